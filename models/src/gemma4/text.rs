//! Gemma 4's text decoder (transformers `Gemma4TextModel`, 5.24): scaled token embeddings,
//! per-layer embeddings (PLE), sliding and full attention layers with their own head dims and
//! RoPE, KV sharing between layers, the sandwich-normed decoder layer with its PLE branch and
//! `layer_scalar`, the final norm and the tied, soft-capped LM head.
//!
//! Positions are plain 1-D (one stream); the caller derives them from the attention mask.
//! Masks are index-based inside the padded row: a key at index `j` is visible to the query at
//! index `i` when `j ≤ i`, the key is not padding and, on sliding layers, `j > i − W`.

use std::ops::Range;

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::gelu_approximate;

use super::config::{Gemma4Config, KvSource, LayerKind, LayerSpec};
use super::layers::{block_norm_weights, geglu, new_block_norms};
use crate::capabilities::KvCache;
use crate::layers::{
    AttentionMask, Linear, RmsNorm, append_kv, apply_rotary, grouped_query_attention, inv_freq,
    rms_normalize, rope_tables,
};
use crate::weights::{Init, WeightNames, Weights, join, shaped};

const PREFIX: &str = "model.language_model";

/// Keys and values `[B, KV, S, D]` of one layer.
type Kv<B> = (Tensor<B, 4>, Tensor<B, 4>);

/// RoPE `cos`/`sin` tables `[B, 1, L, D]`.
type CosSin<B> = (Tensor<B, 4>, Tensor<B, 4>);

/// GeGLU MLP of a decoder layer (`intermediate_size`, doubled on KV-shared layers when
/// `use_double_wide_mlp`).
#[derive(Module, Debug)]
pub struct TextMlp<B: Backend> {
    pub gate_proj: Linear<B>,
    pub up_proj: Linear<B>,
    pub down_proj: Linear<B>,
}

/// `{prefix}.{gate,up,down}_proj`.
impl<B: Backend> Weights<B> for TextMlp<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        self.gate_proj.weights(w, &join(prefix, "gate_proj"));
        self.up_proj.weights(w, &join(prefix, "up_proj"));
        self.down_proj.weights(w, &join(prefix, "down_proj"));
    }
}

impl<B: Backend> TextMlp<B> {
    fn new(device: &B::Device, hidden: usize, inter: usize) -> Self {
        Self {
            gate_proj: Linear::new(device, hidden, inter, false),
            up_proj: Linear::new(device, hidden, inter, false),
            down_proj: Linear::new(device, inter, hidden, false),
        }
    }

    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        geglu(&self.gate_proj, &self.up_proj, &self.down_proj, x)
    }
}

/// Self-attention of one decoder layer. KV-shared layers have no k/v projections and no k norm;
/// `v_norm` has no weight (it is [`rms_normalize`]).
#[derive(Module, Debug)]
pub struct TextAttention<B: Backend> {
    pub q_proj: Linear<B>,
    pub k_proj: Option<Linear<B>>,
    pub v_proj: Option<Linear<B>>,
    pub o_proj: Linear<B>,
    pub q_norm: RmsNorm<B>,
    pub k_norm: Option<RmsNorm<B>>,
}

/// One decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub pre_feedforward_layernorm: RmsNorm<B>,
    pub post_feedforward_layernorm: RmsNorm<B>,
    pub self_attn: TextAttention<B>,
    pub mlp: TextMlp<B>,
    pub per_layer_input_gate: Linear<B>,
    pub per_layer_projection: Linear<B>,
    pub post_per_layer_input_norm: RmsNorm<B>,
    /// Buffer `[1]` multiplying the whole residual stream at the end of the layer.
    pub layer_scalar: f32,
}

/// Static facts of the decoder (from `config.json`).
#[derive(Debug, Clone)]
pub struct TextInfo {
    pub layers: Vec<LayerSpec>,
    pub hidden: usize,
    pub heads: usize,
    pub ple_dim: usize,
    pub vocab: usize,
    pub ple_vocab: usize,
    pub pad_id: u32,
    /// Ids whose lookups use the pad row (image/video/audio soft tokens).
    pub multimodal_ids: Vec<u32>,
    pub softcap: Option<f64>,
    pub eps: f64,
}

/// The decoder with its embeddings and LM head.
#[derive(Module, Debug)]
pub struct TextModel<B: Backend> {
    pub embed_tokens: Param<Tensor<B, 2>>,
    pub embed_tokens_per_layer: Param<Tensor<B, 2>>,
    pub per_layer_model_projection: Linear<B>,
    pub per_layer_projection_norm: RmsNorm<B>,
    pub layers: Vec<DecoderLayer<B>>,
    pub norm: RmsNorm<B>,
    pub info: TextInfo,
}

/// Intermediate tensors of one forward pass (for parity tests and debugging).
#[derive(Debug, Clone)]
pub struct TextTrace<B: Backend> {
    /// `embed_tokens_per_layer[ids'] · sqrt(P)`, `[B, L, n_layers, P]`.
    pub ple_token_identity: Tensor<B, 4>,
    /// Final per-layer inputs `[B, L, n_layers, P]`.
    pub per_layer_inputs: Tensor<B, 4>,
    /// Output of every decoder layer, `[B, L, H]` each.
    pub layer_outputs: Vec<Tensor<B, 3>>,
}

/// `{prefix}.{q,k,v,o}_proj`, `{prefix}.{q,k}_norm` (k/v and the k norm on layers with their
/// own keys and values).
impl<B: Backend> Weights<B> for TextAttention<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let at = |name: &str| join(prefix, name);
        self.q_proj.weights(w, &at("q_proj"));
        if let Some(k) = &mut self.k_proj {
            k.weights(w, &at("k_proj"));
        }
        if let Some(v) = &mut self.v_proj {
            v.weights(w, &at("v_proj"));
        }
        self.o_proj.weights(w, &at("o_proj"));
        self.q_norm.weights(w, &at("q_norm"));
        if let Some(k) = &mut self.k_norm {
            k.weights(w, &at("k_norm"));
        }
    }
}

/// `self_attn`, the four block norms, `mlp`, the PLE branch and the `layer_scalar` buffer.
impl<B: Backend> Weights<B> for DecoderLayer<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let at = |name: &str| join(prefix, name);
        self.self_attn.weights(w, &at("self_attn"));
        let norms = [
            &mut self.input_layernorm,
            &mut self.post_attention_layernorm,
            &mut self.pre_feedforward_layernorm,
            &mut self.post_feedforward_layernorm,
        ];
        block_norm_weights(w, prefix, norms);
        self.mlp.weights(w, &at("mlp"));
        self.per_layer_input_gate
            .weights(w, &at("per_layer_input_gate"));
        self.per_layer_projection
            .weights(w, &at("per_layer_projection"));
        self.post_per_layer_input_norm
            .weights(w, &at("post_per_layer_input_norm"));
        w.scalar(
            &at("layer_scalar"),
            &[1],
            &mut self.layer_scalar,
            Init::Ones,
        );
    }
}

impl<B: Backend> DecoderLayer<B> {
    fn new(device: &B::Device, config: &Gemma4Config, spec: &LayerSpec) -> Self {
        let t = &config.text_config;
        let (h, p, eps) = (t.hidden_size, t.hidden_size_per_layer_input, t.rms_norm_eps);
        let heads = t.num_attention_heads;
        let (d, kv) = (spec.head_dim, spec.num_kv_heads);
        let own = spec.kv == KvSource::Own;
        let [
            input_layernorm,
            post_attention_layernorm,
            pre_feedforward_layernorm,
            post_feedforward_layernorm,
        ] = new_block_norms(device, h, eps);
        Self {
            input_layernorm,
            post_attention_layernorm,
            pre_feedforward_layernorm,
            post_feedforward_layernorm,
            self_attn: TextAttention {
                q_proj: Linear::new(device, h, heads * d, false),
                k_proj: own.then(|| Linear::new(device, h, kv * d, false)),
                v_proj: own.then(|| Linear::new(device, h, kv * d, false)),
                o_proj: Linear::new(device, heads * d, h, false),
                q_norm: RmsNorm::new(device, d, eps),
                k_norm: own.then(|| RmsNorm::new(device, d, eps)),
            },
            mlp: TextMlp::new(device, h, spec.intermediate_size),
            per_layer_input_gate: Linear::new(device, h, p, false),
            per_layer_projection: Linear::new(device, p, h, false),
            post_per_layer_input_norm: RmsNorm::new(device, h, eps),
            layer_scalar: 1.0,
        }
    }
}

/// `model.language_model.{layers.{i}, embed_tokens, embed_tokens_per_layer,
/// per_layer_model_projection, per_layer_projection_norm, norm}` (the LM head is tied).
impl<B: Backend> Weights<B> for TextModel<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let at = |name: &str| join(&join(prefix, PREFIX), name);
        for (i, layer) in self.layers.iter_mut().enumerate() {
            layer.weights(w, &at(&format!("layers.{i}")));
        }
        let embed = at("embed_tokens.weight");
        w.tensor(&embed, &mut self.embed_tokens, Init::Embedding);
        let per_layer = at("embed_tokens_per_layer.weight");
        w.tensor(
            &per_layer,
            &mut self.embed_tokens_per_layer,
            Init::Embedding,
        );
        self.per_layer_model_projection
            .weights(w, &at("per_layer_model_projection"));
        self.per_layer_projection_norm
            .weights(w, &at("per_layer_projection_norm"));
        self.norm.weights(w, &at("norm"));
    }
}

impl<B: Backend> TextModel<B> {
    /// The decoder of `config` with placeholder weights (see [`crate::weights::Weights`]).
    pub fn new(device: &B::Device, config: &Gemma4Config) -> Self {
        let t = &config.text_config;
        let (h, n, p, eps) = (
            t.hidden_size,
            t.num_hidden_layers,
            t.hidden_size_per_layer_input,
            t.rms_norm_eps,
        );
        let mut multimodal_ids = vec![config.image_token_id];
        multimodal_ids.extend(config.video_token_id);
        multimodal_ids.extend(config.audio_token_id);
        Self {
            embed_tokens: shaped(device, [t.vocab_size, h]),
            embed_tokens_per_layer: shaped(device, [t.vocab_size_per_layer_input, n * p]),
            per_layer_model_projection: Linear::new(device, h, n * p, false),
            per_layer_projection_norm: RmsNorm::new(device, p, eps),
            layers: config
                .layers
                .iter()
                .map(|spec| DecoderLayer::new(device, config, spec))
                .collect(),
            norm: RmsNorm::new(device, h, eps),
            info: TextInfo {
                layers: config.layers.clone(),
                hidden: h,
                heads: t.num_attention_heads,
                ple_dim: p,
                vocab: t.vocab_size,
                ple_vocab: t.vocab_size_per_layer_input,
                pad_id: t.pad_token_id.unwrap_or(0),
                multimodal_ids,
                softcap: t.final_logit_softcapping,
                eps,
            },
        }
    }

    /// `ids` with every multimodal soft-token id replaced by the pad id (their embedding rows are
    /// overwritten or unused; transformers `llm_input_ids[multimodal_mask] = pad_token_id`).
    fn text_ids(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 2, Int> {
        let mut ids = ids;
        for &m in &self.info.multimodal_ids {
            let hit = ids.clone().equal_elem(m as i64);
            ids = ids.mask_fill(hit, self.info.pad_id as i64);
        }
        ids
    }

    /// Rows of `weight` at `ids` `[B, L]` → `[B, L, width]`, like `nn.Embedding(padding_idx=pad)`:
    /// lookups of the pad id send no gradient to the table.
    fn lookup(&self, weight: Tensor<B, 2>, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, l] = ids.dims();
        let width = weight.dims()[1];
        let flat = ids.reshape([b * l]);
        let rows = weight.select(0, flat.clone());
        let is_pad = flat
            .equal_elem(self.info.pad_id as i64)
            .reshape([b * l, 1])
            .expand([b * l, width]);
        let rows = rows.clone().mask_where(is_pad, rows.detach());
        rows.reshape([b, l, width])
    }

    /// Scaled token embeddings `embed_tokens[ids'] · f32(sqrt(H))` `[B, L, H]`.
    pub fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let scale = (self.info.hidden as f64).sqrt() as f32;
        self.lookup(self.embed_tokens.val(), self.text_ids(ids)) * scale
    }

    /// Per-layer inputs `[B, L, n_layers, P]` and their token-identity part
    /// (transformers `get_per_layer_inputs` / `project_per_layer_inputs`):
    /// `tok = embed_tokens_per_layer[ids'] · sqrt(P)` (ids outside the PLE vocabulary use row 0),
    /// `ctx = rms_norm((embeds · W_projᵀ) · H^(−1/2))` over P,
    /// `per_layer_inputs = (ctx + tok) · 2^(−1/2)`.
    pub fn per_layer_inputs(
        &self,
        ids: Tensor<B, 2, Int>,
        embeds: Tensor<B, 3>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let [b, l] = ids.dims();
        let (n, p) = (self.layers.len(), self.info.ple_dim);
        let ids = self.text_ids(ids);
        let outside = ids.clone().greater_equal_elem(self.info.ple_vocab as i64);
        let ids = ids.mask_fill(outside, 0);
        let tok = self
            .lookup(self.embed_tokens_per_layer.val(), ids)
            .reshape([b, l, n, p])
            * ((p as f64).sqrt() as f32);
        let ctx = self.per_layer_model_projection.forward(embeds)
            * ((self.info.hidden as f64).powf(-0.5) as f32);
        let ctx = self
            .per_layer_projection_norm
            .forward(ctx.reshape([b, l, n, p]));
        let scale = (0.5f64).sqrt() as f32;
        ((ctx + tok.clone()) * scale, tok)
    }

    /// Runs the decoder. `ids` `[B, L]` (for the per-layer embeddings), `embeds` `[B, L, H]`
    /// (merged text and image embeddings), `positions` `[1, B, L]`, `mask` `[B, cached + L]`.
    /// With a cache, the layers that own K/V append theirs; KV-shared layers read the (updated)
    /// K/V of their source layer. Returns the final-normed hidden states and, when `trace`,
    /// the intermediates.
    pub fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        mask: Tensor<B, 2, Int>,
        cache: Option<&mut KvCache<B>>,
        trace: bool,
    ) -> (Tensor<B, 3>, Option<TextTrace<B>>) {
        let (ple, tok) = self.per_layer_inputs(ids, embeds.clone());
        let mut layer_outputs = trace.then(Vec::new);
        let h = self.run_layers(
            0..self.layers.len(),
            embeds,
            ple.clone(),
            positions,
            mask,
            cache,
            layer_outputs.as_mut(),
        );
        let out = self.norm.forward(h);
        let trace = layer_outputs.map(|layer_outputs| TextTrace {
            ple_token_identity: tok,
            per_layer_inputs: ple,
            layer_outputs,
        });
        (out, trace)
    }

    /// The layers that run as one segment: each layer alone, except that a KV-sharing layer
    /// and every layer from its source on form one (their keys and values cross layers).
    pub fn segments(&self) -> Vec<Range<usize>> {
        let mut segments: Vec<Range<usize>> = Vec::new();
        for (i, spec) in self.info.layers.iter().enumerate() {
            let mut start = match spec.kv {
                KvSource::Shared(src) => src.min(i),
                KvSource::Own => i,
            };
            while let Some(last) = segments.pop_if(|last| last.end > start) {
                start = start.min(last.start);
            }
            segments.push(start..i + 1);
        }
        segments
    }

    /// Layer i reads its per-layer input, channels `i·P .. (i + 1)·P` of
    /// `per_layer_inputs` flattened to `[B, L, n_layers·P]`.
    pub fn layer_input_channels(&self, layers: Range<usize>) -> Range<usize> {
        let p = self.info.ple_dim;
        layers.start * p..layers.end * p
    }

    /// Layers `layers` over the residual stream `h` `[B, L, H]` with their per-layer inputs
    /// `ple` `[B, L, len(layers), P]`; KV-shared layers read the K/V of their source layer,
    /// which must be in `layers` (see [`TextModel::segments`]). With a cache, the layers that
    /// own K/V append theirs. `layer_outputs` receives the stream after every layer.
    #[allow(clippy::too_many_arguments)]
    pub fn run_layers(
        &self,
        layers: Range<usize>,
        mut h: Tensor<B, 3>,
        ple: Tensor<B, 4>,
        positions: Tensor<B, 3, Int>,
        mask: Tensor<B, 2, Int>,
        mut cache: Option<&mut KvCache<B>>,
        mut layer_outputs: Option<&mut Vec<Tensor<B, 3>>>,
    ) -> Tensor<B, 3> {
        let [b, l, _] = h.dims();
        // Attention masks, one per window (None = full layers), and RoPE tables per
        // (head dim, rotating pairs, θ), built once per call.
        let mut masks: Vec<(Option<usize>, AttentionMask<B>)> = Vec::new();
        let mut ropes: Vec<((usize, usize, u64), CosSin<B>)> = Vec::new();
        let mut kv_full: Vec<Option<Kv<B>>> = vec![None; self.layers.len()];
        let p = self.info.ple_dim;
        let first = layers.start;
        for i in layers.clone() {
            let (layer, spec) = (&self.layers[i], &self.info.layers[i]);
            let key = (spec.head_dim, spec.rotary_pairs, spec.rope_theta.to_bits());
            if !ropes.iter().any(|(k, _)| *k == key) {
                let (cos, sin) = rope_tables(positions.clone(), &text_inv_freq(spec), &[]);
                let d = spec.head_dim;
                ropes.push((key, (cos.reshape([b, 1, l, d]), sin.reshape([b, 1, l, d]))));
            }
            let (cos, sin) = ropes
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, t)| t.clone())
                .unwrap();
            let window = match spec.kind {
                LayerKind::Sliding { window } => Some(window),
                LayerKind::Full => None,
            };
            if !masks.iter().any(|(w, _)| *w == window) {
                masks.push((window, AttentionMask::causal(mask.clone(), l, window)));
            }
            let layer_mask = masks
                .iter()
                .find(|(w, _)| *w == window)
                .map(|(_, m)| m)
                .unwrap();
            let layer_cache = match (&mut cache, spec.kv) {
                (Some(c), KvSource::Own) => Some(&mut c.layers[i]),
                _ => None,
            };
            let (attn, kv) = layer.attend(
                layer.input_layernorm.forward(h.clone()),
                spec,
                self.info.heads,
                self.info.eps,
                (cos, sin),
                &kv_full,
                layer_cache,
                layer_mask,
            );
            // Keep the K/V only where a later KV-shared layer reads it.
            if self.info.layers[i + 1..layers.end]
                .iter()
                .any(|s| s.kv == KvSource::Shared(i))
            {
                kv_full[i] = Some(kv);
            }
            let mut x = h + layer.post_attention_layernorm.forward(attn);
            x = x.clone()
                + layer.post_feedforward_layernorm.forward(
                    layer
                        .mlp
                        .forward(layer.pre_feedforward_layernorm.forward(x)),
                );
            let ple_i = ple.clone().narrow(2, i - first, 1).reshape([b, l, p]);
            let g = gelu_approximate(layer.per_layer_input_gate.forward(x.clone())) * ple_i;
            x = x + layer
                .post_per_layer_input_norm
                .forward(layer.per_layer_projection.forward(g));
            h = x * layer.layer_scalar;
            if let Some(outputs) = layer_outputs.as_deref_mut() {
                outputs.push(h.clone());
            }
        }
        h
    }

    /// Logits `[B, L, V]` of final-normed hidden states: `hidden · embed_tokensᵀ` (tied head),
    /// then `cap · tanh(logits / cap)` when `final_logit_softcapping` is set.
    pub fn lm_head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, l, h] = hidden.dims();
        let logits = hidden
            .reshape([b * l, h])
            .matmul(self.embed_tokens.val().transpose())
            .reshape([b, l, self.info.vocab]);
        match self.info.softcap {
            Some(cap) => (logits / cap).tanh() * cap,
            None => logits,
        }
    }
}

impl<B: Backend> DecoderLayer<B> {
    /// Attention of this layer over `x` (input-normed); returns the projected output and the
    /// full-length K/V it attended to (its own, cache included, or its source layer's).
    /// q = RoPE(q_norm(q_proj x)), k = RoPE(k_norm(k_proj x)), v = rms_normalize(v_proj x);
    /// scale 1.0 (the q/k norm weights carry the temperature).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        x: Tensor<B, 3>,
        spec: &LayerSpec,
        heads: usize,
        eps: f64,
        (cos, sin): CosSin<B>,
        kv_full: &[Option<Kv<B>>],
        cache: Option<&mut Option<Kv<B>>>,
        mask: &AttentionMask<B>,
    ) -> (Tensor<B, 3>, Kv<B>) {
        let [b, l, _] = x.dims();
        let (d, kvh) = (spec.head_dim, spec.num_kv_heads);
        let a = &self.self_attn;
        // [B, L, heads, D] → norm → [B, heads, L, D] → RoPE.
        let rope = |t: Tensor<B, 4>| {
            let dims = t.dims();
            apply_rotary(t, cos.clone().expand(dims), sin.clone().expand(dims))
        };
        let q = a
            .q_norm
            .forward(a.q_proj.forward(x.clone()).reshape([b, l, heads, d]));
        let q = rope(q.swap_dims(1, 2));
        let (k, v) = match spec.kv {
            KvSource::Own => {
                let (kp, vp, kn) = (
                    a.k_proj.as_ref().expect("a layer with own K/V has k_proj"),
                    a.v_proj.as_ref().expect("a layer with own K/V has v_proj"),
                    a.k_norm.as_ref().expect("a layer with own K/V has k_norm"),
                );
                let k = kn.forward(kp.forward(x.clone()).reshape([b, l, kvh, d]));
                let k = rope(k.swap_dims(1, 2));
                let v = rms_normalize(vp.forward(x).reshape([b, l, kvh, d]), eps).swap_dims(1, 2);
                match cache {
                    // Every key the queries attend to: cached + new (the mask covers them all).
                    Some(slot) => append_kv(slot, k, v, mask.keys()),
                    None => (k, v),
                }
            }
            KvSource::Shared(src) => kv_full[src]
                .clone()
                .expect("the source layer of a KV-shared layer runs first"),
        };
        let o = grouped_query_attention(q, k.clone(), v.clone(), mask, 1.0)
            .swap_dims(1, 2)
            .reshape([b, l, heads * d]);
        (a.o_proj.forward(o), (k, v))
    }
}

/// Inverse frequencies of a text layer: `1/θ^(2j/D)` ([`inv_freq`]) for the `rotary_pairs`
/// first pairs and 0 for the rest, so those channels pass through unrotated (proportional RoPE
/// keeps the exponent over the full D).
fn text_inv_freq(spec: &LayerSpec) -> Vec<f32> {
    let mut f = inv_freq(spec.rope_theta, spec.head_dim);
    for v in f.iter_mut().skip(spec.rotary_pairs) {
        *v = 0.0;
    }
    f
}
