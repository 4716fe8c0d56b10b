//! `reward.combined`: a weighted sum of the built-in rule-based rewards,
//! score = Σ wᵢ·rᵢ over `weights = { geo3k = …, exact_match = …, format = … }` (absent or 0
//! weights leave a reward out). Every included reward is logged unweighted as
//! `critic/score/<name>/mean` (and geo3k's parts as `critic/score/geo3k/acc/mean`, …).

use anyhow::Result;
use flowrl_algorithms::rewards::{BuiltinReward, CombinedReward, RewardFunction};
use flowrl_engine::{
    BuildContext, Diagnostic, Node, NodeKind, ParamSchema, ParamSpec, Params, PortSpec, ValidateCtx,
};
use serde::Deserialize;

use crate::kinds::reward::support::{RewardNode, reward_inputs, reward_outputs};

/// The `reward.combined` kind.
pub struct CombinedRewardKind;

#[derive(Deserialize, Params)]
struct CombinedParams {
    /// weight per reward, e.g. { geo3k = 1.0, format = 0.5 }
    #[param(required)]
    weights: Weights,
}

/// One weight per built-in reward (0: left out).
#[derive(Deserialize, Params)]
struct Weights {
    /// weight of `geo3k`
    #[param(default = 0.0)]
    geo3k: f64,
    /// weight of `exact_match`
    #[param(default = 0.0)]
    exact_match: f64,
    /// weight of `format`
    #[param(default = 0.0)]
    format: f64,
}

impl CombinedParams {
    /// The rewards with a non-zero weight, by their `BuiltinReward` names.
    fn weights(&self) -> Vec<(&'static str, f64)> {
        let w = &self.weights;
        [
            ("geo3k", w.geo3k),
            ("exact_match", w.exact_match),
            ("format", w.format),
        ]
        .into_iter()
        .filter(|&(_, w)| w != 0.0)
        .collect()
    }
}

impl NodeKind for CombinedRewardKind {
    fn name(&self) -> &str {
        "reward.combined"
    }
    fn doc(&self) -> &str {
        "Weighted sum of rule-based rewards (geo3k, exact_match, format); each component is \
         logged unweighted as critic/score/<name>/mean."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        reward_inputs()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        reward_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        CombinedParams::param_specs()
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let p = match ctx.parse::<CombinedParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        if p.weights().is_empty() {
            vec![ctx.error(
                "weights",
                "reward.combined needs at least one non-zero weight (geo3k, exact_match, format)",
            )]
        } else {
            Vec::new()
        }
    }
    fn timing_key(&self) -> Option<&str> {
        Some("reward")
    }
    /// A few numbers per row on the host: nothing the plan counts.
    fn footprint(&self, _: &flowrl_engine::PlanCtx) -> Option<flowrl_engine::Footprint> {
        Some(flowrl_engine::Footprint::default())
    }

    fn build(&self, params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let parts = params
            .parse::<CombinedParams>()?
            .weights()
            .into_iter()
            .map(|(name, w)| {
                BuiltinReward::from_name(name).map(|r| (w, Box::new(r) as Box<dyn RewardFunction>))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(RewardNode {
            reward: Box::new(CombinedReward::new(parts)?),
        }))
    }
}

flowrl_engine::register_node_kind!(CombinedRewardKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::reward::support::test_support::*;

    #[test]
    fn weighted_sum_and_component_metrics() {
        let r = rollouts(
            &["<think>t</think> \\boxed{0.5}", "\\boxed{7}"],
            &["\\frac{1}{2}", "7"],
            &["a", "a"],
            &[2, 2],
        );
        let p = params(
            serde_json::json!({"weights": {"geo3k": 1.0, "exact_match": 0.5, "format": 0.0}}),
        );
        let mut node = CombinedRewardKind.build(&p, &build_ctx("c")).unwrap();
        let mut c = ctx("c");
        node.run(&inputs("c", ROLLOUTS, (*r).clone()), &mut c)
            .unwrap();
        // Row 0: geo3k 1.0, exact 0 → 1.0. Row 1: geo3k 0.9, exact 1 → 1.4.
        assert!((metric(&c, "critic/score/mean") - 1.2).abs() < 1e-6);
        assert!((metric(&c, "critic/score/geo3k/mean") - 0.95).abs() < 1e-6);
        assert!((metric(&c, "critic/score/exact_match/mean") - 0.5).abs() < 1e-6);
        assert!((metric(&c, "critic/score/geo3k/format/mean") - 0.5).abs() < 1e-6);
        assert!(
            c.metrics()
                .iter()
                .all(|(n, _)| !n.starts_with("critic/score/format"))
        );
    }

    #[test]
    fn all_zero_weights_cannot_build() {
        let p = params(serde_json::json!({"weights": {"geo3k": 0.0}}));
        assert!(CombinedRewardKind.build(&p, &build_ctx("c")).is_err());
    }
}
