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
//! mean(\[L2 > L1\]), `pg_clipfrac_lower` = mean([Lc > −A·c ∧ A < 0]).
//!
//! The branches are chosen with explicit masks, so the gradient w.r.t. `log_prob` is −A·r
//! (times the aggregation factor) where L1 won, and 0 where δ was clamped, the clipped branch
//! L2 won, or the dual-clip constant won, as in the reference.

use burn::prelude::*;

use super::{ClipConfig, PolicyLossOutput, check_shapes};
use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::Result;
use crate::tensor_util::masked_mean;

/// verl `compute_policy_loss_vanilla` (registry name `vanilla`); all inputs `[B, T]`,
/// `response_mask` float 0/1. See the module docs for the formula. Errors on shape mismatch or
/// invalid clip settings. Reports all three metrics.
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
    check_shapes(
        &old_log_prob,
        &log_prob,
        &advantages,
        &response_mask,
        rollout_is_weights.as_ref(),
    )?;
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
    Ok(PolicyLossOutput::new(
        pg_loss,
        Some(per_token),
        Some(pg_clipfrac),
        Some(ppo_kl),
        Some(pg_clipfrac_lower),
    ))
}
