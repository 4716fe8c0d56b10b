//! `advantage.gae`: PPO's generalised advantage estimation from the critic's values (verl
//! `compute_gae_advantage_return`, registry name `gae`; [`flowrl_algorithms::advantage::gae`]).
//!
//! Per response, right to left over the response tokens, with the score on the last token as
//! the token-level reward r_t (as every advantage kind places it) and the values V_t of a
//! `value` node:
//!
//! ```text
//! δ_t = r_t + γ·V_{t+1} − V_t        A_t = δ_t + γλ·A_{t+1}        R_t = A_t + V_t
//! ```
//!
//! (masked positions carry V and A through), then the advantages are whitened over the batch's
//! valid tokens (verl's `masked_whiten`); the returns R are the critic's regression targets
//! (`update.critic`). `gamma` and `lam` are verl's `algorithm.gamma` / `algorithm.lam`
//! (defaults 1.0 and 1.0).
//!
//! Ports: `scores: Scores`, `values: Values` (the critic's values of the scored rollouts,
//! before its update), optional `rollouts: Rollouts` → `advantages: Advantages` (advantages and
//! returns). Metrics: `critic/advantages/*`, `critic/returns/*` and verl's
//! `critic/vf_explained_var` = 1 − var(R − V) / (var(R) + 1e-5) over the valid tokens
//! (`compute_data_metrics`). Timing key `adv`.

use anyhow::Result;
use flowrl_algorithms::{compute_gae_advantage_return, explained_variance};
use flowrl_engine::{Inputs, Node, Outputs, ParamSchema, Port, StepContext};

use crate::kinds::advantage::support::{
    ADVANTAGES, AdvantageKind, Discount, HostRewards, advantage_inputs, advantage_output,
    log_advantage_metrics, no_checks, scores_input,
};
use crate::values::{TokenValues, port_types};

/// The critic's values of the scored rollouts.
const VALUES: Port<TokenValues> = Port::new("values", port_types::VALUES);

/// The `advantage.gae` kind.
pub const GAE: AdvantageKind = AdvantageKind {
    name: "advantage.gae",
    doc: "GAE advantages and returns from the critic's values (verl `gae`: δ_t = r_t + γ·V_{t+1} − \
          V_t, A_t = δ_t + γλ·A_{t+1}, returns A + V, advantages whitened over the batch).",
    inputs: || {
        let mut ports = advantage_inputs();
        ports.insert(
            1,
            VALUES
                .spec()
                .doc("the critic's values of the scored rollouts (a `value` node)"),
        );
        ports
    },
    params: Discount::param_specs,
    ignored: &[],
    checks: no_checks,
    build: |params| Ok(Box::new(GaeNode(params.parse()?))),
};

/// verl's `algorithm.gamma` and `algorithm.lam`.
struct GaeNode(Discount);

impl Node for GaeNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let scores = scores_input(inputs)?;
        let values = inputs.get(VALUES)?;
        values.check(&scores.rollouts)?;
        let host = HostRewards::of(&scores)?;
        let v: Vec<f64> = values.values.data.iter().map(|&x| x as f64).collect();
        let out = compute_gae_advantage_return(host.batch()?, &v, self.0.gamma, self.0.lam)?;
        let batch = advantage_output(scores.rollouts.clone(), out)?;
        log_advantage_metrics(ctx, &batch);
        let returns: Vec<f64> = batch.returns.data.iter().map(|&x| x as f64).collect();
        if let Some(ev) = explained_variance(&returns, &v, &host.mask) {
            ctx.metric("critic/vf_explained_var", ev);
        }
        Ok(Outputs::new().with(ADVANTAGES, batch))
    }
}

flowrl_engine::register_node_kind!(GAE);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use crate::values::TokenMatrix;
    use flowrl_engine::NodeKind;
    use flowrl_engine::{Payload, Value};

    #[test]
    fn gae_of_the_scores_and_values_with_returns_and_explained_variance() {
        // Two responses of lengths 2 and 3 (T = 3), scores on their last tokens.
        let s = scores(&[1.0, 0.5], &["a", "a"], &[2, 3]);
        let values = TokenValues {
            values: TokenMatrix::new(vec![0.5, 0.25, 0.0, 0.1, 0.2, 0.3], 2, 3).unwrap(),
        };
        let (gamma, lam) = (0.9, 0.8);
        let p = params(serde_json::json!({"gamma": gamma, "lam": lam}));
        let mut node = GAE.build(&p, &build_ctx("adv")).unwrap();
        let mut c = ctx("adv");
        let mut i = inputs("adv", SCORES, s);
        i.insert(
            VALUES.name(),
            Value::new(VALUES.port_type(), Payload::new(values)),
        );
        let out = node.run(&i, &mut c).unwrap();
        let adv = out.get_arc(ADVANTAGES).unwrap();
        // Row 0: t1: δ = 1 − 0.25; t0: δ = 0 + 0.9·0.25 − 0.5, A = δ + 0.72·0.75.
        let a01 = 0.75;
        let a00 = (0.9 * 0.25 - 0.5) + 0.72 * a01;
        // Row 1: t2: δ = 0.5 − 0.3; t1: δ = 0.9·0.3 − 0.2; t0: δ = 0.9·0.2 − 0.1.
        let a12 = 0.2;
        let a11 = (0.9 * 0.3 - 0.2) + 0.72 * a12;
        let a10 = (0.9 * 0.2 - 0.1) + 0.72 * a11;
        let want_ret = [a00 + 0.5, a01 + 0.25, a10 + 0.1, a11 + 0.2, a12 + 0.3];
        let got_ret = [0, 1, 3, 4, 5].map(|k| adv.returns.data[k] as f64);
        for (g, w) in got_ret.iter().zip(want_ret) {
            assert!((g - w).abs() < 1e-6, "{got_ret:?} vs {want_ret:?}");
        }
        // Whitened advantages: mean 0 over the valid tokens.
        let valid = [0, 1, 3, 4, 5].map(|k| adv.advantages.data[k] as f64);
        assert!(valid.iter().sum::<f64>().abs() < 1e-5, "{valid:?}");
        let ev = metric(&c, "critic/vf_explained_var");
        let want = flowrl_algorithms::explained_variance(
            &want_ret,
            &[0.5, 0.25, 0.1, 0.2, 0.3],
            &[1.0; 5],
        )
        .unwrap();
        assert!((ev - want).abs() < 1e-6, "{ev} vs {want}");
        assert!(c.metrics().iter().any(|(k, _)| k == "critic/returns/mean"));
    }
}
