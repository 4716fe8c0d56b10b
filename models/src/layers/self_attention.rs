//! The Qwen decoders' self-attention layer ([`Attention`]) and its sizes ([`AttentionShape`]):
//! projections, optional q/k norms, RoPE, the KV cache and grouped-query attention.

use burn::prelude::*;

use super::kv_cache::append_kv;
use super::linear::Linear;
use super::masked_attention::{AttentionMask, grouped_query_attention};
use super::norm::RmsNorm;
use super::rotary::Rotary;
use crate::weights::{WeightNames, Weights, join};

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
