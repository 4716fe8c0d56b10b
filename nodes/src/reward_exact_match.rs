//! `reward.exact_match`: 1 when the last `\boxed{}` content (or the whole stripped response
//! when there is no box) equals the stripped ground truth exactly, else 0
//! (`flowrl_algorithms::rewards::exact_match_reward`; no normalisation).

use anyhow::Result;
use flowrl_algorithms::rewards::BuiltinReward;
use flowrl_engine::{BuildContext, Node, NodeKind, ParamSpec, Params, PortSpec};

use crate::reward_support::{RewardNode, reward_inputs, reward_outputs};

/// The `reward.exact_match` kind.
pub struct ExactMatchRewardKind;

impl NodeKind for ExactMatchRewardKind {
    fn name(&self) -> &str {
        "reward.exact_match"
    }
    fn doc(&self) -> &str {
        "Exact match: 1 when the last \\boxed{} content (or the whole response if unboxed) equals \
         the ground truth after stripping whitespace, else 0."
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
            reward: Box::new(BuiltinReward::ExactMatch),
        }))
    }
}

flowrl_engine::register_node_kind!(ExactMatchRewardKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward_support::test_support::*;

    #[test]
    fn exact_match_scores() {
        let r = rollouts(
            &["\\boxed{42}", "\\boxed{42.0}", " 42 "],
            &["42", "42", "42"],
            &["a", "a", "a"],
            &[1, 1, 1],
        );
        let mut node = ExactMatchRewardKind
            .build(&params(serde_json::json!({})), &build_ctx("em"))
            .unwrap();
        let mut c = ctx("em");
        node.run(&inputs("em", "rollouts", ROLLOUTS, (*r).clone()), &mut c)
            .unwrap();
        assert!((metric(&c, "critic/score/mean") - 2.0 / 3.0).abs() < 1e-6);
        assert_eq!(metric(&c, "critic/score/min"), 0.0);
    }
}
