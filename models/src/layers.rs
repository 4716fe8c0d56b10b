//! Layers shared by the model families: linear maps in Hugging Face weight layout, RMSNorm,
//! LayerNorm, rotate-half RoPE driven by explicit position ids, grouped-query attention with
//! padding + causal masks and a KV cache, the SwiGLU MLP and the GELU variants.
//!
//! Every layer loads and exports its weights by name through [`crate::weights`], next to its
//! `forward`. burn's built-in rotary encoding (interleaved pairs, contiguous offsets) and its
//! attention (no GQA, no position ids) do not fit Hugging Face models, hence these.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::activation::{sigmoid, softmax};

use crate::lora::Lora;
use crate::weights::{Init, WeightSource, WeightVisitor};

/// `y = x·Wᵀ + b` with `W` stored `[out, in]` as in PyTorch / Hugging Face checkpoints, plus
/// `s · x·Aᵀ·Bᵀ` when the build attached a LoRA adapter ([`crate::lora`]).
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    pub weight: Param<Tensor<B, 2>>,
    pub bias: Option<Param<Tensor<B, 1>>>,
    pub lora: Option<Lora<B>>,
}

impl<B: Backend> Linear<B> {
    /// Loads `{prefix}.weight` `[out, in]` and, when `bias`, `{prefix}.bias` `[out]`; the source
    /// decides whether module `prefix` gets an adapter.
    pub fn load(
        src: &mut dyn WeightSource<B>,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        bias: bool,
    ) -> Self {
        let weight = src.take2(&format!("{prefix}.weight"), [out_dim, in_dim], Init::Matrix);
        let bias = bias.then(|| src.take1(&format!("{prefix}.bias"), [out_dim], Init::Zeros));
        let lora = src.lora_adapter(prefix, in_dim, out_dim);
        Self {
            weight: Param::from_tensor(weight),
            bias: bias.map(Param::from_tensor),
            lora,
        }
    }

    pub fn export<V: WeightVisitor<B>>(&self, sink: &mut V, prefix: &str) {
        let name = format!("{prefix}.weight");
        // A streamed merged save visits the model once per shard: merge only for the shard that
        // keeps this weight.
        let weight = match &self.lora {
            Some(lora) if sink.merges_adapters() && sink.wants(&name) => {
                lora.merge_into(self.weight.val())
            }
            _ => self.weight.val(),
        };
        sink.put(&name, weight);
        if let Some(b) = &self.bias {
            sink.put(&format!("{prefix}.bias"), b.val());
        }
        if let Some(lora) = &self.lora
            && !sink.merges_adapters()
        {
            sink.put_lora(prefix, lora);
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

/// RMSNorm: `w · x / sqrt(mean(x²) + eps)` over the last dimension (computed in f32).
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    pub fn load(src: &mut dyn WeightSource<B>, prefix: &str, dim: usize, eps: f64) -> Self {
        let weight = src.take1(&format!("{prefix}.weight"), [dim], Init::Ones);
        Self {
            weight: Param::from_tensor(weight),
            eps,
        }
    }

    pub fn export<V: WeightVisitor<B>>(&self, sink: &mut V, prefix: &str) {
        sink.put(&format!("{prefix}.weight"), self.weight.val());
    }

    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        rms_normalize(x, self.eps) * self.weight.val().unsqueeze::<D>()
    }
}

/// RMSNorm without weight: `x / sqrt(mean(x²) + eps)` over the last dimension (Gemma 4's
/// `v_norm` and vision-projector pre-norm, `with_scale=False`).
pub fn rms_normalize<const D: usize, B: Backend>(x: Tensor<B, D>, eps: f64) -> Tensor<B, D> {
    let var = x.clone().powi_scalar(2).mean_dim(D - 1);
    x * (var + eps).sqrt().recip()
}

/// LayerNorm: `w · (x − mean) / sqrt(var + eps) + b` with the biased variance.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub bias: Param<Tensor<B, 1>>,
    pub eps: f64,
}

impl<B: Backend> LayerNorm<B> {
    pub fn load(src: &mut dyn WeightSource<B>, prefix: &str, dim: usize, eps: f64) -> Self {
        let weight = src.take1(&format!("{prefix}.weight"), [dim], Init::Ones);
        let bias = src.take1(&format!("{prefix}.bias"), [dim], Init::Zeros);
        Self {
            weight: Param::from_tensor(weight),
            bias: Param::from_tensor(bias),
            eps,
        }
    }

    pub fn export<V: WeightVisitor<B>>(&self, sink: &mut V, prefix: &str) {
        sink.put(&format!("{prefix}.weight"), self.weight.val());
        sink.put(&format!("{prefix}.bias"), self.bias.val());
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

impl<B: Backend> SwiGluMlp<B> {
    pub fn load(
        src: &mut dyn WeightSource<B>,
        prefix: &str,
        dim: usize,
        hidden: usize,
        bias: bool,
    ) -> Self {
        Self {
            gate_proj: Linear::load(src, &format!("{prefix}.gate_proj"), dim, hidden, bias),
            up_proj: Linear::load(src, &format!("{prefix}.up_proj"), dim, hidden, bias),
            down_proj: Linear::load(src, &format!("{prefix}.down_proj"), hidden, dim, bias),
        }
    }

    pub fn export<V: WeightVisitor<B>>(&self, sink: &mut V, prefix: &str) {
        self.gate_proj.export(sink, &format!("{prefix}.gate_proj"));
        self.up_proj.export(sink, &format!("{prefix}.up_proj"));
        self.down_proj.export(sink, &format!("{prefix}.down_proj"));
    }

    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let g = silu(self.gate_proj.forward(x.clone()));
        self.down_proj.forward(g * self.up_proj.forward(x))
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

/// Rotate-half RoPE with its cos/sin tables laid out once, contiguous, in the layout of the
/// tensors it rotates (`[.., heads, head_dim]`, the layout a projection's output has before the
/// heads are moved forward), so that every layer's rotation is two same-shape products and a
/// sum, with no broadcast over the heads.
///
/// Same values as [`apply_rotary`]: `x·cos + rotate_half(x)·sin`, where
/// `rotate_half(x)·sin = [−x₂·sin₁, x₁·sin₂] = swap_halves(x)·[−sin₁, sin₂]` (the sign moves
/// from x onto the table; `(−a)·b = a·(−b)` exactly in IEEE arithmetic). Why: on the Flex CPU
/// backend an elementwise product of a permuted view with a broadcast table walks a scalar
/// strided iterator, about an order of magnitude slower than the contiguous path, in the
/// forward and again in the backward.
#[derive(Debug, Clone)]
pub struct Rotary<B: Backend> {
    cos: Tensor<B, 4>,
    /// `[−sin(angle), sin(angle)]` over the two halves of the head dimension.
    sin_signed: Tensor<B, 4>,
}

impl<B: Backend> Rotary<B> {
    /// Tables `[a, c, heads, head_dim]` from cos/sin `[a, c, head_dim]` (as [`rope_tables`]
    /// returns them: `a` = batch, `c` = length; or `a` = 1, `c` = patches).
    pub fn new(cos: Tensor<B, 3>, sin: Tensor<B, 3>, heads: usize) -> Self {
        let d = sin.dims()[2];
        let half = d / 2;
        let sin_signed = Tensor::cat(
            vec![
                sin.clone().narrow(2, 0, half).neg(),
                sin.narrow(2, half, d - half),
            ],
            2,
        );
        let lay = |t: Tensor<B, 3>| t.unsqueeze_dim::<4>(2).repeat_dim(2, heads);
        Self {
            cos: lay(cos),
            sin_signed: lay(sin_signed),
        }
    }

    /// Rotates `x` `[a, c, heads, head_dim]` (cast to x's dtype).
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let dtype = x.dtype();
        let d = x.dims()[3];
        let half = d / 2;
        let swapped = Tensor::cat(
            vec![
                x.clone().narrow(3, half, d - half),
                x.clone().narrow(3, 0, half),
            ],
            3,
        );
        x * self.cos.clone().cast(dtype) + swapped * self.sin_signed.clone().cast(dtype)
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
/// `past + i`) may attend key j (`j ≤ past + i` and `key_mask[b, j] = 1`), a large negative
/// number elsewhere (finite, so fully masked padding rows give a uniform softmax like HF's
/// `finfo.min` bias instead of NaN).
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
    let pad = (key_mask.float().sub_scalar(1.0) * (-MASKED)).reshape([batch, 1, 1, total]);
    // Both terms are ≤ 0; clamp so that a doubly masked entry stays finite and equal to the others.
    (causal + pad).clamp_min(MASKED)
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

/// The attention bias `[b, 1, L, T]` (shared by the heads) laid out for
/// [`grouped_query_attention`]: `[b, kv_heads, group·L, T]`, contiguous, the `group` query heads
/// of each kv head stacked along the query axis. Built once per forward, not per layer, so the
/// score + bias sum is a same-shape contiguous add.
pub fn grouped_attention_bias<B: Backend>(
    bias: Tensor<B, 4>,
    kv_heads: usize,
    group: usize,
) -> Tensor<B, 4> {
    bias.repeat_dim(2, group).repeat_dim(1, kv_heads)
}

/// Grouped-query attention without copying keys and values per query head: q
/// `[b, heads, L, d]`, k, v `[b, kv_heads, T, d]`, bias `[b, kv_heads, group·L, T]` from
/// [`grouped_attention_bias`]. Query head j uses kv head `j / group` (HF `repeat_kv`
/// semantics): the `group` query heads of one kv head are stacked along the query axis,
/// `[b, kv_heads, group·L, d]`, and attend to that kv head at once.
pub fn grouped_query_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Tensor<B, 4>,
    scale: f64,
) -> Tensor<B, 4> {
    let [b, heads, l, d] = q.dims();
    let kv_heads = k.dims()[1];
    let q = q.reshape([b, kv_heads, heads / kv_heads * l, d]);
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
