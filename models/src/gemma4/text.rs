//! Gemma 4's text decoder (transformers `Gemma4TextModel`, 5.24): scaled token embeddings,
//! per-layer embeddings (PLE), sliding and full attention layers with their own head dims and
//! RoPE, KV sharing between layers, the sandwich-normed decoder layer with its PLE branch and
//! `layer_scalar`, the final norm and the tied, soft-capped LM head.
//!
//! Positions are plain 1-D (one stream); the caller derives them from the attention mask.
//! Masks are index-based inside the padded row: a key at index `j` is visible to the query at
//! index `i` when `j ≤ i`, the key is not padding and, on sliding layers, `j > i − W`.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::gelu_approximate;

use super::config::{Gemma4Config, KvSource, LayerKind, LayerSpec};
use super::layers::{export_block_norms, geglu, load_block_norms};
use crate::capabilities::KvCache;
use crate::layers::{
    Linear, RmsNorm, apply_rotary, attention, causal_padding_window_bias, inv_freq, repeat_kv,
    rms_normalize, rope_tables,
};
use crate::weights::{Init, WeightSource, WeightVisitor};

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

impl<B: Backend> TextMlp<B> {
    fn load(src: &mut dyn WeightSource<B>, p: &str, hidden: usize, inter: usize) -> Self {
        Self {
            gate_proj: Linear::load(src, &format!("{p}.gate_proj"), hidden, inter, false),
            up_proj: Linear::load(src, &format!("{p}.up_proj"), hidden, inter, false),
            down_proj: Linear::load(src, &format!("{p}.down_proj"), inter, hidden, false),
        }
    }

    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        geglu(&self.gate_proj, &self.up_proj, &self.down_proj, x)
    }

    fn export<V: WeightVisitor<B>>(&self, sink: &mut V, p: &str) {
        self.gate_proj.export(sink, &format!("{p}.gate_proj"));
        self.up_proj.export(sink, &format!("{p}.up_proj"));
        self.down_proj.export(sink, &format!("{p}.down_proj"));
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

impl<B: Backend> TextModel<B> {
    /// Builds the decoder from `model.language_model.*` tensors of `src`.
    pub fn load(src: &mut dyn WeightSource<B>, config: &Gemma4Config) -> Self {
        let t = &config.text_config;
        let (h, n, p, eps) = (
            t.hidden_size,
            t.num_hidden_layers,
            t.hidden_size_per_layer_input,
            t.rms_norm_eps,
        );
        let heads = t.num_attention_heads;
        let mut layers = Vec::with_capacity(n);
        for (i, spec) in config.layers.iter().enumerate() {
            let lp = format!("{PREFIX}.layers.{i}");
            let ap = format!("{lp}.self_attn");
            let (d, kv) = (spec.head_dim, spec.num_kv_heads);
            let own = spec.kv == KvSource::Own;
            let self_attn = TextAttention {
                q_proj: Linear::load(src, &format!("{ap}.q_proj"), h, heads * d, false),
                k_proj: own.then(|| Linear::load(src, &format!("{ap}.k_proj"), h, kv * d, false)),
                v_proj: own.then(|| Linear::load(src, &format!("{ap}.v_proj"), h, kv * d, false)),
                o_proj: Linear::load(src, &format!("{ap}.o_proj"), heads * d, h, false),
                q_norm: RmsNorm::load(src, &format!("{ap}.q_norm"), d, eps),
                k_norm: own.then(|| RmsNorm::load(src, &format!("{ap}.k_norm"), d, eps)),
            };
            let [
                input_layernorm,
                post_attention_layernorm,
                pre_feedforward_layernorm,
                post_feedforward_layernorm,
            ] = load_block_norms(src, &lp, h, eps);
            layers.push(DecoderLayer {
                input_layernorm,
                post_attention_layernorm,
                pre_feedforward_layernorm,
                post_feedforward_layernorm,
                self_attn,
                mlp: TextMlp::load(src, &format!("{lp}.mlp"), h, spec.intermediate_size),
                per_layer_input_gate: Linear::load(
                    src,
                    &format!("{lp}.per_layer_input_gate"),
                    h,
                    p,
                    false,
                ),
                per_layer_projection: Linear::load(
                    src,
                    &format!("{lp}.per_layer_projection"),
                    p,
                    h,
                    false,
                ),
                post_per_layer_input_norm: RmsNorm::load(
                    src,
                    &format!("{lp}.post_per_layer_input_norm"),
                    h,
                    eps,
                ),
                layer_scalar: src.take_scalar(&format!("{lp}.layer_scalar"), &[1], Init::Ones),
            });
        }
        let mut multimodal_ids = vec![config.image_token_id];
        multimodal_ids.extend(config.video_token_id);
        multimodal_ids.extend(config.audio_token_id);
        Self {
            embed_tokens: Param::from_tensor(src.take2(
                &format!("{PREFIX}.embed_tokens.weight"),
                [t.vocab_size, h],
                Init::Embedding,
            )),
            embed_tokens_per_layer: Param::from_tensor(src.take2(
                &format!("{PREFIX}.embed_tokens_per_layer.weight"),
                [t.vocab_size_per_layer_input, n * p],
                Init::Embedding,
            )),
            per_layer_model_projection: Linear::load(
                src,
                &format!("{PREFIX}.per_layer_model_projection"),
                h,
                n * p,
                false,
            ),
            per_layer_projection_norm: RmsNorm::load(
                src,
                &format!("{PREFIX}.per_layer_projection_norm"),
                p,
                eps,
            ),
            layers,
            norm: RmsNorm::load(src, &format!("{PREFIX}.norm"), h, eps),
            info: TextInfo {
                layers: config.layers.clone(),
                hidden: h,
                heads,
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

    /// Every tensor under its Hugging Face name (`model.language_model.*`; the LM head is tied
    /// and not written).
    pub fn export<V: WeightVisitor<B>>(&self, sink: &mut V) {
        sink.put(
            &format!("{PREFIX}.embed_tokens.weight"),
            self.embed_tokens.val(),
        );
        sink.put(
            &format!("{PREFIX}.embed_tokens_per_layer.weight"),
            self.embed_tokens_per_layer.val(),
        );
        self.per_layer_model_projection
            .export(sink, &format!("{PREFIX}.per_layer_model_projection"));
        self.per_layer_projection_norm
            .export(sink, &format!("{PREFIX}.per_layer_projection_norm"));
        self.norm.export(sink, &format!("{PREFIX}.norm"));
        for (i, l) in self.layers.iter().enumerate() {
            let lp = format!("{PREFIX}.layers.{i}");
            export_block_norms(
                sink,
                &lp,
                [
                    &l.input_layernorm,
                    &l.post_attention_layernorm,
                    &l.pre_feedforward_layernorm,
                    &l.post_feedforward_layernorm,
                ],
            );
            let a = &l.self_attn;
            let ap = format!("{lp}.self_attn");
            a.q_proj.export(sink, &format!("{ap}.q_proj"));
            if let Some(k) = &a.k_proj {
                k.export(sink, &format!("{ap}.k_proj"));
            }
            if let Some(v) = &a.v_proj {
                v.export(sink, &format!("{ap}.v_proj"));
            }
            a.o_proj.export(sink, &format!("{ap}.o_proj"));
            a.q_norm.export(sink, &format!("{ap}.q_norm"));
            if let Some(k) = &a.k_norm {
                k.export(sink, &format!("{ap}.k_norm"));
            }
            l.mlp.export(sink, &format!("{lp}.mlp"));
            l.per_layer_input_gate
                .export(sink, &format!("{lp}.per_layer_input_gate"));
            l.per_layer_projection
                .export(sink, &format!("{lp}.per_layer_projection"));
            l.post_per_layer_input_norm
                .export(sink, &format!("{lp}.post_per_layer_input_norm"));
            sink.put_buffer(&format!("{lp}.layer_scalar"), &[1], &[l.layer_scalar]);
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
        mut cache: Option<&mut KvCache<B>>,
        trace: bool,
    ) -> (Tensor<B, 3>, Option<TextTrace<B>>) {
        let [b, l, _] = embeds.dims();
        let (ple, tok) = self.per_layer_inputs(ids, embeds.clone());
        // Attention biases, one per window (None = full layers), and RoPE tables per
        // (head dim, rotating pairs, θ), built once per forward.
        let mut biases: Vec<(Option<usize>, Tensor<B, 4>)> = Vec::new();
        let mut ropes: Vec<((usize, usize, u64), CosSin<B>)> = Vec::new();
        let mut kv_full: Vec<Option<Kv<B>>> = vec![None; self.layers.len()];
        let mut layer_outputs = Vec::new();
        let p = self.info.ple_dim;
        let mut h = embeds;
        for (i, (layer, spec)) in self.layers.iter().zip(&self.info.layers).enumerate() {
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
            if !biases.iter().any(|(w, _)| *w == window) {
                biases.push((window, causal_padding_window_bias(mask.clone(), l, window)));
            }
            let bias = biases
                .iter()
                .find(|(w, _)| *w == window)
                .map(|(_, t)| t.clone())
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
                bias,
            );
            // Keep the K/V only where a later KV-shared layer reads it.
            if self.info.layers[i + 1..]
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
            let ple_i = ple.clone().narrow(2, i, 1).reshape([b, l, p]);
            let g = gelu_approximate(layer.per_layer_input_gate.forward(x.clone())) * ple_i;
            x = x + layer
                .post_per_layer_input_norm
                .forward(layer.per_layer_projection.forward(g));
            h = x * layer.layer_scalar;
            if trace {
                layer_outputs.push(h.clone());
            }
        }
        let out = self.norm.forward(h);
        let trace = trace.then(|| TextTrace {
            ple_token_identity: tok,
            per_layer_inputs: ple,
            layer_outputs,
        });
        (out, trace)
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
        bias: Tensor<B, 4>,
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
                    Some(slot) => {
                        let (k, v) = match slot.take() {
                            Some((pk, pv)) => {
                                (Tensor::cat(vec![pk, k], 2), Tensor::cat(vec![pv, v], 2))
                            }
                            None => (k, v),
                        };
                        *slot = Some((k.clone(), v.clone()));
                        (k, v)
                    }
                    None => (k, v),
                }
            }
            KvSource::Shared(src) => kv_full[src]
                .clone()
                .expect("the source layer of a KV-shared layer runs first"),
        };
        let group = heads / kvh;
        let o = attention(
            q,
            repeat_kv(k.clone(), group),
            repeat_kv(v.clone(), group),
            Some(bias),
            1.0,
        )
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
