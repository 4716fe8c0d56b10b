//! What the `advantage.*` kinds share: turning a [`ScoreBatch`] into an [`AdvantageBatch`] with
//! one of `flowrl_algorithms`' outcome estimators, and verl's advantage metrics.
//!
//! Ports of every advantage kind: `scores: Scores` (which carries its rollouts: group uids and
//! response mask) and an optional `rollouts: Rollouts` (when wired it must be the batch that
//! was scored) → `advantages: Advantages`.
//!
//! Token-level rewards are built as verl's reward manager does: each response's score sits on
//! its last response token, the last with mask 1 (on the last column for an empty response,
//! verl's index −1); the
//! outcome estimators sum them back per response, so only the token-level ones (REINFORCE++'s
//! discounted returns, the reward-to-go of ReMax and the optimal token baselines) see the
//! position.
//!
//! Metrics (verl's names, over valid tokens): `critic/advantages/mean|max|min`,
//! `critic/returns/mean|max|min`.
//!
//! Every advantage kind is one [`AdvantageKind`]: a table row with its name, doc, parameters,
//! checks and how its node is built; the ports above and the timing key `adv` are the row's
//! type's. The kinds named after verl's other registry entries (`advantage.gdpo`,
//! `advantage.opo`, ...) run through `EstimatorNode` and accept verl's `algorithm.*` options
//! (`norm_adv_by_std_in_grpo`, `gamma`, `lam`) whether or not their estimator reads them, so a
//! verl configuration ports as it is; each kind lists the ones its estimator ignores
//! (`Ignored`) and `flowrl validate` warns (W0501, at the key) when a graph sets one of them.

use std::sync::Arc;

use anyhow::{Result, ensure};
use flowrl_algorithms::{
    AdvantageEstimator, HostAdvantages, TokenRewards, compute_advantages_host,
};
use flowrl_engine::{
    BuildContext, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec, Params,
    Port, PortSpec, StepContext, ValidateCtx,
};
use serde::Deserialize;

use crate::values::{AdvantageBatch, RolloutBatch, ScoreBatch, TokenMatrix, port_types};

/// One `advantage.*` kind, as a table row: what differs between the kinds. Every kind outputs
/// `advantage_outputs` and is timed as `adv`; its validation warns at each of its `ignored`
/// options the graph sets (`warn_ignored`), then runs its `checks`.
pub struct AdvantageKind {
    /// `advantage.<verl registry name>`.
    pub(crate) name: &'static str,
    pub(crate) doc: &'static str,
    /// The input ports: [`advantage_inputs`], or those and the estimator's own.
    pub(crate) inputs: fn() -> Vec<PortSpec>,
    /// Every parameter spec, the ignored options' included ([`ignored_params`]).
    pub(crate) params: fn() -> Vec<ParamSpec>,
    /// The verl options the estimator accepts and ignores.
    pub(crate) ignored: &'static [Ignored],
    /// The kind's own validation, given the context and the kind's name ([`no_checks`]: none).
    pub(crate) checks: fn(&ValidateCtx, &str) -> Vec<Diagnostic>,
    /// The node of validated parameters.
    pub(crate) build: fn(&Params) -> Result<Box<dyn Node>>,
}

/// [`AdvantageKind::checks`] of a kind without checks of its own.
pub(crate) fn no_checks(_: &ValidateCtx, _: &str) -> Vec<Diagnostic> {
    Vec::new()
}

impl NodeKind for AdvantageKind {
    fn name(&self) -> &str {
        self.name
    }
    fn doc(&self) -> &str {
        self.doc
    }
    fn inputs(&self) -> Vec<PortSpec> {
        (self.inputs)()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        advantage_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        (self.params)()
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let mut out = warn_ignored(ctx, self.name, self.ignored);
        out.extend((self.checks)(ctx, self.name));
        out
    }
    fn timing_key(&self) -> Option<&str> {
        Some("adv")
    }
    /// A few numbers per row on the host: nothing the plan counts.
    fn footprint(&self, _: &flowrl_engine::PlanCtx) -> Option<flowrl_engine::Footprint> {
        Some(flowrl_engine::Footprint::default())
    }

    fn build(&self, params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        (self.build)(params)
    }
}

/// The scores input of every advantage kind.
const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);
/// The optional rollouts input of every advantage kind.
const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);
/// The output of every advantage kind.
pub(crate) const ADVANTAGES: Port<AdvantageBatch> = Port::new("advantages", port_types::ADVANTAGES);

/// `scores: Scores`, optional `rollouts: Rollouts`.
pub(crate) fn advantage_inputs() -> Vec<PortSpec> {
    vec![
        SCORES
            .spec()
            .doc("per-response scores (they carry their rollouts)"),
        ROLLOUTS
            .spec()
            .optional()
            .doc("the scored rollouts (checked against the scores' own)"),
    ]
}

/// `advantages: Advantages`.
pub(crate) fn advantage_outputs() -> Vec<PortSpec> {
    vec![
        ADVANTAGES
            .spec()
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
            // The last masked token: the response's last (a multi-turn response ends on a
            // policy turn; its tool tokens in between are masked out).
            let pos = rollouts
                .response_mask
                .row(b)
                .iter()
                .rposition(|&m| m != 0.0)
                .unwrap_or(cols - 1);
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
    let scores = inputs.get_arc(SCORES)?;
    if let Some(r) = inputs.get_opt(ROLLOUTS)? {
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

/// Steps in a row whose advantages were all zero, warned about from [`ZERO_STEPS_WARNED`] on:
/// such an update learns nothing, and the run goes on as if it did.
#[derive(Default)]
pub(crate) struct ZeroAdvantages {
    steps: usize,
}

/// Steps of all-zero advantages in a row before the warning.
pub(crate) const ZERO_STEPS_WARNED: usize = 3;

impl ZeroAdvantages {
    /// Counts `batch` and warns (at [`ZERO_STEPS_WARNED`] steps in a row, then every tenth
    /// step) with the likely cause.
    pub(crate) fn observe(&mut self, ctx: &mut StepContext, batch: &AdvantageBatch) {
        let mask = &batch.rollouts.response_mask.data;
        let zero = batch
            .advantages
            .data
            .iter()
            .zip(mask)
            .all(|(&a, &m)| m == 0.0 || a == 0.0);
        self.steps = if zero { self.steps + 1 } else { 0 };
        if self.steps < ZERO_STEPS_WARNED || !(self.steps - ZERO_STEPS_WARNED).is_multiple_of(10) {
            return;
        }
        let r = &batch.rollouts;
        let cause = if !r.truncated.is_empty() && r.truncated.iter().all(|&t| t) {
            "every response is cut at max_new_tokens, so none is scored as finished: raise \
             max_new_tokens (verl: data.max_response_length)"
        } else {
            "every group's responses get the same score (a reward that never varies, a task the \
             policy always or never solves, or one response per prompt, n = 1, for a \
             group-relative estimator)"
        };
        ctx.warn(format!(
            "the advantages have been all zero for {} steps in a row, so the update learns \
             nothing; likely cause: {cause}",
            self.steps
        ));
    }
}

/// A node that applies one estimator.
pub(crate) struct AdvantageNode {
    estimator: AdvantageEstimator,
    zeros: ZeroAdvantages,
}

impl AdvantageNode {
    /// The node applying `estimator`, boxed as the engine takes it.
    pub(crate) fn boxed(estimator: AdvantageEstimator) -> Box<dyn Node> {
        Box::new(Self {
            estimator,
            zeros: ZeroAdvantages::default(),
        })
    }
}

impl Node for AdvantageNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let scores = scores_input(inputs)?;
        let batch = advantage_batch(&scores, self.estimator)?;
        log_advantage_metrics(ctx, &batch);
        self.zeros.observe(ctx, &batch);
        Ok(Outputs::new().with(ADVANTAGES, batch))
    }
}

/// What an `EstimatorNode`'s estimator sees: the node's inputs, the (checked) scores and their
/// token-level form.
pub(crate) type Estimate =
    dyn Fn(&Inputs, &ScoreBatch, TokenRewards<'_>) -> Result<HostAdvantages> + Send;

/// A node that runs one host estimator of `flowrl_algorithms` on the scores (and whatever other
/// inputs its kind declares), then logs the advantage metrics.
pub(crate) struct EstimatorNode {
    estimate: Box<Estimate>,
    zeros: ZeroAdvantages,
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
            zeros: ZeroAdvantages::default(),
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
        self.zeros.observe(ctx, &batch);
        Ok(Outputs::new().with(ADVANTAGES, batch))
    }
}

/// A verl option that a kind accepts but whose estimator ignores it, and why.
pub(crate) struct Ignored {
    pub(crate) key: &'static str,
    pub(crate) why: &'static str,
}

/// verl's `algorithm.*` options an advantage estimator may read, with verl's defaults: the
/// `advantage.<verl name>` kinds take them all (see the module docs) and document which their
/// estimator reads. A schema only: a kind reads the options it uses through its own struct.
#[derive(Deserialize, flowrl_engine::Params)]
#[allow(dead_code)]
pub(crate) struct AlgorithmOptions {
    /// verl algorithm.norm_adv_by_std_in_grpo: divide by the group std
    #[param(default = true)]
    norm_adv_by_std_in_grpo: bool,
    #[serde(flatten)]
    discount: Discount,
}

/// verl's `algorithm.gamma` and `algorithm.lam`, the discount options (`advantage.gae`'s
/// parameters).
#[derive(Debug, Clone, Copy, Deserialize, flowrl_engine::Params)]
pub(crate) struct Discount {
    /// verl algorithm.gamma: discount factor γ
    #[param(default = 1.0, min = 0.0, max = 1.0)]
    pub(crate) gamma: f64,
    /// verl algorithm.lam: GAE λ
    #[param(default = 1.0, min = 0.0, max = 1.0)]
    pub(crate) lam: f64,
}

/// The spec of one of verl's algorithm options ([`AlgorithmOptions`]).
pub(crate) fn algorithm_option(key: &str) -> ParamSpec {
    AlgorithmOptions::param_specs()
        .into_iter()
        .find(|s| s.name == key)
        .unwrap_or_else(|| unreachable!("no verl algorithm option {key}"))
}

/// A kind's parameter specs: its own (`own`, from its parameter struct), then those of the
/// options it ignores ([`ignored_params`]).
pub(crate) fn with_ignored(
    own: Vec<ParamSpec>,
    ignored: &[Ignored],
    other: impl Fn(&str) -> Option<ParamSpec>,
) -> Vec<ParamSpec> {
    let mut p = own;
    p.extend(ignored_params(ignored, other));
    p
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

    use crate::kinds::reward::support::test_support::rollouts;
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
