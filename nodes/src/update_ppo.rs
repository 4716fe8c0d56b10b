//! The `update.ppo` node kind: verl's actor update (`dp_actor.update_policy`).
//!
//! For each of `ppo_epochs` epochs, the batch is split in order into mini-batches of
//! `mini_batch_size` prompts (× the rollout's `n` responses); each mini-batch is one optimizer
//! step, its gradient accumulated over micro-batches of `micro_batch_size` responses, or of at
//! most `max_tokens_per_micro_batch` prompt + response tokens (verl `use_dynamic_bsz` +
//! `ppo_max_token_len_per_gpu`: rows packed by length, balanced; [`crate::micro_batches`]). The
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
//! [`crate::sequences::chunked_loss_backward`]: the log-probs and entropies as values (every
//! metric and the finite-loss check use them), the loss's gradient with respect to them ([`PpoLoss`]),
//! then one LM-head chunk's logits at a time recomputed and differentiated, and one trunk
//! backward; exactly the gradient of the loss through one graph, without ever holding the
//! `[B, T, V]` logits.

use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use burn::optim::GradientsAccumulator;
use burn::prelude::{Backend, Tensor};
use flowrl_algorithms::{
    ClipConfig, ClipCovConfig, GlobalBatchInfo, KlCovConfig, KlEstimator, LossAggMode,
    LossAggregation, PolicyLossConfig, PolicyLossInputs, PolicyLossMode, PolicyLossOutput,
    agg_loss, compute_policy_loss, kl_penalty, masked_mean,
};
use flowrl_engine::{
    BuildContext, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamSpec, Params, PortSpec,
    PortType, StepContext, ValidateCtx, derive_seed,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Deserialize;

use crate::backend::{FlowBackend, device_of, on_backend};
use crate::data_parallel::Replicas;
use crate::micro_batches::{self, MicroBatching};
use crate::model_resource::ModelResource;
use crate::optim::LrSchedule;
use crate::sequences::SequenceBatch;
use crate::train::{
    OptimParams, PartialStep, global_batch_info, guarded_step, optim_param_specs, replicated_grads,
    rows_tensor, scalar,
};
use crate::validate::{upstream_batch_size, upstream_rollout_n};
use crate::values::{AdvantageBatch, ModelUpdate, RolloutBatch, TokenLogProbs, port_types};
use flowrl_models::lora::DropoutScope;
use flowrl_models::weights::Precision;

/// The `update.ppo` kind.
pub struct PpoUpdateKind;

#[derive(Debug, Clone, Deserialize)]
struct KlParams {
    estimator: String,
    coef: f64,
}

#[derive(Debug, Clone, Deserialize)]
struct PpoParams {
    model: String,
    #[serde(flatten)]
    optim: OptimParams,
    mini_batch_size: Option<usize>,
    micro_batch_size: Option<usize>,
    max_tokens_per_micro_batch: Option<usize>,
    ppo_epochs: usize,
    policy_loss: String,
    clip_ratio: f64,
    clip_ratio_low: Option<f64>,
    clip_ratio_high: Option<f64>,
    clip_ratio_c: f64,
    tau_pos: f64,
    tau_neg: f64,
    clip_cov_ratio: f64,
    clip_cov_lb: f64,
    clip_cov_ub: f64,
    kl_cov_ratio: f64,
    ppo_kl_coef: f64,
    dro_beta: Option<f64>,
    loss_agg_mode: String,
    kl: Option<KlParams>,
    entropy_coeff: f64,
    temperature: f64,
    chunk: usize,
    critic_warmup: u64,
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
            PortSpec::new("rollouts", PortType::new(port_types::ROLLOUTS)),
            PortSpec::new("advantages", PortType::new(port_types::ADVANTAGES)),
            PortSpec::new("old_log_probs", PortType::new(port_types::TOKEN_LOG_PROBS))
                .optional()
                .doc("log-probs before the update; unwired = on-policy (current, detached)"),
            PortSpec::new("ref_log_probs", PortType::new(port_types::TOKEN_LOG_PROBS))
                .optional()
                .doc("reference log-probs, required by `kl`"),
        ]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        vec![
            PortSpec::new("done", PortType::new(port_types::MODEL_UPDATE))
                .doc("the update counters; wire into `eval.after` to evaluate the updated weights"),
        ]
    }

    fn params(&self) -> Vec<ParamSpec> {
        let mut p = vec![
            ParamSpec::resource("model", "model")
                .required()
                .doc("the policy to train"),
            ParamSpec::int("mini_batch_size").min(1.0).doc(
                "prompts per optimizer step (verl ppo_mini_batch_size); default: the whole batch",
            ),
        ];
        p.extend(micro_batches::param_specs(
            None,
            "responses per forward/backward (verl ppo_micro_batch_size_per_gpu); default: the mini-batch",
        ));
        p.extend([
            ParamSpec::int("ppo_epochs").default(1).min(1.0).doc("passes over the batch"),
            ParamSpec::one_of("policy_loss", &PolicyLossMode::ALL.map(|(_, n)| n))
                .default("vanilla")
                .doc("policy loss by verl's name (actor.policy_loss.loss_mode; vanilla = PPO-clip with dual clip); the options below say which losses read them, and `flowrl validate` warns about a set option the loss ignores"),
            ParamSpec::float("clip_ratio").default(0.2).min(0.0).doc("ε: bounds the ratio (vanilla, gspo, clip_cov, cispo), the probability difference or binary KL (dppo_*), the log-ratio (geo_mean)"),
            ParamSpec::float("clip_ratio_low").min(0.0).doc("lower ε (default clip_ratio)"),
            ParamSpec::float("clip_ratio_high").min(0.0).doc("upper ε (default clip_ratio; > low is clip-higher)"),
            ParamSpec::float("clip_ratio_c").default(3.0).gt(1.0).doc("dual-clip constant (vanilla); importance-ratio truncation (dppo_*)"),
            ParamSpec::float("tau_pos").default(1.0).gt(0.0).doc("sapo: gate temperature where A > 0"),
            ParamSpec::float("tau_neg").default(1.05).gt(0.0).doc("sapo: gate temperature where A <= 0"),
            ParamSpec::float("clip_cov_ratio").default(0.0002).gt(0.0).doc("clip_cov: at most this fraction of the tokens is detached"),
            ParamSpec::float("clip_cov_lb").default(1.0).doc("clip_cov: a detached token's covariance is above this"),
            ParamSpec::float("clip_cov_ub").default(5.0).doc("clip_cov: a detached token's covariance is below this"),
            ParamSpec::float("kl_cov_ratio").default(0.0002).gt(0.0).max(1.0).doc("kl_cov: fraction of the tokens (largest covariance) that get the KL penalty"),
            ParamSpec::float("ppo_kl_coef").default(0.1).doc("kl_cov: coefficient of the |log-ratio| penalty"),
            ParamSpec::float("dro_beta").gt(0.0).doc("dro: β of the ½·β·δ² penalty (required by dro)"),
            ParamSpec::one_of(
                "loss_agg_mode",
                &LossAggMode::ALL.map(|(_, n)| n),
            )
            .default("token-mean")
            .doc("loss aggregation (verl loss_agg_mode; gspo and sapo aggregate their policy loss seq-mean-token-mean, geo_mean per sequence, whatever it says)"),
            ParamSpec::table(
                "kl",
                vec![
                    ParamSpec::one_of(
                        "estimator",
                        &["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"],
                    )
                    .default("low_var_kl")
                    .doc("KL estimator (verl kl_loss_type)"),
                    ParamSpec::float("coef").default(0.001).min(0.0).doc("KL loss coefficient (verl kl_loss_coef)"),
                ],
            )
            .switch()
            .doc("KL loss against `ref_log_probs` (verl use_kl_loss; absent = no KL loss)"),
            ParamSpec::float("entropy_coeff").default(0.0).doc("entropy bonus coefficient"),
            ParamSpec::float("temperature").default(1.0).gt(0.0).doc("logits are divided by it (use the rollout's)"),
            ParamSpec::int("chunk").default(16).min(1.0).doc("response positions per LM-head block"),
            ParamSpec::int("critic_warmup").default(0).min(0.0).doc("verl trainer.critic_warmup: the actor is updated at step s (from 1) only when critic_warmup <= s, so N skips the first N − 1 updates while the critic trains"),
        ]);
        p.extend(optim_param_specs());
        p
    }

    fn timing_key(&self) -> Option<&str> {
        Some("update_actor")
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let p = ctx.params();
        let mut out = loss_diagnostics(ctx);
        if p.get("kl").is_some() && ctx.input("ref_log_probs").is_none() {
            out.push(ctx.error(
                "kl",
                "the KL loss needs the reference log-probs: wire `ref_log_probs` (a `logprob` node on the reference model)",
            ));
        }
        let epochs = p.get_i64("ppo_epochs").unwrap_or(1) as usize;
        let batch = upstream_batch_size(ctx);
        let mini = p.get_i64("mini_batch_size").map(|m| m as usize);
        out.extend(mini_batch_diagnostics(ctx));
        out.extend(micro_batches::diagnostics(ctx));
        if ctx.is_set("critic_warmup") && p.get_i64("critic_warmup") == Some(1) {
            out.push(ctx.warning(
                "critic_warmup",
                "critic_warmup = 1 skips no actor update: as in verl, the actor is updated at step s (counted from 1) when critic_warmup <= s; N skips the first N − 1 steps",
            ));
        }
        if ctx.input("old_log_probs").is_none() {
            let several_minis = matches!((&batch, mini), (Some((b, _)), Some(m)) if m < *b)
                || (batch.is_none() && mini.is_some());
            if epochs > 1 || several_minis {
                out.push(ctx.error(
                    "ppo_epochs",
                    "without `old_log_probs` the update is on-policy, which needs ppo_epochs = 1 and one mini-batch per step; wire `old_log_probs` from a `logprob` node",
                ));
            }
        }
        out
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: PpoParams = params.parse()?;
        let model = ctx.resource::<ModelResource>(&p.model)?;
        ensure!(
            model.trainable,
            "model `{}` is a frozen copy and cannot be trained by `{}`",
            p.model,
            ctx.node
        );
        let policy = PolicyLossConfig {
            loss_mode: p.policy_loss.parse()?,
            clip: ClipConfig {
                clip_ratio: p.clip_ratio,
                clip_ratio_low: p.clip_ratio_low,
                clip_ratio_high: p.clip_ratio_high,
                clip_ratio_c: p.clip_ratio_c,
            },
            tau_pos: p.tau_pos,
            tau_neg: p.tau_neg,
            clip_cov: ClipCovConfig {
                ratio: p.clip_cov_ratio,
                lb: p.clip_cov_lb,
                ub: p.clip_cov_ub,
            },
            kl_cov: KlCovConfig {
                ratio: p.kl_cov_ratio,
                coef: p.ppo_kl_coef,
            },
            dro_beta: p.dro_beta,
        };
        policy.validate()?;
        let mode: LossAggMode = p.loss_agg_mode.parse()?;
        let kl = match &p.kl {
            Some(k) => Some((k.estimator.parse::<KlEstimator>()?, k.coef)),
            None => None,
        };
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

/// Sums over micro-batches (added up over replicas by the all-reduce): the mini-batch's policy
/// and KL losses (each micro-batch's share of the globally normalised loss) and the sums of the
/// per-micro-batch metrics, with the micro-batch count.
#[derive(Default, Clone, Copy)]
struct MicroSums {
    pg_loss: f64,
    kl_loss: f64,
    clipfrac: f64,
    clipfrac_lower: f64,
    ppo_kl: f64,
    entropy: f64,
    count: f64,
}

impl MicroSums {
    fn to_vec(self) -> Vec<f64> {
        vec![
            self.pg_loss,
            self.kl_loss,
            self.clipfrac,
            self.clipfrac_lower,
            self.ppo_kl,
            self.entropy,
            self.count,
        ]
    }

    fn from_slice(v: &[f64]) -> Result<Self> {
        ensure!(
            v.len() == 7,
            "expected 7 update statistics, got {}",
            v.len()
        );
        Ok(MicroSums {
            pg_loss: v[0],
            kl_loss: v[1],
            clipfrac: v[2],
            clipfrac_lower: v[3],
            ppo_kl: v[4],
            entropy: v[5],
            count: v[6],
        })
    }

    fn add(&mut self, o: &MicroSums) {
        self.clipfrac += o.clipfrac;
        self.clipfrac_lower += o.clipfrac_lower;
        self.ppo_kl += o.ppo_kl;
        self.entropy += o.entropy;
        self.count += o.count;
    }
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

impl Node for PpoUpdateNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        if ctx.step() + 1 < self.p.critic_warmup {
            // Critic warm-up (see the module doc): no actor update, unchanged counters.
            let counters = on_backend!(self.model.backend(), B => {
                self.model.lock::<B>()?.counters
            });
            return Ok(Outputs::new().with(
                "done",
                ModelUpdate {
                    optimizer_steps: counters.optimizer_steps,
                    skipped_steps: counters.skipped_steps,
                },
            ));
        }
        let rollouts = inputs.get_arc::<RolloutBatch>("rollouts")?;
        let adv = inputs.get_arc::<AdvantageBatch>("advantages")?;
        let old = inputs.get_opt::<TokenLogProbs>("old_log_probs")?;
        let reference = inputs.get_opt::<TokenLogProbs>("ref_log_probs")?;
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

        let b = rollouts.len();
        let n = (b / rollouts.prompts.len().max(1)).max(1);
        let mini_rows = self.p.mini_batch_size.map(|m| m * n).unwrap_or(b).min(b);
        let micro = MicroBatching::new(
            self.p.micro_batch_size.unwrap_or(mini_rows).min(mini_rows),
            self.p.max_tokens_per_micro_batch,
        )?;
        let all: Vec<usize> = (0..b).collect();
        if let Some(w) = micro.oversized_warning(&rollouts, &all) {
            ctx.warn(w);
        }
        if old.is_none() && (self.p.ppo_epochs > 1 || mini_rows < b) {
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
        let adamw = self.p.optim.adamw()?;
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
                let step = replicated_grads(&self.replicas, &state.model, mini, |model, mine| {
                    // LoRA dropout masks: one stream per (step, epoch, mini-batch, replica shard).
                    let first = mine.first().map_or(u64::MAX, |&r| r as u64);
                    let _scope = DropoutScope::enter(derive_seed(mini_seed, first, "rows"));
                    self.mini_batch_grads(
                        model, precision, rollouts, adv, old, reference, &info, mine, micro,
                        loss_seed,
                    )
                })
                .with_context(|| format!("update `{}`", ctx.node_name()))?;
                let m = MicroSums::from_slice(&step.stats)?;
                sums.micro.add(&m);
                if step.grads.is_some() {
                    // The losses carry the factor W (dp_size); their replica sum is W × the loss.
                    sums.pg_loss.push(m.pg_loss / world as f64);
                    if self.loss.kl.is_some() {
                        sums.kl_loss.push(m.kl_loss / world as f64);
                    }
                }
                let outcome = guarded_step(
                    &mut state,
                    adamw,
                    step.grads,
                    lr,
                    self.p.optim.grad_clip,
                    self.p.optim.freeze_vision_tower,
                );
                if outcome.applied {
                    sums.grad_norm.push(outcome.grad_norm);
                } else {
                    sums.skipped += 1;
                }
            }
        }
        let done = ModelUpdate {
            optimizer_steps: state.counters.optimizer_steps,
            skipped_steps: state.counters.skipped_steps,
        };
        drop(state);
        if sums.skipped > 0 {
            ctx.warn(format!(
                "{} optimizer step(s) skipped: non-finite loss or gradient norm",
                sums.skipped
            ));
        }
        for (name, v) in [
            ("actor/pg_loss", &sums.pg_loss),
            ("actor/grad_norm", &sums.grad_norm),
        ] {
            if let Some(m) = mean(v) {
                ctx.metric(name, m);
            }
        }
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
        Ok(Outputs::new().with("done", done))
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
    ) -> Result<PartialStep> {
        let device = device_of(model);
        let mut acc = GradientsAccumulator::<flowrl_models::Model<B>>::new();
        let mut sums = MicroSums::default();
        let mut finite = true;
        let loss = self.loss;
        for micro in micro.split(rollouts, mine) {
            let micro = micro.as_slice();
            let seq = SequenceBatch::new(rollouts, micro)?;
            let mask = seq.mask_tensor::<B>(&device);
            // Two-stage backward on one view of the weights in `precision` (a fresh one per
            // micro-batch: a backward consumes the graph of the casts); the gradients land on
            // `model`'s weights and at most one LM-head chunk of logits is alive at a time.
            let out = seq.loss_gradients(
                model,
                precision,
                self.p.temperature,
                self.p.chunk,
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
            )?;
            sums.entropy += scalar(masked_mean(out.values.entropy, mask));
            sums.count += 1.0;
            if !out.loss.is_finite() {
                finite = false;
                break;
            }
            if let Some(grads) = out.grads {
                acc.accumulate::<B>(model, grads);
            }
        }
        Ok(PartialStep {
            grads: finite.then(|| acc.grads()),
            stats: sums.to_vec(),
        })
    }
}

/// The loss of `update.ppo` on one micro-batch (see the module doc):
/// `pg_loss − entropy_coeff · agg(entropy) + kl.coef · agg(kl(logπ, logπ_ref))`, every `agg`
/// normalised by the mini-batch's [`GlobalBatchInfo`].
#[derive(Debug, Clone, Copy)]
pub struct PpoLoss {
    /// The policy loss and its options (`policy_loss`, `clip_ratio*`, ...).
    pub policy: PolicyLossConfig,
    /// `loss_agg_mode`: of the policy loss where it honours it, and of the KL and entropy terms.
    pub mode: LossAggMode,
    pub entropy_coeff: f64,
    /// The KL estimator and its coefficient (`None`: no KL term).
    pub kl: Option<(KlEstimator, f64)>,
}

/// [`PpoLoss::terms`]: the loss and its parts.
pub struct PpoLossTerms<B: Backend> {
    /// The micro-batch's loss (differentiable w.r.t. the log-probs and entropies).
    pub loss: Tensor<B, 1>,
    /// The policy loss and its metrics.
    pub policy: PolicyLossOutput<B>,
    /// The aggregated KL term, before its coefficient (when the loss has one).
    pub kl_loss: Option<Tensor<B, 1>>,
}

impl PpoLoss {
    /// The loss of one micro-batch from its log-probs and entropies `[b, T]`, the old and
    /// (with a KL term) the reference log-probs, the advantages and the response mask, with
    /// the algorithm functions (`compute_policy_loss`, `agg_loss`, `kl_penalty`). The KL term
    /// is added when both `kl` and `ref_log_probs` are present. `seed` seeds the policy loss's
    /// random draws (clip_cov's `randperm`); the other losses draw none.
    #[allow(clippy::too_many_arguments)]
    pub fn terms<B: Backend>(
        &self,
        log_probs: Tensor<B, 2>,
        entropy: Tensor<B, 2>,
        old_log_probs: Tensor<B, 2>,
        advantages: Tensor<B, 2>,
        mask: Tensor<B, 2>,
        ref_log_probs: Option<Tensor<B, 2>>,
        info: &GlobalBatchInfo,
        seed: u64,
    ) -> Result<PpoLossTerms<B>> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut randperm = |k: usize| {
            let mut perm: Vec<usize> = (0..k).collect();
            perm.shuffle(&mut rng);
            perm
        };
        let inputs = PolicyLossInputs {
            old_log_prob: old_log_probs,
            log_prob: log_probs.clone(),
            advantages,
            response_mask: mask.clone(),
            rollout_is_weights: None,
        };
        let policy = compute_policy_loss(&self.policy, inputs, self.mode, info, &mut randperm)?;
        let mut loss = policy.pg_loss.clone();
        if self.entropy_coeff != 0.0 {
            let ent = agg_loss(entropy, mask.clone(), self.mode, info)?;
            loss = loss - ent.mul_scalar(self.entropy_coeff);
        }
        let mut kl_loss = None;
        if let (Some((est, coef)), Some(ref_lp)) = (self.kl, ref_log_probs) {
            let kl = kl_penalty(log_probs, ref_lp, est)?;
            let term = agg_loss(kl, mask, self.mode, info)?;
            loss = loss + term.clone().mul_scalar(coef);
            kl_loss = Some(term);
        }
        Ok(PpoLossTerms {
            loss,
            policy,
            kl_loss,
        })
    }
}

/// The batch arithmetic of an update node with `mini_batch_size` / `micro_batch_size` (prompts
/// per optimizer step, responses per forward/backward): the upstream dataset's `batch_size`
/// must divide into mini-batches, and a mini-batch's responses (× the rollout's `n`) into
/// micro-batches, with the numbers in the message.
pub(crate) fn mini_batch_diagnostics(ctx: &ValidateCtx) -> Vec<Diagnostic> {
    let p = ctx.params();
    let mut out = Vec::new();
    let batch = upstream_batch_size(ctx);
    let n = upstream_rollout_n(ctx).unwrap_or(1);
    let mini = p.get_i64("mini_batch_size").map(|m| m as usize);
    if let (Some((b, data)), Some(m)) = (&batch, mini)
        && b % m != 0
    {
        out.push(ctx.error(
            "mini_batch_size",
            format!("`{data}.batch_size` {b} is not divisible by mini_batch_size {m} (prompts per optimizer step)"),
        ));
    }
    if let Some(micro) = p.get_i64("micro_batch_size").map(|m| m as usize) {
        let rows = mini.or(batch.as_ref().map(|(b, _)| *b)).map(|m| m * n);
        if let Some(rows) = rows
            && rows % micro != 0
        {
            out.push(ctx.error(
                "micro_batch_size",
                format!(
                    "a mini-batch of {} prompts × n {n} = {rows} responses is not divisible by micro_batch_size {micro}",
                    rows / n
                ),
            ));
        }
    }
    out
}

/// The policy loss's diagnostics: a warning for each option the graph sets that the chosen loss
/// ignores (as verl ignores it), and DRO's required `dro_beta`.
fn loss_diagnostics(ctx: &ValidateCtx) -> Vec<Diagnostic> {
    let p = ctx.params();
    let Some(loss) = p
        .get_str("policy_loss")
        .and_then(|n| n.parse::<PolicyLossMode>().ok())
    else {
        return Vec::new();
    };
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
    let other_terms = p.get("kl").is_some() || p.get_f64("entropy_coeff").is_some_and(|c| c != 0.0);
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
    if loss == PolicyLossMode::Dro && p.get_f64("dro_beta").is_none() {
        out.push(ctx.error(
            "policy_loss",
            "policy_loss = \"dro\" needs `dro_beta` > 0 (verl: policy_loss.dro_beta must be a positive value when using DRO)",
        ));
    }
    out
}

flowrl_engine::register_node_kind!(PpoUpdateKind);
