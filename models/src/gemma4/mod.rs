//! Gemma 4 (`model_type` `gemma4`, transformers `Gemma4ForConditionalGeneration`).
//!
//! - [`config`]: `config.json` and the per-layer table derived from it;
//! - [`layers`]: linear, RMSNorm, clipped linear, rotary and attention helpers;
//! - [`text`]: the decoder (PLE, sliding/full layers, KV sharing, soft-capped tied head);
//! - [`vision`]: vision tower, pooler and projector;
//! - [`model`]: [`Gemma4Model`], loading/saving and the capability traits;
//! - [`weights`]: safetensors reading/writing by name;
//! - [`processor`]: the image processor.
//!
//! Gemma 4 implements `CausalLm`, `Vision` and (through [`processor`]) `ImageProcessor`, and no
//! `MultimodalPositions`: positions are plain 1-D, from the attention mask.

pub mod config;
pub mod layers;
pub mod model;
pub mod processor;
pub mod text;
pub mod vision;
pub mod weights;

pub use config::Gemma4Config;
pub use model::Gemma4Model;
