//! KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
//! Language Models"): verl's `compute_policy_loss_kl_cov` (registry `kl_cov`).
//!
//! The unclipped surrogate with a KL penalty on the tokens of largest covariance between
//! advantage and log-prob. No ±20 clamp, no clip:
//!
//! 1. the valid tokens in row-major order, a = A and l = log_prob there, N of them;
//!    cov_j = (a_j − mean(a))·(l_j − mean(l)) (plain means);
//! 2. the k = max(1, ⌊N·`kl_cov_ratio`⌋) tokens of largest cov are selected (none when N = 0);
//! 3. L = −A·r + κ·|δ|·\[selected\], r = exp(δ), κ = `ppo_kl_coef`, so dL/dlog_prob =
//!    −A·r + κ·sign(δ)·\[selected\] (sign(0) = 0); then L·W and `agg_loss` with the mode and
//!    global info.
//!
//! κ defaults to 0.1 (verl's config default; the function's docstring says 1, which is only its
//! fallback for an explicit null). Metric: `ppo_kl` = MM(|δ|), an absolute value unlike every
//! other loss. The selection is made on the host from the detached values.

use burn::prelude::*;

use super::{PolicyLossInputs, PolicyLossOutput};
use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::{AlgoError, Result};
use crate::tensor_util::{masked_mean, to_host_f64};

/// KL-Cov's options (verl `actor.policy_loss.kl_cov_ratio`, `ppo_kl_coef`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KlCovConfig {
    /// Fraction of the valid tokens that get the KL penalty (`kl_cov_ratio`, default 0.0002;
    /// > 0).
    pub ratio: f64,
    /// The penalty's coefficient κ (`ppo_kl_coef`, default 0.1).
    pub coef: f64,
}

impl Default for KlCovConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl KlCovConfig {
    /// verl's defaults (also those of `update.ppo`'s `kl_cov_ratio` and `ppo_kl_coef`).
    pub const DEFAULT: KlCovConfig = KlCovConfig {
        ratio: 0.0002,
        coef: 0.1,
    };

    /// verl asserts `kl_cov_ratio > 0` (same message); a ratio above 1 fails later, where it
    /// asks for more tokens than there are (see [`policy_loss_kl_cov`]).
    pub fn validate(&self) -> Result<()> {
        if self.ratio.is_nan() || self.ratio <= 0.0 {
            return Err(AlgoError::InvalidParameter(format!(
                "kl_cov_ratio should be larger than 0. (got {})",
                self.ratio
            )));
        }
        if !self.coef.is_finite() {
            return Err(AlgoError::InvalidParameter(format!(
                "ppo_kl_coef must be finite, got {}",
                self.coef
            )));
        }
        Ok(())
    }
}

/// verl `compute_policy_loss_kl_cov`; see the module docs. Errors when k exceeds the number of
/// valid tokens (`kl_cov_ratio` > 1; verl's `topk` raises there).
pub fn policy_loss_kl_cov<B: Backend>(
    inputs: PolicyLossInputs<B>,
    config: &KlCovConfig,
    mode: LossAggMode,
    info: &GlobalBatchInfo,
) -> Result<PolicyLossOutput<B>> {
    inputs.check()?;
    config.validate()?;
    let [rows, cols] = inputs.log_prob.dims();
    let device = inputs.log_prob.device();
    let mask = inputs.mask();
    let adv = inputs.advantages.clone().detach();

    let delta = inputs
        .log_prob
        .clone()
        .sub(inputs.old_log_prob.clone().detach());
    let abs_kl = delta.clone().abs();
    let loss1 = adv.clone().neg().mul(delta.exp());
    let loss_kl = loss1.clone().add(abs_kl.clone().mul_scalar(config.coef));

    let selected = select(
        &to_host_f64(adv),
        &to_host_f64(inputs.log_prob.clone().detach()),
        &to_host_f64(mask.clone()),
        config.ratio,
    )?;
    let selected_t =
        Tensor::<B, 2, Bool>::from_data(TensorData::new(selected.clone(), [rows, cols]), &device);
    let per_token = inputs.weighted(loss1.mask_where(selected_t, loss_kl));

    let ppo_kl = masked_mean(abs_kl.detach(), mask);
    let pg_loss = agg_loss(per_token.clone(), inputs.response_mask, mode, info)?;
    let mut out = PolicyLossOutput::new(pg_loss, Some(per_token), None, Some(ppo_kl), None);
    out.selected = Some(selected);
    Ok(out)
}

/// Steps 1–2 of the module docs on host values (row-major): the selected tokens.
fn select(adv: &[f64], log_prob: &[f64], mask: &[f64], ratio: f64) -> Result<Vec<bool>> {
    let valid: Vec<usize> = (0..mask.len()).filter(|&i| mask[i] > 0.0).collect();
    let mut selected = vec![false; mask.len()];
    if valid.is_empty() {
        return Ok(selected);
    }
    let n = valid.len() as f64;
    let mean_adv = valid.iter().map(|&i| adv[i]).sum::<f64>() / n;
    let mean_lp = valid.iter().map(|&i| log_prob[i]).sum::<f64>() / n;
    let k = ((n * ratio).floor() as usize).max(1);
    if k > valid.len() {
        return Err(AlgoError::InvalidParameter(format!(
            "kl_cov: kl_cov_ratio {ratio} asks for the top {k} of {} valid tokens",
            valid.len()
        )));
    }
    let mut by_cov: Vec<(f64, usize)> = valid
        .iter()
        .map(|&i| ((adv[i] - mean_adv) * (log_prob[i] - mean_lp), i))
        .collect();
    by_cov.sort_by(|a, b| b.0.total_cmp(&a.0));
    for &(_, i) in &by_cov[..k] {
        selected[i] = true;
    }
    Ok(selected)
}
