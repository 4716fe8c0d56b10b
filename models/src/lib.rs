//! flowrl-models: model families behind capability traits.
//!
//! - [`capabilities`]: the traits nodes use (`CausalLm`, `Vision`, `MultimodalPositions`,
//!   `ImageProcessor`) and shared host-side types (`PaddedBatch`, `PositionIds`, `KvCache`).
//! - [`registry`]: `config.json`'s `model_type` → family, one line per family, the only place
//!   that names them; [`family`]: what a family folder implements ([`family::FamilyConfig`],
//!   [`family::FamilyModel`]) and the macro the registry line feeds.
//! - [`model`]: [`Model`], a loaded model of any family (a burn `Module`) exposing capabilities;
//!   Hugging Face loading, saving and random initialisation.
//! - [`layers`]: shared layers (RMSNorm, rotate-half RoPE from position ids, GQA attention, …).
//! - [`weights`]: weight sources (checkpoint, random init, shape-only placeholders) and sinks.
//! - [`checkpoint`]: Hugging Face safetensors directories (single/sharded): checked, lean
//!   reading into the target precision, and sharded writing.
//! - [`lora`]: LoRA adapters with PEFT's semantics and file layout.
//! - [`value_head`]: the critic's value head on any family's model (`ValueModel`).
//! - one folder per family: [`qwen2_vl`] (Qwen2-VL and Qwen2.5-VL), [`qwen3_vl`], [`gemma4`].
//! - [`image`]: image resampling shared by processors; [`generate`], [`sampling`]: decoding.

mod adapted;
pub mod capabilities;
pub mod checkpoint;
pub mod config_checks;
pub mod family;
pub mod flex;
pub mod gemma4;
pub mod generate;
pub mod hub;
pub mod image;
pub mod kernels;
pub mod layers;
pub mod lora;
pub mod model;
pub mod qwen2_vl;
pub mod qwen3_vl;
pub mod registry;
pub mod sampling;
pub mod shape;
pub mod value_head;
pub mod weights;

pub use capabilities::{
    CausalLm, DecoderInputs, ImageProcessor, KvCache, MultimodalPositions, PaddedBatch,
    PositionIds, ProcessedImage, VideoFrames, VideoProcessor, VideoTiming, Vision, embed_inputs,
    layer_input_slice, plain_positions, scatter_image_embeddings,
};
pub use model::Model;
pub use registry::load_image_processor;
