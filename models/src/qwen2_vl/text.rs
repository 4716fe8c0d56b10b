//! The Qwen2 text decoder shared by Qwen2-VL and Qwen2.5-VL (HF `Qwen2VLTextModel`).
//!
//! Layer: `h += o_proj(attn(RMSNorm(h)))`, `h += down(silu(gate(a)) ⊙ up(a))` with
//! `a = RMSNorm(h)`; q/k/v carry biases, o_proj and the MLP do not; RoPE is multimodal (three
//! position streams assigned to slots of the half head dimension by `mrope_section`); attention
//! is grouped-query with a causal + padding mask and an optional KV cache.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;

use super::config::TextConfig;
use crate::capabilities::KvCache;
use crate::layers::{
    Linear, RmsNorm, Rotary, SwiGluMlp, causal_padding_bias, grouped_attention_bias,
    grouped_query_attention, inv_freq, rope_tables,
};
use crate::weights::{Init, WeightSource, WeightVisitor};

/// Self-attention of one decoder layer.
#[derive(Module, Debug)]
pub struct TextAttention<B: Backend> {
    pub q_proj: Linear<B>,
    pub k_proj: Linear<B>,
    pub v_proj: Linear<B>,
    pub o_proj: Linear<B>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl<B: Backend> TextAttention<B> {
    fn load(src: &mut dyn WeightSource<B>, prefix: &str, c: &TextConfig) -> Self {
        let q = c.num_heads * c.head_dim;
        let kv = c.num_kv_heads * c.head_dim;
        Self {
            q_proj: Linear::load(src, &format!("{prefix}.q_proj"), c.hidden_size, q, true),
            k_proj: Linear::load(src, &format!("{prefix}.k_proj"), c.hidden_size, kv, true),
            v_proj: Linear::load(src, &format!("{prefix}.v_proj"), c.hidden_size, kv, true),
            o_proj: Linear::load(src, &format!("{prefix}.o_proj"), q, c.hidden_size, false),
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        }
    }

    fn export<V: WeightVisitor<B>>(&self, sink: &mut V, prefix: &str) {
        self.q_proj.export(sink, &format!("{prefix}.q_proj"));
        self.k_proj.export(sink, &format!("{prefix}.k_proj"));
        self.v_proj.export(sink, &format!("{prefix}.v_proj"));
        self.o_proj.export(sink, &format!("{prefix}.o_proj"));
    }

    /// `x` `[b, l, hidden]`; `rope_q`/`rope_k` for `[b, l, heads, head_dim]` and
    /// `[b, l, kv_heads, head_dim]`; bias `[b, kv_heads, group·l, past + l]`
    /// ([`grouped_attention_bias`]). RoPE is applied before the heads are moved forward, while
    /// the projections' outputs are still contiguous.
    fn forward(
        &self,
        x: Tensor<B, 3>,
        rope_q: &Rotary<B>,
        rope_k: &Rotary<B>,
        bias: Tensor<B, 4>,
        cache: Option<&mut Option<(Tensor<B, 4>, Tensor<B, 4>)>>,
    ) -> Tensor<B, 3> {
        let [b, l, _] = x.dims();
        let (h, kvh, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let q = rope_q
            .apply(self.q_proj.forward(x.clone()).reshape([b, l, h, d]))
            .swap_dims(1, 2);
        let mut k = rope_k
            .apply(self.k_proj.forward(x.clone()).reshape([b, l, kvh, d]))
            .swap_dims(1, 2);
        let mut v = self
            .v_proj
            .forward(x)
            .reshape([b, l, kvh, d])
            .swap_dims(1, 2);
        if let Some(slot) = cache {
            if let Some((pk, pv)) = slot.take() {
                k = Tensor::cat(vec![pk, k], 2);
                v = Tensor::cat(vec![pv, v], 2);
            }
            *slot = Some((k.clone(), v.clone()));
        }
        let out = grouped_query_attention(q, k, v, bias, 1.0 / (d as f64).sqrt());
        self.o_proj
            .forward(out.swap_dims(1, 2).reshape([b, l, h * d]))
    }
}

/// One pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub self_attn: TextAttention<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub mlp: SwiGluMlp<B>,
}

impl<B: Backend> DecoderLayer<B> {
    fn load(src: &mut dyn WeightSource<B>, prefix: &str, c: &TextConfig) -> Self {
        let eps = c.rms_norm_eps;
        Self {
            input_layernorm: RmsNorm::load(
                src,
                &format!("{prefix}.input_layernorm"),
                c.hidden_size,
                eps,
            ),
            self_attn: TextAttention::load(src, &format!("{prefix}.self_attn"), c),
            post_attention_layernorm: RmsNorm::load(
                src,
                &format!("{prefix}.post_attention_layernorm"),
                c.hidden_size,
                eps,
            ),
            mlp: SwiGluMlp::load(
                src,
                &format!("{prefix}.mlp"),
                c.hidden_size,
                c.intermediate_size,
                false,
            ),
        }
    }

    fn export<V: WeightVisitor<B>>(&self, sink: &mut V, prefix: &str) {
        self.input_layernorm
            .export(sink, &format!("{prefix}.input_layernorm"));
        self.self_attn.export(sink, &format!("{prefix}.self_attn"));
        self.post_attention_layernorm
            .export(sink, &format!("{prefix}.post_attention_layernorm"));
        self.mlp.export(sink, &format!("{prefix}.mlp"));
    }
}

/// Embeddings, decoder layers, final norm and LM head.
#[derive(Module, Debug)]
pub struct TextModel<B: Backend> {
    /// `[vocab, hidden]`.
    pub embed_tokens: Param<Tensor<B, 2>>,
    pub layers: Vec<DecoderLayer<B>>,
    pub norm: RmsNorm<B>,
    /// `[vocab, hidden]`; `None` when tied to `embed_tokens`.
    pub lm_head: Option<Param<Tensor<B, 2>>>,
    pub inv_freq: Vec<f32>,
    pub mrope_section: Vec<usize>,
}

impl<B: Backend> TextModel<B> {
    /// Loads `model.*` (and `lm_head.weight` unless embeddings are tied).
    pub fn load(src: &mut dyn WeightSource<B>, c: &TextConfig) -> Self {
        let embed = src.take2(
            "model.embed_tokens.weight",
            [c.vocab_size, c.hidden_size],
            Init::Embedding,
        );
        let layers = (0..c.num_layers)
            .map(|i| DecoderLayer::load(src, &format!("model.layers.{i}"), c))
            .collect();
        let norm = RmsNorm::load(src, "model.norm", c.hidden_size, c.rms_norm_eps);
        let lm_head = if c.tie_word_embeddings {
            src.ignore("lm_head.weight");
            None
        } else {
            Some(Param::from_tensor(src.take2(
                "lm_head.weight",
                [c.vocab_size, c.hidden_size],
                Init::Matrix,
            )))
        };
        Self {
            embed_tokens: Param::from_tensor(embed),
            layers,
            norm,
            lm_head,
            inv_freq: inv_freq(c.rope_theta, c.head_dim),
            mrope_section: c.mrope_section.clone(),
        }
    }

    pub fn export<V: WeightVisitor<B>>(&self, sink: &mut V) {
        sink.put("model.embed_tokens.weight", self.embed_tokens.val());
        for (i, layer) in self.layers.iter().enumerate() {
            layer.export(sink, &format!("model.layers.{i}"));
        }
        self.norm.export(sink, "model.norm");
        if let Some(w) = &self.lm_head {
            sink.put("lm_head.weight", w.val());
        }
    }

    /// `[b, l, hidden]` embeddings of `ids` `[b, l]`.
    pub fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, l] = ids.dims();
        let w = self.embed_tokens.val();
        let hidden = w.dims()[1];
        w.select(0, ids.reshape([b * l])).reshape([b, l, hidden])
    }

    /// Decoder over `embeds`; returns the final-normed hidden states. When `trace` is given it
    /// receives the residual stream after every layer (for parity tests).
    pub fn forward(
        &self,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
        mut cache: Option<&mut KvCache<B>>,
        mut trace: Option<&mut Vec<Tensor<B, 3>>>,
    ) -> Tensor<B, 3> {
        let [_, l, _] = embeds.dims();
        let (cos, sin) = rope_tables(positions, &self.inv_freq, &self.mrope_section);
        let (heads, kv_heads) = self
            .layers
            .first()
            .map(|layer| (layer.self_attn.num_heads, layer.self_attn.num_kv_heads))
            .unwrap_or((1, 1));
        let rope_q = Rotary::new(cos.clone(), sin.clone(), heads);
        let rope_k = Rotary::new(cos, sin, kv_heads);
        let bias = grouped_attention_bias(
            causal_padding_bias(attention_mask, l),
            kv_heads,
            heads / kv_heads,
        );
        let mut h = embeds;
        for (i, layer) in self.layers.iter().enumerate() {
            let slot = cache.as_deref_mut().map(|c| &mut c.layers[i]);
            let a = layer.self_attn.forward(
                layer.input_layernorm.forward(h.clone()),
                &rope_q,
                &rope_k,
                bias.clone(),
                slot,
            );
            h = h + a;
            let m = layer
                .mlp
                .forward(layer.post_attention_layernorm.forward(h.clone()));
            h = h + m;
            if let Some(t) = trace.as_deref_mut() {
                t.push(h.clone());
            }
        }
        self.norm.forward(h)
    }

    /// `hidden · Wᵀ` with the LM head (or the tied embedding table), returned in f32.
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let w = match &self.lm_head {
            Some(w) => w.val(),
            None => self.embed_tokens.val(),
        };
        let [b, l, d] = hidden.dims();
        let v = w.dims()[0];
        hidden
            .reshape([b * l, d])
            .matmul(w.transpose())
            .reshape([b, l, v])
            .cast(DType::F32)
    }
}
