//! DRO: verl's `compute_policy_loss_dro` (registry `dro`).
//!
//! A log-prob objective with a quadratic penalty on the log-ratio δ (not clamped), β =
//! `policy_loss.dro_beta`:
//!
//! ```text
//! L = −(log_prob·A − ½·β·δ²),    dL/dlog_prob = −(A − β·δ)
//! ```
//!
//! then L·W and `agg_loss` with the mode and global info. β must be set and positive (verl's
//! default is null, which raises `ValueError("policy_loss.dro_beta must be a positive value when
//! using DRO")`; same message here).
//!
//! Metric: `ppo_kl` = MM(−δ).

use burn::prelude::*;

use super::{PolicyLossInputs, PolicyLossOutput};
use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::{AlgoError, Result};
use crate::tensor_util::masked_mean;

/// verl's check: β must be given and > 0.
pub(crate) fn validate_beta(beta: Option<f64>) -> Result<f64> {
    match beta {
        Some(b) if b.is_finite() && b > 0.0 => Ok(b),
        _ => Err(AlgoError::InvalidParameter(
            "policy_loss.dro_beta must be a positive value when using DRO".into(),
        )),
    }
}

/// verl `compute_policy_loss_dro`; see the module docs.
pub fn policy_loss_dro<B: Backend>(
    inputs: PolicyLossInputs<B>,
    dro_beta: Option<f64>,
    mode: LossAggMode,
    info: &GlobalBatchInfo,
) -> Result<PolicyLossOutput<B>> {
    inputs.check()?;
    let beta = validate_beta(dro_beta)?;
    let mask = inputs.mask();
    let log_prob = inputs.log_prob.clone();
    let delta = log_prob.clone().sub(inputs.old_log_prob.clone().detach());
    let per_token = log_prob
        .mul(inputs.advantages.clone().detach())
        .sub(delta.clone().powi_scalar(2).mul_scalar(0.5 * beta))
        .neg();
    let per_token = inputs.weighted(per_token);
    let ppo_kl = masked_mean(delta.detach().neg(), mask);
    let pg_loss = agg_loss(per_token.clone(), inputs.response_mask, mode, info)?;
    Ok(PolicyLossOutput::new(
        pg_loss,
        Some(per_token),
        None,
        Some(ppo_kl),
        None,
    ))
}
