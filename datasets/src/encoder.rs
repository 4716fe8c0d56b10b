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
//!
//! Videos ([`PromptEncoder::encode_media`]) are processed by the image processor's video
//! capability and expanded in the rendered text, before step 3, as transformers' processors do
//! (Qwen3-VL writes frame timestamps there): the k-th `<|video_pad|>` becomes video k's
//! [`VideoProcessor::expanded_text`].

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, ensure};
use flowrl_models::capabilities::{ImageProcessor, ProcessedImage, VideoFrames, VideoProcessor};
use flowrl_models::registry::load_image_processor;
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
    /// The processed pictures and videos, in placeholder order.
    pub images: Vec<ProcessedImage>,
    /// Σ num_tokens over the pictures and videos.
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

    /// Id of the video placeholder token, if the model has a video processor.
    pub fn video_token_id(&self) -> Option<u32> {
        let v = self.processor.as_ref()?.video()?;
        self.tokenizer.token_to_id(v.placeholder_text())
    }

    /// The model's video processor, or an error saying the model takes no videos.
    pub fn video_processor(&self) -> Result<&dyn VideoProcessor> {
        self.processor
            .as_ref()
            .and_then(|p| p.video())
            .ok_or_else(|| anyhow!("the prompt has videos but the model has no video processor"))
    }

    /// `videos` processed by the model's video processor.
    pub fn process_videos(&self, videos: &[VideoFrames]) -> Result<Vec<ProcessedImage>> {
        if videos.is_empty() {
            return Ok(Vec::new());
        }
        let processor = self.video_processor()?;
        videos
            .iter()
            .enumerate()
            .map(|(k, v)| {
                processor
                    .process_video(v)
                    .with_context(|| format!("processing video {k}"))
            })
            .collect()
    }

    /// The rendered `text` with the k-th video placeholder replaced by video k's expansion.
    pub fn expand_video_text(&self, text: &str, videos: &[ProcessedImage]) -> Result<String> {
        if videos.is_empty() {
            return Ok(text.to_string());
        }
        let processor = self.video_processor()?;
        let placeholder = processor.placeholder_text();
        let pieces: Vec<&str> = text.split(placeholder).collect();
        ensure!(
            pieces.len() - 1 == videos.len(),
            "the chat template emitted {} `{placeholder}` for {} video(s)",
            pieces.len() - 1,
            videos.len()
        );
        let mut out = String::from(pieces[0]);
        for (video, piece) in videos.iter().zip(&pieces[1..]) {
            out.push_str(&processor.expanded_text(video)?);
            out.push_str(piece);
        }
        Ok(out)
    }

    /// Step 4 of the module doc: `pictures` processed by the image processor, and `ids` with the
    /// k-th image placeholder expanded to picture k's tokens; an error when the placeholders and
    /// the pictures do not pair up one to one.
    pub fn expand_pictures<P: std::borrow::Borrow<RgbImage>>(
        &self,
        ids: &[u32],
        pictures: &[P],
    ) -> Result<(Vec<u32>, Vec<ProcessedImage>)> {
        let Some(processor) = &self.processor else {
            ensure!(
                pictures.is_empty(),
                "the prompt has {} image(s) but the model has no image processor (no preprocessor_config.json)",
                pictures.len()
            );
            return Ok((ids.to_vec(), Vec::new()));
        };
        let token = processor.placeholder_token();
        let token_id = self.tokenizer.token_to_id(token).ok_or_else(|| {
            anyhow!("the tokenizer has no token `{token}` (the image processor's placeholder)")
        })?;
        let emitted = ids.iter().filter(|&&t| t == token_id).count();
        ensure!(
            emitted == pictures.len(),
            "the chat template emitted {emitted} `{token}` token(s) for {} image(s)",
            pictures.len()
        );
        if pictures.is_empty() {
            return Ok((ids.to_vec(), Vec::new()));
        }
        let processed = pictures
            .iter()
            .enumerate()
            .map(|(k, img)| {
                processor
                    .process(img.borrow())
                    .with_context(|| format!("processing image {k}"))
            })
            .collect::<Result<Vec<_>>>()?;
        let ids = processor.expand_placeholders(ids, &processed)?;
        Ok((ids, processed))
    }

    /// The whole flow of the module doc for one prompt. `images` are in placeholder order.
    pub fn encode<P: std::borrow::Borrow<RgbImage>>(
        &self,
        messages: &[ChatMessage],
        images: &[P],
        multimodal: bool,
    ) -> Result<EncodedPrompt> {
        self.encode_media(messages, images, &[], multimodal)
    }

    /// [`Self::encode`] of a prompt with pictures and videos (each in its placeholder order); the
    /// processed inputs come back interleaved in `<image>`/`<video>` order of `messages`.
    pub fn encode_media<P: std::borrow::Borrow<RgbImage>>(
        &self,
        messages: &[ChatMessage],
        images: &[P],
        videos: &[VideoFrames],
        multimodal: bool,
    ) -> Result<EncodedPrompt> {
        let text = self.render(messages, multimodal)?;
        let processed_videos = self.process_videos(videos)?;
        let ids = self.tokenize(&self.expand_video_text(&text, &processed_videos)?)?;
        let (input_ids, processed) = if images.is_empty() {
            (ids, Vec::new())
        } else {
            self.expand_pictures(&ids, images)?
        };
        let images = interleave(messages, processed, processed_videos)?;
        let num_image_tokens = images.iter().map(|p| p.num_tokens).sum();
        Ok(EncodedPrompt {
            text,
            input_ids,
            images,
            num_image_tokens,
        })
    }
}

/// Pictures and videos (each in its own placeholder order) merged in the `<image>`/`<video>`
/// order of `messages` (the order of their tokens in the prompt, which the vision tower and the
/// position ids follow).
pub fn interleave(
    messages: &[ChatMessage],
    images: Vec<ProcessedImage>,
    videos: Vec<ProcessedImage>,
) -> Result<Vec<ProcessedImage>> {
    if videos.is_empty() {
        return Ok(images);
    }
    let order = crate::verl::placeholder_order(messages);
    let (n_images, n_videos) = (images.len(), videos.len());
    ensure!(
        order.iter().filter(|&&v| !v).count() == n_images
            && order.iter().filter(|&&v| v).count() == n_videos,
        "the messages hold {} <image> and {} <video> placeholders for {n_images} image(s) and {n_videos} video(s)",
        order.iter().filter(|&&v| !v).count(),
        order.iter().filter(|&&v| v).count()
    );
    let (mut images, mut videos) = (images.into_iter(), videos.into_iter());
    Ok(order
        .into_iter()
        .map(|video| {
            if video {
                videos.next().expect("counted")
            } else {
                images.next().expect("counted")
            }
        })
        .collect())
}
