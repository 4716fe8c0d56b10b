//! `reward.combined`: a weighted sum of reward terms, per response
//! score = Σᵢ wᵢ·sᵢ, with the weights `wᵢ` of `weights = { <term> = wᵢ, … }`. A term is
//!
//! - a **scores input**: the `scores` of another reward node (an LLM judge, a reward model, an
//!   `exec` program, a `reward.*` rule) wired under a name the graph chooses, or
//! - a **built-in rule** (`geo3k`, `exact_match`, `format`) scoring the `rollouts` input.
//!
//! ```toml
//! [nodes.reward]
//! kind = "reward.combined"
//! inputs = { judge = "judge.scores", format = "fmt.scores" }
//! weights = { judge = 0.9, format = 0.1 }
//!
//! [nodes.rule_reward]
//! kind = "reward.combined"
//! inputs = { rollouts = "rollout.rollouts" }
//! weights = { exact_match = 0.9, format = 0.1 }
//! ```
//!
//! A weight names the scores input of that name when one is wired (`format` above is `fmt`'s
//! scores, not the rule), else a built-in rule, which needs `rollouts` wired. Every scores input
//! needs a weight. A weight of 0, or no weight for a rule, leaves the term out: it is neither
//! summed nor logged. The terms must score the same responses (as many, with the same uids in the
//! same order, and those of `rollouts` when it is wired), checked at each step.
//!
//! The components of the combined scores, logged as `critic/score/<component>/mean` by the
//! shared reward metrics ([`log_score_metrics`]):
//!
//! - `<term>`: the term's score, unweighted (`critic/score/judge/mean`);
//! - `<term>/<component>`: each component of the term's own scores
//!   (`critic/score/geo3k/acc/mean`, `critic/score/judge/parse_failures/mean`);
//! - `acc`: when exactly one term has an `acc` component, that component, so that
//!   `critic/score/acc/mean` and `eval`'s accuracy (the `acc` component when the scores have one)
//!   read the accuracy of the one term that reports it. With none, or several, there is no `acc`.
//!
//! `eval` scores validation, by default, with copies of the combination and of the reward nodes
//! it reads (see `eval`'s module doc).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use flowrl_algorithms::rewards::{BuiltinReward, RewardFunction};
use flowrl_engine::diagnostic::did_you_mean;
use flowrl_engine::{
    BuildContext, Code, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamField, ParamSchema,
    ParamSpec, ParamType, Params, PortSpec, StepContext, ValidateCtx,
};
use serde::Deserialize;
use serde_json::Value as Json;

use crate::kinds::reward::support::{
    ROLLOUTS, SCORES, ScoreColumns, log_score_metrics, reward_outputs,
};
use crate::values::{RolloutBatch, ScoreBatch};

/// The `reward.combined` kind.
pub struct CombinedRewardKind;

/// The built-in rules a weight can name, as `BuiltinReward::from_name` reads them.
const BUILTIN_RULES: [&str; 3] = ["geo3k", "exact_match", "format"];

/// The component that `eval` and `critic/score/acc/mean` read as the accuracy.
const ACCURACY: &str = "acc";

#[derive(Deserialize, Params)]
struct CombinedParams {
    /// weight per term, by name: a scores input, or a built-in rule (geo3k, exact_match, format)
    /// on `rollouts`; e.g. { judge = 0.9, format = 0.1 }
    #[param(required)]
    weights: Weights,
}

/// `weights` as written: a table whose keys are the graph's input names as well as rule names, so
/// the schema takes any value and [`Weights::by_name`] checks it.
#[derive(Deserialize)]
#[serde(transparent)]
struct Weights(Json);

impl ParamField for Weights {
    fn param_type() -> ParamType {
        ParamType::Any
    }
}

impl Weights {
    /// Each term's name and weight (in name order), or what is wrong with the table.
    fn by_name(&self) -> Result<Vec<(String, f64)>, String> {
        let Json::Object(table) = &self.0 else {
            return Err(format!(
                "`weights` must be a table of numbers by term name, e.g. \
                 `weights = {{ judge = 0.9, format = 0.1 }}`, got {}",
                self.0
            ));
        };
        let mut weights: Vec<(String, f64)> = table
            .iter()
            .map(|(name, w)| match w.as_f64().filter(|w| w.is_finite()) {
                Some(w) => Ok((name.clone(), w)),
                None => Err(format!("`weights.{name}` must be a finite number, got {w}")),
            })
            .collect::<Result<_, _>>()?;
        weights.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(weights)
    }
}

/// What part of the node's table a [`TermProblem`] points at.
#[derive(Debug, PartialEq)]
enum ProblemAt {
    Weights,
    /// The `inputs` entry of this scores input.
    Input(String),
}

/// A way in which `weights` and the wired inputs do not fit together.
#[derive(Debug, PartialEq)]
struct TermProblem {
    at: ProblemAt,
    message: String,
    help: Option<String>,
}

/// How the node is wired, as [`term_problems`] checks `weights` against it.
struct Wiring<'a> {
    /// The node's name.
    node: &'a str,
    /// The names of its wired scores inputs (every input but `rollouts`).
    scores_inputs: Vec<&'a str>,
    /// Whether `rollouts` is wired.
    rollouts: bool,
    /// An output that could feed `rollouts` (`"rollout.rollouts"`), for the help.
    rollouts_producer: Option<String>,
}

/// The problems of `weights` on a node wired as `wiring`: a weight that names neither a scores
/// input nor a built-in rule (with a did-you-mean), a scores input without a weight, a rule
/// without `rollouts`, and no non-zero weight at all.
fn term_problems(weights: &[(String, f64)], wiring: &Wiring) -> Vec<TermProblem> {
    let mut problems = Vec::new();
    let weighs = |w: f64| w != 0.0;
    for (name, w) in weights {
        if wiring.scores_inputs.contains(&name.as_str()) {
            continue;
        }
        if BUILTIN_RULES.contains(&name.as_str()) {
            if !wiring.rollouts && weighs(*w) {
                let wire = wiring
                    .rollouts_producer
                    .as_deref()
                    .unwrap_or("<node>.rollouts");
                problems.push(TermProblem {
                    at: ProblemAt::Weights,
                    message: format!(
                        "`weights.{name}` weighs the built-in rule `{name}`, which scores the \
                         `rollouts` input, and `rollouts` is not wired"
                    ),
                    help: Some(format!("wire it: `inputs = {{ rollouts = \"{wire}\" }}`")),
                });
            }
            continue;
        }
        let inputs = if wiring.scores_inputs.is_empty() {
            "none is wired".to_string()
        } else {
            wiring.scores_inputs.join(", ")
        };
        let candidates = wiring.scores_inputs.iter().chain(&BUILTIN_RULES).copied();
        let help = did_you_mean(name, candidates).unwrap_or_else(|| {
            format!(
                "to weigh a reward node's scores, wire them under this name: \
                 `inputs = {{ {name} = \"<node>.scores\" }}`"
            )
        });
        problems.push(TermProblem {
            at: ProblemAt::Weights,
            message: format!(
                "`weights.{name}` names nothing: neither a scores input of `{}` ({inputs}) nor a \
                 built-in rule ({})",
                wiring.node,
                BUILTIN_RULES.join(", ")
            ),
            help: Some(help),
        });
    }
    for input in &wiring.scores_inputs {
        if !weights.iter().any(|(name, _)| name == input) {
            problems.push(TermProblem {
                at: ProblemAt::Input(input.to_string()),
                message: format!("scores input `{input}` of `{}` has no weight", wiring.node),
                help: Some(format!(
                    "add `{input} = <weight>` to `weights` (0 leaves the term out)"
                )),
            });
        }
    }
    if !weights.iter().any(|&(_, w)| weighs(w)) {
        problems.push(TermProblem {
            at: ProblemAt::Weights,
            message: format!(
                "`{}` needs at least one non-zero weight, on a scores input or a built-in rule \
                 ({})",
                wiring.node,
                BUILTIN_RULES.join(", ")
            ),
            help: None,
        });
    }
    problems
}

impl NodeKind for CombinedRewardKind {
    fn name(&self) -> &str {
        "reward.combined"
    }
    fn doc(&self) -> &str {
        "Weighted sum of reward terms, score = Σ wᵢ·sᵢ: other reward nodes' scores wired as named \
         inputs (`inputs = { judge = \"judge.scores\" }`) and built-in rules (geo3k, exact_match, \
         format) on `rollouts`, weighted by name (`weights = { judge = 0.9, format = 0.1 }`). \
         Each term is logged unweighted as critic/score/<name>/mean, its components as \
         critic/score/<name>/<component>/mean, and the one term's `acc` as critic/score/acc/mean."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            ROLLOUTS
                .spec()
                .optional()
                .doc("responses for the built-in rules named in `weights` to score"),
            PortSpec::variadic(SCORES.port_type()).doc(
                "another reward node's scores: a term named by its input, weighted in `weights`",
            ),
        ]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        reward_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        CombinedParams::param_specs()
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let p = match ctx.parse::<CombinedParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        let weights = match p.weights.by_name() {
            Ok(w) => w,
            Err(message) => return vec![ctx.error("weights", message)],
        };
        let graph = ctx.graph();
        let Some(me) = graph.node_id(ctx.name()).map(|i| &graph.nodes[i]) else {
            return Vec::new();
        };
        let rollouts_producer = graph.nodes.iter().find_map(|n| {
            n.kind
                .outputs()
                .iter()
                .find(|o| !o.argument && o.ty == ROLLOUTS.port_type())
                .map(|o| format!("{}.{}", n.name, o.name))
        });
        let wiring = Wiring {
            node: ctx.name(),
            scores_inputs: me
                .inputs
                .iter()
                .map(|e| e.port.as_str())
                .filter(|&port| port != ROLLOUTS.name())
                .collect(),
            rollouts: ctx.input(ROLLOUTS.name()).is_some(),
            rollouts_producer,
        };
        term_problems(&weights, &wiring)
            .into_iter()
            .map(|problem| {
                let d = match problem.at {
                    ProblemAt::Weights => ctx.error("weights", problem.message),
                    ProblemAt::Input(input) => Diagnostic::error(Code::Constraint, problem.message)
                        .at(me.spans.key_span(&format!("inputs.{input}"))),
                };
                match problem.help {
                    Some(help) => d.with_help(help),
                    None => d,
                }
            })
            .collect()
    }
    fn timing_key(&self) -> Option<&str> {
        Some("reward")
    }
    /// A few numbers per row on the host: nothing the plan counts.
    fn footprint(&self, _: &flowrl_engine::PlanCtx) -> Option<flowrl_engine::Footprint> {
        Some(flowrl_engine::Footprint::default())
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let weights = params
            .parse::<CombinedParams>()?
            .weights
            .by_name()
            .map_err(anyhow::Error::msg)?;
        let terms: Vec<Term> = weights
            .into_iter()
            .filter(|&(_, w)| w != 0.0)
            .map(|(name, weight)| Term {
                rule: BuiltinReward::from_name(&name).ok(),
                name,
                weight,
            })
            .collect();
        anyhow::ensure!(
            !terms.is_empty(),
            "reward.combined needs at least one non-zero weight, on a scores input or a built-in \
             rule ({})",
            BUILTIN_RULES.join(", ")
        );
        let wired = ctx
            .graph
            .as_ref()
            .and_then(|g| g.node_id(&ctx.node).map(|i| &g.nodes[i]))
            .map(|n| n.inputs.iter().map(|e| e.port.clone()).collect())
            .unwrap_or_default();
        Ok(Box::new(CombinedRewardNode { terms, wired }))
    }
}

flowrl_engine::register_node_kind!(CombinedRewardKind);

/// One weighted term.
struct Term {
    name: String,
    weight: f64,
    /// The built-in rule of that name; it scores `rollouts` when no scores input has the name.
    rule: Option<BuiltinReward>,
}

struct CombinedRewardNode {
    /// The terms with a non-zero weight, in name order.
    terms: Vec<Term>,
    /// The node's wired inputs (empty for a node built outside a graph): when one of them has no
    /// value, its producer skipped the step, and so does this node.
    wired: Vec<String>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::{Payload, Value};

    /// Scores of `rollouts` with the given components.
    fn scored(
        rollouts: &Arc<RolloutBatch>,
        scores: &[f32],
        components: &[(&str, &[f32])],
    ) -> ScoreBatch {
        ScoreBatch {
            rollouts: rollouts.clone(),
            scores: scores.to_vec(),
            components: components
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
        }
    }

    /// Inputs of node `c`: `rollouts` when given, and each scores input by name.
    fn wired(rollouts: Option<&Arc<RolloutBatch>>, scores: Vec<(&str, ScoreBatch)>) -> Inputs {
        let mut inputs = Inputs::new("c");
        if let Some(r) = rollouts {
            inputs.insert(
                ROLLOUTS.name(),
                Value::new(ROLLOUTS.port_type(), Payload::opaque_arc(r.clone())),
            );
        }
        for (name, batch) in scores {
            inputs.insert(name, Value::new(SCORES.port_type(), Payload::opaque(batch)));
        }
        inputs
    }

    /// Builds `reward.combined` with `weights` and runs it on `inputs`: its scores and metrics.
    fn run(weights: Json, inputs: &Inputs) -> Result<(Arc<ScoreBatch>, StepContext)> {
        let p = params(serde_json::json!({ "weights": weights }));
        let mut node = CombinedRewardKind.build(&p, &build_ctx("c"))?;
        let mut c = ctx("c");
        let out = node.run(inputs, &mut c)?;
        Ok((out.get_arc(SCORES).expect("scores"), c))
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    /// Two responses of one prompt, without the think/boxed format.
    fn two_responses() -> Arc<RolloutBatch> {
        rollouts(&["7", "\\boxed{8}"], &["7", "7"], &["a", "a"], &[2, 2])
    }

    #[test]
    fn weighted_sum_and_component_metrics() {
        let r = rollouts(
            &["<think>t</think> \\boxed{0.5}", "\\boxed{7}"],
            &["\\frac{1}{2}", "7"],
            &["a", "a"],
            &[2, 2],
        );
        let p = params(
            serde_json::json!({"weights": {"geo3k": 1.0, "exact_match": 0.5, "format": 0.0}}),
        );
        let mut node = CombinedRewardKind.build(&p, &build_ctx("c")).unwrap();
        let mut c = ctx("c");
        node.run(&inputs("c", ROLLOUTS, (*r).clone()), &mut c)
            .unwrap();
        // Row 0: geo3k 1.0, exact 0 → 1.0. Row 1: geo3k 0.9, exact 1 → 1.4.
        assert!((metric(&c, "critic/score/mean") - 1.2).abs() < 1e-6);
        assert!((metric(&c, "critic/score/geo3k/mean") - 0.95).abs() < 1e-6);
        assert!((metric(&c, "critic/score/exact_match/mean") - 0.5).abs() < 1e-6);
        assert!((metric(&c, "critic/score/geo3k/format/mean") - 0.5).abs() < 1e-6);
        // geo3k is the one term with an accuracy: both answers are right.
        assert!((metric(&c, "critic/score/acc/mean") - 1.0).abs() < 1e-6);
        assert!(
            c.metrics()
                .iter()
                .all(|(n, _)| !n.starts_with("critic/score/format"))
        );
    }

    #[test]
    fn all_zero_weights_cannot_build() {
        let p = params(serde_json::json!({"weights": {"geo3k": 0.0}}));
        assert!(CombinedRewardKind.build(&p, &build_ctx("c")).is_err());
    }

    #[test]
    fn scores_inputs_are_weighted_and_logged_by_input_name() {
        let r = two_responses();
        let judge = scored(
            &r,
            &[1.0, 0.5],
            &[("acc", &[1.0, 0.0]), ("parse_failures", &[0.0, 1.0])],
        );
        // An input named like a built-in rule is that input: the `format` rule would give 0, 0.
        let format = scored(&r, &[1.0, 0.0], &[]);
        let inputs = wired(None, vec![("judge", judge), ("format", format)]);
        let (s, c) = run(serde_json::json!({"judge": 0.9, "format": 0.1}), &inputs).unwrap();
        // Σ wᵢ·sᵢ: 0.9·1 + 0.1·1 = 1, 0.9·0.5 + 0.1·0 = 0.45.
        assert_eq!(s.scores, [1.0, 0.45]);
        assert!(Arc::ptr_eq(&s.rollouts, &r));
        for (name, want) in [
            ("critic/score/mean", 0.725),
            ("critic/score/max", 1.0),
            ("critic/rewards/min", 0.45),
            ("critic/score/judge/mean", 0.75),
            ("critic/score/format/mean", 0.5),
            ("critic/score/judge/acc/mean", 0.5),
            ("critic/score/judge/parse_failures/mean", 0.5),
            ("critic/score/acc/mean", 0.5),
        ] {
            assert!(
                close(metric(&c, name), want),
                "{name}: {}",
                metric(&c, name)
            );
        }
        assert_eq!(
            s.components.keys().collect::<Vec<_>>(),
            [
                "acc",
                "format",
                "judge",
                "judge/acc",
                "judge/parse_failures"
            ]
        );
    }

    #[test]
    fn rules_and_scores_inputs_mix_and_several_accuracies_give_no_acc() {
        let r = rollouts(
            &["<think>t</think> \\boxed{7}", "\\boxed{8}"],
            &["7", "7"],
            &["a", "a"],
            &[2, 2],
        );
        let judge = scored(&r, &[0.5, 0.5], &[("acc", &[1.0, 1.0])]);
        let inputs = wired(Some(&r), vec![("judge", judge)]);
        let (s, c) = run(serde_json::json!({"judge": 2.0, "geo3k": 1.0}), &inputs).unwrap();
        // geo3k: 1.0 and 0 (wrong, unformatted); judge 0.5 each, weighed 2.
        assert_eq!(s.scores, [2.0, 1.0]);
        assert!(close(metric(&c, "critic/score/geo3k/acc/mean"), 0.5));
        assert!(close(metric(&c, "critic/score/judge/acc/mean"), 1.0));
        assert!(
            !s.components.contains_key("acc"),
            "two terms have an accuracy"
        );

        // The rollouts of a rule that no input shadows, unwired: an error naming the rule.
        let inputs = wired(None, vec![("judge", scored(&r, &[0.5, 0.5], &[]))]);
        let e = run(serde_json::json!({"judge": 1.0, "geo3k": 1.0}), &inputs)
            .err()
            .expect("an error");
        assert!(e.to_string().contains("rule `geo3k`"), "{e}");
    }

    #[test]
    fn terms_of_different_responses_are_an_error_naming_both() {
        let r = two_responses();
        let three = rollouts(
            &["a", "b", "c"],
            &["7", "7", "7"],
            &["a", "a", "b"],
            &[1, 1, 1],
        );
        let inputs = wired(
            None,
            vec![
                ("judge", scored(&r, &[1.0, 0.0], &[])),
                ("rm", scored(&three, &[1.0, 0.0, 1.0], &[])),
            ],
        );
        let e = run(serde_json::json!({"judge": 0.5, "rm": 0.5}), &inputs)
            .err()
            .expect("an error");
        let e = e.to_string();
        assert!(
            e.contains("input `judge` scores 2 responses and input `rm` 3"),
            "{e}"
        );

        let other_uids = rollouts(&["7", "7"], &["7", "7"], &["a", "b"], &[1, 1]);
        let inputs = wired(
            Some(&r),
            vec![("judge", scored(&other_uids, &[1.0, 0.0], &[]))],
        );
        let e = run(serde_json::json!({"judge": 1.0}), &inputs)
            .err()
            .expect("an error");
        let e = e.to_string();
        assert!(
            e.contains("input `rollouts` and input `judge` score different responses")
                && e.contains("response 1 has uid `a` in the one and `b` in the other"),
            "{e}"
        );
    }

    #[test]
    fn a_zero_weight_leaves_its_input_out() {
        let r = two_responses();
        let inputs = wired(
            None,
            vec![
                ("judge", scored(&r, &[1.0, 0.0], &[("acc", &[1.0, 0.0])])),
                ("rm", scored(&r, &[0.25, 0.75], &[])),
            ],
        );
        let (s, c) = run(serde_json::json!({"judge": 0.0, "rm": 2.0}), &inputs).unwrap();
        assert_eq!(s.scores, [0.5, 1.5]);
        assert!(
            c.metrics()
                .iter()
                .all(|(n, _)| !n.contains("judge") && n != "critic/score/acc/mean"),
            "{:?}",
            c.metrics()
        );
    }

    #[test]
    fn a_wired_input_without_a_value_skips_the_step() {
        let mut node = CombinedRewardNode {
            terms: vec![Term {
                name: "judge".into(),
                weight: 1.0,
                rule: None,
            }],
            wired: vec!["judge".into()],
        };
        let out = node.run(&Inputs::new("c"), &mut ctx("c")).unwrap();
        assert!(out.is_skipped());
    }

    #[test]
    fn weights_must_be_a_table_of_finite_numbers() {
        let e = Weights(serde_json::json!(1.0)).by_name().unwrap_err();
        assert!(e.starts_with("`weights` must be a table of numbers"), "{e}");
        let e = Weights(serde_json::json!({"judge": "high"}))
            .by_name()
            .unwrap_err();
        assert_eq!(e, "`weights.judge` must be a finite number, got \"high\"");
        let w = Weights(serde_json::json!({"judge": 1, "format": 0.5}))
            .by_name()
            .unwrap();
        assert_eq!(w, [("format".to_string(), 0.5), ("judge".to_string(), 1.0)]);
    }

    /// The problems of `weights` on node `reward` with these scores inputs and `rollouts` wired
    /// or not.
    fn problems(
        weights: &[(&str, f64)],
        scores_inputs: &[&str],
        rollouts: bool,
    ) -> Vec<TermProblem> {
        let weights: Vec<(String, f64)> =
            weights.iter().map(|&(n, w)| (n.to_string(), w)).collect();
        let wiring = Wiring {
            node: "reward",
            scores_inputs: scores_inputs.to_vec(),
            rollouts,
            rollouts_producer: Some("rollout.rollouts".into()),
        };
        term_problems(&weights, &wiring)
    }

    #[test]
    fn weights_that_fit_the_wiring_have_no_problem() {
        assert!(problems(&[("geo3k", 1.0)], &[], true).is_empty());
        let both = [("judge", 0.9), ("format", 0.1)];
        assert!(problems(&both, &["judge", "format"], false).is_empty());
        assert!(problems(&both, &["judge"], true).is_empty());
        // A zero weight on a rule needs no rollouts.
        assert!(problems(&[("judge", 1.0), ("geo3k", 0.0)], &["judge"], false).is_empty());
    }

    #[test]
    fn a_weight_naming_nothing_says_what_it_could_name() {
        let p = problems(&[("jugde", 0.9), ("judge", 0.1)], &["judge"], false);
        assert_eq!(
            p,
            [TermProblem {
                at: ProblemAt::Weights,
                message: "`weights.jugde` names nothing: neither a scores input of `reward` \
                          (judge) nor a built-in rule (geo3k, exact_match, format)"
                    .into(),
                help: Some("did you mean `judge`?".into()),
            }]
        );
        let p = problems(&[("geo3kk", 1.0)], &[], true);
        assert_eq!(p.len(), 1);
        assert!(p[0].message.contains("(none is wired)"), "{}", p[0].message);
        assert_eq!(p[0].help.as_deref(), Some("did you mean `geo3k`?"));
        let p = problems(&[("rollouts", 1.0)], &[], true);
        assert!(
            p[0].help
                .as_deref()
                .is_some_and(|h| h.contains("inputs = { rollouts = \"<node>.scores\" }")),
            "{p:?}"
        );
    }

    #[test]
    fn a_scores_input_without_a_weight_is_a_problem_at_the_input() {
        let p = problems(&[("judge", 1.0)], &["judge", "rm"], false);
        assert_eq!(
            p,
            [TermProblem {
                at: ProblemAt::Input("rm".into()),
                message: "scores input `rm` of `reward` has no weight".into(),
                help: Some("add `rm = <weight>` to `weights` (0 leaves the term out)".into()),
            }]
        );
    }

    #[test]
    fn a_rule_needs_rollouts_and_some_weight_must_be_non_zero() {
        let p = problems(&[("judge", 1.0), ("geo3k", 0.5)], &["judge"], false);
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].message,
            "`weights.geo3k` weighs the built-in rule `geo3k`, which scores the `rollouts` input, \
             and `rollouts` is not wired"
        );
        assert_eq!(
            p[0].help.as_deref(),
            Some("wire it: `inputs = { rollouts = \"rollout.rollouts\" }`")
        );
        let p = problems(&[("judge", 0.0)], &["judge"], false);
        assert_eq!(
            p.iter().map(|p| p.message.as_str()).collect::<Vec<_>>(),
            [
                "`reward` needs at least one non-zero weight, on a scores input or a built-in rule \
              (geo3k, exact_match, format)"
            ]
        );
        assert_eq!(problems(&[], &[], true).len(), 1);
    }
}
