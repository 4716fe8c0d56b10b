//! The Qwen2 text decoder shared by Qwen2-VL and Qwen2.5-VL (HF `Qwen2VLTextModel`), and the
//! pieces Qwen3-VL's decoder shares with it ([`DecoderLayer`], [`DecoderShape`], [`run_layers`],
//! [`new_stack`] / [`stack_weights`], [`embed`], [`logits`]).
//!
//! Layer: `h += o_proj(attn(RMSNorm(h)))`, `h += down(silu(gate(a)) ⊙ up(a))` with
//! `a = RMSNorm(h)`; q/k/v carry biases, o_proj and the MLP do not; RoPE is multimodal (three
//! position streams assigned to slots of the half head dimension by `mrope_section`); attention
//! is grouped-query with a causal + padding mask and an optional KV cache.

use std::ops::Range;

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;

use super::config::TextConfig;
use crate::capabilities::{DecoderInputs, KvCache};
use crate::layers::{
    Attention, AttentionMask, AttentionShape, RmsNorm, Rotary, SwiGluMlp, inv_freq, rope_tables,
};
use crate::weights::{Init, WeightNames, Weights, join, shaped};

/// Sizes of a Qwen decoder (both families' text configs give one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecoderShape {
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub eps: f64,
    pub tie_word_embeddings: bool,
    pub attention: AttentionShape,
}

impl TextConfig {
    /// The decoder's sizes (Qwen2: q/k/v biases, no o bias, no q/k norms; Qwen3: norms).
    pub fn shape(&self) -> DecoderShape {
        DecoderShape {
            vocab: self.vocab_size,
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            layers: self.num_layers,
            eps: self.rms_norm_eps,
            tie_word_embeddings: self.tie_word_embeddings,
            attention: AttentionShape {
                hidden: self.hidden_size,
                heads: self.num_heads,
                kv_heads: self.num_kv_heads,
                head_dim: self.head_dim,
                qkv_bias: self.qkv_bias,
                o_bias: self.o_bias,
                qk_norm_eps: self.qk_norm.then_some(self.rms_norm_eps),
            },
        }
    }
}

/// One pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub self_attn: Attention<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub mlp: SwiGluMlp<B>,
}

impl<B: Backend> DecoderLayer<B> {
    fn new(device: &B::Device, c: &DecoderShape) -> Self {
        Self {
            input_layernorm: RmsNorm::new(device, c.hidden, c.eps),
            self_attn: Attention::new(device, &c.attention),
            post_attention_layernorm: RmsNorm::new(device, c.hidden, c.eps),
            mlp: SwiGluMlp::new(device, c.hidden, c.intermediate, false),
        }
    }
}

impl<B: Backend> Weights<B> for DecoderLayer<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let at = |name: &str| join(prefix, name);
        self.input_layernorm.weights(w, &at("input_layernorm"));
        self.self_attn.weights(w, &at("self_attn"));
        self.post_attention_layernorm
            .weights(w, &at("post_attention_layernorm"));
        self.mlp.weights(w, &at("mlp"));
    }
}

/// The weights of a Qwen decoder as built: `[vocab, hidden]` embeddings, layers, final norm
/// and the LM head (`None` when tied to the embeddings).
pub struct Stack<B: Backend> {
    pub embed_tokens: Param<Tensor<B, 2>>,
    pub layers: Vec<DecoderLayer<B>>,
    pub norm: RmsNorm<B>,
    pub lm_head: Option<Param<Tensor<B, 2>>>,
}

/// A decoder of sizes `c` with placeholder weights (filled by [`stack_weights`]).
pub fn new_stack<B: Backend>(device: &B::Device, c: &DecoderShape) -> Stack<B> {
    Stack {
        embed_tokens: shaped(device, [c.vocab, c.hidden]),
        layers: (0..c.layers)
            .map(|_| DecoderLayer::new(device, c))
            .collect(),
        norm: RmsNorm::new(device, c.hidden, c.eps),
        lm_head: (!c.tie_word_embeddings).then(|| shaped(device, [c.vocab, c.hidden])),
    }
}

/// `{prefix}.embed_tokens`, `{prefix}.layers.{i}`, `{prefix}.norm` and `lm_head.weight` (a
/// stored one ignored when the embeddings are tied).
pub fn stack_weights<B: Backend, W: WeightNames<B>>(
    w: &mut W,
    prefix: &str,
    embed_tokens: &mut Param<Tensor<B, 2>>,
    layers: &mut [DecoderLayer<B>],
    norm: &mut RmsNorm<B>,
    lm_head: &mut Option<Param<Tensor<B, 2>>>,
) {
    w.tensor(
        &join(prefix, "embed_tokens.weight"),
        embed_tokens,
        Init::Embedding,
    );
    for (i, layer) in layers.iter_mut().enumerate() {
        layer.weights(w, &format!("{prefix}.layers.{i}"));
    }
    norm.weights(w, &join(prefix, "norm"));
    match lm_head {
        Some(head) => w.tensor("lm_head.weight", head, Init::Matrix),
        None => w.ignore("lm_head.weight"),
    }
}

/// `[b, l, hidden]` embeddings of `ids` `[b, l]` from the `[vocab, hidden]` table.
pub fn embed<B: Backend>(
    embed_tokens: &Param<Tensor<B, 2>>,
    ids: Tensor<B, 2, Int>,
) -> Tensor<B, 3> {
    let [b, l] = ids.dims();
    let w = embed_tokens.val();
    let hidden = w.dims()[1];
    w.select(0, ids.reshape([b * l])).reshape([b, l, hidden])
}

/// `hidden · Wᵀ` with the LM head (or the tied embedding table), returned in f32.
pub fn logits<B: Backend>(
    embed_tokens: &Param<Tensor<B, 2>>,
    lm_head: &Option<Param<Tensor<B, 2>>>,
    hidden: Tensor<B, 3>,
) -> Tensor<B, 3> {
    let w = match lm_head {
        Some(w) => w.val(),
        None => embed_tokens.val(),
    };
    let [b, l, d] = hidden.dims();
    let v = w.dims()[0];
    hidden
        .reshape([b * l, d])
        .matmul(w.transpose())
        .reshape([b, l, v])
        .cast(DType::F32)
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

/// The decoder layers over `h` `[b, l, hidden]` with RoPE tables `cos`/`sin` `[b, l, head_dim]`,
/// a causal + padding mask from `attention_mask` `[b, past + l]` and the optional KV cache;
/// `deepstack[k]` (Qwen3-VL) is added to the residual stream after layer k. Returns the
/// residual stream after the last layer (before the final norm).
#[allow(clippy::too_many_arguments)]
pub fn run_layers<B: Backend>(
    layers: &[DecoderLayer<B>],
    mut h: Tensor<B, 3>,
    deepstack: &[Tensor<B, 3>],
    cos: Tensor<B, 3>,
    sin: Tensor<B, 3>,
    attention_mask: Tensor<B, 2, Int>,
    mut cache: Option<&mut KvCache<B>>,
    mut trace: Option<&mut TextTrace<B>>,
) -> Tensor<B, 3> {
    let l = h.dims()[1];
    let (heads, kv_heads) = layers
        .first()
        .map(|layer| (layer.self_attn.num_heads, layer.self_attn.num_kv_heads))
        .unwrap_or((1, 1));
    let dtype = h.dtype();
    let rope_q = Rotary::new(cos.clone(), sin.clone(), heads, dtype);
    let rope_k = Rotary::new(cos, sin, kv_heads, dtype);
    let mask = AttentionMask::causal(attention_mask, l, None);
    for (i, layer) in layers.iter().enumerate() {
        let slot = cache.as_deref_mut().map(|c| &mut c.layers[i]);
        let a = layer.self_attn.forward(
            layer.input_layernorm.forward(h.clone()),
            &rope_q,
            &rope_k,
            &mask,
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
    h
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

/// `model.*` and `lm_head.weight` ([`stack_weights`]).
impl<B: Backend> Weights<B> for TextModel<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let (embed, layers, norm) = (&mut self.embed_tokens, &mut self.layers, &mut self.norm);
        stack_weights(
            w,
            &join(prefix, "model"),
            embed,
            layers,
            norm,
            &mut self.lm_head,
        );
    }
}

impl<B: Backend> TextModel<B> {
    pub fn new(device: &B::Device, c: &TextConfig) -> Self {
        let s = new_stack(device, &c.shape());
        Self {
            embed_tokens: s.embed_tokens,
            layers: s.layers,
            norm: s.norm,
            lm_head: s.lm_head,
            inv_freq: inv_freq(c.rope_theta, c.head_dim),
            mrope_section: c.mrope_section.clone(),
        }
    }

    /// `[b, l, hidden]` embeddings of `ids` `[b, l]`.
    pub fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        embed(&self.embed_tokens, ids)
    }

    /// Decoder over `embeds`; returns the final-normed hidden states. When `trace` is given it
    /// receives the residual stream after every layer (for parity tests).
    pub fn forward(
        &self,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
        cache: Option<&mut KvCache<B>>,
        trace: Option<&mut Vec<Tensor<B, 3>>>,
    ) -> Tensor<B, 3> {
        let (cos, sin) = rope_tables(positions, &self.inv_freq, &self.mrope_section);
        let mut layer_trace = trace.is_some().then(TextTrace::default);
        let h = run_layers(
            &self.layers,
            embeds,
            &[],
            cos,
            sin,
            attention_mask,
            cache,
            layer_trace.as_mut(),
        );
        if let (Some(t), Some(lt)) = (trace, layer_trace) {
            t.extend(lt.layer_out);
        }
        self.norm.forward(h)
    }

    /// `hidden · Wᵀ` with the LM head (or the tied embedding table), returned in f32.
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        logits(&self.embed_tokens, &self.lm_head, hidden)
    }

    /// The residual stream entering the first layer: the embeddings (no layer inputs).
    pub fn decoder_inputs(&self, embeds: Tensor<B, 3>) -> DecoderInputs<B> {
        DecoderInputs {
            stream: embeds,
            layer_inputs: None,
        }
    }

    /// The layers read no layer inputs.
    pub fn layer_input_channels(&self, _layers: Range<usize>) -> Range<usize> {
        0..0
    }

    /// `layers` over the residual stream `h` (no cache; there are no layer inputs).
    pub fn segment(
        &self,
        layers: Range<usize>,
        h: Tensor<B, 3>,
        layer_inputs: Option<Tensor<B, 3>>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
    ) -> Tensor<B, 3> {
        assert!(
            layer_inputs.is_none(),
            "Qwen2-VL's layers read no layer inputs"
        );
        let (cos, sin) = rope_tables(positions, &self.inv_freq, &self.mrope_section);
        run_layers(
            &self.layers[layers],
            h,
            &[],
            cos,
            sin,
            attention_mask,
            None,
            None,
        )
    }

    /// The final norm.
    pub fn final_norm(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
        self.norm.forward(h)
    }
}
