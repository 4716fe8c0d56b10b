//! The optimal token baseline (OTB): a per-position baseline weighted by the path variance of
//! the old policy (verl `core_algos.compute_optimal_token_baseline_advantage`, registry name
//! `optimal_token_baseline`, and its multi-turn twin
//! `compute_multi_turn_optimal_token_baseline_advantage`, registry name
//! `tir_optimal_token_baseline`).
//!
//! Shared quantities, with π_t = exp(old_log_probs_t) and S_t = Σ_v π_v² (`sum_pi_squared`, the
//! old policy's squared probabilities summed over the vocabulary at position t):
//!
//! * G_t = Σ_{t' ≥ t} r_{t'}·m_{t'}, the reward-to-go of the masked rewards (= `returns`);
//! * w_t = 1 − 2π_t + S_t (‖∇ log π‖² proxy), times ρ_t² when rollout IS weights ρ are given;
//! * W_t = Σ_{t' ≤ t} w_{t'}·m_{t'}, the cumulative path variance.
//!
//! **`optimal_token_baseline`**: for a uid group of N ≥ 2 responses, at each absolute position
//! t, B_t = Σ_i G_{i,t}·W_{i,t}·m_{i,t} / (Σ_i W_{i,t}·m_{i,t} + ε), the same for every member;
//! a singleton gets B = 0. With `handle_zero_tail`, when exactly one member has the largest
//! length L1 (lengths n_i = Σ_t m_{i,t}, empty rows counted as 0) and L1 > L2 (the second
//! largest), that member's baseline is 0 at positions t ≥ L2. `advantages` = (G − B)·m.
//!
//! **`tir_optimal_token_baseline`** (multi-turn responses whose masks have holes): each row's
//! valid tokens are first compacted, the k-th valid token taking W and G of its position; rows
//! without a valid token join no group; the baseline is formed per compacted index k,
//! b_k = Σ_i G'_{i,k}·W'_{i,k} / (Σ_i W'_{i,k} + ε) over the members that reach k (entries
//! beyond a row's length are 0), with zero-tail handling on the compacted lengths; G' − b is
//! scattered back to the valid positions and masked positions get 0. With prefix masks both
//! estimators agree.
//!
//! verl's trainer passes neither `handle_zero_tail` nor `epsilon`: they keep the defaults true
//! and 1e-8.

use std::collections::HashMap;

use super::{HostAdvantages, TokenRewards, check_finite, group_by_uid};
use crate::error::Result;

/// What the old policy contributes to the path variance, each `[rows, cols]` like the batch.
#[derive(Debug, Clone, Copy)]
pub struct PathVariance<'a> {
    /// log π_old of the response tokens (verl `old_log_probs`).
    pub old_log_probs: &'a [f64],
    /// Σ_v π_old,v² at every response position (verl `sum_pi_squared`).
    pub sum_pi_squared: &'a [f64],
    /// Rollout importance-sampling weights ρ (verl `rollout_is_weights`), when used.
    pub rollout_is_weights: Option<&'a [f64]>,
}

/// verl's defaults: `handle_zero_tail = true`, `epsilon = 1e-8`.
pub const OTB_EPSILON: f64 = 1e-8;

/// G (reward-to-go) and the cumulative path variance W, both `[rows, cols]`.
fn returns_and_path_variance(
    batch: &TokenRewards<'_>,
    policy: &PathVariance<'_>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    batch.check_matrix("old_log_probs", policy.old_log_probs)?;
    batch.check_matrix("sum_pi_squared", policy.sum_pi_squared)?;
    check_finite("old log-prob", policy.old_log_probs)?;
    check_finite("sum_pi_squared", policy.sum_pi_squared)?;
    if let Some(w) = policy.rollout_is_weights {
        batch.check_matrix("rollout_is_weights", w)?;
        check_finite("rollout IS weight", w)?;
    }
    let mut cumulative = vec![0.0; batch.rows * batch.cols];
    for b in 0..batch.rows {
        let mut running = 0.0;
        for t in 0..batch.cols {
            let i = b * batch.cols + t;
            let mut w = 1.0 - 2.0 * policy.old_log_probs[i].exp() + policy.sum_pi_squared[i];
            if let Some(rho) = policy.rollout_is_weights {
                w *= rho[i] * rho[i];
            }
            running += w * batch.response_mask[i];
            cumulative[i] = running;
        }
    }
    Ok((batch.reward_to_go(), cumulative))
}

/// With `handle_zero_tail`: the member whose tail is left without a baseline and where that tail
/// starts — the only member of maximal length L1 when L1 > L2 (the second largest length).
fn zero_tail(lengths: &[usize]) -> Option<(usize, usize)> {
    let max = *lengths.iter().max()?;
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable();
    let second = sorted[sorted.len().checked_sub(2)?];
    let mut longest = lengths.iter().enumerate().filter(|(_, l)| **l == max);
    let (member, _) = longest.next()?;
    (longest.next().is_none() && max > second).then_some((member, second))
}

/// verl `compute_optimal_token_baseline_advantage` (see the module).
pub fn compute_optimal_token_baseline_advantage<S: AsRef<str>>(
    batch: TokenRewards<'_>,
    index: &[S],
    policy: PathVariance<'_>,
    handle_zero_tail: bool,
    epsilon: f64,
) -> Result<HostAdvantages> {
    let (rows, cols) = (batch.rows, batch.cols);
    let m = batch.response_mask;
    let groups = group_by_uid(&batch.scores(), index)?;
    let (returns, w) = returns_and_path_variance(&batch, &policy)?;
    let mut baselines = vec![0.0; rows * cols];
    for (_, members, _) in groups.iter().filter(|(_, members, _)| members.len() > 1) {
        for t in 0..cols {
            let (mut num, mut den) = (0.0, 0.0);
            for &i in members {
                let k = i * cols + t;
                num += returns[k] * w[k] * m[k];
                den += w[k] * m[k];
            }
            let b = num / (den + epsilon);
            for &i in members {
                baselines[i * cols + t] = b;
            }
        }
        if handle_zero_tail {
            // verl takes the valid-token count as the start column, also for masks with holes.
            let lengths: Vec<usize> = members
                .iter()
                .map(|&i| m[i * cols..(i + 1) * cols].iter().sum::<f64>() as usize)
                .collect();
            if let Some((member, start)) = zero_tail(&lengths) {
                let i = members[member];
                baselines[i * cols + start.min(cols)..(i + 1) * cols].fill(0.0);
            }
        }
    }
    let advantages = (0..rows * cols)
        .map(|k| (returns[k] - baselines[k]) * m[k])
        .collect();
    Ok(HostAdvantages {
        rows,
        cols,
        advantages,
        returns,
    })
}

/// verl `compute_multi_turn_optimal_token_baseline_advantage` (registry name
/// `tir_optimal_token_baseline`; see the module).
pub fn compute_multi_turn_optimal_token_baseline_advantage<S: AsRef<str>>(
    batch: TokenRewards<'_>,
    index: &[S],
    policy: PathVariance<'_>,
    handle_zero_tail: bool,
    epsilon: f64,
) -> Result<HostAdvantages> {
    let (rows, cols) = (batch.rows, batch.cols);
    let m = batch.response_mask;
    // Scores are only checked here (finite, one uid per row); grouping skips empty rows.
    group_by_uid(&batch.scores(), index)?;
    let (returns, w) = returns_and_path_variance(&batch, &policy)?;
    // The valid positions of each row, in order: compacted index k ↦ column.
    let valid: Vec<Vec<usize>> = (0..rows)
        .map(|i| (0..cols).filter(|&t| m[i * cols + t] != 0.0).collect())
        .collect();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut by_uid: HashMap<&str, usize> = HashMap::new();
    for i in (0..rows).filter(|&i| !valid[i].is_empty()) {
        let g = *by_uid.entry(index[i].as_ref()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    let mut advantages = vec![0.0; rows * cols];
    for members in &groups {
        let longest = members.iter().map(|&i| valid[i].len()).max().unwrap_or(0);
        let mut baseline = vec![vec![0.0; longest]; members.len()];
        if members.len() > 1 {
            for k in 0..longest {
                let (mut num, mut den) = (0.0, 0.0);
                for &i in members {
                    if let Some(&t) = valid[i].get(k) {
                        num += returns[i * cols + t] * w[i * cols + t];
                        den += w[i * cols + t];
                    }
                }
                let b = num / (den + epsilon);
                for row in baseline.iter_mut() {
                    row[k] = b;
                }
            }
            if handle_zero_tail {
                let lengths: Vec<usize> = members.iter().map(|&i| valid[i].len()).collect();
                if let Some((member, start)) = zero_tail(&lengths) {
                    baseline[member][start..].fill(0.0);
                }
            }
        }
        for (j, &i) in members.iter().enumerate() {
            for (k, &t) in valid[i].iter().enumerate() {
                let g = returns[i * cols + t];
                advantages[i * cols + t] = (g - baseline[j][k]) * m[i * cols + t];
            }
        }
    }
    Ok(HostAdvantages {
        rows,
        cols,
        advantages,
        returns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// π = 1/2 everywhere and S = 1/2: w = 1 − 1 + 1/2 = 1/2, W_t = (t + 1)/2.
    fn flat_policy(n: usize) -> (Vec<f64>, Vec<f64>) {
        (vec![0.5f64.ln(); n], vec![0.5; n])
    }

    #[test]
    fn per_position_baseline_and_zero_tail() {
        // One group: row 0 of length 3 with reward 1, row 1 of length 1 with reward 0.
        let r = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        let m = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0];
        let batch = TokenRewards::new(&r, &m, 2, 3).unwrap();
        let (lp, s2) = flat_policy(6);
        let policy = PathVariance {
            old_log_probs: &lp,
            sum_pi_squared: &s2,
            rollout_is_weights: None,
        };
        let out = compute_optimal_token_baseline_advantage(batch, &["a", "a"], policy, false, 0.0)
            .unwrap();
        // t = 0: both rows valid with W = 1/2, G = (1, 0): B = 1/2.
        assert!((out.advantages[0] - 0.5).abs() < 1e-12);
        assert!((out.advantages[3] + 0.5).abs() < 1e-12);
        // t ≥ 1: only row 0 is valid, so B = G and A = 0 (up to ε = 0 here).
        assert!(out.advantages[1].abs() < 1e-12 && out.advantages[2].abs() < 1e-12);
        // Zero tail: row 0 is the only longest (3 > 1), so from t = 1 on it keeps A = G.
        let out = compute_optimal_token_baseline_advantage(batch, &["a", "a"], policy, true, 0.0)
            .unwrap();
        assert_eq!(&out.advantages[1..3], &[1.0, 1.0]);
        assert_eq!(out.returns, vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
        // With a prefix mask the multi-turn variant agrees.
        let tir = compute_multi_turn_optimal_token_baseline_advantage(
            batch,
            &["a", "a"],
            policy,
            true,
            0.0,
        )
        .unwrap();
        assert_eq!(tir.advantages, out.advantages);
    }

    #[test]
    fn multi_turn_compacts_holes() {
        // Row 0 has a hole at t = 1; compacted, both rows have 2 tokens at k = 0, 1.
        let r = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        let m = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0];
        let batch = TokenRewards::new(&r, &m, 2, 3).unwrap();
        let (lp, s2) = flat_policy(6);
        let policy = PathVariance {
            old_log_probs: &lp,
            sum_pi_squared: &s2,
            rollout_is_weights: None,
        };
        let out = compute_multi_turn_optimal_token_baseline_advantage(
            batch,
            &["a", "a"],
            policy,
            true,
            0.0,
        )
        .unwrap();
        // Equal W at each k and G = (1, 0): b = 1/2 everywhere; the hole gets 0.
        assert_eq!(out.advantages, vec![0.5, 0.0, 0.5, -0.5, -0.5, 0.0]);
    }
}
