//! DPPO-Binary (Divergence PPO, arXiv 2602.04879): verl's `compute_policy_loss_dppo_tv`
//! (registry `dppo_tv`) and `compute_policy_loss_dppo_kl` (`dppo_kl`).
//!
//! The trust region is a divergence between the token probabilities, not a ratio bound:
//! ε_lo / ε_hi (`clip_ratio_low` / `clip_ratio_high`, falling back to `clip_ratio`) bound it,
//! and c = `clip_ratio_c` truncates the importance ratio (verl's default config gives 3; the
//! function's own fallback of 20 never applies because the config always has the field).
//!
//! With δc = clamp(δ, −20, 20), r = exp(δc), r̄ = min(r, c) (constant), p = exp(log_prob) and
//! p_old = exp(old_log_prob) (both unclamped):
//!
//! * TV: v = [p − p_old ≤ ε_hi] if A > 0, else [p − p_old ≥ −ε_lo] (A = 0 takes the else);
//! * KL: with KL_b = p_old·(old_log_prob − log_prob) + (1 − p_old)·ln((1 − p_old + 1e-8) /
//!   (1 − p + 1e-8)), v = [KL_b ≤ ε_hi ∨ p ≤ p_old] if A > 0, else [KL_b ≤ ε_lo ∨ p ≥ p_old].
//!   Where p > 1 (log_prob > 0) the logarithm's argument is negative and KL_b is NaN: a
//!   comparison with NaN is false (IEEE), so only the p ≤ p_old / p ≥ p_old test decides, and
//!   the NaN reaches no output;
//! * L = −A·r̄·log_prob·v (constant v): the value is not a surrogate, only its gradient
//!   −A·r̄·v matters; then L·W and `agg_loss` with the mode and global info.
//!
//! Metrics: `pg_clipfrac` = MM(1 − v), `pg_clipfrac_lower` = MM(\[r > c\]·v), `ppo_kl` = MM(−δc).

use burn::prelude::*;

use super::{ClipConfig, PolicyLossInputs, PolicyLossOutput};
use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::{AlgoError, Result};
use crate::tensor_util::masked_mean;

/// Which divergence bounds DPPO's trust region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DppoDivergence {
    /// Total variation of the sampled token: p − p_old (`dppo_tv`).
    Tv,
    /// Binary KL between (p_old, 1 − p_old) and (p, 1 − p) (`dppo_kl`).
    Kl,
}

/// The truncation threshold c must be a positive number (verl does not check it; a non-positive
/// c would zero every ratio).
pub(crate) fn validate_threshold(c: f64) -> Result<()> {
    if c.is_nan() || c <= 0.0 {
        return Err(AlgoError::InvalidParameter(format!(
            "clip_ratio_c (DPPO's truncation threshold of the importance ratio) must be > 0, got {c}"
        )));
    }
    Ok(())
}

/// verl `compute_policy_loss_dppo_tv` / `_dppo_kl`; see the module docs for the formula.
pub fn policy_loss_dppo<B: Backend>(
    inputs: PolicyLossInputs<B>,
    clip: &ClipConfig,
    divergence: DppoDivergence,
    mode: LossAggMode,
    info: &GlobalBatchInfo,
) -> Result<PolicyLossOutput<B>> {
    inputs.check()?;
    clip.validate_bounds()?;
    validate_threshold(clip.clip_ratio_c)?;
    let (lo, hi) = clip.low_high();
    let c = clip.clip_ratio_c;
    let mask = inputs.mask();
    let log_prob = inputs.log_prob.clone();
    let old = inputs.old_log_prob.clone().detach();
    let adv = inputs.advantages.clone().detach();

    let delta = log_prob
        .clone()
        .detach()
        .sub(old.clone())
        .clamp(-20.0, 20.0);
    let ratio = delta.clone().exp();
    let truncated = ratio.clone().clamp_max(c);
    let prob = log_prob.clone().detach().exp();
    let old_prob = old.clone().exp();
    let positive = adv.clone().greater_elem(0.0);
    let valid = match divergence {
        DppoDivergence::Tv => {
            let diff = prob.sub(old_prob);
            let pos = diff.clone().lower_equal_elem(hi);
            let neg = diff.greater_equal_elem(-lo);
            neg.mask_where(positive, pos)
        }
        DppoDivergence::Kl => {
            let one_minus_old = old_prob.clone().neg().add_scalar(1.0);
            let one_minus_p = prob.clone().neg().add_scalar(1.0);
            let binary_kl = old_prob
                .clone()
                .mul(old.sub(log_prob.clone().detach()))
                .add(
                    one_minus_old.clone().mul(
                        one_minus_old
                            .add_scalar(1e-8)
                            .div(one_minus_p.add_scalar(1e-8))
                            .log(),
                    ),
                );
            let pos = binary_kl
                .clone()
                .lower_equal_elem(hi)
                .bool_or(prob.clone().lower_equal(old_prob.clone()));
            let neg = binary_kl
                .lower_equal_elem(lo)
                .bool_or(prob.greater_equal(old_prob));
            neg.mask_where(positive, pos)
        }
    };
    let valid_f = valid.clone().float();
    let per_token = adv.neg().mul(truncated).mul(valid_f.clone()).mul(log_prob);
    let per_token = inputs.weighted(per_token);

    let pg_clipfrac = masked_mean(valid_f.clone().neg().add_scalar(1.0), mask.clone());
    let pg_clipfrac_lower = masked_mean(ratio.greater_elem(c).float().mul(valid_f), mask.clone());
    let ppo_kl = masked_mean(delta.neg(), mask);
    let pg_loss = agg_loss(per_token.clone(), inputs.response_mask, mode, info)?;
    Ok(PolicyLossOutput::new(
        pg_loss,
        Some(per_token),
        Some(pg_clipfrac),
        Some(ppo_kl),
        Some(pg_clipfrac_lower),
    ))
}
