//! `reward.geo3k`: verl's geo3k rule-based reward (`reward_score/geo3k.py`).
//!
//! score = (1 − f)·acc + f·format with f = `format_score` (verl: 0.1); acc grades the last
//! `\boxed{}` against the ground truth with the mathruler grader port
//! (`flowrl_algorithms::rewards::grade_answer`), format is 1 for `<think>…</think>…\boxed{…}`.
//! Components `acc` and `format` are logged as `critic/score/acc/mean`, `critic/score/format/mean`.

use anyhow::Result;
use flowrl_algorithms::rewards::{RewardFunction, RewardScore, acc_reward, format_reward};
use flowrl_engine::{BuildContext, Node, NodeKind, ParamSchema, ParamSpec, Params, PortSpec};
use serde::Deserialize;

use crate::kinds::reward::support::{RewardNode, reward_inputs, reward_outputs};

/// The `reward.geo3k` kind.
pub struct Geo3kRewardKind;

#[derive(Deserialize, Params)]
struct Geo3kParams {
    /// weight of the format term (verl geo3k: 0.1)
    #[param(default = 0.1, min = 0.0, max = 1.0)]
    format_score: f64,
}

/// geo3k with a configurable format weight.
struct Geo3k {
    format_score: f64,
}

impl RewardFunction for Geo3k {
    fn name(&self) -> &str {
        "geo3k"
    }

    fn score(&self, response: &str, ground_truth: &str) -> RewardScore {
        let acc = acc_reward(response, ground_truth);
        let format = format_reward(response);
        RewardScore {
            score: (1.0 - self.format_score) * acc + self.format_score * format,
            components: vec![("acc".into(), acc), ("format".into(), format)],
        }
    }
}

impl NodeKind for Geo3kRewardKind {
    fn name(&self) -> &str {
        "reward.geo3k"
    }
    fn doc(&self) -> &str {
        "geo3k reward (verl): (1 − format_score)·acc + format_score·format; acc grades the last \
         \\boxed{} against the ground truth (mathruler grader), format is <think>…</think>…\\boxed{…}."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        reward_inputs()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        reward_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        Geo3kParams::param_specs()
    }
    fn timing_key(&self) -> Option<&str> {
        Some("reward")
    }
    /// A few numbers per row on the host: nothing the plan counts.
    fn footprint(&self, _: &flowrl_engine::PlanCtx) -> Option<flowrl_engine::Footprint> {
        Some(flowrl_engine::Footprint::default())
    }

    fn build(&self, params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: Geo3kParams = params.parse()?;
        Ok(Box::new(RewardNode {
            reward: Box::new(Geo3k {
                format_score: p.format_score,
            }),
        }))
    }
}

flowrl_engine::register_node_kind!(Geo3kRewardKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::reward::support::score_rollouts;
    use crate::kinds::reward::support::test_support::*;

    #[test]
    fn scores_rollouts_and_logs_components() {
        let rollouts = rollouts(
            &[
                "<think>t</think> \\boxed{\\frac{1}{2}}",
                "\\boxed{0.5}",
                "<think>t</think> \\boxed{3}",
                "no answer",
            ],
            &["0.5", "\\frac{1}{2}", "2", "2"],
            &["a", "a", "b", "b"],
            &[3, 2, 4, 1],
        );
        let params = Params::from_map(
            serde_json::json!({"format_score": 0.1})
                .as_object()
                .unwrap()
                .clone(),
        );
        let mut node = Geo3kRewardKind
            .build(&params, &build_ctx("reward"))
            .unwrap();
        let mut c = ctx("reward");
        node.run(&inputs("reward", ROLLOUTS, (*rollouts).clone()), &mut c)
            .unwrap();
        let v = score_rollouts(&Geo3k { format_score: 0.1 }, rollouts).unwrap();
        assert_eq!(v.scores, vec![1.0, 0.9, 0.1, 0.0]);
        assert_eq!(v.components["acc"], vec![1.0, 1.0, 0.0, 0.0]);
        assert_eq!(v.components["format"], vec![1.0, 0.0, 1.0, 0.0]);
        assert!((metric(&c, "critic/score/mean") - 0.5).abs() < 1e-6);
        assert_eq!(metric(&c, "critic/score/max"), 1.0);
        assert_eq!(metric(&c, "critic/score/min"), 0.0);
        assert_eq!(metric(&c, "critic/score/acc/mean"), 0.5);
        assert_eq!(metric(&c, "critic/score/format/mean"), 0.5);
    }
}
