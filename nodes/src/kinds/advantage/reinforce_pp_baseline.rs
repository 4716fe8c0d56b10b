//! `advantage.reinforce_pp_baseline`: REINFORCE++ with a group baseline (verl
//! `compute_reinforce_plus_plus_baseline_outcome_advantage`): (s − mean_g) per uid group
//! (singleton: mean 0), broadcast over the response tokens, then whitened over the batch.

use flowrl_algorithms::AdvantageEstimator;

use crate::kinds::advantage::support::{AdvantageKind, AdvantageNode, advantage_inputs, no_checks};

/// The `advantage.reinforce_pp_baseline` kind.
pub const REINFORCE_PP_BASELINE: AdvantageKind = AdvantageKind {
    name: "advantage.reinforce_pp_baseline",
    doc: "REINFORCE++-baseline advantages (verl): score minus the prompt-group mean, whitened over \
          the batch.",
    inputs: advantage_inputs,
    params: Vec::new,
    ignored: &[],
    checks: no_checks,
    build: |_| {
        Ok(AdvantageNode::boxed(
            AdvantageEstimator::ReinforcePlusPlusBaseline,
        ))
    },
};

flowrl_engine::register_node_kind!(REINFORCE_PP_BASELINE);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::advantage::support::advantage_batch;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;

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
        let mut node = REINFORCE_PP_BASELINE
            .build(&params(serde_json::json!({})), &build_ctx("a"))
            .unwrap();
        let mut c = ctx("a");
        node.run(&inputs("a", SCORES, s), &mut c).unwrap();
        assert!(metric(&c, "critic/advantages/mean").abs() < 1e-6);
    }
}
