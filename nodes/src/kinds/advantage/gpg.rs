//! `advantage.gpg`: GPG (verl `compute_gpg_outcome_advantage`): A = α·(s − mean_g)/f_norm per
//! uid group (a singleton's mean is 0), with α = B / max(#responses with a non-zero score, 1);
//! no std normalisation; broadcast over the response tokens.
//!
//! verl's function takes an `alpha` argument and overwrites it with the α above, so `alpha` is
//! accepted and ignored with a warning. `f_norm` is the function's (verl's trainer leaves it at
//! 1).

use flowrl_algorithms::compute_gpg_outcome_advantage;
use flowrl_engine::{ParamSchema, ParamSpec, Params};
use serde::Deserialize;

use crate::kinds::advantage::support::{
    AdvantageKind, EstimatorNode, Ignored, advantage_inputs, no_checks, with_ignored,
};

const IGNORED: &[Ignored] = &[
    Ignored {
        key: "alpha",
        why: "verl's compute_gpg_outcome_advantage overwrites it with B / (number of responses \
              with a non-zero score)",
    },
    Ignored {
        key: "norm_adv_by_std_in_grpo",
        why: "GPG subtracts the group mean and never divides by a std",
    },
    Ignored {
        key: "gamma",
        why: "GPG is an outcome estimator (no discounting)",
    },
    Ignored {
        key: "lam",
        why: "GPG is an outcome estimator (no GAE)",
    },
];

#[derive(Deserialize, Params)]
struct GpgParams {
    /// divides the advantages (verl compute_gpg_outcome_advantage f_norm)
    #[param(default = 1.0, gt = 0.0)]
    f_norm: f64,
}

/// The `advantage.gpg` kind.
pub const GPG: AdvantageKind = AdvantageKind {
    name: "advantage.gpg",
    doc: "GPG advantages (verl): α·(score − group mean)/f_norm per prompt uid, α = batch size / \
          number of responses with a non-zero score.",
    inputs: advantage_inputs,
    params: || {
        with_ignored(GpgParams::param_specs(), IGNORED, |key| {
            (key == "alpha").then(|| ParamSpec::float("alpha").default(1.0))
        })
    },
    ignored: IGNORED,
    checks: no_checks,
    build: |params| {
        let p: GpgParams = params.parse()?;
        Ok(EstimatorNode::boxed(move |_, scores, batch| {
            Ok(compute_gpg_outcome_advantage(
                batch,
                &scores.rollouts.uid,
                p.f_norm,
            )?)
        }))
    },
};

flowrl_engine::register_node_kind!(GPG);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;

    #[test]
    fn scaled_by_the_inverse_share_of_nonzero_scores() {
        // One of four responses scores: α = 4, mean 0.25.
        let s = scores(&[1.0, 0.0, 0.0, 0.0], &["a"; 4], &[1, 1, 1, 1]);
        let p = params(serde_json::json!({"f_norm": 2.0}));
        let mut node = GPG.build(&p, &build_ctx("adv")).unwrap();
        let mut c = ctx("adv");
        node.run(&inputs("adv", SCORES, s), &mut c).unwrap();
        assert_eq!(metric(&c, "critic/advantages/max"), 1.5);
        assert_eq!(metric(&c, "critic/advantages/min"), -0.5);
    }
}
