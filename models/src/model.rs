//! [`Model`]: a loaded model of any registered family, as one burn `Module` (so optimizers can
//! step it and autodiff can differentiate it) that exposes its capabilities.
//!
//! Loading reads a Hugging Face directory (config.json + safetensors, single or sharded);
//! saving writes the same layout back; [`Model::random`] builds randomly initialised weights from
//! a config (tiny default models, benchmarks). Callers use `causal_lm()`, `vision()` and
//! `multimodal_positions()`, never the variant.

use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::prelude::*;

use crate::capabilities::{
    CausalLm, MultimodalPositions, PaddedBatch, PositionIds, ProcessedImage, Vision,
    plain_positions, scatter_image_embeddings,
};
use crate::checkpoint::{Checkpoint, write_checkpoint};
use crate::gemma4::{Gemma4, Gemma4Config};
use crate::lora::Merged;
use crate::qwen2_vl::{QwenVl, QwenVlConfig};
use crate::qwen3_vl::{Qwen3Vl, Qwen3VlConfig};
use crate::weights::{
    Precision, RandomInit, SavedSizes, ShapeOnly, WeightSink, WeightSource, WeightVisitor,
};

/// A model of any registered family.
// One value per loaded model, so the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Model<B: Backend> {
    /// Qwen2-VL and Qwen2.5-VL.
    QwenVl(QwenVl<B>),
    /// Gemma 4.
    Gemma4(Gemma4<B>),
    /// Qwen3-VL.
    Qwen3Vl(Qwen3Vl<B>),
}

/// A parsed config of any registered family.
#[allow(clippy::large_enum_variant)]
enum FamilyConfig {
    QwenVl(QwenVlConfig),
    Gemma4(Box<Gemma4Config>),
    Qwen3Vl(Box<Qwen3VlConfig>),
}

fn parse_config(text: &str) -> Result<FamilyConfig> {
    let json: serde_json::Value = serde_json::from_str(text).context("parsing config.json")?;
    let model_type = json
        .get("model_type")
        .and_then(|v| v.as_str())
        .context("config.json has no string `model_type`")?;
    crate::registry::family(model_type)?;
    match model_type {
        "qwen2_vl" | "qwen2_5_vl" => Ok(FamilyConfig::QwenVl(QwenVlConfig::from_value(&json)?)),
        "gemma4" => Ok(FamilyConfig::Gemma4(Box::new(Gemma4Config::from_value(
            &json,
        )?))),
        "qwen3_vl" => Ok(FamilyConfig::Qwen3Vl(Box::new(Qwen3VlConfig::from_value(
            &json,
        )?))),
        other => bail!("model_type `{other}` is registered but has no model implementation"),
    }
}

impl<B: Backend> Model<B> {
    fn build(config: &FamilyConfig, src: &mut dyn WeightSource<B>) -> Self {
        match config {
            FamilyConfig::QwenVl(c) => Model::QwenVl(QwenVl::load(src, c)),
            FamilyConfig::Gemma4(c) => Model::Gemma4(Gemma4::load(src, c)),
            FamilyConfig::Qwen3Vl(c) => Model::Qwen3Vl(Qwen3Vl::load(src, c)),
        }
    }

    /// The model of the config in `config_json` (the text of a config.json) with every weight
    /// taken from `src` (a checkpoint, random init, or a wrapper such as
    /// [`crate::lora::LoraSource`]).
    pub fn build_from(config_json: &str, src: &mut dyn WeightSource<B>) -> Result<Self> {
        Ok(Self::build(&parse_config(config_json)?, src))
    }

    /// Loads a Hugging Face model directory: `config.json` and `model.safetensors` or the shards
    /// of `model.safetensors.index.json`. Missing, unexpected and mis-shaped tensors are all
    /// reported, by name, in one error.
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        Self::load_with_precision(dir, device, Precision::F32)
    }

    /// [`Model::load`] with the weights created in `precision` (bf16/f16 for CUDA; checkpoints
    /// of any stored float dtype are converted as the shards are read, see
    /// [`crate::checkpoint`]).
    pub fn load_with_precision(
        dir: &Path,
        device: &B::Device,
        precision: Precision,
    ) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let config = parse_config(&text).with_context(|| format!("in {}", path.display()))?;
        let mut ckpt = Checkpoint::<B>::open(dir, device, precision)?;
        let model = Self::build(&config, &mut ckpt);
        ckpt.finish()?;
        Ok(model)
    }

    /// A randomly initialised model of the config in `config_json` (the text of a config.json):
    /// normal weights with the config's `initializer_range` (0.02 when absent), zero biases,
    /// unit norm weights; deterministic in `seed`.
    pub fn random(config_json: &str, device: &B::Device, seed: u64) -> Result<Self> {
        Self::random_with_precision(config_json, device, seed, Precision::F32)
    }

    /// [`Model::random`] with the weights created in `precision`.
    pub fn random_with_precision(
        config_json: &str,
        device: &B::Device,
        seed: u64,
        precision: Precision,
    ) -> Result<Self> {
        let config = parse_config(config_json)?;
        let std = match &config {
            FamilyConfig::QwenVl(c) => c.text.initializer_range as f32,
            FamilyConfig::Gemma4(c) => c.initializer_range() as f32,
            FamilyConfig::Qwen3Vl(c) => c.text.initializer_range as f32,
        };
        let mut src = RandomInit::<B>::new(device, seed, std).with_precision(precision);
        Ok(Self::build(&config, &mut src))
    }

    /// The model of `config_json` with placeholder weights ([`ShapeOnly`]: every tensor one zero
    /// expanded to its shape, nothing of the model's size allocated): checks that a config
    /// parses and builds, and counts its parameters (`Module::num_params`), for any model size.
    /// Its outputs are meaningless.
    pub fn shape_only(config_json: &str, device: &B::Device, precision: Precision) -> Result<Self> {
        let config = parse_config(config_json)?;
        Ok(Self::build(
            &config,
            &mut ShapeOnly::<B>::new(device, precision),
        ))
    }

    /// The model with every float weight cast to `precision`, parameter ids kept. Under
    /// autodiff the casts are recorded, so the gradient of a loss computed with the cast model
    /// reaches this model's own weights in their dtype: the f32 master weights of mixed-precision
    /// training (`GradientsParams::from_grads` on the uncast model).
    pub fn cast(self, precision: Precision) -> Self {
        use burn::module::{ModuleMapper, Param};
        struct Cast(burn::tensor::DType);
        impl<B: Backend> ModuleMapper<B> for Cast {
            fn map_float<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D>>,
            ) -> Param<Tensor<B, D>> {
                let dtype = self.0;
                param.map(|t| if t.dtype() == dtype { t } else { t.cast(dtype) })
            }
        }
        self.map(&mut Cast(precision.dtype()))
    }

    /// Writes the model as a Hugging Face directory: `config.json` and safetensors with every
    /// weight in its own dtype (an f32 model writes F32), sharded with an index when larger
    /// than `max_shard_bytes`; loadable by [`Model::load`] and by transformers.
    pub fn save(&self, dir: &Path, max_shard_bytes: Option<usize>) -> Result<()> {
        self.save_as(dir, max_shard_bytes, None)
    }

    /// [`Model::save`] with every weight (and host buffer) converted to `precision` (each in its
    /// own dtype when `None`). Streamed: one pass over the model plans the shards from shapes
    /// and dtypes, then each shard's tensors are collected, written and dropped before the next,
    /// so the host holds at most one shard besides the model.
    pub fn save_as(
        &self,
        dir: &Path,
        max_shard_bytes: Option<usize>,
        precision: Option<Precision>,
    ) -> Result<()> {
        self.save_streamed(dir, max_shard_bytes, precision, false)
    }

    /// [`Model::save_as`], with every LoRA adapter folded into its weight when `merge_adapters`
    /// (merging changes no name, shape or dtype, so the plain export plans the shards).
    pub(crate) fn save_streamed(
        &self,
        dir: &Path,
        max_shard_bytes: Option<usize>,
        precision: Option<Precision>,
        merge_adapters: bool,
    ) -> Result<()> {
        let mut plan = SavedSizes::new(precision);
        self.export(&mut plan);
        write_checkpoint(dir, &plan.sizes, max_shard_bytes, |names| {
            let mut sink = WeightSink::shard(names, precision);
            if merge_adapters {
                self.export(&mut Merged(&mut sink));
            } else {
                self.export(&mut sink);
            }
            Ok(sink.into_tensors())
        })?;
        let path = dir.join("config.json");
        std::fs::write(&path, self.config_json())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }

    /// Every weight under its checkpoint name.
    pub fn export<V: WeightVisitor<B>>(&self, sink: &mut V) {
        match self {
            Model::QwenVl(m) => m.export(sink),
            Model::Gemma4(m) => m.export(sink),
            Model::Qwen3Vl(m) => m.export(sink),
        }
    }

    /// The config.json text describing this model.
    pub fn config_json(&self) -> String {
        match self {
            Model::QwenVl(m) => m.config.to_json(),
            Model::Gemma4(m) => m.config.to_json(),
            Model::Qwen3Vl(m) => m.config.to_json(),
        }
    }

    /// `config.json`'s `model_type` (for messages and metadata only; behaviour follows the
    /// capabilities).
    pub fn model_type(&self) -> &'static str {
        match self {
            Model::QwenVl(m) => m.config.flavor.model_type(),
            Model::Gemma4(_) => "gemma4",
            Model::Qwen3Vl(_) => "qwen3_vl",
        }
    }

    /// The causal-LM capability (every family has it).
    pub fn causal_lm(&self) -> &dyn CausalLm<B> {
        match self {
            Model::QwenVl(m) => m,
            Model::Gemma4(m) => m,
            Model::Qwen3Vl(m) => m,
        }
    }

    /// The vision capability, for families that take images.
    pub fn vision(&self) -> Option<&dyn Vision<B>> {
        match self {
            Model::QwenVl(m) => Some(m),
            Model::Gemma4(m) => m.vision.as_ref().map(|_| m as &dyn Vision<B>),
            Model::Qwen3Vl(m) => Some(m),
        }
    }

    /// Visits the parameters of the vision tower (none for a model without one), for optimizers
    /// that freeze the tower (verl's `actor.freeze_vision_tower`, which sets
    /// `requires_grad=False` on the module `get_vl_model_vision_tower` returns).
    ///
    /// Qwen2-VL / Qwen2.5-VL: the whole `visual` module — patch embedding, blocks and the patch
    /// merger (projector into the text width) — exactly the module verl freezes, since
    /// transformers' `Qwen2VisionTransformerPretrainedModel` owns `merger`. Gemma 4: the vision
    /// encoder and its `embed_vision` projection, the same choice (the tower together with its
    /// projector); verl's helper looks only for a `visual` attribute and freezes nothing there.
    /// Qwen3-VL: the whole `visual` module, its DeepStack mergers included (transformers'
    /// `Qwen3VLVisionModel` owns `deepstack_merger_list`).
    pub fn visit_vision_tower<V: burn::module::ModuleVisitor<B>>(&self, visitor: &mut V) {
        match self {
            Model::QwenVl(m) => m.visual.visit(visitor),
            Model::Qwen3Vl(m) => m.visual.visit(visitor),
            Model::Gemma4(m) => {
                if let Some(v) = &m.vision {
                    v.visit(visitor)
                }
            }
        }
    }

    /// Ids of the parameters [`Model::visit_vision_tower`] visits.
    pub fn vision_param_ids(&self) -> Vec<burn::module::ParamId> {
        use burn::module::{ModuleVisitor, Param, ParamId};
        struct Ids(Vec<ParamId>);
        impl<B: Backend> ModuleVisitor<B> for Ids {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                self.0.push(param.id);
            }
        }
        let mut ids = Ids(Vec::new());
        self.visit_vision_tower(&mut ids);
        ids.0
    }

    /// The multimodal position-id capability, for families with multimodal RoPE.
    pub fn multimodal_positions(&self) -> Option<&dyn MultimodalPositions> {
        match self {
            Model::QwenVl(m) => Some(&m.positions),
            Model::Gemma4(_) => None,
            Model::Qwen3Vl(m) => Some(&m.positions),
        }
    }

    /// Position ids of a prompt batch: the family's multimodal ones when it has them, else
    /// plain 1-D positions from the attention mask.
    pub fn position_ids(
        &self,
        batch: &PaddedBatch,
        images: &[ProcessedImage],
    ) -> Result<PositionIds> {
        match self.multimodal_positions() {
            Some(p) => p.position_ids(batch, images),
            None => Ok(plain_positions(batch)),
        }
    }

    /// Logits `[batch, len, vocab]` of every position of a batch with its images: input
    /// embeddings, position ids, the decoder and the LM head in one call (checks and tools;
    /// training and generation project only the positions they need).
    pub fn logits(
        &self,
        batch: &PaddedBatch,
        images: &[ProcessedImage],
        device: &B::Device,
    ) -> Result<Tensor<B, 3>> {
        let embeds = self.input_embeddings(batch, images, device)?;
        let positions = self.position_ids(batch, images)?;
        let lm = self.causal_lm();
        let hidden = lm.forward_hidden(
            batch.ids_tensor(device),
            embeds,
            positions.tensor(device),
            batch.mask_tensor(device),
            None,
        );
        Ok(lm.lm_head(hidden))
    }

    /// Input embeddings `[batch, len, hidden]` of a prompt batch: token embeddings with the
    /// image embeddings scattered into the image-token positions (`(1 + K) · hidden` wide when
    /// the images carry K layer-input blocks, see [`Vision::embed_images`]).
    pub fn input_embeddings(
        &self,
        batch: &PaddedBatch,
        images: &[ProcessedImage],
        device: &B::Device,
    ) -> Result<Tensor<B, 3>> {
        batch.validate()?;
        let lm = self.causal_lm();
        let embeds = lm.embed_tokens(batch.ids_tensor(device));
        match self.vision() {
            Some(v) if !images.is_empty() => {
                let image_embeds = v.embed_images(images, device)?;
                scatter_image_embeddings(embeds, &batch.ids, &v.vision_token_ids(), image_embeds)
            }
            Some(v) => {
                let vision_ids = v.vision_token_ids();
                let n = batch.ids.iter().filter(|t| vision_ids.contains(t)).count();
                if n > 0 {
                    bail!("the prompts hold {n} image tokens but no images were given");
                }
                Ok(embeds)
            }
            None if images.is_empty() => Ok(embeds),
            None => bail!("model `{}` takes no images", self.model_type()),
        }
    }
}

/// Files of a Hugging Face model directory that travel with its weights: tokenizer, chat
/// template, processor and generation configs.
pub const SIDE_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "generation_config.json",
];

/// Copies the [`SIDE_FILES`] that `from` holds into `to` (a checkpoint, an export).
pub fn copy_side_files(from: &Path, to: &Path) -> Result<()> {
    for file in SIDE_FILES {
        let src = from.join(file);
        if src.is_file() {
            std::fs::copy(&src, to.join(file))
                .with_context(|| format!("copying {} into {}", src.display(), to.display()))?;
        }
    }
    Ok(())
}
