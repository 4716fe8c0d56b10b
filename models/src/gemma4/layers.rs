//! Gemma 4's own building blocks on top of the shared layers ([`crate::layers`]): the vision
//! tower's clipped linear, the GELU-tanh gated MLP (GeGLU) used by both towers, and the
//! names of the four norms every text and vision block carries.
//!
//! Formulas follow transformers `models/gemma4/modeling_gemma4.py` (5.24).

use burn::prelude::*;
use burn::tensor::activation::gelu_approximate;

use crate::layers::{Linear, RmsNorm};
use crate::weights::{Init, WeightNames, Weights, join};

/// A bias-free linear map, plain (text) or clipped (vision).
pub trait LinearMap<B: Backend> {
    fn apply(&self, x: Tensor<B, 3>) -> Tensor<B, 3>;
}

impl<B: Backend> LinearMap<B> for Linear<B> {
    fn apply(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward(x)
    }
}

/// The vision tower's clipped linear (`Gemma4ClippableLinear`):
/// `y = clamp(clamp(x, in_min, in_max) · Wᵀ, out_min, out_max)`. The four bounds are scalar
/// buffers stored next to `linear.weight` (shape `[]`); random initialisation uses ±∞ (no
/// clipping). The clamps pass zero gradient where they are active.
#[derive(Module, Debug)]
pub struct ClippedLinear<B: Backend> {
    pub linear: Linear<B>,
    pub input_min: f32,
    pub input_max: f32,
    pub output_min: f32,
    pub output_max: f32,
}

/// `{prefix}.{input,output}_{min,max}` (scalar buffers `[]`, random init ±∞) and
/// `{prefix}.linear`.
impl<B: Backend> Weights<B> for ClippedLinear<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let (low, high) = (Init::Const(f32::NEG_INFINITY), Init::Const(f32::INFINITY));
        w.scalar(&join(prefix, "input_min"), &[], &mut self.input_min, low);
        w.scalar(&join(prefix, "input_max"), &[], &mut self.input_max, high);
        w.scalar(&join(prefix, "output_min"), &[], &mut self.output_min, low);
        w.scalar(&join(prefix, "output_max"), &[], &mut self.output_max, high);
        self.linear.weights(w, &join(prefix, "linear"));
    }
}

impl<B: Backend> ClippedLinear<B> {
    /// `[out, in]` weight without bias; no clipping until loaded.
    pub fn new(device: &B::Device, in_dim: usize, out_dim: usize) -> Self {
        Self {
            linear: Linear::new(device, in_dim, out_dim, false),
            input_min: f32::NEG_INFINITY,
            input_max: f32::INFINITY,
            output_min: f32::NEG_INFINITY,
            output_max: f32::INFINITY,
        }
    }
}

impl<B: Backend> LinearMap<B> for ClippedLinear<B> {
    fn apply(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = x.clamp(self.input_min, self.input_max);
        self.linear
            .forward(x)
            .clamp(self.output_min, self.output_max)
    }
}

/// Gated GELU MLP (GeGLU): `down(gelu_tanh(gate(x)) · up(x))`, `gelu_tanh` being GELU with the
/// tanh approximation (`gelu_pytorch_tanh`).
pub fn geglu<B: Backend, M: LinearMap<B>>(
    gate: &M,
    up: &M,
    down: &M,
    x: Tensor<B, 3>,
) -> Tensor<B, 3> {
    let g = gelu_approximate(gate.apply(x.clone()));
    down.apply(g * up.apply(x))
}

/// Hugging Face names of the four norms around each Gemma 4 block's attention and MLP, shared
/// by the text decoder layers and the vision encoder layers, in load/export order.
pub const BLOCK_NORMS: [&str; 4] = [
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
];

/// A block's four norms of width `dim` (placeholders), in [`BLOCK_NORMS`] order.
pub fn new_block_norms<B: Backend>(device: &B::Device, dim: usize, eps: f64) -> [RmsNorm<B>; 4] {
    BLOCK_NORMS.map(|_| RmsNorm::new(device, dim, eps))
}

/// A block's four norms `{prefix}.{name}.weight`, in [`BLOCK_NORMS`] order.
pub fn block_norm_weights<B: Backend, W: WeightNames<B>>(
    w: &mut W,
    prefix: &str,
    norms: [&mut RmsNorm<B>; 4],
) {
    for (name, norm) in BLOCK_NORMS.iter().zip(norms) {
        norm.weights(w, &join(prefix, name));
    }
}
