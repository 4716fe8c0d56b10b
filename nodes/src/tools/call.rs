//! Tool calls in an assistant turn's text, in the family's chat-template syntax.
//!
//! - [`CallSyntax::Hermes`] (Qwen2-VL, Qwen2.5-VL, Qwen3-VL; verl's and vLLM's `hermes` parser):
//!   `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, whitespace around the JSON
//!   allowed, any number of calls per turn.
//! - [`CallSyntax::Gemma4`]: `<|tool_call>call:NAME{key:value,...}<tool_call|>`, values being
//!   `<|"|>`-quoted strings, JSON strings, numbers, `true`/`false`/`null`, `[...]` lists and
//!   `{key:value}` objects with bare keys (Gemma 4's chat template writes arguments this way).
//!
//! A malformed call (no closing tag, bad JSON, no name, arguments that are not an object) is an
//! `Err` with the message the model gets back; it never stops the rollout.

use serde_json::{Map, Value as Json};

/// A tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallSyntax {
    Hermes,
    Gemma4,
}

impl CallSyntax {
    /// The opening and closing tags of a call.
    pub fn tags(self) -> (&'static str, &'static str) {
        match self {
            CallSyntax::Hermes => ("<tool_call>", "</tool_call>"),
            CallSyntax::Gemma4 => ("<|tool_call>", "<tool_call|>"),
        }
    }

    /// The syntax a tokenizer's vocabulary and chat template call for: Gemma 4's when either
    /// knows `<|tool_call>`, else Hermes.
    pub fn detect(vocab_has: impl Fn(&str) -> bool, template: &str) -> Self {
        if vocab_has("<|tool_call>") || template.contains("<|tool_call>") {
            CallSyntax::Gemma4
        } else {
            CallSyntax::Hermes
        }
    }

    /// The calls of `text`, in order: each a `(name, arguments object)` or the error message a
    /// malformed one gets.
    pub fn parse(self, text: &str) -> Vec<Result<ParsedCall, String>> {
        let (open, close) = self.tags();
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find(open) {
            let after = &rest[at + open.len()..];
            let Some(end) = after.find(close) else {
                out.push(Err(format!(
                    "Error: the tool call has no closing `{close}`"
                )));
                break;
            };
            let body = after[..end].trim();
            out.push(match self {
                CallSyntax::Hermes => parse_hermes(body),
                CallSyntax::Gemma4 => parse_gemma4(body),
            });
            rest = &after[end + close.len()..];
        }
        out
    }
}

/// A well-formed call.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// Always a JSON object.
    pub arguments: Json,
}

fn parse_hermes(body: &str) -> Result<ParsedCall, String> {
    let v: Json = serde_json::from_str(body)
        .map_err(|e| format!("Error: the tool call is not valid JSON ({e})"))?;
    let name = v
        .get("name")
        .and_then(Json::as_str)
        .ok_or("Error: the tool call has no \"name\" string")?
        .to_string();
    let arguments = match v.get("arguments") {
        None | Some(Json::Null) => Json::Object(Map::new()),
        Some(Json::Object(o)) => Json::Object(o.clone()),
        // Some models write the arguments as a JSON string.
        Some(Json::String(s)) => match serde_json::from_str(s) {
            Ok(Json::Object(o)) => Json::Object(o),
            _ => return Err("Error: \"arguments\" must be a JSON object".into()),
        },
        Some(_) => return Err("Error: \"arguments\" must be a JSON object".into()),
    };
    Ok(ParsedCall { name, arguments })
}

fn parse_gemma4(body: &str) -> Result<ParsedCall, String> {
    let rest = body
        .strip_prefix("call:")
        .ok_or("Error: a tool call must read `call:NAME{...}`")?;
    let brace = rest
        .find('{')
        .ok_or("Error: a tool call must read `call:NAME{...}`")?;
    let name = rest[..brace].trim();
    if name.is_empty() {
        return Err("Error: the tool call has no name".into());
    }
    let mut p = GemmaValue {
        s: &rest[brace..],
        at: 0,
    };
    let arguments = p
        .value()
        .map_err(|e| format!("Error: bad tool-call arguments ({e})"))?;
    p.skip_ws();
    if p.at != p.s.len() {
        return Err(format!(
            "Error: unexpected text after the tool call's arguments: `{}`",
            &p.s[p.at..]
        ));
    }
    Ok(ParsedCall {
        name: name.to_string(),
        arguments,
    })
}

/// A recursive-descent reader of Gemma 4's argument values.
struct GemmaValue<'a> {
    s: &'a str,
    at: usize,
}

const GEMMA_QUOTE: &str = "<|\"|>";

impl GemmaValue<'_> {
    fn skip_ws(&mut self) {
        while self.s[self.at..].starts_with(char::is_whitespace) {
            self.at += self.s[self.at..].chars().next().map_or(1, char::len_utf8);
        }
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.s[self.at..].starts_with(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.skip_ws();
        let rest = &self.s[self.at..];
        if let Some(r) = rest.strip_prefix(GEMMA_QUOTE) {
            let end = r.find(GEMMA_QUOTE).ok_or("an unterminated <|\"|> string")?;
            self.at += GEMMA_QUOTE.len() * 2 + end;
            return Ok(Json::String(r[..end].to_string()));
        }
        if rest.starts_with('"') {
            let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Json>();
            let v = stream
                .next()
                .ok_or("an empty string")?
                .map_err(|e| e.to_string())?;
            self.at += stream.byte_offset();
            return Ok(v);
        }
        if self.eat('{') {
            let mut o = Map::new();
            if self.eat('}') {
                return Ok(Json::Object(o));
            }
            loop {
                self.skip_ws();
                let key = self.key()?;
                if !self.eat(':') {
                    return Err(format!("`:` expected after key `{key}`"));
                }
                o.insert(key, self.value()?);
                if self.eat('}') {
                    return Ok(Json::Object(o));
                }
                if !self.eat(',') {
                    return Err("`,` or `}` expected".into());
                }
            }
        }
        if self.eat('[') {
            let mut items = Vec::new();
            if self.eat(']') {
                return Ok(Json::Array(items));
            }
            loop {
                items.push(self.value()?);
                if self.eat(']') {
                    return Ok(Json::Array(items));
                }
                if !self.eat(',') {
                    return Err("`,` or `]` expected".into());
                }
            }
        }
        let end = rest
            .find(|c: char| matches!(c, ',' | '}' | ']') || c.is_whitespace())
            .unwrap_or(rest.len());
        let word = &rest[..end];
        self.at += end;
        match word {
            "true" => Ok(Json::Bool(true)),
            "false" => Ok(Json::Bool(false)),
            "null" => Ok(Json::Null),
            _ => serde_json::from_str::<serde_json::Number>(word)
                .map(Json::Number)
                .map_err(|_| format!("`{word}` is not a value")),
        }
    }

    fn key(&mut self) -> Result<String, String> {
        let rest = &self.s[self.at..];
        if let Some(r) = rest.strip_prefix(GEMMA_QUOTE) {
            let end = r.find(GEMMA_QUOTE).ok_or("an unterminated <|\"|> key")?;
            self.at += GEMMA_QUOTE.len() * 2 + end;
            return Ok(r[..end].to_string());
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(rest.len());
        if end == 0 {
            return Err("a key expected".into());
        }
        self.at += end;
        Ok(rest[..end].to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hermes_calls_are_parsed_in_order_and_malformed_ones_are_messages() {
        let text = "<think>look closer</think>\n<tool_call>\n{\"name\": \"zoom_in\", \"arguments\": {\"bbox_2d\": [1, 2, 30, 40]}}\n</tool_call><tool_call>{\"name\": \"rotate\", \"arguments\": \"{\\\"angle\\\": 90}\"}</tool_call>";
        let calls = CallSyntax::Hermes.parse(text);
        assert_eq!(
            calls,
            vec![
                Ok(ParsedCall {
                    name: "zoom_in".into(),
                    arguments: json!({"bbox_2d": [1, 2, 30, 40]})
                }),
                Ok(ParsedCall {
                    name: "rotate".into(),
                    arguments: json!({"angle": 90})
                }),
            ]
        );
        assert!(CallSyntax::Hermes.parse("no call here").is_empty());
        let bad = CallSyntax::Hermes.parse("<tool_call>{\"name\": zoom}</tool_call>");
        assert!(
            bad[0].as_ref().unwrap_err().contains("not valid JSON"),
            "{bad:?}"
        );
        let open = CallSyntax::Hermes.parse("<tool_call>{\"name\": \"zoom_in\"");
        assert!(open[0].as_ref().unwrap_err().contains("no closing"));
        let nameless = CallSyntax::Hermes.parse("<tool_call>{\"arguments\": {}}</tool_call>");
        assert!(nameless[0].as_ref().unwrap_err().contains("\"name\""));
    }

    #[test]
    fn gemma4_calls_read_bare_keys_quoted_strings_and_nested_values() {
        let text = "ok<|tool_call>call:zoom_in{bbox_2d:[10,20,50,60],label:<|\"|>red, square<|\"|>,deep:{on:true,n:-1.5,none:null}}<tool_call|>";
        let calls = CallSyntax::Gemma4.parse(text);
        assert_eq!(
            calls,
            vec![Ok(ParsedCall {
                name: "zoom_in".into(),
                arguments: json!({"bbox_2d": [10, 20, 50, 60], "label": "red, square",
                                  "deep": {"on": true, "n": -1.5, "none": null}}),
            })]
        );
        let bad = CallSyntax::Gemma4.parse("<|tool_call>zoom_in{}<tool_call|>");
        assert!(bad[0].as_ref().unwrap_err().contains("call:NAME"));
        let bad = CallSyntax::Gemma4.parse("<|tool_call>call:f{a:[1,2}<tool_call|>");
        assert!(bad[0].is_err());
        assert_eq!(
            CallSyntax::detect(|t| t == "<|tool_call>", ""),
            CallSyntax::Gemma4
        );
        assert_eq!(CallSyntax::detect(|_| false, "{{ x }}"), CallSyntax::Hermes);
    }
}
