//! `advantage.opo`: OPO (verl `compute_opo_outcome_advantage`): the score minus the
//! length-weighted mean score of its uid group, b = Σ n_i·s_i / Σ n_i (n_i the response lengths;
//! a singleton's baseline is 0); broadcast over the response tokens. No std normalisation.

use anyhow::Result;
use flowrl_algorithms::compute_opo_outcome_advantage;
use flowrl_engine::{
    BuildContext, Diagnostic, Node, NodeKind, ParamSpec, Params, PortSpec, ValidateCtx,
};

use crate::advantage_support::{
    EstimatorNode, Ignored, advantage_inputs, advantage_outputs, ignored_params, warn_ignored,
};

/// The `advantage.opo` kind.
pub struct OpoAdvantageKind;

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

impl NodeKind for OpoAdvantageKind {
    fn name(&self) -> &str {
        "advantage.opo"
    }
    fn doc(&self) -> &str {
        "OPO advantages (verl): score minus the length-weighted mean score of the same prompt uid \
         (a singleton keeps its score)."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        advantage_inputs()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        advantage_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        ignored_params(IGNORED, |_| None)
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        warn_ignored(ctx, self.name(), IGNORED)
    }
    fn timing_key(&self) -> Option<&str> {
        Some("adv")
    }
    fn build(&self, _params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        Ok(EstimatorNode::boxed(|_, scores, batch| {
            Ok(compute_opo_outcome_advantage(batch, &scores.rollouts.uid)?)
        }))
    }
}

flowrl_engine::register_node_kind!(OpoAdvantageKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advantage_support::test_support::scores;
    use crate::reward_support::test_support::*;

    #[test]
    fn longer_responses_weigh_more_in_the_baseline() {
        // Lengths 3 and 1, scores 1 and 0: baseline 0.75.
        let s = scores(&[1.0, 0.0], &["a", "a"], &[3, 1]);
        let mut node = OpoAdvantageKind
            .build(&params(serde_json::json!({})), &build_ctx("adv"))
            .unwrap();
        let mut c = ctx("adv");
        node.run(&inputs("adv", "scores", SCORES, s), &mut c)
            .unwrap();
        assert_eq!(metric(&c, "critic/advantages/max"), 0.25);
        assert_eq!(metric(&c, "critic/advantages/min"), -0.75);
    }
}
