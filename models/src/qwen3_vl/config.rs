//! `config.json` of Qwen3-VL checkpoints (transformers `Qwen3VLConfig` with its
//! `Qwen3VLTextConfig` and `Qwen3VLVisionConfig`).
//!
//! Two layouts are accepted, which transformers 5.24 loads into the same model:
//! - transformers 5 (`save_pretrained`): `text_config.rope_parameters = {rope_type, rope_theta,
//!   mrope_section, mrope_interleaved}`, `vision_config.rope_parameters = {rope_type: "axial",
//!   rope_theta}`;
//! - the hub layout (transformers 4.57, the public `Qwen/Qwen3-VL-*` files): the same dict is
//!   `text_config.rope_scaling` with `rope_theta` beside it in `text_config`, and the vision
//!   config has no rope settings (theta 10000).
//!
//! `head_dim` is an explicit key (it need not be `hidden_size / num_attention_heads`); the vision
//! config uses Qwen2.5-VL's naming (`hidden_size` = ViT width, `out_hidden_size` = merger output).
//! Absent optional keys take transformers' defaults. `mrope_interleaved` is not read:
//! transformers 5.24 always interleaves.
//!
//! The sections are read by serde (`RootKeys`, `TextKeys`, `RopeKeys`, `VisionKeys`, every
//! field a [`Key`]); which keys are required or defaulted is decided below, each error naming
//! its key.

use anyhow::{Context, Result, bail, ensure};

use serde::Deserialize;
use serde_json::Value;

use crate::config_checks::{
    Key, MAX_COUNT, MAX_PATCH, MAX_WIDTH, Section, ensure_at_most, ensure_positive, ids_of, keys,
};

/// Text decoder settings (`text_config`): Qwen2-VL's, with `attention_bias` on all four
/// projections, q/k norms, an explicit `head_dim` (`q_proj` is `[num_heads·head_dim, hidden]`)
/// and a 3-entry `mrope_section` of which only `H` and `W` are read.
pub use crate::qwen2_vl::config::TextConfig;

/// Activation of the vision blocks' MLP (`vision_config.hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionAct {
    /// `gelu_pytorch_tanh` (the released checkpoints): `0.5·z·(1 + tanh(√(2/π)·(z + 0.044715·z³)))`.
    GeluTanh,
    /// `gelu`: `0.5·z·(1 + erf(z/√2))`.
    GeluErf,
}

/// Vision tower settings (`vision_config`).
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    pub depth: usize,
    /// ViT width (`hidden_size`).
    pub width: usize,
    pub num_heads: usize,
    /// Hidden width of the block MLP (`intermediate_size`).
    pub mlp_hidden: usize,
    /// Merger output width (`out_hidden_size`, = text hidden size).
    pub out_width: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    /// Rows of the learned position-embedding grid (`num_position_embeddings` = side²).
    pub num_position_embeddings: usize,
    /// Vision blocks whose outputs feed the DeepStack mergers (0-based, in merger order).
    pub deepstack_visual_indexes: Vec<usize>,
    pub hidden_act: VisionAct,
    /// Base of the 2-D vision RoPE (`rope_parameters.rope_theta`, 10000 when absent).
    pub rope_theta: f64,
}

impl VisionConfig {
    /// Length of one flattened patch: `in_channels · temporal_patch · patch²`.
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Side of the learned position-embedding grid: `√num_position_embeddings`.
    pub fn pos_grid_side(&self) -> usize {
        self.num_position_embeddings.isqrt()
    }
}

/// A whole Qwen3-VL config.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3VlConfig {
    pub text: TextConfig,
    pub vision: VisionConfig,
    pub image_token_id: u32,
    pub video_token_id: u32,
    pub vision_start_token_id: u32,
    pub vision_end_token_id: u32,
    /// The parsed config.json, written back unchanged when the model is saved.
    pub raw: Value,
}

/// The top-level keys of config.json.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RootKeys {
    model_type: Key<String>,
    text_config: Section<TextKeys>,
    vision_config: Section<VisionKeys>,
    tie_word_embeddings: Key<bool>,
    eos_token_id: Key<Value>,
    image_token_id: Key<u64>,
    video_token_id: Key<u64>,
    vision_start_token_id: Key<u64>,
    vision_end_token_id: Key<u64>,
}

/// `text_config`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TextKeys {
    vocab_size: Key<u64>,
    hidden_size: Key<u64>,
    intermediate_size: Key<u64>,
    num_hidden_layers: Key<u64>,
    num_attention_heads: Key<u64>,
    num_key_value_heads: Key<u64>,
    head_dim: Key<u64>,
    attention_bias: Key<bool>,
    rms_norm_eps: Key<f64>,
    rope_theta: Key<f64>,
    rope_parameters: Section<RopeKeys>,
    rope_scaling: Section<RopeKeys>,
    hidden_act: Key<Value>,
    max_position_embeddings: Key<u64>,
    eos_token_id: Key<Value>,
    tie_word_embeddings: Key<bool>,
    initializer_range: Key<f64>,
}

/// `text_config.rope_parameters` / `rope_scaling`, `vision_config.rope_parameters`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RopeKeys {
    rope_type: Key<Value>,
    #[serde(rename = "type")]
    kind: Key<Value>,
    rope_theta: Key<f64>,
    mrope_section: Key<Vec<Value>>,
}

/// `vision_config`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct VisionKeys {
    depth: Key<u64>,
    hidden_size: Key<u64>,
    num_heads: Key<u64>,
    intermediate_size: Key<u64>,
    out_hidden_size: Key<u64>,
    in_channels: Key<u64>,
    patch_size: Key<u64>,
    temporal_patch_size: Key<u64>,
    spatial_merge_size: Key<u64>,
    num_position_embeddings: Key<u64>,
    deepstack_visual_indexes: Key<Vec<Value>>,
    hidden_act: Key<String>,
    rope_parameters: Section<RopeKeys>,
}

fn size(k: Key<u64>, key: &str, what: &str) -> Result<usize> {
    k.required(|| format!("config.json: {what}: missing or non-integer `{key}`"))
        .map(|x| x as usize)
}

fn size_or(k: Key<u64>, key: &str, what: &str, default: usize) -> Result<usize> {
    k.or_default(default as u64, || {
        format!("config.json: {what}: missing or non-integer `{key}`")
    })
    .map(|x| x as usize)
}

fn f64_or(k: Key<f64>, key: &str, what: &str, default: f64) -> Result<f64> {
    k.or_default(default, || {
        format!("config.json: {what}: `{key}` is not a number")
    })
}

fn usize_list(k: Key<Vec<Value>>, key: &str, what: &str) -> Result<Option<Vec<usize>>> {
    let items = match k {
        Key::Absent => return Ok(None),
        Key::Invalid(_) => bail!("config.json: {what}: `{key}` is not a list"),
        Key::Valid(items) => items,
    };
    items
        .iter()
        .map(|x| {
            x.as_u64().map(|x| x as usize).with_context(|| {
                format!("config.json: {what}: `{key}` holds {x}, not a non-negative integer")
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

impl Qwen3VlConfig {
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
        let keys: RootKeys = keys(root);
        match keys.model_type.valid().as_deref() {
            Some("qwen3_vl") => {}
            other => bail!("config.json: model_type {other:?} is not qwen3_vl"),
        }
        let t = keys
            .text_config
            .present()
            .context("config.json: no text_config")?;
        let v = keys
            .vision_config
            .present()
            .context("config.json: no vision_config")?;
        let tie = keys.tie_word_embeddings;
        let text = text_config(tie, keys.eos_token_id, t)?;
        let vision = vision_config(v)?;
        let token = |k: Key<u64>, key: &str| -> Result<u32> {
            k.required(|| format!("config.json: missing or non-integer `{key}`"))
                .map(|x| x as u32)
        };
        let config = Self {
            text,
            vision,
            image_token_id: token(keys.image_token_id, "image_token_id")?,
            video_token_id: token(keys.video_token_id, "video_token_id")?,
            vision_start_token_id: token(keys.vision_start_token_id, "vision_start_token_id")?,
            vision_end_token_id: token(keys.vision_end_token_id, "vision_end_token_id")?,
            raw: root.clone(),
        };
        check_values(&config)?;
        Ok(config)
    }
}

/// `tie` and `eos` are the top-level keys (`tie_word_embeddings` is read there first,
/// `eos_token_id` last).
fn text_config(tie: Key<bool>, eos: Key<Value>, t: TextKeys) -> Result<TextConfig> {
    let what = "text_config";
    let num_heads = size(t.num_attention_heads, "num_attention_heads", what)?;
    // transformers 5: rope_parameters; hub (4.57): rope_scaling, with rope_theta beside it.
    let rope = t.rope_parameters.or(t.rope_scaling).present();
    let (rope_type, rope_theta_key, section_key) = match rope {
        Some(r) => (
            r.rope_type.or(r.kind).value(),
            r.rope_theta,
            Some(r.mrope_section),
        ),
        None => (None, Key::Absent, None),
    };
    if let Some(kind) = rope_type {
        ensure!(
            kind.as_str() == Some("default"),
            "config.json: text_config rope_type {kind} is not supported (only \"default\")"
        );
    }
    let rope_theta = if rope_theta_key.is_present() {
        f64_or(
            rope_theta_key,
            "rope_theta",
            "text_config rope_parameters",
            0.0,
        )?
    } else {
        f64_or(t.rope_theta, "rope_theta", what, 5_000_000.0)?
    };
    let section = match section_key {
        Some(k) => usize_list(k, "mrope_section", "text_config rope_parameters")?,
        None => None,
    }
    .unwrap_or_else(|| vec![24, 20, 20]);
    ensure!(
        section.len() == 3,
        "config.json: text_config mrope_section {section:?} must have 3 entries (T, H, W)"
    );
    if let Some(act) = t.hidden_act.value() {
        ensure!(
            act.as_str() == Some("silu"),
            "config.json: text_config hidden_act {act} is not supported (only \"silu\")"
        );
    }
    let tie_word_embeddings = tie.or(t.tie_word_embeddings).valid().unwrap_or(false);
    let attention_bias = t.attention_bias.valid().unwrap_or(false);
    Ok(TextConfig {
        vocab_size: size(t.vocab_size, "vocab_size", what)?,
        hidden_size: size(t.hidden_size, "hidden_size", what)?,
        intermediate_size: size(t.intermediate_size, "intermediate_size", what)?,
        num_layers: size(t.num_hidden_layers, "num_hidden_layers", what)?,
        num_heads,
        num_kv_heads: size_or(
            t.num_key_value_heads,
            "num_key_value_heads",
            what,
            num_heads,
        )?,
        head_dim: size_or(t.head_dim, "head_dim", what, 128)?,
        rms_norm_eps: f64_or(t.rms_norm_eps, "rms_norm_eps", what, 1e-6)?,
        rope_theta,
        mrope_section: section,
        max_position_embeddings: size_or(
            t.max_position_embeddings,
            "max_position_embeddings",
            what,
            128_000,
        )?,
        eos_token_ids: t
            .eos_token_id
            .or(eos)
            .value()
            .map(|v| ids_of(&v))
            .unwrap_or_default(),
        tie_word_embeddings,
        initializer_range: f64_or(t.initializer_range, "initializer_range", what, 0.02)?,
        qkv_bias: attention_bias,
        o_bias: attention_bias,
        qk_norm: true,
    })
}

fn vision_config(v: VisionKeys) -> Result<VisionConfig> {
    let what = "vision_config";
    let hidden_act = match v.hidden_act.valid().as_deref() {
        None | Some("gelu_pytorch_tanh") => VisionAct::GeluTanh,
        Some("gelu") => VisionAct::GeluErf,
        Some(other) => bail!(
            "config.json: vision_config hidden_act \"{other}\" is not supported (\"gelu_pytorch_tanh\" or \"gelu\")"
        ),
    };
    let rope_theta = match v.rope_parameters.present() {
        Some(r) => f64_or(
            r.rope_theta,
            "rope_theta",
            "vision_config rope_parameters",
            10000.0,
        )?,
        None => 10000.0,
    };
    Ok(VisionConfig {
        depth: size(v.depth, "depth", what)?,
        width: size(v.hidden_size, "hidden_size", what)?,
        num_heads: size(v.num_heads, "num_heads", what)?,
        mlp_hidden: size(v.intermediate_size, "intermediate_size", what)?,
        out_width: size(v.out_hidden_size, "out_hidden_size", what)?,
        in_channels: size_or(v.in_channels, "in_channels", what, 3)?,
        patch_size: size(v.patch_size, "patch_size", what)?,
        temporal_patch_size: size(v.temporal_patch_size, "temporal_patch_size", what)?,
        spatial_merge_size: size(v.spatial_merge_size, "spatial_merge_size", what)?,
        num_position_embeddings: size(v.num_position_embeddings, "num_position_embeddings", what)?,
        deepstack_visual_indexes: usize_list(
            v.deepstack_visual_indexes,
            "deepstack_visual_indexes",
            what,
        )?
        .unwrap_or_else(|| vec![8, 16, 24]),
        hidden_act,
        rope_theta,
    })
}

/// Impossible values, each error naming its key: zero sizes and counts, implausibly large sizes,
/// head counts that do not divide, rotary widths that do not split, a position grid that is not
/// a square, DeepStack blocks past the depth or repeated, a merger width that is not the text
/// width, non-positive epsilons and RoPE bases.
fn check_values(c: &Qwen3VlConfig) -> Result<()> {
    let (t, v) = (&c.text, &c.vision);
    let text = t.sizes("text_config", "text_config rope_theta");
    text.ensure_positive()?;
    let positive = [
        ("vision_config depth", v.depth),
        ("vision_config hidden_size", v.width),
        ("vision_config num_heads", v.num_heads),
        ("vision_config intermediate_size", v.mlp_hidden),
        ("vision_config out_hidden_size", v.out_width),
        ("vision_config in_channels", v.in_channels),
        ("vision_config patch_size", v.patch_size),
        ("vision_config temporal_patch_size", v.temporal_patch_size),
        ("vision_config spatial_merge_size", v.spatial_merge_size),
        (
            "vision_config num_position_embeddings",
            v.num_position_embeddings,
        ),
    ];
    ensure_positive("config.json: ", &positive)?;
    // Upper bounds far above any real checkpoint, so that a mistyped size is an error naming its
    // key rather than a build that allocates (or loops over) what it claims.
    text.ensure_bounded()?;
    let bounded = [
        (
            "text_config mrope_section[1]",
            t.mrope_section[1],
            MAX_WIDTH,
        ),
        (
            "text_config mrope_section[2]",
            t.mrope_section[2],
            MAX_WIDTH,
        ),
        ("vision_config depth", v.depth, MAX_COUNT),
        ("vision_config hidden_size", v.width, MAX_WIDTH),
        ("vision_config num_heads", v.num_heads, MAX_COUNT),
        ("vision_config intermediate_size", v.mlp_hidden, MAX_WIDTH),
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
        (
            "vision_config num_position_embeddings",
            v.num_position_embeddings,
            MAX_WIDTH,
        ),
    ];
    ensure_at_most("config.json: ", &bounded)?;
    text.ensure_divisible()?;
    ensure!(
        v.width.is_multiple_of(v.num_heads),
        "config.json: vision_config hidden_size {} is not a multiple of num_heads {}",
        v.width,
        v.num_heads
    );
    ensure!(
        (v.width / v.num_heads).is_multiple_of(4),
        "config.json: vision_config head width {} (hidden_size / num_heads) is not a multiple of 4 (the 2-D rotary embedding rotates pairs of each of its halves)",
        v.width / v.num_heads
    );
    let side = v.pos_grid_side();
    ensure!(
        side * side == v.num_position_embeddings,
        "config.json: vision_config num_position_embeddings {} is not a square (the learned grid is side × side)",
        v.num_position_embeddings
    );
    ensure!(
        v.out_width == t.hidden_size,
        "config.json: vision_config out_hidden_size {} differs from text_config hidden_size {}",
        v.out_width,
        t.hidden_size
    );
    for (k, &b) in v.deepstack_visual_indexes.iter().enumerate() {
        ensure!(
            b < v.depth,
            "config.json: vision_config deepstack_visual_indexes holds {b}, past the last block ({} blocks)",
            v.depth
        );
        ensure!(
            !v.deepstack_visual_indexes[..k].contains(&b),
            "config.json: vision_config deepstack_visual_indexes holds block {b} twice"
        );
    }
    text.ensure_positive_floats()?;
    ensure!(
        v.rope_theta.is_finite() && v.rope_theta > 0.0,
        "config.json: vision_config rope_parameters.rope_theta must be a positive number (got {})",
        v.rope_theta
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Value {
        serde_json::json!({
            "model_type": "qwen3_vl",
            "image_token_id": 12, "video_token_id": 13,
            "vision_start_token_id": 10, "vision_end_token_id": 11,
            "tie_word_embeddings": true,
            "text_config": {
                "vocab_size": 20, "hidden_size": 16, "intermediate_size": 24,
                "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                "head_dim": 12, "rms_norm_eps": 1e-6, "eos_token_id": 3,
                "rope_parameters": {"rope_type": "default", "rope_theta": 100.0,
                                    "mrope_section": [2, 2, 2], "mrope_interleaved": true}
            },
            "vision_config": {
                "depth": 2, "hidden_size": 8, "num_heads": 2, "intermediate_size": 16,
                "out_hidden_size": 16, "patch_size": 4, "temporal_patch_size": 2,
                "spatial_merge_size": 2, "num_position_embeddings": 9,
                "deepstack_visual_indexes": [0]
            }
        })
    }

    #[test]
    fn both_layouts_give_the_same_config() {
        let five = Qwen3VlConfig::from_value(&tiny()).unwrap();
        let mut hub = tiny();
        let t = hub["text_config"].as_object_mut().unwrap();
        let mut rope = t.remove("rope_parameters").unwrap();
        rope.as_object_mut().unwrap().remove("rope_theta");
        t.insert("rope_scaling".into(), rope);
        t.insert("rope_theta".into(), 100.0.into());
        let hub = Qwen3VlConfig::from_value(&hub).unwrap();
        assert_eq!(five.text, hub.text);
        assert_eq!(five.vision, hub.vision);
        assert_eq!(five.text.head_dim, 12);
        assert_eq!(five.vision.rope_theta, 10000.0);
        assert_eq!(five.vision.pos_grid_side(), 3);
    }

    #[test]
    fn impossible_values_name_their_key() {
        let cases: [(&str, &str, Value, &str); 6] = [
            (
                "text_config",
                "num_hidden_layers",
                (1u64 << 40).into(),
                "num_hidden_layers = 1099511627776 is implausibly large",
            ),
            (
                "vision_config",
                "num_position_embeddings",
                10.into(),
                "is not a square",
            ),
            (
                "vision_config",
                "deepstack_visual_indexes",
                serde_json::json!([2]),
                "past the last block",
            ),
            (
                "text_config",
                "num_key_value_heads",
                3.into(),
                "num_key_value_heads 3",
            ),
            (
                "vision_config",
                "out_hidden_size",
                8.into(),
                "out_hidden_size 8",
            ),
            (
                "text_config",
                "head_dim",
                0.into(),
                "text_config head_dim must be at least 1",
            ),
        ];
        for (section, key, value, message) in cases {
            let mut json = tiny();
            json[section][key] = value;
            let err = Qwen3VlConfig::from_value(&json).unwrap_err().to_string();
            assert!(err.contains(message), "{section}.{key}: {err}");
        }
    }
}
