//! ReMax (verl `core_algos.compute_remax_outcome_advantage`, registry name `remax`;
//! <https://arxiv.org/abs/2310.10505>): REINFORCE with the greedy response's reward as the
//! baseline.
//!
//! `returns` = G_t = Σ_{t' ≥ t} r_{t'}·m_{t'} (the reward-to-go of the masked rewards, at every
//! position) and `advantages` = G_t − b_b·m_t, where b_b (verl `reward_baselines`) is the reward
//! of the greedy response to the same prompt. No whitening, no grouping.

use super::{HostAdvantages, TokenRewards, check_finite};
use crate::error::{AlgoError, Result};

/// verl `compute_remax_outcome_advantage`: `reward_baselines` holds one value per response.
pub fn compute_remax_outcome_advantage(
    batch: TokenRewards<'_>,
    reward_baselines: &[f64],
) -> Result<HostAdvantages> {
    if reward_baselines.len() != batch.rows {
        return Err(AlgoError::ShapeMismatch {
            what: "reward_baselines vs batch".into(),
            expected: vec![batch.rows],
            got: vec![reward_baselines.len()],
        });
    }
    check_finite("reward baseline", reward_baselines)?;
    check_finite("token-level reward", batch.token_level_rewards)?;
    let returns = batch.reward_to_go();
    let advantages = returns
        .iter()
        .zip(batch.response_mask)
        .enumerate()
        .map(|(i, (g, m))| g - reward_baselines[i / batch.cols] * m)
        .collect();
    Ok(HostAdvantages {
        rows: batch.rows,
        cols: batch.cols,
        advantages,
        returns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_to_go_minus_the_greedy_reward() {
        let r = [0.0, 1.0, 0.0, 0.5, 0.0, 0.0];
        let m = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0];
        let batch = TokenRewards::new(&r, &m, 2, 3).unwrap();
        let out = compute_remax_outcome_advantage(batch, &[0.25, 1.0]).unwrap();
        assert_eq!(out.returns, vec![1.0, 1.0, 0.0, 0.5, 0.0, 0.0]);
        assert_eq!(out.advantages, vec![0.75, 0.75, 0.0, -0.5, 0.0, 0.0]);
        assert!(compute_remax_outcome_advantage(batch, &[0.0]).is_err());
    }
}
