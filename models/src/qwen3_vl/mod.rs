//! Qwen3-VL (`model_type` `qwen3_vl`, transformers `Qwen3VLForConditionalGeneration`, source
//! `models/qwen3_vl/modeling_qwen3_vl.py`).
//!
//! Files: `config` (config.json, both layouts), `text` (Qwen3 decoder with q/k norms, explicit
//! head_dim, DeepStack additions), `vision` (tower with the learned, resampled position grid,
//! main and DeepStack mergers), `positions` (M-RoPE ids — Qwen2-VL's algorithm — and the
//! interleaved rotary table), `processor` (Qwen2-VL's image processor with Qwen3-VL settings).
//!
//! Capabilities: [`CausalLm`], [`Vision`] (whose embeddings carry the DeepStack features as
//! extra channel blocks, see [`Vision::embed_images`]), `MultimodalPositions` ([`MropePositions`])
//! and, through the registry, the image processor. Weights are named as in the hub checkpoints
//! (`model.visual.*`, `model.language_model.*`, `lm_head.weight`), loaded and saved that way.

pub mod config;
pub mod positions;
pub mod processor;
pub mod text;
pub mod vision;

use anyhow::Result;
use burn::prelude::*;

use crate::capabilities::{CausalLm, KvCache, ProcessedImage, Vision};
use crate::weights::{NormalizedNames, WeightSource, WeightVisitor};
pub use config::Qwen3VlConfig;
pub use positions::{MropePositions, VideoTime};
use text::{TextModel, TextTrace};
use vision::{VisionTower, VisionTrace};

/// A Qwen3-VL conditional-generation model.
#[derive(Module, Debug)]
pub struct Qwen3Vl<B: Backend> {
    pub text: TextModel<B>,
    pub visual: VisionTower<B>,
    pub config: Qwen3VlConfig,
    pub positions: MropePositions,
}

impl<B: Backend> Qwen3Vl<B> {
    /// Builds the model from `config`, taking every weight from `src`.
    pub fn load(src: &mut dyn WeightSource<B>, config: &Qwen3VlConfig) -> Self {
        let mut names = NormalizedNames(src);
        let src: &mut dyn WeightSource<B> = &mut names;
        let visual = VisionTower::load(src, &config.vision);
        let text = TextModel::load(src, &config.text);
        Self {
            text,
            visual,
            config: config.clone(),
            positions: MropePositions {
                image_token_id: config.image_token_id,
                video_token_id: config.video_token_id,
                spatial_merge_size: config.vision.spatial_merge_size,
                video_time: VideoTime::Frames,
            },
        }
    }

    /// Every weight under its hub name.
    pub fn export<V: WeightVisitor<B>>(&self, sink: &mut V) {
        self.visual.export(sink);
        self.text.export(sink);
    }

    /// Image embeddings and DeepStack features with the vision intermediates (parity tests).
    #[allow(clippy::type_complexity)]
    pub fn embed_images_traced(
        &self,
        images: &[ProcessedImage],
        device: &B::Device,
    ) -> Result<(Tensor<B, 2>, Vec<Tensor<B, 2>>, VisionTrace<B>)> {
        let (pixels, grids) = self.visual.inputs(images, device)?;
        let mut trace = VisionTrace::default();
        let (embeds, deepstack) = self.visual.forward(pixels, &grids, Some(&mut trace));
        Ok((embeds, deepstack, trace))
    }

    /// [`CausalLm::forward_hidden`] with the decoder's intermediates (parity tests).
    pub fn forward_traced(
        &self,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
    ) -> (Tensor<B, 3>, TextTrace<B>) {
        let mut trace = TextTrace::default();
        let h = self
            .text
            .forward(embeds, positions, attention_mask, None, Some(&mut trace));
        (h, trace)
    }
}

impl<B: Backend> CausalLm<B> for Qwen3Vl<B> {
    fn embed_tokens(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.text.embed(ids)
    }

    /// `embeds` may carry DeepStack blocks after the first `hidden` channels
    /// ([`TextModel::forward`]).
    fn forward_hidden(
        &self,
        _ids: Tensor<B, 2, Int>,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        self.text
            .forward(embeds, positions, attention_mask, cache, None)
    }

    fn lm_head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.text.logits(hidden)
    }

    fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.text.layers.len())
    }

    fn vocab_size(&self) -> usize {
        self.config.text.vocab_size
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.config.text.eos_token_ids.clone()
    }

    fn context_length(&self) -> usize {
        self.config.text.max_position_embeddings
    }

    fn hidden_size(&self) -> usize {
        self.config.text.hidden_size
    }
}

impl<B: Backend> Vision<B> for Qwen3Vl<B> {
    fn image_token_id(&self) -> u32 {
        self.config.image_token_id
    }

    fn video_token_id(&self) -> Option<u32> {
        Some(self.config.video_token_id)
    }

    /// `[Σ tokens, hidden · (1 + K)]`: the main merger's embeddings, then the K DeepStack
    /// features (K = number of DeepStack blocks that reach a decoder layer, block k added after
    /// decoder layer k).
    fn embed_images(&self, images: &[ProcessedImage], device: &B::Device) -> Result<Tensor<B, 2>> {
        let blocks = self.config.vision.deepstack_visual_indexes.len();
        let width = self.hidden_size() * (1 + blocks.min(self.text.layers.len()));
        if images.is_empty() {
            return Ok(Tensor::zeros([0, width], device));
        }
        let (pixels, grids) = self.visual.inputs(images, device)?;
        let (embeds, mut deepstack) = self.visual.forward(pixels, &grids, None);
        deepstack.truncate(self.text.layers.len());
        deepstack.insert(0, embeds);
        Ok(Tensor::cat(deepstack, 1))
    }
}
