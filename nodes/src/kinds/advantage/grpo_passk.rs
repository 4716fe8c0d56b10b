//! `advantage.grpo_passk`: pass@k GRPO (verl `compute_grpo_passk_outcome_advantage`): per uid
//! group (at least 2 responses), only the best response gets an advantage, r1 − r2 (the gap to
//! the second best), divided by (group std + 1e-6) when `norm_adv_by_std_in_grpo`; every other
//! response gets 0. Broadcast over the response tokens. A group of one response is an error, as
//! in verl ("Pass@k requires at least 2 samples per group").
//!
//! verl reads `norm_adv_by_std_in_grpo` from the algorithm configuration here (and ignores the
//! function's argument of that name), so the graph's value is the one used.

use flowrl_algorithms::compute_grpo_passk_outcome_advantage;
use flowrl_engine::{Diagnostic, ParamSchema, Params, ValidateCtx};
use serde::Deserialize;

use crate::kinds::advantage::support::{
    AdvantageKind, EstimatorNode, Ignored, advantage_inputs, with_ignored,
};
use crate::kinds::validate::upstream_rollout_n;

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

#[derive(Deserialize, Params)]
struct PassKParams {
    /// divide the gap by the group std + ε (verl reads algorithm.norm_adv_by_std_in_grpo)
    #[param(default = true)]
    norm_adv_by_std_in_grpo: bool,
}

/// The `advantage.grpo_passk` kind.
pub const GRPO_PASSK: AdvantageKind = AdvantageKind {
    name: "advantage.grpo_passk",
    doc: "Pass@k GRPO advantages (verl): per prompt uid only the best response gets the gap to the \
          second best (divided by the group std + ε with norm_adv_by_std_in_grpo); others get 0.",
    inputs: advantage_inputs,
    params: || with_ignored(PassKParams::param_specs(), IGNORED, |_| None),
    ignored: IGNORED,
    checks: at_least_two_per_prompt,
    build: |params| {
        let p: PassKParams = params.parse()?;
        Ok(EstimatorNode::boxed(move |_, scores, batch| {
            Ok(compute_grpo_passk_outcome_advantage(
                batch,
                &scores.rollouts.uid,
                EPSILON,
                p.norm_adv_by_std_in_grpo,
            )?)
        }))
    },
};

/// An error when the rollout upstream samples fewer than 2 responses per prompt.
fn at_least_two_per_prompt(ctx: &ValidateCtx, _kind: &str) -> Vec<Diagnostic> {
    let mut out = Vec::new();
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

flowrl_engine::register_node_kind!(GRPO_PASSK);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;

    #[test]
    fn the_best_response_gets_the_gap() {
        let s = scores(&[1.0, 0.25, 0.0, 0.0], &["a", "a", "b", "b"], &[1, 1, 1, 1]);
        let p = params(serde_json::json!({"norm_adv_by_std_in_grpo": false}));
        let mut node = GRPO_PASSK.build(&p, &build_ctx("adv")).unwrap();
        let mut c = ctx("adv");
        node.run(&inputs("adv", SCORES, s), &mut c).unwrap();
        assert_eq!(metric(&c, "critic/advantages/max"), 0.75);
        assert_eq!(metric(&c, "critic/advantages/min"), 0.0);
        let single = scores(&[1.0], &["a"], &[1]);
        let e = node
            .run(&inputs("adv", SCORES, single), &mut ctx("adv"))
            .err()
            .expect("an error");
        assert!(e.to_string().contains("Pass@k requires at least 2"), "{e}");
    }
}
