//! The `update.*` kinds: one training step of a model resource per graph step (`update.ppo`,
//! `update.sft`, `update.critic`). What they share is in [`support`]; the optimizer step itself
//! is [`crate::train`]'s.

pub mod critic;
pub mod ppo;
pub mod ppo_loss;
pub mod sft;
pub mod support;
