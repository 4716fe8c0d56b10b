//! The `update.critic` node kind: verl's critic update (`dp_critic.update_critic`), PPO's value
//! function regression.
//!
//! For each of `ppo_epochs` epochs, the batch is split in order into mini-batches of
//! `mini_batch_size` prompts (× the rollout's `n` responses); each mini-batch is one optimizer
//! step of the value model (backbone and value head, one AdamW of the node's own settings),
//! its gradient accumulated over micro-batches of `micro_batch_size` responses or of at most
//! `max_tokens_per_micro_batch` prompt + response tokens (verl `critic.use_dynamic_bsz` +
//! `ppo_max_token_len_per_gpu`; [`crate::train::micro_batches`]). The loss of a micro-batch is verl's clipped value loss ([`flowrl_algorithms::compute_value_loss`]):
//!
//! ```text
//! V̂ = value head(final hidden states at the positions predicting the response tokens)
//! L = ½ · agg(max((V̂ − R)², (clip(V̂, V − c, V + c) − R)²))     c = cliprange_value
//! ```
//!
//! with V the values before the update (the `value` node's, which GAE used), R the returns of
//! `advantage.gae`, and `agg` the `loss_agg_mode` normalised over the **whole mini-batch**
//! (`GlobalBatchInfo`, as `update.ppo`), so the summed micro-batch gradients are the mini-batch
//! loss's gradient whatever the micro-batch size. (verl's critic averages micro-batch means;
//! the two agree when the micro-batches hold equal token counts.) Then global-norm clipping
//! (`grad_clip`) and AdamW at the scheduled learning rate; a step whose loss or gradient norm
//! is not finite is skipped and counted.
//!
//! Parameters are verl's `critic.*` names and defaults: `lr` 1e-5 (`critic.optim.lr`),
//! `cliprange_value` 0.5, `loss_agg_mode` token-mean, `ppo_epochs` 1, `grad_clip` 1.0.
//!
//! Metrics (verl's names): `critic/vf_loss` (mini-batch losses, mean over mini-batches, as
//! `update.ppo`'s `actor/pg_loss`), `critic/vf_clipfrac` and `critic/vpred_mean` (means over
//! micro-batches), `critic/grad_norm` (mean over applied steps), `critic/lr`,
//! `critic/skipped_steps`. Timing key `update_critic`.
//!
//! Data-parallel like `update.ppo`: each replica computes the gradient of its share of a
//! mini-batch's rows on its own copy of the value model, and the step is
//! [`crate::train::replicated::replicated_step`] (`zero_stage` shards the optimizer).

use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use flowrl_algorithms::{GlobalBatchInfo, LossAggMode, compute_value_loss, masked_mean};
use flowrl_engine::{
    BuildContext, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec, Params,
    Port, PortSpec, StepContext, ValidateCtx,
};
use flowrl_engine::{Footprint, PlanCtx};
use flowrl_models::value_head::ValueModel;
use serde::Deserialize;

use crate::sizing::{Training, planned_pass, training_footprint};

use crate::kinds::update::support::{
    ADVANTAGES, DONE, ROLLOUTS, done_output, mini_batch_diagnostics, skipped_and_means,
    split_batches, trainable_model,
};
use crate::kinds::value::value_model_diagnostics;
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
use crate::values::{AdvantageBatch, ModelUpdate, RolloutBatch, TokenValues, port_types};

/// The `update.critic` kind.
pub struct CriticUpdateKind;

#[derive(Debug, Clone, Deserialize, Params)]
struct CriticParams {
    /// the value model to train (a `[models.*]` with `value_head = true`)
    #[param(resource = "model", required)]
    model: String,
    /// prompts per optimizer step (verl critic.ppo_mini_batch_size); default: the whole batch
    #[param(min = 1.0)]
    mini_batch_size: Option<usize>,
    #[serde(flatten)]
    #[param(specs = micro_batches::param_specs(
        None,
        "responses per forward/backward (verl critic.ppo_micro_batch_size_per_gpu); default: the mini-batch",
    ))]
    micro: MicroBatchParams,
    /// passes over the batch (verl critic.ppo_epochs)
    #[param(default = 1, min = 1.0)]
    ppo_epochs: usize,
    /// c: the prediction is clipped to the old value ± c in the second loss term (verl
    /// critic.cliprange_value)
    #[param(default = 0.5, min = 0.0)]
    cliprange_value: f64,
    /// aggregation of the per-token value loss (verl critic.loss_agg_mode)
    #[serde(deserialize_with = "flowrl_engine::params::by_name")]
    #[param(one_of = &LossAggMode::ALL.map(|(_, n)| n), default = "token-mean")]
    loss_agg_mode: LossAggMode,
    #[serde(flatten)]
    #[param(specs = critic_optim_specs())]
    optim: OptimParams,
    #[serde(flatten)]
    checkpointing: CheckpointingParams,
}

/// The specs of [`OptimParams`] with verl's critic learning rate (`critic.optim.lr`: 1e-5).
fn critic_optim_specs() -> Vec<ParamSpec> {
    OptimParams::param_specs()
        .into_iter()
        .map(|s| {
            if s.name == "lr" {
                s.default(1e-5)
                    .doc("AdamW learning rate (verl critic.optim.lr: 1e-5)")
            } else {
                s
            }
        })
        .collect()
}

const VALUES: Port<TokenValues> = Port::new("values", port_types::VALUES);

impl NodeKind for CriticUpdateKind {
    fn name(&self) -> &str {
        "update.critic"
    }

    fn doc(&self) -> &str {
        "PPO critic update (verl's critic): the clipped value loss of a value model's predictions \
         against the GAE returns, around the values before the update (`cliprange_value`); \
         mini-batches × epochs × micro-batches normalised over the mini-batch; global-norm \
         clipping; the critic's own AdamW; non-finite steps skipped."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            ROLLOUTS.spec(),
            VALUES
                .spec()
                .doc("the values before the update (the `value` node's, which GAE used)"),
            ADVANTAGES
                .spec()
                .doc("their returns are the regression targets (`advantage.gae`)"),
        ]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        done_output("the critic's update counters")
    }

    fn params(&self) -> Vec<ParamSpec> {
        CriticParams::param_specs()
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn timing_key(&self) -> Option<&str> {
        Some("update_critic")
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let p = match ctx.parse::<CriticParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        let mut out: Vec<Diagnostic> = value_model_diagnostics(ctx, "model").into_iter().collect();
        out.extend(mini_batch_diagnostics(
            ctx,
            p.mini_batch_size,
            p.micro.micro_batch_size,
        ));
        out.extend(micro_batches::diagnostics(ctx));
        out
    }

    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let p = ctx.parse::<CriticParams>().ok()?;
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
                chunk: None,
                lm_head: false,
                checkpointing: p.checkpointing.gradient_checkpointing,
                epochs: p.ppo_epochs,
                vision: !p.optim.freeze_vision_tower,
                zero_stage: p.optim.zero_stage,
            },
        );
        Some(f)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: CriticParams = params.parse()?;
        let model = trainable_model(ctx, &p.model)?;
        ensure!(
            model.has_value_head(),
            "`{}` needs a value model: model `{}` has no value head (set `value_head = true` on it)",
            ctx.node,
            p.model
        );
        let mode = p.loss_agg_mode;
        let schedule = p.optim.schedule(ctx.total_steps);
        p.optim.adamw()?;
        Ok(Box::new(CriticUpdateNode {
            replicas: Replicas::new(&ctx.placement, &ctx.node)?,
            p,
            mode,
            model,
            schedule,
        }))
    }
}

struct CriticUpdateNode {
    replicas: Replicas,
    p: CriticParams,
    mode: LossAggMode,
    model: Arc<ModelResource>,
    schedule: LrSchedule,
}

/// One step's metrics: per-mini-batch losses, per-micro-batch sums with their count,
/// per-applied-step gradient norms.
#[derive(Default)]
struct Sums {
    vf_loss: Vec<f64>,
    clipfrac: f64,
    vpred_mean: f64,
    micro: f64,
    grad_norm: Vec<f64>,
    skipped: u64,
}

impl Node for CriticUpdateNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let rollouts = inputs.get_arc(ROLLOUTS)?;
        let values = inputs.get(VALUES)?;
        let adv = inputs.get(ADVANTAGES)?;
        values.check(&rollouts)?;
        ensure!(
            adv.returns.shape() == rollouts.response_mask.shape(),
            "returns {:?} do not match the rollouts {:?}",
            adv.returns.shape(),
            rollouts.response_mask.shape()
        );
        let (mini_rows, micro) =
            split_batches(self.p.mini_batch_size, &self.p.micro, &rollouts, ctx)?;
        on_backend!(self.model.backend(), B => {
            self.update::<B>(&rollouts, values, adv, mini_rows, micro, ctx)
        })
    }
}

impl CriticUpdateNode {
    /// The epochs of mini-batch steps on the model's backend `B`, and the step's metrics.
    fn update<B: FlowBackend>(
        &self,
        rollouts: &RolloutBatch,
        values: &TokenValues,
        adv: &AdvantageBatch,
        mini_rows: usize,
        micro: MicroBatching,
        ctx: &mut StepContext,
    ) -> Result<Outputs> {
        let lr = self.schedule.lr(ctx.step());
        let mut sums = Sums::default();
        let mut state = self.model.lock::<B>()?;
        let precision = state.precision;
        let world = self.replicas.world() as f64;
        let rows: Vec<usize> = (0..rollouts.len()).collect();
        for _ in 0..self.p.ppo_epochs {
            for mini in rows.chunks(mini_rows) {
                let info = global_batch_info(rollouts, mini, &self.replicas);
                let compute = |critic: &ValueModel<B>, mine: &[usize], sum: GradSum| {
                    self.mini_batch_grads(
                        critic, precision, rollouts, values, adv, &info, mine, micro, sum,
                    )
                };
                let (outcome, stats) =
                    replicated_step(&self.replicas, &mut state, &self.p.optim, lr, mini, compute)
                        .with_context(|| format!("update `{}`", ctx.node_name()))?;
                let [loss, clipfrac, vpred_mean, micro_batches] = stats[..] else {
                    bail!(
                        "the critic's step returned {} statistics, not 4",
                        stats.len()
                    );
                };
                sums.clipfrac += clipfrac;
                sums.vpred_mean += vpred_mean;
                sums.micro += micro_batches;
                if outcome.finite_loss {
                    // The losses carry the factor W (dp_size); their replica sum is W × the loss.
                    sums.vf_loss.push(loss / world);
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
            "critic optimizer",
            sums.skipped,
            [
                ("critic/vf_loss", &sums.vf_loss),
                ("critic/grad_norm", &sums.grad_norm),
            ],
        );
        if sums.micro > 0.0 {
            ctx.metric("critic/vf_clipfrac", sums.clipfrac / sums.micro);
            ctx.metric("critic/vpred_mean", sums.vpred_mean / sums.micro);
        }
        ctx.metric("critic/lr", lr);
        ctx.metric("critic/skipped_steps", sums.skipped as f64);
        Ok(Outputs::new().with(DONE, done))
    }

    /// One replica's accumulated gradients over its rows `mine` of a mini-batch (`None` when a
    /// micro-batch loss is not finite), with the sums `[vf_loss, vf_clipfrac, vpred_mean,
    /// micro-batches]`; the loss is normalised by the mini-batch's `info`.
    #[allow(clippy::too_many_arguments)]
    fn mini_batch_grads<B: FlowBackend>(
        &self,
        critic: &ValueModel<B>,
        precision: flowrl_models::weights::Precision,
        rollouts: &RolloutBatch,
        values: &TokenValues,
        adv: &AdvantageBatch,
        info: &GlobalBatchInfo,
        mine: &[usize],
        micro: MicroBatching,
        mut sum: GradSum,
    ) -> Result<PartialStep> {
        let device = device_of(&critic.model);
        let mut sums = [0.0; 4];
        for micro in micro.split(rollouts, mine) {
            let micro = micro.as_slice();
            let seq = SequenceBatch::with_layout(rollouts, micro, self.p.micro.layout())?;
            let mask = seq.mask_tensor::<B>(&device);
            // The trunk on a view of the weights in `precision` (a recorded cast: the
            // gradients land on the f32 masters), the head in f32.
            let view = critic.model.compute_view(precision);
            let (hidden, _, trunk) = seq.response_hidden_for_backward(
                &critic.model,
                &view,
                self.p.checkpointing.gradient_checkpointing,
                &device,
            )?;
            let vpreds = critic.head.forward(hidden);
            let out = compute_value_loss(
                vpreds.clone(),
                rows_tensor::<B>(&adv.returns, micro, &device),
                rows_tensor::<B>(&values.values, micro, &device),
                mask.clone(),
                self.p.cliprange_value,
                self.mode,
                info,
            )?;
            let value = scalar(out.vf_loss.clone().detach());
            sums[0] += value;
            sums[1] += scalar(out.vf_clipfrac);
            sums[2] += scalar(masked_mean(vpreds.detach(), mask));
            sums[3] += 1.0;
            if !value.is_finite() {
                return Ok(PartialStep {
                    grads: None,
                    stats: sums.to_vec(),
                });
            }
            trunk.backward(out.vf_loss, critic, &mut sum);
        }
        Ok(PartialStep {
            grads: Some(sum.finish()),
            stats: sums.to_vec(),
        })
    }
}

flowrl_engine::register_node_kind!(CriticUpdateKind);
