//! The replicas' training states ([`TrainCopy`]): each local replica's copy of a model's weights,
//! moved out of the model resource for a step and put back after it, and the optimizer state
//! handed out to them by owner when the sharding changes.

use anyhow::{Result, bail, ensure};
use burn::module::{AutodiffModule, Module};
use flowrl_models::Model;
use flowrl_models::value_head::{ValueHead, ValueModel};

use crate::runtime::backend::{FlowBackend, device_of};
use crate::runtime::data_parallel::Replicas;
use crate::train::model_state::ModelState;
use crate::train::optim::AdamW;

use super::copies::{Sharding, TrainCopy, Trained};
use super::layout::Layout;
use crate::train::model_state::InferenceView;

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
pub(super) fn take_slots<B: FlowBackend>(
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
pub(super) fn put_slots<B: FlowBackend>(
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
pub(super) fn distribute<B: FlowBackend>(
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

impl<B: FlowBackend> ModelState<B> {
    /// The model without autodiff in the compute precision (and its value head, if any) on
    /// local replica `local` of `replicas`, with the replica's burn device: this state's own
    /// model on its device, else the replica's kept copy (made once, and again after the model
    /// changed without it).
    #[allow(clippy::type_complexity)]
    pub fn inference_on(
        &mut self,
        replicas: &Replicas,
        local: usize,
    ) -> Result<(
        Model<B::InnerBackend>,
        Option<ValueHead<B::InnerBackend>>,
        B::Device,
    )> {
        let device = B::device(replicas.devices()[local])?;
        let precision = self.precision;
        let version = self.version;
        if self.views.len() <= local {
            self.views.resize_with(local + 1, || None);
        }
        let cached = self.views[local].take().filter(|v| v.version == version);
        let view = match cached {
            Some(v) => v,
            None => {
                let (model, head) = if uses_primary(self, replicas, local)? {
                    (&self.model, &self.value_head)
                } else {
                    let copy = copy_on(self, local, &device);
                    (&copy.model, &copy.value_head)
                };
                InferenceView {
                    version,
                    model: model.valid().compute_view(precision),
                    head: head.as_ref().map(|h| h.valid()),
                }
            }
        };
        let out = (view.model.clone(), view.head.clone(), device);
        self.views[local] = Some(view);
        Ok(out)
    }
}
