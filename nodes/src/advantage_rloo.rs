//! `advantage.rloo`: RLOO outcome advantages (verl `compute_rloo_outcome_advantage`):
//! A = s·n/(n−1) − mean_g·n/(n−1) (the score minus the mean of the other group members);
//! a singleton keeps A = s (`vectorized = true` follows verl's vectorised variant: A = 0).

use anyhow::Result;
use flowrl_algorithms::AdvantageEstimator;
use flowrl_engine::{BuildContext, Node, NodeKind, ParamSpec, Params, PortSpec};
use serde::Deserialize;

use crate::advantage_support::{AdvantageNode, advantage_inputs, advantage_outputs};

/// The `advantage.rloo` kind.
pub struct RlooAdvantageKind;

#[derive(Deserialize)]
struct RlooParams {
    vectorized: bool,
}

impl NodeKind for RlooAdvantageKind {
    fn name(&self) -> &str {
        "advantage.rloo"
    }
    fn doc(&self) -> &str {
        "RLOO advantages (verl): score minus the mean of the other responses of the same prompt \
         uid; a singleton keeps its score (0 with vectorized = true, as verl's vectorised RLOO)."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        advantage_inputs()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        advantage_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec::bool("vectorized")
                .default(false)
                .doc("singleton groups get 0 (verl compute_rloo_vectorized_outcome_advantage)"),
        ]
    }
    fn timing_key(&self) -> Option<&str> {
        Some("adv")
    }
    fn build(&self, params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: RlooParams = params.parse()?;
        Ok(Box::new(AdvantageNode {
            estimator: if p.vectorized {
                AdvantageEstimator::RlooVectorized
            } else {
                AdvantageEstimator::Rloo
            },
        }))
    }
}

flowrl_engine::register_node_kind!(RlooAdvantageKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advantage_support::advantage_batch;
    use crate::advantage_support::test_support::scores;
    use crate::reward_support::test_support::*;

    #[test]
    fn leave_one_out_and_singletons() {
        let s = scores(&[1.0, 0.0, 0.5, 3.0], &["a", "a", "a", "z"], &[1, 1, 1, 1]);
        let adv = advantage_batch(&s, AdvantageEstimator::Rloo).unwrap();
        // a: 1 − (0 + 0.5)/2 = 0.75, 0 − 0.75 = −0.75, 0.5 − 0.5 = 0; singleton z keeps 3.
        assert_eq!(adv.advantages.data, vec![0.75, -0.75, 0.0, 3.0]);
        let vec = advantage_batch(&s, AdvantageEstimator::RlooVectorized).unwrap();
        assert_eq!(vec.advantages.data, vec![0.75, -0.75, 0.0, 0.0]);

        let mut node = RlooAdvantageKind
            .build(
                &params(serde_json::json!({"vectorized": false})),
                &build_ctx("a"),
            )
            .unwrap();
        let mut c = ctx("a");
        node.run(&inputs("a", "scores", SCORES, s), &mut c).unwrap();
        assert_eq!(metric(&c, "critic/advantages/max"), 3.0);
    }
}
