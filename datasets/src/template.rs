//! A model's own Jinja chat template, rendered with `minijinja` the way Hugging Face
//! `apply_chat_template` renders it.
//!
//! The template comes from the model directory, in the order a Hugging Face processor looks:
//! `chat_template.jinja`, then `chat_template.json`'s `chat_template` (older processors), then
//! `tokenizer_config.json`'s `chat_template` (a string, or a list of `{name, template}` where the
//! one named `default` is used). Rendering follows transformers' `_compile_jinja_template`:
//! `trim_blocks` and `lstrip_blocks` on, no trailing newline kept, loop controls, the globals
//! `raise_exception(msg)` and `strftime_now(fmt)`, a `tojson` with Python `json.dumps` spacing
//! that does not HTML-escape, and Python string/dict/list methods (`strip`, `startswith`,
//! `split`, `items`, `get`, ...) through `minijinja_contrib::pycompat`. The context holds
//! `messages`, `add_generation_prompt` and the special-token strings of `tokenizer_config.json`
//! (`bos_token`, `eos_token`, `pad_token`, `unk_token`).
//!
//! verl's message layout is reproduced by [`multimodal_messages`]: each content string is split
//! on `<image>` into `[{"type": "image"}, {"type": "text", "text": ...}]` items, empty pieces
//! dropped (verl `RLHFDataset._build_messages`).

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::{Value as Json, json};

use crate::verl::{ChatMessage, IMAGE_PLACEHOLDER};
use crate::video::VIDEO_PLACEHOLDER;

/// A loaded chat template plus the special-token strings it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("source_len", &self.source.len())
            .finish()
    }
}

/// A special token in `tokenizer_config.json` is a string or an `AddedToken` object with `content`.
fn token_string(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

impl ChatTemplate {
    /// Loads the template of a Hugging Face model directory (see the module doc for where).
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Json = if config_path.exists() {
            let text = std::fs::read_to_string(&config_path)
                .with_context(|| format!("reading {}", config_path.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", config_path.display()))?
        } else {
            Json::Null
        };
        let jinja_path = dir.join("chat_template.jinja");
        let json_path = dir.join("chat_template.json");
        let source = if jinja_path.exists() {
            std::fs::read_to_string(&jinja_path)
                .with_context(|| format!("reading {}", jinja_path.display()))?
        } else if json_path.exists() {
            let text = std::fs::read_to_string(&json_path)
                .with_context(|| format!("reading {}", json_path.display()))?;
            let v: Json = serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", json_path.display()))?;
            v.get("chat_template")
                .and_then(Json::as_str)
                .map(str::to_string)
                .ok_or_else(|| anyhow!("{} has no string `chat_template`", json_path.display()))?
        } else {
            match config.get("chat_template") {
                Some(Json::String(s)) => s.clone(),
                Some(Json::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                    .and_then(|t| t.get("template").and_then(Json::as_str))
                    .map(str::to_string)
                    .ok_or_else(|| {
                        anyhow!(
                            "{}: chat_template is a list without a `default` entry",
                            config_path.display()
                        )
                    })?,
                _ => bail!(
                    "{} has no chat template: neither chat_template.jinja nor a `chat_template` in tokenizer_config.json",
                    dir.display()
                ),
            }
        };
        let mut t = Self::new(source)?;
        t.bos_token = token_string(config.get("bos_token"));
        t.eos_token = token_string(config.get("eos_token"));
        t.pad_token = token_string(config.get("pad_token"));
        t.unk_token = token_string(config.get("unk_token"));
        Ok(t)
    }

    /// Compiles a template source (special tokens unset).
    pub fn new(source: String) -> Result<Self> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| anyhow!("{e}"))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // A template is outside input: a loop over range(10^11), or filters that would build
        // gigabytes (`indent(10^11)`), run out of fuel and fail instead of running on.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |_fmt: String| -> Result<Value, Error> {
            // Deterministic on purpose: rendering must not depend on the wall clock.
            Ok(Value::from("01 Jan 2026"))
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.clone())
            .map_err(|e| anyhow!("the chat template does not compile: {e:#}"))?;
        Ok(Self {
            env,
            source,
            bos_token: None,
            eos_token: None,
            pad_token: None,
            unk_token: None,
        })
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (JSON, HF layout) with `add_generation_prompt`.
    pub fn render(&self, messages: &Json, add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, add_generation_prompt, &[])
    }

    /// [`Self::render`] with `tools` (OpenAI function descriptions) in the template's `tools`
    /// variable, as `apply_chat_template(..., tools=...)` passes them; none: `tools` is unset.
    pub fn render_with_tools(
        &self,
        messages: &Json,
        add_generation_prompt: bool,
        tools: &[Json],
    ) -> Result<String> {
        let ctx = json!({
            "messages": messages,
            "tools": (!tools.is_empty()).then_some(tools),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "unk_token": self.unk_token,
        });
        let tmpl = self.env.get_template("chat").expect("added in new()");
        tmpl.render(Value::from(minijinja::value::Serde(ctx)))
            .map_err(|e| anyhow!("rendering the chat template failed: {e:#}"))
    }
}

/// verl's multimodal message layout: each content split on `<image>` and `<video>` into image,
/// video and text items (empty text pieces dropped; verl `re.split("(<image>|<video>)")`).
/// Text-only data keeps plain string contents (`multimodal = false`).
pub fn multimodal_messages(messages: &[ChatMessage], multimodal: bool) -> Json {
    Json::Array(
        messages
            .iter()
            .map(|m| {
                if !multimodal {
                    return json!({"role": m.role, "content": m.content});
                }
                let mut items = Vec::new();
                for (k, part) in m.content.split(IMAGE_PLACEHOLDER).enumerate() {
                    if k > 0 {
                        items.push(json!({"type": "image"}));
                    }
                    for (j, piece) in part.split(VIDEO_PLACEHOLDER).enumerate() {
                        if j > 0 {
                            items.push(json!({"type": "video"}));
                        }
                        if !piece.is_empty() {
                            items.push(json!({"type": "text", "text": piece}));
                        }
                    }
                }
                json!({"role": m.role, "content": items})
            })
            .collect(),
    )
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=indent)`, i.e. `", "`
/// and `": "` separators without indent, no HTML escaping.
/// minijinja fuel of one render: 10^7 instructions, or 640 MB of produced bytes; a real chat
/// template spends a few thousand.
const TEMPLATE_FUEL: u64 = 10_000_000;

/// The largest `tojson(indent=…)` a chat template may ask for.
const MAX_TOJSON_INDENT: usize = 64;

fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(n) => Some(n),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    // Accepted for compatibility; the output is always `ensure_ascii=False`, unsorted keys.
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    // A template is outside input: an indent of 10^11 spaces must be an error, not an allocation.
    if let Some(n) = indent
        && n > MAX_TOJSON_INDENT
    {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: indent {n} is too large (at most {MAX_TOJSON_INDENT})"),
        ));
    }
    let json: Json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_python_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_python_json(v: &Json, indent: Option<usize>, level: usize, out: &mut String) {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                write_python_json(item, indent, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        Json::Object(map) if !map.is_empty() => {
            out.push('{');
            for (k, (key, item)) in map.iter().enumerate() {
                if k > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                out.push_str(&Json::String(key.clone()).to_string());
                out.push_str(": ");
                write_python_json(item, indent, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_placeholders_like_verl() {
        let msgs = vec![ChatMessage {
            role: "user".into(),
            content: "<image>A <image><image>B".into(),
        }];
        let j = multimodal_messages(&msgs, true);
        assert_eq!(
            j,
            json!([{"role": "user", "content": [
                {"type": "image"}, {"type": "text", "text": "A "},
                {"type": "image"}, {"type": "image"}, {"type": "text", "text": "B"}]}])
        );
    }

    #[test]
    fn hf_features_render() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no ' + m.role) }}{% endif %}\
             {{ m.content.strip() | tojson }}{% if loop.last %}!{% endif %}{% endfor %}\
             {% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}\
             {{ {'a': [1, '<x>']} | tojson }}{{ [1] | tojson(indent=2) }}{% if add_generation_prompt %}G{% endif %}"
                .into(),
        )
        .unwrap();
        let out = t
            .render(&json!([{"role": "user", "content": "  hi <b> "}]), true)
            .unwrap();
        assert_eq!(out, "\"hi <b>\"!1{\"a\": [1, \"<x>\"]}[\n  1\n]G");
        let err = t
            .render(&json!([{"role": "bad", "content": ""}]), false)
            .unwrap_err();
        assert!(format!("{err:#}").contains("no bad"), "{err:#}");
    }

    #[test]
    fn template_file_precedence() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"chat_template": "T{{ bos_token }}", "bos_token": {"content": "<s>"}}"#,
        )
        .unwrap();
        let render = || {
            ChatTemplate::from_model_dir(dir)
                .unwrap()
                .render(&json!([]), true)
                .unwrap()
        };
        assert_eq!(render(), "T<s>");
        std::fs::write(dir.join("chat_template.json"), r#"{"chat_template": "J"}"#).unwrap();
        assert_eq!(render(), "J");
        std::fs::write(dir.join("chat_template.jinja"), "K\n").unwrap();
        assert_eq!(render(), "K");
    }

    #[test]
    fn trims_blocks_like_transformers() {
        let t =
            ChatTemplate::new("{% for m in messages %}\n  {{ m.content }}\n{% endfor %}\n".into())
                .unwrap();
        let out = t
            .render(
                &json!([{"role": "u", "content": "a"}, {"role": "u", "content": "b"}]),
                false,
            )
            .unwrap();
        assert_eq!(out, "  a\n  b\n");
    }
}
