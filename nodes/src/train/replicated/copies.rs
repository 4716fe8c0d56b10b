//! One replica's training state ([`TrainCopy`]), how the optimizer state is spread over the
//! replicas ([`Sharding`]), and what a step trains ([`Trained`]).

use anyhow::{Context, Result};
use burn::module::AutodiffModule;
use flowrl_models::Model;
use flowrl_models::value_head::{ValueHead, ValueModel};

use crate::runtime::backend::FlowBackend;
use crate::train::optim::AdamW;

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
