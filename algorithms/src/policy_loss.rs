//! The "vanilla" PPO-clip policy loss: verl's `core_algos.compute_policy_loss_vanilla`.
//!
//! Per token, with ε_lo / ε_hi the clip ratios, c the dual-clip constant and A the advantage:
//!
//! 1. δ = clamp(log_prob − old_log_prob, −20, 20), r = exp(δ)
//! 2. L1 = −A·r, L2 = −A·clamp(r, 1−ε_lo, 1+ε_hi), Lc = max(L1, L2)
//! 3. A < 0: loss = min(Lc, −A·c) (dual clip, Ye et al. 2020); otherwise loss = Lc
//! 4. loss ·= rollout_is_weights (when given)
//! 5. pg_loss = agg_loss(loss, mask, mode, global info)
//!
//! Metrics (masked means, Σ(x·m)/(Σm + 1e-8)): `ppo_kl` = mean(−δ), `pg_clipfrac` =
//! mean([L2 > L1]), `pg_clipfrac_lower` = mean([Lc > −A·c ∧ A < 0]).
//!
//! The branches are chosen with explicit masks, so the gradient w.r.t. `log_prob` is −A·r
//! (times the aggregation factor) where L1 won, and 0 where δ was clamped, the clipped branch
//! L2 won, or the dual-clip constant won, as in the reference.

use burn::prelude::*;

use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::{AlgoError, Result};
use crate::tensor_util::{check_same_shape, masked_mean};

/// Clip parameters of the PPO surrogate (verl's actor config fields of the same names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipConfig {
    /// Symmetric clip ratio ε, the fallback of the two below.
    pub clip_ratio: f64,
    /// Lower clip ratio ε_lo (`None` → `clip_ratio`).
    pub clip_ratio_low: Option<f64>,
    /// Upper clip ratio ε_hi (`None` → `clip_ratio`; > ε_lo is DAPO's clip-higher).
    pub clip_ratio_high: Option<f64>,
    /// Dual-clip constant c for negative advantages; must be > 1.
    pub clip_ratio_c: f64,
}

impl Default for ClipConfig {
    /// verl's defaults: ε = 0.2, c = 3.
    fn default() -> Self {
        Self {
            clip_ratio: 0.2,
            clip_ratio_low: None,
            clip_ratio_high: None,
            clip_ratio_c: 3.0,
        }
    }
}

impl ClipConfig {
    /// (ε_lo, ε_hi) after the fallback to `clip_ratio`.
    pub fn low_high(&self) -> (f64, f64) {
        (
            self.clip_ratio_low.unwrap_or(self.clip_ratio),
            self.clip_ratio_high.unwrap_or(self.clip_ratio),
        )
    }

    /// Checks the ranges verl asserts (`clip_ratio_c > 1`) plus finiteness and ε ≥ 0.
    pub fn validate(&self) -> Result<()> {
        let (lo, hi) = self.low_high();
        if self.clip_ratio_c.is_nan() || self.clip_ratio_c <= 1.0 {
            return Err(AlgoError::InvalidParameter(format!(
                "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0, but get the value: {}",
                self.clip_ratio_c
            )));
        }
        for (name, v) in [("clip_ratio_low", lo), ("clip_ratio_high", hi)] {
            if !v.is_finite() || v < 0.0 {
                return Err(AlgoError::InvalidParameter(format!(
                    "{name} must be finite and >= 0, got {v}"
                )));
            }
        }
        Ok(())
    }
}

/// Output of [`policy_loss_vanilla`]. All tensors are scalars `[1]` except `per_token_loss`.
#[derive(Debug, Clone)]
pub struct PolicyLossOutput<B: Backend> {
    /// The aggregated loss (differentiable w.r.t. `log_prob`).
    pub pg_loss: Tensor<B, 1>,
    /// Unreduced per-token loss `[B, T]` (after IS weights, masked positions included).
    pub per_token_loss: Tensor<B, 2>,
    /// `actor/pg_clipfrac` (detached).
    pub pg_clipfrac: Tensor<B, 1>,
    /// `actor/ppo_kl` (detached).
    pub ppo_kl: Tensor<B, 1>,
    /// `actor/pg_clipfrac_lower` (detached).
    pub pg_clipfrac_lower: Tensor<B, 1>,
}

/// verl `compute_policy_loss_vanilla`; all inputs `[B, T]`, `response_mask` float 0/1.
/// See the module docs for the formula. Errors on shape mismatch or invalid clip settings.
#[allow(clippy::too_many_arguments)]
pub fn policy_loss_vanilla<B: Backend>(
    old_log_prob: Tensor<B, 2>,
    log_prob: Tensor<B, 2>,
    advantages: Tensor<B, 2>,
    response_mask: Tensor<B, 2>,
    rollout_is_weights: Option<Tensor<B, 2>>,
    clip: &ClipConfig,
    mode: LossAggMode,
    info: &GlobalBatchInfo,
) -> Result<PolicyLossOutput<B>> {
    clip.validate()?;
    let dims = log_prob.dims();
    check_same_shape("old_log_prob vs log_prob", dims, old_log_prob.dims())?;
    check_same_shape("advantages vs log_prob", dims, advantages.dims())?;
    check_same_shape("response_mask vs log_prob", dims, response_mask.dims())?;
    if let Some(w) = &rollout_is_weights {
        check_same_shape("rollout_is_weights vs log_prob", dims, w.dims())?;
    }
    let (lo, hi) = clip.low_high();
    let c = clip.clip_ratio_c;

    let delta = log_prob.sub(old_log_prob).clamp(-20.0, 20.0);
    let ratio = delta.clone().exp();
    let neg_adv = advantages.clone().neg();
    let loss1 = neg_adv.clone().mul(ratio.clone());
    let loss2 = neg_adv.clone().mul(ratio.clamp(1.0 - lo, 1.0 + hi));
    // Lc = max(L1, L2): L2 only where strictly greater (then r was clipped: zero gradient).
    let clipped = loss2.clone().detach().greater(loss1.clone().detach());
    let clip_max = loss1.mask_where(clipped.clone(), loss2);
    // Dual clip: for A < 0, min(Lc, −A·c); the constant wins where Lc > −A·c.
    let loss3 = neg_adv.mul_scalar(c).detach();
    let adv_negative = advantages.lower_elem(0.0);
    let dual = clip_max
        .clone()
        .detach()
        .greater(loss3.clone())
        .bool_and(adv_negative);
    let mut per_token = clip_max.mask_where(dual.clone(), loss3);
    if let Some(w) = rollout_is_weights {
        per_token = per_token.mul(w);
    }

    let mask = response_mask.clone().detach();
    let ppo_kl = masked_mean(delta.detach().neg(), mask.clone());
    let pg_clipfrac = masked_mean(clipped.float(), mask.clone());
    let pg_clipfrac_lower = masked_mean(dual.float(), mask);
    let pg_loss = agg_loss(per_token.clone(), response_mask, mode, info)?;
    Ok(PolicyLossOutput {
        pg_loss,
        per_token_loss: per_token,
        pg_clipfrac,
        ppo_kl,
        pg_clipfrac_lower,
    })
}
