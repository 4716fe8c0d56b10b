//! What the `advantage.*` kinds share: turning a [`ScoreBatch`] into an [`AdvantageBatch`] with
//! one of `flowrl_algorithms`' outcome estimators, and verl's advantage metrics.
//!
//! Ports of every advantage kind: `scores: Scores` (which carries its rollouts: group uids and
//! response mask) and an optional `rollouts: Rollouts` (when wired it must be the batch that
//! was scored) → `advantages: Advantages`.
//!
//! Token-level rewards are built as verl's reward manager does: each response's score sits on
//! its last response token (on the last column for an empty response, verl's index −1); the
//! estimators sum them back per response, so only REINFORCE++ sees the position.
//!
//! Metrics (verl's names, over valid tokens): `critic/advantages/mean|max|min`,
//! `critic/returns/mean|max|min`.

use std::sync::Arc;

use anyhow::{Result, ensure};
use flowrl_algorithms::{AdvantageEstimator, compute_advantages_host};
use flowrl_engine::{Inputs, Node, Outputs, PortSpec, PortType, StepContext};

use crate::values::{AdvantageBatch, RolloutBatch, ScoreBatch, TokenMatrix, port_types};

/// `scores: Scores`, optional `rollouts: Rollouts`.
pub(crate) fn advantage_inputs() -> Vec<PortSpec> {
    vec![
        PortSpec::new("scores", PortType::new(port_types::SCORES))
            .doc("per-response scores (they carry their rollouts)"),
        PortSpec::new("rollouts", PortType::new(port_types::ROLLOUTS))
            .optional()
            .doc("the scored rollouts (checked against the scores' own)"),
    ]
}

/// `advantages: Advantages`.
pub(crate) fn advantage_outputs() -> Vec<PortSpec> {
    vec![
        PortSpec::new("advantages", PortType::new(port_types::ADVANTAGES))
            .doc("per-token advantages and returns [B, T]"),
    ]
}

/// Computes the advantages of `scores` with `estimator` (see the module docs).
pub fn advantage_batch(
    scores: &ScoreBatch,
    estimator: AdvantageEstimator,
) -> Result<AdvantageBatch> {
    scores.check()?;
    let rollouts = scores.rollouts.clone();
    let [rows, cols] = rollouts.response_mask.shape();
    ensure!(
        cols > 0 || rows == 0,
        "rollouts have no response positions (T = 0)"
    );
    let mask: Vec<f64> = rollouts
        .response_mask
        .data
        .iter()
        .map(|&m| m as f64)
        .collect();
    let mut rewards = vec![0.0f64; rows * cols];
    for (b, &s) in scores.scores.iter().enumerate() {
        let len = rollouts
            .response_mask
            .row(b)
            .iter()
            .filter(|&&m| m != 0.0)
            .count();
        let pos = if len == 0 { cols - 1 } else { len - 1 };
        rewards[b * cols + pos] = s as f64;
    }
    let host = compute_advantages_host(&rewards, &mask, rows, cols, &rollouts.uid, estimator)?;
    let to_f32 =
        |v: Vec<f64>| TokenMatrix::new(v.into_iter().map(|x| x as f32).collect(), rows, cols);
    let batch = AdvantageBatch {
        rollouts,
        advantages: to_f32(host.advantages)?,
        returns: to_f32(host.returns)?,
    };
    batch.check()?;
    Ok(batch)
}

/// Records `critic/advantages/*` and `critic/returns/*` over the valid tokens.
pub fn log_advantage_metrics(ctx: &mut StepContext, batch: &AdvantageBatch) {
    let mask = &batch.rollouts.response_mask.data;
    for (name, m) in [
        ("advantages", &batch.advantages),
        ("returns", &batch.returns),
    ] {
        let valid: Vec<f64> = m
            .data
            .iter()
            .zip(mask)
            .filter(|(_, k)| **k != 0.0)
            .map(|(&x, _)| x as f64)
            .collect();
        if valid.is_empty() {
            continue;
        }
        let mean = valid.iter().sum::<f64>() / valid.len() as f64;
        ctx.metric(format!("critic/{name}/mean"), mean);
        ctx.metric(
            format!("critic/{name}/max"),
            valid.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        );
        ctx.metric(
            format!("critic/{name}/min"),
            valid.iter().cloned().fold(f64::INFINITY, f64::min),
        );
    }
}

/// A node that applies one estimator.
pub(crate) struct AdvantageNode {
    pub(crate) estimator: AdvantageEstimator,
}

impl Node for AdvantageNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let scores = inputs.get_arc::<ScoreBatch>("scores")?;
        if let Some(r) = inputs.get_opt::<RolloutBatch>("rollouts")? {
            ensure!(
                std::ptr::eq(r, Arc::as_ptr(&scores.rollouts))
                    || (r.uid == scores.rollouts.uid
                        && r.response_mask == scores.rollouts.response_mask),
                "the wired rollouts ({} responses) are not the batch the scores belong to ({} responses)",
                r.len(),
                scores.rollouts.len()
            );
        }
        let batch = advantage_batch(&scores, self.estimator)?;
        log_advantage_metrics(ctx, &batch);
        Ok(Outputs::new().with_opaque("advantages", batch))
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::collections::BTreeMap;

    use crate::reward_support::test_support::rollouts;
    use crate::values::ScoreBatch;

    /// Scores for responses with the given uids and lengths.
    pub fn scores(values: &[f32], uids: &[&str], lens: &[usize]) -> ScoreBatch {
        let texts = vec![""; values.len()];
        ScoreBatch {
            rollouts: rollouts(&texts, &texts, uids, lens),
            scores: values.to_vec(),
            components: BTreeMap::new(),
        }
    }
}
