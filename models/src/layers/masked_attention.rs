//! The attention computation: the causal / padding / packed-segment / sliding-window masks
//! ([`AttentionMask`], [`causal_padding_window_bias`]), eager [`attention`] and
//! [`grouped_query_attention`] (flash kernel on the GPU backends, composite elsewhere).

use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::activation::softmax;

use crate::kernels::attention::MaskRule;

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
