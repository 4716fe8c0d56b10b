//! `advantage.rloo`: RLOO outcome advantages (verl `compute_rloo_outcome_advantage`):
//! A = s·n/(n−1) − mean_g·n/(n−1) (the score minus the mean of the other group members);
//! a singleton keeps A = s (`vectorized = true` follows verl's vectorised variant: A = 0).

use flowrl_algorithms::AdvantageEstimator;
use flowrl_engine::{ParamSchema, Params};
use serde::Deserialize;

use crate::kinds::advantage::support::{AdvantageKind, AdvantageNode, advantage_inputs, no_checks};

#[derive(Deserialize, Params)]
struct RlooParams {
    /// singleton groups get 0 (verl compute_rloo_vectorized_outcome_advantage)
    #[param(default = false)]
    vectorized: bool,
}

/// The `advantage.rloo` kind.
pub const RLOO: AdvantageKind = AdvantageKind {
    name: "advantage.rloo",
    doc: "RLOO advantages (verl): score minus the mean of the other responses of the same prompt \
          uid; a singleton keeps its score (0 with vectorized = true, as verl's vectorised RLOO).",
    inputs: advantage_inputs,
    params: RlooParams::param_specs,
    ignored: &[],
    checks: no_checks,
    build: |params| {
        let p: RlooParams = params.parse()?;
        Ok(AdvantageNode::boxed(if p.vectorized {
            AdvantageEstimator::RlooVectorized
        } else {
            AdvantageEstimator::Rloo
        }))
    },
};

flowrl_engine::register_node_kind!(RLOO);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::advantage::support::advantage_batch;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;

    #[test]
    fn leave_one_out_and_singletons() {
        let s = scores(&[1.0, 0.0, 0.5, 3.0], &["a", "a", "a", "z"], &[1, 1, 1, 1]);
        let adv = advantage_batch(&s, AdvantageEstimator::Rloo).unwrap();
        // a: 1 − (0 + 0.5)/2 = 0.75, 0 − 0.75 = −0.75, 0.5 − 0.5 = 0; singleton z keeps 3.
        assert_eq!(adv.advantages.data, vec![0.75, -0.75, 0.0, 3.0]);
        let vec = advantage_batch(&s, AdvantageEstimator::RlooVectorized).unwrap();
        assert_eq!(vec.advantages.data, vec![0.75, -0.75, 0.0, 0.0]);

        let mut node = RLOO
            .build(
                &params(serde_json::json!({"vectorized": false})),
                &build_ctx("a"),
            )
            .unwrap();
        let mut c = ctx("a");
        node.run(&inputs("a", SCORES, s), &mut c).unwrap();
        assert_eq!(metric(&c, "critic/advantages/max"), 3.0);
    }
}
