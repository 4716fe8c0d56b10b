//! A model's sizes from its `config.json` alone, for planning memory and FLOPs before anything
//! loads (`flowrl plan`): a shape-only build ([`Model::shape_only`]: every weight one zero
//! expanded to its shape, nothing of the model's size allocated) gives the parameter counts
//! exactly as the loaded model has them, and its [`CausalLm::kv_cache_bytes_per_token`](crate::capabilities::CausalLm::kv_cache_bytes_per_token) is the
//! very function the rollout's KV-cache budget divides by; the widths come from the config.

use anyhow::{Context, Result};
use burn::backend::Flex;
use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::DType;
use serde_json::Value;

use crate::lora::{LoraConfig, in_vision_tower};
use crate::model::Model;
use crate::weights::{Init, Precision, ShapeOnly, WeightSource};

/// What memory and compute depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelShape {
    /// Every parameter (vision tower, embeddings and LM head included; adapters excluded).
    pub params: u64,
    /// Parameters of the vision tower (mergers included).
    pub vision_params: u64,
    /// Parameters of the LoRA adapters the configuration attaches (0 without LoRA).
    pub adapter_params: u64,
    /// `vocab × hidden`: the input embedding, a lookup that costs no FLOPs.
    pub embedding_params: u64,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    /// `heads · head_dim`: the width of the queries and of the attention's output (the hidden
    /// size unless the config sets a `head_dim` of its own).
    pub attention_width: usize,
    pub vocab: usize,
    /// KV-cache bytes per token in the precision the shape was built in.
    pub kv_cache_bytes_per_token: u64,
    /// The vision tower's width, depth and attention heads (0 without one).
    pub vision_hidden: usize,
    pub vision_layers: usize,
    pub vision_heads: usize,
    /// Floats per patch of the processor's `pixel_values` (`3 · temporal_patch · patch²`).
    pub patch_values: usize,
    /// Patches per image token (`spatial_merge_size²`, Gemma 4: `pooling_kernel_size²`).
    pub patches_per_token: usize,
}

impl ModelShape {
    /// The shape of `config_json` with weights in `precision` and, when given, the adapters of
    /// `lora` (fresh adapters: every linear it matches).
    pub fn of_config(
        config_json: &str,
        precision: Precision,
        lora: Option<&LoraConfig>,
    ) -> Result<Self> {
        let device = Default::default();
        let json: Value = serde_json::from_str(config_json).context("config.json is not JSON")?;
        let mut shapes = CountAdapters {
            inner: ShapeOnly::<Flex>::new(&device, precision),
            lora,
            params: 0,
        };
        let model = Model::<Flex>::build_from(config_json, &mut shapes)?;
        let adapter_params = shapes.params;
        let params = model.num_params() as u64;
        let mut vision = Count(0);
        model.visit_vision_tower(&mut vision);
        let lm = model.causal_lm();
        let text = json.get("text_config").unwrap_or(&json);
        let vision_json = json.get("vision_config");
        let int = |v: Option<&Value>, keys: &[&str]| {
            keys.iter()
                .find_map(|k| v.and_then(|v| v.get(*k)).and_then(Value::as_u64))
                .unwrap_or(0) as usize
        };
        let hidden = lm.hidden_size();
        let vocab = lm.vocab_size();
        let vision_hidden = int(vision_json, &["embed_dim", "hidden_size"]);
        let patch = int(vision_json, &["patch_size"]);
        let temporal = int(vision_json, &["temporal_patch_size"]).max(1);
        let merge = int(vision_json, &["spatial_merge_size", "pooling_kernel_size"]).max(1);
        Ok(ModelShape {
            params,
            vision_params: vision.0,
            adapter_params,
            embedding_params: (vocab * hidden) as u64,
            hidden,
            intermediate: int(Some(text), &["intermediate_size"]),
            layers: int(Some(text), &["num_hidden_layers"]),
            heads: int(Some(text), &["num_attention_heads"]),
            attention_width: match int(Some(text), &["head_dim"]) {
                0 => hidden,
                d => d * int(Some(text), &["num_attention_heads"]),
            },
            vocab,
            kv_cache_bytes_per_token: lm.kv_cache_bytes_per_token() as u64,
            vision_hidden,
            vision_layers: int(vision_json, &["depth", "num_hidden_layers"]),
            vision_heads: int(vision_json, &["num_heads", "num_attention_heads"]),
            patch_values: 3 * temporal * patch * patch,
            patches_per_token: merge * merge,
        })
    }

    /// Parameters whose weights multiply each token in the decoder: all but the vision tower,
    /// the input embedding and the LM head (which only the positions whose logits are taken
    /// multiply).
    pub fn decoder_matmul_params(&self) -> u64 {
        self.params
            .saturating_sub(self.vision_params)
            .saturating_sub(self.embedding_params)
            .saturating_sub(self.lm_head_params())
    }

    /// `hidden × vocab`, the LM head's multiply-adds per position (tied or not).
    pub fn lm_head_params(&self) -> u64 {
        (self.hidden * self.vocab) as u64
    }
}

/// Counts the parameters of a visited module.
struct Count(u64);

impl<B: Backend> ModuleVisitor<B> for Count {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0 += param.shape().num_elements() as u64;
    }
}

/// A shape-only source that counts the parameters of the adapters `lora` would attach
/// (`rank · (in + out)` per matched linear) without building them.
struct CountAdapters<'a> {
    inner: ShapeOnly<Flex>,
    lora: Option<&'a LoraConfig>,
    params: u64,
}

impl WeightSource<Flex> for CountAdapters<'_> {
    fn device(&self) -> burn::tensor::Device<Flex> {
        self.inner.device()
    }
    fn dtype(&self) -> DType {
        self.inner.dtype()
    }
    fn take_data(&mut self, name: &str, shape: &[usize], init: Init) -> TensorData {
        self.inner.take_data(name, shape, init)
    }
    fn ignore(&mut self, name: &str) {
        self.inner.ignore(name)
    }
    fn placeholders(&self) -> bool {
        true
    }
    fn lora_adapter(
        &mut self,
        module: &str,
        in_dim: usize,
        out_dim: usize,
    ) -> Option<crate::lora::Lora<Flex>> {
        if let Some(c) = self.lora
            && c.matches(module, in_vision_tower(module))
        {
            self.params += (c.rank * (in_dim + out_dim)) as u64;
        }
        None
    }
}
