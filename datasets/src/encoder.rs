//! Prompt encoding: chat messages + pictures → token ids with image tokens expanded, the way verl's
//! `RLHFDataset.__getitem__` does it with a Hugging Face processor:
//!
//! 1. split each message on `<image>` into image/text items ([`multimodal_messages`]);
//! 2. render the model's chat template with the generation prompt ([`ChatTemplate`]);
//! 3. tokenize the rendered text with the model's `tokenizer.json` **without** adding special
//!    tokens (the template writes BOS itself, as `apply_chat_template(tokenize=True)` does), and
//!    drop a doubled leading BOS, so there is never a double BOS;
//! 4. process each picture with the model's image processor and expand the k-th placeholder
//!    token (Qwen: one `<|image_pad|>`) to image k's `num_tokens` tokens.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail, ensure};
use flowrl_models::capabilities::{ImageProcessor, ProcessedImage, load_image_processor};
use image::RgbImage;
use tokenizers::Tokenizer;

use crate::template::{ChatTemplate, multimodal_messages};
use crate::verl::ChatMessage;

/// A prompt after encoding.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedPrompt {
    /// The rendered chat template (before placeholder expansion).
    pub text: String,
    /// Token ids with every image placeholder expanded.
    pub input_ids: Vec<u32>,
    /// The processed pictures, in placeholder order.
    pub images: Vec<ProcessedImage>,
    /// Σ num_tokens over the images.
    pub num_image_tokens: usize,
}

/// Template + tokenizer + (optional) image processor of one model.
pub struct PromptEncoder {
    pub template: ChatTemplate,
    pub tokenizer: Tokenizer,
    pub processor: Option<Arc<dyn ImageProcessor>>,
    /// Id of the template's BOS string, if the tokenizer knows it.
    pub bos_token_id: Option<u32>,
    /// Id of the pad token (`pad_token` of `tokenizer_config.json`, else `<|endoftext|>`/`<pad>`).
    pub pad_token_id: Option<u32>,
}

impl std::fmt::Debug for PromptEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptEncoder")
            .field("template", &self.template)
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("has_processor", &self.processor.is_some())
            .finish()
    }
}

/// Loads `tokenizer.json` of a model directory.
pub fn load_tokenizer(dir: &Path) -> Result<Tokenizer> {
    let path = dir.join("tokenizer.json");
    Tokenizer::from_file(&path).map_err(|e| anyhow!("cannot load {}: {e}", path.display()))
}

impl PromptEncoder {
    /// Loads template, tokenizer and (when `preprocessor_config.json` exists) image processor of a
    /// Hugging Face model directory.
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        let template = ChatTemplate::from_model_dir(dir)?;
        let tokenizer = load_tokenizer(dir)?;
        let processor: Option<Arc<dyn ImageProcessor>> =
            if dir.join("preprocessor_config.json").exists() {
                Some(Arc::from(load_image_processor(dir).with_context(|| {
                    format!("loading the image processor of {}", dir.display())
                })?))
            } else {
                None
            };
        Ok(Self::new(template, tokenizer, processor))
    }

    /// Assembles an encoder from its parts.
    pub fn new(
        template: ChatTemplate,
        tokenizer: Tokenizer,
        processor: Option<Arc<dyn ImageProcessor>>,
    ) -> Self {
        let bos_token_id = template
            .bos_token
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t));
        let pad_token_id = template
            .pad_token
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t))
            .or_else(|| tokenizer.token_to_id("<|endoftext|>"))
            .or_else(|| tokenizer.token_to_id("<pad>"));
        Self {
            template,
            tokenizer,
            processor,
            bos_token_id,
            pad_token_id,
        }
    }

    /// Renders the chat template for `messages` with the generation prompt; `multimodal` selects
    /// verl's image/text item layout.
    pub fn render(&self, messages: &[ChatMessage], multimodal: bool) -> Result<String> {
        self.template
            .render(&multimodal_messages(messages, multimodal), true)
    }

    /// Tokenizes rendered text without adding special tokens; a doubled leading BOS is reduced to one.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| anyhow!("tokenization failed: {e}"))?;
        let mut ids = enc.get_ids().to_vec();
        if let Some(bos) = self.bos_token_id {
            while ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
                ids.remove(0);
            }
        }
        Ok(ids)
    }

    /// Id of the image placeholder token, if the model has an image processor.
    pub fn image_token_id(&self) -> Option<u32> {
        let p = self.processor.as_ref()?;
        self.tokenizer.token_to_id(p.placeholder_token())
    }

    /// The whole flow of the module doc for one prompt. `images` are in placeholder order.
    pub fn encode(
        &self,
        messages: &[ChatMessage],
        images: &[RgbImage],
        multimodal: bool,
    ) -> Result<EncodedPrompt> {
        let text = self.render(messages, multimodal)?;
        let ids = self.tokenize(&text)?;
        if images.is_empty() {
            return Ok(EncodedPrompt {
                text,
                input_ids: ids,
                images: Vec::new(),
                num_image_tokens: 0,
            });
        }
        let Some(processor) = &self.processor else {
            bail!(
                "the prompt has {} image(s) but the model has no image processor (no preprocessor_config.json)",
                images.len()
            );
        };
        let token = processor.placeholder_token();
        let token_id = self.tokenizer.token_to_id(token).ok_or_else(|| {
            anyhow!("the tokenizer has no token `{token}` (the image processor's placeholder)")
        })?;
        let emitted = ids.iter().filter(|&&t| t == token_id).count();
        ensure!(
            emitted == images.len(),
            "the chat template emitted {emitted} `{token}` token(s) for {} image(s)",
            images.len()
        );
        let processed = images
            .iter()
            .enumerate()
            .map(|(k, img)| {
                processor
                    .process(img)
                    .with_context(|| format!("processing image {k}"))
            })
            .collect::<Result<Vec<_>>>()?;
        let input_ids = processor.expand_placeholders(&ids, &processed)?;
        let num_image_tokens = processed.iter().map(|p| p.num_tokens).sum();
        Ok(EncodedPrompt {
            text,
            input_ids,
            images: processed,
            num_image_tokens,
        })
    }
}
