//! What a checkpoint of a replicated model holds: the master weights gathered whole when they are
//! sharded, and the optimizer state put together from the replicas (and, on rank 0, the other
//! processes).

use anyhow::{Result, bail, ensure};
use flowrl_models::Model;
use flowrl_models::value_head::{ValueHead, ValueModel};

use crate::runtime::backend::FlowBackend;
use crate::runtime::data_parallel::{all_gather_across_processes, gather_to_rank_zero};
use crate::train::model_state::ModelState;
use crate::train::optim::AdamW;

use super::layout::{Layout, owned_values, owners, segments, write_values};

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
