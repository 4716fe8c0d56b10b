//! The Qwen3-VL text decoder (transformers `Qwen3VLTextModel`, `Qwen3VLTextDecoderLayer`,
//! `Qwen3VLTextAttention` in `modeling_qwen3_vl.py`).
//!
//! Layer i, pre-norm:
//!
//! ```text
//! a = RMSNorm(h)
//! q = RMSNorm_hd(a·Wqᵀ) per head, k = RMSNorm_hd(a·Wkᵀ) per head, v = a·Wvᵀ   (q_norm, k_norm over head_dim)
//! q, k = rope(q, k)                                (interleaved M-RoPE, after the norms)
//! h += o_proj(softmax(q·kᵀ/√head_dim + mask)·v)    (GQA, causal + padding mask, KV cache)
//! h += down(silu(gate(a')) ⊙ up(a')),  a' = RMSNorm(h)
//! h += deepstack_i   at the image-token positions, for i < number of DeepStack features
//! ```
//!
//! `head_dim` is explicit, so `q_proj` / `o_proj` may be non-square. The cache holds k after
//! k_norm and RoPE. DeepStack features arrive inside the input embeddings (see
//! [`TextModel::forward`]); decode steps (text tokens only) carry none.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;

use super::config::TextConfig;
use super::positions::interleaved_rope_tables;
use crate::capabilities::KvCache;
use crate::layers::{
    Linear, RmsNorm, Rotary, SwiGluMlp, causal_padding_bias, grouped_attention_bias,
    grouped_query_attention, inv_freq,
};
use crate::weights::{Init, WeightSource, WeightVisitor};

/// Checkpoint prefix of the decoder.
pub const PREFIX: &str = "model.language_model";

/// Self-attention of one decoder layer.
#[derive(Module, Debug)]
pub struct TextAttention<B: Backend> {
    pub q_proj: Linear<B>,
    pub k_proj: Linear<B>,
    pub v_proj: Linear<B>,
    pub o_proj: Linear<B>,
    pub q_norm: RmsNorm<B>,
    pub k_norm: RmsNorm<B>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl<B: Backend> TextAttention<B> {
    fn load(src: &mut dyn WeightSource<B>, prefix: &str, c: &TextConfig) -> Self {
        let q = c.num_heads * c.head_dim;
        let kv = c.num_kv_heads * c.head_dim;
        let bias = c.attention_bias;
        let linear = |src: &mut dyn WeightSource<B>, name: &str, i, o| {
            Linear::load(src, &format!("{prefix}.{name}"), i, o, bias)
        };
        let norm = |src: &mut dyn WeightSource<B>, name: &str| {
            RmsNorm::load(src, &format!("{prefix}.{name}"), c.head_dim, c.rms_norm_eps)
        };
        Self {
            q_proj: linear(src, "q_proj", c.hidden_size, q),
            k_proj: linear(src, "k_proj", c.hidden_size, kv),
            v_proj: linear(src, "v_proj", c.hidden_size, kv),
            o_proj: linear(src, "o_proj", q, c.hidden_size),
            q_norm: norm(src, "q_norm"),
            k_norm: norm(src, "k_norm"),
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
        self.q_norm.export(sink, &format!("{prefix}.q_norm"));
        self.k_norm.export(sink, &format!("{prefix}.k_norm"));
    }

    /// `x` `[b, l, hidden]`; `rope_q`/`rope_k` for `[b, l, heads, head_dim]` and
    /// `[b, l, kv_heads, head_dim]`; bias `[b, kv_heads, group·l, past + l]`
    /// ([`grouped_attention_bias`]). The norms and RoPE act in the projections' contiguous
    /// `[b, l, heads, head_dim]` layout, before the heads are moved forward.
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
        let q = self
            .q_norm
            .forward(self.q_proj.forward(x.clone()).reshape([b, l, h, d]));
        let q = rope_q.apply(q).swap_dims(1, 2);
        let k = self
            .k_norm
            .forward(self.k_proj.forward(x.clone()).reshape([b, l, kvh, d]));
        let mut k = rope_k.apply(k).swap_dims(1, 2);
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
        let (eps, hidden) = (c.rms_norm_eps, c.hidden_size);
        Self {
            input_layernorm: RmsNorm::load(src, &format!("{prefix}.input_layernorm"), hidden, eps),
            self_attn: TextAttention::load(src, &format!("{prefix}.self_attn"), c),
            post_attention_layernorm: RmsNorm::load(
                src,
                &format!("{prefix}.post_attention_layernorm"),
                hidden,
                eps,
            ),
            mlp: SwiGluMlp::load(
                src,
                &format!("{prefix}.mlp"),
                hidden,
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

/// Intermediate decoder outputs for parity tests.
pub struct TextTrace<B: Backend> {
    /// Output of layer k before its DeepStack addition, for each layer that gets one.
    pub before_deepstack: Vec<Tensor<B, 3>>,
    /// The residual stream after every layer, DeepStack addition included.
    pub layer_out: Vec<Tensor<B, 3>>,
}

impl<B: Backend> Default for TextTrace<B> {
    fn default() -> Self {
        Self {
            before_deepstack: Vec::new(),
            layer_out: Vec::new(),
        }
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
    pub mrope_section: [usize; 3],
    pub hidden_size: usize,
}

impl<B: Backend> TextModel<B> {
    /// Loads `model.language_model.*` (and `lm_head.weight` unless embeddings are tied).
    pub fn load(src: &mut dyn WeightSource<B>, c: &TextConfig) -> Self {
        let embed = src.take2(
            &format!("{PREFIX}.embed_tokens.weight"),
            [c.vocab_size, c.hidden_size],
            Init::Embedding,
        );
        let layers = (0..c.num_layers)
            .map(|i| DecoderLayer::load(src, &format!("{PREFIX}.layers.{i}"), c))
            .collect();
        let norm = RmsNorm::load(
            src,
            &format!("{PREFIX}.norm"),
            c.hidden_size,
            c.rms_norm_eps,
        );
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
            mrope_section: c.mrope_section,
            hidden_size: c.hidden_size,
        }
    }

    pub fn export<V: WeightVisitor<B>>(&self, sink: &mut V) {
        sink.put(
            &format!("{PREFIX}.embed_tokens.weight"),
            self.embed_tokens.val(),
        );
        for (i, layer) in self.layers.iter().enumerate() {
            layer.export(sink, &format!("{PREFIX}.layers.{i}"));
        }
        self.norm.export(sink, &format!("{PREFIX}.norm"));
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

    /// Decoder over `embeds`; returns the final-normed hidden states `[b, l, hidden]`.
    ///
    /// `embeds` is `[b, l, hidden·(1 + K)]`: channels `0..hidden` are the input embeddings,
    /// block `j ≥ 1` the DeepStack feature added to the residual stream after layer `j − 1`
    /// (zero at text positions, so adding the whole block is transformers'
    /// `h[visual_pos_masks] += feature`; see [`crate::capabilities::Vision::embed_images`]).
    /// K = 0 for text-only inputs. When `trace` is given it receives the residual stream around
    /// every layer (for parity tests).
    pub fn forward(
        &self,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
        mut cache: Option<&mut KvCache<B>>,
        mut trace: Option<&mut TextTrace<B>>,
    ) -> Tensor<B, 3> {
        let [_, l, width] = embeds.dims();
        let hidden = self.hidden_size;
        assert!(
            width.is_multiple_of(hidden) && width >= hidden,
            "input embeddings are {width} wide, not a multiple of the hidden size {hidden}"
        );
        let deepstack: Vec<Tensor<B, 3>> = (1..width / hidden)
            .map(|j| embeds.clone().narrow(2, j * hidden, hidden))
            .collect();
        let (cos, sin) = interleaved_rope_tables(positions, &self.inv_freq, self.mrope_section);
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
        let mut h = if deepstack.is_empty() {
            embeds
        } else {
            embeds.narrow(2, 0, hidden)
        };
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
            if let Some(feature) = deepstack.get(i) {
                if let Some(t) = trace.as_deref_mut() {
                    t.before_deepstack.push(h.clone());
                }
                h = h + feature.clone();
            }
            if let Some(t) = trace.as_deref_mut() {
                t.layer_out.push(h.clone());
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
