//! What every family's config parser shares: the size checks — zero sizes and implausibly
//! large ones, each error naming its key, so that a mistyped config.json is an error rather
//! than a build that divides by zero or allocates (or loops over) what it claims — and the serde
//! types the config sections derive from ([`Key`], [`Section`]).

use anyhow::{Result, ensure};
use serde::de::{Deserialize, DeserializeOwned, Deserializer};
use serde_json::Value;

/// Largest accepted width of a tensor dimension (vocabulary, hidden, MLP and head sizes): 2^26.
pub const MAX_WIDTH: usize = 1 << 26;
/// Largest accepted count of layers or heads.
pub const MAX_COUNT: usize = 1 << 12;
/// Largest accepted patch side, temporal patch, merge size, pooling window or channel count.
pub const MAX_PATCH: usize = 1 << 10;

/// Every `(key, value)` is at least 1; the message starts with `prefix` (e.g. `"config.json: "`).
pub fn ensure_positive(prefix: &str, sizes: &[(&str, usize)]) -> Result<()> {
    for &(key, value) in sizes {
        ensure!(value > 0, "{prefix}{key} must be at least 1 (got 0)");
    }
    Ok(())
}

/// Every `(key, value, max)` has `value <= max`.
pub fn ensure_at_most(prefix: &str, sizes: &[(&str, usize, usize)]) -> Result<()> {
    for &(key, value, max) in sizes {
        ensure!(
            value <= max,
            "{prefix}{key} = {value} is implausibly large (at most {max})"
        );
    }
    Ok(())
}

/// The sizes of a Qwen text decoder (Qwen2-VL, Qwen2.5-VL and Qwen3-VL share the checks),
/// named in errors as `config.json: {section} {key}`. The checks run in four groups so that a
/// family can interleave its vision checks in the order its messages come: zero sizes, upper
/// bounds, divisibility, then positive floats.
pub struct DecoderSizes<'a> {
    /// `"text"` or `"text_config"`.
    pub section: &'a str,
    /// How the RoPE base is named in its error (`rope_theta`, `text_config rope_theta`).
    pub rope_theta_key: &'a str,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
}

impl DecoderSizes<'_> {
    fn named(&self, key: &str) -> String {
        format!("{} {key}", self.section)
    }

    /// Every size at least 1.
    pub fn ensure_positive(&self) -> Result<()> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (key, value) in sizes {
            ensure_positive("config.json: ", &[(self.named(key).as_str(), value)])?;
        }
        Ok(())
    }

    /// Widths at most [`MAX_WIDTH`], counts at most [`MAX_COUNT`].
    pub fn ensure_bounded(&self) -> Result<()> {
        let sizes = [
            ("vocab_size", self.vocab_size, MAX_WIDTH),
            ("hidden_size", self.hidden_size, MAX_WIDTH),
            ("intermediate_size", self.intermediate_size, MAX_WIDTH),
            ("head_dim", self.head_dim, MAX_WIDTH),
            ("num_hidden_layers", self.num_layers, MAX_COUNT),
            ("num_attention_heads", self.num_heads, MAX_COUNT),
            ("num_key_value_heads", self.num_kv_heads, MAX_COUNT),
        ];
        for (key, value, max) in sizes {
            ensure_at_most("config.json: ", &[(self.named(key).as_str(), value, max)])?;
        }
        Ok(())
    }

    /// Query heads a multiple of the KV heads; an even head width (RoPE rotates pairs).
    pub fn ensure_divisible(&self) -> Result<()> {
        ensure!(
            self.num_heads.is_multiple_of(self.num_kv_heads),
            "config.json: {} num_attention_heads {} is not a multiple of num_key_value_heads {}",
            self.section,
            self.num_heads,
            self.num_kv_heads
        );
        ensure!(
            self.head_dim.is_multiple_of(2),
            "config.json: {} head_dim {} is odd (rotary embeddings rotate pairs)",
            self.section,
            self.head_dim
        );
        Ok(())
    }

    /// A positive, finite RMSNorm epsilon and RoPE base.
    pub fn ensure_positive_floats(&self) -> Result<()> {
        ensure!(
            self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0,
            "config.json: {} rms_norm_eps must be a positive number (got {})",
            self.section,
            self.rms_norm_eps
        );
        ensure!(
            self.rope_theta.is_finite() && self.rope_theta > 0.0,
            "config.json: {} must be a positive number (got {})",
            self.rope_theta_key,
            self.rope_theta
        );
        Ok(())
    }
}

/// One key of a config.json section as serde reads it: absent (or `null`), a value of the
/// expected type, or a value of another type (kept, so the error or the lenient default can be
/// chosen by the parser). Sections derive `Deserialize` with every field a `Key` (or a
/// [`Section`]) and `#[serde(default)]`, so reading a section never fails by itself: which keys
/// are required, which fall back to a default and which refuse a wrong type is the family
/// parser's choice, with an error naming the key.
#[derive(Debug, Clone, Default)]
pub enum Key<T> {
    #[default]
    Absent,
    Valid(T),
    Invalid(Value),
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Key<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Null => Key::Absent,
            v => match T::deserialize(&v) {
                Ok(x) => Key::Valid(x),
                Err(_) => Key::Invalid(v),
            },
        })
    }
}

impl<T> Key<T> {
    /// This key, or `other` when this one is absent.
    pub fn or(self, other: Self) -> Self {
        match self {
            Key::Absent => other,
            present => present,
        }
    }

    /// Whether the key holds a value (of any type).
    pub fn is_present(&self) -> bool {
        !matches!(self, Key::Absent)
    }

    /// The value when it has the expected type (a value of another type counts as absent).
    pub fn valid(self) -> Option<T> {
        match self {
            Key::Valid(x) => Some(x),
            _ => None,
        }
    }

    /// The value, or an error with `message` when it is absent or of another type.
    pub fn required(self, message: impl FnOnce() -> String) -> Result<T> {
        self.valid().ok_or_else(|| anyhow::anyhow!(message()))
    }

    /// The value, `default` when absent, an error with `message` when of another type.
    pub fn or_default(self, default: T, message: impl FnOnce() -> String) -> Result<T> {
        match self {
            Key::Absent => Ok(default),
            Key::Valid(x) => Ok(x),
            Key::Invalid(_) => Err(anyhow::anyhow!(message())),
        }
    }
}

impl Key<Value> {
    /// The raw value of a key read as [`Value`] (never [`Key::Invalid`]).
    pub fn value(self) -> Option<Value> {
        self.valid()
    }
}

/// A nested section of config.json (`text_config`, `rope_parameters`, …): absent (or `null`),
/// or present with its keys. A present value that is not an object has no keys.
#[derive(Debug, Clone, Default)]
pub enum Section<T> {
    #[default]
    Absent,
    Present(T),
}

impl<'de, T: DeserializeOwned + Default> Deserialize<'de> for Section<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Null => Section::Absent,
            v @ Value::Object(_) => Section::Present(T::deserialize(&v).unwrap_or_default()),
            _ => Section::Present(T::default()),
        })
    }
}

impl<T> Section<T> {
    /// This section, or `other` when this one is absent.
    pub fn or(self, other: Self) -> Self {
        match self {
            Section::Absent => other,
            present => present,
        }
    }

    pub fn present(self) -> Option<T> {
        match self {
            Section::Absent => None,
            Section::Present(t) => Some(t),
        }
    }
}

/// The keys of `json` as section `T` (every field a [`Key`] or [`Section`]: never fails; a
/// non-object gives no keys).
pub fn keys<T: DeserializeOwned + Default>(json: &Value) -> T {
    match json {
        Value::Object(_) => T::deserialize(json).unwrap_or_default(),
        _ => T::default(),
    }
}

/// Token ids of an `eos_token_id`-like value: one id or a list (non-integers dropped).
pub fn ids_of(v: &Value) -> Vec<u32> {
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
