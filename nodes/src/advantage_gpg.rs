//! `advantage.gpg`: GPG (verl `compute_gpg_outcome_advantage`): A = α·(s − mean_g)/f_norm per
//! uid group (a singleton's mean is 0), with α = B / max(#responses with a non-zero score, 1);
//! no std normalisation; broadcast over the response tokens.
//!
//! verl's function takes an `alpha` argument and overwrites it with the α above, so `alpha` is
//! accepted and ignored with a warning. `f_norm` is the function's (verl's trainer leaves it at
//! 1).

use anyhow::Result;
use flowrl_algorithms::compute_gpg_outcome_advantage;
use flowrl_engine::{
    BuildContext, Diagnostic, Node, NodeKind, ParamSpec, Params, PortSpec, ValidateCtx,
};
use serde::Deserialize;

use crate::advantage_support::{
    EstimatorNode, Ignored, advantage_inputs, advantage_outputs, ignored_params, warn_ignored,
};

/// The `advantage.gpg` kind.
pub struct GpgAdvantageKind;

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

#[derive(Deserialize)]
struct GpgParams {
    f_norm: f64,
}

impl NodeKind for GpgAdvantageKind {
    fn name(&self) -> &str {
        "advantage.gpg"
    }
    fn doc(&self) -> &str {
        "GPG advantages (verl): α·(score − group mean)/f_norm per prompt uid, α = batch size / \
         number of responses with a non-zero score."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        advantage_inputs()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        advantage_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        let mut p = vec![
            ParamSpec::float("f_norm")
                .default(1.0)
                .gt(0.0)
                .doc("divides the advantages (verl compute_gpg_outcome_advantage f_norm)"),
        ];
        p.extend(ignored_params(IGNORED, |key| {
            (key == "alpha").then(|| ParamSpec::float("alpha").default(1.0))
        }));
        p
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        warn_ignored(ctx, self.name(), IGNORED)
    }
    fn timing_key(&self) -> Option<&str> {
        Some("adv")
    }
    fn build(&self, params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: GpgParams = params.parse()?;
        Ok(EstimatorNode::boxed(move |_, scores, batch| {
            Ok(compute_gpg_outcome_advantage(
                batch,
                &scores.rollouts.uid,
                p.f_norm,
            )?)
        }))
    }
}

flowrl_engine::register_node_kind!(GpgAdvantageKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advantage_support::test_support::scores;
    use crate::reward_support::test_support::*;

    #[test]
    fn scaled_by_the_inverse_share_of_nonzero_scores() {
        // One of four responses scores: α = 4, mean 0.25.
        let s = scores(&[1.0, 0.0, 0.0, 0.0], &["a"; 4], &[1, 1, 1, 1]);
        let p = params(serde_json::json!({"f_norm": 2.0}));
        let mut node = GpgAdvantageKind.build(&p, &build_ctx("adv")).unwrap();
        let mut c = ctx("adv");
        node.run(&inputs("adv", "scores", SCORES, s), &mut c)
            .unwrap();
        assert_eq!(metric(&c, "critic/advantages/max"), 1.5);
        assert_eq!(metric(&c, "critic/advantages/min"), -0.5);
    }
}
