//! `advantage.reinforce_pp`: REINFORCE++ (verl `compute_reinforce_plus_plus_outcome_advantage`):
//! discounted returns G_t = r_t + γ·G_{t+1} over the response tokens (right to left), whitened
//! over the whole batch (mean 0, unbiased std 1 over valid tokens); `returns` are G before
//! whitening. No grouping by uid. Needs at least 2 valid tokens in the batch.

use anyhow::Result;
use flowrl_algorithms::AdvantageEstimator;
use flowrl_engine::{BuildContext, Node, NodeKind, ParamSpec, Params, PortSpec};
use serde::Deserialize;

use crate::advantage_support::{AdvantageNode, advantage_inputs, advantage_outputs};

/// The `advantage.reinforce_pp` kind.
pub struct ReinforcePpAdvantageKind;

#[derive(Deserialize)]
struct ReinforcePpParams {
    gamma: f64,
}

impl NodeKind for ReinforcePpAdvantageKind {
    fn name(&self) -> &str {
        "advantage.reinforce_pp"
    }
    fn doc(&self) -> &str {
        "REINFORCE++ advantages (verl): discounted returns whitened over the batch."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        advantage_inputs()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        advantage_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec::float("gamma")
                .default(1.0)
                .min(0.0)
                .max(1.0)
                .doc("discount factor γ (verl algorithm.gamma)"),
        ]
    }
    fn timing_key(&self) -> Option<&str> {
        Some("adv")
    }
    fn build(&self, params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: ReinforcePpParams = params.parse()?;
        Ok(Box::new(AdvantageNode {
            estimator: AdvantageEstimator::ReinforcePlusPlus { gamma: p.gamma },
        }))
    }
}

flowrl_engine::register_node_kind!(ReinforcePpAdvantageKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advantage_support::advantage_batch;
    use crate::advantage_support::test_support::scores;
    use crate::reward_support::test_support::*;

    #[test]
    fn discounted_returns_then_whitened() {
        let s = scores(&[1.0, 0.0], &["a", "b"], &[2, 1]);
        let adv =
            advantage_batch(&s, AdvantageEstimator::ReinforcePlusPlus { gamma: 0.5 }).unwrap();
        // Returns: row 0 = [0.5, 1.0], row 1 = [0, pad].
        assert_eq!(adv.returns.data, vec![0.5, 1.0, 0.0, 0.0]);
        let valid = [
            adv.advantages.data[0],
            adv.advantages.data[1],
            adv.advantages.data[2],
        ];
        let mean: f32 = valid.iter().sum::<f32>() / 3.0;
        let var: f32 = valid.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / 2.0;
        assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-4, "{valid:?}");
        assert_eq!(adv.advantages.data[3], 0.0);

        let mut node = ReinforcePpAdvantageKind
            .build(&params(serde_json::json!({"gamma": 0.5})), &build_ctx("a"))
            .unwrap();
        let mut c = ctx("a");
        node.run(&inputs("a", "scores", SCORES, s), &mut c).unwrap();
        assert_eq!(metric(&c, "critic/returns/max"), 1.0);
        // One valid token cannot be whitened: a clear error.
        let one = scores(&[1.0], &["a"], &[1]);
        assert!(
            advantage_batch(&one, AdvantageEstimator::ReinforcePlusPlus { gamma: 1.0 }).is_err()
        );
    }
}
