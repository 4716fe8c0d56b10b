//! The whole Gemma 4 model (`Gemma4ForConditionalGeneration`): text decoder plus optional vision
//! tower, loaded from and saved to a Hugging Face directory, exposed through the capability
//! traits [`CausalLm`] and [`Vision`]. Gemma 4 has no multimodal-position capability: callers
//! give it plain 1-D positions from the attention mask ([`crate::plain_positions`]).

use std::path::Path;

use anyhow::{Context, Result, ensure};
use burn::prelude::*;

use super::config::Gemma4Config;
use super::text::{TextModel, TextTrace};
use super::vision::{VisionTower, VisionTrace};
use super::weights::{NamedTensors, WeightReader, write_safetensors};
use crate::capabilities::{CausalLm, KvCache, ProcessedImage, Vision};

/// A loaded Gemma 4 checkpoint.
#[derive(Module, Debug)]
pub struct Gemma4Model<B: Backend> {
    pub language_model: TextModel<B>,
    pub vision: Option<VisionTower<B>>,
    pub meta: Gemma4Meta,
}

/// Host-side facts kept from `config.json`.
#[derive(Debug, Clone)]
pub struct Gemma4Meta {
    pub config: Gemma4Config,
    /// The original `config.json`, written back verbatim on save.
    pub raw_config: serde_json::Value,
}

impl<B: Backend> Gemma4Model<B> {
    /// Loads `config.json` and the safetensors weights of a Hugging Face directory. Every
    /// missing, mis-shaped or unexpected tensor is named in one error. `lm_head.weight` is tied
    /// to `embed_tokens` and ignored when stored.
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        let config = Gemma4Config::from_dir(dir)?;
        let raw_path = dir.join("config.json");
        let raw_config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&raw_path)
                .with_context(|| format!("reading {}", raw_path.display()))?,
        )?;
        let mut w = WeightReader::from_dir(dir)?;
        let language_model = TextModel::load(&config, &mut w, device)?;
        let vision = match &config.vision_config {
            Some(vc) => Some(VisionTower::load(
                vc,
                config.text_config.hidden_size,
                &mut w,
                device,
            )?),
            None => None,
        };
        w.ignore("lm_head.weight");
        w.finish()?;
        Ok(Self {
            language_model,
            vision,
            meta: Gemma4Meta { config, raw_config },
        })
    }

    /// Every tensor under its Hugging Face name (`state_dict` names, `lm_head` omitted as tied).
    pub fn named_tensors(&self) -> NamedTensors<B> {
        let mut out = NamedTensors::default();
        self.language_model.named(&mut out);
        if let Some(v) = &self.vision {
            v.named(&mut out);
        }
        out
    }

    /// Writes `config.json` and `model.safetensors` (f32) into `dir`, in the layout
    /// [`Gemma4Model::load`] and transformers read.
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let config = serde_json::to_string_pretty(&self.meta.raw_config)?;
        std::fs::write(dir.join("config.json"), config + "\n")
            .with_context(|| format!("writing {}", dir.join("config.json").display()))?;
        write_safetensors(
            &self.named_tensors().to_host()?,
            &dir.join("model.safetensors"),
        )
    }

    /// The `[B, L]` stream of `[1, B, L]` positions.
    fn one_stream(positions: Tensor<B, 3, Int>) -> Tensor<B, 2, Int> {
        let [streams, b, l] = positions.dims();
        assert_eq!(
            streams, 1,
            "Gemma 4 uses plain 1-D positions, got {streams} position streams"
        );
        positions.reshape([b, l])
    }

    /// Full forward with intermediates (for parity tests): the decoder's final-normed hidden
    /// states and its trace.
    pub fn forward_traced(
        &self,
        ids: Tensor<B, 2, Int>,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 2, Int>,
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
        let tower = self
            .vision
            .as_ref()
            .context("this Gemma 4 checkpoint has no vision tower")?;
        let (e, t) = tower.forward(images, device, true)?;
        Ok((e, t.expect("trace requested")))
    }
}

impl<B: Backend> CausalLm<B> for Gemma4Model<B> {
    fn embed_tokens(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.language_model.embed(ids)
    }

    fn forward_hidden(
        &self,
        ids: Tensor<B, 2, Int>,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        self.language_model
            .forward(
                ids,
                embeds,
                Self::one_stream(positions),
                attention_mask,
                cache,
                false,
            )
            .0
    }

    fn lm_head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.language_model.lm_head(hidden)
    }

    fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.language_model.layers.len())
    }

    fn vocab_size(&self) -> usize {
        self.meta.config.text_config.vocab_size
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.meta.config.text_config.eos_token_ids()
    }

    fn context_length(&self) -> usize {
        self.meta.config.text_config.max_position_embeddings
    }

    fn hidden_size(&self) -> usize {
        self.meta.config.text_config.hidden_size
    }
}

impl<B: Backend> Vision<B> for Gemma4Model<B> {
    fn image_token_id(&self) -> u32 {
        self.meta.config.image_token_id
    }

    fn embed_images(&self, images: &[ProcessedImage], device: &B::Device) -> Result<Tensor<B, 2>> {
        if images.is_empty() {
            return Ok(Tensor::zeros([0, self.hidden_size()], device));
        }
        let tower = self
            .vision
            .as_ref()
            .context("this Gemma 4 checkpoint has no vision tower")?;
        let (embeds, _) = tower.forward(images, device, false)?;
        ensure!(
            embeds.dims()[1] == self.hidden_size(),
            "image embeddings are not in the text width"
        );
        Ok(embeds)
    }
}
