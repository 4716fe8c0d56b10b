//! Gemma 4 (`model_type` `gemma4`, transformers `Gemma4ForConditionalGeneration`).
//!
//! - [`config`]: `config.json` and the per-layer table derived from it;
//! - [`layers`]: the clipped linear and the GeGLU MLP (the rest comes from [`crate::layers`]);
//! - [`text`]: the decoder (PLE, sliding/full layers, KV sharing, soft-capped tied head);
//! - [`vision`]: vision tower, pooler and projector;
//! - [`model`]: [`Gemma4`] and its capability traits (loaded and saved through
//!   [`crate::model::Model`] and [`crate::weights`]);
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

pub use config::Gemma4Config;
pub use model::Gemma4;
