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
//!
//! [`log_score_metrics`]: crate::kinds::reward::support::log_score_metrics

mod node;

use anyhow::Result;
use flowrl_algorithms::rewards::BuiltinReward;
use flowrl_engine::diagnostic::did_you_mean;
use flowrl_engine::{
    BuildContext, Code, Diagnostic, Node, NodeKind, ParamField, ParamSchema, ParamSpec, ParamType,
    Params, PortSpec, ValidateCtx,
};
use serde::Deserialize;
use serde_json::Value as Json;

use crate::kinds::reward::support::{ROLLOUTS, SCORES, reward_outputs};
use node::{CombinedRewardNode, Term};

/// The `reward.combined` kind.
pub struct CombinedRewardKind;

/// The built-in rules a weight can name, as `BuiltinReward::from_name` reads them.
const BUILTIN_RULES: [&str; 3] = ["geo3k", "exact_match", "format"];

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

#[cfg(test)]
mod tests;
