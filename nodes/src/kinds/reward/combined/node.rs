//! The node that runs a combination: each step it gathers every term's scores (a wired scores
//! input, or a built-in rule on `rollouts`), checks that they score the same responses and sums
//! them with their weights.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use flowrl_algorithms::rewards::{BuiltinReward, RewardFunction};
use flowrl_engine::{Inputs, Node, Outputs, StepContext};

use crate::kinds::reward::support::{ROLLOUTS, SCORES, ScoreColumns, log_score_metrics};
use crate::values::{RolloutBatch, ScoreBatch};

/// The component that `eval` and `critic/score/acc/mean` read as the accuracy.
const ACCURACY: &str = "acc";

/// One weighted term.
pub(super) struct Term {
    pub(super) name: String,
    pub(super) weight: f64,
    /// The built-in rule of that name; it scores `rollouts` when no scores input has the name.
    pub(super) rule: Option<BuiltinReward>,
}

pub(super) struct CombinedRewardNode {
    /// The terms with a non-zero weight, in name order.
    pub(super) terms: Vec<Term>,
    /// The node's wired inputs (empty for a node built outside a graph): when one of them has no
    /// value, its producer skipped the step, and so does this node.
    pub(super) wired: Vec<String>,
}

impl Node for CombinedRewardNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        if self.wired.iter().any(|port| !inputs.contains(port)) {
            return Ok(Outputs::skipped());
        }
        let rollouts = if inputs.contains(ROLLOUTS.name()) {
            Some(inputs.get_arc(ROLLOUTS)?)
        } else {
            None
        };
        let mut terms = Vec::with_capacity(self.terms.len());
        for term in &self.terms {
            let scores = if inputs.contains(&term.name) {
                let batch: Arc<ScoreBatch> = inputs.get_arc(term.name.as_str())?;
                TermScores::of_input(&term.name, &batch)
            } else if let Some(rule) = term.rule {
                let rollouts = rollouts.clone().with_context(|| {
                    format!(
                        "the built-in rule `{}` scores the `rollouts` input, which is not wired",
                        term.name
                    )
                })?;
                TermScores::of_rule(rule, rollouts)?
            } else {
                anyhow::bail!(
                    "`weights.{}` names neither a wired scores input nor a built-in rule",
                    term.name
                );
            };
            terms.push((term.weight, scores));
        }
        let batch = combine(rollouts, &terms)?;
        log_score_metrics(ctx, &batch);
        Ok(Outputs::new().with(SCORES, batch))
    }
}

/// One term's unweighted scores, with their components, one value per response.
struct TermScores {
    name: String,
    /// Where the scores come from, as errors name it: "input `judge`", "rule `geo3k` on input
    /// `rollouts`".
    origin: String,
    rollouts: Arc<RolloutBatch>,
    scores: Vec<f64>,
    components: BTreeMap<String, Vec<f64>>,
}

impl TermScores {
    /// The scores on input `name`.
    fn of_input(name: &str, batch: &ScoreBatch) -> TermScores {
        let ScoreColumns { scores, components } = ScoreColumns::of_batch(batch);
        TermScores {
            name: name.to_string(),
            origin: format!("input `{name}`"),
            rollouts: batch.rollouts.clone(),
            scores,
            components,
        }
    }

    /// `rule`'s scores of every response of `rollouts` against its ground truth.
    fn of_rule(rule: BuiltinReward, rollouts: Arc<RolloutBatch>) -> Result<TermScores> {
        let ScoreColumns { scores, components } = ScoreColumns::of_rule(&rule, &rollouts)?;
        Ok(TermScores {
            name: rule.name().to_string(),
            origin: format!("rule `{}` on input `{}`", rule.name(), ROLLOUTS.name()),
            rollouts,
            scores,
            components,
        })
    }
}

/// Fails unless `a` and `b` are the same responses: the same batch, or as many with the same uids
/// in the same order. The message names both origins.
fn check_same_responses(a: (&str, &RolloutBatch), b: (&str, &RolloutBatch)) -> Result<()> {
    let ((a_origin, a), (b_origin, b)) = (a, b);
    if std::ptr::eq(a, b) {
        return Ok(());
    }
    anyhow::ensure!(
        a.len() == b.len(),
        "{a_origin} scores {} responses and {b_origin} {}: the terms of a combined reward must \
         score the same responses",
        a.len(),
        b.len()
    );
    if let Some(i) = (0..a.len()).find(|&i| a.uid[i] != b.uid[i]) {
        anyhow::bail!(
            "{a_origin} and {b_origin} score different responses: response {i} has uid `{}` in \
             the one and `{}` in the other; the terms of a combined reward must score the same \
             responses",
            a.uid[i],
            b.uid[i]
        );
    }
    Ok(())
}

/// The combined scores of the responses of `rollouts` (else of the first term):
/// score = Σᵢ wᵢ·sᵢ per response, summed in f64 and rounded once to f32, with the components of
/// the module doc.
fn combine(rollouts: Option<Arc<RolloutBatch>>, terms: &[(f64, TermScores)]) -> Result<ScoreBatch> {
    let (reference_origin, rollouts) = match rollouts {
        Some(r) => (format!("input `{}`", ROLLOUTS.name()), r),
        None => {
            let first = &terms.first().context("a combined reward needs a term")?.1;
            (first.origin.clone(), first.rollouts.clone())
        }
    };
    for (_, t) in terms {
        check_same_responses((&reference_origin, &rollouts), (&t.origin, &t.rollouts))?;
    }
    let narrow = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let scores = (0..rollouts.len())
        .map(|i| terms.iter().map(|(w, t)| w * t.scores[i]).sum::<f64>() as f32)
        .collect();
    let mut components = BTreeMap::new();
    for (_, t) in terms {
        components.insert(t.name.clone(), narrow(&t.scores));
        for (k, v) in &t.components {
            components.insert(format!("{}/{k}", t.name), narrow(v));
        }
    }
    let accuracies: Vec<&Vec<f64>> = terms
        .iter()
        .filter_map(|(_, t)| t.components.get(ACCURACY))
        .collect();
    if let [accuracy] = accuracies[..] {
        components
            .entry(ACCURACY.to_string())
            .or_insert_with(|| narrow(accuracy));
    }
    let batch = ScoreBatch {
        rollouts,
        scores,
        components,
    };
    batch.check()?;
    Ok(batch)
}
