//! OPO: on-policy RL with the optimal (length-weighted) baseline (verl
//! `core_algos.compute_opo_outcome_advantage`, registry name `opo`;
//! <https://arxiv.org/pdf/2505.23585>).
//!
//! Per uid group of at least 2 responses the baseline is the length-weighted mean score
//! b_g = Σ n_b·s_b / Σ n_b, with n_b = Σ_t m\[b,t\] and s_b = Σ_t r\[b,t\]; a singleton's baseline
//! is 0. A_b = s_b − b_g, broadcast × mask; `returns` = `advantages`. verl's function takes an
//! `epsilon` that it never uses.
//!
//! A group of ≥ 2 responses that are all empty (Σ n_b = 0) has no baseline (verl: 0/0 = NaN);
//! that is an error here.

use super::{HostAdvantages, TokenRewards, group_by_uid};
use crate::error::{AlgoError, Result};

/// verl `compute_opo_outcome_advantage` (see the module).
pub fn compute_opo_outcome_advantage<S: AsRef<str>>(
    batch: TokenRewards<'_>,
    index: &[S],
) -> Result<HostAdvantages> {
    let scores = batch.scores();
    let lengths = batch.lengths();
    let mut per_response = vec![0.0; batch.rows];
    for (uid, rows, _) in group_by_uid(&scores, index)? {
        let baseline = if rows.len() == 1 {
            0.0
        } else {
            let total: f64 = rows.iter().map(|&r| lengths[r]).sum();
            if total == 0.0 {
                return Err(AlgoError::Empty(format!(
                    "OPO: the {} responses of group {uid:?} have no valid tokens, so the \
                     length-weighted baseline is 0/0",
                    rows.len()
                )));
            }
            rows.iter().map(|&r| lengths[r] * scores[r]).sum::<f64>() / total
        };
        for r in rows {
            per_response[r] = scores[r] - baseline;
        }
    }
    Ok(batch.broadcast(&per_response))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_weighted_baseline() {
        // Group a: lengths 3 and 1, scores 1 and 0 → baseline 0.75; b is a singleton.
        let r = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5];
        let m = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0];
        let batch = TokenRewards::new(&r, &m, 3, 3).unwrap();
        let out = compute_opo_outcome_advantage(batch, &["a", "a", "b"]).unwrap();
        assert_eq!(
            out.advantages,
            vec![0.25, 0.25, 0.25, -0.75, 0.0, 0.0, 0.5, 0.5, 0.0]
        );
        let empty = TokenRewards::new(&r[..6], &[0.0; 6], 2, 3).unwrap();
        assert!(compute_opo_outcome_advantage(empty, &["a", "a"]).is_err());
    }
}
