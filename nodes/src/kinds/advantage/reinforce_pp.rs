//! `advantage.reinforce_pp`: REINFORCE++ (verl `compute_reinforce_plus_plus_outcome_advantage`):
//! discounted returns G_t = r_t + γ·G_{t+1} over the response tokens (right to left), whitened
//! over the whole batch (mean 0, unbiased std 1 over valid tokens); `returns` are G before
//! whitening. No grouping by uid. Needs at least 2 valid tokens in the batch.

use flowrl_algorithms::AdvantageEstimator;
use flowrl_engine::{ParamSchema, Params};
use serde::Deserialize;

use crate::kinds::advantage::support::{AdvantageKind, AdvantageNode, advantage_inputs, no_checks};

#[derive(Deserialize, Params)]
struct ReinforcePpParams {
    /// discount factor γ (verl algorithm.gamma)
    #[param(default = 1.0, min = 0.0, max = 1.0)]
    gamma: f64,
}

/// The `advantage.reinforce_pp` kind.
pub const REINFORCE_PP: AdvantageKind = AdvantageKind {
    name: "advantage.reinforce_pp",
    doc: "REINFORCE++ advantages (verl): discounted returns whitened over the batch.",
    inputs: advantage_inputs,
    params: ReinforcePpParams::param_specs,
    ignored: &[],
    checks: no_checks,
    build: |params| {
        let p: ReinforcePpParams = params.parse()?;
        Ok(AdvantageNode::boxed(
            AdvantageEstimator::ReinforcePlusPlus { gamma: p.gamma },
        ))
    },
};

flowrl_engine::register_node_kind!(REINFORCE_PP);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::advantage::support::advantage_batch;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;

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

        let mut node = REINFORCE_PP
            .build(&params(serde_json::json!({"gamma": 0.5})), &build_ctx("a"))
            .unwrap();
        let mut c = ctx("a");
        node.run(&inputs("a", SCORES, s), &mut c).unwrap();
        assert_eq!(metric(&c, "critic/returns/max"), 1.0);
        // One valid token cannot be whitened: a clear error.
        let one = scores(&[1.0], &["a"], &[1]);
        assert!(
            advantage_batch(&one, AdvantageEstimator::ReinforcePlusPlus { gamma: 1.0 }).is_err()
        );
    }
}
