//! GPG (Group Policy Gradient, arXiv 2504.02546): verl's `compute_policy_loss_gpg` (registry
//! `gpg`).
//!
//! The plain policy gradient without ratio or clip: L = −log_prob·A (so dL/dlog_prob = −A;
//! `old_log_prob` is not used), L·W, `agg_loss` with the mode and global info. It reports no
//! metrics (verl returns an empty dict).

use burn::prelude::*;

use super::{PolicyLossInputs, PolicyLossOutput};
use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::Result;

/// verl `compute_policy_loss_gpg`; see the module docs.
pub fn policy_loss_gpg<B: Backend>(
    inputs: PolicyLossInputs<B>,
    mode: LossAggMode,
    info: &GlobalBatchInfo,
) -> Result<PolicyLossOutput<B>> {
    inputs.check()?;
    let per_token = inputs
        .log_prob
        .clone()
        .neg()
        .mul(inputs.advantages.clone().detach());
    let per_token = inputs.weighted(per_token);
    let pg_loss = agg_loss(per_token.clone(), inputs.response_mask, mode, info)?;
    Ok(PolicyLossOutput::new(
        pg_loss,
        Some(per_token),
        None,
        None,
        None,
    ))
}
