//! `reward.format`: the geo3k format term alone: 1 when the response is
//! `<think>…</think>…\boxed{…}…` (verl geo3k `format_reward`), else 0.

use flowrl_algorithms::rewards::BuiltinReward;

use crate::kinds::reward::support::builtin_reward_kind;

builtin_reward_kind!(
    /// The `reward.format` kind.
    FormatRewardKind,
    "reward.format",
    "Format reward: 1 when the response is <think>…</think> followed by a \\boxed{…} answer \
     (verl geo3k format_reward), else 0.",
    BuiltinReward::Format
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;

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
        node.run(&inputs("f", ROLLOUTS, (*r).clone()), &mut c)
            .unwrap();
        assert!((metric(&c, "critic/score/mean") - 1.0 / 3.0).abs() < 1e-6);
        assert_eq!(metric(&c, "critic/score/max"), 1.0);
    }
}
