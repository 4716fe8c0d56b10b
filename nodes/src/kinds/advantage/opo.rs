//! `advantage.opo`: OPO (verl `compute_opo_outcome_advantage`): the score minus the
//! length-weighted mean score of its uid group, b = Σ n_i·s_i / Σ n_i (n_i the response lengths;
//! a singleton's baseline is 0); broadcast over the response tokens. No std normalisation.

use flowrl_algorithms::compute_opo_outcome_advantage;

use crate::kinds::advantage::support::{
    AdvantageKind, EstimatorNode, Ignored, advantage_inputs, ignored_params, no_checks,
};

const IGNORED: &[Ignored] = &[
    Ignored {
        key: "norm_adv_by_std_in_grpo",
        why: "OPO subtracts the length-weighted group mean and never divides by a std",
    },
    Ignored {
        key: "gamma",
        why: "OPO is an outcome estimator (no discounting)",
    },
    Ignored {
        key: "lam",
        why: "OPO is an outcome estimator (no GAE)",
    },
];

/// The `advantage.opo` kind.
pub const OPO: AdvantageKind = AdvantageKind {
    name: "advantage.opo",
    doc: "OPO advantages (verl): score minus the length-weighted mean score of the same prompt uid \
          (a singleton keeps its score).",
    inputs: advantage_inputs,
    params: || ignored_params(IGNORED, |_| None),
    ignored: IGNORED,
    checks: no_checks,
    build: |_| {
        Ok(EstimatorNode::boxed(|_, scores, batch| {
            Ok(compute_opo_outcome_advantage(batch, &scores.rollouts.uid)?)
        }))
    },
};

flowrl_engine::register_node_kind!(OPO);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;

    #[test]
    fn longer_responses_weigh_more_in_the_baseline() {
        // Lengths 3 and 1, scores 1 and 0: baseline 0.75.
        let s = scores(&[1.0, 0.0], &["a", "a"], &[3, 1]);
        let mut node = OPO
            .build(&params(serde_json::json!({})), &build_ctx("adv"))
            .unwrap();
        let mut c = ctx("adv");
        node.run(&inputs("adv", SCORES, s), &mut c).unwrap();
        assert_eq!(metric(&c, "critic/advantages/max"), 0.25);
        assert_eq!(metric(&c, "critic/advantages/min"), -0.75);
    }
}
