//! `advantage.reinforce_pp_baseline`: REINFORCE++ with a group baseline (verl
//! `compute_reinforce_plus_plus_baseline_outcome_advantage`): (s − mean_g) per uid group
//! (singleton: mean 0), broadcast over the response tokens, then whitened over the batch.

use anyhow::Result;
use flowrl_algorithms::AdvantageEstimator;
use flowrl_engine::{BuildContext, Node, NodeKind, ParamSpec, Params, PortSpec};

use crate::advantage_support::{AdvantageNode, advantage_inputs, advantage_outputs};

/// The `advantage.reinforce_pp_baseline` kind.
pub struct ReinforcePpBaselineAdvantageKind;

impl NodeKind for ReinforcePpBaselineAdvantageKind {
    fn name(&self) -> &str {
        "advantage.reinforce_pp_baseline"
    }
    fn doc(&self) -> &str {
        "REINFORCE++-baseline advantages (verl): score minus the prompt-group mean, whitened over \
         the batch."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        advantage_inputs()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        advantage_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        Vec::new()
    }
    fn timing_key(&self) -> Option<&str> {
        Some("adv")
    }
    fn build(&self, _params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        Ok(Box::new(AdvantageNode {
            estimator: AdvantageEstimator::ReinforcePlusPlusBaseline,
        }))
    }
}

flowrl_engine::register_node_kind!(ReinforcePpBaselineAdvantageKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advantage_support::advantage_batch;
    use crate::advantage_support::test_support::scores;
    use crate::reward_support::test_support::*;

    #[test]
    fn group_centred_then_whitened() {
        let s = scores(&[1.0, 0.0, 1.0, 1.0], &["a", "a", "b", "b"], &[1, 1, 1, 1]);
        let adv = advantage_batch(&s, AdvantageEstimator::ReinforcePlusPlusBaseline).unwrap();
        // Centred: [0.5, −0.5, 0, 0]; whitened with unbiased std sqrt(1/6·... ) → symmetric.
        let d = &adv.advantages.data;
        assert!(
            (d[0] + d[1]).abs() < 1e-6 && d[0] > 0.0 && d[2].abs() < 1e-6 && d[3].abs() < 1e-6,
            "{d:?}"
        );
        let var: f32 = d.iter().map(|x| x * x).sum::<f32>() / 3.0;
        assert!((var - 1.0).abs() < 1e-4, "{d:?}");
        let mut node = ReinforcePpBaselineAdvantageKind
            .build(&params(serde_json::json!({})), &build_ctx("a"))
            .unwrap();
        let mut c = ctx("a");
        node.run(&inputs("a", "scores", SCORES, s), &mut c).unwrap();
        assert!(metric(&c, "critic/advantages/mean").abs() < 1e-6);
    }
}
