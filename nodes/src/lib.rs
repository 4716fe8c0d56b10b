//! flowrl-nodes: the built-in node kinds (one kind per file) and the model/optimizer resources.
//!
//! Values on edges are defined in [`values`]; node kinds register with the engine's registry.

pub mod values;

pub use values::{AdvantageBatch, PromptBatch, RolloutBatch, ScoreBatch, TokenLogProbs, TokenMatrix};
