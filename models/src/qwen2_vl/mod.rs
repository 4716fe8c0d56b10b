//! Qwen2-VL and Qwen2.5-VL (`model_type` `qwen2_vl`, `qwen2_5_vl`).
//!
//! The two families share the text decoder, the position-id algorithm and the image processor;
//! they differ in the vision tower ([`config::Flavor`]). Files: `config` (config.json), `text`
//! (decoder), `vision` (tower + merger + Qwen2.5 windows), `positions` (M-RoPE ids),
//! `processor` (image processor), `video` (video processor, shared with Qwen3-VL).

pub mod config;
pub mod patches;
pub mod positions;
pub mod processor;
pub mod text;
pub mod video;
pub mod vision;

use anyhow::Result;
use burn::prelude::*;

use burn::module::ModuleVisitor;

use crate::capabilities::{CausalLm, KvCache, MultimodalPositions, ProcessedImage, Vision};
use crate::family::{FamilyConfig, FamilyModel, ImageProcessorLoader};
use crate::weights::{WeightNames, Weights};
pub use config::{Flavor, QwenVlConfig};
pub use positions::{MropePositions, VideoTime};
use text::TextModel;
use vision::{VisionTower, VisionTrace};

/// A Qwen2-VL / Qwen2.5-VL conditional-generation model (HF `Qwen2VLForConditionalGeneration`).
#[derive(Module, Debug)]
pub struct QwenVl<B: Backend> {
    pub text: TextModel<B>,
    pub visual: VisionTower<B>,
    pub config: QwenVlConfig,
    pub positions: MropePositions,
}

impl FamilyConfig for QwenVlConfig {
    const IMAGE_PROCESSOR: Option<ImageProcessorLoader> = Some(processor::load_boxed);

    fn parse(json: &serde_json::Value) -> Result<Self> {
        Self::from_value(json)
    }

    fn initializer_range(&self) -> f64 {
        self.text.initializer_range
    }
}

impl<B: Backend> FamilyModel<B> for QwenVl<B> {
    type Config = QwenVlConfig;

    fn new(device: &B::Device, config: &QwenVlConfig) -> Self {
        Self {
            visual: VisionTower::new(device, &config.vision, config.flavor),
            text: TextModel::new(device, &config.text),
            config: config.clone(),
            positions: MropePositions {
                image_token_id: config.image_token_id,
                video_token_id: config.video_token_id,
                spatial_merge_size: config.vision.spatial_merge_size,
                video_time: match config.flavor {
                    Flavor::Qwen2Vl => VideoTime::Index,
                    Flavor::Qwen25Vl => VideoTime::Seconds {
                        tokens_per_second: config.tokens_per_second(),
                    },
                },
            },
        }
    }

    fn config_json(&self) -> String {
        self.config.to_json()
    }

    fn model_type(&self) -> &'static str {
        self.config.flavor.model_type()
    }

    fn vision(&self) -> Option<&dyn Vision<B>> {
        Some(self)
    }

    /// The whole `visual` module — patch embedding, blocks and the patch merger (projector into
    /// the text width) — exactly the module verl freezes, since transformers'
    /// `Qwen2VisionTransformerPretrainedModel` owns `merger`.
    fn visit_vision_tower<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        self.visual.visit(visitor)
    }

    fn multimodal_positions(&self) -> Option<&dyn MultimodalPositions> {
        Some(&self.positions)
    }
}

/// Every weight under its legacy hub name: `visual.*` (the tower and its merger), then the
/// decoder `model.*` and `lm_head.weight`.
impl<B: Backend> Weights<B> for QwenVl<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        self.visual.weights(w, prefix);
        self.text.weights(w, prefix);
    }
}

impl<B: Backend> QwenVl<B> {
    /// Image embeddings with the vision intermediates (for parity tests).
    pub fn embed_images_traced(
        &self,
        images: &[ProcessedImage],
        device: &B::Device,
    ) -> Result<(Tensor<B, 2>, VisionTrace<B>)> {
        let (pixels, grids) = self.visual.inputs(images, device)?;
        let mut trace = VisionTrace::default();
        let out = self.visual.forward(pixels, &grids, Some(&mut trace));
        Ok((out, trace))
    }
}

/// The [`CausalLm`] of a Qwen model struct with a decoder `text` (`embed`, `forward`, `logits`,
/// `layers`, `decoder_inputs`, `layer_input_channels`, `segment`, `final_norm`) and a
/// [`config::TextConfig`] at `config.text`: Qwen2-VL's and Qwen3-VL's.
macro_rules! qwen_causal_lm {
    ($model:ident) => {
        impl<B: Backend> CausalLm<B> for $model<B> {
            fn embed_tokens(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
                self.text.embed(ids)
            }

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

            fn decoder_segments(&self) -> Vec<std::ops::Range<usize>> {
                (0..self.text.layers.len()).map(|i| i..i + 1).collect()
            }

            fn decoder_inputs(
                &self,
                _ids: Tensor<B, 2, Int>,
                embeds: Tensor<B, 3>,
            ) -> $crate::capabilities::DecoderInputs<B> {
                self.text.decoder_inputs(embeds)
            }

            fn layer_input_channels(
                &self,
                layers: std::ops::Range<usize>,
            ) -> std::ops::Range<usize> {
                self.text.layer_input_channels(layers)
            }

            fn decoder_segment(
                &self,
                layers: std::ops::Range<usize>,
                h: Tensor<B, 3>,
                layer_inputs: Option<Tensor<B, 3>>,
                positions: Tensor<B, 3, Int>,
                attention_mask: Tensor<B, 2, Int>,
            ) -> Tensor<B, 3> {
                self.text
                    .segment(layers, h, layer_inputs, positions, attention_mask)
            }

            fn final_norm(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
                self.text.final_norm(h)
            }

            fn new_cache(&self) -> KvCache<B> {
                KvCache::new(self.text.layers.len())
            }

            fn kv_cache_bytes_per_token(&self) -> usize {
                let t = &self.config.text;
                let element = self.text.embed_tokens.val().dtype().size();
                t.num_layers * 2 * t.num_kv_heads * t.head_dim * element
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
    };
}
pub(crate) use qwen_causal_lm;

qwen_causal_lm!(QwenVl);

impl<B: Backend> Vision<B> for QwenVl<B> {
    fn image_token_id(&self) -> u32 {
        self.config.image_token_id
    }

    fn video_token_id(&self) -> Option<u32> {
        Some(self.config.video_token_id)
    }

    fn embed_images(&self, images: &[ProcessedImage], device: &B::Device) -> Result<Tensor<B, 2>> {
        let (pixels, grids) = self.visual.inputs(images, device)?;
        Ok(self.visual.forward(pixels, &grids, None))
    }
}
