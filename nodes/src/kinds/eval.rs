//! The `eval` node kind: greedy generation on the validation prompts every `every` steps (and at
//! the last step), scored with a rule-based reward; metrics per `data_source`.
//!
//! Wire `prompts` to the dataset node's `val_prompts` and, to evaluate the weights after the
//! step's update (and keep the order deterministic), `after` to the update node's `done`.
//!
//! Scoring: the built-in rule named by `reward`, or any reward node of the graph — a plugin or an
//! `exec` reward included — that the eval node repeats (see `flowrl_engine::repeat`): list it in
//! `repeat`, wire its `rollouts` to `eval.rollouts` (each chunk of responses is handed to it) and
//! `eval.scores` to its `scores`:
//!
//! ```toml
//! [nodes.val_reward]
//! kind = "exec"                 # or any reward.* kind
//! timing = "eval"               # its time counts in timing_s/eval
//! inputs = { rollouts = "eval.rollouts" }
//!
//! [nodes.eval]
//! kind = "eval"
//! repeat = ["val_reward"]
//! inputs = { prompts = "data.val_prompts", after = "update.done", scores = "val_reward.scores" }
//! ```
//!
//! Metrics: `val/<data_source>/score` (mean reward), `val/<data_source>/accuracy` (mean of the
//! reward's `acc` component when it has one, else of the reward), `val/score` and `val/accuracy`
//! over all prompts, `val/response_length/mean`.
//!
//! With a `tools` table (and `rollout.multi_turn`'s other turn parameters) the responses are
//! multi-turn, generated as `rollout.multi_turn` generates them, greedily; then also
//! `val/tool_calls/mean` and `val/tool_calls/rate` (responses with a call).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use flowrl_algorithms::rewards::{BuiltinReward, RewardFunction};
use flowrl_engine::{
    BuildContext, Diagnostic, Footprint, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec,
    Params, PlanCtx, Port, PortSpec, StepContext, ValidateCtx,
};
use rand::Rng;
use serde::Deserialize;

use crate::kinds::rollout::multi_turn::{MultiTurn, TurnParams, validate_turns};
use crate::kinds::rollout::{
    Generation, KV_CACHE_GIB, MAX_NUM_BATCHED_TOKENS, RolloutParams, generation_footprint,
    sample_rollouts, stop_token_ids, validate_generation,
};
use crate::resources::model::ModelResource;
use crate::runtime::data_parallel::Replicas;
use crate::sizing::{Prompts, planned_prompts};
use crate::values::{ModelUpdate, PromptBatch, RolloutBatch, ScoreBatch, port_types};

/// The `eval` kind.
pub struct EvalKind;

const PROMPTS: Port<PromptBatch> = Port::new("prompts", port_types::PROMPTS);
const AFTER: Port<ModelUpdate> = Port::new("after", port_types::MODEL_UPDATE);
const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);
const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);

#[derive(Debug, Clone, Deserialize, Params)]
struct EvalParams {
    /// the model to evaluate
    #[param(resource = "model", required)]
    model: String,
    /// evaluate every N steps (and at the last step)
    #[param(default = 5, min = 1.0)]
    every: u64,
    /// rule-based reward used for scoring
    #[param(one_of = &["geo3k", "exact_match", "format"], default = "geo3k")]
    reward: String,
    /// prompts per generation batch
    #[param(default = 64, min = 1.0)]
    batch_size: usize,
    /// maximum response length in tokens (verl: response_length)
    #[param(required, min = 1.0)]
    max_new_tokens: usize,
    /// extra stop tokens (each must be one token of the tokenizer), besides the model's EOS
    #[serde(default)]
    stop: Vec<String>,
    /// with `tools`, the responses are multi-turn, as `rollout.multi_turn`'s (greedy)
    #[serde(flatten)]
    turns: TurnParams,
}

impl EvalParams {
    /// The greedy rollout (n = 1) an evaluation batch is generated with, at the rollout's
    /// default budgets.
    fn rollout(&self) -> RolloutParams {
        RolloutParams {
            model: self.model.clone(),
            n: 1,
            max_new_tokens: self.max_new_tokens,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            greedy: true,
            stop: Vec::new(),
            kv_cache_gib: KV_CACHE_GIB,
            max_num_batched_tokens: MAX_NUM_BATCHED_TOKENS,
        }
    }
}

impl NodeKind for EvalKind {
    fn name(&self) -> &str {
        "eval"
    }

    fn doc(&self) -> &str {
        "Greedy generation on the validation prompts every `every` steps; reward and accuracy per \
         data_source (val/<data_source>/score, val/<data_source>/accuracy)."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            PROMPTS
                .spec()
                .doc("the validation prompts (dataset `val_prompts`)"),
            AFTER
                .spec()
                .optional()
                .doc("an update node's `done`: evaluate after that update"),
            SCORES.spec().optional().repeated().doc(
                "the scores of a reward node in `repeat`, for each chunk (instead of `reward`)",
            ),
        ]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        vec![
            ROLLOUTS
                .spec()
                .argument()
                .doc("each chunk of greedy responses, handed to the reward node in `repeat`"),
        ]
    }

    fn params(&self) -> Vec<ParamSpec> {
        EvalParams::param_specs()
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let p = match ctx.parse::<EvalParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        let mut out = validate_generation(ctx, p.max_new_tokens);
        out.extend(validate_turns(ctx, &p.turns, p.max_new_tokens, false));
        if ctx.input(SCORES.name()).is_some() && ctx.is_set("reward") {
            out.push(ctx.warning(
                "reward",
                "`reward` is ignored: the responses are scored by the reward node wired to \
                 `scores`",
            ));
        }
        out
    }

    /// A rollout of `batch_size` validation prompts (n = 1, greedy) with the rollout's default
    /// budgets.
    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let p = ctx.parse::<EvalParams>().ok()?;
        let mut f = Footprint::default();
        let Some((m, prompts)) = planned_prompts(ctx, &mut f) else {
            return Some(f);
        };
        let prompts = Prompts {
            per_step: p.batch_size,
            ..prompts
        };
        generation_footprint(&mut f, &m, ctx, Generation::of(&p.rollout(), prompts));
        // Evaluated every `every` steps: its FLOPs per step on average.
        f.flops /= p.every as f64;
        Some(f)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: EvalParams = params.parse()?;
        let model = ctx.resource::<ModelResource>(&p.model)?;
        let reward = BuiltinReward::from_name(&p.reward)?;
        let stop_ids = stop_token_ids(&model, &p.stop)?;
        let multi_turn = match &p.turns.tools {
            serde_json::Value::Null => None,
            _ => Some(
                MultiTurn::new(p.rollout(), p.turns.clone(), model.clone())
                    .with_context(|| format!("node `{}`", ctx.node))?,
            ),
        };
        Ok(Box::new(EvalNode {
            p,
            model,
            reward,
            stop_ids,
            multi_turn,
        }))
    }
}

struct EvalNode {
    p: EvalParams,
    model: Arc<ModelResource>,
    reward: BuiltinReward,
    stop_ids: Vec<u32>,
    /// Multi-turn generation, when the node declares tools.
    multi_turn: Option<MultiTurn>,
}

#[derive(Default)]
struct SourceStats {
    score: f64,
    accuracy: f64,
    count: usize,
}

impl Node for EvalNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        if !ctx.step().is_multiple_of(self.p.every) && !ctx.is_last_step() {
            return Ok(Outputs::new());
        }
        let prompts = inputs.get_arc(PROMPTS)?;
        let params = self.p.rollout();
        let mut per_source: BTreeMap<String, SourceStats> = BTreeMap::new();
        let mut lengths = 0usize;
        let mut total = 0usize;
        let (mut tool_calls, mut tool_users) = (0usize, 0usize);
        for chunk in split(&prompts, self.p.batch_size) {
            // Generation runs where the model lives.
            let here = Replicas::single(self.model.device);
            let rollouts = match &self.multi_turn {
                Some(m) => m.sample(&Arc::new(chunk), &here, ctx.rng().random())?,
                None => sample_rollouts(
                    &self.model,
                    &Arc::new(chunk),
                    &params,
                    &self.stop_ids,
                    &here,
                    ctx,
                )?,
            };
            for t in &rollouts.trajectories {
                tool_calls += t.tool_calls;
                tool_users += usize::from(t.tool_calls > 0);
            }
            let scored = if ctx.has_repeat() {
                // The reward node's own critic/score/* would overwrite the training reward's.
                let repeat = ctx.repeat()?;
                repeat.report_metrics(false);
                let got = repeat.run(Outputs::new().with_opaque(ROLLOUTS, rollouts.clone()))?;
                Some(got.get_arc(SCORES)?)
            } else {
                None
            };
            if let Some(s) = &scored {
                s.check()?;
                anyhow::ensure!(
                    s.rollouts.len() == rollouts.len(),
                    "the reward node scored {} responses, eval handed it {}",
                    s.rollouts.len(),
                    rollouts.len()
                );
            }
            for r in 0..rollouts.len() {
                let (score, acc) = match &scored {
                    Some(s) => (
                        s.scores[r] as f64,
                        s.components.get("acc").map_or(s.scores[r], |a| a[r]) as f64,
                    ),
                    None => {
                        let s = self
                            .reward
                            .score(&rollouts.response_text[r], &rollouts.ground_truth[r]);
                        let acc = s
                            .components
                            .iter()
                            .find(|(name, _)| name == "acc")
                            .map(|(_, v)| *v)
                            .unwrap_or(s.score);
                        (s.score, acc)
                    }
                };
                let e = per_source
                    .entry(rollouts.data_source[r].clone())
                    .or_default();
                e.score += score;
                e.accuracy += acc;
                e.count += 1;
                lengths += rollouts.response_ids[r].len();
                total += 1;
            }
        }
        let (mut score, mut accuracy) = (0.0, 0.0);
        for (source, s) in &per_source {
            let n = s.count as f64;
            ctx.metric(format!("val/{source}/score"), s.score / n);
            ctx.metric(format!("val/{source}/accuracy"), s.accuracy / n);
            score += s.score;
            accuracy += s.accuracy;
        }
        if total > 0 {
            ctx.metric("val/score", score / total as f64);
            ctx.metric("val/accuracy", accuracy / total as f64);
            ctx.metric("val/response_length/mean", lengths as f64 / total as f64);
            if self.multi_turn.is_some() {
                ctx.metric("val/tool_calls/mean", tool_calls as f64 / total as f64);
                ctx.metric("val/tool_calls/rate", tool_users as f64 / total as f64);
            }
        }
        Ok(Outputs::new())
    }
}

/// `batch` in consecutive pieces of at most `size` prompts.
fn split(batch: &PromptBatch, size: usize) -> Vec<PromptBatch> {
    batch
        .prompts
        .chunks(size.max(1))
        .map(|c| PromptBatch {
            prompts: c.to_vec(),
            pad_token_id: batch.pad_token_id,
            image_token_id: batch.image_token_id,
            epoch: batch.epoch,
        })
        .collect()
}

flowrl_engine::register_node_kind!(EvalKind);
