//! `reward.length_penalty`: a drop-in for `reward.geo3k` (Rollouts in, Scores out).
//! score = acc − penalty · max(0, tokens − max_tokens), acc = 1 when the response contains
//! `\boxed{<ground truth>}`, else 0.

use flowrl_engine::{BuildContext, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec};
use flowrl_engine::{Params, Port, PortSpec, StepContext};
use flowrl_nodes::kinds::reward::support::log_score_metrics;
use flowrl_nodes::values::port_types;
use flowrl_nodes::{RolloutBatch, ScoreBatch};

/// The ports: a name and flowrl's value type (port type and Rust type of the values), declared
/// once.
const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);
const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);

pub struct LengthPenaltyKind;

impl NodeKind for LengthPenaltyKind {
    fn name(&self) -> &str {
        "reward.length_penalty"
    }
    fn doc(&self) -> &str {
        "1 when the response boxes the ground truth, minus `penalty` per token past `max_tokens`."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![ROLLOUTS.spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![SCORES.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        LengthPenalty::param_specs()
    }
    fn timing_key(&self) -> Option<&str> {
        Some("reward")
    }
    fn build(&self, params: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(params.parse::<LengthPenalty>()?))
    }
}

/// The parameters, which are also the node: each field is a key of the node's table.
#[derive(serde::Deserialize, Params)]
struct LengthPenalty {
    /// tokens allowed for free
    #[param(default = 12, gt = 0)]
    max_tokens: usize,
    /// cost of each extra token
    #[param(default = 0.05, min = 0)]
    penalty: f64,
}

impl Node for LengthPenalty {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        let rollouts = inputs.get_arc(ROLLOUTS)?;
        let (mut scores, mut acc) = (Vec::new(), Vec::new());
        for (i, tokens) in rollouts.response_lengths().into_iter().enumerate() {
            let boxed = format!("\\boxed{{{}}}", rollouts.ground_truth[i].trim());
            let a = f64::from(u8::from(rollouts.response_text[i].contains(&boxed)));
            let over = tokens.saturating_sub(self.max_tokens) as f64;
            scores.push((a - self.penalty * over) as f32);
            acc.push(a as f32);
        }
        let components = [("acc".to_string(), acc)].into();
        let batch = ScoreBatch {
            rollouts,
            scores,
            components,
        };
        log_score_metrics(ctx, &batch); // critic/score/*, critic/rewards/*, critic/score/acc/mean
        Ok(Outputs::new().with_opaque(SCORES, batch)) // ScoreBatch is not Serialize
    }
}
