//! What to adapt: PEFT's `LoraConfig` fields and its `target_modules` rule (see [`super`]).

use anyhow::{Result, ensure};

use crate::weights::normalize_name;

/// The `target_modules` entry that selects every linear but the output layer.
pub const ALL_LINEAR: &str = "all-linear";

/// The output layer, never adapted by [`ALL_LINEAR`] (PEFT leaves the output embedding alone).
const OUTPUT_LAYER: &str = "lm_head";

/// What to adapt and how (PEFT's `LoraConfig` fields of the same names).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// `r`: the adapters' rank.
    pub rank: usize,
    /// `lora_alpha`: the scaling is `alpha / rank`.
    pub alpha: f64,
    /// `lora_dropout`: dropout on the adapter's input while training.
    pub dropout: f64,
    /// Module-name suffixes, or [`ALL_LINEAR`].
    pub target_modules: Vec<String>,
}

impl LoraConfig {
    /// `s = alpha / r`.
    pub fn scaling(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Rank ≥ 1, alpha finite and > 0, dropout in [0, 1), at least one target.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.rank >= 1,
            "LoRA rank must be at least 1 (got {})",
            self.rank
        );
        ensure!(
            self.alpha.is_finite() && self.alpha > 0.0,
            "LoRA alpha must be a positive number (got {})",
            self.alpha
        );
        ensure!(
            (0.0..1.0).contains(&self.dropout),
            "LoRA dropout must be in [0, 1) (got {})",
            self.dropout
        );
        ensure!(
            !self.target_modules.is_empty(),
            "LoRA target_modules is empty: name module suffixes such as \"q_proj\", or \"{ALL_LINEAR}\""
        );
        Ok(())
    }

    /// Whether linear `module` (its checkpoint prefix, e.g. `model.layers.0.self_attn.q_proj`)
    /// gets an adapter (see the module doc); `vision` tells whether it belongs to the vision
    /// tower.
    pub fn matches(&self, module: &str, vision: bool) -> bool {
        self.target_modules
            .iter()
            .any(|t| entry_matches(t, module, vision))
    }
}

/// One `target_modules` entry against one module name.
pub(super) fn entry_matches(entry: &str, module: &str, vision: bool) -> bool {
    // A vision-tower module only for an entry that names the tower.
    if vision && !in_vision_tower(entry) {
        return false;
    }
    if entry == ALL_LINEAR {
        return module != OUTPUT_LAYER && !module.ends_with(".lm_head");
    }
    let (module, entry) = (normalize_name(module), normalize_name(entry));
    module == entry || module.ends_with(&format!(".{entry}"))
}

/// Module-name prefixes of the families' vision towers (legacy and transformers-5 names).
pub const VISION_TOWER_PREFIXES: &[&str] = &[
    "visual.",
    "model.visual.",
    "model.vision_tower.",
    "model.embed_vision.",
];

/// Whether a module name (or a `target_modules` entry) lies in a vision tower.
pub fn in_vision_tower(module: &str) -> bool {
    VISION_TOWER_PREFIXES.iter().any(|p| module.starts_with(p))
}
