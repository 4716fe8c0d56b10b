//! `advantage.tir_optimal_token_baseline`: the multi-turn optimal token baseline (verl
//! `compute_multi_turn_optimal_token_baseline_advantage`, registry name
//! `tir_optimal_token_baseline`): as `advantage.optimal_token_baseline`, but each response's
//! valid tokens are first compacted (tool-observation holes in the mask removed), the baseline is
//! formed per compacted token index k, b_k = Σ_i G'_{i,k}·W'_{i,k} / (Σ_i W'_{i,k} + ε), and
//! G' − b is scattered back to the valid positions; responses without a valid token join no
//! group. With masks without holes (every flowrl rollout today) both kinds give the same numbers.
//! Same inputs and parameters as `advantage.optimal_token_baseline`.

use anyhow::Result;
use flowrl_engine::{
    BuildContext, Diagnostic, Node, NodeKind, ParamSpec, Params, PortSpec, ValidateCtx,
};

use crate::advantage_optimal_token_baseline::{otb_build, otb_inputs, otb_params, otb_validate};
use crate::advantage_support::advantage_outputs;

/// The `advantage.tir_optimal_token_baseline` kind.
pub struct TirOptimalTokenBaselineAdvantageKind;

impl NodeKind for TirOptimalTokenBaselineAdvantageKind {
    fn name(&self) -> &str {
        "advantage.tir_optimal_token_baseline"
    }
    fn doc(&self) -> &str {
        "Multi-turn optimal-token-baseline advantages (verl): the optimal token baseline formed \
         per valid-token index, skipping the mask's holes (tool observations)."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        otb_inputs()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        advantage_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        otb_params()
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        otb_validate(ctx, self.name())
    }
    fn timing_key(&self) -> Option<&str> {
        Some("adv")
    }
    fn build(&self, params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        otb_build(params, true)
    }
}

flowrl_engine::register_node_kind!(TirOptimalTokenBaselineAdvantageKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advantage_optimal_token_baseline::tests::otb_inputs_for;
    use crate::advantage_support::test_support::scores;
    use crate::reward_support::test_support::*;

    #[test]
    fn equals_the_plain_baseline_without_holes() {
        let s = scores(&[1.0, 0.0, 0.5], &["a", "a", "a"], &[3, 1, 2]);
        let p = params(serde_json::json!({"handle_zero_tail": true, "epsilon": 1e-8}));
        let mut plain = crate::advantage_optimal_token_baseline::OptimalTokenBaselineAdvantageKind
            .build(&p, &build_ctx("adv"))
            .unwrap();
        let mut tir = TirOptimalTokenBaselineAdvantageKind
            .build(&p, &build_ctx("adv"))
            .unwrap();
        let (mut a, mut b) = (ctx("adv"), ctx("adv"));
        plain.run(&otb_inputs_for(&s, true), &mut a).unwrap();
        tir.run(&otb_inputs_for(&s, true), &mut b).unwrap();
        assert_eq!(a.metrics(), b.metrics());
    }
}
