//! The `update.ppo` node kind: verl's actor update (`dp_actor.update_policy`).
//!
//! For each of `ppo_epochs` epochs, the batch is split in order into mini-batches of
//! `mini_batch_size` prompts (× the rollout's `n` responses); each mini-batch is one optimizer
//! step, its gradient accumulated over micro-batches of `micro_batch_size` responses, or of at
//! most `max_tokens_per_micro_batch` prompt + response tokens (verl `use_dynamic_bsz` +
//! `ppo_max_token_len_per_gpu`: rows packed by length, balanced; [`crate::train::micro_batches`]). The
//! loss of a micro-batch is
//!
//! ```text
//! L = pg_loss − entropy_coeff · agg(entropy) + kl.coef · agg(kl(logπ, logπ_ref))
//! ```
//!
//! (`flowrl_algorithms::compute_policy_loss`, `kl_penalty`, `agg_loss`), with `agg` normalised
//! over the **whole mini-batch** (`GlobalBatchInfo`: its valid-token count for `token-mean`, its
//! response count for the `seq-mean-*` modes), so the summed micro-batch gradients equal the
//! gradient of the mini-batch loss whatever the micro-batch size or token budget. After the last micro-batch:
//! global-norm clipping (`grad_clip`), then AdamW at the scheduled learning rate — or, when the
//! loss or the gradient norm is not finite, the step is skipped and counted
//! (`actor/skipped_steps`).
//!
//! `pg_loss` is the loss that `policy_loss` names by its verl registry name
//! (`actor.policy_loss.loss_mode`; default `vanilla`, PPO-clip), with verl's option names and
//! defaults (`clip_ratio*`, `tau_pos`, `tau_neg`, `clip_cov_*`, `kl_cov_ratio`, `ppo_kl_coef`,
//! `dro_beta`) and verl's semantics, including what a loss ignores: gspo and sapo always
//! aggregate `seq-mean-token-mean`, geo_mean averages over the micro-batch's sequences (no mode,
//! no mini-batch normalisation: the mini-batch loss is the sum of its micro-batch means, as in
//! verl). Validation warns about each option the graph sets that the chosen loss ignores.
//! clip_cov's random subset of tokens is drawn from a stream derived from (run seed, step, node,
//! epoch, mini-batch, micro-batch).
//!
//! `old_log_probs` is optional: when it is not wired, the update is on-policy and the old
//! log-probs are the current ones, detached (valid only with one epoch over one mini-batch;
//! checked). `ref_log_probs` is required by the KL loss.
//!
//! Metrics: `actor/pg_loss` and `actor/kl_loss` (mini-batch losses, mean over mini-batches),
//! `actor/pg_clipfrac`, `actor/pg_clipfrac_lower`, `actor/ppo_kl` (those the loss reports, see
//! `PolicyLossMode::metric_keys`), `actor/entropy` (means over micro-batches), `actor/grad_norm`
//! (mean over applied steps), `actor/lr`, `actor/kl_coef`, `actor/skipped_steps`. Autodiff
//! graphs live only inside one micro-batch. Timing key `update_actor`.
//!
//! Critic warm-up (verl `trainer.critic_warmup`, default 0): verl updates the actor at step s
//! (counted from 1) only when `critic_warmup <= s`, so `critic_warmup = N` skips the actor update
//! — and its metrics — on the first N − 1 steps while `update.critic` trains the value model;
//! `done` then carries the unchanged counters. Validation warns that `critic_warmup = 1` skips
//! nothing. The learning-rate schedule keeps following the run's step (verl's actor scheduler
//! does not advance while skipped; the two differ only with a warm-up or decay schedule).
//!
//! Each micro-batch's gradient comes from the two-stage backward of
//! [`crate::train::sequences::chunked_loss_backward`]: the log-probs and entropies as values (every
//! metric and the finite-loss check use them), the loss's gradient with respect to them ([`PpoLoss`]),
//! then one LM-head chunk's logits at a time recomputed and differentiated, and one trunk
//! backward; exactly the gradient of the loss through one graph, without ever holding the
//! `[B, T, V]` logits.

use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use burn::prelude::Tensor;
use flowrl_algorithms::{
    GlobalBatchInfo, KlEstimator, LossAggMode, LossAggregation, PolicyLossMode, masked_mean,
};
use flowrl_engine::{
    BuildContext, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec, Params,
    Port, PortSpec, StepContext, ValidateCtx, derive_seed,
};
use flowrl_engine::{Footprint, PlanCtx};
use flowrl_models::lora::DropoutScope;
use flowrl_models::weights::Precision;
use serde::Deserialize;

use crate::sizing::{Training, planned_pass, training_footprint};

use crate::kinds::update::ppo_loss::{PolicyLossParams, PpoLoss};
use crate::kinds::update::support::{
    ADVANTAGES, DONE, ROLLOUTS, done_output, mean, mini_batch_diagnostics, skipped_and_means,
    split_batches, trainable_model,
};
use crate::kinds::validate::upstream_batch_size;
use crate::resources::model::ModelResource;
use crate::runtime::backend::{FlowBackend, device_of, on_backend};
use crate::runtime::data_parallel::Replicas;
use crate::train::checkpoint::CheckpointingParams;
use crate::train::grad_sum::GradSum;
use crate::train::micro_batches::{self, MicroBatchParams, MicroBatching};
use crate::train::optim::LrSchedule;
use crate::train::replicated::replicated_step;
use crate::train::sequences::SequenceBatch;
use crate::train::{OptimParams, PartialStep, global_batch_info, rows_tensor, scalar};
use crate::values::{AdvantageBatch, ModelUpdate, RolloutBatch, TokenLogProbs, port_types};

/// The `update.ppo` kind.
pub struct PpoUpdateKind;

const OLD_LOG_PROBS: Port<TokenLogProbs> = Port::new("old_log_probs", port_types::TOKEN_LOG_PROBS);
const REF_LOG_PROBS: Port<TokenLogProbs> = Port::new("ref_log_probs", port_types::TOKEN_LOG_PROBS);

#[derive(Debug, Clone, Copy, Deserialize, Params)]
struct KlParams {
    /// KL estimator (verl kl_loss_type)
    #[serde(deserialize_with = "flowrl_engine::params::by_name")]
    #[param(one_of = &KlEstimator::NAMES, default = "low_var_kl")]
    estimator: KlEstimator,
    /// KL loss coefficient (verl kl_loss_coef)
    #[param(default = 0.001, min = 0.0)]
    coef: f64,
}

#[derive(Debug, Clone, Deserialize, Params)]
struct PpoParams {
    /// the policy to train
    #[param(resource = "model", required)]
    model: String,
    /// prompts per optimizer step (verl ppo_mini_batch_size); default: the whole batch
    #[param(min = 1.0)]
    mini_batch_size: Option<usize>,
    #[serde(flatten)]
    #[param(specs = micro_batches::param_specs(
        None,
        "responses per forward/backward (verl ppo_micro_batch_size_per_gpu); default: the mini-batch",
    ))]
    micro: MicroBatchParams,
    /// passes over the batch
    #[param(default = 1, min = 1.0)]
    ppo_epochs: usize,
    #[serde(flatten)]
    loss: PolicyLossParams,
    /// loss aggregation (verl loss_agg_mode; gspo and sapo aggregate their policy loss
    /// seq-mean-token-mean, geo_mean per sequence, whatever it says)
    #[serde(deserialize_with = "flowrl_engine::params::by_name")]
    #[param(one_of = &LossAggMode::ALL.map(|(_, n)| n), default = "token-mean")]
    loss_agg_mode: LossAggMode,
    /// KL loss against `ref_log_probs` (verl use_kl_loss; absent = no KL loss)
    #[param(switch)]
    kl: Option<KlParams>,
    /// entropy bonus coefficient
    #[param(default = 0.0)]
    entropy_coeff: f64,
    /// logits are divided by it (use the rollout's)
    #[param(default = 1.0, gt = 0.0)]
    temperature: f64,
    /// response positions per LM-head block; default: 16 on the CPU, 128 on a GPU
    #[param(min = 1.0)]
    chunk: Option<usize>,
    /// verl trainer.critic_warmup: the actor is updated at step s (from 1) only when
    /// critic_warmup <= s, so N skips the first N − 1 updates while the critic trains
    #[param(default = 0, min = 0.0)]
    critic_warmup: u64,
    #[serde(flatten)]
    optim: OptimParams,
    #[serde(flatten)]
    checkpointing: CheckpointingParams,
}

/// The log-probs wired to the update come from the right models: `old_log_probs` from the
/// model it trains (the importance ratio π_θ / π_old is of one model), `ref_log_probs` from one
/// that no update node trains (the KL reference stays put). Swapped wires validate otherwise
/// and train wrong.
fn log_prob_sources(ctx: &ValidateCtx) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let Some(trained) = ctx.params().get_str("model") else {
        return out;
    };
    let model_of = |port: &str| {
        let node = ctx.input(port)?;
        let model = node.params().get_str("model")?.to_string();
        Some((node.name().to_string(), model))
    };
    if let Some((node, model)) = model_of(OLD_LOG_PROBS.name())
        && model != trained
    {
        out.push(ctx.error(
            "inputs.old_log_probs",
            format!(
                "`old_log_probs` comes from node `{node}` on model `{model}`, but this update \
                 trains `{trained}`: the importance ratio needs the trained model's log-probs \
                 (are `old_log_probs` and `ref_log_probs` swapped?)"
            ),
        ));
    }
    if let Some((node, model)) = model_of(REF_LOG_PROBS.name()) {
        let updaters: Vec<String> = ctx
            .nodes()
            .iter()
            .filter(|n| {
                n.kind().starts_with("update.") && n.params().get_str("model") == Some(&model)
            })
            .map(|n| format!("`{}`", n.name()))
            .collect();
        if !updaters.is_empty() {
            out.push(ctx.error(
                "inputs.ref_log_probs",
                format!(
                    "`ref_log_probs` comes from node `{node}` on model `{model}`, which {} \
                     trains: the KL reference must be a frozen model (`[models.reference] from = \
                     \"{trained}\"`; are `old_log_probs` and `ref_log_probs` swapped?)",
                    updaters.join(", ")
                ),
            ));
        }
    }
    out
}

impl NodeKind for PpoUpdateKind {
    fn name(&self) -> &str {
        "update.ppo"
    }

    fn doc(&self) -> &str {
        "PPO/GRPO policy update (verl's actor): a policy loss of verl's registry (`policy_loss`, \
         default PPO-clip) + optional KL loss + optional entropy bonus; mini-batches × epochs × \
         micro-batches with gradient accumulation normalised over the mini-batch; global-norm \
         clipping; AdamW with warm-up; non-finite steps skipped."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            ROLLOUTS.spec(),
            ADVANTAGES.spec(),
            OLD_LOG_PROBS
                .spec()
                .optional()
                .doc("log-probs before the update; unwired = on-policy (current, detached)"),
            REF_LOG_PROBS
                .spec()
                .optional()
                .doc("reference log-probs, required by `kl`"),
        ]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        done_output("the update counters; wire into `eval.after` to evaluate the updated weights")
    }

    fn params(&self) -> Vec<ParamSpec> {
        PpoParams::param_specs()
    }

    fn timing_key(&self) -> Option<&str> {
        Some("update_actor")
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let p = match ctx.parse::<PpoParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        let mut out = loss_diagnostics(ctx, &p);
        if p.kl.is_some() && ctx.input(REF_LOG_PROBS.name()).is_none() {
            out.push(ctx.error(
                "kl",
                "the KL loss needs the reference log-probs: wire `ref_log_probs` (a `logprob` node on the reference model)",
            ));
        }
        let batch = upstream_batch_size(ctx);
        let mini = p.mini_batch_size;
        out.extend(mini_batch_diagnostics(ctx, mini, p.micro.micro_batch_size));
        out.extend(micro_batches::diagnostics(ctx));
        if ctx.is_set("critic_warmup") && p.critic_warmup == 1 {
            out.push(ctx.warning(
                "critic_warmup",
                "critic_warmup = 1 skips no actor update: as in verl, the actor is updated at step s (counted from 1) when critic_warmup <= s; N skips the first N − 1 steps",
            ));
        }
        out.extend(log_prob_sources(ctx));
        if ctx.input(OLD_LOG_PROBS.name()).is_none() {
            let several_minis = matches!((&batch, mini), (Some((b, _)), Some(m)) if m < *b)
                || (batch.is_none() && mini.is_some());
            if p.ppo_epochs > 1 || several_minis {
                out.push(ctx.error(
                    "ppo_epochs",
                    "without `old_log_probs` the update is on-policy, which needs ppo_epochs = 1 and one mini-batch per step; wire `old_log_probs` from a `logprob` node",
                ));
            }
        }
        out
    }

    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let p = ctx.parse::<PpoParams>().ok()?;
        let mut f = Footprint::default();
        let Some((m, pass, prompts)) = planned_pass(ctx, &mut f, &p.micro, p.mini_batch_size)
        else {
            return Some(f);
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
                epochs: p.ppo_epochs,
                vision: !p.optim.freeze_vision_tower,
                zero_stage: p.optim.zero_stage,
            },
        );
        Some(f)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: PpoParams = params.parse()?;
        let model = trainable_model(ctx, &p.model)?;
        let policy = p.loss.config();
        policy.validate()?;
        let mode = p.loss_agg_mode;
        let kl = p.kl.map(|k| (k.estimator, k.coef));
        let schedule = p.optim.schedule(ctx.total_steps);
        p.optim.adamw()?;
        let entropy_coeff = p.entropy_coeff;
        Ok(Box::new(PpoUpdateNode {
            replicas: Replicas::new(&ctx.placement, &ctx.node)?,
            p,
            model,
            loss: PpoLoss {
                policy,
                mode,
                entropy_coeff,
                kl,
            },
            schedule,
        }))
    }
}

struct PpoUpdateNode {
    replicas: Replicas,
    p: PpoParams,
    model: Arc<ModelResource>,
    /// The loss settings (from `p`, parsed once).
    loss: PpoLoss,
    schedule: LrSchedule,
}

/// The metrics of one step: per-micro-batch sums with their count, per-mini-batch losses,
/// per-applied-step gradient norms.
#[derive(Default)]
struct Sums {
    pg_loss: Vec<f64>,
    kl_loss: Vec<f64>,
    micro: MicroSums,
    grad_norm: Vec<f64>,
    skipped: u64,
}

/// Declares [`MicroSums`] from one list of its fields: the struct, its flattening for the
/// all-reduce and back, and the sum of two.
macro_rules! micro_sums {
    ($($(#[$doc:meta])* $field:ident),+ $(,)?) => {
        /// Sums over micro-batches (added up over replicas by the all-reduce): the mini-batch's
        /// policy and KL losses (each micro-batch's share of the globally normalised loss) and
        /// the sums of the per-micro-batch metrics, with the micro-batch count.
        #[derive(Default, Clone, Copy)]
        struct MicroSums {
            $($(#[$doc])* $field: f64,)+
        }

        impl MicroSums {
            /// How many numbers [`MicroSums::to_vec`] gives.
            const LEN: usize = [$(stringify!($field)),+].len();

            fn to_vec(self) -> Vec<f64> {
                vec![$(self.$field),+]
            }

            fn from_slice(v: &[f64]) -> Result<Self> {
                ensure!(
                    v.len() == Self::LEN,
                    "expected {} update statistics, got {}",
                    Self::LEN,
                    v.len()
                );
                let mut values = v.iter().copied();
                Ok(MicroSums {
                    $($field: values.next().expect("length checked"),)+
                })
            }

            fn add(&mut self, o: &MicroSums) {
                $(self.$field += o.$field;)+
            }
        }
    };
}

micro_sums! {
    pg_loss,
    kl_loss,
    clipfrac,
    clipfrac_lower,
    ppo_kl,
    entropy,
    count,
}

impl Node for PpoUpdateNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        if ctx.step() + 1 < self.p.critic_warmup {
            // Critic warm-up (see the module doc): no actor update, unchanged counters.
            let counters = on_backend!(self.model.backend(), B => {
                self.model.lock::<B>()?.counters
            });
            return Ok(Outputs::new().with(DONE, ModelUpdate::from(counters)));
        }
        let rollouts = inputs.get_arc(ROLLOUTS)?;
        let adv = inputs.get_arc(ADVANTAGES)?;
        let old = inputs.get_opt(OLD_LOG_PROBS)?;
        let reference = inputs.get_opt(REF_LOG_PROBS)?;
        let shape = rollouts.response_mask.shape();
        ensure!(
            adv.advantages.shape() == shape,
            "advantages {:?} do not match the rollouts {:?}",
            adv.advantages.shape(),
            shape
        );
        for (name, lp) in [("old_log_probs", old), ("ref_log_probs", reference)] {
            if let Some(lp) = lp {
                ensure!(
                    lp.log_probs.shape() == shape,
                    "{name} {:?} do not match the rollouts {:?}",
                    lp.log_probs.shape(),
                    shape
                );
            }
        }
        if self.loss.kl.is_some() && reference.is_none() {
            bail!("the KL loss needs `ref_log_probs`");
        }

        let (mini_rows, micro) =
            split_batches(self.p.mini_batch_size, &self.p.micro, &rollouts, ctx)?;
        if old.is_none() && (self.p.ppo_epochs > 1 || mini_rows < rollouts.len()) {
            bail!("without `old_log_probs` the update must be one epoch over one mini-batch");
        }
        on_backend!(self.model.backend(), B => {
            self.update::<B>(&rollouts, &adv, old, reference, mini_rows, micro, ctx)
        })
    }
}

impl PpoUpdateNode {
    /// The epochs of mini-batch steps over `rollouts`, on the model's backend `B`, and the
    /// step's metrics.
    #[allow(clippy::too_many_arguments)]
    fn update<B: FlowBackend>(
        &self,
        rollouts: &RolloutBatch,
        adv: &AdvantageBatch,
        old: Option<&TokenLogProbs>,
        reference: Option<&TokenLogProbs>,
        mini_rows: usize,
        micro: MicroBatching,
        ctx: &mut StepContext,
    ) -> Result<Outputs> {
        let b = rollouts.len();
        let lr = self.schedule.lr(ctx.step());
        let mut sums = Sums::default();
        let mut state = self.model.lock::<B>()?;
        let precision = state.precision;
        let rows: Vec<usize> = (0..b).collect();
        let world = self.replicas.world();
        let dropout_base = ctx.derive_seed("lora.dropout");
        let loss_base = ctx.derive_seed("policy_loss");
        for epoch in 0..self.p.ppo_epochs {
            for (k, mini) in rows.chunks(mini_rows).enumerate() {
                let info = global_batch_info(rollouts, mini, &self.replicas);
                let mini_seed = derive_seed(dropout_base, (epoch * b + k) as u64, "mini-batch");
                let loss_seed = derive_seed(loss_base, (epoch * b + k) as u64, "mini-batch");
                let compute = |model: &flowrl_models::Model<B>, mine: &[usize], sum: GradSum| {
                    // LoRA dropout masks: one stream per (step, epoch, mini-batch, replica shard).
                    let first = mine.first().map_or(u64::MAX, |&r| r as u64);
                    let _scope = DropoutScope::enter(derive_seed(mini_seed, first, "rows"));
                    self.mini_batch_grads(
                        model, precision, rollouts, adv, old, reference, &info, mine, micro,
                        loss_seed, sum,
                    )
                };
                let (outcome, stats) =
                    replicated_step(&self.replicas, &mut state, &self.p.optim, lr, mini, compute)
                        .with_context(|| format!("update `{}`", ctx.node_name()))?;
                let m = MicroSums::from_slice(&stats)?;
                sums.micro.add(&m);
                if outcome.finite_loss {
                    // The losses carry the factor W (dp_size); their replica sum is W × the loss.
                    sums.pg_loss.push(m.pg_loss / world as f64);
                    if self.loss.kl.is_some() {
                        sums.kl_loss.push(m.kl_loss / world as f64);
                    }
                }
                if outcome.applied {
                    sums.grad_norm.push(outcome.grad_norm);
                } else {
                    sums.skipped += 1;
                }
            }
        }
        let done = ModelUpdate::from(state.counters);
        drop(state);
        skipped_and_means(
            ctx,
            "optimizer",
            sums.skipped,
            [
                ("actor/pg_loss", &sums.pg_loss),
                ("actor/grad_norm", &sums.grad_norm),
            ],
        );
        let m = &sums.micro;
        if m.count > 0.0 {
            let reported = self.loss.policy.loss_mode.metric_keys();
            for (name, v) in [
                ("actor/pg_clipfrac", m.clipfrac),
                ("actor/pg_clipfrac_lower", m.clipfrac_lower),
                ("actor/ppo_kl", m.ppo_kl),
                ("actor/entropy", m.entropy),
            ] {
                if name == "actor/entropy" || reported.contains(&name) {
                    ctx.metric(name, v / m.count);
                }
            }
        }
        if let Some((_, coef)) = self.loss.kl {
            if let Some(m) = mean(&sums.kl_loss) {
                ctx.metric("actor/kl_loss", m);
            }
            ctx.metric("actor/kl_coef", coef);
        }
        ctx.metric("actor/lr", lr);
        ctx.metric("actor/skipped_steps", sums.skipped as f64);
        // verl's compute_throughout_metrics: every token of the trained batch.
        ctx.metric("perf/total_num_tokens", rollouts.total_tokens() as f64);
        Ok(Outputs::new().with(DONE, done))
    }

    /// One replica's accumulated gradients over its rows `mine` of a mini-batch (`None` when a
    /// micro-batch loss is not finite), with its [`MicroSums`]. The loss is normalised by the
    /// mini-batch's `info` (its token and row counts, scaled by the replica count); `loss_seed`
    /// seeds the loss's random draws (clip_cov), per micro-batch by its first row.
    #[allow(clippy::too_many_arguments)]
    fn mini_batch_grads<B: FlowBackend>(
        &self,
        model: &flowrl_models::Model<B>,
        precision: Precision,
        rollouts: &RolloutBatch,
        adv: &AdvantageBatch,
        old: Option<&TokenLogProbs>,
        reference: Option<&TokenLogProbs>,
        info: &GlobalBatchInfo,
        mine: &[usize],
        micro: MicroBatching,
        loss_seed: u64,
        mut sum: GradSum,
    ) -> Result<PartialStep> {
        let device = device_of(model);
        let mut sums = MicroSums::default();
        let mut finite = true;
        let loss = self.loss;
        for micro in micro.split(rollouts, mine) {
            let micro = micro.as_slice();
            let seq = SequenceBatch::with_layout(rollouts, micro, self.p.micro.layout())?;
            let mask = seq.mask_tensor::<B>(&device);
            // Two-stage backward on one view of the weights in `precision` (a fresh one per
            // micro-batch: a backward consumes the graph of the casts); the gradients land on
            // `model`'s weights and at most one LM-head chunk of logits is alive at a time.
            let out = seq.loss_gradients_into(
                model,
                precision,
                self.p.checkpointing.gradient_checkpointing,
                self.p.temperature,
                self.p.chunk.unwrap_or(B::LM_HEAD_CHUNK),
                &device,
                |log_probs, entropy| {
                    let old_lp = match old {
                        Some(o) => rows_tensor::<B>(&o.log_probs, micro, &device),
                        // On-policy: the current log-probs as a constant (`detach` of the leaf
                        // would keep it a leaf).
                        None => Tensor::from_inner(log_probs.clone().inner()),
                    };
                    let parts = loss.terms(
                        log_probs,
                        entropy,
                        old_lp,
                        rows_tensor::<B>(&adv.advantages, micro, &device),
                        mask.clone(),
                        reference.map(|r| rows_tensor::<B>(&r.log_probs, micro, &device)),
                        info,
                        derive_seed(loss_seed, micro[0] as u64, "rows"),
                    )?;
                    if let Some(kl_loss) = &parts.kl_loss {
                        sums.kl_loss += scalar(kl_loss.clone().detach());
                    }
                    sums.pg_loss += scalar(parts.policy.pg_loss.clone().detach());
                    let metric = |m: Option<Tensor<B, 1>>| m.map_or(0.0, scalar);
                    sums.clipfrac += metric(parts.policy.pg_clipfrac);
                    sums.clipfrac_lower += metric(parts.policy.pg_clipfrac_lower);
                    sums.ppo_kl += metric(parts.policy.ppo_kl);
                    Ok(parts.loss)
                },
                &mut sum,
            )?;
            sums.entropy += scalar(masked_mean(out.values.entropy, mask));
            sums.count += 1.0;
            if !out.loss.is_finite() {
                finite = false;
                break;
            }
        }
        Ok(PartialStep {
            grads: finite.then(|| sum.finish()),
            stats: sums.to_vec(),
        })
    }
}

/// The policy loss's diagnostics: a warning for each option the graph sets that the chosen loss
/// ignores (as verl ignores it), and DRO's required `dro_beta`.
fn loss_diagnostics(ctx: &ValidateCtx, p: &PpoParams) -> Vec<Diagnostic> {
    let loss = p.loss.policy_loss;
    let mut out = Vec::new();
    let reads = loss.reads();
    // Every option of any loss, in declaration order.
    let mut options: Vec<&str> = Vec::new();
    for (mode, _) in PolicyLossMode::ALL {
        for key in mode.reads() {
            if !options.contains(key) {
                options.push(key);
            }
        }
    }
    for key in options {
        if ctx.is_set(key) && !reads.contains(&key) {
            let used = if reads.is_empty() {
                "it reads none of the loss options".to_string()
            } else {
                format!("it reads {}", reads.join(", "))
            };
            out.push(ctx.warning(
                key,
                format!("`{key}` has no effect with policy_loss = \"{loss}\" ({used})"),
            ));
        }
    }
    let other_terms = p.kl.is_some() || p.entropy_coeff != 0.0;
    let scope = if other_terms {
        "; it still applies to the KL and entropy terms"
    } else {
        ""
    };
    match loss.aggregation() {
        LossAggregation::Fixed(fixed) if ctx.is_set("loss_agg_mode") => {
            out.push(ctx.warning(
                "loss_agg_mode",
                format!(
                    "policy_loss = \"{loss}\" always aggregates its policy loss with {fixed} (as in verl), whatever `loss_agg_mode` says{scope}"
                ),
            ));
        }
        LossAggregation::RowMean => {
            if ctx.is_set("loss_agg_mode") {
                out.push(ctx.warning(
                    "loss_agg_mode",
                    format!(
                        "policy_loss = \"{loss}\" averages its policy loss over the sequences of each micro-batch (as in verl), whatever `loss_agg_mode` says{scope}"
                    ),
                ));
            }
            if let Some(key) = ["micro_batch_size", "max_tokens_per_micro_batch"]
                .into_iter()
                .find(|k| ctx.is_set(k))
            {
                out.push(ctx.warning(
                    key,
                    format!(
                        "policy_loss = \"{loss}\" ignores the mini-batch normalisation (as in verl): the mini-batch's policy loss is the sum of its micro-batch means, so the gradient scales with the number of micro-batches"
                    ),
                ));
            }
        }
        _ => {}
    }
    if loss == PolicyLossMode::Dro && p.loss.dro_beta.is_none() {
        out.push(ctx.error(
            "policy_loss",
            "policy_loss = \"dro\" needs `dro_beta` > 0 (verl: policy_loss.dro_beta must be a positive value when using DRO)",
        ));
    }
    out
}

flowrl_engine::register_node_kind!(PpoUpdateKind);
