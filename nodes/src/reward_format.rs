//! `reward.format`: the geo3k format term alone: 1 when the response is
//! `<think>…</think>…\boxed{…}…` (verl geo3k `format_reward`), else 0.

use anyhow::Result;
use flowrl_algorithms::rewards::BuiltinReward;
use flowrl_engine::{BuildContext, Node, NodeKind, ParamSpec, Params, PortSpec};

use crate::reward_support::{RewardNode, reward_inputs, reward_outputs};

/// The `reward.format` kind.
pub struct FormatRewardKind;

impl NodeKind for FormatRewardKind {
    fn name(&self) -> &str {
        "reward.format"
    }
    fn doc(&self) -> &str {
        "Format reward: 1 when the response is <think>…</think> followed by a \\boxed{…} answer \
         (verl geo3k format_reward), else 0."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        reward_inputs()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        reward_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        Vec::new()
    }
    fn timing_key(&self) -> Option<&str> {
        Some("reward")
    }
    fn build(&self, _params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        Ok(Box::new(RewardNode {
            reward: Box::new(BuiltinReward::Format),
        }))
    }
}

flowrl_engine::register_node_kind!(FormatRewardKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward_support::test_support::*;

    #[test]
    fn format_scores() {
        let r = rollouts(
            &[
                "<think>a</think> \\boxed{1}",
                " <think>a</think> \\boxed{1}",
                "<think>a</think>",
            ],
            &["1", "1", "1"],
            &["a", "a", "a"],
            &[1, 1, 1],
        );
        let mut node = FormatRewardKind
            .build(&params(serde_json::json!({})), &build_ctx("f"))
            .unwrap();
        let mut c = ctx("f");
        node.run(&inputs("f", "rollouts", ROLLOUTS, (*r).clone()), &mut c)
            .unwrap();
        assert!((metric(&c, "critic/score/mean") - 1.0 / 3.0).abs() < 1e-6);
        assert_eq!(metric(&c, "critic/score/max"), 1.0);
    }
}
