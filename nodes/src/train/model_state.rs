//! The mutable part of a model resource ([`ModelState`]): its weights, the optimizer state
//! update nodes create, the step counters, the copies on the other replicas and the cached
//! inference views.

use burn::module::AutodiffModule;
use flowrl_models::Model;
use flowrl_models::value_head::ValueHead;
use flowrl_models::weights::Precision;
use serde::{Deserialize, Serialize};

use crate::runtime::backend::FlowBackend;
use crate::train::optim::AdamW;
use crate::train::replicated::copies::{Sharding, TrainCopy};

/// Counters of the optimizer steps applied to a model (saved with checkpoints).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateCounters {
    /// Optimizer steps applied.
    pub optimizer_steps: u64,
    /// Optimizer steps skipped because the loss or the gradient norm was not finite.
    pub skipped_steps: u64,
}

/// The mutable part of a model resource, on backend `B`.
pub struct ModelState<B: FlowBackend> {
    /// The weights in f32 (the master weights under mixed precision), or in `precision` for a
    /// frozen model (it is never updated) and for the frozen base of a LoRA model (whose
    /// adapters are f32).
    pub model: Model<B>,
    /// Created by the first update node that trains this model; its moments are f32. Of a
    /// value model: the AdamW of the [`flowrl_models::value_head::ValueModel`] (backbone + head).
    pub optimizer: Option<AdamW<B>>,
    pub counters: UpdateCounters,
    pub device: B::Device,
    /// The precision of the forward passes' weights and activations.
    pub precision: Precision,
    /// The value head of a value model (`value_head = true`), in f32.
    pub value_head: Option<ValueHead<B>>,
    /// The model on the other devices of its data-parallel nodes, by local replica index,
    /// kept for the run ([`crate::train::replicated`]); `None` where `model` itself serves.
    pub copies: Vec<Option<TrainCopy<B>>>,
    /// Counts the changes of `model`; a copy or view of an older version is made again before
    /// use.
    pub version: u64,
    /// The inference view of each local replica ([`ModelState::inference_on`]), kept until the
    /// weights change.
    pub(crate) views: Vec<Option<InferenceView<B>>>,
    /// How the optimizer state is spread over `optimizer` and the copies' (`None`: all of it in
    /// `optimizer`).
    pub sharding: Option<Sharding>,
}

impl<B: FlowBackend> ModelState<B> {
    /// A model on `device`, computing in `precision`, with no optimizer state yet.
    pub fn new(model: Model<B>, device: B::Device, precision: Precision) -> Self {
        Self {
            model,
            optimizer: None,
            counters: UpdateCounters::default(),
            device,
            precision,
            value_head: None,
            copies: Vec::new(),
            version: 0,
            views: Vec::new(),
            sharding: None,
        }
    }

    /// The model without autodiff in the compute precision (generation, log-probs without
    /// gradients).
    pub fn inference_model(&self) -> Model<B::InnerBackend> {
        self.model.valid().compute_view(self.precision)
    }

    /// Drops the kept inference views (before a step replaces the weights they were cast from).
    pub fn drop_views(&mut self) {
        self.views.clear();
    }
}

/// A replica's weights without autodiff in the compute precision, as of `version`.
pub(crate) struct InferenceView<B: FlowBackend> {
    pub(crate) version: u64,
    pub(crate) model: Model<B::InnerBackend>,
    pub(crate) head: Option<ValueHead<B::InnerBackend>>,
}
