//! `sink.trajectories`: the step's responses as JSONL you can read, with their pictures.
//!
//! Every `every` steps (and at the last step) it writes `DIR/step_NNNNNN.jsonl` (`DIR`:
//! `rollouts` under the run directory by default): one object per response with `uid`,
//! `sample` (its row), `data_source`, `ground_truth`, `messages` (the prompt's, then per
//! assistant turn `{"role": "assistant", "content", "tool_calls"}` and per tool answer
//! `{"role": "tool", "name", "content": [{"type": "image", "image": FILE}..., {"type": "text"}]}`;
//! image parts name PNG files under `DIR/step_NNNNNN/`, relative to the run directory),
//! `prompt_length`, `token_ids` (prompt then response, as the model saw them), `loss_mask` (per
//! response token), `turn_lengths` (tokens per assistant turn), `tool_calls`, `tool_errors`,
//! `images` (tool pictures), `finish` (`stop`, `length`, `budget`, `max_turns`), `truncated`,
//! `response_text`, `score`, `score_components` and, with `advantages` wired, `advantage` (the
//! mean over the response's tokens). A single-turn rollout's responses are written too (one
//! turn, no tools). `samples = N` writes N responses drawn at random (verl's
//! `log_completions`-style sample; 0: all).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use flowrl_datasets::template::multimodal_messages;
use flowrl_engine::{
    BuildContext, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec, Params, Port, PortSpec,
    StepContext,
};
use image::RgbImage;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use crate::kinds::reward::support::ScoreColumns;
use crate::values::{AdvantageBatch, RolloutBatch, ScoreBatch, port_types};

/// The `sink.trajectories` kind.
pub struct SinkTrajectories;

const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);
const ADVANTAGES: Port<AdvantageBatch> = Port::new("advantages", port_types::ADVANTAGES);

#[derive(Deserialize, Params)]
struct TrajectoriesParams {
    /// the folder of the files; a relative path is inside the run directory
    #[param(default = "rollouts")]
    dir: PathBuf,
    /// write every N steps (and at the last step)
    #[param(default = 1, min = 1)]
    every: u64,
    /// responses per step, drawn at random (0: all)
    #[param(default = 0, min = 0)]
    samples: usize,
}

impl NodeKind for SinkTrajectories {
    fn name(&self) -> &str {
        "sink.trajectories"
    }

    fn doc(&self) -> &str {
        "Writes the step's scored responses as JSONL (messages, tool calls, token ids, loss mask, \
         turn lengths, score) with their pictures as PNG files."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            SCORES
                .spec()
                .doc("the scored responses (they carry their rollouts)"),
            ADVANTAGES
                .spec()
                .optional()
                .doc("their advantages, written as each response's mean"),
        ]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }

    fn params(&self) -> Vec<ParamSpec> {
        TrajectoriesParams::param_specs()
    }

    fn footprint(&self, _: &flowrl_engine::PlanCtx) -> Option<flowrl_engine::Footprint> {
        Some(flowrl_engine::Footprint::default())
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: TrajectoriesParams = params.parse()?;
        let (dir, prefix) = match (&ctx.run_dir, p.dir.is_relative()) {
            (Some(run), true) => (run.join(&p.dir), format!("{}/", p.dir.display())),
            _ => (p.dir.clone(), format!("{}/", p.dir.display())),
        };
        Ok(Box::new(TrajectoriesNode {
            dir,
            prefix,
            every: p.every,
            samples: p.samples,
        }))
    }
}

struct TrajectoriesNode {
    dir: PathBuf,
    /// How the JSONL names the folder (relative to the run directory when it is inside).
    prefix: String,
    every: u64,
    samples: usize,
}

impl Node for TrajectoriesNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        if !(ctx.step() + 1).is_multiple_of(self.every) && !ctx.is_last_step() {
            return Ok(Outputs::skipped());
        }
        let scores = inputs.get_arc(SCORES)?;
        let advantages = inputs.get_opt(ADVANTAGES)?;
        if let Some(a) = advantages {
            anyhow::ensure!(
                a.rollouts.len() == scores.rollouts.len(),
                "the advantages are of {} responses, the scores of {}",
                a.rollouts.len(),
                scores.rollouts.len()
            );
        }
        let n = scores.rollouts.len();
        let rows = (self.samples > 0 && self.samples < n).then(|| {
            let mut rows = rand::seq::index::sample(ctx.rng(), n, self.samples).into_vec();
            rows.sort_unstable();
            rows
        });
        write_trajectories(
            &self.dir,
            &self.prefix,
            ctx.step() + 1,
            &scores,
            rows.as_deref(),
            advantages,
        )?;
        Ok(Outputs::new())
    }
}

/// Writes `dir/step_NNNNNN.jsonl` and the pictures under `dir/step_NNNNNN/` (see the module
/// doc) for the responses `rows` of `scores` (all when `None`), each with its sequence-level
/// advantage when `advantages` are given; the JSONL names the pictures `prefix` +
/// `step_NNNNNN/FILE`.
pub fn write_trajectories(
    dir: &Path,
    prefix: &str,
    step: u64,
    scores: &ScoreBatch,
    rows: Option<&[usize]>,
    advantages: Option<&AdvantageBatch>,
) -> Result<()> {
    let stem = format!("step_{step:06}");
    let mut pictures = PictureFolder::new(dir.join(&stem), format!("{prefix}{stem}/"))?;
    let all: Vec<usize> = (0..scores.rollouts.len()).collect();
    let columns = ScoreColumns::of_batch(scores);
    let mut lines = String::new();
    for &r in rows.unwrap_or(&all) {
        let mut line = trajectory_line(
            &scores.rollouts,
            r,
            columns.scores[r],
            &columns.row(r),
            &mut pictures,
        )?;
        if let Some(a) = advantages {
            line["advantage"] = json!(a.sequence_advantage(r));
        }
        lines.push_str(&serde_json::to_string(&line)?);
        lines.push('\n');
    }
    let path = dir.join(format!("{stem}.jsonl"));
    std::fs::write(&path, lines).with_context(|| format!("writing {}", path.display()))
}

/// A folder the pictures of trajectory lines are saved to, each file once.
pub struct PictureFolder {
    dir: PathBuf,
    /// How the JSONL names the folder.
    prefix: String,
}

impl PictureFolder {
    /// Creates `dir`; the lines name its files `prefix` + file name.
    pub fn new(dir: PathBuf, prefix: String) -> Result<PictureFolder> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(PictureFolder { dir, prefix })
    }

    /// Saves `picture` as `file` (a PNG) unless it is there already; the name the JSONL gives it.
    fn save(&mut self, picture: &RgbImage, file: &str) -> Result<String> {
        let path = self.dir.join(file);
        if !path.exists() {
            picture
                .save(&path)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(format!("{}{file}", self.prefix))
    }
}

/// One response of `rollouts` as a JSON object (see the module doc), its pictures saved into
/// `pictures`.
pub fn trajectory_line(
    rollouts: &RolloutBatch,
    r: usize,
    score: f64,
    components: &[(String, f64)],
    pictures: &mut PictureFolder,
) -> Result<Json> {
    let pi = rollouts.prompt_index[r];
    let prompt = &rollouts.prompts.prompts[pi];
    let trajectory = rollouts.trajectories.get(r);
    // The prompt's pictures once per prompt, the tools' per response.
    let mut files = Vec::new();
    for (k, p) in prompt.pictures.iter().enumerate() {
        files.push(pictures.save(p, &format!("prompt{pi}_image{k}.png"))?);
    }
    let mut messages: Vec<Json> =
        multimodal_messages(&prompt.messages, !prompt.pictures.is_empty())
            .as_array()
            .cloned()
            .unwrap_or_default();
    let turn_lengths: Vec<usize> = match trajectory {
        Some(t) => {
            for (k, p) in t.pictures.iter().enumerate() {
                files.push(pictures.save(p, &format!("response{r}_tool_image{k}.png"))?);
            }
            messages.extend(t.messages.iter().cloned());
            t.policy_segments().map(|s| s.len).collect()
        }
        // A single-turn response: one assistant turn, all the policy's.
        None => {
            messages.push(json!({"role": "assistant", "content": rollouts.response_text[r]}));
            vec![rollouts.response_ids[r].len()]
        }
    };
    // Name each image part's file, in order.
    let mut next = files.iter();
    for m in &mut messages {
        if let Some(parts) = m.get_mut("content").and_then(Json::as_array_mut) {
            for part in parts {
                if part.get("type").and_then(Json::as_str) == Some("image")
                    && let Some(f) = next.next()
                {
                    part["image"] = json!(f);
                }
            }
        }
    }
    let ids = &rollouts.response_ids[r];
    let mut token_ids = rollouts.prompt_ids[r].clone();
    token_ids.extend_from_slice(ids);
    let mask: Vec<u8> = rollouts.response_mask.row(r)[..ids.len()]
        .iter()
        .map(|&m| u8::from(m > 0.5))
        .collect();
    Ok(json!({
        "uid": rollouts.uid[r],
        "sample": r,
        "data_source": rollouts.data_source[r],
        "ground_truth": rollouts.ground_truth[r],
        "messages": messages,
        "prompt_length": rollouts.prompt_ids[r].len(),
        "token_ids": token_ids,
        "loss_mask": mask,
        "turn_lengths": turn_lengths,
        "tool_calls": trajectory.map_or(0, |t| t.tool_calls),
        "tool_errors": trajectory.map_or(0, |t| t.tool_errors),
        "finish": trajectory.map(|t| t.finish),
        "images": trajectory.map_or(0, |t| t.images.len()),
        "truncated": rollouts.truncated[r],
        "response_text": rollouts.response_text[r],
        "score": score,
        "score_components": components.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
    }))
}

flowrl_engine::register_node_kind!(SinkTrajectories);
