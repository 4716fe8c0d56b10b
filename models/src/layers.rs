//! Layers shared by the model families: linear maps in Hugging Face weight layout, RMSNorm,
//! LayerNorm, rotate-half RoPE driven by explicit position ids, grouped-query attention with
//! padding + causal masks and a KV cache (the Qwen decoders' [`Attention`], with optional q/k
//! norms), the SwiGLU MLP and the GELU variants.
//!
//! Every layer has a `new` (its sizes, placeholder tensors) and a `weights` that names each
//! tensor once for both loading and export ([`crate::weights::Weights`]), next to its `forward`. burn's built-in rotary encoding (interleaved pairs, contiguous offsets) and its
//! attention (no GQA, no position ids) do not fit Hugging Face models, hence these.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::activation::{sigmoid, softmax};

pub use crate::kernels::attention::MaskRule;
use crate::lora::Lora;
use crate::weights::{Init, WeightNames, Weights, join, shaped};

/// `y = x·Wᵀ + b` with `W` stored `[out, in]` as in PyTorch / Hugging Face checkpoints, plus
/// `s · x·Aᵀ·Bᵀ` when the build attached a LoRA adapter ([`crate::lora`]).
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    pub weight: Param<Tensor<B, 2>>,
    pub bias: Option<Param<Tensor<B, 1>>>,
    pub lora: Option<Lora<B>>,
}

/// `{prefix}.weight` `[out, in]`, `{prefix}.bias` `[out]` when present, and the adapter the
/// source gives module `prefix`.
impl<B: Backend> Weights<B> for Linear<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        w.adapted(
            &join(prefix, "weight"),
            &mut self.weight,
            self.lora.as_ref(),
        );
        if let Some(b) = &mut self.bias {
            w.tensor(&join(prefix, "bias"), b, Init::Zeros);
        }
        w.adapter(prefix, &mut self.lora, &self.weight);
    }
}

impl<B: Backend> Linear<B> {
    /// `[out_dim, in_dim]` weight, `[out_dim]` bias when `bias`, no adapter (placeholders).
    pub fn new(device: &B::Device, in_dim: usize, out_dim: usize, bias: bool) -> Self {
        Self {
            weight: shaped(device, [out_dim, in_dim]),
            bias: bias.then(|| shaped(device, [out_dim])),
            lora: None,
        }
    }

    /// Applies the map over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dims = x.dims();
        let in_dim = dims[D - 1];
        let rows = x.shape().num_elements() / in_dim;
        let w = self.weight.val();
        let out_dim = w.dims()[0];
        let x = x.reshape([rows, in_dim]);
        let mut y = match &self.lora {
            Some(lora) => x.clone().matmul(w.transpose()) + lora.forward(x),
            None => x.matmul(w.transpose()),
        };
        if let Some(b) = &self.bias {
            y = y + b.val().unsqueeze_dim(0);
        }
        let mut out = dims;
        out[D - 1] = out_dim;
        y.reshape(out)
    }
}

/// Sizes of an [`Attention`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// Per-head width (explicit: `q_proj` is `[heads·head_dim, hidden]`, need not be square).
    pub head_dim: usize,
    /// Biases on q/k/v.
    pub qkv_bias: bool,
    /// Bias on o.
    pub o_bias: bool,
    /// Per-head RMSNorm of q and k (over `head_dim`, before RoPE) with this epsilon.
    pub qk_norm_eps: Option<f64>,
}

/// Self-attention of a Qwen decoder layer (Qwen2 `Qwen2VLAttention`; Qwen3
/// `Qwen3VLTextAttention` adds `q_norm` / `k_norm`):
/// `o_proj(softmax(q·kᵀ/√head_dim + bias)·v)` with `q = rope(norm_q(x·Wqᵀ))`,
/// `k = rope(norm_k(x·Wkᵀ))` (the norms when present), grouped-query heads and a KV cache
/// that stores keys after their norm and RoPE.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub q_proj: Linear<B>,
    pub k_proj: Linear<B>,
    pub v_proj: Linear<B>,
    pub o_proj: Linear<B>,
    pub q_norm: Option<RmsNorm<B>>,
    pub k_norm: Option<RmsNorm<B>>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// `{prefix}.{q,k,v,o}_proj` and, with norms, `{prefix}.{q,k}_norm`.
impl<B: Backend> Weights<B> for Attention<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        self.q_proj.weights(w, &join(prefix, "q_proj"));
        self.k_proj.weights(w, &join(prefix, "k_proj"));
        self.v_proj.weights(w, &join(prefix, "v_proj"));
        self.o_proj.weights(w, &join(prefix, "o_proj"));
        if let Some(n) = &mut self.q_norm {
            n.weights(w, &join(prefix, "q_norm"));
        }
        if let Some(n) = &mut self.k_norm {
            n.weights(w, &join(prefix, "k_norm"));
        }
    }
}

impl<B: Backend> Attention<B> {
    pub fn new(device: &B::Device, s: &AttentionShape) -> Self {
        let q = s.heads * s.head_dim;
        let kv = s.kv_heads * s.head_dim;
        let norm = || {
            s.qk_norm_eps
                .map(|eps| RmsNorm::new(device, s.head_dim, eps))
        };
        Self {
            q_proj: Linear::new(device, s.hidden, q, s.qkv_bias),
            k_proj: Linear::new(device, s.hidden, kv, s.qkv_bias),
            v_proj: Linear::new(device, s.hidden, kv, s.qkv_bias),
            o_proj: Linear::new(device, q, s.hidden, s.o_bias),
            q_norm: norm(),
            k_norm: norm(),
            num_heads: s.heads,
            num_kv_heads: s.kv_heads,
            head_dim: s.head_dim,
        }
    }

    /// `x` `[b, l, hidden]`; `rope_q`/`rope_k` for `[b, l, heads, head_dim]` and
    /// `[b, l, kv_heads, head_dim]`; `mask` over the `past + l` keys. The norms and RoPE act in
    /// the projections' contiguous `[b, l, heads, head_dim]` layout, before the heads are moved
    /// forward.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        rope_q: &Rotary<B>,
        rope_k: &Rotary<B>,
        mask: &AttentionMask<B>,
        cache: Option<&mut Option<(Tensor<B, 4>, Tensor<B, 4>)>>,
    ) -> Tensor<B, 3> {
        let [b, l, _] = x.dims();
        let (h, kvh, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let normed = |norm: &Option<RmsNorm<B>>, t: Tensor<B, 4>| match norm {
            Some(n) => n.forward(t),
            None => t,
        };
        let q = normed(
            &self.q_norm,
            self.q_proj.forward(x.clone()).reshape([b, l, h, d]),
        );
        let q = rope_q.apply(q).swap_dims(1, 2);
        let k = normed(
            &self.k_norm,
            self.k_proj.forward(x.clone()).reshape([b, l, kvh, d]),
        );
        let mut k = rope_k.apply(k).swap_dims(1, 2);
        let mut v = self
            .v_proj
            .forward(x)
            .reshape([b, l, kvh, d])
            .swap_dims(1, 2);
        if let Some(slot) = cache {
            // Every key the queries attend to: cached + new (the mask covers them all).
            (k, v) = append_kv(slot, k, v, mask.keys());
        }
        let out = grouped_query_attention(q, k, v, mask, 1.0 / (d as f64).sqrt());
        self.o_proj
            .forward(out.swap_dims(1, 2).reshape([b, l, h * d]))
    }
}

/// Appends a layer's new keys and values `[b, kv_heads, l, d]` to its cache slot and returns
/// the keys and values to attend to, `[b, kv_heads, total, d]` (`total` = cached + `l`, the
/// width of the attention mask). The slot holds either exactly the `total − l` cached
/// positions, grown here by a `cat` (a cache filled by plain forward calls), or buffers
/// reserved at a longer length by [`reserve_kv`] (generation): their first `total − l`
/// positions are filled, the new ones are written in place after them ([`write_positions`])
/// and the filled prefix is returned as a view, so no step copies the cache. Either way the
/// returned values are the same numbers. An empty slot stores `k`, `v` as they are.
pub(crate) fn append_kv<B: Backend>(
    slot: &mut Option<(Tensor<B, 4>, Tensor<B, 4>)>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    total: usize,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let Some((pk, pv)) = slot.take() else {
        *slot = Some((k.clone(), v.clone()));
        return (k, v);
    };
    let [b, h, capacity, d] = pk.dims();
    let past = total - k.dims()[2];
    if capacity == past || capacity < total {
        // Grown by a cat (a reserved buffer too short for this step keeps its filled prefix).
        let (pk, pv) = if capacity == past {
            (pk, pv)
        } else {
            let prefix = |t: Tensor<B, 4>| t.slice([0..b, 0..h, 0..past, 0..d]);
            (prefix(pk), prefix(pv))
        };
        let k = Tensor::cat(vec![pk, k], 2);
        let v = Tensor::cat(vec![pv, v], 2);
        *slot = Some((k.clone(), v.clone()));
        return (k, v);
    }
    let pk = write_positions(pk, k, past);
    let pv = write_positions(pv, v, past);
    let filled = |t: &Tensor<B, 4>| t.clone().slice([0..b, 0..h, 0..total, 0..d]);
    let (k, v) = (filled(&pk), filled(&pv));
    *slot = Some((pk, pv));
    (k, v)
}

/// Reserves a cache slot's keys and values `[b, kv_heads, len, d]` as buffers of `capacity`
/// positions (the first `len` filled, the rest zeros), so that [`append_kv`] writes the next
/// `capacity − len` positions in place. A slot already that long is left as it is.
pub(crate) fn reserve_kv<B: Backend>(
    slot: &mut Option<(Tensor<B, 4>, Tensor<B, 4>)>,
    capacity: usize,
) {
    let Some((k, v)) = slot.take() else {
        return;
    };
    let grow = |t: Tensor<B, 4>| {
        let [b, h, len, d] = t.dims();
        if len >= capacity {
            return t;
        }
        let buffer = Tensor::<B, 4>::zeros([b, h, capacity, d], (&t.device(), t.dtype()));
        write_positions(buffer, t, 0)
    };
    *slot = Some((grow(k), grow(v)));
}

/// `buffer[:, :, at..at + l, :] = values` for `values` `[b, h, l, d]`. On the Flex backend the
/// write goes into `buffer`'s own storage when nothing else holds it (burn-flex's
/// `slice_assign` copies the whole buffer first: it keeps a second handle on its input before
/// writing; [`crate::flex::write_positions`]); elsewhere, or for a shared buffer, it is
/// `slice_assign`.
pub(crate) fn write_positions<B: Backend>(
    buffer: Tensor<B, 4>,
    values: Tensor<B, 4>,
    at: usize,
) -> Tensor<B, 4> {
    use burn::tensor::TensorPrimitive;
    let [b, h, capacity, d] = buffer.dims();
    let l = values.dims()[2];
    debug_assert!(at + l <= capacity, "writing {at}..{} of {capacity}", at + l);
    let TensorPrimitive::Float(mut dst) = buffer.into_primitive() else {
        unreachable!("a KV cache holds float tensors")
    };
    let written = match values.clone().into_primitive() {
        TensorPrimitive::Float(src) => {
            crate::flex::write_positions::<B>(&mut dst, src, [b, h, capacity, d], l, at)
        }
        TensorPrimitive::QFloat(_) => false,
    };
    let buffer = Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(dst));
    if written {
        buffer
    } else {
        buffer.slice_assign([0..b, 0..h, at..at + l, 0..d], values)
    }
}

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

/// Exact GELU `0.5·z·(1 + erf(z/√2))` (PyTorch `nn.GELU()` default).
pub fn gelu_erf<const D: usize, B: Backend>(z: Tensor<B, D>) -> Tensor<B, D> {
    z.clone() * (z * std::f64::consts::FRAC_1_SQRT_2).erf().add_scalar(1.0) * 0.5
}

/// QuickGELU `z·σ(1.702·z)` (CLIP / Qwen2-VL vision MLP).
pub fn quick_gelu<const D: usize, B: Backend>(z: Tensor<B, D>) -> Tensor<B, D> {
    z.clone() * sigmoid(z * 1.702)
}

/// SiLU `z·σ(z)`.
pub fn silu<const D: usize, B: Backend>(z: Tensor<B, D>) -> Tensor<B, D> {
    z.clone() * sigmoid(z)
}

/// Gated MLP `down(silu(gate(x)) ⊙ up(x))` (LLaMA/Qwen SwiGLU).
#[derive(Module, Debug)]
pub struct SwiGluMlp<B: Backend> {
    pub gate_proj: Linear<B>,
    pub up_proj: Linear<B>,
    pub down_proj: Linear<B>,
}

/// `{prefix}.{gate,up,down}_proj`.
impl<B: Backend> Weights<B> for SwiGluMlp<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        self.gate_proj.weights(w, &join(prefix, "gate_proj"));
        self.up_proj.weights(w, &join(prefix, "up_proj"));
        self.down_proj.weights(w, &join(prefix, "down_proj"));
    }
}

impl<B: Backend> SwiGluMlp<B> {
    pub fn new(device: &B::Device, dim: usize, hidden: usize, bias: bool) -> Self {
        Self {
            gate_proj: Linear::new(device, dim, hidden, bias),
            up_proj: Linear::new(device, dim, hidden, bias),
            down_proj: Linear::new(device, hidden, dim, bias),
        }
    }

    /// On the GPU backends the gate is one kernel ([`crate::kernels::elementwise::swiglu`]).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let gate = self.gate_proj.forward(x.clone());
        let up = self.up_proj.forward(x);
        let g = match crate::kernels::elementwise::swiglu(&gate, &up) {
            Some(g) => g,
            None => silu(gate) * up,
        };
        self.down_proj.forward(g)
    }
}

/// `rotate_half(x) = [−x[d/2:], x[:d/2]]` over the last dimension.
pub fn rotate_half<const D: usize, B: Backend>(x: Tensor<B, D>) -> Tensor<B, D> {
    let d = x.dims()[D - 1];
    let half = d / 2;
    let x1 = x.clone().narrow(D - 1, 0, half);
    let x2 = x.narrow(D - 1, half, half);
    Tensor::cat(vec![x2.neg(), x1], D - 1)
}

/// Rotate-half RoPE: `x·cos + rotate_half(x)·sin` (cos/sin broadcast against `x`, cast to its
/// dtype).
pub fn apply_rotary<const D: usize, B: Backend>(
    x: Tensor<B, D>,
    cos: Tensor<B, D>,
    sin: Tensor<B, D>,
) -> Tensor<B, D> {
    let dtype = x.dtype();
    x.clone() * cos.cast(dtype) + rotate_half(x) * sin.cast(dtype)
}

/// Rotate-half RoPE with its cos/sin tables in the compute dtype, cast once per forward (not
/// per layer): `x·cos + rotate_half(x)·sin`, where
/// `rotate_half(x)·sin = [−x₂·sin₁, x₁·sin₂] = swap_halves(x)·[−sin₁, sin₂]` (the sign moves
/// from x onto the table; `(−a)·b = a·(−b)` exactly in IEEE arithmetic). Same values as
/// [`apply_rotary`].
///
/// On the GPU backends one kernel per rotation ([`crate::kernels::elementwise::rotate_half`]),
/// reading the `[a, c, d]` tables for every head. Elsewhere the tables are laid out once,
/// contiguous, in the layout of the tensors they rotate (`[.., heads, head_dim]`, the layout a
/// projection's output has before the heads are moved forward), so that every layer's
/// rotation is two same-shape products and a sum: on the Flex CPU backend an elementwise
/// product of a permuted view with a broadcast table walks a scalar strided iterator, about an
/// order of magnitude slower than the contiguous path, in the forward and again in the
/// backward.
#[derive(Debug, Clone)]
pub struct Rotary<B: Backend> {
    /// `[a, c, head_dim]`.
    cos: Tensor<B, 3>,
    /// `[−sin(angle), sin(angle)]` over the two halves of the head dimension, `[a, c, head_dim]`.
    sin_signed: Tensor<B, 3>,
    heads: usize,
    /// The composite's tables `[a, c, heads, head_dim]`, built on first use.
    laid_out: std::cell::OnceCell<(Tensor<B, 4>, Tensor<B, 4>)>,
}

impl<B: Backend> Rotary<B> {
    /// Tables for `heads` heads in `dtype` from cos/sin `[a, c, head_dim]` (as [`rope_tables`]
    /// returns them: `a` = batch, `c` = length; or `a` = 1, `c` = patches).
    pub fn new(cos: Tensor<B, 3>, sin: Tensor<B, 3>, heads: usize, dtype: DType) -> Self {
        let d = sin.dims()[2];
        let half = d / 2;
        let sin_signed = Tensor::cat(
            vec![
                sin.clone().narrow(2, 0, half).neg(),
                sin.narrow(2, half, d - half),
            ],
            2,
        );
        Self {
            cos: cast_to(cos, dtype),
            sin_signed: cast_to(sin_signed, dtype),
            heads,
            laid_out: std::cell::OnceCell::new(),
        }
    }

    /// Rotates `x` `[a, c, heads, head_dim]` (in the tables' dtype).
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        if let Some(y) = crate::kernels::elementwise::rotate_half(&x, &self.cos, &self.sin_signed) {
            return y;
        }
        let (cos, sin_signed) = self.laid_out.get_or_init(|| {
            let lay = |t: &Tensor<B, 3>| t.clone().unsqueeze_dim::<4>(2).repeat_dim(2, self.heads);
            (lay(&self.cos), lay(&self.sin_signed))
        });
        let d = x.dims()[3];
        let half = d / 2;
        let swapped = Tensor::cat(
            vec![
                x.clone().narrow(3, half, d - half),
                x.clone().narrow(3, 0, half),
            ],
            3,
        );
        x * cos.clone() + swapped * sin_signed.clone()
    }
}

/// RoPE inverse frequencies `1 / theta^(2i/dim)`, i = 0..dim/2 − 1 (computed in f64, stored f32).
pub fn inv_freq(theta: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| (1.0 / theta.powf(2.0 * i as f64 / dim as f64)) as f32)
        .collect()
}

/// cos/sin tables `[batch, len, head_dim]` of rotate-half RoPE from explicit position ids
/// `[streams, batch, len]`.
///
/// Half-dimension slot i takes its position from stream `s(i)`: with one stream every slot uses
/// it; with several, `sections` (Qwen2-VL's `mrope_section`, summing to head_dim/2) assigns
/// consecutive slots to streams 0, 1, 2. `angle_i = pos[s(i)]·inv_freq[i]`,
/// `cos = [cos(angle), cos(angle)]` (HF `apply_multimodal_rotary_pos_emb`).
pub fn rope_tables<B: Backend>(
    positions: Tensor<B, 3, Int>,
    inv_freq: &[f32],
    sections: &[usize],
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let [streams, batch, len] = positions.dims();
    let half = inv_freq.len();
    let device = positions.device();
    let freq = Tensor::<B, 1>::from_data(TensorData::new(inv_freq.to_vec(), [half]), &device)
        .reshape([1, 1, half]);
    let pos = positions.float();
    let angles = if streams == 1 {
        pos.reshape([batch, len, 1]) * freq
    } else {
        let mut parts = Vec::with_capacity(sections.len());
        let mut start = 0;
        for (s, &n) in sections.iter().enumerate() {
            let p = pos
                .clone()
                .narrow(0, s.min(streams - 1), 1)
                .reshape([batch, len, 1]);
            parts.push(p * freq.clone().narrow(2, start, n));
            start += n;
        }
        Tensor::cat(parts, 2)
    };
    let emb = Tensor::cat(vec![angles.clone(), angles], 2);
    (emb.clone().cos(), emb.sin())
}

/// Additive attention bias `[batch, 1, len, past + len]`: 0 where query i (absolute index
/// `past + i`) may attend key j, a large negative number elsewhere (finite, so fully masked
/// padding rows give a uniform softmax like HF's `finfo.min` bias instead of NaN).
///
/// `key_mask[b, j]` is 0 at padding and a sequence number (segment) at real tokens: 1 for
/// every real token of an ordinary row, 1, 2, … for the sequences a padding-free row packs
/// one after the other. Query q may attend key j when `j ≤ q`, `key_mask[b, j] ≠ 0` and the
/// two are in one segment (`key_mask[b, q] = key_mask[b, j]`); a padding query (segment 0)
/// attends every earlier real key, as with a 0/1 mask (its output is never read). With a 0/1
/// mask this is the usual causal + padding mask, bit for bit.
pub fn causal_padding_bias<B: Backend>(key_mask: Tensor<B, 2, Int>, len: usize) -> Tensor<B, 4> {
    causal_padding_window_bias(key_mask, len, None)
}

/// [`causal_padding_bias`] with an optional sliding window `W`: key j is also masked unless
/// `j > past + i − W` (at most W keys, the query's own included; HF sliding-window layers).
pub fn causal_padding_window_bias<B: Backend>(
    key_mask: Tensor<B, 2, Int>,
    len: usize,
    window: Option<usize>,
) -> Tensor<B, 4> {
    let [batch, total] = key_mask.dims();
    let past = total - len;
    let device = key_mask.device();
    let mut causal = Vec::with_capacity(len * total);
    for i in 0..len {
        for j in 0..total {
            let visible = j <= past + i && window.is_none_or(|w| j + w > past + i);
            causal.push(if visible { 0.0f32 } else { MASKED });
        }
    }
    let causal = Tensor::<B, 1>::from_data(TensorData::new(causal, [len * total]), &device)
        .reshape([1, 1, len, total]);
    let keys = key_mask.clone().reshape([batch, 1, 1, total]);
    let pad = keys.clone().equal_elem(0).float() * MASKED;
    // (s_q − s_k)·s_q is 0 exactly when the query is padding or in the key's segment.
    let queries = key_mask
        .narrow(1, past, len)
        .reshape([batch, 1, len, 1])
        .expand([batch, 1, len, total]);
    let other_segment = ((queries.clone() - keys.expand([batch, 1, len, total])) * queries)
        .not_equal_elem(0)
        .float()
        * MASKED;
    // Every term is ≤ 0; clamp so that a doubly masked entry stays finite and equal to the others.
    (causal + pad + other_segment).clamp_min(MASKED)
}

/// Bias of masked attention entries.
pub const MASKED: f32 = -1.0e30;

/// `softmax(q·kᵀ·scale + bias)·v` with q `[.., L, d]`, k, v `[.., T, d]`; the bias and the
/// softmax in f32 (HF eager attention), the result in q's dtype.
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Option<Tensor<B, 4>>,
    scale: f64,
) -> Tensor<B, 4> {
    let dtype = q.dtype();
    let mut scores = (q.matmul(k.transpose()) * scale).cast(DType::F32);
    if let Some(b) = bias {
        scores = scores + b.cast(DType::F32);
    }
    softmax(scores, 3).cast(dtype).matmul(v)
}

/// Which keys the queries of one forward pass attend to, shared by its layers: per key its
/// segment (`[batch, keys]`: 0 at padding, 1, 2, … at the real tokens of the sequences a row
/// packs; the attention mask of [`crate::capabilities::CausalLm::forward_hidden`]), the last
/// `queries` keys being the queries' own, causally and with an optional sliding window. The flash
/// kernels ([`crate::kernels::attention`]) read the segments; the composite path's additive bias
/// ([`causal_padding_window_bias`], laid out per kv head by [`grouped_attention_bias`]) is
/// built on its first use and kept for the other layers.
pub struct AttentionMask<B: Backend> {
    segments: Tensor<B, 2, Int>,
    queries: usize,
    rule: MaskRule,
    grouped_bias: std::cell::OnceCell<Tensor<B, 4>>,
}

impl<B: Backend> AttentionMask<B> {
    /// Causal attention of the last `queries` of the keys `segments` covers, within `window`
    /// keys when given.
    pub fn causal(segments: Tensor<B, 2, Int>, queries: usize, window: Option<usize>) -> Self {
        Self {
            segments,
            queries,
            rule: MaskRule {
                causal: true,
                window,
            },
            grouped_bias: std::cell::OnceCell::new(),
        }
    }

    /// Number of keys.
    pub fn keys(&self) -> usize {
        self.segments.dims()[1]
    }

    /// The bias `[b, kv_heads, group·L, T]` of the composite path (built once).
    fn grouped_bias(&self, kv_heads: usize, group: usize) -> Tensor<B, 4> {
        self.grouped_bias
            .get_or_init(|| {
                grouped_attention_bias(
                    causal_padding_window_bias(
                        self.segments.clone(),
                        self.queries,
                        self.rule.window,
                    ),
                    kv_heads,
                    group,
                )
            })
            .clone()
    }
}

/// The attention bias `[b, 1, L, T]` (shared by the heads) laid out for
/// [`grouped_query_attention`]'s composite path: `[b, kv_heads, group·L, T]`, contiguous, the
/// `group` query heads of each kv head stacked along the query axis, so the score + bias sum is
/// a same-shape contiguous add.
pub fn grouped_attention_bias<B: Backend>(
    bias: Tensor<B, 4>,
    kv_heads: usize,
    group: usize,
) -> Tensor<B, 4> {
    bias.repeat_dim(2, group).repeat_dim(1, kv_heads)
}

/// Grouped-query attention without copying keys and values per query head: q
/// `[b, heads, L, d]`, k, v `[b, kv_heads, T, d]`, `mask` over the T keys. Query head j uses kv
/// head `j / group` (HF `repeat_kv` semantics). On the GPU backends one flash kernel that never
/// materialises the `[L, T]` scores ([`crate::kernels::attention`]); elsewhere the composite
/// [`attention`] with the `group` query heads of one kv head stacked along the query axis,
/// `[b, kv_heads, group·L, d]`, attending to that kv head at once.
pub fn grouped_query_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: &AttentionMask<B>,
    scale: f64,
) -> Tensor<B, 4> {
    if crate::kernels::attention::available::<B>()
        && let Some(out) = crate::kernels::attention::flash_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            &mask.segments,
            mask.rule,
            scale,
        )
    {
        return out;
    }
    let [b, heads, l, d] = q.dims();
    let kv_heads = k.dims()[1];
    let group = heads / kv_heads;
    let q = q.reshape([b, kv_heads, group * l, d]);
    let bias = mask.grouped_bias(kv_heads, group);
    attention(q, k, v, Some(bias), scale).reshape([b, heads, l, d])
}

/// `[batch, kv_heads, T, d]` → `[batch, kv_heads·group, T, d]`: query head j uses kv head
/// `j / group` (HF `repeat_kv`).
pub fn repeat_kv<B: Backend>(x: Tensor<B, 4>, group: usize) -> Tensor<B, 4> {
    if group == 1 {
        return x;
    }
    let [b, h, t, d] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .repeat_dim(2, group)
        .reshape([b, h * group, t, d])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    fn ints(v: Vec<i64>, shape: [usize; 2]) -> Tensor<Flex, 2, Int> {
        Tensor::<Flex, 1, Int>::from_data(
            TensorData::new(v, [shape[0] * shape[1]]),
            &Default::default(),
        )
        .reshape(shape)
    }

    /// A cache reserved at its final length gives the keys of the cat-grown one at every step,
    /// and its steps write into the one buffer reserved (no copy of the cache per step).
    #[test]
    fn reserved_kv_cache_writes_in_place_and_matches_cat() {
        let device = Default::default();
        let step = |i: usize, l: usize| {
            let n = 2 * 3 * l * 4;
            let v: Vec<f32> = (0..n).map(|j| (i * 1000 + j) as f32).collect();
            // [b, l, kv_heads, d] moved to [b, kv_heads, l, d], as the projections give them.
            Tensor::<Flex, 1>::from_data(TensorData::new(v, [n]), &device)
                .reshape([2, l, 3, 4])
                .swap_dims(1, 2)
        };
        let ptr = |t: &Tensor<Flex, 4>| t.clone().into_primitive().tensor().bytes().as_ptr();
        let (mut grown, mut reserved) = (None, None);
        let prompt = 5;
        for slot in [&mut grown, &mut reserved] {
            append_kv(slot, step(0, prompt), step(0, prompt), prompt);
        }
        reserve_kv(&mut reserved, prompt + 3);
        let buffer = ptr(&reserved.as_ref().unwrap().0);
        for i in 1..=3 {
            let total = prompt + i;
            let (gk, gv) = append_kv(&mut grown, step(i, 1), step(i, 1), total);
            let (rk, rv) = append_kv(&mut reserved, step(i, 1), step(i, 1), total);
            assert_eq!(rk.dims(), [2, 3, total, 4]);
            assert_eq!(gk.into_data(), rk.into_data(), "keys after step {i}");
            assert_eq!(gv.into_data(), rv.into_data(), "values after step {i}");
            assert_eq!(
                ptr(&reserved.as_ref().unwrap().0),
                buffer,
                "step {i} wrote in place"
            );
        }
        // A buffer someone else also holds is not written through: slice_assign copies it.
        let held = reserved.clone();
        let before = held.as_ref().unwrap().0.clone().into_data();
        reserve_kv(&mut reserved, prompt + 4);
        append_kv(&mut reserved, step(4, 1), step(4, 1), prompt + 4);
        assert_eq!(held.unwrap().0.into_data(), before);
    }

    #[test]
    fn bias_is_causal_and_masks_padding_keys() {
        // Row 0: one pad then two tokens; one cached key + 2 new queries.
        let mask = ints(vec![0, 1, 1], [1, 3]);
        let b = causal_padding_bias(mask, 2)
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        // Query 0 (absolute 1) sees key 1; query 1 (absolute 2) sees keys 1, 2; key 0 is padding.
        assert_eq!(b, vec![MASKED, 0.0, MASKED, MASKED, 0.0, 0.0]);
    }

    #[test]
    fn packed_segments_attend_only_within_themselves() {
        // One row packing two sequences (segments 1: 2 tokens, 2: 2 tokens) and a padding tail.
        let mask = ints(vec![1, 1, 2, 2, 0], [1, 5]);
        let b = causal_padding_bias(mask, 5)
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        let visible: Vec<Vec<usize>> = b
            .chunks(5)
            .map(|row| (0..5).filter(|&j| row[j] == 0.0).collect())
            .collect();
        // The padding query sees every earlier real key, as with a 0/1 mask.
        assert_eq!(
            visible,
            vec![vec![0], vec![0, 1], vec![2], vec![2, 3], vec![0, 1, 2, 3]]
        );
        assert!(b.iter().all(|&x| x == 0.0 || x == MASKED));
        // With a sliding window of 2 the second segment's queries keep their own keys only.
        let w = causal_padding_window_bias(ints(vec![1, 1, 2, 2, 2], [1, 5]), 5, Some(2))
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        let row = |q: usize| -> Vec<usize> { (0..5).filter(|&j| w[q * 5 + j] == 0.0).collect() };
        assert_eq!((row(2), row(3), row(4)), (vec![2], vec![2, 3], vec![3, 4]));
    }

    #[test]
    fn one_stream_rope_equals_three_equal_streams() {
        let device = Default::default();
        let freq = inv_freq(100.0, 16);
        let one =
            Tensor::<Flex, 1, Int>::from_data(TensorData::new(vec![0i64, 3, 7], [3]), &device)
                .reshape([1, 1, 3]);
        let three = one.clone().repeat_dim(0, 3);
        let (c1, s1) = rope_tables(one, &freq, &[2, 3, 3]);
        let (c3, s3) = rope_tables(three, &freq, &[2, 3, 3]);
        assert_eq!(c1.into_data(), c3.into_data());
        assert_eq!(s1.into_data(), s3.into_data());
    }

    #[test]
    fn repeat_kv_maps_query_head_j_to_kv_head_j_over_group() {
        let device = Default::default();
        let x = Tensor::<Flex, 1>::from_data(TensorData::new(vec![1.0f32, 2.0], [2]), &device)
            .reshape([1, 2, 1, 1]);
        let v = repeat_kv(x, 2).into_data().into_vec::<f32>().unwrap();
        assert_eq!(v, vec![1.0, 1.0, 2.0, 2.0]);
    }
}
