//! The whole Gemma 4 model (`Gemma4ForConditionalGeneration`): text decoder plus optional vision
//! tower, exposed through the capability traits [`CausalLm`] and [`Vision`]. Gemma 4 has no
//! multimodal-position capability: callers give it plain 1-D positions from the attention mask
//! ([`crate::plain_positions`]). Loading and saving go through [`crate::model::Model`].

use std::ops::Range;

use anyhow::{Context, Result, ensure};
use burn::prelude::*;

use super::config::Gemma4Config;
use super::text::{TextModel, TextTrace};
use super::vision::{VisionTower, VisionTrace};
use burn::module::ModuleVisitor;

use crate::capabilities::{CausalLm, DecoderInputs, KvCache, ProcessedImage, Vision};
use crate::family::{FamilyConfig, FamilyModel, ImageProcessorLoader};
use crate::weights::{WeightNames, Weights};

/// A Gemma 4 conditional-generation model.
#[derive(Module, Debug)]
pub struct Gemma4<B: Backend> {
    pub language_model: TextModel<B>,
    /// Absent for checkpoints without `vision_config`.
    pub vision: Option<VisionTower<B>>,
    pub config: Gemma4Config,
}

impl FamilyConfig for Gemma4Config {
    const IMAGE_PROCESSOR: Option<ImageProcessorLoader> = Some(super::processor::load_boxed);

    fn parse(json: &serde_json::Value) -> Result<Self> {
        Self::from_value(json)
    }

    fn initializer_range(&self) -> f64 {
        Gemma4Config::initializer_range(self)
    }
}

impl<B: Backend> FamilyModel<B> for Gemma4<B> {
    type Config = Gemma4Config;

    /// The decoder and, when the config has `vision_config`, the vision tower.
    fn new(device: &B::Device, config: &Gemma4Config) -> Self {
        Self {
            language_model: TextModel::new(device, config),
            vision: config
                .vision_config
                .as_ref()
                .map(|vc| VisionTower::new(device, vc, config.text_config.hidden_size)),
            config: config.clone(),
        }
    }

    fn config_json(&self) -> String {
        self.config.to_json()
    }

    fn model_type(&self) -> &'static str {
        "gemma4"
    }

    fn vision(&self) -> Option<&dyn Vision<B>> {
        self.vision.as_ref().map(|_| self as &dyn Vision<B>)
    }

    /// The vision encoder and its `embed_vision` projection (the tower together with its
    /// projector, as for the Qwen families); verl's helper looks only for a `visual` attribute
    /// and freezes nothing there. No multimodal positions: plain 1-D ones from the mask.
    fn visit_vision_tower<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        if let Some(v) = &self.vision {
            v.visit(visitor)
        }
    }
}

/// Every weight under its transformers-5 name: the decoder `model.language_model.*`, the
/// vision tower when present (`model.vision_tower.*`, `model.embed_vision.*`); a stored
/// `lm_head.weight` is ignored (the head is tied to `embed_tokens`).
impl<B: Backend> Weights<B> for Gemma4<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        self.language_model.weights(w, prefix);
        if let Some(v) = &mut self.vision {
            v.weights(w, prefix);
        }
        w.ignore(&crate::weights::join(prefix, "lm_head.weight"));
    }
}

impl<B: Backend> Gemma4<B> {
    /// Full forward with intermediates (for parity tests): the decoder's final-normed hidden
    /// states and its trace. `positions` `[1, B, L]`.
    pub fn forward_traced(
        &self,
        ids: Tensor<B, 2, Int>,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        mask: Tensor<B, 2, Int>,
    ) -> (Tensor<B, 3>, TextTrace<B>) {
        let (h, t) = self
            .language_model
            .forward(ids, embeds, positions, mask, None, true);
        (h, t.expect("trace requested"))
    }

    /// Image embeddings with the vision intermediates (for parity tests).
    pub fn embed_images_traced(
        &self,
        images: &[ProcessedImage],
        device: &B::Device,
    ) -> Result<(Tensor<B, 2>, VisionTrace<B>)> {
        let (e, t) = self.tower()?.forward(images, device, true)?;
        Ok((e, t.expect("trace requested")))
    }

    fn tower(&self) -> Result<&VisionTower<B>> {
        self.vision
            .as_ref()
            .context("this Gemma 4 checkpoint has no vision tower")
    }
}

impl<B: Backend> CausalLm<B> for Gemma4<B> {
    fn embed_tokens(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.language_model.embed(ids)
    }

    /// `positions` must hold one stream (plain 1-D RoPE).
    fn forward_hidden(
        &self,
        ids: Tensor<B, 2, Int>,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let streams = positions.dims()[0];
        assert_eq!(
            streams, 1,
            "Gemma 4 uses plain 1-D positions, got {streams} position streams"
        );
        self.language_model
            .forward(ids, embeds, positions, attention_mask, cache, false)
            .0
    }

    fn lm_head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.language_model.lm_head(hidden)
    }

    fn decoder_segments(&self) -> Vec<Range<usize>> {
        self.language_model.segments()
    }

    /// The embeddings as the stream; the per-layer inputs `[B, L, n_layers·P]`.
    fn decoder_inputs(&self, ids: Tensor<B, 2, Int>, embeds: Tensor<B, 3>) -> DecoderInputs<B> {
        let [b, l, _] = embeds.dims();
        let (ple, _) = self.language_model.per_layer_inputs(ids, embeds.clone());
        let [_, _, n, p] = ple.dims();
        DecoderInputs {
            stream: embeds,
            layer_inputs: Some(ple.reshape([b, l, n * p])),
        }
    }

    fn layer_input_channels(&self, layers: Range<usize>) -> Range<usize> {
        self.language_model.layer_input_channels(layers)
    }

    fn decoder_segment(
        &self,
        layers: Range<usize>,
        h: Tensor<B, 3>,
        layer_inputs: Option<Tensor<B, 3>>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
    ) -> Tensor<B, 3> {
        let [b, l, _] = h.dims();
        let ple = layer_inputs
            .expect("Gemma 4's layers read their per-layer inputs")
            .reshape([b, l, layers.len(), self.language_model.info.ple_dim]);
        self.language_model
            .run_layers(layers, h, ple, positions, attention_mask, None, None)
    }

    fn final_norm(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
        self.language_model.norm.forward(h)
    }

    fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.language_model.layers.len())
    }

    /// Only the layers with their own keys and values store them (KV-sharing layers read
    /// their source layer's); head widths differ between sliding and full layers.
    fn kv_cache_bytes_per_token(&self) -> usize {
        let element = self.language_model.embed_tokens.val().dtype().size();
        self.config
            .layers
            .iter()
            .filter(|l| matches!(l.kv, crate::gemma4::config::KvSource::Own))
            .map(|l| 2 * l.num_kv_heads * l.head_dim * element)
            .sum()
    }

    fn vocab_size(&self) -> usize {
        self.config.text_config.vocab_size
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.config.text_config.eos_token_ids()
    }

    fn context_length(&self) -> usize {
        self.config.text_config.max_position_embeddings
    }

    fn hidden_size(&self) -> usize {
        self.config.text_config.hidden_size
    }
}

impl<B: Backend> Vision<B> for Gemma4<B> {
    fn image_token_id(&self) -> u32 {
        self.config.image_token_id
    }

    fn embed_images(&self, images: &[ProcessedImage], device: &B::Device) -> Result<Tensor<B, 2>> {
        if images.is_empty() {
            return Ok(Tensor::zeros([0, self.hidden_size()], device));
        }
        let (embeds, _) = self.tower()?.forward(images, device, false)?;
        ensure!(
            embeds.dims()[1] == self.hidden_size(),
            "image embeddings are not in the text width"
        );
        Ok(embeds)
    }
}
