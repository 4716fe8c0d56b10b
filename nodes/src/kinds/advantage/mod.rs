//! The `advantage.*` kinds: scores → per-token advantages and returns, one per estimator of
//! `flowrl_algorithms` (verl's registry names). What they share is in [`support`].

pub mod gae;
pub mod gdpo;
pub mod gpg;
pub mod grpo;
pub mod grpo_passk;
pub mod opo;
pub mod optimal_token_baseline;
pub mod reinforce_pp;
pub mod reinforce_pp_baseline;
pub mod remax;
pub mod rloo;
pub mod support;
pub mod tir_optimal_token_baseline;
