//! LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") with
//! PEFT's semantics, so adapters move between flowrl and `peft` unchanged.
//!
//! A linear map `y = x·Wᵀ + b` of `[out, in]` weight gets two trainable matrices `A` `[r, in]` and
//! `B` `[out, r]`:
//!
//! ```text
//! y = x·Wᵀ + b + s · dropout(x)·Aᵀ·Bᵀ        s = alpha / r
//! ```
//!
//! as PEFT's `lora.Linear.forward` (`use_rslora = false`). A fresh adapter has
//! `A ~ U(−1/√in, 1/√in)` (PEFT's `kaiming_uniform_(a=√5)` on a `[r, in]` weight) and `B = 0`, so
//! an adapted model starts exactly at its base. Merging folds the adapter into the base weight:
//! `W' = W + s·B·A` (PEFT's `merge_and_unload`).
//!
//! Which linears get adapters ([`LoraConfig::matches`]): PEFT's rule for a list of
//! `target_modules` — a module whose name equals an entry or ends with `"." + entry` — where
//! `"all-linear"` means every linear but the output layer (`lm_head`). Vision-tower modules are
//! excluded unless an entry names the tower (an entry that starts with a tower prefix such as
//! `visual.` or `model.vision_tower.`), as EasyR1 does with `exclude_modules = ".*visual.*"`.
//!
//! Adapters are attached while a model is built: loading a [`Linear`](crate::layers::Linear)
//! ([`crate::weights::Load`]) asks its weight source
//! ([`crate::weights::WeightSource::lora_adapter`]) and [`LoraSource`] answers
//! for the modules that match, with fresh weights or with those of a stored PEFT adapter. Files
//! are in PEFT's layout ([`write_peft_adapter`], [`read_peft_adapter`]): `adapter_config.json` and
//! `adapter_model.safetensors` with keys `base_model.model.<module>.lora_A.weight` /
//! `.lora_B.weight`, where `<module>` is the transformers module path.
//!
//! The model-level operations (loading with adapters, reading, freezing and saving them) are
//! [`Model`](crate::model::Model)'s, in `adapted.rs`.
//!
//! The files: [`config`] (what to adapt), [`adapter`] (one linear's adapter and its dropout),
//! [`source`] (attaching adapters while a model is built, and merging them on export), `peft`
//! (PEFT's files).

pub mod adapter;
pub mod config;
mod peft;
pub mod source;

pub use adapter::{DropoutPosition, DropoutScope, Lora, TrainingSweep};
pub use config::{ALL_LINEAR, LoraConfig, VISION_TOWER_PREFIXES, in_vision_tower};
pub use peft::{
    AdapterTensors, module_path, read_peft_adapter, read_peft_config, write_peft_adapter,
};
pub use source::{AdapterInit, LoraSource, Merged, StoredAdapter};
