//! The `update.sft` node kind: supervised fine-tuning on ground-truth responses (warm starts,
//! SFT graphs).
//!
//! Each prompt's target response is `response_template` with `{answer}` replaced by the prompt's
//! ground truth, tokenized without special tokens, followed by the model's first EOS token; or,
//! with `rollouts` wired instead of `prompts`, the rollouts' responses on their loss mask (a
//! multi-turn conversation's tool and template tokens are not targets). The loss
//! is the token-mean cross-entropy over the target tokens of the whole batch,
//!
//! ```text
//! L = − Σ_{b,t} m[b,t] · log π(y[b,t] | prompt_b, y[b,<t]) / Σ m
//! ```
//!
//! (verl's SFT trainer, `loss_agg_mode = token-mean`), accumulated over micro-batches with the
//! batch's token count as the normaliser, then one guarded AdamW step (global-norm clipping;
//! non-finite → skipped and counted; `freeze_vision_tower` drops the vision tower's gradients
//! first, as verl's `actor.freeze_vision_tower`). Metrics: `train/loss`, `actor/grad_norm`, `actor/lr`,
//! `actor/skipped_steps`. Timing key `update_actor`.
//!
//! Each micro-batch's gradient comes from the two-stage backward of
//! [`crate::train::sequences::chunked_loss_backward`] ([`sft_loss`] on the log-probs as values, then one
//! LM-head chunk of logits at a time, then the trunk), so the `[B, T, V]` logits never exist.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use burn::prelude::{Backend, Tensor};
use flowrl_algorithms::{GlobalBatchInfo, LossAggMode, agg_loss};
use flowrl_engine::{
    BuildContext, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec, Params, Port, PortSpec,
    StepContext, derive_seed,
};
use flowrl_engine::{Footprint, PlanCtx};
use serde::Deserialize;

use crate::sizing::{Pass, Training, planned_prompts, training_footprint};

/// Answer tokens per row the plan sizes an SFT step with.
const ANSWER_TOKENS: usize = 32;

use crate::kinds::update::support::{DONE, done_output};
use crate::resources::model::ModelResource;
use crate::runtime::backend::{FlowBackend, device_of, on_backend};
use crate::runtime::data_parallel::Replicas;
use crate::train::checkpoint::CheckpointingParams;
use crate::train::grad_sum::GradSum;
use crate::train::optim::LrSchedule;
use crate::train::replicated::replicated_step;
use crate::train::sequences::SequenceBatch;
use crate::train::{OptimParams, PartialStep, global_batch_info};
use crate::values::{ModelUpdate, PromptBatch, RolloutBatch, TokenMatrix, port_types};
use flowrl_models::lora::DropoutScope;

/// The `update.sft` kind.
pub struct SftUpdateKind;

const PROMPTS: Port<PromptBatch> = Port::new("prompts", port_types::PROMPTS);
const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);

#[derive(Debug, Clone, Deserialize, Params)]
struct SftParams {
    /// the model to train
    #[param(resource = "model", required)]
    model: String,
    /// target response; `{answer}` is replaced by the ground truth
    #[param(default = "{answer}")]
    response_template: String,
    /// responses per forward/backward; default: the batch
    #[param(min = 1.0)]
    micro_batch_size: Option<usize>,
    /// response positions per LM-head block; default: 16 on the CPU, 128 on a GPU
    #[param(min = 1.0)]
    chunk: Option<usize>,
    #[serde(flatten)]
    optim: OptimParams,
    #[serde(flatten)]
    checkpointing: CheckpointingParams,
}

impl NodeKind for SftUpdateKind {
    fn name(&self) -> &str {
        "update.sft"
    }

    fn doc(&self) -> &str {
        "Supervised fine-tuning on the prompts' ground-truth answers written into \
         `response_template`: token-mean cross-entropy, one AdamW step per batch."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            PROMPTS
                .spec()
                .optional()
                .doc("prompts whose targets are `response_template` with their ground truth"),
            ROLLOUTS.spec().optional().doc(
                "or responses to imitate, on their loss mask (e.g. a `rollout.multi_turn` with \
                 `replay_turns`: tool-using conversations, the tools' tokens masked out)",
            ),
        ]
    }

    fn validate(&self, ctx: &flowrl_engine::ValidateCtx) -> Vec<flowrl_engine::Diagnostic> {
        let prompts = ctx.input(PROMPTS.name()).is_some();
        let rollouts = ctx.input(ROLLOUTS.name()).is_some();
        let mut out = Vec::new();
        if prompts == rollouts {
            out.push(ctx.error(
                "inputs",
                "wire exactly one of `prompts` (targets from `response_template`) and `rollouts` \
                 (responses to imitate)",
            ));
        }
        if rollouts && ctx.is_set("response_template") {
            out.push(ctx.warning(
                "response_template",
                "`response_template` is ignored: the targets are the wired rollouts' responses",
            ));
        }
        out
    }

    fn outputs(&self) -> Vec<PortSpec> {
        done_output("the update counters; wire into `eval.after`")
    }

    fn params(&self) -> Vec<ParamSpec> {
        SftParams::param_specs()
    }

    fn timing_key(&self) -> Option<&str> {
        Some("update_actor")
    }

    fn data_parallel(&self) -> bool {
        true
    }

    /// Rows are the dataset's prompts (sized as [`Prompts::upstream`] finds them) plus an answer
    /// sized at [`ANSWER_TOKENS`] (the answers' lengths are the data's).
    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let p = ctx.parse::<SftParams>().ok()?;
        let mut f = Footprint::default();
        let Some((m, prompts)) = planned_prompts(ctx, &mut f) else {
            return Some(f);
        };
        let rows = prompts.per_step;
        let replica_rows = rows.div_ceil(ctx.replicas().max(1));
        let pass = Pass {
            rows,
            replica_rows,
            micro_rows: p
                .micro_batch_size
                .unwrap_or(replica_rows)
                .min(replica_rows)
                .max(1),
            len: prompts.len + ANSWER_TOKENS,
            response: ANSWER_TOKENS,
            mini_rows: replica_rows,
            n: 1,
        };
        training_footprint(
            &mut f,
            &m,
            ctx,
            Training {
                pass,
                prompts,
                chunk: p.chunk,
                lm_head: true,
                checkpointing: p.checkpointing.gradient_checkpointing,
                epochs: 1,
                vision: !p.optim.freeze_vision_tower,
                zero_stage: p.optim.zero_stage,
            },
        );
        Some(f)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: SftParams = params.parse()?;
        let model = ctx.resource::<ModelResource>(&p.model)?;
        ensure!(
            model.trainable,
            "model `{}` is a frozen copy and cannot be trained",
            p.model
        );
        model.tokenizer()?;
        p.optim.adamw()?;
        let schedule = p.optim.schedule(ctx.total_steps);
        Ok(Box::new(SftNode {
            replicas: Replicas::new(&ctx.placement, &ctx.node)?,
            p,
            model,
            schedule,
        }))
    }
}

struct SftNode {
    replicas: Replicas,
    p: SftParams,
    model: Arc<ModelResource>,
    schedule: LrSchedule,
}

/// The prompts with their target responses, as a rollout batch (n = 1).
pub fn target_batch(
    model: &ModelResource,
    prompts: &Arc<PromptBatch>,
    template: &str,
) -> Result<RolloutBatch> {
    let tok = model.tokenizer()?;
    let eos = on_backend!(model.backend(), B => {
        let s = model.lock::<B>()?;
        s.model.causal_lm().eos_token_ids().first().copied()
    });
    let mut response_ids = Vec::with_capacity(prompts.len());
    let mut texts = Vec::with_capacity(prompts.len());
    for p in &prompts.prompts {
        let text = template.replace("{answer}", &p.ground_truth);
        let mut ids = tok
            .encode(text.as_str(), false)
            .map_err(|e| anyhow::anyhow!("tokenizing the target of {}: {e}", p.uid))?
            .get_ids()
            .to_vec();
        ids.extend(eos);
        response_ids.push(ids);
        texts.push(text);
    }
    let b = prompts.len();
    let t = response_ids.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut mask = TokenMatrix::zeros(b, t);
    for (r, ids) in response_ids.iter().enumerate() {
        mask.row_mut(r)[..ids.len()].fill(1.0);
    }
    let batch = RolloutBatch::for_prompts(
        prompts.clone(),
        (0..b).collect(),
        response_ids,
        mask,
        TokenMatrix::zeros(b, t),
        texts,
        vec![false; b],
    );
    batch.check()?;
    Ok(batch)
}

impl Node for SftNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let batch = match inputs.get_opt(ROLLOUTS)? {
            Some(rollouts) => rollouts.clone(),
            None => target_batch(
                &self.model,
                &inputs.get_arc(PROMPTS)?,
                &self.p.response_template,
            )?,
        };
        on_backend!(self.model.backend(), B => self.step::<B>(&batch, ctx))
    }
}

impl SftNode {
    /// One optimizer step on the targets of `batch`, on the model's backend `B`.
    fn step<B: FlowBackend>(&self, batch: &RolloutBatch, ctx: &mut StepContext) -> Result<Outputs> {
        let b = batch.len();
        let micro = self.p.micro_batch_size.unwrap_or(b).min(b).max(1);
        let lr = self.schedule.lr(ctx.step());
        let mut state = self.model.lock::<B>()?;
        let rows: Vec<usize> = (0..b).collect();
        let info = global_batch_info(batch, &rows, &self.replicas);
        let precision = state.precision;
        let dropout_base = ctx.derive_seed("lora.dropout");
        let step = |model: &flowrl_models::Model<B>, mine: &[usize], mut sum: GradSum| {
            // LoRA dropout masks: one stream per (step, replica shard).
            let first = mine.first().map_or(u64::MAX, |&r| r as u64);
            let _scope = DropoutScope::enter(derive_seed(dropout_base, first, "rows"));
            let device = device_of(model);
            let mut total = 0.0;
            for chunk in mine.chunks(micro) {
                let seq = SequenceBatch::new(batch, chunk)?;
                let mask = seq.mask_tensor::<B>(&device);
                // Two-stage backward on one view of the weights in `precision` (a fresh one per
                // micro-batch: a backward consumes the graph of the casts); the gradients land
                // on `model`'s weights and at most one LM-head chunk of logits is alive at a time.
                let out = seq.loss_gradients_into(
                    model,
                    precision,
                    self.p.checkpointing.gradient_checkpointing,
                    1.0,
                    self.p.chunk.unwrap_or(B::LM_HEAD_CHUNK),
                    &device,
                    |log_probs, _entropy| sft_loss(log_probs, mask, &info),
                    &mut sum,
                )?;
                total += out.loss;
                if !out.loss.is_finite() {
                    return Ok(PartialStep {
                        grads: None,
                        stats: vec![total],
                    });
                }
            }
            Ok(PartialStep {
                grads: Some(sum.finish()),
                stats: vec![total],
            })
        };
        let (outcome, stats) =
            replicated_step(&self.replicas, &mut state, &self.p.optim, lr, &rows, step)
                .with_context(|| format!("node `{}`", ctx.node_name()))?;
        // The losses carry the factor W (dp_size); their replica sum is W × the batch loss.
        let total = stats[0] / self.replicas.world() as f64;
        let done = ModelUpdate::from(state.counters);
        drop(state);
        ctx.metric("train/loss", total);
        if outcome.applied {
            ctx.metric("actor/grad_norm", outcome.grad_norm);
        } else {
            ctx.warn("optimizer step skipped: non-finite loss or gradient norm");
        }
        ctx.metric("actor/lr", lr);
        ctx.metric(
            "actor/skipped_steps",
            if outcome.applied { 0.0 } else { 1.0 },
        );
        Ok(Outputs::new().with(DONE, done))
    }
}

/// The loss of `update.sft` on one micro-batch (see the module doc): the token-mean negative
/// log-likelihood of the targets, normalised by the batch's [`GlobalBatchInfo`] (its token count).
pub fn sft_loss<B: Backend>(
    log_probs: Tensor<B, 2>,
    mask: Tensor<B, 2>,
    info: &GlobalBatchInfo,
) -> Result<Tensor<B, 1>> {
    Ok(agg_loss(
        log_probs.neg(),
        mask,
        LossAggMode::TokenMean,
        info,
    )?)
}

flowrl_engine::register_node_kind!(SftUpdateKind);
