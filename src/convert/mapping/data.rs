//! The prompts and their responses: `[nodes.data]` (verl's `data.*`: files, batch, prompt
//! length and truncation, column names, shuffling, image resizing) and `[nodes.rollout]`
//! (`actor_rollout_ref.rollout.*`: responses per prompt, length, sampling).

use super::mapper::{Mapper, t_f64, t_str, t_strs};
use super::{Plan, ROLLOUT, Section};

/// `[nodes.data]`.
pub(super) fn data(m: &mut Mapper, p: &Plan) {
    let dk = "dataset.parquet";
    let mut data = Section::node("data", dk, "");
    data.set("model", t_str("policy"), "");
    match p.train_files.as_slice() {
        [one] => data.set("path", t_str(one), "data.train_files"),
        many => data.set("paths", t_strs(many), "data.train_files"),
    }
    if let Some(first) = p.val_files.first() {
        data.set("val_path", t_str(first), "data.val_files");
        if p.val_files.len() > 1 {
            m.not_carried(
                "data.val_files",
                format!("one validation file only: {first} is used"),
            );
        }
    }
    data.set(
        "batch_size",
        p.gen_batch.to_string(),
        if p.filter && m.int("data.gen_batch_size").is_some() {
            "data.gen_batch_size"
        } else {
            "data.train_batch_size"
        },
    );
    if let Some(len) = m.int("data.max_prompt_length") {
        data.set(
            "max_prompt_length",
            len.to_string(),
            "data.max_prompt_length",
        );
    }
    if let Some(f) = m.v("data.filter_overlong_prompts").as_bool() {
        data.set(
            "filter_overlong_prompts",
            f.to_string(),
            "data.filter_overlong_prompts",
        );
    }
    match m.text("data.truncation").as_deref() {
        Some(t @ ("error" | "left" | "right")) => {
            data.set("truncation", t_str(t), "data.truncation")
        }
        Some(other) => m.not_carried(
            "data.truncation",
            format!("truncation `{other}` is not supported (error, left or right); error used"),
        ),
        None => {}
    }
    m.str_param(&mut data, dk, "prompt_key", "data.prompt_key");
    let image_key = m.text("data.image_key").unwrap_or_default();
    m.str_param(&mut data, dk, "image_key", "data.image_key");
    m.str_param(&mut data, dk, "data_source_key", "data.reward_fn_key");
    if let Some(b) = m.v("data.shuffle").as_bool()
        && !b
    {
        data.set("shuffle", "false".into(), "data.shuffle");
    }
    if !image_key.is_empty()
        && let Some(patch) = m.int("data.image_patch_size")
    {
        data.set(
            "verl_image_patch_size",
            patch.to_string(),
            "data.image_patch_size",
        );
    }
    m.sections.push(data);
}

/// `[nodes.rollout]`: `n` responses per prompt, sampled (temperature, top-p, top-k) or greedy;
/// multi-turn with tools when verl's `multi_turn` is on ([`super::tools`]).
pub(super) fn rollout(m: &mut Mapper, p: &Plan) {
    let (rk, from) = match p.turns {
        Some(_) => ("rollout.multi_turn", format!("{ROLLOUT}.multi_turn.enable")),
        None => ("rollout", String::new()),
    };
    let mut rollout = Section::node("rollout", rk, &from);
    rollout.set("model", t_str("policy"), "");
    rollout.inputs(&[("prompts", "data.prompts")]);
    let n = m.int(&format!("{ROLLOUT}.n")).unwrap_or(1);
    rollout.set("n", n.to_string(), &format!("{ROLLOUT}.n"));
    rollout.set(
        "max_new_tokens",
        p.response_length.to_string(),
        &format!("{ROLLOUT}.response_length"),
    );
    m.int_param(
        &mut rollout,
        rk,
        "max_num_batched_tokens",
        &format!("{ROLLOUT}.max_num_batched_tokens"),
    );
    if m.v(&format!("{ROLLOUT}.do_sample")).as_bool() == Some(false) {
        rollout.set(
            "greedy",
            "true".into(),
            &format!("{ROLLOUT}.do_sample = false"),
        );
    } else {
        rollout.set(
            "temperature",
            t_f64(p.temperature),
            &format!("{ROLLOUT}.temperature"),
        );
        m.float_param(&mut rollout, rk, "top_p", &format!("{ROLLOUT}.top_p"));
        m.int_param(&mut rollout, rk, "top_k", &format!("{ROLLOUT}.top_k"));
    }
    match &p.turns {
        Some(turns) => {
            turns.write(&mut rollout);
            m.sections.push(rollout);
            m.sections.extend(turns.tool_sections("rollout"));
        }
        None => m.sections.push(rollout),
    }
}
