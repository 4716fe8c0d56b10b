//! The advantage estimator: verl's `algorithm.adv_estimator` → flowrl's advantage kind, its
//! inputs and options (`algorithm.gamma`, `lam`, `norm_adv_by_std_in_grpo`, GDPO's reward
//! keys), and ReMax's greedy baseline (`[nodes.baseline]`, `[nodes.baseline_reward]`).

use super::mapper::{Mapper, string_list, t_f64, t_str, t_strs};
use super::{Plan, ROLLOUT, Section};
use crate::convert::input::Value;

/// verl's estimator names → flowrl's advantage kinds.
fn estimator_kind(name: &str) -> Option<&'static str> {
    Some(match name {
        "gae" => "advantage.gae",
        "grpo" | "grpo_vectorized" => "advantage.grpo",
        "reinforce_plus_plus" => "advantage.reinforce_pp",
        "reinforce_plus_plus_baseline" => "advantage.reinforce_pp_baseline",
        "remax" => "advantage.remax",
        "rloo" | "rloo_vectorized" => "advantage.rloo",
        "opo" => "advantage.opo",
        "grpo_passk" => "advantage.grpo_passk",
        "gpg" => "advantage.gpg",
        "gdpo" => "advantage.gdpo",
        "optimal_token_baseline" => "advantage.optimal_token_baseline",
        "tir_optimal_token_baseline" => "advantage.tir_optimal_token_baseline",
        _ => return None,
    })
}

/// The advantage kind for `estimator`; `advantage.grpo`, with a note, when the registry has
/// none.
pub(super) fn kind(m: &mut Mapper, estimator: &str) -> &'static str {
    match estimator_kind(estimator) {
        Some(k) if m.registry.kind(k).is_some() => k,
        _ => {
            m.not_carried(
                "algorithm.adv_estimator",
                format!("no flowrl advantage kind for `{estimator}`; advantage.grpo written in its place"),
            );
            "advantage.grpo"
        }
    }
}

/// ReMax's greedy baseline: one greedy response per prompt, scored by a copy of the reward node.
pub(super) fn remax_baseline(m: &mut Mapper, p: &Plan) {
    if p.adv_kind != "advantage.remax" {
        return;
    }
    if p.filter {
        m.not_carried(
            "algorithm.filter_groups.enable",
            "remax with filter_groups: the greedy baseline is not repeated with the groups; convert without filter_groups",
        );
    }
    let mut b = Section::node("baseline", "rollout", "algorithm.adv_estimator = remax");
    b.set("model", t_str("policy"), "");
    b.inputs(&[("prompts", "data.prompts")]);
    b.set("greedy", "true".into(), "");
    b.set(
        "max_new_tokens",
        p.response_length.to_string(),
        &format!("{ROLLOUT}.response_length"),
    );
    m.sections.push(b);
    // The reward node's kind and parameters, on the baseline's responses.
    let reward = m
        .sections
        .iter()
        .find(|s| s.name == "nodes.reward")
        .expect("the reward stage writes [nodes.reward] first");
    let mut br = Section::new("nodes.baseline_reward");
    for e in reward.entries.iter().filter(|e| e.key != "inputs") {
        br.set(&e.key, e.value.clone(), "");
    }
    br.inputs(&[("rollouts", "baseline.rollouts")]);
    m.sections.push(br);
}

/// `[nodes.advantage]`, reading `scores` (and values, old log-probs or the baseline's scores
/// when the estimator needs them).
pub(super) fn advantage(m: &mut Mapper, p: &Plan, scores: &str) {
    let kind = p.adv_kind;
    let mut adv = Section::node("advantage", kind, "algorithm.adv_estimator");
    let mut inputs = vec![("scores", scores)];
    if p.gae {
        inputs.push(("values", "values.values"));
    }
    if p.otb() {
        inputs.push(("old_log_probs", "old.log_probs"));
    }
    if kind == "advantage.remax" {
        inputs.push(("baseline_scores", "baseline_reward.scores"));
    }
    adv.inputs(&inputs);
    match kind {
        "advantage.gae" => {
            adv.set(
                "gamma",
                t_f64(m.float("algorithm.gamma").unwrap_or(1.0)),
                "algorithm.gamma",
            );
            adv.set(
                "lam",
                t_f64(m.float("algorithm.lam").unwrap_or(1.0)),
                "algorithm.lam",
            );
        }
        "advantage.reinforce_pp" => {
            m.float_param(&mut adv, kind, "gamma", "algorithm.gamma");
        }
        "advantage.grpo" | "advantage.grpo_passk"
            if m.v("algorithm.norm_adv_by_std_in_grpo").as_bool() == Some(false) =>
        {
            // advantage.grpo names it norm_by_std, advantage.grpo_passk as verl does.
            let name = if kind == "advantage.grpo" {
                "norm_by_std"
            } else {
                "norm_adv_by_std_in_grpo"
            };
            adv.set(name, "false".into(), "algorithm.norm_adv_by_std_in_grpo");
        }
        "advantage.rloo" if p.estimator == "rloo_vectorized" => {
            adv.set(
                "vectorized",
                "true".into(),
                "algorithm.adv_estimator = rloo_vectorized",
            );
        }
        "advantage.gdpo" => gdpo(m, &mut adv),
        _ => {}
    }
    m.sections.push(adv);
}

/// GDPO's score components and their weights.
fn gdpo(m: &mut Mapper, adv: &mut Section) {
    let keys = string_list(m.v("algorithm.gdpo_reward_keys"));
    if keys.is_empty() {
        m.not_carried(
            "algorithm.adv_estimator",
            "gdpo needs algorithm.gdpo_reward_keys (the score components, e.g. [acc, format])",
        );
    } else {
        adv.set(
            "gdpo_reward_keys",
            t_strs(&keys),
            "algorithm.gdpo_reward_keys",
        );
    }
    if let Value::List(w) = m.v("algorithm.gdpo_reward_weights").clone() {
        let w: Vec<String> = w.iter().filter_map(Value::as_f64).map(t_f64).collect();
        adv.set(
            "gdpo_reward_weights",
            format!("[{}]", w.join(", ")),
            "algorithm.gdpo_reward_weights",
        );
    }
}
