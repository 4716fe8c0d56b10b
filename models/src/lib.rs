//! flowrl-models: model families behind capability traits.
//!
//! - [`capabilities`]: the traits nodes use (`CausalLm`, `Vision`, `MultimodalPositions`,
//!   `ImageProcessor`) and shared host-side types.
//! - [`registry`]: `config.json`'s `model_type` → family.

pub mod capabilities;
pub mod gemma4;
pub mod generate;
pub mod image;
pub mod qwen2_vl;
pub mod registry;
pub mod sampling;

pub use capabilities::{
    CausalLm, ImageProcessor, KvCache, MultimodalPositions, PaddedBatch, PositionIds,
    ProcessedImage, Vision, load_image_processor, plain_positions, scatter_image_embeddings,
};
