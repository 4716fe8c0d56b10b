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

use burn::module::ModuleVisitor;

use crate::capabilities::{CausalLm, KvCache, MultimodalPositions, ProcessedImage, Vision};
use crate::family::{FamilyConfig, FamilyModel, ImageProcessorLoader};
use crate::weights::{WeightNames, Weights};
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

impl FamilyConfig for Qwen3VlConfig {
    const IMAGE_PROCESSOR: Option<ImageProcessorLoader> =
        Some(crate::qwen2_vl::processor::load_boxed);

    fn parse(json: &serde_json::Value) -> Result<Self> {
        Self::from_value(json)
    }

    fn initializer_range(&self) -> f64 {
        self.text.initializer_range
    }
}

impl<B: Backend> FamilyModel<B> for Qwen3Vl<B> {
    type Config = Qwen3VlConfig;

    fn new(device: &B::Device, config: &Qwen3VlConfig) -> Self {
        Self {
            visual: VisionTower::new(device, &config.vision),
            text: TextModel::new(device, &config.text),
            config: config.clone(),
            positions: MropePositions {
                image_token_id: config.image_token_id,
                video_token_id: config.video_token_id,
                spatial_merge_size: config.vision.spatial_merge_size,
                video_time: VideoTime::Frames,
            },
        }
    }

    fn config_json(&self) -> String {
        self.config.to_json()
    }

    fn model_type(&self) -> &'static str {
        "qwen3_vl"
    }

    fn vision(&self) -> Option<&dyn Vision<B>> {
        Some(self)
    }

    /// The whole `visual` module, its DeepStack mergers included (transformers'
    /// `Qwen3VLVisionModel` owns `deepstack_merger_list`).
    fn visit_vision_tower<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        self.visual.visit(visitor)
    }

    fn multimodal_positions(&self) -> Option<&dyn MultimodalPositions> {
        Some(&self.positions)
    }
}

/// Every weight under its hub name: `model.visual.*`, then `model.language_model.*` and
/// `lm_head.weight`.
impl<B: Backend> Weights<B> for Qwen3Vl<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        self.visual.weights(w, prefix);
        self.text.weights(w, prefix);
    }
}

impl<B: Backend> Qwen3Vl<B> {
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

// `forward_hidden`'s embeddings may carry DeepStack blocks after the first `hidden` channels
// (`TextModel::forward`).
crate::qwen2_vl::qwen_causal_lm!(Qwen3Vl);

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
