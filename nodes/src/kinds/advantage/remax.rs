//! `advantage.remax`: ReMax (verl `compute_remax_outcome_advantage`): REINFORCE with the reward
//! of the greedy response to the same prompt as the baseline. `returns` = G_t, the reward-to-go
//! (with the score on the last response token: the score at every valid token), and
//! `advantages` = G_t − b·mask, where b is the greedy response's score. No whitening.
//!
//! **Where the baseline comes from.** verl's trainer generates one extra greedy response per
//! prompt (`do_sample = False`), scores it with the same reward function and repeats that score
//! over the prompt's `n` samples as `reward_baselines`. A graph says the same with a second
//! rollout of the same prompts and a reward node for it, wired to `baseline_scores`:
//!
//! ```toml
//! [nodes.greedy]
//! kind = "rollout"
//! model = "policy"
//! inputs = { prompts = "data.prompts" }
//! greedy = true          # verl: do_sample = False
//! n = 1                  # one baseline per prompt
//! max_new_tokens = 16
//!
//! [nodes.greedy_reward]
//! kind = "reward.geo3k"
//! inputs = { rollouts = "greedy.rollouts" }
//!
//! [nodes.advantage]
//! kind = "advantage.remax"
//! inputs = { scores = "reward.scores", baseline_scores = "greedy_reward.scores" }
//! ```
//!
//! Each sampled response takes the baseline score of the greedy response with its prompt uid;
//! `flowrl validate` checks that the rollout behind `baseline_scores` is greedy with `n = 1`, and
//! a run fails if a uid has no greedy response or more than one.

use std::collections::HashMap;

use anyhow::{Result, anyhow, ensure};
use flowrl_algorithms::compute_remax_outcome_advantage;
use flowrl_engine::{Diagnostic, Port, ValidateCtx};

use crate::kinds::advantage::support::{
    AdvantageKind, EstimatorNode, Ignored, advantage_inputs, ignored_params,
};
use crate::kinds::validate::rollout_upstream;
use crate::values::{ScoreBatch, port_types};

/// The scores of the greedy responses, one per prompt.
const BASELINE_SCORES: Port<ScoreBatch> = Port::new("baseline_scores", port_types::SCORES);

const IGNORED: &[Ignored] = &[
    Ignored {
        key: "norm_adv_by_std_in_grpo",
        why: "ReMax subtracts the greedy baseline and never divides by a std",
    },
    Ignored {
        key: "gamma",
        why: "verl's ReMax sums the rewards undiscounted",
    },
    Ignored {
        key: "lam",
        why: "ReMax is an outcome estimator (no GAE)",
    },
];

/// The `advantage.remax` kind.
pub const REMAX: AdvantageKind = AdvantageKind {
    name: "advantage.remax",
    doc: "ReMax advantages (verl): reward-to-go minus the score of the greedy response to the same \
          prompt (`baseline_scores`: a greedy rollout with n = 1, scored by a reward node).",
    inputs: || {
        let mut inputs = advantage_inputs();
        inputs.push(BASELINE_SCORES.spec().doc(
            "scores of one greedy response per prompt (verl reward_baselines): a `rollout` with \
             greedy = true and n = 1 on the same prompts, then a reward node",
        ));
        inputs
    },
    params: || ignored_params(IGNORED, |_| None),
    ignored: IGNORED,
    checks: greedy_baseline_rollout,
    build: |_| {
        Ok(EstimatorNode::boxed(|inputs, scores, batch| {
            let baseline = inputs.get_arc(BASELINE_SCORES)?;
            let b = reward_baselines(scores, &baseline)?;
            Ok(compute_remax_outcome_advantage(batch, &b)?)
        }))
    },
};

/// The baseline of every response of `scores`: the score of the one response of `baseline` with
/// the same prompt uid.
pub fn reward_baselines(scores: &ScoreBatch, baseline: &ScoreBatch) -> Result<Vec<f64>> {
    baseline.check()?;
    let mut by_uid: HashMap<&str, f64> = HashMap::new();
    for (uid, &s) in baseline.rollouts.uid.iter().zip(&baseline.scores) {
        ensure!(
            by_uid.insert(uid, s as f64).is_none(),
            "ReMax baseline: prompt uid {uid:?} has more than one baseline response (the baseline \
             rollout must have n = 1)"
        );
    }
    scores
        .rollouts
        .uid
        .iter()
        .map(|uid| {
            by_uid.get(uid.as_str()).copied().ok_or_else(|| {
                anyhow!(
                    "ReMax baseline: no baseline response for prompt uid {uid:?} (wire \
                     `baseline_scores` to the scores of a greedy rollout of the same prompts)"
                )
            })
        })
        .collect()
}

/// Errors unless the rollout behind `baseline_scores` is greedy, with n = 1, and not the one
/// behind `scores`.
fn greedy_baseline_rollout(ctx: &ValidateCtx, _kind: &str) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let rollout_of = |port: &str| ctx.input(port).and_then(|n| rollout_upstream(&n));
    if let Some((greedy, p)) = rollout_of(BASELINE_SCORES.name()) {
        let name = greedy.name();
        if p.greedy != Some(true) {
            out.push(ctx.error(
                "inputs.baseline_scores",
                format!(
                    "the ReMax baseline must be the greedy response: set `greedy = true` on \
                     rollout node `{name}` (verl: do_sample = False)"
                ),
            ));
        }
        if let Some(n) = p.n
            && n != 1
        {
            out.push(ctx.error(
                "inputs.baseline_scores",
                format!(
                    "the ReMax baseline needs one response per prompt, but rollout node \
                     `{name}` has n = {n}"
                ),
            ));
        }
        if rollout_of("scores").is_some_and(|(s, _)| s.name() == name) {
            out.push(ctx.error(
                "inputs.baseline_scores",
                format!(
                    "`scores` and `baseline_scores` both come from rollout node `{name}`: the \
                     baseline needs its own greedy rollout"
                ),
            ));
        }
    }
    out
}

flowrl_engine::register_node_kind!(REMAX);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;
    use flowrl_engine::{Payload, Value};

    #[test]
    fn each_response_takes_its_prompts_greedy_score() {
        let sampled = scores(&[1.0, 0.0, 0.5], &["a", "b", "a"], &[2, 1, 1]);
        let greedy = scores(&[0.25, 1.0], &["b", "a"], &[1, 1]);
        assert_eq!(
            reward_baselines(&sampled, &greedy).unwrap(),
            vec![1.0, 0.25, 1.0]
        );

        let mut i = inputs("adv", SCORES, sampled.clone());
        i.insert(
            BASELINE_SCORES.name(),
            Value::new(BASELINE_SCORES.port_type(), Payload::opaque(greedy)),
        );
        let mut node = REMAX
            .build(&params(serde_json::json!({})), &build_ctx("adv"))
            .unwrap();
        let mut c = ctx("adv");
        node.run(&i, &mut c).unwrap();
        // Row 0: 1 − 1 = 0; row 1: 0 − 0.25; row 2: 0.5 − 1.
        assert_eq!(metric(&c, "critic/advantages/max"), 0.0);
        assert_eq!(metric(&c, "critic/advantages/min"), -0.5);
        assert_eq!(metric(&c, "critic/returns/max"), 1.0);

        let missing = scores(&[0.25], &["b"], &[1]);
        let e = reward_baselines(&sampled, &missing)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no baseline response for prompt uid \"a\""),
            "{e}"
        );
        let twice = scores(&[0.25, 0.5, 1.0], &["b", "b", "a"], &[1, 1, 1]);
        let e = reward_baselines(&sampled, &twice).unwrap_err().to_string();
        assert!(e.contains("more than one"), "{e}");
    }
}
