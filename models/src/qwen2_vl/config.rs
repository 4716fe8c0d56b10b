//! `config.json` of Qwen2-VL and Qwen2.5-VL checkpoints.
//!
//! Accepts the nested layout transformers 5 writes (`text_config`, `vision_config`,
//! `rope_parameters`) and the older flat one (text keys at the top level, `rope_theta` top-level,
//! `rope_scaling: {"type": "mrope", "mrope_section": [...]}`). The two families name their vision
//! widths differently: Qwen2-VL `embed_dim` (ViT width) / `hidden_size` (merger output);
//! Qwen2.5-VL `hidden_size` (ViT width) / `out_hidden_size` (merger output).
//!
//! The sections are read by serde (`TextKeys`, `RopeKeys`, `VisionKeys`, every field a
//! [`Key`]); which keys are required, defaulted or looked up at the top level is decided below,
//! each error naming its key.

use anyhow::{Context, Result, bail, ensure};

use serde::Deserialize;
use serde_json::Value;

use crate::config_checks::{
    DecoderSizes, Key, MAX_COUNT, MAX_PATCH, MAX_WIDTH, Section, ensure_at_most, ensure_positive,
    ids_of, keys,
};

/// Which of the two families (they differ only in the vision tower).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Qwen2-VL: LayerNorm, QuickGELU MLP, full attention per image.
    Qwen2Vl,
    /// Qwen2.5-VL: RMSNorm, gated SiLU MLP, window attention except in full-attention blocks.
    Qwen25Vl,
}

impl Flavor {
    /// `config.json`'s `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Flavor::Qwen2Vl => "qwen2_vl",
            Flavor::Qwen25Vl => "qwen2_5_vl",
        }
    }
}

/// Text decoder settings, shared with Qwen3-VL (whose decoder is Qwen2's with q/k norms).
#[derive(Debug, Clone, PartialEq)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// Qwen2: slots of the half head dimension per position stream (T, H, W), summing to
    /// head_dim/2. Qwen3: `[T, H, W]` with only `H` and `W` read, as the limits of the
    /// interleaved layout (see [`crate::qwen3_vl::positions::slot_streams`]).
    pub mrope_section: Vec<usize>,
    pub max_position_embeddings: usize,
    pub eos_token_ids: Vec<u32>,
    pub tie_word_embeddings: bool,
    pub initializer_range: f64,
    /// Biases on q/k/v (Qwen2: always; Qwen3: `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on o_proj (Qwen2: never; Qwen3: `attention_bias`).
    pub o_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
}

impl TextConfig {
    /// The checks of the decoder's sizes, named under `section` (`text`, `text_config`).
    pub fn sizes<'a>(&self, section: &'a str, rope_theta_key: &'a str) -> DecoderSizes<'a> {
        DecoderSizes {
            section,
            rope_theta_key,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_layers,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            max_position_embeddings: self.max_position_embeddings,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
        }
    }
}

/// Vision tower settings.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    pub depth: usize,
    /// ViT width.
    pub width: usize,
    pub num_heads: usize,
    /// Hidden width of the block MLP.
    pub mlp_hidden: usize,
    /// Merger output width (= text hidden size).
    pub out_width: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    /// Qwen2.5-VL: window side in pixels (0 = no window attention).
    pub window_size: usize,
    /// Qwen2.5-VL: blocks that attend over the whole image.
    pub fullatt_block_indexes: Vec<usize>,
}

impl VisionConfig {
    /// Length of one flattened patch: `in_channels · temporal_patch · patch²`.
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

/// A whole Qwen2-VL / Qwen2.5-VL config.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenVlConfig {
    pub flavor: Flavor,
    pub text: TextConfig,
    pub vision: VisionConfig,
    pub image_token_id: u32,
    pub video_token_id: u32,
    pub vision_start_token_id: u32,
    pub vision_end_token_id: u32,
    /// The parsed config.json, written back unchanged when the model is saved.
    pub raw: Value,
}

/// Keys of the text section (`text_config`, or the top level of the flat layout), and the
/// top-level keys the parser also looks up there.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TextKeys {
    model_type: Key<String>,
    vocab_size: Key<u64>,
    hidden_size: Key<u64>,
    intermediate_size: Key<u64>,
    num_hidden_layers: Key<u64>,
    num_attention_heads: Key<u64>,
    num_key_value_heads: Key<u64>,
    head_dim: Key<u64>,
    rms_norm_eps: Key<f64>,
    rope_theta: Key<f64>,
    rope_parameters: Section<RopeKeys>,
    rope_scaling: Section<RopeKeys>,
    use_sliding_window: Key<bool>,
    max_position_embeddings: Key<u64>,
    eos_token_id: Key<Value>,
    tie_word_embeddings: Key<bool>,
    initializer_range: Key<f64>,
    image_token_id: Key<u64>,
    video_token_id: Key<u64>,
    vision_start_token_id: Key<u64>,
    vision_end_token_id: Key<u64>,
    text_config: Section<Box<TextKeys>>,
    vision_config: Section<VisionKeys>,
}

/// `rope_parameters` / `rope_scaling`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RopeKeys {
    rope_theta: Key<f64>,
    mrope_section: Key<Vec<Value>>,
}

/// `vision_config` (both families' names).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct VisionKeys {
    depth: Key<u64>,
    embed_dim: Key<u64>,
    hidden_size: Key<u64>,
    out_hidden_size: Key<u64>,
    num_heads: Key<u64>,
    mlp_ratio: Key<f64>,
    intermediate_size: Key<u64>,
    in_channels: Key<u64>,
    patch_size: Key<u64>,
    temporal_patch_size: Key<u64>,
    spatial_merge_size: Key<u64>,
    window_size: Key<u64>,
    fullatt_block_indexes: Key<Vec<Value>>,
}

/// A required size: `{what}: missing or non-integer `{key}``.
fn size(k: Key<u64>, key: &str, what: &str) -> Result<usize> {
    k.required(|| format!("{what}: missing or non-integer `{key}`"))
        .map(|x| x as usize)
}

/// The integers of a list (other entries dropped).
fn integers(list: Vec<Value>) -> Vec<usize> {
    list.iter()
        .filter_map(Value::as_u64)
        .map(|x| x as usize)
        .collect()
}

impl QwenVlConfig {
    /// Qwen2.5-VL's `vision_config.tokens_per_second` (temporal positions per second of video;
    /// transformers' default 4 when absent).
    pub fn tokens_per_second(&self) -> f32 {
        self.raw
            .get("vision_config")
            .and_then(|v| v.get("tokens_per_second"))
            .and_then(|v| v.as_f64())
            .unwrap_or(4.0) as f32
    }

    /// Parses a `config.json` text.
    pub fn from_json(text: &str) -> Result<Self> {
        let root: Value = serde_json::from_str(text).context("parsing config.json")?;
        Self::from_value(&root)
    }

    /// The config.json text (pretty-printed).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.raw).expect("a JSON value serialises")
    }

    pub fn from_value(root: &Value) -> Result<Self> {
        let mut top: TextKeys = keys(root);
        let flavor = match std::mem::take(&mut top.model_type).valid().as_deref() {
            Some("qwen2_vl") => Flavor::Qwen2Vl,
            Some("qwen2_5_vl") => Flavor::Qwen25Vl,
            other => bail!("config.json: model_type {other:?} is not qwen2_vl or qwen2_5_vl"),
        };
        let vision_keys = std::mem::take(&mut top.vision_config);
        // Nested (transformers 5) or flat (older): text keys live in text_config or at the top;
        // the optional ones (and the token ids) are looked up in text_config, then at the top.
        let (mut text, mut top) = match std::mem::take(&mut top.text_config) {
            Section::Present(text) => (*text, top),
            Section::Absent => (top, TextKeys::default()),
        };
        macro_rules! lookup {
            ($key:ident) => {
                std::mem::take(&mut text.$key).or(std::mem::take(&mut top.$key))
            };
        }
        let what = "text config";
        let hidden_size = size(std::mem::take(&mut text.hidden_size), "hidden_size", what)?;
        let num_heads = size(
            std::mem::take(&mut text.num_attention_heads),
            "num_attention_heads",
            what,
        )?;
        ensure!(
            num_heads > 0,
            "config.json: text num_attention_heads must be at least 1 (got 0)"
        );
        let head_dim = match lookup!(head_dim).valid() {
            Some(h) => h as usize,
            None => {
                ensure!(
                    hidden_size % num_heads == 0,
                    "config.json: text hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads} (and no head_dim is given)"
                );
                hidden_size / num_heads
            }
        };
        let rope = lookup!(rope_parameters)
            .or(lookup!(rope_scaling))
            .present()
            .unwrap_or_default();
        let rope_theta = rope
            .rope_theta
            .valid()
            .or(lookup!(rope_theta).valid())
            .unwrap_or(1_000_000.0);
        let mrope_section = rope
            .mrope_section
            .valid()
            .map(integers)
            .context("config.json: no mrope_section in rope_parameters / rope_scaling")?;
        if mrope_section
            .iter()
            .fold(0usize, |a, &b| a.saturating_add(b))
            != head_dim / 2
        {
            bail!(
                "config.json: mrope_section {mrope_section:?} does not sum to head_dim/2 = {}",
                head_dim / 2
            );
        }
        if lookup!(use_sliding_window).valid() == Some(true) {
            bail!(
                "config.json: use_sliding_window = true is not supported (Qwen2 VL checkpoints use full attention)"
            );
        }
        // The top level first.
        let tie_word_embeddings = std::mem::take(&mut top.tie_word_embeddings)
            .or(std::mem::take(&mut text.tie_word_embeddings))
            .valid()
            .unwrap_or(false);
        let text_cfg = TextConfig {
            vocab_size: size(std::mem::take(&mut text.vocab_size), "vocab_size", what)?,
            hidden_size,
            intermediate_size: size(
                std::mem::take(&mut text.intermediate_size),
                "intermediate_size",
                what,
            )?,
            num_layers: size(
                std::mem::take(&mut text.num_hidden_layers),
                "num_hidden_layers",
                what,
            )?,
            num_heads,
            num_kv_heads: lookup!(num_key_value_heads)
                .valid()
                .map(|x| x as usize)
                .unwrap_or(num_heads),
            head_dim,
            rms_norm_eps: lookup!(rms_norm_eps).valid().unwrap_or(1e-6),
            rope_theta,
            mrope_section,
            max_position_embeddings: lookup!(max_position_embeddings)
                .valid()
                .map(|x| x as usize)
                .unwrap_or(32768),
            eos_token_ids: lookup!(eos_token_id)
                .value()
                .map(|v| ids_of(&v))
                .unwrap_or_default(),
            tie_word_embeddings,
            initializer_range: lookup!(initializer_range).valid().unwrap_or(0.02),
            qkv_bias: true,
            o_bias: false,
            qk_norm: false,
        };

        let v = vision_keys
            .present()
            .context("config.json: no vision_config")?;
        let what = "vision_config";
        let in_channels = v.in_channels.valid().map(|x| x as usize).unwrap_or(3);
        let vision = match flavor {
            Flavor::Qwen2Vl => {
                let width = size(v.embed_dim, "embed_dim", what)?;
                let ratio = v.mlp_ratio.valid().unwrap_or(4.0);
                VisionConfig {
                    depth: size(v.depth, "depth", what)?,
                    width,
                    num_heads: size(v.num_heads, "num_heads", what)?,
                    mlp_hidden: (width as f64 * ratio) as usize,
                    out_width: size(v.hidden_size, "hidden_size", what)?,
                    in_channels,
                    patch_size: size(v.patch_size, "patch_size", what)?,
                    temporal_patch_size: size(v.temporal_patch_size, "temporal_patch_size", what)?,
                    spatial_merge_size: size(v.spatial_merge_size, "spatial_merge_size", what)?,
                    window_size: 0,
                    fullatt_block_indexes: Vec::new(),
                }
            }
            Flavor::Qwen25Vl => VisionConfig {
                depth: size(v.depth, "depth", what)?,
                width: size(v.hidden_size, "hidden_size", what)?,
                num_heads: size(v.num_heads, "num_heads", what)?,
                mlp_hidden: size(v.intermediate_size, "intermediate_size", what)?,
                out_width: size(v.out_hidden_size, "out_hidden_size", what)?,
                in_channels,
                patch_size: size(v.patch_size, "patch_size", what)?,
                temporal_patch_size: size(v.temporal_patch_size, "temporal_patch_size", what)?,
                spatial_merge_size: size(v.spatial_merge_size, "spatial_merge_size", what)?,
                window_size: size(v.window_size, "window_size", what)?,
                fullatt_block_indexes: v
                    .fullatt_block_indexes
                    .valid()
                    .map(integers)
                    .unwrap_or_default(),
            },
        };
        if vision.out_width != text_cfg.hidden_size {
            bail!(
                "config.json: vision merger output width {} differs from text hidden_size {}",
                vision.out_width,
                text_cfg.hidden_size
            );
        }
        let token = |k: Key<u64>, key: &str| -> Result<u32> {
            k.required(|| format!("config.json: missing `{key}`"))
                .map(|x| x as u32)
        };
        check_sizes(&text_cfg, &vision)?;
        Ok(Self {
            flavor,
            text: text_cfg,
            vision,
            image_token_id: token(lookup!(image_token_id), "image_token_id")?,
            video_token_id: token(lookup!(video_token_id), "video_token_id")?,
            vision_start_token_id: token(lookup!(vision_start_token_id), "vision_start_token_id")?,
            vision_end_token_id: token(lookup!(vision_end_token_id), "vision_end_token_id")?,
            raw: root.clone(),
        })
    }
}

/// Impossible values, each error naming its key: zero sizes and counts, head counts that do not
/// divide, implausibly large sizes, odd rotary widths, vision windows that are not whole merged
/// patches, full-attention blocks past the depth, non-positive epsilons and RoPE bases.
fn check_sizes(t: &TextConfig, v: &VisionConfig) -> Result<()> {
    let text = t.sizes("text", "rope_theta");
    text.ensure_positive()?;
    let positive = [
        ("vision_config depth", v.depth),
        ("vision_config width (embed_dim / hidden_size)", v.width),
        ("vision_config num_heads", v.num_heads),
        (
            "vision_config MLP width (mlp_ratio / intermediate_size)",
            v.mlp_hidden,
        ),
        ("vision_config in_channels", v.in_channels),
        ("vision_config patch_size", v.patch_size),
        ("vision_config temporal_patch_size", v.temporal_patch_size),
        ("vision_config spatial_merge_size", v.spatial_merge_size),
    ];
    ensure_positive("config.json: ", &positive)?;
    // Upper bounds far above any real checkpoint, so that a mistyped size is an error naming
    // its key rather than a build that allocates (or loops over) what it claims.
    text.ensure_bounded()?;
    let bounded = [
        ("vision_config depth", v.depth, MAX_COUNT),
        (
            "vision_config width (embed_dim / hidden_size)",
            v.width,
            MAX_WIDTH,
        ),
        ("vision_config num_heads", v.num_heads, MAX_COUNT),
        (
            "vision_config MLP width (mlp_ratio / intermediate_size)",
            v.mlp_hidden,
            MAX_WIDTH,
        ),
        ("vision_config in_channels", v.in_channels, MAX_PATCH),
        ("vision_config patch_size", v.patch_size, MAX_PATCH),
        (
            "vision_config temporal_patch_size",
            v.temporal_patch_size,
            MAX_PATCH,
        ),
        (
            "vision_config spatial_merge_size",
            v.spatial_merge_size,
            MAX_PATCH,
        ),
        ("vision_config window_size", v.window_size, MAX_WIDTH),
    ];
    ensure_at_most("config.json: ", &bounded)?;
    text.ensure_divisible()?;
    ensure!(
        v.width.is_multiple_of(v.num_heads),
        "config.json: vision_config width {} is not a multiple of num_heads {}",
        v.width,
        v.num_heads
    );
    ensure!(
        (v.width / v.num_heads).is_multiple_of(2),
        "config.json: vision_config head width {} (width / num_heads) is odd (rotary embeddings rotate pairs)",
        v.width / v.num_heads
    );
    let merged_patch = v.patch_size * v.spatial_merge_size;
    ensure!(
        v.window_size.is_multiple_of(merged_patch),
        "config.json: vision_config window_size {} is not a multiple of patch_size × spatial_merge_size = {merged_patch}",
        v.window_size
    );
    if let Some(&b) = v.fullatt_block_indexes.iter().find(|&&b| b >= v.depth) {
        bail!(
            "config.json: vision_config fullatt_block_indexes holds {b}, past the last block ({} blocks)",
            v.depth
        );
    }
    text.ensure_positive_floats()?;
    Ok(())
}
