//! What a node kind or resource kind declares it holds: [`Footprint`]s, sized by a
//! [`PlanCtx`] from the graph's parameters and the models' `config.json` (no weights loaded).

use crate::device::DeviceSpec;
use crate::node::ValidateCtx;
use std::any::Any;
use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::Arc;

/// Where a declared buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Place {
    /// Host memory outside the devices' tensors (data, images, tokenizers).
    Host,
    /// The memory of each device the declaring node runs on (for a resource: the device it is
    /// built on, the run's first); on a CPU device this is host RAM too.
    Device,
    /// The node's first device only, where the resources live (an optimizer's state).
    First,
    /// The memory of each device of a data-parallel node but its first, where the resources
    /// live: what a replica copies there (its weights).
    Replicas,
}

/// One buffer: what it is, its size, where it lives, and which parameter makes it smaller.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub what: String,
    pub bytes: u64,
    pub place: Place,
    /// What to change when this buffer is what does not fit (`"lower kv_cache_gib"`).
    pub hint: Option<String>,
}

impl Item {
    pub fn new(what: impl Into<String>, bytes: u64, place: Place) -> Self {
        Item {
            what: what.into(),
            bytes,
            place,
            hint: None,
        }
    }

    /// The same buffer with what to change when it does not fit.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

/// A stretch of a node's work during which a set of buffers is alive together (`prefill`,
/// `decode`, `forward+backward`, `optimizer`); phases of one node never overlap.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    pub name: String,
    pub items: Vec<Item>,
}

/// What a node kind (per replica, on each of its devices) or a resource kind holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Footprint {
    /// Kept from the first step on (weights; optimizer moments, created by the first update).
    pub resident: Vec<Item>,
    /// Alive only while the node runs, one phase at a time.
    pub phases: Vec<Phase>,
    /// Floating-point operations of one step, all replicas together (2 per multiply-add).
    pub flops: f64,
    /// Precision the FLOPs run in (`"f32"`, `"bf16"`), for the device's throughput.
    pub flops_precision: Option<String>,
    /// What could not be sized and why (a missing config.json, say): shown as unknown.
    pub not_sized: Vec<String>,
}

impl Footprint {
    /// Adds a resident buffer (zero-sized ones are left out).
    pub fn resident(&mut self, item: Item) -> &mut Self {
        if item.bytes > 0 {
            self.resident.push(item);
        }
        self
    }

    /// Adds a phase with its buffers, zero-sized ones left out.
    pub fn phase(&mut self, name: impl Into<String>, items: Vec<Item>) -> &mut Self {
        self.phases.push(Phase {
            name: name.into(),
            items: items.into_iter().filter(|i| i.bytes > 0).collect(),
        });
        self
    }

    /// Records something that could not be sized.
    pub fn not_sized(&mut self, why: impl Into<String>) -> &mut Self {
        self.not_sized.push(why.into());
        self
    }
}

/// What a resource kind declares: its [`Footprint`] and, for the node kinds that use it, a
/// description of its shape (a model's parameter count, widths, KV-cache bytes per token), read
/// back with [`PlanCtx::shape`].
#[derive(Clone, Default)]
pub struct ResourcePlan {
    pub footprint: Footprint,
    pub shape: Option<Arc<dyn Any + Send + Sync>>,
}

/// What a kind's `footprint` hook sees: everything a `validate` hook sees (through `Deref`),
/// the shapes the resources declared, and the node's placement.
pub struct PlanCtx<'a> {
    pub(crate) validate: ValidateCtx<'a>,
    pub(crate) shapes: &'a BTreeMap<String, Arc<dyn Any + Send + Sync>>,
    pub(crate) replicas: usize,
    pub(crate) local_replicas: usize,
    pub(crate) device: DeviceSpec,
}

impl<'a> Deref for PlanCtx<'a> {
    type Target = ValidateCtx<'a>;
    fn deref(&self) -> &ValidateCtx<'a> {
        &self.validate
    }
}

impl PlanCtx<'_> {
    /// The shape resource `name` declared, downcast to the declaring crate's type (`None` when
    /// the resource could not be sized or declared none).
    pub fn shape<T: Any + Send + Sync>(&self, name: &str) -> Option<Arc<T>> {
        self.shapes.get(name)?.clone().downcast::<T>().ok()
    }

    /// Replicas the node's rows are split over, in every process of the run (1 unless the kind
    /// is data-parallel and the run has several devices or processes).
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// This process's share of [`PlanCtx::replicas`] (its devices the node runs on).
    pub fn local_replicas(&self) -> usize {
        self.local_replicas
    }

    /// The node's first device (its kind decides the kernels: a CPU materialises what a GPU
    /// kernel streams).
    pub fn device(&self) -> DeviceSpec {
        self.device
    }
}
