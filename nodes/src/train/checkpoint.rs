//! Gradient checkpointing for the update nodes (verl `model.enable_gradient_checkpointing`,
//! transformers' `gradient_checkpointing_enable`, on by default in TRL): the trunk's forward
//! keeps no graph, only the residual stream entering each decoder segment
//! ([`flowrl_models::CausalLm::decoder_segments`]: one layer, or Gemma 4's KV-sharing layers
//! with their sources), and the backward recomputes one segment at a time from its kept input.
//!
//! With the trunk written as `h₀ = stream(e)`, `h_{s+1} = f_s(h_s, u_s; θ_s)` (segment s, its
//! layer inputs `u_s`, taken from the embeddings `e`: DeepStack features, per-layer inputs) and
//! the output `y = norm(h_S)`, the chain rule gives, from the last segment down,
//!
//! ```text
//! g_S = ∂L/∂h_S                                   (the loss's backward, through the final norm)
//! ∂L/∂θ_s, g_s, ∂L/∂u_s  from one backward of  Σ f_s(h_s, u_s; θ_s) ⊙ g_{s+1}   (recomputed)
//! ∂L/∂(embedding and vision weights)  from one backward of  Σ stream(e) ⊙ g₀ + Σ_s Σ u_s(e) ⊙ ∂L/∂u_s
//! ```
//!
//! Each recomputed segment runs the same operations on the same inputs as the forward, so its
//! values are the forward's bits; only the order in which a weight's gradient shares are summed
//! differs (a tied embedding's, a layer input's). What stays alive for the backward is one
//! `[b, len, hidden]` stream per segment plus one segment's activations, instead of every
//! layer's; the price is one more forward of the trunk. LoRA dropout draws the same masks in
//! the recompute as in the forward ([`DropoutScope::replay`]).
//!
//! The forward sweep runs on the inner backend (no autodiff); the recomputed segments
//! differentiate with respect to leaf copies of the view's weights, as the LM-head chunks of
//! [`super::chunked_backward::chunked_loss_backward`] do, so that every recorded cast of a
//! mixed-precision view is consumed by exactly one backward (the embedding stage's, or the
//! final norm's).

use std::ops::Range;

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use flowrl_engine::Params;
use flowrl_models::lora::{DropoutPosition, DropoutScope, TrainingSweep};
use flowrl_models::{DecoderInputs, Model, layer_input_slice};
use serde::Deserialize;

use super::grad_sum::GradSum;
use super::leaf_copy::leaf_copy;

/// The gradient-checkpointing switch of an update node, for a kind's parameter struct as
/// `#[serde(flatten)] checkpointing: CheckpointingParams`.
#[derive(Debug, Clone, Copy, Deserialize, Params)]
pub struct CheckpointingParams {
    /// recompute each decoder layer in the backward instead of keeping its activations (verl
    /// model.enable_gradient_checkpointing, TRL gradient_checkpointing): about one layer's
    /// activations kept instead of all, for one more forward of the trunk
    #[param(default = false)]
    pub gradient_checkpointing: bool,
}

/// How a trunk forward's share of the gradients is taken ([`TrunkBackward::backward`]).
pub enum TrunkBackward<B: AutodiffBackend> {
    /// The forward kept its graph: one backward through it.
    Graph,
    /// The forward kept the stream at the segment boundaries: the segments are recomputed.
    Recompute(Box<Recompute<B>>),
}

/// What a checkpointed forward kept for its backward (see the module doc).
pub struct Recompute<B: AutodiffBackend> {
    /// Leaf copies of the view's weights, with the model's parameter ids.
    leaf: Model<B>,
    /// The embeddings stage's outputs, with their graph (through the view).
    inputs: DecoderInputs<B>,
    /// Per segment: its layers, its layer-input channels (clamped to the batch's) and their
    /// values, the stream entering it, and where the dropout stream stood when the forward ran
    /// it.
    segments: Vec<Segment<B>>,
    /// The stream after the last segment, a leaf the final norm hangs off.
    last: Tensor<B, 3>,
    positions: Tensor<B, 3, Int>,
    mask: Tensor<B, 2, Int>,
}

struct Segment<B: AutodiffBackend> {
    layers: Range<usize>,
    channels: Range<usize>,
    input: Tensor<B::InnerBackend, 3>,
    /// The channels `channels` of the layer inputs (a view), `None` when empty.
    layer_inputs: Option<Tensor<B::InnerBackend, 3>>,
    dropout: DropoutPosition,
}

/// The final-normed hidden states `[b, len, hidden]` of the trunk over `embeds` on `view` (the
/// model itself or a recorded cast of it, see [`flowrl_models::Model::compute_view`]),
/// computed without keeping the layers' activations, and the [`TrunkBackward`] that
/// recomputes them. `model` is the module whose parameters receive the gradients.
pub fn checkpointed_trunk<B: AutodiffBackend>(
    model: &Model<B>,
    view: &Model<B>,
    ids: Tensor<B, 2, Int>,
    embeds: Tensor<B, 3>,
    positions: Tensor<B, 3, Int>,
    mask: Tensor<B, 2, Int>,
) -> (Tensor<B, 3>, TrunkBackward<B>) {
    let inputs = view.causal_lm().decoder_inputs(ids, embeds);
    let inner_view = view.valid();
    let lm = inner_view.causal_lm();
    let (inner_positions, inner_mask) = (positions.clone().inner(), mask.clone().inner());
    let layer_inputs = inputs.layer_inputs.clone().map(|t| t.inner());
    let mut h = inputs.stream.clone().inner();
    let mut segments = Vec::new();
    {
        let _sweep = TrainingSweep::enter();
        for layers in lm.decoder_segments() {
            let wanted = lm.layer_input_channels(layers.clone());
            let (channels, layer_inputs) = layer_input_slice(layer_inputs.as_ref(), wanted);
            let input = h.clone();
            let dropout = DropoutPosition::now();
            h = lm.decoder_segment(
                layers.clone(),
                h,
                layer_inputs.clone(),
                inner_positions.clone(),
                inner_mask.clone(),
            );
            segments.push(Segment {
                layers,
                channels,
                input,
                layer_inputs,
                dropout,
            });
        }
    }
    let last = Tensor::<B, 3>::from_inner(h).require_grad();
    let hidden = view.causal_lm().final_norm(last.clone());
    let recompute = Recompute {
        leaf: leaf_copy(model, inner_view),
        inputs,
        segments,
        last,
        positions,
        mask,
    };
    (hidden, TrunkBackward::Recompute(Box::new(recompute)))
}

impl<B: AutodiffBackend> TrunkBackward<B> {
    /// Adds to `sum` the gradients of `surrogate` (a scalar whose graph reaches the hidden
    /// states of the trunk forward this came from) with respect to `module`'s parameters
    /// (`module`: the trunk's model, or a critic with its trunk under its head), as they come:
    /// the whole trunk's at once through the forward's graph, or segment by segment when
    /// recomputed (the device then holds one segment's gradients at a time beside `sum`'s).
    pub fn backward<M: AutodiffModule<B>>(
        self,
        surrogate: Tensor<B, 1>,
        module: &M,
        sum: &mut GradSum,
    ) {
        let r = match self {
            Self::Graph => {
                sum.add(
                    module,
                    GradientsParams::from_grads(surrogate.backward(), module),
                );
                return;
            }
            Self::Recompute(r) => *r,
        };
        let grads = surrogate.backward();
        let mut g = r
            .last
            .grad(&grads)
            .unwrap_or_else(|| r.last.clone().inner().zeros_like());
        sum.add(module, GradientsParams::from_grads(grads, module));
        let lm = r.leaf.causal_lm();
        let mut input_grads = Vec::new();
        for segment in r.segments.into_iter().rev() {
            let x = Tensor::<B, 3>::from_inner(segment.input).require_grad();
            let u = segment
                .layer_inputs
                .map(|t| Tensor::<B, 3>::from_inner(t).require_grad());
            let y = {
                let _replay = DropoutScope::replay(segment.dropout);
                lm.decoder_segment(
                    segment.layers,
                    x.clone(),
                    u.clone(),
                    r.positions.clone(),
                    r.mask.clone(),
                )
            };
            let grads = (y * Tensor::<B, 3>::from_inner(g)).sum().backward();
            g = x
                .grad(&grads)
                .unwrap_or_else(|| x.clone().inner().zeros_like());
            if let Some(gu) = u.and_then(|u| u.grad(&grads)) {
                input_grads.push((segment.channels, gu));
            }
            // The leaf copies carry `model`'s parameter ids, which `module` holds.
            sum.add(module, GradientsParams::from_grads::<B, _>(grads, &r.leaf));
        }
        // The embeddings stage: Σ stream ⊙ g₀ + Σ_s u_s ⊙ ∂L/∂u_s, plus a zero term on a
        // fresh leaf so that the backward has a graph to walk when nothing before the first
        // layer trains (LoRA, a frozen tower): burn has no public test for a tracked tensor.
        let device = g.device();
        let mut embedding = (r.inputs.stream * Tensor::<B, 3>::from_inner(g)).sum();
        if let Some(layer_inputs) = r.inputs.layer_inputs {
            for (channels, gu) in input_grads {
                let u = layer_inputs
                    .clone()
                    .narrow(2, channels.start, channels.len());
                embedding = embedding + (u * Tensor::<B, 3>::from_inner(gu)).sum();
            }
        }
        let probe = Tensor::<B, 1>::zeros([1], (&device, embedding.dtype())).require_grad();
        let grads = (embedding + probe * 0.0).backward();
        sum.add(module, GradientsParams::from_grads(grads, module));
    }
}
