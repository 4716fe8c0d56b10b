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
    BuildContext, Diagnostic, Node, NodeKind, ParamSpec, Params, PortSpec, PortType, ValidateCtx,
};
use serde::Deserialize;

use crate::advantage_support::{
    EstimatorNode, Ignored, advantage_inputs, advantage_outputs, ignored_params, warn_ignored,
};
use crate::values::{ScoreBatch, TokenLogProbs, TokenMatrix, port_types};

/// The `advantage.optimal_token_baseline` kind.
pub struct OptimalTokenBaselineAdvantageKind;

const IGNORED: &[Ignored] = &[
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

#[derive(Deserialize)]
struct OtbParams {
    handle_zero_tail: bool,
    epsilon: f64,
}

/// The ports of both optimal-token-baseline kinds: the advantage inputs and `old_log_probs`.
pub(crate) fn otb_inputs() -> Vec<PortSpec> {
    let mut inputs = advantage_inputs();
    inputs.push(
        PortSpec::new("old_log_probs", PortType::new(port_types::TOKEN_LOG_PROBS)).doc(
            "old-policy log-probs with Σπ² (a `logprob` node on the policy with \
             sum_pi_squared = true)",
        ),
    );
    inputs
}

/// The parameters of both kinds (verl's function defaults).
pub(crate) fn otb_params() -> Vec<ParamSpec> {
    let mut p = vec![
        ParamSpec::bool("handle_zero_tail").default(true).doc(
            "the only longest response of a group gets no baseline beyond the second longest \
             length (verl handle_zero_tail)",
        ),
        ParamSpec::float("epsilon")
            .default(OTB_EPSILON)
            .min(0.0)
            .doc("added to the baseline's denominator Σ W"),
    ];
    p.extend(ignored_params(IGNORED, |_| None));
    p
}

/// Warnings for ignored options, and an error when `old_log_probs` comes from a `logprob` node
/// that does not output Σπ².
pub(crate) fn otb_validate(ctx: &ValidateCtx, kind: &str) -> Vec<Diagnostic> {
    let mut out = warn_ignored(ctx, kind, IGNORED);
    if let Some(lp) = ctx.input("old_log_probs")
        && lp.kind() == "logprob"
        && lp.params().get_bool("sum_pi_squared") != Some(true)
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
            let lp = inputs.get::<TokenLogProbs>("old_log_probs")?;
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

impl NodeKind for OptimalTokenBaselineAdvantageKind {
    fn name(&self) -> &str {
        "advantage.optimal_token_baseline"
    }
    fn doc(&self) -> &str {
        "Optimal-token-baseline advantages (verl): reward-to-go minus a per-position baseline \
         of the uid group weighted by the old policy's cumulative path variance (needs \
         old_log_probs with sum_pi_squared)."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        otb_inputs()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        advantage_outputs()
    }
    fn params(&self) -> Vec<ParamSpec> {
        otb_params()
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        otb_validate(ctx, self.name())
    }
    fn timing_key(&self) -> Option<&str> {
        Some("adv")
    }
    fn build(&self, params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        otb_build(params, false)
    }
}

flowrl_engine::register_node_kind!(OptimalTokenBaselineAdvantageKind);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::advantage_support::test_support::scores;
    use crate::reward_support::test_support::*;
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
        let mut i = inputs("adv", "scores", SCORES, s.clone());
        i.insert(
            "old_log_probs",
            Value::new(
                PortType::new(port_types::TOKEN_LOG_PROBS),
                Payload::opaque(lp),
            ),
        );
        i
    }

    #[test]
    fn per_position_baseline_from_the_old_policy() {
        // Lengths 3 and 1 in one group: at t = 0 the baseline is the mean score 0.5.
        let s = scores(&[1.0, 0.0], &["a", "a"], &[3, 1]);
        let p = params(serde_json::json!({"handle_zero_tail": true, "epsilon": 1e-8}));
        let mut node = OptimalTokenBaselineAdvantageKind
            .build(&p, &build_ctx("adv"))
            .unwrap();
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
