//! `config.json` of Qwen2-VL and Qwen2.5-VL checkpoints.
//!
//! Accepts the nested layout transformers 5 writes (`text_config`, `vision_config`,
//! `rope_parameters`) and the older flat one (text keys at the top level, `rope_theta` top-level,
//! `rope_scaling: {"type": "mrope", "mrope_section": [...]}`). The two families name their vision
//! widths differently: Qwen2-VL `embed_dim` (ViT width) / `hidden_size` (merger output);
//! Qwen2.5-VL `hidden_size` (ViT width) / `out_hidden_size` (merger output).

use anyhow::{Context, Result, bail, ensure};

use crate::config_checks::{MAX_COUNT, MAX_PATCH, MAX_WIDTH, ensure_at_most, ensure_positive};
use serde_json::Value;

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

/// Text decoder settings.
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
    /// Slots of the half head dimension per position stream (T, H, W); sums to head_dim/2.
    pub mrope_section: Vec<usize>,
    pub max_position_embeddings: usize,
    pub eos_token_ids: Vec<u32>,
    pub tie_word_embeddings: bool,
    pub initializer_range: f64,
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

fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

fn usize_of(v: &Value, key: &str, what: &str) -> Result<usize> {
    get(v, key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .with_context(|| format!("{what}: missing or non-integer `{key}`"))
}

fn f64_of(v: &Value, key: &str) -> Option<f64> {
    get(v, key).and_then(Value::as_f64)
}

fn ids_of(v: &Value) -> Vec<u32> {
    match v {
        Value::Number(n) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
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
        let flavor = match get(root, "model_type").and_then(Value::as_str) {
            Some("qwen2_vl") => Flavor::Qwen2Vl,
            Some("qwen2_5_vl") => Flavor::Qwen25Vl,
            other => bail!("config.json: model_type {other:?} is not qwen2_vl or qwen2_5_vl"),
        };
        // Nested (transformers 5) or flat (older): text keys live in text_config or at the top.
        let text = get(root, "text_config").unwrap_or(root);
        let lookup = |key: &str| get(text, key).or_else(|| get(root, key));

        let hidden_size = usize_of(text, "hidden_size", "text config")?;
        let num_heads = usize_of(text, "num_attention_heads", "text config")?;
        ensure!(
            num_heads > 0,
            "config.json: text num_attention_heads must be at least 1 (got 0)"
        );
        let head_dim = match lookup("head_dim").and_then(Value::as_u64) {
            Some(h) => h as usize,
            None => {
                ensure!(
                    hidden_size % num_heads == 0,
                    "config.json: text hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads} (and no head_dim is given)"
                );
                hidden_size / num_heads
            }
        };
        let rope = lookup("rope_parameters").or_else(|| lookup("rope_scaling"));
        let rope_theta = rope
            .and_then(|r| f64_of(r, "rope_theta"))
            .or_else(|| lookup("rope_theta").and_then(Value::as_f64))
            .unwrap_or(1_000_000.0);
        let mrope_section: Vec<usize> = rope
            .and_then(|r| get(r, "mrope_section"))
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_u64)
                    .map(|x| x as usize)
                    .collect()
            })
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
        if lookup("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            bail!(
                "config.json: use_sliding_window = true is not supported (Qwen2 VL checkpoints use full attention)"
            );
        }
        let tie_word_embeddings = get(root, "tie_word_embeddings")
            .or_else(|| get(text, "tie_word_embeddings"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let text_cfg = TextConfig {
            vocab_size: usize_of(text, "vocab_size", "text config")?,
            hidden_size,
            intermediate_size: usize_of(text, "intermediate_size", "text config")?,
            num_layers: usize_of(text, "num_hidden_layers", "text config")?,
            num_heads,
            num_kv_heads: lookup("num_key_value_heads")
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .unwrap_or(num_heads),
            head_dim,
            rms_norm_eps: lookup("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            mrope_section,
            max_position_embeddings: lookup("max_position_embeddings")
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .unwrap_or(32768),
            eos_token_ids: lookup("eos_token_id").map(ids_of).unwrap_or_default(),
            tie_word_embeddings,
            initializer_range: lookup("initializer_range")
                .and_then(Value::as_f64)
                .unwrap_or(0.02),
        };

        let v = get(root, "vision_config").context("config.json: no vision_config")?;
        let what = "vision_config";
        let vision = match flavor {
            Flavor::Qwen2Vl => {
                let width = usize_of(v, "embed_dim", what)?;
                let ratio = f64_of(v, "mlp_ratio").unwrap_or(4.0);
                VisionConfig {
                    depth: usize_of(v, "depth", what)?,
                    width,
                    num_heads: usize_of(v, "num_heads", what)?,
                    mlp_hidden: (width as f64 * ratio) as usize,
                    out_width: usize_of(v, "hidden_size", what)?,
                    in_channels: usize_of(v, "in_channels", what).unwrap_or(3),
                    patch_size: usize_of(v, "patch_size", what)?,
                    temporal_patch_size: usize_of(v, "temporal_patch_size", what)?,
                    spatial_merge_size: usize_of(v, "spatial_merge_size", what)?,
                    window_size: 0,
                    fullatt_block_indexes: Vec::new(),
                }
            }
            Flavor::Qwen25Vl => VisionConfig {
                depth: usize_of(v, "depth", what)?,
                width: usize_of(v, "hidden_size", what)?,
                num_heads: usize_of(v, "num_heads", what)?,
                mlp_hidden: usize_of(v, "intermediate_size", what)?,
                out_width: usize_of(v, "out_hidden_size", what)?,
                in_channels: usize_of(v, "in_channels", what).unwrap_or(3),
                patch_size: usize_of(v, "patch_size", what)?,
                temporal_patch_size: usize_of(v, "temporal_patch_size", what)?,
                spatial_merge_size: usize_of(v, "spatial_merge_size", what)?,
                window_size: usize_of(v, "window_size", what)?,
                fullatt_block_indexes: get(v, "fullatt_block_indexes")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_u64)
                            .map(|x| x as usize)
                            .collect()
                    })
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
        let token = |key: &str| -> Result<u32> {
            lookup(key)
                .and_then(Value::as_u64)
                .map(|x| x as u32)
                .with_context(|| format!("config.json: missing `{key}`"))
        };
        check_sizes(&text_cfg, &vision)?;
        Ok(Self {
            flavor,
            text: text_cfg,
            vision,
            image_token_id: token("image_token_id")?,
            video_token_id: token("video_token_id")?,
            vision_start_token_id: token("vision_start_token_id")?,
            vision_end_token_id: token("vision_end_token_id")?,
            raw: root.clone(),
        })
    }
}

/// Impossible values, each error naming its key: zero sizes and counts, head counts that do not
/// divide, implausibly large sizes, odd rotary widths, vision windows that are not whole merged
/// patches, full-attention blocks past the depth, non-positive epsilons and RoPE bases.
fn check_sizes(t: &TextConfig, v: &VisionConfig) -> Result<()> {
    let positive = [
        ("text vocab_size", t.vocab_size),
        ("text hidden_size", t.hidden_size),
        ("text intermediate_size", t.intermediate_size),
        ("text num_hidden_layers", t.num_layers),
        ("text num_key_value_heads", t.num_kv_heads),
        ("text head_dim", t.head_dim),
        ("text max_position_embeddings", t.max_position_embeddings),
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
    let bounded = [
        ("text vocab_size", t.vocab_size, MAX_WIDTH),
        ("text hidden_size", t.hidden_size, MAX_WIDTH),
        ("text intermediate_size", t.intermediate_size, MAX_WIDTH),
        ("text head_dim", t.head_dim, MAX_WIDTH),
        ("text num_hidden_layers", t.num_layers, MAX_COUNT),
        ("text num_attention_heads", t.num_heads, MAX_COUNT),
        ("text num_key_value_heads", t.num_kv_heads, MAX_COUNT),
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
    ensure!(
        t.num_heads.is_multiple_of(t.num_kv_heads),
        "config.json: text num_attention_heads {} is not a multiple of num_key_value_heads {}",
        t.num_heads,
        t.num_kv_heads
    );
    ensure!(
        t.head_dim.is_multiple_of(2),
        "config.json: text head_dim {} is odd (rotary embeddings rotate pairs)",
        t.head_dim
    );
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
    ensure!(
        t.rms_norm_eps.is_finite() && t.rms_norm_eps > 0.0,
        "config.json: text rms_norm_eps must be a positive number (got {})",
        t.rms_norm_eps
    );
    ensure!(
        t.rope_theta.is_finite() && t.rope_theta > 0.0,
        "config.json: rope_theta must be a positive number (got {})",
        t.rope_theta
    );
    Ok(())
}
