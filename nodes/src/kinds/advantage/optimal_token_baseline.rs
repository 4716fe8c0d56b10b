//! `advantage.optimal_token_baseline`: the optimal token baseline (verl
//! `compute_optimal_token_baseline_advantage`): a baseline per response position, weighted by
//! the old policy's cumulative path variance. With π_t = exp(old log-prob), S_t = Σ_v π_v² and
//! G_t the reward-to-go (the score at every valid token):
//! w_t = 1 − 2π_t + S_t, W_t = Σ_{t' ≤ t} w_{t'}·m_{t'}, and per uid group of ≥ 2 responses
//! B_t = Σ_i G_{i,t}·W_{i,t}·m_{i,t} / (Σ_i W_{i,t}·m_{i,t} + ε) (a singleton: B = 0);
//! `advantages` = (G − B)·mask, `returns` = G. With `handle_zero_tail` the only longest response
//! of a group keeps B = 0 beyond the second longest length. See
//! `flowrl_algorithms::advantage::optimal_token_baseline`.
//!
//! **Inputs.** Besides the scores, `old_log_probs` from a `logprob` node on the policy with
//! `sum_pi_squared = true` (verl: `actor.calculate_sum_pi_squared = True`), which carries S_t
//! next to the log-probs; `flowrl validate` checks that flag. verl's rollout importance-sampling
//! weights (`rollout_is_weights`, ρ² scaling w_t) are not produced by any flowrl node yet, so
//! the baseline is formed without them.
//!
//! `advantage.tir_optimal_token_baseline` (its own file) is the multi-turn variant on the same
//! inputs and parameters.

use anyhow::{Result, anyhow, ensure};
use flowrl_algorithms::{
    HostAdvantages, OTB_EPSILON, PathVariance, TokenRewards,
    compute_multi_turn_optimal_token_baseline_advantage, compute_optimal_token_baseline_advantage,
};
use flowrl_engine::{
    Diagnostic, Node, ParamSchema, ParamSpec, Params, Port, PortSpec, ValidateCtx,
};
use serde::Deserialize;

use crate::kinds::advantage::support::{
    AdvantageKind, EstimatorNode, Ignored, advantage_inputs, with_ignored,
};
use crate::values::{ScoreBatch, TokenLogProbs, TokenMatrix, port_types};

/// The `advantage.optimal_token_baseline` kind.
pub const OPTIMAL_TOKEN_BASELINE: AdvantageKind = AdvantageKind {
    name: "advantage.optimal_token_baseline",
    doc: "Optimal-token-baseline advantages (verl): reward-to-go minus a per-position baseline \
          of the uid group weighted by the old policy's cumulative path variance (needs \
          old_log_probs with sum_pi_squared).",
    inputs: otb_inputs,
    params: otb_params,
    ignored: OTB_IGNORED,
    checks: otb_checks,
    build: |params| otb_build(params, false),
};

/// The verl options both optimal-token-baseline kinds ignore.
pub(crate) const OTB_IGNORED: &[Ignored] = &[
    Ignored {
        key: "norm_adv_by_std_in_grpo",
        why: "the optimal token baseline never divides by a std",
    },
    Ignored {
        key: "gamma",
        why: "the optimal token baseline uses the undiscounted reward-to-go",
    },
    Ignored {
        key: "lam",
        why: "the optimal token baseline is not GAE",
    },
];

/// The parameters of both kinds (verl's function defaults).
#[derive(Deserialize, Params)]
struct OtbParams {
    /// the only longest response of a group gets no baseline beyond the second longest length
    /// (verl handle_zero_tail)
    #[param(default = true)]
    handle_zero_tail: bool,
    /// added to the baseline's denominator Σ W
    #[param(default = OTB_EPSILON, min = 0.0)]
    epsilon: f64,
}

/// The old policy's log-probs (with Σπ²), the input both kinds add.
pub(crate) const OLD_LOG_PROBS: Port<TokenLogProbs> =
    Port::new("old_log_probs", port_types::TOKEN_LOG_PROBS);

/// The ports of both optimal-token-baseline kinds: the advantage inputs and `old_log_probs`.
pub(crate) fn otb_inputs() -> Vec<PortSpec> {
    let mut inputs = advantage_inputs();
    inputs.push(OLD_LOG_PROBS.spec().doc(
        "old-policy log-probs with Σπ² (a `logprob` node on the policy with sum_pi_squared = \
         true)",
    ));
    inputs
}

/// The parameters of both kinds: [`OtbParams`] and the ignored options.
pub(crate) fn otb_params() -> Vec<ParamSpec> {
    with_ignored(OtbParams::param_specs(), OTB_IGNORED, |_| None)
}

/// What the producer of `old_log_probs` says about Σπ²: a `logprob` node's `sum_pi_squared`
/// switch (absent on producers without one, which are not checked).
#[derive(Deserialize)]
struct SumPiSquared {
    sum_pi_squared: Option<bool>,
}

/// An error when `old_log_probs` comes from a `logprob` node that does not output Σπ².
pub(crate) fn otb_checks(ctx: &ValidateCtx, kind: &str) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    if let Some(lp) = ctx.input(OLD_LOG_PROBS.name())
        && let Ok(SumPiSquared {
            sum_pi_squared: Some(false),
        }) = lp.params().parse()
    {
        out.push(ctx.error(
            "inputs.old_log_probs",
            format!(
                "`{kind}` needs Σπ² of the old policy: set `sum_pi_squared = true` on logprob \
                 node `{}` (verl: actor.calculate_sum_pi_squared = True)",
                lp.name()
            ),
        ));
    }
    out
}

/// A `[B, T]` matrix of the scored batch as f64, checked against its shape.
fn host_matrix(what: &str, m: &TokenMatrix, scores: &ScoreBatch) -> Result<Vec<f64>> {
    let want = scores.rollouts.response_mask.shape();
    ensure!(
        m.shape() == want,
        "{what} {:?} do not match the scored rollouts {want:?}",
        m.shape()
    );
    Ok(m.data.iter().map(|&x| x as f64).collect())
}

/// Builds the node of either kind.
pub(crate) fn otb_build(params: &Params, multi_turn: bool) -> Result<Box<dyn Node>> {
    let p: OtbParams = params.parse()?;
    Ok(EstimatorNode::boxed(
        move |inputs, scores, batch: TokenRewards<'_>| -> Result<HostAdvantages> {
            let lp = inputs.get(OLD_LOG_PROBS)?;
            let sq = lp.sum_pi_squared.as_ref().ok_or_else(|| {
                anyhow!(
                    "the old log-probs carry no Σπ²: set `sum_pi_squared = true` on the logprob \
                     node wired to `old_log_probs`"
                )
            })?;
            let old = host_matrix("old log-probs", &lp.log_probs, scores)?;
            let sq = host_matrix("Σπ²", sq, scores)?;
            let policy = PathVariance {
                old_log_probs: &old,
                sum_pi_squared: &sq,
                rollout_is_weights: None,
            };
            let uid = &scores.rollouts.uid;
            Ok(if multi_turn {
                compute_multi_turn_optimal_token_baseline_advantage(
                    batch,
                    uid,
                    policy,
                    p.handle_zero_tail,
                    p.epsilon,
                )?
            } else {
                compute_optimal_token_baseline_advantage(
                    batch,
                    uid,
                    policy,
                    p.handle_zero_tail,
                    p.epsilon,
                )?
            })
        },
    ))
}

flowrl_engine::register_node_kind!(OPTIMAL_TOKEN_BASELINE);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;
    use flowrl_engine::{Inputs, Payload, Value};

    /// Scores plus old log-probs with π = 1/2 and Σπ² = 1/2 at every valid token (w = 1/2).
    pub(crate) fn otb_inputs_for(s: &ScoreBatch, with_sq: bool) -> Inputs {
        let [b, t] = s.rollouts.response_mask.shape();
        let mask = &s.rollouts.response_mask.data;
        let lp: Vec<f32> = mask.iter().map(|&m| m * 0.5f32.ln()).collect();
        let sq: Vec<f32> = mask.iter().map(|&m| m * 0.5).collect();
        let lp = TokenLogProbs {
            log_probs: TokenMatrix::new(lp, b, t).unwrap(),
            entropy: None,
            sum_pi_squared: with_sq.then(|| TokenMatrix::new(sq, b, t).unwrap()),
        };
        let mut i = inputs("adv", SCORES, s.clone());
        i.insert(
            OLD_LOG_PROBS.name(),
            Value::new(OLD_LOG_PROBS.port_type(), Payload::opaque(lp)),
        );
        i
    }

    #[test]
    fn per_position_baseline_from_the_old_policy() {
        // Lengths 3 and 1 in one group: at t = 0 the baseline is the mean score 0.5.
        let s = scores(&[1.0, 0.0], &["a", "a"], &[3, 1]);
        let p = params(serde_json::json!({"handle_zero_tail": true, "epsilon": 1e-8}));
        let mut node = OPTIMAL_TOKEN_BASELINE.build(&p, &build_ctx("adv")).unwrap();
        let mut c = ctx("adv");
        node.run(&otb_inputs_for(&s, true), &mut c).unwrap();
        // Row 0: 0.5 at t = 0, then its zero tail keeps A = G = 1; row 1: −0.5.
        assert!((metric(&c, "critic/advantages/max") - 1.0).abs() < 1e-6);
        assert!((metric(&c, "critic/advantages/min") + 0.5).abs() < 1e-6);
        let e = node
            .run(&otb_inputs_for(&s, false), &mut ctx("adv"))
            .err()
            .expect("an error")
            .to_string();
        assert!(e.contains("sum_pi_squared = true"), "{e}");
    }
}
