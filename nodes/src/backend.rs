//! The burn backends the built-in nodes compute on.
//!
//! Training runs on `Autodiff<Flex>` (burn's pure-Rust CPU backend); generation and log-probs
//! without gradients run on its inner backend, reached through `AutodiffModule::valid`, so no
//! autodiff graph is ever built there. Edge values are plain data (see [`crate::values`]), so a
//! CUDA backend can be added here without touching the node kinds' interfaces.

use burn::backend::{Autodiff, Flex};

/// The backend of trainable models.
pub type TrainBackend = Autodiff<Flex>;
/// The backend without autodiff (generation, reference and old-policy log-probs).
pub type InferBackend = Flex;
/// The device of both.
pub type TrainDevice = burn::backend::flex::FlexDevice;
