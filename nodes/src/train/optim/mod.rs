//! Optimisation pieces of the update nodes, with PyTorch semantics: AdamW
//! ([`adamw::AdamW`], `torch.optim.AdamW`), global-norm gradient clipping ([`clip`],
//! `torch.nn.utils.clip_grad_norm_`) and the learning-rate schedules verl uses ([`schedule`]).
//!
//! burn ships an AdamW and gradient clipping, but with other defaults (epsilon 1e-5, weight decay
//! 1e-4), per-tensor clipping, and optimizer state keyed by the random `ParamId`s of one process;
//! these versions key the state by the parameter's module path so that a checkpoint restores into
//! a freshly loaded model.

pub mod adamw;
pub mod clip;
pub mod schedule;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::{clip_grad_norm, global_grad_norm, grad_sum_squares, scale_grads};
pub use schedule::{LrSchedule, WarmupStyle};
