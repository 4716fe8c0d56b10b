//! The tokens between two assistant turns, written by the model's own chat template.
//!
//! After an assistant turn that called tools, the template segment is:
//! 1. the end of the assistant turn that the policy did not sample: what the template writes
//!    after an assistant message's content ([`TurnTemplate::assistant_suffix`], found once by
//!    rendering a probe message), less the part the turn's last tokens already wrote (Qwen: the
//!    policy samples `<|im_end|>`, the template adds `\n`);
//! 2. the tool messages and the next generation prompt: the text the template adds to the
//!    conversation when they are appended, `render(history + answers, generation prompt)` less
//!    `render(history)` (which must be its prefix: a template that renders the earlier
//!    messages differently once the answers follow is refused with the conversation named).
//!
//! The segment's text is tokenized once, without special tokens added, and its image
//! placeholders are expanded for the tools' pictures by the model's image processor, as a
//! prompt's are ([`flowrl_datasets::PromptEncoder`]). A template that drops a tool message's
//! pictures (writes fewer placeholders than there are pictures) is an error naming the model,
//! never a silent misalignment.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use flowrl_datasets::PromptEncoder;
use flowrl_models::ProcessedImage;
use image::RgbImage;
use serde_json::{Value as Json, json};

/// A probe content no template writes by itself.
const PROBE: &str = "\u{e000}flowrl-probe\u{e000}";

/// A model's chat template, tokenizer and image processor, for the segments between turns.
pub struct TurnTemplate {
    encoder: Arc<PromptEncoder>,
    /// The tools' OpenAI function descriptions, in the template's `tools` variable.
    tools: Vec<Json>,
    /// What the template writes after an assistant message's content (Qwen: `<|im_end|>\n`).
    assistant_suffix: String,
    /// The model's name, for messages.
    model: String,
}

/// A template segment: its text, ids (placeholders expanded) and processed pictures.
#[derive(Debug, Clone)]
pub struct RenderedSegment {
    pub text: String,
    pub ids: Vec<u32>,
    pub images: Vec<ProcessedImage>,
}

impl TurnTemplate {
    /// Probes the template: the assistant suffix, and that it renders a tool message at all.
    /// `tools` (OpenAI function descriptions) are passed to every rendering.
    pub fn new(encoder: Arc<PromptEncoder>, model: &str, tools: Vec<Json>) -> Result<Self> {
        let user = json!({"role": "user", "content": "u"});
        let assistant = json!({"role": "assistant", "content": PROBE});
        let text = encoder
            .template
            .render(&json!([user, assistant]), false)
            .with_context(|| format!("model `{model}`: rendering an assistant message"))?;
        let at = text.rfind(PROBE).ok_or_else(|| {
            anyhow!(
                "model `{model}`: the chat template does not write an assistant message's content"
            )
        })?;
        let assistant_suffix = text[at + PROBE.len()..].to_string();
        let tool = tool_message("probe", "t", 0);
        encoder
            .template
            .render(&json!([user, assistant, tool]), true)
            .map_err(|e| {
                anyhow!(
                    "model `{model}`: the chat template cannot render a tool message ({e:#}); \
                     multi-turn rollouts need a template with a tool role"
                )
            })?;
        Ok(Self {
            encoder,
            tools,
            assistant_suffix,
            model: model.to_string(),
        })
    }

    /// What the template writes after an assistant message's content.
    pub fn assistant_suffix(&self) -> &str {
        &self.assistant_suffix
    }

    /// `messages` rendered with the tools.
    pub fn render(&self, messages: &[Json], add_generation_prompt: bool) -> Result<String> {
        self.encoder.template.render_with_tools(
            &Json::Array(messages.to_vec()),
            add_generation_prompt,
            &self.tools,
        )
    }

    /// Whether the template writes the tools into the conversation (reads its `tools`
    /// variable): prompts are then encoded again with them.
    pub fn writes_tools(&self) -> bool {
        !self.tools.is_empty() && self.encoder.template.source().contains("tools")
    }

    /// The encoder (tokenizer, template, processor).
    pub fn encoder(&self) -> &PromptEncoder {
        &self.encoder
    }

    /// The segment after the last assistant turn of `history` (the prompt's messages in the
    /// template's layout, then the assistant and tool messages so far), whose sampled text
    /// ended with `turn_end`, answered by `answers` (tool messages) whose pictures are
    /// `pictures`, in order.
    pub fn tool_segment(
        &self,
        history: &[Json],
        turn_end: &str,
        answers: &[Json],
        pictures: &[Arc<RgbImage>],
    ) -> Result<RenderedSegment> {
        let before = self.render(history, false)?;
        let mut all = history.to_vec();
        all.extend_from_slice(answers);
        let after = self.render(&all, true)?;
        let added = after.strip_prefix(before.as_str()).ok_or_else(|| {
            anyhow!(
                "model `{}`: the chat template renders the conversation differently once tool \
                 answers follow it, so the tool segment cannot be cut out; conversation: {}",
                self.model,
                serde_json::to_string(history).unwrap_or_default()
            )
        })?;
        let text = format!("{}{added}", self.closing(turn_end));
        let ids = self.encoder.tokenize(&text)?;
        let (ids, images) = self.expand(ids, pictures)?;
        Ok(RenderedSegment { text, ids, images })
    }

    /// The part of the assistant suffix the turn's sampled end `turn_end` did not write: the
    /// suffix less its longest prefix that `turn_end` ends with.
    pub fn closing(&self, turn_end: &str) -> &str {
        let s = &self.assistant_suffix;
        let written = (0..=s.len())
            .rev()
            .filter(|&k| s.is_char_boundary(k))
            .find(|&k| turn_end.ends_with(&s[..k]))
            .unwrap_or(0);
        &s[written..]
    }

    /// `ids` with their image placeholders expanded for `pictures` (processed here).
    fn expand(
        &self,
        ids: Vec<u32>,
        pictures: &[Arc<RgbImage>],
    ) -> Result<(Vec<u32>, Vec<ProcessedImage>)> {
        self.encoder.expand_pictures(&ids, pictures).with_context(|| {
            format!(
                "model `{}`: the tool answer's pictures (a template that drops pictures in tool \
                 messages would train a policy on pictures it never saw)",
                self.model
            )
        })
    }
}

/// A tool message in verl's multimodal layout: the pictures first, then the text.
pub fn tool_message(name: &str, text: &str, pictures: usize) -> Json {
    let mut content: Vec<Json> = (0..pictures).map(|_| json!({"type": "image"})).collect();
    content.push(json!({"type": "text", "text": text}));
    json!({"role": "tool", "name": name, "content": content})
}
