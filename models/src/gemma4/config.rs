//! Gemma 4 `config.json` (transformers 5.x schema) and the per-layer layout derived from it.
//!
//! The file nests a `text_config` and a `vision_config` under the top-level multimodal config.
//! Per-layer facts that the file does not state explicitly (head dim of full layers, KV-sharing
//! sources, double-wide MLPs) are derived here once, in [`TextConfig::layers`], so the model code
//! reads a plain table. Audio is not supported (`audio_config` must be null).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};

use crate::config_checks::{MAX_COUNT, MAX_PATCH, MAX_WIDTH, ensure_at_most, ensure_positive};
use serde::{Deserialize, Serialize};

/// The whole `config.json` of a `Gemma4ForConditionalGeneration` checkpoint.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Gemma4Config {
    pub text_config: TextConfig,
    /// Absent for text-only checkpoints.
    #[serde(default)]
    pub vision_config: Option<VisionConfig>,
    /// The soft token whose positions receive image embeddings (`<|image|>`).
    pub image_token_id: u32,
    #[serde(default)]
    pub boi_token_id: Option<u32>,
    #[serde(default)]
    pub eoi_token_id: Option<u32>,
    #[serde(default)]
    pub video_token_id: Option<u32>,
    #[serde(default)]
    pub audio_token_id: Option<u32>,
    #[serde(default)]
    pub audio_config: Option<serde_json::Value>,
    /// The per-layer table derived from `text_config` ([`TextConfig::layers`]).
    #[serde(skip)]
    pub layers: Vec<LayerSpec>,
    /// The parsed `config.json` as written, kept to save it back unchanged.
    #[serde(skip)]
    pub raw: serde_json::Value,
}

/// RoPE parameters of one layer type (`text_config.rope_parameters[<layer type>]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct RopeParameters {
    pub rope_type: String,
    pub rope_theta: f64,
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
}

/// Per-layer overrides (`text_config.per_layer_config["<i>"]`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct LayerOverride {
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
}

/// `text_config` of a Gemma 4 checkpoint.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Head dim of sliding layers (full layers take theirs from `per_layer_config`).
    pub head_dim: usize,
    pub hidden_size_per_layer_input: usize,
    pub vocab_size_per_layer_input: usize,
    pub layer_types: Vec<String>,
    #[serde(default)]
    pub per_layer_config: BTreeMap<String, LayerOverride>,
    pub rope_parameters: BTreeMap<String, RopeParameters>,
    pub sliding_window: usize,
    #[serde(default)]
    pub num_kv_shared_layers: usize,
    #[serde(default)]
    pub use_double_wide_mlp: bool,
    #[serde(default)]
    pub final_logit_softcapping: Option<f64>,
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub hidden_activation: Option<String>,
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub attention_k_eq_v: bool,
    #[serde(default)]
    pub enable_moe_block: bool,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub initializer_range: Option<f64>,
    /// `null`/`false` only: bidirectional attention over image tokens is not implemented.
    #[serde(default)]
    pub use_bidirectional_attention: Option<serde_json::Value>,
}

fn default_max_positions() -> usize {
    131_072
}

/// `vision_config` of a Gemma 4 checkpoint.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    pub num_hidden_layers: usize,
    pub head_dim: usize,
    pub patch_size: usize,
    pub pooling_kernel_size: usize,
    pub position_embedding_size: usize,
    pub rms_norm_eps: f64,
    pub rope_parameters: RopeParameters,
    #[serde(default)]
    pub standardize: bool,
    #[serde(default = "yes")]
    pub use_clipped_linears: bool,
    #[serde(default)]
    pub hidden_activation: Option<String>,
}

fn yes() -> bool {
    true
}

/// Attention kind of a decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Causal attention over the last `window` positions (query included), default RoPE.
    Sliding { window: usize },
    /// Causal attention over every position, proportional (partial) RoPE.
    Full,
}

/// Where a layer's keys and values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvSource {
    /// The layer projects its own K/V.
    Own,
    /// The layer has no k/v projections and attends to the K/V of this earlier layer.
    Shared(usize),
}

/// Everything the decoder needs to know about one layer, derived from `text_config`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    pub kind: LayerKind,
    pub head_dim: usize,
    pub num_kv_heads: usize,
    pub intermediate_size: usize,
    pub kv: KvSource,
    pub rope_theta: f64,
    /// Channel pairs `(j, j + D/2)` that rotate; the remaining pairs pass through.
    pub rotary_pairs: usize,
}

impl Gemma4Config {
    /// Reads and checks `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        Self::from_value(&json).with_context(|| format!("in {}", path.display()))
    }

    /// Parses and checks a `config.json` value and derives the per-layer table.
    pub fn from_value(json: &serde_json::Value) -> Result<Self> {
        let mut config: Self =
            serde_json::from_value(json.clone()).context("parsing a Gemma 4 config.json")?;
        config.validate().context("unsupported Gemma 4 config")?;
        config.layers = config.text_config.layers()?;
        config.raw = json.clone();
        Ok(config)
    }

    /// The `config.json` text (the file it was read from, unchanged).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.raw).expect("a JSON value serialises") + "\n"
    }

    /// `text_config.initializer_range` (0.02 when absent), the std of random weights.
    pub fn initializer_range(&self) -> f64 {
        self.text_config.initializer_range.unwrap_or(0.02)
    }

    /// Rejects features this implementation does not cover.
    pub fn validate(&self) -> Result<()> {
        let t = &self.text_config;
        ensure!(
            self.audio_config.as_ref().is_none_or(|a| a.is_null()),
            "audio towers are not supported"
        );
        ensure!(!t.enable_moe_block, "MoE blocks are not supported");
        ensure!(!t.attention_k_eq_v, "attention_k_eq_v is not supported");
        ensure!(
            t.use_bidirectional_attention
                .as_ref()
                .is_none_or(|v| v.is_null() || v == &serde_json::Value::Bool(false)),
            "use_bidirectional_attention = {} is not supported (only null)",
            t.use_bidirectional_attention
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_default()
        );
        check_sizes(self)?;
        ensure!(
            t.hidden_size_per_layer_input > 0,
            "hidden_size_per_layer_input = 0 (no per-layer embeddings) is not supported"
        );
        ensure!(
            t.layer_types.len() == t.num_hidden_layers,
            "layer_types lists {} layers but num_hidden_layers is {}",
            t.layer_types.len(),
            t.num_hidden_layers
        );
        if let Some(v) = &self.vision_config {
            ensure!(!v.standardize, "vision standardize=true is not supported");
            ensure!(
                v.rope_parameters.rope_type == "axial",
                "vision rope_type `{}` is not supported (expected axial)",
                v.rope_parameters.rope_type
            );
            let kv = v.num_key_value_heads.unwrap_or(v.num_attention_heads);
            ensure!(
                kv > 0 && v.num_attention_heads % kv == 0,
                "vision: {} heads are not a multiple of {kv} KV heads",
                v.num_attention_heads
            );
            ensure!(
                v.head_dim % 4 == 0,
                "vision head_dim {} must be divisible by 4",
                v.head_dim
            );
        }
        t.layers().map(|_| ())
    }
}

impl TextConfig {
    /// EOS ids (`eos_token_id` may be one id or a list).
    pub fn eos_token_ids(&self) -> Vec<u32> {
        match &self.eos_token_id {
            Some(serde_json::Value::Number(n)) => {
                n.as_u64().map(|v| vec![v as u32]).unwrap_or_default()
            }
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_u64())
                .map(|v| v as u32)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Index of the first layer that reuses another layer's K/V:
    /// `num_hidden_layers − num_kv_shared_layers`.
    pub fn first_kv_shared_layer(&self) -> usize {
        self.num_hidden_layers
            .saturating_sub(self.num_kv_shared_layers)
    }

    /// Derives the per-layer table (transformers `Gemma4TextAttention.__init__` /
    /// `Gemma4TextMLP.__init__`):
    /// - head dim: `head_dim`, overridden by `per_layer_config["i"].head_dim`;
    /// - KV sharing: layers at or after `first_shared` reuse the K/V of the last layer of the same
    ///   type before `first_shared`;
    /// - MLP width: `intermediate_size`, doubled on KV-shared layers when `use_double_wide_mlp`;
    /// - RoPE: `rope_parameters[layer type]`; proportional RoPE rotates
    ///   `floor(partial_rotary_factor · D / 2)` channel pairs, default RoPE all `D / 2`.
    pub fn layers(&self) -> Result<Vec<LayerSpec>> {
        let first_shared = self.first_kv_shared_layer();
        let mut out = Vec::with_capacity(self.num_hidden_layers);
        for (i, ty) in self.layer_types.iter().enumerate() {
            let kind = match ty.as_str() {
                "sliding_attention" => LayerKind::Sliding {
                    window: self.sliding_window,
                },
                "full_attention" => LayerKind::Full,
                other => bail!("layer {i}: unknown layer type `{other}`"),
            };
            let over = self.per_layer_config.get(&i.to_string());
            let head_dim = over.and_then(|o| o.head_dim).unwrap_or(self.head_dim);
            let num_kv_heads = over
                .and_then(|o| o.num_key_value_heads)
                .unwrap_or(self.num_key_value_heads);
            ensure!(
                head_dim.is_multiple_of(2) && self.num_attention_heads.is_multiple_of(num_kv_heads),
                "layer {i}: head_dim {head_dim} must be even and {} heads a multiple of {num_kv_heads} KV heads",
                self.num_attention_heads
            );
            let kv = if i >= first_shared {
                match self.layer_types[..first_shared]
                    .iter()
                    .rposition(|t| t == ty)
                {
                    Some(src) => KvSource::Shared(src),
                    None => bail!("layer {i}: KV-shared {ty} layer has no earlier {ty} layer"),
                }
            } else {
                KvSource::Own
            };
            let intermediate_size = if matches!(kv, KvSource::Shared(_)) && self.use_double_wide_mlp
            {
                2 * self.intermediate_size
            } else {
                self.intermediate_size
            };
            let rope = self
                .rope_parameters
                .get(ty)
                .with_context(|| format!("rope_parameters has no entry for `{ty}`"))?;
            let rotary_pairs = match rope.rope_type.as_str() {
                "default" => head_dim / 2,
                "proportional" => {
                    let f = rope.partial_rotary_factor.unwrap_or(1.0);
                    ((f * head_dim as f64) / 2.0).floor() as usize
                }
                other => bail!("layer {i}: rope_type `{other}` is not supported"),
            };
            out.push(LayerSpec {
                kind,
                head_dim,
                num_kv_heads,
                intermediate_size,
                kv,
                rope_theta: rope.rope_theta,
                rotary_pairs: rotary_pairs.min(head_dim / 2),
            });
        }
        // A reuse layer's source must have the same head dim and KV heads.
        for (i, l) in out.iter().enumerate() {
            if let KvSource::Shared(src) = l.kv {
                let s = &out[src];
                ensure!(
                    s.head_dim == l.head_dim && s.num_kv_heads == l.num_kv_heads,
                    "layer {i} shares the K/V of layer {src} but their head dims or KV heads differ"
                );
            }
        }
        Ok(out)
    }
}

/// Zero and implausibly large sizes, each error naming its key: a mistyped size is reported
/// instead of building (or allocating) what it claims.
fn check_sizes(c: &Gemma4Config) -> Result<()> {
    let t = &c.text_config;
    let mut sizes = vec![
        ("text_config.vocab_size", t.vocab_size, MAX_WIDTH),
        ("text_config.hidden_size", t.hidden_size, MAX_WIDTH),
        (
            "text_config.intermediate_size",
            t.intermediate_size,
            MAX_WIDTH,
        ),
        ("text_config.head_dim", t.head_dim, MAX_WIDTH),
        (
            "text_config.hidden_size_per_layer_input",
            t.hidden_size_per_layer_input,
            MAX_WIDTH,
        ),
        (
            "text_config.vocab_size_per_layer_input",
            t.vocab_size_per_layer_input,
            MAX_WIDTH,
        ),
        (
            "text_config.num_hidden_layers",
            t.num_hidden_layers,
            MAX_COUNT,
        ),
        (
            "text_config.num_attention_heads",
            t.num_attention_heads,
            MAX_COUNT,
        ),
        (
            "text_config.num_key_value_heads",
            t.num_key_value_heads,
            MAX_COUNT,
        ),
    ];
    if let Some(v) = &c.vision_config {
        sizes.extend([
            ("vision_config.hidden_size", v.hidden_size, MAX_WIDTH),
            (
                "vision_config.intermediate_size",
                v.intermediate_size,
                MAX_WIDTH,
            ),
            ("vision_config.head_dim", v.head_dim, MAX_WIDTH),
            (
                "vision_config.num_attention_heads",
                v.num_attention_heads,
                MAX_COUNT,
            ),
            (
                "vision_config.num_hidden_layers",
                v.num_hidden_layers,
                MAX_COUNT,
            ),
            ("vision_config.patch_size", v.patch_size, MAX_PATCH),
            (
                "vision_config.pooling_kernel_size",
                v.pooling_kernel_size,
                MAX_PATCH,
            ),
            (
                "vision_config.position_embedding_size",
                v.position_embedding_size,
                MAX_WIDTH,
            ),
        ]);
        if let Some(kv) = v.num_key_value_heads {
            sizes.push(("vision_config.num_key_value_heads", kv, MAX_COUNT));
        }
    }
    for (key, value, max) in sizes {
        ensure_positive("", &[(key, value)])?;
        ensure_at_most("", &[(key, value, max)])?;
    }
    for (layer, o) in &t.per_layer_config {
        for (key, value) in [
            ("head_dim", o.head_dim),
            ("num_key_value_heads", o.num_key_value_heads),
        ] {
            if let Some(value) = value {
                ensure!(
                    value > 0 && value <= MAX_WIDTH,
                    "text_config.per_layer_config.{layer}.{key} = {value} is not between 1 and {MAX_WIDTH}"
                );
            }
        }
    }
    ensure!(
        t.rms_norm_eps.is_finite() && t.rms_norm_eps > 0.0,
        "text_config.rms_norm_eps must be a positive number (got {})",
        t.rms_norm_eps
    );
    Ok(())
}
