//! The prompts as the chat template sees them: their messages in the layout their text was
//! rendered with, and their text encoded again with the tools when the template writes them.

use std::sync::Arc;

use anyhow::{Result, anyhow};
use flowrl_datasets::template::multimodal_messages;
use flowrl_models::ProcessedImage;
use serde_json::Value as Json;

use super::MultiTurn;
use crate::values::PromptBatch;

impl MultiTurn {
    /// The prompt's messages in the layout its text was rendered with (verl's multimodal item
    /// layout, or plain strings): the one whose rendering with the generation prompt, with or
    /// without the tools, is the prompt's text.
    pub(super) fn prompt_messages(&self, prompt: &flowrl_datasets::Prompt) -> Result<Vec<Json>> {
        let template = &self.template.encoder().template;
        for multimodal in [true, false] {
            let messages = multimodal_messages(&prompt.messages, multimodal)
                .as_array()
                .cloned()
                .unwrap_or_default();
            let text = Some(prompt.text.as_str());
            if template
                .render(&Json::Array(messages.clone()), true)
                .ok()
                .as_deref()
                == text
                || self.template.render(&messages, true).ok().as_deref() == text
            {
                return Ok(messages);
            }
        }
        Err(anyhow!(
            "prompt {}: its messages do not render to its text with the chat template of model `{}`",
            prompt.uid,
            self.model.name
        ))
    }

    /// The prompts encoded again with the tools in the chat template's `tools` variable, when
    /// the template writes them (the dataset renders prompts without tools): text, ids and
    /// placeholder expansion as the dataset's encoder does them.
    pub(super) fn with_tools(&self, prompts: &Arc<PromptBatch>) -> Result<Arc<PromptBatch>> {
        if !self.template.writes_tools() {
            return Ok(prompts.clone());
        }
        let encoder = self.template.encoder();
        let mut batch = (**prompts).clone();
        for p in &mut batch.prompts {
            let messages = self.prompt_messages(p)?;
            let text = self.template.render(&messages, true)?;
            if text == p.text {
                continue;
            }
            let (videos, stills): (Vec<ProcessedImage>, Vec<ProcessedImage>) =
                p.images.iter().cloned().partition(|i| i.video.is_some());
            let mut ids = encoder.tokenize(&encoder.expand_video_text(&text, &videos)?)?;
            if !stills.is_empty() {
                let processor = encoder
                    .processor
                    .as_ref()
                    .ok_or_else(|| anyhow!("prompt {} has pictures but no processor", p.uid))?;
                ids = processor.expand_placeholders(&ids, &stills)?;
            }
            p.input_ids = ids;
            p.text = text;
        }
        Ok(Arc::new(batch))
    }
}
