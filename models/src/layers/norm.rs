//! Normalisations: [`RmsNorm`] (with weight) and [`rms_normalize`] (without), [`LayerNorm`],
//! and the dtype helper [`cast_to`] they share with RoPE.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;

use crate::weights::{Init, WeightNames, Weights, join, shaped};

/// RMSNorm: `w · x / sqrt(mean(x²) + eps)` over the last dimension, computed in f32 and
/// rounded once to x's dtype (transformers' `Qwen2RMSNorm` computes the variance in f32). One
/// kernel on the GPU backends ([`crate::kernels::norm`]).
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub eps: f64,
}

/// `{prefix}.weight`.
impl<B: Backend> Weights<B> for RmsNorm<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        w.tensor(&join(prefix, "weight"), &mut self.weight, Init::Ones);
    }
}

impl<B: Backend> RmsNorm<B> {
    pub fn new(device: &B::Device, dim: usize, eps: f64) -> Self {
        Self {
            weight: shaped(device, [dim]),
            eps,
        }
    }

    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let weight = self.weight.val();
        if let Some(y) = crate::kernels::norm::rms_norm(&x, Some(&weight), self.eps) {
            return y;
        }
        let dtype = x.dtype();
        cast_to(
            f32_normalize(x, self.eps) * cast_to(weight, DType::F32).unsqueeze::<D>(),
            dtype,
        )
    }
}

/// RMSNorm without weight: `x / sqrt(mean(x²) + eps)` over the last dimension, in f32 (Gemma 4's
/// `v_norm` and vision-projector pre-norm, `with_scale=False`).
pub fn rms_normalize<const D: usize, B: Backend>(x: Tensor<B, D>, eps: f64) -> Tensor<B, D> {
    if let Some(y) = crate::kernels::norm::rms_norm(&x, None, eps) {
        return y;
    }
    let dtype = x.dtype();
    cast_to(f32_normalize(x, eps), dtype)
}

/// `x / sqrt(mean(x²) + eps)` of x in f32.
fn f32_normalize<const D: usize, B: Backend>(x: Tensor<B, D>, eps: f64) -> Tensor<B, D> {
    let x = cast_to(x, DType::F32);
    let var = x.clone().powi_scalar(2).mean_dim(D - 1);
    x * (var + eps).sqrt().recip()
}

/// `x` in `dtype`: the tensor itself when it already is (no cast op, no autodiff node).
pub fn cast_to<const D: usize, B: Backend>(x: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if x.dtype() == dtype { x } else { x.cast(dtype) }
}

/// LayerNorm: `w · (x − mean) / sqrt(var + eps) + b` with the biased variance.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub bias: Param<Tensor<B, 1>>,
    pub eps: f64,
}

/// `{prefix}.weight`, `{prefix}.bias`.
impl<B: Backend> Weights<B> for LayerNorm<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        w.tensor(&join(prefix, "weight"), &mut self.weight, Init::Ones);
        w.tensor(&join(prefix, "bias"), &mut self.bias, Init::Zeros);
    }
}

impl<B: Backend> LayerNorm<B> {
    pub fn new(device: &B::Device, dim: usize, eps: f64) -> Self {
        Self {
            weight: shaped(device, [dim]),
            bias: shaped(device, [dim]),
            eps,
        }
    }

    /// Computed in f32, result in the input's dtype.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dtype = x.dtype();
        let x = x.cast(DType::F32);
        let mean = x.clone().mean_dim(D - 1);
        let centered = x - mean;
        let var = centered.clone().powi_scalar(2).mean_dim(D - 1);
        let x = centered * (var + self.eps).sqrt().recip();
        let w = self.weight.val().cast(DType::F32).unsqueeze::<D>();
        let b = self.bias.val().cast(DType::F32).unsqueeze::<D>();
        (x * w + b).cast(dtype)
    }
}
