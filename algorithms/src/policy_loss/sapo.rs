//! SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347): verl's
//! `compute_policy_loss_sapo` (registry `sapo`).
//!
//! A smooth gate replaces the hard clip. With δc = clamp(δ, −20, 20), r = exp(δc) and
//! τ = τ+ (`tau_pos`) where A > 0, else τ− (`tau_neg`):
//!
//! ```text
//! f = σ(τ·(r − 1)) · 4/τ,    L = −f·A
//! ```
//!
//! so dL/dlog_prob = −A·4·σ·(1 − σ)·r (0 where δ was clamped). Then L·W and **always**
//! `agg_loss(·, m, seq-mean-token-mean, global info)`: verl ignores `loss_agg_mode` here but
//! honours `dp_size` and `global_batch_size`.
//!
//! Metrics: `pg_clipfrac` = 0, `pg_clipfrac_lower` = 0, `ppo_kl` = MM(−δc).

use burn::prelude::*;
use burn::tensor::activation::sigmoid;

use super::{PolicyLossInputs, PolicyLossOutput, zero_metric};
use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::{AlgoError, Result};
use crate::tensor_util::masked_mean;

/// The gate temperatures must be finite and non-zero (the gate divides by τ).
pub(crate) fn validate_taus(tau_pos: f64, tau_neg: f64) -> Result<()> {
    for (name, v) in [("tau_pos", tau_pos), ("tau_neg", tau_neg)] {
        if !v.is_finite() || v == 0.0 {
            return Err(AlgoError::InvalidParameter(format!(
                "{name} must be finite and non-zero, got {v}"
            )));
        }
    }
    Ok(())
}

/// verl `compute_policy_loss_sapo`; see the module docs (there is no `loss_agg_mode`: SAPO
/// always aggregates `seq-mean-token-mean`).
pub fn policy_loss_sapo<B: Backend>(
    inputs: PolicyLossInputs<B>,
    tau_pos: f64,
    tau_neg: f64,
    info: &GlobalBatchInfo,
) -> Result<PolicyLossOutput<B>> {
    inputs.check()?;
    validate_taus(tau_pos, tau_neg)?;
    let mask = inputs.mask();
    let adv = inputs.advantages.clone().detach();
    let delta = inputs
        .log_prob
        .clone()
        .sub(inputs.old_log_prob.clone().detach())
        .clamp(-20.0, 20.0);
    let ratio = delta.clone().exp();
    let taus = adv
        .clone()
        .ones_like()
        .mul_scalar(tau_neg)
        .mask_fill(adv.clone().greater_elem(0.0), tau_pos);
    let gates = sigmoid(ratio.sub_scalar(1.0).mul(taus.clone())).mul(taus.recip().mul_scalar(4.0));
    let per_token = inputs.weighted(gates.neg().mul(adv));

    let ppo_kl = masked_mean(delta.detach().neg(), mask.clone());
    let pg_loss = agg_loss(
        per_token.clone(),
        inputs.response_mask,
        LossAggMode::SeqMeanTokenMean,
        info,
    )?;
    Ok(PolicyLossOutput::new(
        pg_loss,
        Some(per_token),
        Some(zero_metric(&mask)),
        Some(ppo_kl),
        Some(zero_metric(&mask)),
    ))
}
