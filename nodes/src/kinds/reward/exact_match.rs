//! `reward.exact_match`: 1 when the last `\boxed{}` content (or the whole stripped response
//! when there is no box) equals the stripped ground truth exactly, else 0
//! (`flowrl_algorithms::rewards::exact_match_reward`; no normalisation).

use flowrl_algorithms::rewards::BuiltinReward;

use crate::kinds::reward::support::builtin_reward_kind;

builtin_reward_kind!(
    /// The `reward.exact_match` kind.
    ExactMatchRewardKind,
    "reward.exact_match",
    "Exact match: 1 when the last \\boxed{} content (or the whole response if unboxed) equals \
     the ground truth after stripping whitespace, else 0.",
    BuiltinReward::ExactMatch
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;

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
        node.run(&inputs("em", ROLLOUTS, (*r).clone()), &mut c)
            .unwrap();
        assert!((metric(&c, "critic/score/mean") - 2.0 / 3.0).abs() < 1e-6);
        assert_eq!(metric(&c, "critic/score/min"), 0.0);
    }
}
