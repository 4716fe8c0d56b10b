//! `advantage.grpo`: GRPO outcome advantages (verl `compute_grpo_outcome_advantage`):
//! A = (s − mean_g)/(std_g + ε) per uid group (unbiased std; singleton: mean 0, std 1), or
//! A = s − mean_g with `norm_by_std = false` (Dr.GRPO); broadcast over the response tokens.

use flowrl_algorithms::AdvantageEstimator;
use flowrl_engine::{ParamSchema, Params};
use serde::Deserialize;

use crate::kinds::advantage::support::{AdvantageKind, AdvantageNode, advantage_inputs, no_checks};

#[derive(Deserialize, Params)]
struct GrpoParams {
    /// divide by the group std (verl norm_adv_by_std_in_grpo); false = Dr.GRPO
    #[param(default = true)]
    norm_by_std: bool,
    /// added to the group std
    #[param(default = 1e-6, gt = 0.0)]
    epsilon: f64,
}

/// The `advantage.grpo` kind.
pub const GRPO: AdvantageKind = AdvantageKind {
    name: "advantage.grpo",
    doc: "GRPO advantages (verl): (score − group mean) / (group std + ε) per prompt uid; \
          norm_by_std = false is Dr.GRPO (score − group mean).",
    inputs: advantage_inputs,
    params: GrpoParams::param_specs,
    ignored: &[],
    checks: no_checks,
    build: |params| {
        let p: GrpoParams = params.parse()?;
        Ok(AdvantageNode::boxed(AdvantageEstimator::Grpo {
            norm_by_std: p.norm_by_std,
            epsilon: p.epsilon,
        }))
    },
};

flowrl_engine::register_node_kind!(GRPO);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::advantage::support::advantage_batch;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;

    #[test]
    fn grpo_and_dr_grpo_per_uid_group() {
        // Interleaved groups a = {1, 0}, b = {0.5} (singleton).
        let s = scores(&[1.0, 0.5, 0.0], &["a", "b", "a"], &[2, 3, 1]);
        let adv = advantage_batch(&s, AdvantageEstimator::GRPO).unwrap();
        let a = 0.5 / (std::f64::consts::FRAC_1_SQRT_2 + 1e-6);
        let single = 0.5 / (1.0 + 1e-6);
        let want = [a, a, 0.0, single, single, single, -a, 0.0, 0.0];
        for (g, w) in adv.advantages.data.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{:?}", adv.advantages.data);
        }
        assert_eq!(adv.returns, adv.advantages);
        let dr = advantage_batch(&s, AdvantageEstimator::DR_GRPO).unwrap();
        assert_eq!(dr.advantages.row(0), &[0.5, 0.5, 0.0]);
        assert_eq!(dr.advantages.row(1), &[0.5, 0.5, 0.5]);

        let p = params(serde_json::json!({"norm_by_std": true, "epsilon": 1e-6}));
        let mut node = GRPO.build(&p, &build_ctx("adv")).unwrap();
        let mut c = ctx("adv");
        node.run(&inputs("adv", SCORES, s), &mut c).unwrap();
        assert!((metric(&c, "critic/advantages/max") - a).abs() < 1e-5);
        assert!((metric(&c, "critic/returns/min") + a).abs() < 1e-5);
    }

    #[test]
    fn nan_score_is_a_clear_error() {
        let s = scores(&[f32::NAN, 0.0], &["a", "a"], &[1, 1]);
        let e = advantage_batch(&s, AdvantageEstimator::GRPO)
            .unwrap_err()
            .to_string();
        assert!(e.contains("non-finite score"), "{e}");
    }
}
