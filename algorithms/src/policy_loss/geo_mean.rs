//! GMPO (Geometric-Mean Policy Optimization, arXiv 2507.20673): verl's
//! `compute_policy_loss_geo_mean` (registry `geo_mean`).
//!
//! The clip bounds the **log-ratio**: δcl = clamp(δ, −ε_lo, ε_hi), δ not clamped otherwise.
//! Per token, with s = sign(A), δmin = s·min(s·δ, s·δcl): min(δ, ε_hi) where A > 0 (only the
//! upper bound acts), max(δ, −ε_lo) where A < 0, 0 where A = 0. Per row b, with n_b = Σ_t m:
//!
//! ```text
//! ρ_b = exp(Σ_t δmin·m / (n_b + 1e-8))          the geometric mean of the clipped ratios
//! Ā_b = Σ_t A·m / (n_b + 1e-8)                    the row's mean advantage
//! L_b = −Ā_b·ρ_b · ω_b,   ω_b = exp(Σ_t ln(W + 1e-10)·m / (n_b + 1e-8))   (ω_b = 1 without W)
//! pg_loss = (1/B)·Σ_b L_b
//! ```
//!
//! a plain mean over **all** B rows (an empty row contributes 0 but counts). verl ignores
//! `loss_agg_mode` and the global normalisation here, so neither is a parameter; in a
//! micro-batched update the mini-batch loss is the sum of the micro-batch means, as in verl.
//! Gradient: dpg_loss/dlog_prob_t = −Ā_b·ρ_b·ω_b·m_t/(n_b + 1e-8)·g_t/B, with g_t = 0 where the
//! clamp wins (A > 0 ∧ δ > ε_hi, or A < 0 ∧ δ < −ε_lo) or A = 0, else 1.
//!
//! Metrics: `pg_clipfrac` = MM([δ ≠ δcl]·\[A > 0\]), `pg_clipfrac_lower` = MM([δ ≠ δcl]·\[A < 0\])
//! (every token outside the range, even where the min kept δ), `ppo_kl` = MM(−δ). There is no
//! per-token loss.

use burn::prelude::*;

use super::{ClipConfig, PolicyLossInputs, PolicyLossOutput};
use crate::error::Result;
use crate::tensor_util::{masked_mean, row_masked_sum};

/// verl `compute_policy_loss_geo_mean`; see the module docs (no `loss_agg_mode` and no global
/// info: GMPO averages over the rows of its input).
pub fn policy_loss_geo_mean<B: Backend>(
    inputs: PolicyLossInputs<B>,
    clip: &ClipConfig,
) -> Result<PolicyLossOutput<B>> {
    inputs.check()?;
    clip.validate_bounds()?;
    let (lo, hi) = clip.low_high();
    let mask = inputs.mask();
    let adv = inputs.advantages.clone().detach();

    let delta = inputs
        .log_prob
        .clone()
        .sub(inputs.old_log_prob.clone().detach());
    let d = delta.clone().detach();
    let positive = adv.clone().greater_elem(0.0);
    let negative = adv.clone().lower_elem(0.0);
    let delta_min = delta
        .mask_fill(positive.clone().bool_and(d.clone().greater_elem(hi)), hi)
        .mask_fill(negative.clone().bool_and(d.clone().lower_elem(-lo)), -lo)
        .mask_fill(adv.clone().equal_elem(0.0), 0.0);

    let lengths = mask.clone().sum_dim(1).add_scalar(1e-8); // [B, 1]
    let ratio = row_masked_sum(delta_min, mask.clone())
        .div(lengths.clone())
        .exp();
    let mean_adv = row_masked_sum(adv, mask.clone()).div(lengths.clone());
    let mut seq_loss = mean_adv.neg().mul(ratio); // [B, 1]
    if let Some(w) = &inputs.rollout_is_weights {
        let log_w = w.clone().detach().add_scalar(1e-10).log();
        let seq_w = row_masked_sum(log_w, mask.clone()).div(lengths).exp();
        seq_loss = seq_loss.mul(seq_w);
    }
    let pg_loss = seq_loss.mean();

    let clipped = d.clone().not_equal(d.clamp(-lo, hi));
    let pg_clipfrac = masked_mean(clipped.clone().bool_and(positive).float(), mask.clone());
    let pg_clipfrac_lower = masked_mean(clipped.bool_and(negative).float(), mask.clone());
    let ppo_kl = masked_mean(
        inputs
            .log_prob
            .detach()
            .sub(inputs.old_log_prob.detach())
            .neg(),
        mask,
    );
    Ok(PolicyLossOutput::new(
        pg_loss,
        None,
        Some(pg_clipfrac),
        Some(ppo_kl),
        Some(pg_clipfrac_lower),
    ))
}
