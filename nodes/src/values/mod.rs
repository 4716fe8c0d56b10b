//! The values that travel on the edges of a GRPO/PPO graph, as plain Rust data.
//!
//! Edges carry backend-independent values (docs/ARCHITECTURE.md, "Values on edges"): a node builds
//! tensors on its own device from these. All per-token quantities are stored row-major as
//! `[B, T]` `Vec<f32>`, where `B` is the number of *responses* (prompts × `n`) and `T` is the padded
//! response length of the batch (`RolloutBatch::response_len`). Padding positions hold 0 and are
//! marked 0 in the response mask; every consumer must weight by the mask.
//!
//! | port type       | Rust type            | produced by                       |
//! |-----------------|----------------------|-----------------------------------|
//! | `Prompts`       | [`PromptBatch`]      | `dataset.parquet` (flowrl-datasets) |
//! | `Rollouts`      | [`RolloutBatch`]     | `rollout`                         |
//! | `Scores`        | [`ScoreBatch`]       | `reward.*`                        |
//! | `TokenLogProbs` | [`TokenLogProbs`]    | `logprob`                         |
//! | `Values`        | [`TokenValues`]      | `value` (the critic's values)     |
//! | `Advantages`    | [`AdvantageBatch`]   | `advantage.*`                     |
//! | `ModelUpdate`   | [`ModelUpdate`]      | `update.*` (orders `eval` after the update) |
//!
//! What this module does not do: no tensors, no model calls; only shapes, accessors and the
//! consistency checks (`check`) that producers run before emitting a value.

use std::collections::BTreeMap;
use std::sync::Arc;

pub use flowrl_datasets::PromptBatch;
use flowrl_models::ProcessedImage;

pub mod trajectory;
pub use trajectory::Trajectory;

/// Port types, as declared by the node kinds and shown in diagnostics, each bound to the Rust type
/// of the values it carries (a [`Port`](flowrl_engine::Port) of one reads and writes that type).
pub mod port_types {
    use flowrl_engine::ValueType;

    /// [`super::PromptBatch`].
    pub const PROMPTS: ValueType<super::PromptBatch> = ValueType::new("Prompts");
    /// [`super::RolloutBatch`].
    pub const ROLLOUTS: ValueType<super::RolloutBatch> = ValueType::new("Rollouts");
    /// [`super::ScoreBatch`].
    pub const SCORES: ValueType<super::ScoreBatch> = ValueType::new("Scores");
    /// [`super::TokenLogProbs`].
    pub const TOKEN_LOG_PROBS: ValueType<super::TokenLogProbs> = ValueType::new("TokenLogProbs");
    /// [`super::TokenValues`].
    pub const VALUES: ValueType<super::TokenValues> = ValueType::new("Values");
    /// [`super::AdvantageBatch`].
    pub const ADVANTAGES: ValueType<super::AdvantageBatch> = ValueType::new("Advantages");
    /// [`super::ModelUpdate`].
    pub const MODEL_UPDATE: ValueType<super::ModelUpdate> = ValueType::new("ModelUpdate");
}

/// A `[rows, cols]` f32 matrix stored row-major; the common shape of every per-token value.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenMatrix {
    /// Row-major values, `rows * cols` long.
    pub data: Vec<f32>,
    /// Number of responses `B`.
    pub rows: usize,
    /// Padded response length `T`.
    pub cols: usize,
}

impl TokenMatrix {
    /// A `[rows, cols]` matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            data: vec![0.0; rows * cols],
            rows,
            cols,
        }
    }

    /// Wraps row-major data; errors when `data.len() != rows * cols`.
    pub fn new(data: Vec<f32>, rows: usize, cols: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(
            data.len() == rows * cols,
            "token matrix of shape [{rows}, {cols}] needs {} values, got {}",
            rows * cols,
            data.len()
        );
        Ok(Self { data, rows, cols })
    }

    /// Row `i` (one response).
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// Mutable row `i`.
    pub fn row_mut(&mut self, i: usize) -> &mut [f32] {
        &mut self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }
}

/// Generated responses: `B = prompts × n` rows, each tied to its prompt and its GRPO group.
///
/// Row `i` is response `i`; `prompt_index[i]` points into `prompts` (the batch the rollout node
/// received), which holds the prompt's processed images (pixel values + grids), so the log-prob and
/// update nodes can re-run the vision tower. Responses of one prompt share `uid[i]` (the group id
/// the advantage estimators group by, never the position in the batch).
#[derive(Debug, Clone)]
pub struct RolloutBatch {
    /// The prompt batch these responses answer (tokenized prompts, processed images, ground truth).
    pub prompts: Arc<PromptBatch>,
    /// Per response: index of its prompt in `prompts`.
    pub prompt_index: Vec<usize>,
    /// Per response: the group uid (shared by the `n` samples of one prompt).
    pub uid: Vec<String>,
    /// Per response: the prompt token ids, unpadded (image placeholders already expanded).
    pub prompt_ids: Vec<Vec<u32>>,
    /// Per response: the generated token ids, unpadded; includes the EOS/stop token when one
    /// was generated (verl keeps it in the response and in the mask).
    pub response_ids: Vec<Vec<u32>>,
    /// `[B, T]` response mask, 1.0 for generated tokens, 0.0 for right padding.
    pub response_mask: TokenMatrix,
    /// `[B, T]` log-probs of the sampled tokens under the sampling distribution (after temperature,
    /// top-k and top-p), 0.0 at padding. Greedy decoding stores the unscaled model log-prob.
    pub sampling_log_probs: TokenMatrix,
    /// Per response: the prompt's ground truth (copied from `prompts`, for reward functions).
    pub ground_truth: Vec<String>,
    /// Per response: the prompt's data source (reward routing, per-source validation metrics).
    pub data_source: Vec<String>,
    /// Per response: the decoded response text (special tokens skipped).
    pub response_text: Vec<String>,
    /// Per response: true when generation stopped at `max_new_tokens` without EOS/stop token.
    pub truncated: Vec<bool>,
    /// Per response, for multi-turn rollouts: its turns, tool answers and tool pictures
    /// ([`Trajectory`]); the response mask is then 0 on the tool and template tokens. Empty for
    /// single-turn rollouts (every response token is the policy's).
    pub trajectories: Vec<Arc<Trajectory>>,
}

impl RolloutBatch {
    /// A batch answering `prompts`, response `r` answering prompt `prompt_index[r]`: the
    /// per-response prompt columns (`uid`, `prompt_ids`, `ground_truth`, `data_source`) are
    /// gathered from `prompts` through `prompt_index`. Call [`RolloutBatch::check`] on the result.
    pub fn for_prompts(
        prompts: Arc<PromptBatch>,
        prompt_index: Vec<usize>,
        response_ids: Vec<Vec<u32>>,
        response_mask: TokenMatrix,
        sampling_log_probs: TokenMatrix,
        response_text: Vec<String>,
        truncated: Vec<bool>,
    ) -> Self {
        let gather = |f: fn(&flowrl_datasets::Prompt) -> String| -> Vec<String> {
            prompt_index
                .iter()
                .map(|&i| f(&prompts.prompts[i]))
                .collect()
        };
        let uid = gather(|p| p.uid.clone());
        let ground_truth = gather(|p| p.ground_truth.clone());
        let data_source = gather(|p| p.data_source.clone());
        let prompt_ids = prompt_index
            .iter()
            .map(|&i| prompts.prompts[i].input_ids.clone())
            .collect();
        Self {
            prompts,
            prompt_index,
            uid,
            prompt_ids,
            response_ids,
            response_mask,
            sampling_log_probs,
            ground_truth,
            data_source,
            response_text,
            truncated,
            trajectories: Vec::new(),
        }
    }

    /// This batch with the multi-turn structure of its responses (one per response).
    pub fn with_trajectories(mut self, trajectories: Vec<Arc<Trajectory>>) -> Self {
        self.trajectories = trajectories;
        self
    }

    /// The pictures response `r`'s tools added (after its prompt's, in token order).
    pub fn response_images(&self, r: usize) -> &[ProcessedImage] {
        self.trajectories.get(r).map_or(&[], |t| &t.images)
    }

    /// Number of responses `B`.
    pub fn len(&self) -> usize {
        self.uid.len()
    }

    /// True when the batch holds no response.
    pub fn is_empty(&self) -> bool {
        self.uid.is_empty()
    }

    /// Padded response length `T`.
    pub fn response_len(&self) -> usize {
        self.response_mask.cols
    }

    /// Every token of the batch: the prompts' and the responses' (tool answers included).
    pub fn total_tokens(&self) -> usize {
        self.prompt_ids.iter().map(Vec::len).sum::<usize>()
            + self.response_ids.iter().map(Vec::len).sum::<usize>()
    }

    /// Per response: number of generated tokens (sum of its mask row).
    pub fn response_lengths(&self) -> Vec<usize> {
        self.response_ids.iter().map(Vec::len).collect()
    }

    /// Checks that every per-response field has `B` entries and the matrices are `[B, T]` with
    /// the mask matching the response lengths.
    pub fn check(&self) -> anyhow::Result<()> {
        let b = self.len();
        let lens = [
            ("prompt_index", self.prompt_index.len()),
            ("prompt_ids", self.prompt_ids.len()),
            ("response_ids", self.response_ids.len()),
            ("ground_truth", self.ground_truth.len()),
            ("data_source", self.data_source.len()),
            ("response_text", self.response_text.len()),
            ("truncated", self.truncated.len()),
            ("response_mask rows", self.response_mask.rows),
            ("sampling_log_probs rows", self.sampling_log_probs.rows),
        ];
        for (name, n) in lens {
            anyhow::ensure!(n == b, "rollout batch: {name} has {n} entries, uid has {b}");
        }
        let t = self.response_len();
        anyhow::ensure!(
            self.sampling_log_probs.cols == t,
            "rollout batch: sampling_log_probs has {} columns, response_mask has {t}",
            self.sampling_log_probs.cols
        );
        for (i, ids) in self.response_ids.iter().enumerate() {
            anyhow::ensure!(
                ids.len() <= t,
                "rollout batch: response {i} has {} tokens, more than T = {t}",
                ids.len()
            );
            let row = self.response_mask.row(i);
            match self.trajectories.get(i) {
                None => {
                    let ones = row.iter().filter(|&&m| m > 0.5).count();
                    anyhow::ensure!(
                        ones == ids.len(),
                        "rollout batch: response {i} has {} tokens but {ones} mask ones",
                        ids.len()
                    );
                }
                Some(t) => {
                    t.check(ids.len())
                        .map_err(|e| anyhow::anyhow!("rollout batch: response {i}: {e}"))?;
                    let mut expected = t.mask(ids.len());
                    expected.resize(row.len(), 0.0);
                    anyhow::ensure!(
                        row == expected.as_slice(),
                        "rollout batch: response {i}'s mask is not 1 on its policy turns and 0 elsewhere"
                    );
                }
            }
        }
        anyhow::ensure!(
            self.trajectories.is_empty() || self.trajectories.len() == b,
            "rollout batch: {} trajectories for {b} responses",
            self.trajectories.len()
        );
        Ok(())
    }
}

/// Serialized (for `sink.jsonl`, `debug.print`) as the per-response fields; the prompt batch is
/// summarised by its uids (its own serialization is available on the `Prompts` edge).
impl serde::Serialize for RolloutBatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("RolloutBatch", 10)?;
        st.serialize_field("uid", &self.uid)?;
        st.serialize_field("prompt_index", &self.prompt_index)?;
        st.serialize_field("response_text", &self.response_text)?;
        st.serialize_field("ground_truth", &self.ground_truth)?;
        st.serialize_field("data_source", &self.data_source)?;
        st.serialize_field("response_ids", &self.response_ids)?;
        st.serialize_field("truncated", &self.truncated)?;
        st.serialize_field("response_mask", &self.response_mask)?;
        st.serialize_field("sampling_log_probs", &self.sampling_log_probs)?;
        st.serialize_field(
            "prompt_lengths",
            &self.prompt_ids.iter().map(Vec::len).collect::<Vec<_>>(),
        )?;
        st.end()
    }
}

/// Per-response scalar rewards, with the named components that make them up.
///
/// Carries the rollouts it scores, so that an advantage estimator needs only this value
/// (group uids, response mask) and metrics can be split by data source.
#[derive(Debug, Clone)]
pub struct ScoreBatch {
    /// The scored responses.
    pub rollouts: Arc<RolloutBatch>,
    /// Per response: the final scalar reward (verl's `token_level_scores` summed; placed on the
    /// last response token by the advantage estimators).
    pub scores: Vec<f32>,
    /// Named components (e.g. `accuracy`, `format`), each with one value per response; logged as
    /// `critic/score/<name>/mean` style metrics by the reward nodes.
    pub components: BTreeMap<String, Vec<f32>>,
}

/// Serialized (for `sink.jsonl`, `debug.print`) as the responses' uids, scores and components
/// (the rollouts themselves are on the `Rollouts` edge).
impl serde::Serialize for ScoreBatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("ScoreBatch", 3)?;
        st.serialize_field("uid", &self.rollouts.uid)?;
        st.serialize_field("scores", &self.scores)?;
        st.serialize_field("components", &self.components)?;
        st.end()
    }
}

impl ScoreBatch {
    /// Checks that scores and every component have one value per response.
    pub fn check(&self) -> anyhow::Result<()> {
        let b = self.rollouts.len();
        anyhow::ensure!(
            self.scores.len() == b,
            "score batch: {} scores for {b} responses",
            self.scores.len()
        );
        for (name, v) in &self.components {
            anyhow::ensure!(
                v.len() == b,
                "score batch: component {name} has {} values for {b} responses",
                v.len()
            );
        }
        Ok(())
    }
}

impl ScoreBatch {
    /// The responses `rows` of each part, in that order, as one batch: one prompt batch holding
    /// the prompts they answer (each once), response matrices padded to the longest `T` among
    /// the parts, scores and components alongside. The parts must share their component names
    /// and their prompts' pad and image token ids (one dataset).
    pub fn gather(parts: &[(Arc<ScoreBatch>, Vec<usize>)]) -> anyhow::Result<ScoreBatch> {
        let first = &parts
            .first()
            .ok_or_else(|| anyhow::anyhow!("gathering responses from no batch"))?
            .0;
        let t = parts
            .iter()
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(s, _)| s.rollouts.response_len())
            .max()
            .unwrap_or(0);
        let mut prompts = Vec::new();
        let mut prompt_index = Vec::new();
        let (mut response_ids, mut text, mut truncated) = (Vec::new(), Vec::new(), Vec::new());
        let (mut mask, mut logp) = (Vec::new(), Vec::new());
        let mut trajectories = Vec::new();
        let mut scores = Vec::new();
        let mut components: BTreeMap<String, Vec<f32>> = first
            .components
            .keys()
            .map(|k| (k.clone(), Vec::new()))
            .collect();
        for (s, rows) in parts {
            let r = &s.rollouts;
            anyhow::ensure!(
                r.prompts.pad_token_id == first.rollouts.prompts.pad_token_id
                    && r.prompts.image_token_id == first.rollouts.prompts.image_token_id,
                "gathered responses come from prompt batches with different pad or image tokens"
            );
            anyhow::ensure!(
                s.components.keys().eq(first.components.keys()),
                "gathered score batches have different components ({:?} and {:?})",
                first.components.keys().collect::<Vec<_>>(),
                s.components.keys().collect::<Vec<_>>()
            );
            let mut mapped: BTreeMap<usize, usize> = BTreeMap::new();
            for &i in rows {
                anyhow::ensure!(i < r.len(), "row {i} of a batch of {} responses", r.len());
                let p = r.prompt_index[i];
                let index = *mapped.entry(p).or_insert_with(|| {
                    prompts.push(r.prompts.prompts[p].clone());
                    prompts.len() - 1
                });
                prompt_index.push(index);
                response_ids.push(r.response_ids[i].clone());
                text.push(r.response_text[i].clone());
                truncated.push(r.truncated[i]);
                trajectories.extend(r.trajectories.get(i).cloned());
                let pad = t - r.response_len();
                mask.extend_from_slice(r.response_mask.row(i));
                mask.extend(std::iter::repeat_n(0.0, pad));
                logp.extend_from_slice(r.sampling_log_probs.row(i));
                logp.extend(std::iter::repeat_n(0.0, pad));
                scores.push(s.scores[i]);
                for (name, v) in &s.components {
                    components.get_mut(name).expect("same keys").push(v[i]);
                }
            }
        }
        let b = prompt_index.len();
        let batch = PromptBatch {
            prompts,
            pad_token_id: first.rollouts.prompts.pad_token_id,
            image_token_id: first.rollouts.prompts.image_token_id,
            epoch: parts.last().map_or(0, |(s, _)| s.rollouts.prompts.epoch),
        };
        let rollouts = RolloutBatch::for_prompts(
            Arc::new(batch),
            prompt_index,
            response_ids,
            TokenMatrix::new(mask, b, t)?,
            TokenMatrix::new(logp, b, t)?,
            text,
            truncated,
        )
        .with_trajectories(trajectories);
        rollouts.check()?;
        let out = ScoreBatch {
            rollouts: Arc::new(rollouts),
            scores,
            components,
        };
        out.check()?;
        Ok(out)
    }
}

/// Per-token log-probs of the response tokens under some model (old policy, reference), `[B, T]`,
/// 0.0 at padding positions. Aligned with the `RolloutBatch` they were computed for.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenLogProbs {
    /// `[B, T]` log π(response token t | prompt, response < t).
    pub log_probs: TokenMatrix,
    /// Optional `[B, T]` per-token entropy of the same distribution (when requested).
    pub entropy: Option<TokenMatrix>,
    /// Optional `[B, T]` Σ_v π_v² of the same distribution at every response position (verl's
    /// `sum_pi_squared`, when requested; 0.0 at padding).
    pub sum_pi_squared: Option<TokenMatrix>,
}

/// The critic's value of every response position `[B, T]` (verl's `values`: the value head's
/// output at the position that predicts response token t, 0.0 at padding). Aligned with the
/// `RolloutBatch` they were computed for.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenValues {
    /// `[B, T]` V(prompt, response < t).
    pub values: TokenMatrix,
}

impl TokenValues {
    /// Checks the shape against `rollouts`.
    pub fn check(&self, rollouts: &RolloutBatch) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.values.shape() == rollouts.response_mask.shape(),
            "values {:?} do not match the rollouts {:?}",
            self.values.shape(),
            rollouts.response_mask.shape()
        );
        Ok(())
    }
}

/// Per-token advantages and returns `[B, T]`, 0.0 at padding (verl's `advantages`, `returns`).
#[derive(Debug, Clone)]
pub struct AdvantageBatch {
    /// The rollouts the advantages belong to.
    pub rollouts: Arc<RolloutBatch>,
    /// `[B, T]` advantages.
    pub advantages: TokenMatrix,
    /// `[B, T]` returns (equal to the advantages for GRPO, as in verl).
    pub returns: TokenMatrix,
}

/// Serialized (for `sink.jsonl`, `debug.print`) as the responses' uids and the `[B, T]`
/// advantages and returns.
impl serde::Serialize for AdvantageBatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("AdvantageBatch", 3)?;
        st.serialize_field("uid", &self.rollouts.uid)?;
        st.serialize_field("advantages", &self.advantages)?;
        st.serialize_field("returns", &self.returns)?;
        st.end()
    }
}

impl AdvantageBatch {
    /// Response `r`'s advantage as one number: the mean over its response tokens (GRPO's is the
    /// same at every token).
    pub fn sequence_advantage(&self, r: usize) -> f32 {
        let mask = self.rollouts.response_mask.row(r);
        let (sum, n) = self
            .advantages
            .row(r)
            .iter()
            .zip(mask)
            .filter(|(_, m)| **m > 0.5)
            .fold((0.0f64, 0usize), |(s, n), (a, _)| (s + *a as f64, n + 1));
        if n == 0 { 0.0 } else { (sum / n as f64) as f32 }
    }

    /// Checks the shapes against the rollouts.
    pub fn check(&self) -> anyhow::Result<()> {
        let shape = self.rollouts.response_mask.shape();
        anyhow::ensure!(
            self.advantages.shape() == shape && self.returns.shape() == shape,
            "advantage batch: advantages {:?} / returns {:?} do not match the rollouts {:?}",
            self.advantages.shape(),
            self.returns.shape(),
            shape
        );
        Ok(())
    }
}

/// What an update node did to its model this step. Wiring it into `eval.after` makes the
/// evaluation see the weights after this step's update (and makes the order deterministic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ModelUpdate {
    /// Optimizer steps applied so far (whole run).
    pub optimizer_steps: u64,
    /// Optimizer steps skipped so far because of a non-finite loss or gradient norm.
    pub skipped_steps: u64,
}
