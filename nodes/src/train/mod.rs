//! Training and scoring a model on rollouts, below the node kinds: response log-probs and the
//! two-stage backward ([`sequences`]), the split of rows into micro-batches ([`micro_batches`]),
//! AdamW, clipping and schedules with PyTorch/verl semantics ([`optim`]).
//!
//! This module itself holds what the update node kinds share: the optimizer parameters of a graph
//! node, the learning-rate schedule they define, the data-parallel gradients of one step, and one
//! guarded optimizer step (global-norm clipping, skip on a non-finite loss or gradient norm,
//! count).

pub mod checkpoint;
pub mod micro_batches;
pub mod optim;
pub mod sequences;

use anyhow::{Result, ensure};
use burn::optim::GradientsParams;
use burn::prelude::*;
use flowrl_engine::Params;
use serde::Deserialize;

use crate::resources::model::ModelState;
use crate::runtime::backend::FlowBackend;
use crate::runtime::data_parallel::{Replicas, shard};
use crate::train::optim::{AdamW, AdamWConfig, LrSchedule, WarmupStyle, clip_grad_norm};
use crate::values::TokenMatrix;

/// Optimizer parameters of an update node (verl's `actor.optim.*` names, verl's actor defaults),
/// for a kind's parameter struct as `#[serde(flatten)] optim: OptimParams`.
#[derive(Debug, Clone, Deserialize, Params)]
pub struct OptimParams {
    /// AdamW learning rate (verl actor: 1e-6)
    #[param(default = 1e-6, gt = 0.0)]
    pub lr: f64,
    /// decoupled weight decay (torch AdamW: 0.01; burn's default 1e-4 is not used)
    #[param(default = 0.01, min = 0.0)]
    pub weight_decay: f64,
    /// AdamW (β1, β2)
    #[param(default = vec![0.9, 0.999])]
    pub betas: Vec<f64>,
    /// AdamW ε (torch: 1e-8; burn's default 1e-5 is not used)
    #[param(default = 1e-8, gt = 0.0)]
    pub eps: f64,
    /// max global gradient norm (torch clip_grad_norm_)
    #[param(default = 1.0, gt = 0.0)]
    pub grad_clip: f64,
    /// linear warm-up steps
    #[param(default = 0, min = 0.0)]
    pub warmup_steps: u64,
    /// warm-up as a fraction of the run's steps (verl lr_warmup_steps_ratio); the larger of the
    /// two applies
    #[param(default = 0.0, min = 0.0, max = 1.0)]
    pub warmup_ratio: f64,
    /// shape after warm-up (verl warmup_style)
    #[param(default = WarmupStyle::Constant)]
    pub lr_schedule: WarmupStyle,
    /// cosine floor
    #[param(default = 0.0, min = 0.0, max = 1.0)]
    pub min_lr_ratio: f64,
    /// verl actor.freeze_vision_tower: the vision tower (with its projector/merger) gets no
    /// update and stays out of the gradient norm
    #[param(default = false)]
    pub freeze_vision_tower: bool,
}

impl OptimParams {
    pub fn adamw(&self) -> Result<AdamWConfig> {
        ensure!(
            self.betas.len() == 2,
            "betas must hold two values, got {:?}",
            self.betas
        );
        Ok(AdamWConfig {
            beta1: self.betas[0],
            beta2: self.betas[1],
            eps: self.eps,
            weight_decay: self.weight_decay,
        })
    }

    /// The schedule over a run of `total_steps` steps.
    pub fn schedule(&self, total_steps: u64) -> LrSchedule {
        let from_ratio = (self.warmup_ratio * total_steps as f64) as u64;
        LrSchedule {
            base_lr: self.lr,
            warmup_steps: self.warmup_steps.max(from_ratio),
            total_steps,
            style: self.lr_schedule,
            min_lr_ratio: self.min_lr_ratio,
            num_cycles: 0.5,
        }
    }
}

/// What one guarded optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOutcome {
    /// Global gradient norm before clipping (NaN when the loss was not finite).
    pub grad_norm: f64,
    /// False when the step was skipped.
    pub applied: bool,
}

/// Applies one AdamW step (`config`, at `lr`) to `state.model` with `grads` (accumulated over a
/// mini-batch), after global-norm clipping at `optim.grad_clip`; skips it (and counts it) when
/// `grads` is `None` (a loss was not finite) or the gradient norm is not finite, as verl does
/// (`if not torch.isfinite(grad_norm): skip`).
///
/// With `optim.freeze_vision_tower`, the gradients of the model's vision tower
/// ([`flowrl_models::Model::vision_param_ids`]) are dropped first, so they count neither in the
/// global norm nor in the step, and AdamW (which visits only parameters with a gradient) leaves
/// those weights bit-identical, weight decay included — verl's `requires_grad_(False)` on the tower.
pub fn guarded_step<B: FlowBackend>(
    state: &mut ModelState<B>,
    optim: &OptimParams,
    config: AdamWConfig,
    grads: Option<GradientsParams>,
    lr: f64,
) -> StepOutcome {
    let Some(mut grads) = grads else {
        state.counters.skipped_steps += 1;
        return StepOutcome {
            grad_norm: f64::NAN,
            applied: false,
        };
    };
    if optim.freeze_vision_tower {
        drop_vision_grads(&state.model, &mut grads);
    }
    let norm = clip_grad_norm::<B, _>(&state.model, &mut grads, optim.grad_clip);
    if !norm.is_finite() {
        state.counters.skipped_steps += 1;
        return StepOutcome {
            grad_norm: norm,
            applied: false,
        };
    }
    let opt = state.optimizer.get_or_insert_with(|| AdamW::new(config));
    opt.config = config;
    let model = state.model.clone();
    state.model = opt.step(lr, model, grads);
    state.counters.optimizer_steps += 1;
    StepOutcome {
        grad_norm: norm,
        applied: true,
    }
}

/// Removes the gradients of `model`'s vision tower from `grads`.
pub fn drop_vision_grads<B: FlowBackend>(
    model: &flowrl_models::Model<B>,
    grads: &mut GradientsParams,
) {
    use burn::module::{ModuleVisitor, Param};
    struct Drop<'a>(&'a mut GradientsParams);
    impl<B: FlowBackend> ModuleVisitor<B> for Drop<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = self.0.remove::<B::InnerBackend, D>(param.id);
        }
    }
    model.visit_vision_tower(&mut Drop(grads));
}

/// `[rows.len(), cols]` tensor of the given rows of a host matrix.
pub fn rows_tensor<B: Backend>(
    m: &TokenMatrix,
    rows: &[usize],
    device: &B::Device,
) -> Tensor<B, 2> {
    let mut v = Vec::with_capacity(rows.len() * m.cols);
    for &r in rows {
        v.extend_from_slice(m.row(r));
    }
    Tensor::<B, 1>::from_data(TensorData::new(v, [rows.len() * m.cols]), device)
        .reshape([rows.len(), m.cols])
}

/// A scalar tensor's value on the host.
pub fn scalar<B: Backend>(t: Tensor<B, 1>) -> f64 {
    t.into_scalar().elem::<f64>()
}

/// The global normaliser of one optimizer step over `rows` of `batch` (verl's
/// `global_batch_info`): its valid-token count and row count, with `dp_size` = the replica count,
/// so each replica's globally normalised loss carries the factor the gradient mean divides away.
pub fn global_batch_info(
    batch: &crate::values::RolloutBatch,
    rows: &[usize],
    replicas: &Replicas,
) -> flowrl_algorithms::GlobalBatchInfo {
    let tokens: f64 = rows
        .iter()
        .map(|&r| batch.response_mask.row(r).iter().sum::<f32>() as f64)
        .sum();
    flowrl_algorithms::GlobalBatchInfo {
        dp_size: replicas.world(),
        batch_num_tokens: Some(tokens.max(1.0)),
        global_batch_size: Some(rows.len() as f64),
        loss_scale_factor: None,
    }
}

/// What one replica computed for one optimizer step: its accumulated gradients (`None` when a
/// loss was not finite) and statistics that add up over replicas (sums and counts).
pub struct PartialStep {
    pub grads: Option<GradientsParams>,
    pub stats: Vec<f64>,
}

/// Held while a replica builds and differentiates its autodiff graph (see [`replicated_grads`]).
static AUTODIFF_GRAPHS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The gradients of one optimizer step over `rows`, computed data-parallel
/// ([`crate::runtime::data_parallel`]): replica `i` of `W` runs `compute(model, rows_i)` on its
/// contiguous share `rows_i` of the rows, with its own copy of `model` (same parameter ids);
/// the gradients are averaged over replicas (sum / `W`) and the statistics summed. `compute` must
/// normalise its loss globally and scale it by `W = replicas.world()` (`GlobalBatchInfo::dp_size`,
/// see [`global_batch_info`]), so the mean is
/// the gradient of the whole step's loss, as verl's FSDP actor. When any replica's loss was not
/// finite, every replica gets `None` (the step is skipped everywhere).
///
/// Replicas exchange one vector per optimizer step whatever their micro-batch counts, so uneven
/// shares cannot leave a replica waiting in a collective the others never call.
pub fn replicated_grads<B: FlowBackend>(
    replicas: &Replicas,
    model: &flowrl_models::Model<B>,
    rows: &[usize],
    compute: impl Fn(&flowrl_models::Model<B>, &[usize]) -> Result<PartialStep> + Sync,
) -> Result<PartialStep> {
    use burn::module::{AutodiffModule, Module};
    if replicas.world() == 1 {
        return compute(model, rows);
    }
    let mut out = replicas.run(|r| {
        let mine = &rows[shard(rows.len(), r.world, r.index)];
        // Each replica differentiates its own copy on its own device (shared storage on the CPU;
        // `fork` moves the parameters as new leaves that still require gradients).
        let device = B::device(r.device)?;
        let copy = flowrl_models::Model::<B>::from_inner(model.valid());
        let copy = if crate::runtime::backend::device_of(&copy) == device {
            copy
        } else {
            copy.fork(&device)
        };
        // One replica's forward and backward at a time: burn 0.21's autodiff lets a backward on
        // one thread free graph steps another thread is still building, and a gradient goes
        // missing (tracel-ai/burn#5573, fixed after 0.21). The all-reduce stays outside the
        // lock, so replicas still meet there. CPU replicas share the cores anyway; on GPUs this
        // serialises the replicas' updates until burn is upgraded.
        let partial = {
            let _one_at_a_time = AUTODIFF_GRAPHS.lock().unwrap_or_else(|e| e.into_inner());
            compute(&copy, mine)?
        };
        let flat = flatten_step(&copy, partial);
        let flat = r.all_reduce_sum(flat)?;
        unflatten_step(&copy, flat, r.world)
    })?;
    Ok(out.swap_remove(0))
}

/// `[gradient values of every float parameter in module order (zeros when absent) | one
/// presence flag per parameter | non-finite flag | stats]`.
fn flatten_step<B: FlowBackend>(model: &flowrl_models::Model<B>, step: PartialStep) -> Vec<f32> {
    use burn::module::{Module, ModuleVisitor, Param};
    struct Flatten {
        grads: Option<GradientsParams>,
        values: Vec<f32>,
        flags: Vec<f32>,
    }
    impl<B: FlowBackend> ModuleVisitor<B> for Flatten {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let numel = param.val().shape().num_elements();
            let grad = self
                .grads
                .as_mut()
                .and_then(|g| g.remove::<B::InnerBackend, D>(param.id));
            match grad {
                Some(g) => {
                    let v = g.into_data().convert::<f32>();
                    self.values
                        .extend_from_slice(v.as_slice::<f32>().expect("f32 gradient"));
                    self.flags.push(1.0);
                }
                None => {
                    self.values.resize(self.values.len() + numel, 0.0);
                    self.flags.push(0.0);
                }
            }
        }
    }
    let nonfinite = if step.grads.is_none() { 1.0 } else { 0.0 };
    let mut v = Flatten {
        grads: step.grads,
        values: Vec::new(),
        flags: Vec::new(),
    };
    model.visit(&mut v);
    let mut flat = v.values;
    flat.extend(v.flags);
    flat.push(nonfinite);
    flat.extend(step.stats.iter().map(|&s| s as f32));
    flat
}

/// The inverse of [`flatten_step`] after the all-reduce sum: gradients divided by `world`,
/// registered under `model`'s parameter ids; statistics as summed.
fn unflatten_step<B: FlowBackend>(
    model: &flowrl_models::Model<B>,
    flat: Vec<f32>,
    world: usize,
) -> Result<PartialStep> {
    use burn::module::{Module, ModuleVisitor, Param};
    struct Shapes(Vec<usize>);
    impl<B: FlowBackend> ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.val().shape().num_elements());
        }
    }
    let mut shapes = Shapes(Vec::new());
    model.visit(&mut shapes);
    let numel: usize = shapes.0.iter().sum();
    let params = shapes.0.len();
    ensure!(
        flat.len() > numel + params,
        "the all-reduced step holds {} values, fewer than the model's {numel} + {params} + 1",
        flat.len()
    );
    let nonfinite = flat[numel + params] > 0.5;
    let stats = flat[numel + params + 1..]
        .iter()
        .map(|&s| s as f64)
        .collect();
    if nonfinite {
        return Ok(PartialStep { grads: None, stats });
    }
    struct Unflatten<'a> {
        flat: &'a [f32],
        offset: usize,
        index: usize,
        flags_at: usize,
        scale: f32,
        grads: GradientsParams,
    }
    impl<B: FlowBackend> ModuleVisitor<B> for Unflatten<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            let shape = value.shape();
            let n = shape.num_elements();
            let present = self.flat[self.flags_at + self.index] > 0.5;
            if present {
                let v: Vec<f32> = self.flat[self.offset..self.offset + n]
                    .iter()
                    .map(|x| x * self.scale)
                    .collect();
                let t = Tensor::<B::InnerBackend, D>::from_data(
                    TensorData::new(v, shape),
                    &value.device(),
                );
                self.grads.register::<B::InnerBackend, D>(param.id, t);
            }
            self.offset += n;
            self.index += 1;
        }
    }
    let mut u = Unflatten {
        flat: &flat,
        offset: 0,
        index: 0,
        flags_at: numel,
        scale: 1.0 / world as f32,
        grads: GradientsParams::new(),
    };
    model.visit(&mut u);
    Ok(PartialStep {
        grads: Some(u.grads),
        stats,
    })
}
