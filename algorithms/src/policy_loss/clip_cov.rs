//! Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
//! Language Models"): verl's `compute_policy_loss_clip_cov` (registry `clip_cov`).
//!
//! PPO-clip without the ±20 clamp and without the dual clip, in which a few tokens of high
//! covariance between advantage and log-prob are detached:
//!
//! 1. r = exp(δ), L1 = −A·r, L2 = −A·clamp(r, 1−ε_lo, 1+ε_hi);
//! 2. cov_t = (A_t − MM(A))·(log_prob_t − MM(log_prob));
//! 3. candidates: valid tokens with not \[L2 > L1\] and `clip_cov_lb` < cov < `clip_cov_ub`;
//! 4. clip_num = max(⌊`clip_cov_ratio`·Σm⌋, 1);
//! 5. with K candidates (row-major cand[0..K)), verl draws perm = `torch.randperm(K)` (only when
//!    K > 0) and selects cand\[perm\[j\]\] for j < min(clip_num, K): all candidates when K ≤
//!    clip_num, a random subset otherwise. The permutation comes from the caller here;
//! 6. L = max(L1, L2)·[not selected] (no gradient through the selection: −A·r where L2 ≤ L1
//!    and the token is not selected, else 0), then L·W and `agg_loss` with the mode and global
//!    info.
//!
//! Metrics: `pg_clipfrac` = MM(selected), `ppo_kl` = MM(−δ); no `pg_clipfrac_lower`. The
//! selection is made on the host from the detached values.

use burn::prelude::*;

use super::{ClipConfig, PolicyLossInputs, PolicyLossOutput};
use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::{AlgoError, Result};
use crate::tensor_util::{masked_mean, to_host_f64};

/// Clip-Cov's options (verl `actor.policy_loss.clip_cov_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipCovConfig {
    /// Fraction of the valid tokens to detach at most (`clip_cov_ratio`, default 0.0002; > 0).
    pub ratio: f64,
    /// Exclusive lower bound of a candidate's covariance (`clip_cov_lb`, default 1.0).
    pub lb: f64,
    /// Exclusive upper bound of a candidate's covariance (`clip_cov_ub`, default 5.0).
    pub ub: f64,
}

impl Default for ClipCovConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl ClipCovConfig {
    /// verl's defaults (also those of `update.ppo`'s `clip_cov_*` parameters).
    pub const DEFAULT: ClipCovConfig = ClipCovConfig {
        ratio: 0.0002,
        lb: 1.0,
        ub: 5.0,
    };

    /// verl asserts `clip_cov_ratio > 0` (its message names it `clip_ratio`); the bounds must not
    /// be NaN.
    pub fn validate(&self) -> Result<()> {
        if self.ratio.is_nan() || self.ratio <= 0.0 {
            return Err(AlgoError::InvalidParameter(format!(
                "clip_cov_ratio must be > 0, got {} (verl: clip_ratio should be larger than 0.)",
                self.ratio
            )));
        }
        if self.lb.is_nan() || self.ub.is_nan() {
            return Err(AlgoError::InvalidParameter(
                "clip_cov_lb and clip_cov_ub must be numbers".into(),
            ));
        }
        Ok(())
    }
}

/// verl `compute_policy_loss_clip_cov`; see the module docs. `randperm(k)` must return a
/// permutation of `0..k` (verl's `torch.randperm(k)`); it is called once, only when there are
/// candidates.
pub fn policy_loss_clip_cov<B: Backend>(
    inputs: PolicyLossInputs<B>,
    clip: &ClipConfig,
    config: &ClipCovConfig,
    mode: LossAggMode,
    info: &GlobalBatchInfo,
    randperm: &mut dyn FnMut(usize) -> Vec<usize>,
) -> Result<PolicyLossOutput<B>> {
    inputs.check()?;
    clip.validate_bounds()?;
    config.validate()?;
    let (lo, hi) = clip.low_high();
    let [rows, cols] = inputs.log_prob.dims();
    let device = inputs.log_prob.device();
    let mask = inputs.mask();
    let log_prob = inputs.log_prob.clone();
    let adv = inputs.advantages.clone().detach();

    let delta = log_prob.sub(inputs.old_log_prob.clone().detach());
    let ratio = delta.clone().exp();
    let neg_adv = adv.clone().neg();
    let loss1 = neg_adv.clone().mul(ratio.clone());
    let loss2 = neg_adv.mul(ratio.clamp(1.0 - lo, 1.0 + hi));
    let clipped = loss2.clone().detach().greater(loss1.clone().detach());

    let selected = select(
        &to_host_f64(adv),
        &to_host_f64(inputs.log_prob.clone().detach()),
        &to_host_f64(mask.clone()),
        &to_host_f64(clipped.clone().float()),
        config,
        randperm,
    )?;
    let selected_t =
        Tensor::<B, 2, Bool>::from_data(TensorData::new(selected.clone(), [rows, cols]), &device);
    let per_token = loss1
        .mask_where(clipped, loss2)
        .mask_fill(selected_t.clone(), 0.0);
    let per_token = inputs.weighted(per_token);

    let pg_clipfrac = masked_mean(selected_t.float(), mask.clone());
    let ppo_kl = masked_mean(delta.detach().neg(), mask);
    let pg_loss = agg_loss(per_token.clone(), inputs.response_mask, mode, info)?;
    let mut out = PolicyLossOutput::new(
        pg_loss,
        Some(per_token),
        Some(pg_clipfrac),
        Some(ppo_kl),
        None,
    );
    out.selected = Some(selected);
    Ok(out)
}

/// Steps 2–5 of the module docs on host values (row-major): the selected tokens.
fn select(
    adv: &[f64],
    log_prob: &[f64],
    mask: &[f64],
    clipped: &[f64],
    config: &ClipCovConfig,
    randperm: &mut dyn FnMut(usize) -> Vec<usize>,
) -> Result<Vec<bool>> {
    let valid: f64 = mask.iter().sum();
    let masked_mean = |x: &[f64]| {
        x.iter()
            .zip(mask)
            .filter(|(_, m)| **m != 0.0)
            .map(|(v, m)| v * m)
            .sum::<f64>()
            / (valid + 1e-8)
    };
    let (mean_adv, mean_lp) = (masked_mean(adv), masked_mean(log_prob));
    let candidates: Vec<usize> = (0..mask.len())
        .filter(|&i| {
            let cov = (adv[i] - mean_adv) * (log_prob[i] - mean_lp);
            mask[i] > 0.0 && clipped[i] == 0.0 && cov > config.lb && cov < config.ub
        })
        .collect();
    let clip_num = ((config.ratio * valid).floor() as usize).max(1);
    let mut selected = vec![false; mask.len()];
    let k = candidates.len();
    if k > 0 {
        let perm = randperm(k);
        let mut seen = vec![false; k];
        if perm.len() != k
            || perm
                .iter()
                .any(|&j| j >= k || std::mem::replace(&mut seen[j], true))
        {
            return Err(AlgoError::InvalidParameter(format!(
                "clip_cov: randperm({k}) must return a permutation of 0..{k}, got {perm:?}"
            )));
        }
        for &j in perm.iter().take(clip_num.min(k)) {
            selected[candidates[j]] = true;
        }
    }
    Ok(selected)
}
