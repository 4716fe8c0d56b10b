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
use super::layers::{Linear, RmsNorm, apply_rotary, attention, rotary_tables};
use super::weights::{NamedTensor, NamedTensors, WeightReader};
use crate::capabilities::KvCache;

const PREFIX: &str = "model.language_model";

/// Gated GELU MLP: `down(gelu_tanh(gate(x)) · up(x))`.
#[derive(Module, Debug)]
pub struct TextMlp<B: Backend> {
    pub gate_proj: Linear<B>,
    pub up_proj: Linear<B>,
    pub down_proj: Linear<B>,
}

impl<B: Backend> TextMlp<B> {
    fn load(w: &mut WeightReader, p: &str, hidden: usize, inter: usize, d: &B::Device) -> Self {
        Self {
            gate_proj: Linear::load(w, &format!("{p}.gate_proj"), inter, hidden, d),
            up_proj: Linear::load(w, &format!("{p}.up_proj"), inter, hidden, d),
            down_proj: Linear::load(w, &format!("{p}.down_proj"), hidden, inter, d),
        }
    }

    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let g = gelu_approximate(self.gate_proj.forward(x.clone()));
        self.down_proj.forward(g * self.up_proj.forward(x))
    }

    fn named(&self, p: &str, out: &mut NamedTensors<B>) {
        self.gate_proj.named(&format!("{p}.gate_proj"), out);
        self.up_proj.named(&format!("{p}.up_proj"), out);
        self.down_proj.named(&format!("{p}.down_proj"), out);
    }
}

/// Self-attention of one decoder layer. KV-shared layers have no k/v projections and no k norm.
#[derive(Module, Debug)]
pub struct TextAttention<B: Backend> {
    pub q_proj: Linear<B>,
    pub k_proj: Option<Linear<B>>,
    pub v_proj: Option<Linear<B>>,
    pub o_proj: Linear<B>,
    pub q_norm: RmsNorm<B>,
    pub k_norm: Option<RmsNorm<B>>,
    pub v_norm: RmsNorm<B>,
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
    /// Buffer multiplying the whole residual stream at the end of the layer.
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
    /// Ids whose PLE lookups use the pad row (image/video/audio soft tokens).
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
    /// Loads the decoder weights (`model.language_model.*`).
    pub fn load(
        config: &Gemma4Config,
        w: &mut WeightReader,
        device: &B::Device,
    ) -> anyhow::Result<Self> {
        let t = &config.text_config;
        let specs = t.layers()?;
        let (h, n, p, eps) = (
            t.hidden_size,
            t.num_hidden_layers,
            t.hidden_size_per_layer_input,
            t.rms_norm_eps,
        );
        let mut layers = Vec::with_capacity(n);
        for (i, spec) in specs.iter().enumerate() {
            let lp = format!("{PREFIX}.layers.{i}");
            let ap = format!("{lp}.self_attn");
            let (d, heads, kv) = (spec.head_dim, t.num_attention_heads, spec.num_kv_heads);
            let own = spec.kv == KvSource::Own;
            let self_attn = TextAttention {
                q_proj: Linear::load(w, &format!("{ap}.q_proj"), heads * d, h, device),
                k_proj: own.then(|| Linear::load(w, &format!("{ap}.k_proj"), kv * d, h, device)),
                v_proj: own.then(|| Linear::load(w, &format!("{ap}.v_proj"), kv * d, h, device)),
                o_proj: Linear::load(w, &format!("{ap}.o_proj"), h, heads * d, device),
                q_norm: RmsNorm::load(w, &format!("{ap}.q_norm"), d, eps, device),
                k_norm: own.then(|| RmsNorm::load(w, &format!("{ap}.k_norm"), d, eps, device)),
                v_norm: RmsNorm::plain(eps),
            };
            layers.push(DecoderLayer {
                input_layernorm: RmsNorm::load(w, &format!("{lp}.input_layernorm"), h, eps, device),
                post_attention_layernorm: RmsNorm::load(
                    w,
                    &format!("{lp}.post_attention_layernorm"),
                    h,
                    eps,
                    device,
                ),
                pre_feedforward_layernorm: RmsNorm::load(
                    w,
                    &format!("{lp}.pre_feedforward_layernorm"),
                    h,
                    eps,
                    device,
                ),
                post_feedforward_layernorm: RmsNorm::load(
                    w,
                    &format!("{lp}.post_feedforward_layernorm"),
                    h,
                    eps,
                    device,
                ),
                self_attn,
                mlp: TextMlp::load(w, &format!("{lp}.mlp"), h, spec.intermediate_size, device),
                per_layer_input_gate: Linear::load(
                    w,
                    &format!("{lp}.per_layer_input_gate"),
                    p,
                    h,
                    device,
                ),
                per_layer_projection: Linear::load(
                    w,
                    &format!("{lp}.per_layer_projection"),
                    h,
                    p,
                    device,
                ),
                post_per_layer_input_norm: RmsNorm::load(
                    w,
                    &format!("{lp}.post_per_layer_input_norm"),
                    h,
                    eps,
                    device,
                ),
                layer_scalar: w.scalar(&format!("{lp}.layer_scalar")),
            });
        }
        let pad_id = t.pad_token_id.unwrap_or(0);
        let mut multimodal_ids = vec![config.image_token_id];
        multimodal_ids.extend(config.video_token_id);
        multimodal_ids.extend(config.audio_token_id);
        Ok(Self {
            embed_tokens: w.param(
                &format!("{PREFIX}.embed_tokens.weight"),
                [t.vocab_size, h],
                device,
            ),
            embed_tokens_per_layer: w.param(
                &format!("{PREFIX}.embed_tokens_per_layer.weight"),
                [t.vocab_size_per_layer_input, n * p],
                device,
            ),
            per_layer_model_projection: Linear::load(
                w,
                &format!("{PREFIX}.per_layer_model_projection"),
                n * p,
                h,
                device,
            ),
            per_layer_projection_norm: RmsNorm::load(
                w,
                &format!("{PREFIX}.per_layer_projection_norm"),
                p,
                eps,
                device,
            ),
            layers,
            norm: RmsNorm::load(w, &format!("{PREFIX}.norm"), h, eps, device),
            info: TextInfo {
                layers: specs,
                hidden: h,
                heads: t.num_attention_heads,
                ple_dim: p,
                vocab: t.vocab_size,
                ple_vocab: t.vocab_size_per_layer_input,
                pad_id,
                multimodal_ids,
                softcap: t.final_logit_softcapping,
                eps,
            },
        })
    }

    /// Lists every tensor under its Hugging Face name.
    pub fn named(&self, out: &mut NamedTensors<B>) {
        out.push(
            format!("{PREFIX}.embed_tokens.weight"),
            NamedTensor::R2(self.embed_tokens.val()),
        );
        out.push(
            format!("{PREFIX}.embed_tokens_per_layer.weight"),
            NamedTensor::R2(self.embed_tokens_per_layer.val()),
        );
        self.per_layer_model_projection
            .named(&format!("{PREFIX}.per_layer_model_projection"), out);
        self.per_layer_projection_norm
            .named(&format!("{PREFIX}.per_layer_projection_norm"), out);
        self.norm.named(&format!("{PREFIX}.norm"), out);
        for (i, l) in self.layers.iter().enumerate() {
            let lp = format!("{PREFIX}.layers.{i}");
            l.input_layernorm
                .named(&format!("{lp}.input_layernorm"), out);
            l.post_attention_layernorm
                .named(&format!("{lp}.post_attention_layernorm"), out);
            l.pre_feedforward_layernorm
                .named(&format!("{lp}.pre_feedforward_layernorm"), out);
            l.post_feedforward_layernorm
                .named(&format!("{lp}.post_feedforward_layernorm"), out);
            let a = &l.self_attn;
            let ap = format!("{lp}.self_attn");
            a.q_proj.named(&format!("{ap}.q_proj"), out);
            if let Some(k) = &a.k_proj {
                k.named(&format!("{ap}.k_proj"), out);
            }
            if let Some(v) = &a.v_proj {
                v.named(&format!("{ap}.v_proj"), out);
            }
            a.o_proj.named(&format!("{ap}.o_proj"), out);
            a.q_norm.named(&format!("{ap}.q_norm"), out);
            if let Some(k) = &a.k_norm {
                k.named(&format!("{ap}.k_norm"), out);
            }
            l.mlp.named(&format!("{lp}.mlp"), out);
            l.per_layer_input_gate
                .named(&format!("{lp}.per_layer_input_gate"), out);
            l.per_layer_projection
                .named(&format!("{lp}.per_layer_projection"), out);
            l.post_per_layer_input_norm
                .named(&format!("{lp}.post_per_layer_input_norm"), out);
            out.push(
                format!("{lp}.layer_scalar"),
                NamedTensor::Scalar1(l.layer_scalar),
            );
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
    /// `tok = embed_tokens_per_layer[ids'] · sqrt(P)`,
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
        // Ids outside the PLE vocabulary use row 0.
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
    /// (merged text and image embeddings), `positions` `[B, L]`, `mask` `[B, cached + L]`.
    /// With a cache, the layers that own K/V append theirs; KV-shared layers read the (updated)
    /// K/V of their source layer. Returns the final-normed hidden states and, when `trace`,
    /// the intermediates.
    pub fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 2, Int>,
        mask: Tensor<B, 2, Int>,
        mut cache: Option<&mut KvCache<B>>,
        trace: bool,
    ) -> (Tensor<B, 3>, Option<TextTrace<B>>) {
        let [b, l, _] = embeds.dims();
        let device = embeds.device();
        let total = mask.dims()[1];
        let cached = total - l;
        let (ple, tok) = self.per_layer_inputs(ids, embeds.clone());
        let windows: Vec<usize> = self
            .info
            .layers
            .iter()
            .filter_map(|s| match s.kind {
                LayerKind::Sliding { window } => Some(window),
                LayerKind::Full => None,
            })
            .collect();
        let blocked = BlockedMasks::new(&mask, cached, l, &windows, &device);
        let positions = positions.float();
        let mut rope_cache: Vec<((usize, usize, u64), (Tensor<B, 4>, Tensor<B, 4>))> = Vec::new();
        let mut kv_full: Vec<Option<(Tensor<B, 4>, Tensor<B, 4>)>> = vec![None; self.layers.len()];
        let mut layer_outputs = Vec::new();
        let p = self.info.ple_dim;
        let mut h = embeds;
        for (i, (layer, spec)) in self.layers.iter().zip(&self.info.layers).enumerate() {
            let key = (spec.head_dim, spec.rotary_pairs, spec.rope_theta.to_bits());
            let (cos, sin) = match rope_cache.iter().find(|(k, _)| *k == key) {
                Some((_, cs)) => cs.clone(),
                None => {
                    let cs = rotary_tables(positions.clone(), &text_inv_freq(spec));
                    rope_cache.push((key, cs.clone()));
                    cs
                }
            };
            let window = match spec.kind {
                LayerKind::Sliding { window } => Some(window),
                LayerKind::Full => None,
            };
            let layer_cache = match (&mut cache, spec.kv) {
                (Some(c), KvSource::Own) => Some(&mut c.layers[i]),
                _ => None,
            };
            let attn = layer.attend(
                layer.input_layernorm.forward(h.clone()),
                spec,
                self.info.heads,
                &cos,
                &sin,
                &kv_full,
                layer_cache,
                blocked.get(window),
            );
            kv_full[i] = Some(attn.1);
            let mut x = h + layer.post_attention_layernorm.forward(attn.0);
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
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        x: Tensor<B, 3>,
        spec: &LayerSpec,
        heads: usize,
        cos: &Tensor<B, 4>,
        sin: &Tensor<B, 4>,
        kv_full: &[Option<(Tensor<B, 4>, Tensor<B, 4>)>],
        cache: Option<&mut Option<(Tensor<B, 4>, Tensor<B, 4>)>>,
        blocked: Tensor<B, 3, Bool>,
    ) -> (Tensor<B, 3>, (Tensor<B, 4>, Tensor<B, 4>)) {
        let [b, l, _] = x.dims();
        let (d, kvh) = (spec.head_dim, spec.num_kv_heads);
        let a = &self.self_attn;
        // [B, L, heads, D] → norm → [B, heads, L, D] → RoPE.
        let q = a
            .q_norm
            .forward(a.q_proj.forward(x.clone()).reshape([b, l, heads, d]));
        let q = apply_rotary(q.swap_dims(1, 2), cos.clone(), sin.clone());
        let (k, v) = match spec.kv {
            KvSource::Own => {
                let (kp, vp, kn) = (
                    a.k_proj.as_ref().expect("own K/V layer has k_proj"),
                    a.v_proj.as_ref().expect("own K/V layer has v_proj"),
                    a.k_norm.as_ref().expect("own K/V layer has k_norm"),
                );
                let k = kn.forward(kp.forward(x.clone()).reshape([b, l, kvh, d]));
                let k = apply_rotary(k.swap_dims(1, 2), cos.clone(), sin.clone());
                let v = a
                    .v_norm
                    .forward(vp.forward(x).reshape([b, l, kvh, d]))
                    .swap_dims(1, 2);
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
        let o = attention(q, k.clone(), v.clone(), blocked)
            .swap_dims(1, 2)
            .reshape([b, l, heads * d]);
        (a.o_proj.forward(o), (k, v))
    }
}

/// Inverse frequencies of a text layer: `1/θ^(2j/D)` for the `rotary_pairs` first pairs and 0
/// for the rest (proportional RoPE keeps the exponent over the full D), computed in f32 as
/// transformers does.
fn text_inv_freq(spec: &LayerSpec) -> Vec<f32> {
    let d = spec.head_dim;
    let theta = spec.rope_theta as f32;
    (0..d / 2)
        .map(|j| {
            if j < spec.rotary_pairs {
                1.0 / theta.powf((2 * j) as f32 / d as f32)
            } else {
                0.0
            }
        })
        .collect()
}

/// Blocked (query, key) pairs for full and sliding layers, built once per forward from the
/// attention mask: index-based causal + key padding (+ window).
struct BlockedMasks<B: Backend> {
    full: Tensor<B, 3, Bool>,
    sliding: Vec<(usize, Tensor<B, 3, Bool>)>,
}

impl<B: Backend> BlockedMasks<B> {
    fn new(
        mask: &Tensor<B, 2, Int>,
        cached: usize,
        l: usize,
        windows: &[usize],
        device: &B::Device,
    ) -> Self {
        let [b, total] = mask.dims();
        let valid: Vec<bool> = mask
            .clone()
            .into_data()
            .convert::<i64>()
            .into_vec::<i64>()
            .expect("attention mask values")
            .into_iter()
            .map(|m| m != 0)
            .collect();
        let build = |window: Option<usize>| {
            let mut blocked = Vec::with_capacity(b * l * total);
            for row in 0..b {
                for qi in 0..l {
                    let q = cached + qi;
                    for k in 0..total {
                        let mut ok = k <= q && valid[row * total + k];
                        if let Some(w) = window {
                            ok &= k + w > q;
                        }
                        blocked.push(!ok);
                    }
                }
            }
            Tensor::<B, 3, Bool>::from_data(TensorData::new(blocked, [b, l, total]), device)
        };
        let mut sliding: Vec<(usize, Tensor<B, 3, Bool>)> = Vec::new();
        for &w in windows {
            if !sliding.iter().any(|(x, _)| *x == w) {
                sliding.push((w, build(Some(w))));
            }
        }
        Self {
            full: build(None),
            sliding,
        }
    }

    fn get(&self, window: Option<usize>) -> Tensor<B, 3, Bool> {
        match window {
            None => self.full.clone(),
            Some(w) => self
                .sliding
                .iter()
                .find(|(x, _)| *x == w)
                .map(|(_, t)| t.clone())
                .expect("sliding mask built for every window"),
        }
    }
}
