//! GAE: generalised advantage estimation from per-token values (verl
//! `core_algos.compute_gae_advantage_return`, registry name `gae`; Schulman et al. 2015,
//! <https://arxiv.org/abs/1506.02438>).
//!
//! Per row, right to left, with carried next value nv = 0 and running advantage lg = 0:
//!
//! * δ_t = r_t + γ·nv − V_t and lg' = δ_t + γλ·lg;
//! * nv ← V_t·m_t + (1 − m_t)·nv and lg ← lg'·m_t + (1 − m_t)·lg, so a masked token (padding, or
//!   a tool observation inside a multi-turn response) carries both through unchanged;
//! * the raw advantage at t is lg after the update (at a masked token: the carried value, not 0).
//!
//! `returns` = raw advantage + V (at every position), and `advantages` = masked_whiten(raw
//! advantage) over the batch (see the parent module), **not** multiplied by the mask: verl leaves
//! (x − μ)/σ at padding. The batch needs at least 2 valid tokens.
//!
//! The critic that produces `values` is not part of this crate; this is the estimator only.

use super::{HostAdvantages, TokenRewards, check_finite, masked_whiten};
use crate::error::Result;

/// verl `compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam)`:
/// `values` is `[rows, cols]` like the rewards; γ the discount, λ the GAE λ (see the module).
pub fn compute_gae_advantage_return(
    batch: TokenRewards<'_>,
    values: &[f64],
    gamma: f64,
    lam: f64,
) -> Result<HostAdvantages> {
    batch.check_matrix("values", values)?;
    check_finite("value", values)?;
    check_finite("token-level reward", batch.token_level_rewards)?;
    let (rows, cols) = (batch.rows, batch.cols);
    let (r, m) = (batch.token_level_rewards, batch.response_mask);
    let mut raw = vec![0.0; rows * cols];
    for b in 0..rows {
        let (mut next_value, mut last_gae) = (0.0, 0.0);
        for t in (0..cols).rev() {
            let i = b * cols + t;
            let delta = r[i] + gamma * next_value - values[i];
            let gae = delta + gamma * lam * last_gae;
            next_value = values[i] * m[i] + (1.0 - m[i]) * next_value;
            last_gae = gae * m[i] + (1.0 - m[i]) * last_gae;
            raw[i] = last_gae;
        }
    }
    let returns = raw.iter().zip(values).map(|(a, v)| a + v).collect();
    Ok(HostAdvantages {
        rows,
        cols,
        advantages: masked_whiten(&raw, m)?,
        returns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_step_td_and_holes_carry_through() {
        // Row 0: tokens 0 and 2 valid, token 1 a hole; row 1: one valid token then padding.
        let r = [0.0, 5.0, 1.0, 0.0, 0.0, 2.0];
        let m = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0];
        let v = [0.5, 9.0, 0.25, 0.1, 7.0, 3.0];
        let batch = TokenRewards::new(&r, &m, 2, 3).unwrap();
        let out = compute_gae_advantage_return(batch, &v, 0.5, 1.0).unwrap();
        // t = 2: δ = 1 − 0.25 = 0.75. t = 1 (hole): carried 0.75. t = 0: δ = 0 + 0.5·0.25 − 0.5,
        // lg = δ + 0.5·0.75.
        let lg0 = (0.5 * 0.25 - 0.5) + 0.5 * 0.75;
        assert_eq!(out.returns[0], lg0 + 0.5);
        assert_eq!(out.returns[1], 0.75 + 9.0);
        assert_eq!(out.returns[2], 0.75 + 0.25);
        // Row 1: padding carries 0; the valid token's δ = 0 − 0.1.
        assert_eq!(out.returns[3], -0.1 + 0.1);
        assert_eq!(out.returns[5], 3.0);
        // Whitened over the three valid tokens, padding not zeroed.
        let valid = [out.advantages[0], out.advantages[2], out.advantages[3]];
        assert!(valid.iter().sum::<f64>().abs() < 1e-6);
        assert!(out.advantages[5] != 0.0);
    }
}
