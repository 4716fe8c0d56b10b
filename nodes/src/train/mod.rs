//! Training and scoring a model on rollouts, below the node kinds: response log-probs and the
//! two-stage backward ([`sequences`]), the split of rows into micro-batches ([`micro_batches`]),
//! AdamW, clipping and schedules with PyTorch/verl semantics ([`optim`]).
//!
//! This module itself holds what the update node kinds share: the optimizer parameters of a graph
//! node, the learning-rate schedule they define, and what one replica computed for a step; the
//! step itself, data-parallel and guarded (global-norm clipping, skip on a non-finite loss or
//! gradient norm, count), is [`replicated::replicated_step`].

pub mod checkpoint;
pub mod chunked_backward;
pub mod grad_sum;
pub(crate) mod leaf_copy;
pub mod micro_batches;
pub mod model_state;
pub mod optim;
pub mod replicated;
pub mod sequences;

use anyhow::{Result, ensure};
use burn::optim::GradientsParams;
use burn::prelude::*;
use flowrl_engine::Params;
use serde::Deserialize;

use crate::runtime::backend::FlowBackend;
use crate::runtime::data_parallel::Replicas;
use crate::train::optim::{AdamWConfig, LrSchedule, WarmupStyle};
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
    /// ZeRO stage over the node's replicas: 0 every replica holds all AdamW moments; 1 each
    /// holds those of 1/N of the parameters (and, computing in bf16, only their f32 masters);
    /// 2 also only their summed gradients
    #[param(default = 0, min = 0.0, max = 2.0)]
    pub zero_stage: u8,
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
    /// False when a replica's loss was not finite (the step had no gradients).
    pub finite_loss: bool,
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
    pub grads: Option<grad_sum::StepGrads>,
    pub stats: Vec<f64>,
}
