//! The reward stage: the reward kind for the data (verl picks a scorer per row by
//! `data_source`; flowrl judges it from the training files' names), DAPO's overlong shaping
//! (`[nodes.overlong]`, only with verl's dapo reward manager, as in verl) and the group filter
//! (`[nodes.filter]`, `algorithm.filter_groups`), which repeats data → rollout → reward until
//! the batch is full.

use super::mapper::{Mapper, t_f64, t_str, t_strs};
use super::{Plan, Section, Wiring};

/// The overlong buffer's key prefix when the shaping node is to be written; notes a reward
/// manager flowrl does not have, and an overlong buffer that verl would not apply.
pub(super) fn overlong_prefix(m: &mut Mapper) -> Option<&'static str> {
    let manager = manager_name(m);
    let overlong_on = m.flag("reward_model.overlong_buffer.enable")
        || m.flag("reward.reward_kwargs.overlong_buffer_cfg.enable");
    let prefix = if m.flag("reward.reward_kwargs.overlong_buffer_cfg.enable") {
        "reward.reward_kwargs.overlong_buffer_cfg"
    } else {
        "reward_model.overlong_buffer"
    };
    if !matches!(manager.as_str(), "naive" | "dapo" | "batch" | "prime") {
        m.not_carried(
            "reward_model.reward_manager",
            format!("reward manager `{manager}` is not supported: the data source's rule-based scorer is used"),
        );
    }
    let overlong = overlong_on && manager == "dapo";
    if overlong_on && !overlong {
        m.not_carried(
            &format!("{prefix}.enable"),
            format!("verl applies the overlong buffer in its dapo reward manager only; with `{manager}` it is off here too"),
        );
    }
    overlong.then_some(prefix)
}

/// The reward manager's name, under verl's three names for it: `reward.reward_manager.name`
/// (the newest), `reward_manager.name`, `reward_model.reward_manager` (the oldest). verl's
/// defaults now hold `reward.reward_manager.name = naive` and a null `reward_model.reward_manager`
/// (which verl's `migrate_legacy_reward_impl` copies over when set), so the name the input chose
/// wins, in that order; else the first that has a value.
fn manager_name(m: &Mapper) -> String {
    let keys = [
        "reward.reward_manager.name",
        "reward_manager.name",
        "reward_model.reward_manager",
    ];
    keys.iter()
        .filter(|key| m.cfg.set.contains(**key))
        .find_map(|key| m.text(key))
        .or_else(|| keys.iter().find_map(|key| m.text(key)))
        .unwrap_or_else(|| "naive".into())
}

/// The reward kind for verl's default scorer of the data, judged from the training files'
/// names (verl picks the scorer per row by `data_source`).
fn reward_kind(files: &[String]) -> Option<&'static str> {
    let all = files.join(" ").to_ascii_lowercase();
    (all.contains("geo3k") || all.contains("geometry3k") || all.contains("shapes"))
        .then_some("reward.geo3k")
}

/// verl's reward model, when the configuration enables one: the key that enables it and the
/// model's path (`reward.reward_model.*`, or the older `reward_model.*`).
fn reward_model(m: &Mapper) -> Option<(&'static str, Option<String>)> {
    if m.flag("reward.reward_model.enable") {
        return Some((
            "reward.reward_model.enable",
            m.text("reward.reward_model.model_path"),
        ));
    }
    m.flag("reward_model.enable")
        .then(|| ("reward_model.enable", m.text("reward_model.model.path")))
}

/// `[models.reward_model]` and `[nodes.reward]` of kind `reward.model` for verl's reward model
/// when its directory holds a score head (a discriminative model, whose score replaces the
/// rule reward as verl's `rm_scores` do); `None`, with a note, when it does not or cannot be
/// read here: a generative reward model's verdict format lives in its reward loop, which the
/// converter cannot see.
fn reward_model_sections(m: &mut Mapper, key: &str, path: Option<String>) -> Option<[Section; 2]> {
    let Some(path) = path else {
        m.not_carried(key, "no model path is given: the rule reward is written");
        return None;
    };
    let dir = flowrl_models::hub::resolve_model_path(std::path::Path::new(&path));
    match dir.as_deref().map(flowrl_models::value_head::stored_head) {
        Ok(Ok(Some(_))) => {}
        Ok(Ok(None)) => {
            m.not_carried(
                key,
                format!(
                    "{path} has no score head (value_head.safetensors or score.weight): a \
                     generative reward model's verdicts depend on its reward loop; write a \
                     reward.judge with its prompt template instead. The rule reward is written"
                ),
            );
            return None;
        }
        _ => {
            m.not_carried(
                key,
                format!(
                    "{path} cannot be read here to tell a score-head reward model (reward.model) \
                     from a generative one (reward.judge): convert where the model is, or write \
                     the reward node by hand. The rule reward is written"
                ),
            );
            return None;
        }
    }
    let mut model = Section::new("models.reward_model");
    model.set("path", t_str(&path), "reward model path");
    model.set("value_head", "true".into(), "a score head in the directory");
    model.set("trainable", "false".into(), "");
    let mut node = Section::node("reward", "reward.model", key);
    node.set("model", t_str("reward_model"), "");
    node.inputs(&[("rollouts", "rollout.rollouts")]);
    Some([model, node])
}

/// `[nodes.reward]`, then `[nodes.overlong]` and `[nodes.filter]` when the plan has them;
/// returns where the scores and rollouts are read from after them.
pub(super) fn reward(m: &mut Mapper, p: &Plan) -> Wiring {
    let model_sections =
        reward_model(m).and_then(|(key, path)| reward_model_sections(m, key, path));
    match model_sections {
        Some(sections) => m.sections.extend(sections),
        None => {
            let reward_kind = reward_kind(&p.train_files).unwrap_or_else(|| {
                m.not_carried(
                    "data.train_files",
                    "verl scores each row with the default scorer of its data_source; flowrl has built-in geo3k, exact_match and format rewards only: reward.geo3k is written, replace it (or use an `exec` node) if the data is not geo3k-style",
                );
                "reward.geo3k"
            });
            let mut reward = Section::node("reward", reward_kind, "data source's default scorer");
            reward.inputs(&[("rollouts", "rollout.rollouts")]);
            m.sections.push(reward);
        }
    }
    finish_reward(m, p)
}

/// The shaping and filter nodes after `[nodes.reward]`.
fn finish_reward(m: &mut Mapper, p: &Plan) -> Wiring {
    let mut scores = "reward.scores".to_string();
    let mut repeat = vec!["data", "rollout", "reward"];
    if let Some(prefix) = p.overlong {
        let s = overlong(m, p, prefix, &scores);
        m.sections.push(s);
        scores = "overlong.scores".into();
        repeat.push("overlong");
    }
    let mut rollouts = "rollout.rollouts".to_string();
    if p.filter {
        let s = filter(m, p, &repeat, &scores);
        m.sections.push(s);
        scores = "filter.scores".into();
        rollouts = "filter.rollouts".into();
    }
    Wiring { scores, rollouts }
}

/// `[nodes.overlong]`: DAPO's soft overlong penalty on `scores`, from the buffer at `prefix`.
fn overlong(m: &mut Mapper, p: &Plan, prefix: &str, scores: &str) -> Section {
    let mut s = Section::node("overlong", "reward.overlong", &format!("{prefix}.enable"));
    s.inputs(&[("scores", scores)]);
    let len = m.int(&format!("{prefix}.len")).unwrap_or(1).max(1);
    s.set("len", len.to_string(), &format!("{prefix}.len"));
    let pf = m.float(&format!("{prefix}.penalty_factor")).unwrap_or(1.0);
    s.set(
        "penalty_factor",
        t_f64(pf),
        &format!("{prefix}.penalty_factor"),
    );
    let max_len = m
        .int("reward.reward_kwargs.max_resp_len")
        .unwrap_or(p.response_length);
    s.set(
        "max_response_length",
        max_len.to_string(),
        "data.max_response_length",
    );
    s
}

/// `[nodes.filter]`: DAPO's group filter on `scores`, repeating the `repeat` nodes until
/// `data.train_batch_size` groups are kept.
fn filter(m: &mut Mapper, p: &Plan, repeat: &[&str], scores: &str) -> Section {
    let mut s = Section::node("filter", "filter.groups", "algorithm.filter_groups.enable");
    let list: Vec<String> = repeat.iter().map(|r| r.to_string()).collect();
    s.set("repeat", t_strs(&list), "");
    s.inputs(&[("scores", scores)]);
    match m.text("algorithm.filter_groups.metric") {
        Some(metric) => s.set("metric", t_str(&metric), "algorithm.filter_groups.metric"),
        None => m.not_carried(
            "algorithm.filter_groups.metric",
            "null: verl needs a metric; flowrl's default `acc` is used",
        ),
    }
    s.set(
        "batch_size",
        p.train_batch.to_string(),
        "data.train_batch_size",
    );
    let max = m
        .int("algorithm.filter_groups.max_num_gen_batches")
        .unwrap_or(0)
        .max(0);
    s.set(
        "max_num_gen_batches",
        max.to_string(),
        "algorithm.filter_groups.max_num_gen_batches",
    );
    s
}
