//! `advantage.tir_optimal_token_baseline`: the multi-turn optimal token baseline (verl
//! `compute_multi_turn_optimal_token_baseline_advantage`, registry name
//! `tir_optimal_token_baseline`): as `advantage.optimal_token_baseline`, but each response's
//! valid tokens are first compacted (tool-observation holes in the mask removed), the baseline is
//! formed per compacted token index k, b_k = Σ_i G'_{i,k}·W'_{i,k} / (Σ_i W'_{i,k} + ε), and
//! G' − b is scattered back to the valid positions; responses without a valid token join no
//! group. With masks without holes (every flowrl rollout today) both kinds give the same numbers.
//! Same inputs and parameters as `advantage.optimal_token_baseline`.

use crate::kinds::advantage::optimal_token_baseline::{
    OTB_IGNORED, otb_build, otb_checks, otb_inputs, otb_params,
};
use crate::kinds::advantage::support::AdvantageKind;

/// The `advantage.tir_optimal_token_baseline` kind.
pub const TIR_OPTIMAL_TOKEN_BASELINE: AdvantageKind = AdvantageKind {
    name: "advantage.tir_optimal_token_baseline",
    doc: "Multi-turn optimal-token-baseline advantages (verl): the optimal token baseline formed \
          per valid-token index, skipping the mask's holes (tool observations).",
    inputs: otb_inputs,
    params: otb_params,
    ignored: OTB_IGNORED,
    checks: otb_checks,
    build: |params| otb_build(params, true),
};

flowrl_engine::register_node_kind!(TIR_OPTIMAL_TOKEN_BASELINE);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::advantage::optimal_token_baseline::tests::otb_inputs_for;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;

    #[test]
    fn equals_the_plain_baseline_without_holes() {
        let s = scores(&[1.0, 0.0, 0.5], &["a", "a", "a"], &[3, 1, 2]);
        let p = params(serde_json::json!({"handle_zero_tail": true, "epsilon": 1e-8}));
        let mut plain = crate::kinds::advantage::optimal_token_baseline::OPTIMAL_TOKEN_BASELINE
            .build(&p, &build_ctx("adv"))
            .unwrap();
        let mut tir = TIR_OPTIMAL_TOKEN_BASELINE
            .build(&p, &build_ctx("adv"))
            .unwrap();
        let (mut a, mut b) = (ctx("adv"), ctx("adv"));
        plain.run(&otb_inputs_for(&s, true), &mut a).unwrap();
        tir.run(&otb_inputs_for(&s, true), &mut b).unwrap();
        assert_eq!(a.metrics(), b.metrics());
    }
}
