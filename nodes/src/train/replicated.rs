//! Data-parallel optimizer steps over persistent replicas, with the optimizer state optionally
//! sharded over them (ZeRO stages 1 and 2, Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
//! Toward Training Trillion Parameter Models").
//!
//! Every local replica of a trained model keeps its own copy of the weights on its device for the
//! whole run ([`TrainCopy`]): the model resource's own weights serve the replica on their device,
//! the others are made once (a fork) and kept equal by applying the same update. One step over
//! `rows` on `W` replicas:
//!
//! 1. replica `i` computes the gradient of its share of the rows ([`shard`]), its loss normalised
//!    over the whole step and scaled by `W` (`GlobalBatchInfo::dp_size`), summed on the host as
//!    the backward hands it over ([`GradSum::on_host`]);
//! 2. the gradients of the trainable parameters, flattened in module order, are summed over the
//!    replicas and divided by `W`: by an all-reduce (stages 0 and 1), or by a reduce-scatter that
//!    leaves each replica only the parameters it owns (stage 2);
//! 3. the global gradient norm (torch's `clip_grad_norm_`): stages 0 and 1 on every replica from
//!    the whole gradient; stage 2 as the square root of the owners' sums of squares, summed by an
//!    all-reduce;
//! 4. AdamW: stage 0 on every replica for every parameter (each replica holds all the moments, as
//!    PyTorch DDP); stages 1 and 2 on each replica for the parameters it owns (1/W of the
//!    moments);
//! 5. stages 1 and 2: the owners' updated weights are all-gathered into every replica.
//!
//! Ownership ([`owners`]): the trainable parameters, in module order, are cut into `W` contiguous
//! runs of about equal size, never splitting a parameter (as PyTorch's ZeroRedundancyOptimizer).
//! Each replica's AdamW is therefore the unsharded AdamW restricted to its parameters, the same
//! values bit for bit: stage 1 updates the weights as stage 0 does, bit for bit; stage 2 sums the
//! gradient norm in another order (a relative difference of order 1e-7). A skipped step (a
//! loss or the norm not finite) is skipped on every replica, since both are known everywhere.
//!
//! The moments move between replicas only when the sharding changes (the first step, a resume,
//! another stage or device count): they are put together and handed out again by owner. A
//! checkpoint holds them all ([`checkpoint_optimizer`]; of a multi-process run: rank 0's).
//!
//! Master weights ([`Sharding::masters`]): a model computing in bf16 (or f16) at stage 1 or 2
//! keeps on each replica the f32 masters of the parameters it owns only, and the others' weights
//! in the compute precision ([`hold_own_masters`]): the values its forward view casts them to.
//! Their gradients, widened to f32, are the masters' (the cast's backward widens them the same
//! way), the owners step their masters, and the all-gathered weights are rounded to the
//! compute precision where they are not masters: stage 1 still updates as stage 0, bit for bit.
//! A checkpoint gathers the masters whole ([`checkpoint_weights`]). The replicas holding a
//! model's sharded masters cannot change until a resume (they hold nothing of the others').
//!
//! Equivalent on paper to what DeepSpeed's stages 1 and 2 keep per replica (fp32 masters and
//! moments of 1/W); the collective is the host's, not yet NCCL's.

use std::collections::BTreeSet;
use std::sync::Mutex;

use anyhow::{Context, Result, bail, ensure};
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::DType;
use flowrl_models::Model;
use flowrl_models::value_head::{ValueHead, ValueModel};
use flowrl_models::weights::Precision;

use crate::resources::model::ModelState;
use crate::runtime::backend::{FlowBackend, device_of};
use crate::runtime::data_parallel::{
    Replica, Replicas, all_gather_across_processes, gather_to_rank_zero, shard,
};
use crate::train::grad_sum::{GradSum, StepGrads};
use crate::train::optim::{AdamW, grad_sum_squares, scale_grads};
use crate::train::{OptimParams, PartialStep, StepOutcome, drop_vision_grads};

/// One replica's training state on its device.
pub struct TrainCopy<B: FlowBackend> {
    pub model: Model<B>,
    pub value_head: Option<ValueHead<B>>,
    /// This replica's moments: all of them (stage 0) or those of the parameters it owns.
    pub optimizer: Option<AdamW<B>>,
    /// The [`ModelState::version`] of the weights this copy holds.
    pub version: u64,
}

/// How the optimizer state is spread over a model's replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharding {
    pub stage: u8,
    pub world: usize,
    pub first: usize,
    pub local: usize,
    /// The f32 master weights are sharded too: a replica holds its own parameters' masters and
    /// the others' weights in the compute precision (stages 1 and 2 of a model computing in
    /// bf16 or f16).
    pub masters: bool,
}

/// What a step trains: the model alone, or a value model (backbone and head).
pub trait Trained<B: FlowBackend>: AutodiffModule<B> + Clone + Send + Sync {
    /// The module of a replica's state.
    fn of(copy: &TrainCopy<B>) -> Result<Self>;
    /// Stores the updated module back into the replica's state.
    fn put(self, copy: &mut TrainCopy<B>);
    /// The language model (whose vision tower `freeze_vision_tower` leaves alone).
    fn backbone(&self) -> &Model<B>;
}

impl<B: FlowBackend> Trained<B> for Model<B> {
    fn of(copy: &TrainCopy<B>) -> Result<Self> {
        Ok(copy.model.clone())
    }
    fn put(self, copy: &mut TrainCopy<B>) {
        copy.model = self;
    }
    fn backbone(&self) -> &Model<B> {
        self
    }
}

impl<B: FlowBackend> Trained<B> for ValueModel<B> {
    fn of(copy: &TrainCopy<B>) -> Result<Self> {
        Ok(ValueModel {
            model: copy.model.clone(),
            head: copy
                .value_head
                .clone()
                .context("the value model lost its value head")?,
        })
    }
    fn put(self, copy: &mut TrainCopy<B>) {
        copy.model = self.model;
        copy.value_head = Some(self.head);
    }
    fn backbone(&self) -> &Model<B> {
        &self.model
    }
}

/// One optimizer step over `rows` on `replicas` (see the module doc), with `optim`'s AdamW at
/// learning rate `lr`; `compute(module, rows_i)` returns a replica's gradients and statistics.
/// Returns what the step did and the statistics summed over replicas. The model's counters
/// count the step (applied or skipped).
pub fn replicated_step<B: FlowBackend, M: Trained<B>>(
    replicas: &Replicas,
    state: &mut ModelState<B>,
    optim: &OptimParams,
    lr: f64,
    rows: &[usize],
    compute: impl Fn(&M, &[usize], GradSum) -> Result<PartialStep> + Sync,
) -> Result<(StepOutcome, Vec<f64>)> {
    let config = optim.adamw()?;
    let stage = if replicas.world() > 1 {
        optim.zero_stage
    } else {
        0
    };
    let sharding = Sharding {
        stage,
        world: replicas.world(),
        first: replicas.first(),
        local: replicas.local(),
        masters: stage > 0 && state.precision != Precision::F32,
    };
    let compute_dtype = state.precision.dtype();
    state.drop_views();
    let mut slots = take_slots(state, replicas)?;
    distribute(state, &mut slots, sharding)?;
    let slots: Vec<Mutex<TrainCopy<B>>> = slots.into_iter().map(Mutex::new).collect();
    let out = replicas.run(|r| {
        let mut slot = slots[r.local_index]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut module = M::of(&slot)?;
        // The trainable parameters and their owners, once per step.
        let layout = Layout::of(&module);
        let owner = owners(&layout.numels, sharding.world);
        if sharding.masters {
            module = hold_own_masters(module, &owner, r.index, compute_dtype);
        }
        let mine = &rows[shard(rows.len(), r.world, r.index)];
        // Several replicas exchange host vectors: the gradients go there as they come.
        let sum = if r.world == 1 {
            GradSum::on_device()
        } else {
            GradSum::on_host(&layout.numels)
        };
        let partial = compute(&module, mine, sum)?;
        let opt = slot.optimizer.get_or_insert_with(|| AdamW::new(config));
        opt.config = config;
        let (module, outcome, stats) = step_on_replica(
            r,
            module,
            (&layout, &owner),
            opt,
            optim,
            sharding,
            lr,
            partial,
        )?;
        module.put(&mut slot);
        Ok((outcome, stats))
    });
    let slots = slots
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
        .collect();
    // The weights are put back even after a failure: every replica still holds a whole model.
    put_slots(state, slots, replicas)?;
    let (outcome, stats) = out?.swap_remove(0);
    if outcome.applied {
        state.counters.optimizer_steps += 1;
    } else {
        state.counters.skipped_steps += 1;
    }
    Ok((outcome, stats))
}

/// Steps 2–5 of the module doc on one replica.
#[allow(clippy::too_many_arguments)]
fn step_on_replica<B: FlowBackend, M: Trained<B>>(
    r: &Replica<'_>,
    module: M,
    (layout, owner): (&Layout, &[usize]),
    opt: &mut AdamW<B>,
    optim: &OptimParams,
    sharding: Sharding,
    lr: f64,
    partial: PartialStep,
) -> Result<(M, StepOutcome, Vec<f64>)> {
    if sharding.world == 1 {
        // Nothing to exchange: the gradients stay where they are.
        let PartialStep { grads, stats } = partial;
        return match grads {
            None => Ok((module, skipped(f64::NAN), stats)),
            Some(StepGrads::Host(_)) => bail!("one replica's gradients were summed on the host"),
            Some(StepGrads::Device(grads)) => {
                let (module, outcome) =
                    clip_and_step(module, opt, optim, lr, grads, |s| Ok(s.sqrt()), |_, _| {})?;
                Ok((module, outcome, stats))
            }
        };
    }
    let segments = segments(&layout.numels, owner, sharding.world);
    let flat = flatten(&module, layout, partial);
    let (grads, meta) = match sharding.stage {
        0 | 1 => {
            let mut all = r.all_reduce_sum(flat)?;
            let meta = all.split_off(layout.total);
            (all, meta)
        }
        _ => {
            let mut flat = flat;
            let meta = flat.split_off(layout.total);
            let mine = r.reduce_scatter_sum(flat, &segments)?;
            (mine, r.all_reduce_sum(meta)?)
        }
    };
    let params = layout.numels.len();
    let stats = meta[params + 1..].iter().map(|&s| s as f64).collect();
    if meta[params] > 0.5 {
        return Ok((module, skipped(f64::NAN), stats));
    }
    // The parameters whose gradients this replica holds, and where its values start.
    // Stage 1 holds the whole gradient until its norm is taken (the norm of stage 0, bit for
    // bit); stage 2 only its own parameters' from the start.
    let own: Vec<bool> = owner.iter().map(|&o| o == r.index).collect();
    let stage = sharding.stage;
    let grads = if stage == 2 {
        let offset = segments[..r.index].iter().sum();
        unflatten(
            &module,
            layout,
            &grads,
            offset,
            &own,
            &meta[..params],
            r.world,
        )
    } else {
        unflatten(
            &module,
            layout,
            &grads,
            0,
            &vec![true; params],
            &meta[..params],
            r.world,
        )
    };
    let norm = |squares: f64| {
        Ok(if stage == 2 {
            (r.all_reduce_sum(vec![squares as f32])?[0] as f64).sqrt()
        } else {
            squares.sqrt()
        })
    };
    let keep = |module: &M, grads: &mut GradientsParams| {
        if stage == 1 {
            retain(module, grads, &own);
        }
    };
    let (mut module, outcome) = clip_and_step(module, opt, optim, lr, grads, norm, keep)?;
    if outcome.applied && stage > 0 {
        let mine = owned_values(&module, layout, owner, r.index);
        let all = r.all_gather(mine, &segments)?;
        module = write_values(module, layout, owner, r.index, &all, false);
    }
    Ok((module, outcome, stats))
}

/// A step that did not change the weights (`norm` NaN: a loss was not finite).
fn skipped(norm: f64) -> StepOutcome {
    StepOutcome {
        grad_norm: norm,
        applied: false,
        finite_loss: !norm.is_nan(),
    }
}

/// verl's guarded step on the gradients a replica holds: the vision tower's dropped when it is
/// frozen; the global norm from the gradients' sum of squares (`norm`, which sums over the
/// replicas that hold the others); then only the gradients `keep` leaves are clipped to
/// `grad_clip` as torch's `clip_grad_norm_` (`coef = min(1, max_norm / (norm + 1e-6))`) and
/// stepped by AdamW; a skip when the norm is not finite.
fn clip_and_step<B: FlowBackend, M: Trained<B>>(
    module: M,
    opt: &mut AdamW<B>,
    optim: &OptimParams,
    lr: f64,
    mut grads: GradientsParams,
    norm: impl FnOnce(f64) -> Result<f64>,
    keep: impl FnOnce(&M, &mut GradientsParams),
) -> Result<(M, StepOutcome)> {
    if optim.freeze_vision_tower {
        drop_vision_grads(module.backbone(), &mut grads);
    }
    let norm = norm(grad_sum_squares(&module, &grads))?;
    if !norm.is_finite() {
        return Ok((module, skipped(norm)));
    }
    keep(&module, &mut grads);
    let coef = (optim.grad_clip / (norm + 1e-6)).min(1.0);
    if coef < 1.0 {
        scale_grads(&module, &mut grads, coef);
    }
    let module = opt.step(lr, module, grads);
    let outcome = StepOutcome {
        grad_norm: norm,
        applied: true,
        finite_loss: true,
    };
    Ok((module, outcome))
}

/// The owner (global replica index) of each trainable parameter of sizes `numels` (module
/// order) on `world` replicas: contiguous runs of about `total / world` values, a parameter
/// going to the replica its middle falls in.
pub fn owners(numels: &[usize], world: usize) -> Vec<usize> {
    let total: usize = numels.iter().sum::<usize>().max(1);
    let mut before = 0usize;
    numels
        .iter()
        .map(|&n| {
            let middle = before as u128 * 2 + n as u128;
            before += n;
            ((middle * world as u128 / (2 * total as u128)) as usize).min(world - 1)
        })
        .collect()
}

/// The number of values each of `world` replicas owns.
fn segments(numels: &[usize], owner: &[usize], world: usize) -> Vec<usize> {
    let mut out = vec![0; world];
    for (&n, &o) in numels.iter().zip(owner) {
        out[o] += n;
    }
    out
}

/// The trainable float parameters of a module in visit order: their module paths (the keys of
/// AdamW's state) and sizes.
struct Layout {
    paths: Vec<String>,
    numels: Vec<usize>,
    total: usize,
}

impl Layout {
    fn of<B: FlowBackend, M: Module<B>>(module: &M) -> Self {
        struct Visit {
            path: Vec<String>,
            out: Layout,
        }
        impl<B: FlowBackend> ModuleVisitor<B> for Visit {
            fn enter_module(&mut self, name: &str, _container_type: &str) {
                self.path.push(name.to_string());
            }
            fn exit_module(&mut self, _name: &str, _container_type: &str) {
                self.path.pop();
            }
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let value = param.val();
                if value.is_require_grad() {
                    let n = value.shape().num_elements();
                    self.out.paths.push(self.path.join("."));
                    self.out.numels.push(n);
                    self.out.total += n;
                }
            }
        }
        let mut v = Visit {
            path: Vec::new(),
            out: Layout {
                paths: Vec::new(),
                numels: Vec::new(),
                total: 0,
            },
        };
        module.visit(&mut v);
        v.out
    }

    /// The paths of the parameters `replica` owns among `world` replicas.
    fn owned_paths(&self, world: usize, replica: usize) -> BTreeSet<String> {
        owners(&self.numels, world)
            .into_iter()
            .zip(&self.paths)
            .filter(|(o, _)| *o == replica)
            .map(|(_, p)| p.clone())
            .collect()
    }
}

/// Visits the trainable float parameters of a module with their index in its [`Layout`].
fn for_trainable<B: FlowBackend, M: Module<B>>(
    module: &M,
    mut f: impl FnMut(usize, &dyn ErasedTensor<B>),
) {
    struct Visit<'a, B: FlowBackend> {
        index: usize,
        f: &'a mut dyn FnMut(usize, &dyn ErasedTensor<B>),
    }
    impl<B: FlowBackend> ModuleVisitor<B> for Visit<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            if value.is_require_grad() {
                (self.f)(self.index, &value);
                self.index += 1;
            }
        }
    }
    module.visit(&mut Visit {
        index: 0,
        f: &mut f,
    });
}

/// What [`for_trainable`] needs of a parameter whatever its rank.
trait ErasedTensor<B: FlowBackend> {
    /// Its values, f32, row-major.
    fn values(&self) -> Vec<f32>;
}

impl<B: FlowBackend, const D: usize> ErasedTensor<B> for Tensor<B, D> {
    fn values(&self) -> Vec<f32> {
        self.clone()
            .inner()
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32 values")
    }
}

/// `[gradients of the trainable parameters in layout order (zeros where absent) | one presence
/// flag per parameter | non-finite flag | stats]`.
fn flatten<B: FlowBackend, M: Module<B>>(
    module: &M,
    layout: &Layout,
    step: PartialStep,
) -> Vec<f32> {
    let device_grads = match step.grads {
        Some(StepGrads::Host(h)) => {
            let mut flat = h.values;
            flat.reserve(h.present.len() + 1 + step.stats.len());
            flat.extend(h.present.iter().map(|&p| if p { 1.0 } else { 0.0 }));
            flat.push(0.0);
            flat.extend(step.stats.iter().map(|&s| s as f32));
            return flat;
        }
        Some(StepGrads::Device(g)) => Some(g),
        None => None,
    };
    struct Flatten<'a> {
        grads: Option<GradientsParams>,
        values: Vec<f32>,
        flags: Vec<f32>,
        layout: &'a Layout,
    }
    impl<B: FlowBackend> ModuleVisitor<B> for Flatten<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if !param.val().is_require_grad() {
                return;
            }
            let numel = self.layout.numels[self.flags.len()];
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
    let nonfinite = if device_grads.is_none() { 1.0 } else { 0.0 };
    let mut v = Flatten {
        grads: device_grads,
        values: Vec::with_capacity(layout.total + layout.numels.len() + 1 + step.stats.len()),
        flags: Vec::new(),
        layout,
    };
    module.visit(&mut v);
    let mut flat = v.values;
    flat.extend(v.flags);
    flat.push(nonfinite);
    flat.extend(step.stats.iter().map(|&s| s as f32));
    flat
}

/// The summed gradients as `GradientsParams`, divided by `world`, of the parameters `held`
/// marks (whose values lie consecutively in `values` from `offset` of the layout) and whose
/// `flags` say some replica had a gradient for them.
fn unflatten<B: FlowBackend, M: Module<B>>(
    module: &M,
    layout: &Layout,
    values: &[f32],
    offset: usize,
    held: &[bool],
    flags: &[f32],
    world: usize,
) -> GradientsParams {
    struct Unflatten<'a> {
        values: &'a [f32],
        /// Start of the next parameter in the layout's flat order.
        at: usize,
        offset: usize,
        index: usize,
        held: &'a [bool],
        flags: &'a [f32],
        numels: &'a [usize],
        scale: f32,
        grads: GradientsParams,
    }
    impl<B: FlowBackend> ModuleVisitor<B> for Unflatten<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            if !value.is_require_grad() {
                return;
            }
            let (i, n) = (self.index, self.numels[self.index]);
            if self.held[i] && self.flags[i] > 0.5 {
                let start = self.at - self.offset;
                let v: Vec<f32> = self.values[start..start + n]
                    .iter()
                    .map(|x| x * self.scale)
                    .collect();
                let t = Tensor::<B::InnerBackend, D>::from_data(
                    TensorData::new(v, value.shape()),
                    &value.device(),
                );
                self.grads.register::<B::InnerBackend, D>(param.id, t);
            }
            self.at += n;
            self.index += 1;
        }
    }
    let mut u = Unflatten {
        values,
        at: 0,
        offset,
        index: 0,
        held,
        flags,
        numels: &layout.numels,
        scale: 1.0 / world as f32,
        grads: GradientsParams::new(),
    };
    module.visit(&mut u);
    u.grads
}

/// Drops from `grads` the gradients of the trainable parameters `own` does not mark.
fn retain<B: FlowBackend, M: Module<B>>(module: &M, grads: &mut GradientsParams, own: &[bool]) {
    struct Retain<'a> {
        grads: &'a mut GradientsParams,
        own: &'a [bool],
        index: usize,
    }
    impl<B: FlowBackend> ModuleVisitor<B> for Retain<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if !param.val().is_require_grad() {
                return;
            }
            if !self.own[self.index] {
                let _ = self.grads.remove::<B::InnerBackend, D>(param.id);
            }
            self.index += 1;
        }
    }
    module.visit(&mut Retain {
        grads,
        own,
        index: 0,
    });
}

/// The values of the trainable parameters `replica` owns, in layout order.
fn owned_values<B: FlowBackend, M: Module<B>>(
    module: &M,
    layout: &Layout,
    owner: &[usize],
    replica: usize,
) -> Vec<f32> {
    let mine: usize = layout
        .numels
        .iter()
        .zip(owner)
        .filter(|(_, o)| **o == replica)
        .map(|(n, _)| n)
        .sum();
    let mut out = Vec::with_capacity(mine);
    for_trainable(module, |i, t| {
        if owner[i] == replica {
            out.extend(t.values());
        }
    });
    out
}

/// `module` with every trainable parameter `replica` does not own replaced by its values in
/// `all` (the layout's flat order), keeping ids, `require_grad` and each parameter's dtype
/// (`whole`: in f32, the master weights whole).
fn write_values<B: FlowBackend, M: Module<B>>(
    module: M,
    layout: &Layout,
    owner: &[usize],
    replica: usize,
    all: &[f32],
    whole: bool,
) -> M {
    struct Write<'a> {
        all: &'a [f32],
        at: usize,
        index: usize,
        owner: &'a [usize],
        numels: &'a [usize],
        replica: usize,
        whole: bool,
    }
    impl<B: FlowBackend> ModuleMapper<B> for Write<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            if !tensor.is_require_grad() {
                return Param::from_mapped_value(id, tensor, mapper);
            }
            let (i, n) = (self.index, self.numels[self.index]);
            let start = self.at;
            self.at += n;
            self.index += 1;
            if self.owner[i] == self.replica {
                return Param::from_mapped_value(id, tensor, mapper);
            }
            let inner = Tensor::<B::InnerBackend, D>::from_data(
                TensorData::new(self.all[start..start + n].to_vec(), tensor.shape()),
                &tensor.device(),
            );
            // A weight held in the compute precision (sharded masters) stays in it: the cast
            // its master's forward view would make.
            let dtype = if self.whole {
                DType::F32
            } else {
                tensor.dtype()
            };
            let inner = if inner.dtype() == dtype {
                inner
            } else {
                inner.cast(dtype)
            };
            Param::from_mapped_value(id, Tensor::from_inner(inner).require_grad(), mapper)
        }
    }
    module.map(&mut Write {
        all,
        at: 0,
        index: 0,
        owner,
        numels: &layout.numels,
        replica,
        whole,
    })
}

/// `module` as replica `replica` holds it when the masters are sharded (`owner`: each trainable
/// parameter's replica, [`owners`]): the trainable parameters of its backbone that it owns stay
/// f32 masters; the others become new leaves in `dtype`, the compute precision (a no-op for those already in it). The
/// forward view ([`crate::resources::model::compute_view`]) casts every backbone weight to
/// `dtype`, so the forward computes with the same values; the gradient a weight held in `dtype`
/// receives, widened to f32 ([`GradSum`]), is the one its master would have received through the
/// cast. A value model's head stays f32 on every replica (its forward is f32).
fn hold_own_masters<B: FlowBackend, M: Trained<B>>(
    module: M,
    owner: &[usize],
    replica: usize,
    dtype: DType,
) -> M {
    struct Hold<'a> {
        owner: &'a [usize],
        /// Trainable parameters of the backbone: the first ones in module order.
        backbone: usize,
        index: usize,
        replica: usize,
        dtype: DType,
    }
    impl<B: FlowBackend> ModuleMapper<B> for Hold<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            if !tensor.is_require_grad() {
                return Param::from_mapped_value(id, tensor, mapper);
            }
            let i = self.index;
            self.index += 1;
            if i >= self.backbone || self.owner[i] == self.replica || tensor.dtype() == self.dtype {
                return Param::from_mapped_value(id, tensor, mapper);
            }
            let held = Tensor::from_inner(tensor.inner().cast(self.dtype)).require_grad();
            Param::from_mapped_value(id, held, mapper)
        }
    }
    let backbone = Layout::of(module.backbone()).numels.len();
    module.map(&mut Hold {
        owner,
        backbone,
        index: 0,
        replica,
        dtype,
    })
}

/// Whether local replica `local` of `replicas` trains on the model resource's own weights
/// (the first replica, when it lives on the resource's device).
pub fn uses_primary<B: FlowBackend>(
    state: &ModelState<B>,
    replicas: &Replicas,
    local: usize,
) -> Result<bool> {
    Ok(local == 0 && B::device(replicas.devices()[0])? == state.device)
}

/// Local replica `local`'s copy, made (forked from the resource's weights) when it has none or
/// holds older weights.
pub fn copy_on<'s, B: FlowBackend>(
    state: &'s mut ModelState<B>,
    local: usize,
    device: &B::Device,
) -> &'s mut TrainCopy<B> {
    if state.copies.len() <= local {
        state.copies.resize_with(local + 1, || None);
    }
    let fresh = state.copies[local]
        .as_ref()
        .is_some_and(|c| c.version == state.version);
    if !fresh {
        // New autodiff leaves (same `require_grad`): a replica must not share graph nodes with
        // another, whose backward on another thread would free them. On the resource's device
        // the values themselves are shared until an update replaces them.
        fn own<B: FlowBackend, M: AutodiffModule<B>>(m: &M, device: &B::Device) -> M {
            let m = M::from_inner(m.valid());
            if device_of(&m) == *device {
                m
            } else {
                m.fork(device)
            }
        }
        let model = own(&state.model, device);
        let value_head = state.value_head.as_ref().map(|h| own(h, device));
        let optimizer = state.copies[local].take().and_then(|c| c.optimizer);
        state.copies[local] = Some(TrainCopy {
            model,
            value_head,
            optimizer,
            version: state.version,
        });
    }
    state.copies[local].as_mut().expect("made above")
}

/// Every local replica's training state, moved out of `state` for one step.
fn take_slots<B: FlowBackend>(
    state: &mut ModelState<B>,
    replicas: &Replicas,
) -> Result<Vec<TrainCopy<B>>> {
    (0..replicas.local())
        .map(|i| {
            if uses_primary(state, replicas, i)? {
                return Ok(TrainCopy {
                    model: state.model.clone(),
                    value_head: state.value_head.clone(),
                    optimizer: state.optimizer.take(),
                    version: state.version,
                });
            }
            let device = B::device(replicas.devices()[i])?;
            copy_on(state, i, &device);
            Ok(state.copies[i].take().expect("made by copy_on"))
        })
        .collect()
}

/// Puts the replicas' states back after a step: all hold the same new weights.
fn put_slots<B: FlowBackend>(
    state: &mut ModelState<B>,
    slots: Vec<TrainCopy<B>>,
    replicas: &Replicas,
) -> Result<()> {
    state.version += 1;
    let mut primary_served = false;
    for (i, mut slot) in slots.into_iter().enumerate() {
        slot.version = state.version;
        if uses_primary(state, replicas, i)? {
            state.model = slot.model;
            state.value_head = slot.value_head;
            state.optimizer = slot.optimizer;
            primary_served = true;
        } else {
            state.copies[i] = Some(slot);
        }
    }
    if !primary_served {
        // The resource's weights live on a device no replica trains on: copy the new weights.
        let first = state.copies[0].as_ref().expect("replica 0's copy");
        let device = state.device.clone();
        state.model = first.model.clone().fork(&device);
        state.value_head = first.value_head.clone().map(|h| h.fork(&device));
    }
    Ok(())
}

/// Hands the optimizer state out to the replicas as `sharding` wants it, when it is not already.
fn distribute<B: FlowBackend>(
    state: &mut ModelState<B>,
    slots: &mut [TrainCopy<B>],
    sharding: Sharding,
) -> Result<()> {
    if state.sharding == Some(sharding) {
        return Ok(());
    }
    if let Some(old) = state.sharding.filter(|o| o.masters) {
        // The masters of the parameters other replicas owned are gone from these: they cannot
        // be handed out anew.
        bail!(
            "its f32 master weights are sharded over {} replicas at ZeRO stage {}; this step \
             would train it on {} replicas at stage {} (nodes that train one model must agree \
             on their devices and zero_stage)",
            old.world,
            old.stage,
            sharding.world,
            sharding.stage
        );
    }
    let mut all: Option<AdamW<B>> = None;
    for slot in slots.iter_mut() {
        if let Some(o) = slot.optimizer.take() {
            match &mut all {
                Some(a) => a.absorb(o),
                None => all = Some(o),
            }
        }
    }
    // Copies of devices this step does not use hold no moments of their own parameters.
    for c in state.copies.iter_mut().flatten() {
        if let Some(o) = c.optimizer.take() {
            match &mut all {
                Some(a) => a.absorb(o),
                None => all = Some(o),
            }
        }
    }
    if let Some(mut all) = all {
        ensure!(!slots.is_empty(), "a step needs at least one replica");
        let layout = match &slots[0].value_head {
            Some(_) => Layout::of(&ValueModel::<B>::of(&slots[0])?),
            None => Layout::of(&slots[0].model),
        };
        for (i, slot) in slots.iter_mut().enumerate() {
            slot.optimizer = Some(if sharding.stage == 0 {
                all.duplicate()
            } else {
                let owned = layout.owned_paths(sharding.world, sharding.first + i);
                let mut rest = all.split_off(|k| !owned.contains(k));
                std::mem::swap(&mut rest, &mut all);
                rest
            });
        }
    }
    state.sharding = Some(sharding);
    Ok(())
}

/// The weights a checkpoint holds when the masters are sharded ([`Sharding::masters`]): every
/// trainable parameter's f32 master, gathered from its owner (this process's replicas, and the
/// other processes' by an all-gather, so that every process's checkpoint holds the whole
/// model), on the model's device (a transient whole copy, made between steps); `None` when
/// the model's own weights are the masters whole.
pub fn checkpoint_weights<B: FlowBackend>(
    state: &ModelState<B>,
    label: &str,
) -> Result<Option<WholeWeights<B>>> {
    let Some(sh) = state.sharding.filter(|s| s.masters) else {
        return Ok(None);
    };
    let trained = |model: &Model<B>, head: &Option<ValueHead<B>>| -> Result<ValueModelOrModel<B>> {
        Ok(match head {
            Some(h) => ValueModelOrModel::Value(Box::new(ValueModel {
                model: model.clone(),
                head: h.clone(),
            })),
            None => ValueModelOrModel::Model(Box::new(model.clone())),
        })
    };
    let own = trained(&state.model, &state.value_head)?;
    let layout = own.layout();
    let owner = owners(&layout.numels, sh.world);
    // This process's replicas' masters, in replica order: its segment of the layout.
    let mut mine = Vec::new();
    for i in 0..sh.local {
        let replica = sh.first + i;
        let copy = match state.copies.get(i).and_then(Option::as_ref) {
            Some(c) if c.version == state.version => trained(&c.model, &c.value_head)?,
            None if i == 0 => own.clone(),
            _ => bail!("{label}: replica {replica} holds no current copy of its master weights"),
        };
        mine.extend(copy.owned_values(&layout, &owner, replica));
    }
    let segments = segments(&layout.numels, &owner, sh.world);
    let processes = sh.world / sh.local;
    let all = if processes > 1 {
        let per_process: Vec<usize> = segments.chunks(sh.local).map(|c| c.iter().sum()).collect();
        all_gather_across_processes(&format!("master weights of {label}"), &mine, &per_process)?
    } else {
        mine
    };
    ensure!(
        all.len() == layout.total,
        "{label}: gathered {} master values for {} parameters",
        all.len(),
        layout.total
    );
    Ok(Some(match own {
        ValueModelOrModel::Value(v) => {
            let v = write_values(*v, &layout, &owner, usize::MAX, &all, true);
            (v.model, Some(v.head))
        }
        ValueModelOrModel::Model(m) => (
            write_values(*m, &layout, &owner, usize::MAX, &all, true),
            None,
        ),
    }))
}

/// A model's weights for a checkpoint: the model, and a value model's head.
pub type WholeWeights<B> = (Model<B>, Option<ValueHead<B>>);

/// The module a model's optimizer steps: the model, or a value model (backbone and head).
#[derive(Clone)]
enum ValueModelOrModel<B: FlowBackend> {
    Model(Box<Model<B>>),
    Value(Box<ValueModel<B>>),
}

impl<B: FlowBackend> ValueModelOrModel<B> {
    fn layout(&self) -> Layout {
        match self {
            Self::Model(m) => Layout::of(m.as_ref()),
            Self::Value(v) => Layout::of(v.as_ref()),
        }
    }

    fn owned_values(&self, layout: &Layout, owner: &[usize], replica: usize) -> Vec<f32> {
        match self {
            Self::Model(m) => owned_values(m.as_ref(), layout, owner, replica),
            Self::Value(v) => owned_values(v.as_ref(), layout, owner, replica),
        }
    }
}

/// The optimizer state a checkpoint of this process holds: the resource's own and its copies'
/// moments put together ([`whole_optimizer`]); when the moments are sharded over processes
/// (stages 1 and 2 of a multi-process run), rank 0's also holds every other process's, gathered
/// (2 + 2n values per parameter of n values, from its owner: a presence flag, the step count and
/// the two moments), so that rank 0's checkpoint resumes on any number of devices and processes.
/// The other ranks' hold their own parameters' moments. `label` names the model.
pub fn checkpoint_optimizer<B: FlowBackend>(
    state: &ModelState<B>,
    label: &str,
) -> Result<Option<AdamW<B>>> {
    let local = whole_optimizer(state);
    let Some(sh) = state.sharding.filter(|s| s.stage > 0 && s.world > s.local) else {
        return Ok(local);
    };
    let layout = match &state.value_head {
        Some(head) => Layout::of(&ValueModel {
            model: state.model.clone(),
            head: head.clone(),
        }),
        None => Layout::of(&state.model),
    };
    let process_of: Vec<usize> = owners(&layout.numels, sh.world)
        .into_iter()
        .map(|o| o / sh.local)
        .collect();
    let (processes, me) = (sh.world / sh.local, sh.first / sh.local);
    let mut counts = vec![0; processes];
    for (&n, &p) in layout.numels.iter().zip(&process_of) {
        counts[p] += 2 + 2 * n;
    }
    let mut mine = Vec::with_capacity(counts[me]);
    for ((path, &n), _) in layout
        .paths
        .iter()
        .zip(&layout.numels)
        .zip(&process_of)
        .filter(|(_, p)| **p == me)
    {
        match local.as_ref().and_then(|o| o.moments_of(path)) {
            Some((step, exp_avg, exp_avg_sq)) => {
                ensure!(
                    step < 1 << 24,
                    "{label}: step count {step} of `{path}` does not travel exactly as f32"
                );
                mine.extend([1.0, step as f32]);
                mine.extend(exp_avg);
                mine.extend(exp_avg_sq);
            }
            None => mine.resize(mine.len() + 2 + 2 * n, 0.0),
        }
    }
    let gathered = gather_to_rank_zero(&format!("optimizer state of {label}"), &mine, &counts)?;
    let Some(all) = gathered else {
        return Ok(local);
    };
    let mut whole = local.unwrap_or_else(|| AdamW::new(Default::default()));
    let mut at = 0;
    for p in 0..processes {
        for ((path, &n), _) in layout
            .paths
            .iter()
            .zip(&layout.numels)
            .zip(&process_of)
            .filter(|(_, q)| **q == p)
        {
            let record = &all[at..at + 2 + 2 * n];
            at += 2 + 2 * n;
            if p == me || record[0] == 0.0 {
                continue;
            }
            let moments = (
                record[1] as u64,
                record[2..2 + n].to_vec(),
                record[2 + n..].to_vec(),
            );
            whole.set_moments(path.clone(), moments, &state.device);
        }
    }
    Ok(Some(whole))
}

/// The model's whole optimizer state in this process: the resource's own and its copies'
/// moments put together.
pub fn whole_optimizer<B: FlowBackend>(state: &ModelState<B>) -> Option<AdamW<B>> {
    let mut all: Option<AdamW<B>> = state.optimizer.as_ref().map(AdamW::duplicate);
    for c in state.copies.iter().flatten() {
        if let Some(o) = &c.optimizer {
            match &mut all {
                Some(a) => a.absorb(o.duplicate()),
                None => all = Some(o.duplicate()),
            }
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_contiguous_balanced_and_never_split_a_parameter() {
        let numels = [100, 5, 5, 40, 40, 10, 300, 1];
        for world in 1..6 {
            let owner = owners(&numels, world);
            assert!(owner.windows(2).all(|w| w[0] <= w[1]), "{owner:?}");
            assert!(owner.iter().all(|&o| o < world));
            let seg = segments(&numels, &owner, world);
            assert_eq!(seg.iter().sum::<usize>(), 501);
            // No replica holds more than its share plus the largest parameter.
            assert!(seg.iter().all(|&s| s <= 501 / world + 300), "{seg:?}");
        }
        assert_eq!(owners(&numels, 1), vec![0; 8]);
        let even = [10; 9];
        assert_eq!(segments(&even, &owners(&even, 3), 3), vec![30, 30, 30]);
    }
}
