//! GSPO (Group Sequence Policy Optimization, arXiv 2507.18071): verl's
//! `compute_policy_loss_gspo` (registry `gspo`).
//!
//! The importance ratio is one per sequence: with n_b = max(Σ_t m, 1),
//! s_b = Σ_t δ·m / n_b (the row's mean log-ratio, 0 for an empty row; δ is **not** clamped),
//! every token of row b, masked ones included, gets
//!
//! ```text
//! S_b,t = exp(min(log_prob − sg(log_prob) + sg(s_b), 10))
//! ```
//!
//! whose value is exp(min(s_b, 10)) and whose derivative w.r.t. log_prob_t is S_b (0 when
//! s_b > 10). Then L1 = −A·S, L2 = −A·clamp(S, 1−ε_lo, 1+ε_hi), L = max(L1, L2) (gradient
//! −A·S where L2 ≤ L1, else 0), L·W, and **always** `agg_loss(·, m, seq-mean-token-mean,
//! global info)`: verl ignores `loss_agg_mode` here but honours `dp_size` and
//! `global_batch_size`. The GSPO paper uses ε_lo = 3e-4, ε_hi = 4e-4.
//!
//! Metrics: `pg_clipfrac` = MM(\[L2 > L1\]), `pg_clipfrac_lower` = 0, `ppo_kl` = MM(−δ).

use burn::prelude::*;

use super::{ClipConfig, PolicyLossInputs, PolicyLossOutput, zero_metric};
use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::Result;
use crate::tensor_util::{masked_mean, row_masked_sum};

/// verl `compute_policy_loss_gspo`; see the module docs (there is no `loss_agg_mode`: GSPO
/// always aggregates `seq-mean-token-mean`).
pub fn policy_loss_gspo<B: Backend>(
    inputs: PolicyLossInputs<B>,
    clip: &ClipConfig,
    info: &GlobalBatchInfo,
) -> Result<PolicyLossOutput<B>> {
    inputs.check()?;
    clip.validate_bounds()?;
    let (lo, hi) = clip.low_high();
    let mask = inputs.mask();
    let log_prob = inputs.log_prob.clone();
    let adv = inputs.advantages.clone().detach();

    let delta = log_prob
        .clone()
        .detach()
        .sub(inputs.old_log_prob.clone().detach());
    let lengths = mask.clone().sum_dim(1).clamp_min(1.0); // [B, 1]
    let seq_log_ratio = row_masked_sum(delta.clone(), mask.clone()).div(lengths); // [B, 1]
    let log_ratio = log_prob
        .clone()
        .sub(log_prob.detach())
        .add(seq_log_ratio.detach())
        .clamp_max(10.0);
    let ratio = log_ratio.exp();
    let neg_adv = adv.neg();
    let loss1 = neg_adv.clone().mul(ratio.clone());
    let loss2 = neg_adv.mul(ratio.clamp(1.0 - lo, 1.0 + hi));
    let clipped = loss2.clone().detach().greater(loss1.clone().detach());
    let per_token = inputs.weighted(loss1.mask_where(clipped.clone(), loss2));

    let pg_clipfrac = masked_mean(clipped.float(), mask.clone());
    let ppo_kl = masked_mean(delta.neg(), mask.clone());
    let pg_loss = agg_loss(
        per_token.clone(),
        inputs.response_mask,
        LossAggMode::SeqMeanTokenMean,
        info,
    )?;
    Ok(PolicyLossOutput::new(
        pg_loss,
        Some(per_token),
        Some(pg_clipfrac),
        Some(ppo_kl),
        Some(zero_metric(&mask)),
    ))
}
