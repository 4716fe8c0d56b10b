//! Gemma 4's own building blocks on top of the shared layers ([`crate::layers`]): the vision
//! tower's clipped linear, the GELU-tanh gated MLP (GeGLU) used by both towers, and the
//! load/export of the four norms every text and vision block carries.
//!
//! Formulas follow transformers `models/gemma4/modeling_gemma4.py` (5.24).

use burn::prelude::*;
use burn::tensor::activation::gelu_approximate;

use crate::layers::{Linear, RmsNorm};
use crate::weights::{Init, WeightSource, WeightVisitor};

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

impl<B: Backend> ClippedLinear<B> {
    /// Loads `{prefix}.linear.weight` `[out, in]` and `{prefix}.{input,output}_{min,max}`.
    pub fn load(
        src: &mut dyn WeightSource<B>,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
    ) -> Self {
        let mut bound = |name: &str, init: f32| {
            src.take_scalar(&format!("{prefix}.{name}"), &[], Init::Const(init))
        };
        let (input_min, input_max) = (
            bound("input_min", f32::NEG_INFINITY),
            bound("input_max", f32::INFINITY),
        );
        let (output_min, output_max) = (
            bound("output_min", f32::NEG_INFINITY),
            bound("output_max", f32::INFINITY),
        );
        Self {
            linear: Linear::load(src, &format!("{prefix}.linear"), in_dim, out_dim, false),
            input_min,
            input_max,
            output_min,
            output_max,
        }
    }

    pub fn export<V: WeightVisitor<B>>(&self, sink: &mut V, prefix: &str) {
        self.linear.export(sink, &format!("{prefix}.linear"));
        for (name, v) in [
            ("input_min", self.input_min),
            ("input_max", self.input_max),
            ("output_min", self.output_min),
            ("output_max", self.output_max),
        ] {
            sink.put_buffer(&format!("{prefix}.{name}"), &[], &[v]);
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

/// Loads a block's four norms `{prefix}.{name}.weight` (`[dim]`) in [`BLOCK_NORMS`] order.
pub fn load_block_norms<B: Backend>(
    src: &mut dyn WeightSource<B>,
    prefix: &str,
    dim: usize,
    eps: f64,
) -> [RmsNorm<B>; 4] {
    BLOCK_NORMS.map(|name| RmsNorm::load(src, &format!("{prefix}.{name}"), dim, eps))
}

/// Exports a block's four norms under `{prefix}.{name}` in [`BLOCK_NORMS`] order.
pub fn export_block_norms<B: Backend, V: WeightVisitor<B>>(
    sink: &mut V,
    prefix: &str,
    norms: [&RmsNorm<B>; 4],
) {
    for (name, norm) in BLOCK_NORMS.iter().zip(norms) {
        norm.export(sink, &format!("{prefix}.{name}"));
    }
}
