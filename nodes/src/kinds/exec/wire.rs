//! The JSON forms of edge values in the exec-node protocol (docs/exec-protocol.md, "Values").
//!
//! Inputs are sent as the text-level view a reward function or filter needs (response texts,
//! ground truths, token ids, scores); pixel tensors are never sent. With `images = true` the
//! prompts' and tools' pictures are added as paths of PNG files ([`add_images`]). Outputs are the
//! per-response numbers only: flowrl attaches them to the batch of responses the node received
//! (the first required input of type Rollouts, Scores or Advantages), checks that there is exactly
//! one entry per response, and pads per-token rows to the batch's response length.
//!
//! What this module does not do: no process handling and no message framing (see `process` and
//! `protocol`).

use super::images::ImageFolder;
use crate::values::{
    AdvantageBatch, PromptBatch, RolloutBatch, ScoreBatch, TokenLogProbs, TokenMatrix, port_types,
};
use flowrl_engine::{PortType, Value};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value as Json, json};
use std::collections::BTreeMap;
use std::sync::Arc;

const PROMPTS: PortType = port_types::PROMPTS.port_type();
const ROLLOUTS: PortType = port_types::ROLLOUTS.port_type();
const SCORES: PortType = port_types::SCORES.port_type();
const TOKEN_LOG_PROBS: PortType = port_types::TOKEN_LOG_PROBS.port_type();
const ADVANTAGES: PortType = port_types::ADVANTAGES.port_type();

/// The port types a program may declare, in documentation order.
pub const KNOWN_TYPES: &[&str] = &[
    PROMPTS.name(),
    ROLLOUTS.name(),
    SCORES.name(),
    TOKEN_LOG_PROBS.name(),
    ADVANTAGES.name(),
];

/// The port types a program may produce.
pub const OUTPUT_TYPES: &[&str] = &[SCORES.name(), TOKEN_LOG_PROBS.name(), ADVANTAGES.name()];

/// The port type named `name`, if the protocol knows it.
pub fn port_type(name: &str) -> Option<PortType> {
    [PROMPTS, ROLLOUTS, SCORES, TOKEN_LOG_PROBS, ADVANTAGES]
        .into_iter()
        .find(|t| t.name() == name)
}

pub fn can_output(ty: PortType) -> bool {
    OUTPUT_TYPES.contains(&ty.name())
}

/// Values of this type carry the batch of responses they belong to.
pub fn carries_rollouts(ty: PortType) -> bool {
    ty == ROLLOUTS || ty == SCORES || ty == ADVANTAGES
}

/// Values of this type carry pictures (`images = true` sends their paths).
pub fn has_pictures(ty: PortType) -> bool {
    ty == PROMPTS || carries_rollouts(ty)
}

/// Outputs of this type must be attached to a batch of responses.
pub fn needs_rollouts(ty: PortType) -> bool {
    ty == SCORES || ty == ADVANTAGES || ty == TOKEN_LOG_PROBS
}

/// The batch of responses an input value belongs to.
pub fn rollouts_of(v: &Value) -> Option<Arc<RolloutBatch>> {
    if let Some(r) = v.downcast_arc::<RolloutBatch>() {
        return Some(r);
    }
    if let Some(s) = v.downcast_ref::<ScoreBatch>() {
        return Some(s.rollouts.clone());
    }
    v.downcast_ref::<AdvantageBatch>()
        .map(|a| a.rollouts.clone())
}

fn get<T: 'static>(v: &Value) -> Result<&T, String> {
    v.downcast_ref::<T>().ok_or_else(|| {
        format!(
            "holds `{}`, not `{}` as port type {} requires",
            v.type_name(),
            std::any::type_name::<T>(),
            v.ty
        )
    })
}

/// The JSON form of an input value.
pub fn to_json(v: &Value) -> Result<Json, String> {
    match v.ty {
        PROMPTS => Ok(prompts_json(get::<PromptBatch>(v)?)),
        ROLLOUTS => Ok(rollouts_json(get::<RolloutBatch>(v)?)),
        SCORES => {
            let s = get::<ScoreBatch>(v)?;
            Ok(json!({
                "size": s.scores.len(),
                "scores": s.scores,
                "components": s.components,
                "rollouts": rollouts_json(&s.rollouts),
            }))
        }
        ADVANTAGES => {
            let a = get::<AdvantageBatch>(v)?;
            let lens = a.rollouts.response_lengths();
            Ok(json!({
                "size": a.rollouts.len(),
                "advantages": unpadded_rows(&a.advantages, &lens),
                "returns": unpadded_rows(&a.returns, &lens),
                "rollouts": rollouts_json(&a.rollouts),
            }))
        }
        TOKEN_LOG_PROBS => {
            let t = get::<TokenLogProbs>(v)?;
            let rows = |m: &TokenMatrix| (0..m.rows).map(|i| m.row(i).to_vec()).collect::<Vec<_>>();
            Ok(json!({
                "size": t.log_probs.rows,
                "length": t.log_probs.cols,
                "log_probs": rows(&t.log_probs),
                "entropy": t.entropy.as_ref().map(rows),
            }))
        }
        other => Err(format!(
            "has port type {other}, which the protocol cannot send"
        )),
    }
}

/// Adds the paths of a value's pictures to its JSON form (`images = true`), written through
/// `folder`: for Prompts, `images` (per prompt, its pictures); for a batch of responses
/// (Rollouts, and the `rollouts` of Scores and Advantages), `images` (per response, its prompt's
/// pictures) and `tool_images` (per response, the pictures tools returned to it). Other types
/// carry no pictures and are left as they are.
pub fn add_images(v: &Value, json: &mut Json, folder: &mut ImageFolder) -> Result<(), String> {
    match v.ty {
        PROMPTS => {
            let p = get::<PromptBatch>(v)?;
            let images = (0..p.len())
                .map(|i| folder.prompt(p, i))
                .collect::<Result<Vec<_>, _>>()?;
            json["images"] = json!(images);
        }
        ROLLOUTS | SCORES | ADVANTAGES => {
            let r = rollouts_of(v).ok_or_else(|| {
                format!(
                    "holds `{}`, which carries no batch of responses",
                    v.type_name()
                )
            })?;
            let target = if v.ty == ROLLOUTS {
                json
            } else {
                &mut json["rollouts"]
            };
            let mut images = Vec::with_capacity(r.len());
            let mut tool_images = Vec::with_capacity(r.len());
            for (i, &p) in r.prompt_index.iter().enumerate() {
                images.push(folder.prompt(&r.prompts, p)?);
                tool_images.push(folder.tool(&r, i)?);
            }
            target["images"] = json!(images);
            target["tool_images"] = json!(tool_images);
        }
        _ => {}
    }
    Ok(())
}

fn unpadded_rows(m: &TokenMatrix, lens: &[usize]) -> Vec<Vec<f32>> {
    lens.iter()
        .enumerate()
        .map(|(i, &n)| m.row(i)[..n.min(m.cols)].to_vec())
        .collect()
}

fn prompts_json(p: &PromptBatch) -> Json {
    let col = |f: &dyn Fn(&flowrl_datasets::Prompt) -> Json| -> Vec<Json> {
        p.prompts.iter().map(f).collect()
    };
    json!({
        "size": p.len(),
        "uid": col(&|x| json!(x.uid)),
        "prompt": col(&|x| json!(x.text)),
        "messages": col(&|x| json!(x.messages)),
        "ground_truth": col(&|x| json!(x.ground_truth)),
        "data_source": col(&|x| json!(x.data_source)),
        "extra_info": col(&|x| x.extra_info.clone()),
        "input_ids": col(&|x| json!(x.input_ids)),
    })
}

fn rollouts_json(r: &RolloutBatch) -> Json {
    let prompt = |i: usize| {
        r.prompt_index
            .get(i)
            .and_then(|&p| r.prompts.prompts.get(p))
    };
    let n = r.len();
    json!({
        "size": n,
        "uid": r.uid,
        "prompt_index": r.prompt_index,
        "prompt": (0..n).map(|i| prompt(i).map_or(Json::Null, |p| json!(p.text))).collect::<Vec<_>>(),
        "response": r.response_text,
        "response_ids": r.response_ids,
        "response_length": r.response_lengths(),
        "truncated": r.truncated,
        "ground_truth": r.ground_truth,
        "data_source": r.data_source,
        "extra_info": (0..n).map(|i| prompt(i).map_or(Json::Null, |p| p.extra_info.clone())).collect::<Vec<_>>(),
    })
}

/// An output value decoded from JSON and attached to its batch.
pub enum OutValue {
    Scores(ScoreBatch),
    Advantages(AdvantageBatch),
    LogProbs(TokenLogProbs),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScoresOut {
    scores: Vec<f64>,
    #[serde(default)]
    components: BTreeMap<String, Vec<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdvantagesOut {
    advantages: Vec<Vec<f64>>,
    #[serde(default)]
    returns: Option<Vec<Vec<f64>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogProbsOut {
    log_probs: Vec<Vec<f64>>,
    #[serde(default)]
    entropy: Option<Vec<Vec<f64>>>,
}

/// The expected JSON shape of an output of type `ty`, for error messages.
pub fn output_shape(ty: PortType) -> &'static str {
    match ty {
        SCORES => {
            r#"{"scores": [one number per response], "components": {"name": [one number per response]}}"#
        }
        ADVANTAGES => {
            r#"{"advantages": [one row per response, as long as the response], "returns": [same, optional]}"#
        }
        _ => {
            r#"{"log_probs": [one row per response, as long as the response], "entropy": [same, optional]}"#
        }
    }
}

fn parse<T: DeserializeOwned>(ty: PortType, json: Json) -> Result<T, String> {
    serde_json::from_value(json).map_err(|e| {
        format!(
            "is not a valid {ty} value ({e}); expected {}",
            output_shape(ty)
        )
    })
}

/// Checks that a per-response list has one finite number per response.
fn per_response(what: &str, v: &[f64], b: usize) -> Result<Vec<f32>, String> {
    if v.len() != b {
        return Err(format!(
            "has {} {what} for a batch of {b} responses (one per response expected)",
            v.len()
        ));
    }
    finite(what, v)
}

fn finite(what: &str, v: &[f64]) -> Result<Vec<f32>, String> {
    match v.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(format!("has a non-finite value in {what} at index {i}")),
        None => Ok(v.iter().map(|&x| x as f32).collect()),
    }
}

/// Per-token rows (one per response, each as long as its response) → a padded `[B, T]` matrix.
fn token_rows(what: &str, rows: &[Vec<f64>], r: &RolloutBatch) -> Result<TokenMatrix, String> {
    let b = r.len();
    if rows.len() != b {
        return Err(format!(
            "has {} rows of {what} for a batch of {b} responses (one row per response expected)",
            rows.len()
        ));
    }
    let t = r.response_len();
    let mut m = TokenMatrix::zeros(b, t);
    for (i, (row, n)) in rows.iter().zip(r.response_lengths()).enumerate() {
        if row.len() != n {
            return Err(format!(
                "has {} values in row {i} of {what}, but response {i} has {n} tokens",
                row.len()
            ));
        }
        let vals = finite(&format!("row {i} of {what}"), row)?;
        m.row_mut(i)[..n].copy_from_slice(&vals);
    }
    Ok(m)
}

/// Decodes an output of type `ty` and attaches it to `rollouts`.
pub fn from_json(
    ty: PortType,
    json: Json,
    rollouts: &Arc<RolloutBatch>,
) -> Result<OutValue, String> {
    let b = rollouts.len();
    match ty {
        SCORES => {
            let o: ScoresOut = parse(ty, json)?;
            let scores = per_response("scores", &o.scores, b)?;
            let mut components = BTreeMap::new();
            for (name, v) in o.components {
                let vals = per_response(&format!("values in component `{name}`"), &v, b)?;
                components.insert(name, vals);
            }
            Ok(OutValue::Scores(ScoreBatch {
                rollouts: rollouts.clone(),
                scores,
                components,
            }))
        }
        ADVANTAGES => {
            let o: AdvantagesOut = parse(ty, json)?;
            let advantages = token_rows("advantages", &o.advantages, rollouts)?;
            let returns = match &o.returns {
                Some(r) => token_rows("returns", r, rollouts)?,
                None => advantages.clone(),
            };
            Ok(OutValue::Advantages(AdvantageBatch {
                rollouts: rollouts.clone(),
                advantages,
                returns,
            }))
        }
        TOKEN_LOG_PROBS => {
            let o: LogProbsOut = parse(ty, json)?;
            let log_probs = token_rows("log_probs", &o.log_probs, rollouts)?;
            let entropy = match &o.entropy {
                Some(e) => Some(token_rows("entropy", e, rollouts)?),
                None => None,
            };
            Ok(OutValue::LogProbs(TokenLogProbs {
                log_probs,
                entropy,
                sum_pi_squared: None,
            }))
        }
        other => Err(format!(
            "has port type {other}, which a program cannot produce"
        )),
    }
}
