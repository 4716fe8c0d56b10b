//! flowrl-algorithms: verl's core RL algorithms on burn tensors, and rule-based rewards.
//!
//! What it holds (each module documents its formulas and the verl function it reproduces):
//!
//! * [`advantage`]: every advantage estimator verl registers: GRPO, Dr.GRPO, RLOO,
//!   REINFORCE++, REINFORCE++-baseline (`core_algos.compute_*_outcome_advantage`), grouping by
//!   prompt uid, and in one submodule each GAE, GDPO, pass@k GRPO, OPO, ReMax, GPG and the
//!   optimal token baseline (plain and multi-turn);
//! * [`policy_loss`]: every policy loss of verl's registry by its name — the "vanilla"
//!   PPO-clip surrogate with clip-higher and dual clip (`core_algos.compute_policy_loss_vanilla`),
//!   DPPO-TV/KL, GSPO, SAPO, GPG, Clip-Cov, KL-Cov, GMPO (`geo_mean`), DRO, CISPO — and their
//!   metrics;
//! * [`kl`]: the k1/abs/k2/k3 KL estimators and their straight-through variants
//!   (`core_algos.kl_penalty`), as a loss term and as a reward penalty;
//! * [`agg_loss`](mod@agg_loss): loss aggregation modes with global (micro-batch / data-parallel)
//!   normalisation (`core_algos.agg_loss`);
//! * [`entropy`]: token entropy and label log-probs from logits or hidden states, chunked
//!   along the sequence (`torch_functional.entropy_from_logits`, `logprobs_from_logits`);
//! * [`value_loss`]: PPO's clipped value loss of the critic (`core_algos.compute_value_loss`) and
//!   the critic's explained variance;
//! * [`rewards`]: pure-Rust rule-based rewards: the geo3k score (`reward_score.geo3k`) with a
//!   port of its answer grader, exact match, format only, weighted combinations.
//!
//! What it does not do: no models, no I/O, no graph nodes (those live in `flowrl-nodes`).
//! Tensor functions are generic over `B: Backend` and differentiable where the reference is
//! (policy loss w.r.t. the log-probs, KL w.r.t. the log-probs, entropy and log-probs w.r.t.
//! the logits). Every fallible function returns [`AlgoError`]; none panics on bad input.
//! Fixture parity: `tests/fixtures.rs` runs every vector of `tests/fixtures/grpo/`.

pub mod advantage;
pub mod agg_loss;
pub mod entropy;
pub mod error;
pub mod kl;
mod names;
pub mod policy_loss;
pub mod rewards;
mod tensor_util;
pub mod value_loss;

pub use advantage::gae::compute_gae_advantage_return;
pub use advantage::gdpo::{GdpoComponent, compute_gdpo_outcome_advantage};
pub use advantage::gpg::compute_gpg_outcome_advantage;
pub use advantage::grpo_passk::compute_grpo_passk_outcome_advantage;
pub use advantage::opo::compute_opo_outcome_advantage;
pub use advantage::optimal_token_baseline::{
    OTB_EPSILON, PathVariance, compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
};
pub use advantage::remax::compute_remax_outcome_advantage;
pub use advantage::{
    AdvantageEstimator, AdvantageOutput, GroupStats, HostAdvantages, TokenRewards,
    compute_advantages, compute_advantages_host, group_by_uid, group_scalar_advantages,
};
pub use agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
pub use entropy::{
    entropy_and_logprobs_chunked, entropy_and_logprobs_from_hidden, entropy_from_logits,
    entropy_loss, logprobs_from_logits, sum_pi_squared_from_hidden,
};
pub use error::{AlgoError, Result};
pub use kl::{KlEstimator, KlKind, kl_penalty, kl_reward_penalty};
pub use policy_loss::vanilla::policy_loss_vanilla;
pub use policy_loss::{
    ClipConfig, ClipCovConfig, DppoDivergence, KlCovConfig, LossAggregation, PolicyLossConfig,
    PolicyLossInputs, PolicyLossMode, PolicyLossOutput, compute_policy_loss,
};
pub use tensor_util::masked_mean;
pub use value_loss::{ValueLossOutput, compute_value_loss, explained_variance};
