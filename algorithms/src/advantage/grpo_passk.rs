//! Pass@k GRPO (verl `core_algos.compute_grpo_passk_outcome_advantage`, registry name
//! `grpo_passk`; <https://arxiv.org/abs/2503.19595>).
//!
//! Per uid group (at least 2 responses, else verl's `ValueError`), with the scores
//! s_b = Σ_t r\[b,t\] and the two largest r1 ≥ r2: the response holding r1 gets r1 − r2, divided
//! by (unbiased std of the group's scores + ε) when `norm_adv_by_std_in_grpo`; every other
//! response gets 0. When r1 = r2 every advantage is 0, so ties need no rule. Broadcast × mask;
//! `returns` = `advantages`.
//!
//! verl reads the flag from `config.norm_adv_by_std_in_grpo` (the algorithm configuration) and
//! ignores the function's own argument of that name; the caller here passes the configured flag.

use super::{HostAdvantages, TokenRewards, group_by_uid};
use crate::error::{AlgoError, Result};

/// verl `compute_grpo_passk_outcome_advantage` with `config.norm_adv_by_std_in_grpo` =
/// `norm_adv_by_std_in_grpo` (see the module).
pub fn compute_grpo_passk_outcome_advantage<S: AsRef<str>>(
    batch: TokenRewards<'_>,
    index: &[S],
    epsilon: f64,
    norm_adv_by_std_in_grpo: bool,
) -> Result<HostAdvantages> {
    let scores = batch.scores();
    let mut per_response = vec![0.0; batch.rows];
    for (uid, rows, stats) in group_by_uid(&scores, index)? {
        if rows.len() < 2 {
            return Err(AlgoError::PassKGroupTooSmall {
                group: uid,
                n: rows.len(),
            });
        }
        // The first row holding the maximum, and the largest score among the others.
        let best = rows
            .iter()
            .copied()
            .reduce(|a, b| if scores[b] > scores[a] { b } else { a })
            .expect("a group has members");
        let second = rows
            .iter()
            .filter(|&&r| r != best)
            .map(|&r| scores[r])
            .fold(f64::NEG_INFINITY, f64::max);
        let gap = scores[best] - second;
        per_response[best] = if norm_adv_by_std_in_grpo {
            gap / (stats.std + epsilon)
        } else {
            gap
        };
    }
    Ok(batch.broadcast(&per_response))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_best_of_each_group_moves() {
        let r = [0.0, 1.0, 0.0, 0.25, 0.0, 0.5, 0.0, 0.5];
        let m = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0];
        let batch = TokenRewards::new(&r, &m, 4, 2).unwrap();
        let uids = ["a", "a", "b", "b"];
        let out = compute_grpo_passk_outcome_advantage(batch, &uids, 1e-6, false).unwrap();
        assert_eq!(
            out.advantages,
            vec![0.75, 0.75, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        );
        let e = compute_grpo_passk_outcome_advantage(batch, &["a", "a", "a", "z"], 1e-6, true)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Pass@k requires at least 2 samples per group. Got 1 for group z."
        );
    }
}
