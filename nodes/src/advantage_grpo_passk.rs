//! `advantage.grpo_passk`: pass@k GRPO (verl `compute_grpo_passk_outcome_advantage`): per uid
//! group (at least 2 responses), only the best response gets an advantage, r1 − r2 (the gap to
//! the second best), divided by (group std + 1e-6) when `norm_adv_by_std_in_grpo`; every other
//! response gets 0. Broadcast over the response tokens. A group of one response is an error, as
//! in verl ("Pass@k requires at least 2 samples per group").
//!
//! verl reads `norm_adv_by_std_in_grpo` from the algorithm configuration here (and ignores the
//! function's argument of that name), so the graph's value is the one used.

use anyhow::Result;
use flowrl_algorithms::compute_grpo_passk_outcome_advantage;
use flowrl_engine::{
    BuildContext, Diagnostic, Node, NodeKind, ParamSpec, Params, PortSpec, ValidateCtx,
};
use serde::Deserialize;

use crate::advantage_support::{
    EstimatorNode, Ignored, advantage_inputs, advantage_outputs, algorithm_option, ignored_params,
    warn_ignored,
};
use crate::validate::upstream_rollout_n;

/// The `advantage.grpo_passk` kind.
pub struct GrpoPassKAdvantageKind;

const IGNORED: &[Ignored] = &[
    Ignored {
        key: "gamma",
        why: "pass@k GRPO is an outcome estimator (no discounting)",
    },
    Ignored {
        key: "lam",
        why: "pass@k GRPO is an outcome estimator (no GAE)",
    },
];

/// verl's epsilon (the trainer never passes another).
const EPSILON: f64 = 1e-6;

#[derive(Deserialize)]
struct PassKParams {
    norm_adv_by_std_in_grpo: bool,
}

impl NodeKind for GrpoPassKAdvantageKind {
    fn name(&self) -> &str {
        "advantage.grpo_passk"
    }
    fn doc(&self) -> &str {
        "Pass@k GRPO advantages (verl): per prompt uid only the best response gets the gap to the \
         second best (divided by the group std + ε with norm_adv_by_std_in_grpo); others get 0."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        advantage_inputs()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        advantage_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        let mut p = vec![algorithm_option("norm_adv_by_std_in_grpo").doc(
            "divide the gap by the group std + ε (verl reads algorithm.norm_adv_by_std_in_grpo)",
        )];
        p.extend(ignored_params(IGNORED, |_| None));
        p
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let mut out = warn_ignored(ctx, self.name(), IGNORED);
        if let Some(n) = upstream_rollout_n(ctx)
            && n < 2
        {
            out.push(ctx.error(
                "inputs.scores",
                format!(
                    "pass@k GRPO needs at least 2 responses per prompt, but the rollout upstream has n = {n}"
                ),
            ));
        }
        out
    }
    fn timing_key(&self) -> Option<&str> {
        Some("adv")
    }
    fn build(&self, params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: PassKParams = params.parse()?;
        Ok(EstimatorNode::boxed(move |_, scores, batch| {
            Ok(compute_grpo_passk_outcome_advantage(
                batch,
                &scores.rollouts.uid,
                EPSILON,
                p.norm_adv_by_std_in_grpo,
            )?)
        }))
    }
}

flowrl_engine::register_node_kind!(GrpoPassKAdvantageKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advantage_support::test_support::scores;
    use crate::reward_support::test_support::*;

    #[test]
    fn the_best_response_gets_the_gap() {
        let s = scores(&[1.0, 0.25, 0.0, 0.0], &["a", "a", "b", "b"], &[1, 1, 1, 1]);
        let p = params(serde_json::json!({"norm_adv_by_std_in_grpo": false}));
        let mut node = GrpoPassKAdvantageKind.build(&p, &build_ctx("adv")).unwrap();
        let mut c = ctx("adv");
        node.run(&inputs("adv", "scores", SCORES, s), &mut c)
            .unwrap();
        assert_eq!(metric(&c, "critic/advantages/max"), 0.75);
        assert_eq!(metric(&c, "critic/advantages/min"), 0.0);
        let single = scores(&[1.0], &["a"], &[1]);
        let e = node
            .run(&inputs("adv", "scores", SCORES, single), &mut ctx("adv"))
            .err()
            .expect("an error");
        assert!(e.to_string().contains("Pass@k requires at least 2"), "{e}");
    }
}
