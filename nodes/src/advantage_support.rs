//! What the `advantage.*` kinds share: turning a [`ScoreBatch`] into an [`AdvantageBatch`] with
//! one of `flowrl_algorithms`' outcome estimators, and verl's advantage metrics.
//!
//! Ports of every advantage kind: `scores: Scores` (which carries its rollouts: group uids and
//! response mask) and an optional `rollouts: Rollouts` (when wired it must be the batch that
//! was scored) → `advantages: Advantages`.
//!
//! Token-level rewards are built as verl's reward manager does: each response's score sits on
//! its last response token (on the last column for an empty response, verl's index −1); the
//! outcome estimators sum them back per response, so only the token-level ones (REINFORCE++'s
//! discounted returns, the reward-to-go of ReMax and the optimal token baselines) see the
//! position.
//!
//! Metrics (verl's names, over valid tokens): `critic/advantages/mean|max|min`,
//! `critic/returns/mean|max|min`.
//!
//! The kinds named after verl's other registry entries (`advantage.gdpo`, `advantage.opo`, ...)
//! run through [`EstimatorNode`] and accept verl's `algorithm.*` options
//! (`norm_adv_by_std_in_grpo`, `gamma`, `lam`) whether or not their estimator reads them, so a
//! verl configuration ports as it is; each kind lists the ones its estimator ignores
//! ([`Ignored`]) and `flowrl validate` warns (W0501, at the key) when a graph sets one of them.

use std::sync::Arc;

use anyhow::{Result, ensure};
use flowrl_algorithms::{
    AdvantageEstimator, HostAdvantages, TokenRewards, compute_advantages_host,
};
use flowrl_engine::{
    Diagnostic, Inputs, Node, Outputs, ParamSpec, PortSpec, PortType, StepContext, ValidateCtx,
};

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

/// A score batch as the estimators read it (host form): verl's token-level rewards, each
/// response's score on its last response token (the last column for an empty response), and the
/// response mask, row-major `[rows, cols]`.
pub(crate) struct HostRewards {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) rewards: Vec<f64>,
    pub(crate) mask: Vec<f64>,
}

impl HostRewards {
    pub(crate) fn of(scores: &ScoreBatch) -> Result<Self> {
        scores.check()?;
        let rollouts = &scores.rollouts;
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
        Ok(Self {
            rows,
            cols,
            rewards,
            mask,
        })
    }

    pub(crate) fn batch(&self) -> Result<TokenRewards<'_>> {
        Ok(TokenRewards::new(
            &self.rewards,
            &self.mask,
            self.rows,
            self.cols,
        )?)
    }
}

/// The output batch of an estimator's host result (rounded to f32 once).
pub(crate) fn advantage_output(
    rollouts: Arc<RolloutBatch>,
    host: HostAdvantages,
) -> Result<AdvantageBatch> {
    let (rows, cols) = (host.rows, host.cols);
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

/// Computes the advantages of `scores` with `estimator` (see the module docs).
pub fn advantage_batch(
    scores: &ScoreBatch,
    estimator: AdvantageEstimator,
) -> Result<AdvantageBatch> {
    let host = HostRewards::of(scores)?;
    let out = compute_advantages_host(
        &host.rewards,
        &host.mask,
        host.rows,
        host.cols,
        &scores.rollouts.uid,
        estimator,
    )?;
    advantage_output(scores.rollouts.clone(), out)
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

/// The `scores` input, checked against the optional `rollouts` input (when wired it must be the
/// scored batch).
pub(crate) fn scores_input(inputs: &Inputs) -> Result<Arc<ScoreBatch>> {
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
    Ok(scores)
}

/// A node that applies one estimator.
pub(crate) struct AdvantageNode {
    pub(crate) estimator: AdvantageEstimator,
}

impl Node for AdvantageNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let scores = scores_input(inputs)?;
        let batch = advantage_batch(&scores, self.estimator)?;
        log_advantage_metrics(ctx, &batch);
        Ok(Outputs::new().with_opaque("advantages", batch))
    }
}

/// What an [`EstimatorNode`]'s estimator sees: the node's inputs, the (checked) scores and their
/// token-level form.
pub(crate) type Estimate =
    dyn Fn(&Inputs, &ScoreBatch, TokenRewards<'_>) -> Result<HostAdvantages> + Send;

/// A node that runs one host estimator of `flowrl_algorithms` on the scores (and whatever other
/// inputs its kind declares), then logs the advantage metrics.
pub(crate) struct EstimatorNode {
    estimate: Box<Estimate>,
}

impl EstimatorNode {
    /// The node running `estimate`, boxed as the engine takes it.
    pub(crate) fn boxed(
        estimate: impl Fn(&Inputs, &ScoreBatch, TokenRewards<'_>) -> Result<HostAdvantages>
        + Send
        + 'static,
    ) -> Box<dyn Node> {
        Box::new(Self {
            estimate: Box::new(estimate),
        })
    }
}

impl Node for EstimatorNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let scores = scores_input(inputs)?;
        let host = HostRewards::of(&scores)?;
        let out = (self.estimate)(inputs, &scores, host.batch()?)?;
        let batch = advantage_output(scores.rollouts.clone(), out)?;
        log_advantage_metrics(ctx, &batch);
        Ok(Outputs::new().with_opaque("advantages", batch))
    }
}

/// A verl option that a kind accepts but whose estimator ignores it, and why.
pub(crate) struct Ignored {
    pub(crate) key: &'static str,
    pub(crate) why: &'static str,
}

/// verl's `algorithm.*` options an advantage estimator may read, with verl's defaults: the
/// `advantage.<verl name>` kinds take them all (see the module docs) and document which their
/// estimator reads.
pub(crate) fn algorithm_option(key: &str) -> ParamSpec {
    match key {
        "norm_adv_by_std_in_grpo" => ParamSpec::bool(key)
            .default(true)
            .doc("verl algorithm.norm_adv_by_std_in_grpo: divide by the group std"),
        "gamma" => ParamSpec::float(key)
            .default(1.0)
            .min(0.0)
            .max(1.0)
            .doc("verl algorithm.gamma: discount factor γ"),
        "lam" => ParamSpec::float(key)
            .default(1.0)
            .min(0.0)
            .max(1.0)
            .doc("verl algorithm.lam: GAE λ"),
        other => unreachable!("no verl algorithm option {other}"),
    }
}

/// Parameter specs of a kind's ignored options: verl's algorithm options by [`algorithm_option`],
/// any other through `own`, each documented as ignored.
pub(crate) fn ignored_params(
    ignored: &[Ignored],
    own: impl Fn(&str) -> Option<ParamSpec>,
) -> Vec<ParamSpec> {
    ignored
        .iter()
        .map(|i| {
            own(i.key)
                .unwrap_or_else(|| algorithm_option(i.key))
                .doc(format!(
                    "ignored: {} (`flowrl validate` warns when set)",
                    i.why
                ))
        })
        .collect()
}

/// A warning at every ignored option the graph sets.
pub(crate) fn warn_ignored(ctx: &ValidateCtx, kind: &str, ignored: &[Ignored]) -> Vec<Diagnostic> {
    ignored
        .iter()
        .filter(|i| ctx.is_set(i.key))
        .map(|i| {
            ctx.warning(
                i.key,
                format!("`{}` is ignored by `{kind}`: {}", i.key, i.why),
            )
        })
        .collect()
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
