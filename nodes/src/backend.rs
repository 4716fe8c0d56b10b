//! The burn backends the built-in nodes compute on.
//!
//! Training runs on `Autodiff<Flex, BalancedCheckpointing>` (burn's pure-Rust CPU backend with
//! activation checkpointing); generation and log-probs without gradients run on its inner
//! backend, reached through `AutodiffModule::valid`, so no autodiff graph is ever built there.
//! Edge values are plain data (see [`crate::values`]), so a CUDA backend can be added here
//! without touching the node kinds' interfaces.

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};

/// The backend of trainable models.
///
/// With `BalancedCheckpointing`, burn-autodiff keeps only the outputs of compute-bound
/// operations (matmuls, reductions, ...) for the backward pass and recomputes the memory-bound
/// ones (elementwise ops, reshapes) from them when their gradient is needed, instead of keeping
/// every intermediate activation of the forward pass. On the benchmark's update micro-batch
/// (32 rows × 237 tokens, `bench-profile update`) the peak RSS falls from 8.2 to 5.65 GB for
/// about 4 % more CPU time.
pub type TrainBackend = Autodiff<Flex, BalancedCheckpointing>;
/// The backend without autodiff (generation, reference and old-policy log-probs).
pub type InferBackend = Flex;
/// The device of both.
pub type TrainDevice = burn::backend::flex::FlexDevice;
