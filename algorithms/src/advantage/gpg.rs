//! GPG: group policy gradient (verl `core_algos.compute_gpg_outcome_advantage`, registry name
//! `gpg`).
//!
//! With the scores s_b = Σ_t r\[b,t\] and B responses:
//!
//! * α = B / max(#{b : s_b ≠ 0}, 1), the inverse share of responses with a non-zero score;
//! * A_b = α·(s_b − mean_g) / f_norm per uid group (a singleton's mean is 0), no std
//!   normalisation; broadcast × mask, `returns` = `advantages`.
//!
//! verl's function also takes `alpha` and `epsilon` arguments; it overwrites `alpha` with the
//! value above and never uses `epsilon`. `f_norm` defaults to 1 (verl's trainer never passes it).

use super::{HostAdvantages, TokenRewards, group_by_uid};
use crate::error::{AlgoError, Result};

/// verl `compute_gpg_outcome_advantage` with `f_norm` (see the module).
pub fn compute_gpg_outcome_advantage<S: AsRef<str>>(
    batch: TokenRewards<'_>,
    index: &[S],
    f_norm: f64,
) -> Result<HostAdvantages> {
    if !f_norm.is_finite() || f_norm == 0.0 {
        return Err(AlgoError::InvalidParameter(format!(
            "GPG f_norm must be finite and non-zero, got {f_norm}"
        )));
    }
    let scores = batch.scores();
    let nonzero = scores.iter().filter(|&&s| s != 0.0).count().max(1);
    let alpha = batch.rows as f64 / nonzero as f64;
    let mut per_response = vec![0.0; batch.rows];
    for (_, rows, stats) in group_by_uid(&scores, index)? {
        let mean = if rows.len() > 1 { stats.mean } else { 0.0 };
        for r in rows {
            per_response[r] = alpha * (scores[r] - mean) / f_norm;
        }
    }
    Ok(batch.broadcast(&per_response))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_is_the_inverse_share_of_nonzero_scores() {
        // Scores 1, 0, 0, 0 in one group: α = 4, mean 0.25.
        let r = [1.0, 0.0, 0.0, 0.0];
        let m = [1.0; 4];
        let batch = TokenRewards::new(&r, &m, 4, 1).unwrap();
        let out = compute_gpg_outcome_advantage(batch, &["a"; 4], 2.0).unwrap();
        assert_eq!(out.advantages, vec![1.5, -0.5, -0.5, -0.5]);
        assert!(compute_gpg_outcome_advantage(batch, &["a"; 4], 0.0).is_err());
    }
}
