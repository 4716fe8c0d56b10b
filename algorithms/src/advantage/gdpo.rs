//! GDPO: group reward-decoupled normalisation (verl `core_algos.compute_gdpo_outcome_advantage`,
//! registry name `gdpo`; <https://arxiv.org/abs/2601.05242>).
//!
//! Each reward component k (e.g. format and accuracy) is normalised within its uid groups on
//! its own, then the results are summed with weights and whitened over the batch:
//!
//! 1. A_k,b = GRPO(c_k)_b = (c_k,b − mean_g) / (std_g + ε) (unbiased std; singleton: mean 0,
//!    std 1; without std normalisation c_k,b − mean_g), the scalar of
//!    [`compute_grpo_outcome_advantage`](super::AdvantageEstimator::Grpo);
//! 2. A_b = Σ_k w_k·A_k,b, broadcast × mask;
//! 3. `advantages` = masked_whiten(A)·mask over the batch; `returns` = `advantages`.
//!
//! verl places component k's per-sample score on one position of a zero matrix (the last
//! response token by the attention mask, column T−1 for an empty response) and lets GRPO sum the
//! row back, so the position never matters: the component enters as its per-response scores.
//! When verl's function is called without the raw batch (its fallback), the one component is
//! the response score s_b = Σ_t r\[b,t\] with weight 1 (`components = None` here). The batch
//! needs at least 2 valid tokens (whitening).

use super::{
    AdvantageEstimator, HostAdvantages, TokenRewards, check_finite, group_scalar_advantages,
    masked_whiten,
};
use crate::error::{AlgoError, Result};

/// One reward component: its per-response scores (verl `non_tensor_batch[key]`) and weight
/// (verl `algorithm.gdpo_reward_weights[k]`, default 1).
#[derive(Debug, Clone, Copy)]
pub struct GdpoComponent<'a> {
    /// One score per response.
    pub scores: &'a [f64],
    /// Its weight in the sum.
    pub weight: f64,
}

/// verl `compute_gdpo_outcome_advantage`: `components` = `None` is verl's fallback (the summed
/// token-level rewards as the only component); `epsilon` and `norm_adv_by_std_in_grpo` are the
/// GRPO step's (verl's trainer never passes them: 1e-6 and true).
pub fn compute_gdpo_outcome_advantage<S: AsRef<str>>(
    batch: TokenRewards<'_>,
    index: &[S],
    components: Option<&[GdpoComponent<'_>]>,
    epsilon: f64,
    norm_adv_by_std_in_grpo: bool,
) -> Result<HostAdvantages> {
    let fallback = batch.scores();
    let fallback = [GdpoComponent {
        scores: &fallback,
        weight: 1.0,
    }];
    let components = components.unwrap_or(&fallback);
    if components.is_empty() {
        return Err(AlgoError::InvalidParameter(
            "GDPO needs at least one reward component (verl: algorithm.gdpo_reward_keys)".into(),
        ));
    }
    let grpo = AdvantageEstimator::Grpo {
        norm_by_std: norm_adv_by_std_in_grpo,
        epsilon,
    };
    let mut sum = vec![0.0; batch.rows];
    for c in components {
        check_finite("GDPO component weight", &[c.weight])?;
        let a = group_scalar_advantages(c.scores, index, grpo)?;
        for (s, a) in sum.iter_mut().zip(a) {
            *s += c.weight * a;
        }
    }
    let summed = batch.broadcast(&sum).advantages;
    let advantages: Vec<f64> = masked_whiten(&summed, batch.response_mask)?
        .iter()
        .zip(batch.response_mask)
        .map(|(a, m)| a * m)
        .collect();
    Ok(HostAdvantages {
        rows: batch.rows,
        cols: batch.cols,
        returns: advantages.clone(),
        advantages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_normalised_apart_then_whitened() {
        // One group of 3; format is constant (contributes 0), accuracy decides.
        let m = [1.0; 6];
        let r = [0.0; 6];
        let batch = TokenRewards::new(&r, &m, 3, 2).unwrap();
        let format = [1.0, 1.0, 1.0];
        let acc = [1.0, 0.0, 0.0];
        let comps = [
            GdpoComponent {
                scores: &format,
                weight: 1.0,
            },
            GdpoComponent {
                scores: &acc,
                weight: 0.5,
            },
        ];
        let out =
            compute_gdpo_outcome_advantage(batch, &["a"; 3], Some(&comps), 1e-6, true).unwrap();
        // Whitened: mean 0, so the winner is positive and the two others equal and negative.
        assert!(out.advantages[0] > 0.0 && out.advantages[2] < 0.0);
        assert_eq!(out.advantages[2], out.advantages[4]);
        assert!(out.advantages.iter().sum::<f64>().abs() < 1e-9);
        assert_eq!(out.returns, out.advantages);
        let e = compute_gdpo_outcome_advantage(batch, &["a"; 3], Some(&[]), 1e-6, true);
        assert!(e.is_err());
    }
}
