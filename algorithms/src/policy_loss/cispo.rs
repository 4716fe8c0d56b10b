//! CISPO (Clipped IS-weight Policy Optimization, MiniMax-M1, arXiv 2506.13585): verl's
//! `compute_policy_loss_cispo` (registry `cispo`).
//!
//! The clipped ratio weighs the log-prob instead of replacing the surrogate, so the gradient
//! still flows where the ratio is clipped. With δc = clamp(δ, −20, 20), r = exp(δc) and
//! r̂ = clamp(r, 1−ε_lo, 1+ε_hi) (constant):
//!
//! ```text
//! L = −r̂·A·log_prob,    dL/dlog_prob = −r̂·A
//! ```
//!
//! then L·W and `agg_loss` with the mode and global info. `clip_ratio_low = 1` puts the lower
//! bound at 0 (never clips from below).
//!
//! Metrics: `pg_clipfrac` = MM([r ≠ r̂]) (either side), `pg_clipfrac_lower` = 0,
//! `ppo_kl` = MM(−δc).

use burn::prelude::*;

use super::{ClipConfig, PolicyLossInputs, PolicyLossOutput, zero_metric};
use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::Result;
use crate::tensor_util::masked_mean;

/// verl `compute_policy_loss_cispo`; see the module docs.
pub fn policy_loss_cispo<B: Backend>(
    inputs: PolicyLossInputs<B>,
    clip: &ClipConfig,
    mode: LossAggMode,
    info: &GlobalBatchInfo,
) -> Result<PolicyLossOutput<B>> {
    inputs.check()?;
    clip.validate_bounds()?;
    let (lo, hi) = clip.low_high();
    let mask = inputs.mask();
    let log_prob = inputs.log_prob.clone();
    let delta = log_prob
        .clone()
        .detach()
        .sub(inputs.old_log_prob.clone().detach())
        .clamp(-20.0, 20.0);
    let ratio = delta.clone().exp();
    let clipped_ratio = ratio.clone().clamp(1.0 - lo, 1.0 + hi);
    let clipped = ratio.not_equal(clipped_ratio.clone());
    let per_token = clipped_ratio
        .neg()
        .mul(inputs.advantages.clone().detach())
        .mul(log_prob);
    let per_token = inputs.weighted(per_token);

    let pg_clipfrac = masked_mean(clipped.float(), mask.clone());
    let ppo_kl = masked_mean(delta.neg(), mask.clone());
    let pg_loss = agg_loss(per_token.clone(), inputs.response_mask, mode, info)?;
    Ok(PolicyLossOutput::new(
        pg_loss,
        Some(per_token),
        Some(pg_clipfrac),
        Some(ppo_kl),
        Some(zero_metric(&mask)),
    ))
}
