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

mod checkpoint;
pub(crate) mod copies;
mod layout;
mod slots;

use std::sync::Mutex;

use anyhow::{Result, bail};
use burn::optim::GradientsParams;
use flowrl_models::weights::Precision;

use crate::runtime::backend::FlowBackend;
use crate::runtime::data_parallel::{Replica, Replicas, shard};
use crate::train::grad_sum::{GradSum, StepGrads};
use crate::train::model_state::ModelState;
use crate::train::optim::{AdamW, grad_sum_squares, scale_grads};
use crate::train::{OptimParams, PartialStep, StepOutcome, drop_vision_grads};

pub use checkpoint::{WholeWeights, checkpoint_optimizer, checkpoint_weights, whole_optimizer};
pub use copies::{Sharding, TrainCopy, Trained};
pub use layout::owners;
pub use slots::{copy_on, uses_primary};

use layout::{
    Layout, flatten, hold_own_masters, owned_values, retain, segments, unflatten, write_values,
};
use slots::{distribute, put_slots, take_slots};

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
