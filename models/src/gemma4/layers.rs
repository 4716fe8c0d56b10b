//! Small building blocks of Gemma 4's text and vision towers: a bias-free linear in the Hugging
//! Face weight layout, RMSNorm with an optional weight, the clipped linear of the vision tower,
//! half-split ("rotate_half") rotary embedding and masked multi-head attention with grouped
//! KV heads and attention scale 1.0.
//!
//! Formulas follow transformers `models/gemma4/modeling_gemma4.py` (5.24); see each item.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::softmax;

use super::weights::{NamedTensor, NamedTensors, WeightReader};

/// `y = x · Wᵀ`, `W` `[out, in]` as stored by transformers (`nn.Linear(bias=False)`).
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    pub weight: Param<Tensor<B, 2>>,
}

impl<B: Backend> Linear<B> {
    /// Loads `<prefix>.weight` of shape `[out, in]`.
    pub fn load(
        w: &mut WeightReader,
        prefix: &str,
        out: usize,
        inp: usize,
        device: &B::Device,
    ) -> Self {
        Self {
            weight: w.param(&format!("{prefix}.weight"), [out, inp], device),
        }
    }

    /// Applies the linear map over the last dimension.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let mut dims = x.dims();
        let inp = dims[D - 1];
        let rows: usize = dims[..D - 1].iter().product();
        let w = self.weight.val();
        let out = w.dims()[0];
        dims[D - 1] = out;
        x.reshape([rows, inp]).matmul(w.transpose()).reshape(dims)
    }

    /// Lists `<prefix>.weight`.
    pub fn named(&self, prefix: &str, out: &mut NamedTensors<B>) {
        out.push(
            format!("{prefix}.weight"),
            NamedTensor::R2(self.weight.val()),
        );
    }
}

/// RMSNorm over the last dimension: `x · (mean(x²) + eps)^(−1/2) · w`, computed in f32.
/// Gemma 4 multiplies by `w` itself (not `1 + w` as Gemma 1–3); `v_norm` and the vision
/// projector's pre-norm have no weight (`with_scale=False`).
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    pub weight: Option<Param<Tensor<B, 1>>>,
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// Loads `<prefix>.weight` of shape `[dim]`.
    pub fn load(
        w: &mut WeightReader,
        prefix: &str,
        dim: usize,
        eps: f64,
        device: &B::Device,
    ) -> Self {
        Self {
            weight: Some(w.param(&format!("{prefix}.weight"), [dim], device)),
            eps,
        }
    }

    /// A norm without weight.
    pub fn plain(eps: f64) -> Self {
        Self { weight: None, eps }
    }

    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let ms = x.clone().square().mean_dim(D - 1);
        let y = x * (ms + self.eps).sqrt().recip();
        match &self.weight {
            Some(w) => {
                let dim = w.dims()[0];
                let mut shape = [1usize; D];
                shape[D - 1] = dim;
                y * w.val().reshape(shape)
            }
            None => y,
        }
    }

    /// Lists `<prefix>.weight` when the norm has a weight.
    pub fn named(&self, prefix: &str, out: &mut NamedTensors<B>) {
        if let Some(w) = &self.weight {
            out.push(format!("{prefix}.weight"), NamedTensor::R1(w.val()));
        }
    }
}

/// The vision tower's clipped linear (`Gemma4ClippableLinear`):
/// `y = clamp(clamp(x, in_min, in_max) · Wᵀ, out_min, out_max)`; the four bounds are scalar
/// buffers stored next to `linear.weight`. The clamps pass zero gradient where they are active.
#[derive(Module, Debug)]
pub struct ClippedLinear<B: Backend> {
    pub linear: Linear<B>,
    pub input_min: f32,
    pub input_max: f32,
    pub output_min: f32,
    pub output_max: f32,
}

impl<B: Backend> ClippedLinear<B> {
    /// Loads `<prefix>.linear.weight` and the bounds `<prefix>.{input,output}_{min,max}`.
    pub fn load(
        w: &mut WeightReader,
        prefix: &str,
        out: usize,
        inp: usize,
        device: &B::Device,
    ) -> Self {
        Self {
            linear: Linear::load(w, &format!("{prefix}.linear"), out, inp, device),
            input_min: w.scalar(&format!("{prefix}.input_min")),
            input_max: w.scalar(&format!("{prefix}.input_max")),
            output_min: w.scalar(&format!("{prefix}.output_min")),
            output_max: w.scalar(&format!("{prefix}.output_max")),
        }
    }

    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let x = x.clamp(self.input_min, self.input_max);
        self.linear
            .forward(x)
            .clamp(self.output_min, self.output_max)
    }

    /// Lists `<prefix>.linear.weight` and the four scalar bounds.
    pub fn named(&self, prefix: &str, out: &mut NamedTensors<B>) {
        self.linear.named(&format!("{prefix}.linear"), out);
        for (name, v) in [
            ("input_min", self.input_min),
            ("input_max", self.input_max),
            ("output_min", self.output_min),
            ("output_max", self.output_max),
        ] {
            out.push(format!("{prefix}.{name}"), NamedTensor::Scalar(v));
        }
    }
}

/// `rotate_half(x) = cat(−x[..., D/2:], x[..., :D/2])` over the last dimension.
pub fn rotate_half<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let last = x.dims()[D - 1];
    let half = last / 2;
    let x1 = x.clone().narrow(D - 1, 0, half);
    let x2 = x.narrow(D - 1, half, last - half);
    Tensor::cat(vec![x2.neg(), x1], D - 1)
}

/// `x · cos + rotate_half(x) · sin` (transformers `apply_rotary_pos_emb`); `cos`/`sin`
/// broadcast against `x`.
pub fn apply_rotary<B: Backend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let dims = x.dims();
    x.clone() * cos.expand(dims) + rotate_half(x) * sin.expand(dims)
}

/// `cos(cat(f, f))`, `sin(cat(f, f))` with `f = pos · inv_freq` in f32, shaped `[B, 1, L, 2·F]`
/// for positions `[B, L]`.
pub fn rotary_tables<B: Backend>(
    positions: Tensor<B, 2>,
    inv_freq: &[f32],
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let [b, l] = positions.dims();
    let device = positions.device();
    let f = inv_freq.len();
    let inv = Tensor::<B, 1>::from_data(TensorData::new(inv_freq.to_vec(), [f]), &device)
        .reshape([1, 1, f]);
    let freqs = positions.reshape([b, l, 1]) * inv;
    let emb = Tensor::cat(vec![freqs.clone(), freqs], 2).reshape([b, 1, l, 2 * f]);
    (emb.clone().cos(), emb.sin())
}

/// Scaled-dot-product attention with scale 1.0 (Gemma 4: the q/k norms carry the temperature)
/// and grouped KV heads (query head h uses KV head `h / (H / KV)`).
///
/// `q` `[B, H, L, D]`, `k`/`v` `[B, KV, S, D]`, `blocked` `[B, L, S]` (true = the query may not
/// see the key). Blocked scores are replaced by the lowest f32 before the softmax, so a query
/// that sees no key gets a uniform softmax (as the eager reference). Returns `[B, H, L, D]`.
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    blocked: Tensor<B, 3, Bool>,
) -> Tensor<B, 4> {
    let [b, h, l, d] = q.dims();
    let [_, kv, s, _] = k.dims();
    let (k, v) = if kv == h {
        (k, v)
    } else {
        let g = h / kv;
        (
            k.unsqueeze_dim::<5>(2)
                .expand([b, kv, g, s, d])
                .reshape([b, h, s, d]),
            v.unsqueeze_dim::<5>(2)
                .expand([b, kv, g, s, d])
                .reshape([b, h, s, d]),
        )
    };
    let scores = q.matmul(k.swap_dims(2, 3));
    let blocked = blocked.unsqueeze_dim::<4>(1).expand([b, h, l, s]);
    let probs = softmax(scores.mask_fill(blocked, f32::MIN), 3);
    probs.matmul(v)
}
