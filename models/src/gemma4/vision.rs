//! Gemma 4's vision tower and projector (transformers `Gemma4VisionModel` and
//! `Gemma4MultimodalEmbedder`, 5.24): patch embedding with 2-D position tables, encoder layers
//! with clipped linears, axial 2-D RoPE and bidirectional attention over the real patches, the
//! average pooler over `k × k` patch blocks and the projection into the text width.
//!
//! Input: the image processor's padded patches (`ProcessedImage::pixel_values` `[P, 3·p·p]`,
//! values in [0, 1], and `patch_positions` `(x, y)` with `(−1, −1)` on padding patches).
//! Output: one embedding per soft token, images concatenated in order.

use anyhow::{Result, bail, ensure};
use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::gelu_approximate;

use super::config::VisionConfig;
use super::layers::{ClippedLinear, Linear, RmsNorm, apply_rotary, attention, rotary_tables};
use super::weights::{NamedTensor, NamedTensors, WeightReader};
use crate::capabilities::ProcessedImage;

const TOWER: &str = "model.vision_tower";
const EMBED: &str = "model.embed_vision";

/// Gated GELU MLP with clipped linears.
#[derive(Module, Debug)]
pub struct VisionMlp<B: Backend> {
    pub gate_proj: ClippedLinear<B>,
    pub up_proj: ClippedLinear<B>,
    pub down_proj: ClippedLinear<B>,
}

/// Bidirectional self-attention with clipped projections and q/k/v norms.
#[derive(Module, Debug)]
pub struct VisionAttention<B: Backend> {
    pub q_proj: ClippedLinear<B>,
    pub k_proj: ClippedLinear<B>,
    pub v_proj: ClippedLinear<B>,
    pub o_proj: ClippedLinear<B>,
    pub q_norm: RmsNorm<B>,
    pub k_norm: RmsNorm<B>,
    pub v_norm: RmsNorm<B>,
}

/// One encoder layer: the text layer's sandwich norms, without PLE and `layer_scalar`.
#[derive(Module, Debug)]
pub struct VisionLayer<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub pre_feedforward_layernorm: RmsNorm<B>,
    pub post_feedforward_layernorm: RmsNorm<B>,
    pub self_attn: VisionAttention<B>,
    pub mlp: VisionMlp<B>,
}

/// Static facts of the tower.
#[derive(Debug, Clone)]
pub struct VisionInfo {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub patch_dim: usize,
    pub pool: usize,
    pub table_size: usize,
    pub rope_theta: f64,
}

/// The vision tower and the projector into the text width.
#[derive(Module, Debug)]
pub struct VisionTower<B: Backend> {
    pub input_proj: Linear<B>,
    /// `[2, table_size, Hv]`: `[0]` indexed by the patch column x, `[1]` by the row y.
    pub position_embedding_table: Param<Tensor<B, 3>>,
    pub layers: Vec<VisionLayer<B>>,
    /// `embed_vision.embedding_projection` `[H, Hv]`, after a weightless RMSNorm.
    pub embedding_projection: Linear<B>,
    pub pre_projection_norm: RmsNorm<B>,
    pub info: VisionInfo,
}

/// Intermediates of [`VisionTower::forward`].
#[derive(Debug, Clone)]
pub struct VisionTrace<B: Backend> {
    /// Patch embedder output `[N, P, Hv]`.
    pub patch_embeds: Tensor<B, 3>,
    /// Encoder output before pooling `[N, P, Hv]`.
    pub encoder_out: Tensor<B, 3>,
    /// Pooled, scaled soft tokens `[Σ n_soft, Hv]`.
    pub pooled: Tensor<B, 2>,
}

fn clipped<B: Backend>(
    w: &mut WeightReader,
    p: &str,
    out: usize,
    inp: usize,
    d: &B::Device,
) -> ClippedLinear<B> {
    ClippedLinear::load(w, p, out, inp, d)
}

impl<B: Backend> VisionTower<B> {
    /// Loads `model.vision_tower.*` and `model.embed_vision.*`; `text_hidden` is the text width.
    pub fn load(
        c: &VisionConfig,
        text_hidden: usize,
        w: &mut WeightReader,
        device: &B::Device,
    ) -> Result<Self> {
        let (hv, iv, eps) = (c.hidden_size, c.intermediate_size, c.rms_norm_eps);
        let heads = c.num_attention_heads;
        let kv_heads = c.num_key_value_heads.unwrap_or(heads);
        let dv = c.head_dim;
        ensure!(
            heads % kv_heads == 0,
            "vision: {heads} heads are not a multiple of {kv_heads} KV heads"
        );
        let patch_dim = 3 * c.patch_size * c.patch_size;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let lp = format!("{TOWER}.encoder.layers.{i}");
            let ap = format!("{lp}.self_attn");
            let mp = format!("{lp}.mlp");
            layers.push(VisionLayer {
                input_layernorm: RmsNorm::load(
                    w,
                    &format!("{lp}.input_layernorm"),
                    hv,
                    eps,
                    device,
                ),
                post_attention_layernorm: RmsNorm::load(
                    w,
                    &format!("{lp}.post_attention_layernorm"),
                    hv,
                    eps,
                    device,
                ),
                pre_feedforward_layernorm: RmsNorm::load(
                    w,
                    &format!("{lp}.pre_feedforward_layernorm"),
                    hv,
                    eps,
                    device,
                ),
                post_feedforward_layernorm: RmsNorm::load(
                    w,
                    &format!("{lp}.post_feedforward_layernorm"),
                    hv,
                    eps,
                    device,
                ),
                self_attn: VisionAttention {
                    q_proj: clipped(w, &format!("{ap}.q_proj"), heads * dv, hv, device),
                    k_proj: clipped(w, &format!("{ap}.k_proj"), kv_heads * dv, hv, device),
                    v_proj: clipped(w, &format!("{ap}.v_proj"), kv_heads * dv, hv, device),
                    o_proj: clipped(w, &format!("{ap}.o_proj"), hv, heads * dv, device),
                    q_norm: RmsNorm::load(w, &format!("{ap}.q_norm"), dv, eps, device),
                    k_norm: RmsNorm::load(w, &format!("{ap}.k_norm"), dv, eps, device),
                    v_norm: RmsNorm::plain(eps),
                },
                mlp: VisionMlp {
                    gate_proj: clipped(w, &format!("{mp}.gate_proj"), iv, hv, device),
                    up_proj: clipped(w, &format!("{mp}.up_proj"), iv, hv, device),
                    down_proj: clipped(w, &format!("{mp}.down_proj"), hv, iv, device),
                },
            });
        }
        Ok(Self {
            input_proj: Linear::load(
                w,
                &format!("{TOWER}.patch_embedder.input_proj"),
                hv,
                patch_dim,
                device,
            ),
            position_embedding_table: w.param(
                &format!("{TOWER}.patch_embedder.position_embedding_table"),
                [2, c.position_embedding_size, hv],
                device,
            ),
            layers,
            embedding_projection: Linear::load(
                w,
                &format!("{EMBED}.embedding_projection"),
                text_hidden,
                hv,
                device,
            ),
            pre_projection_norm: RmsNorm::plain(eps),
            info: VisionInfo {
                hidden: hv,
                heads,
                kv_heads,
                head_dim: dv,
                patch_dim,
                pool: c.pooling_kernel_size,
                table_size: c.position_embedding_size,
                rope_theta: c.rope_parameters.rope_theta,
            },
        })
    }

    /// Lists every tensor under its Hugging Face name.
    pub fn named(&self, out: &mut NamedTensors<B>) {
        self.input_proj
            .named(&format!("{TOWER}.patch_embedder.input_proj"), out);
        out.push(
            format!("{TOWER}.patch_embedder.position_embedding_table"),
            NamedTensor::R3(self.position_embedding_table.val()),
        );
        for (i, l) in self.layers.iter().enumerate() {
            let lp = format!("{TOWER}.encoder.layers.{i}");
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
            a.k_proj.named(&format!("{ap}.k_proj"), out);
            a.v_proj.named(&format!("{ap}.v_proj"), out);
            a.o_proj.named(&format!("{ap}.o_proj"), out);
            a.q_norm.named(&format!("{ap}.q_norm"), out);
            a.k_norm.named(&format!("{ap}.k_norm"), out);
            let mp = format!("{lp}.mlp");
            l.mlp.gate_proj.named(&format!("{mp}.gate_proj"), out);
            l.mlp.up_proj.named(&format!("{mp}.up_proj"), out);
            l.mlp.down_proj.named(&format!("{mp}.down_proj"), out);
        }
        self.embedding_projection
            .named(&format!("{EMBED}.embedding_projection"), out);
    }

    /// Image embeddings `[Σ n_soft, H]` of `images` (tower, pooler, projector) and, when
    /// `trace`, the intermediates.
    pub fn forward(
        &self,
        images: &[ProcessedImage],
        device: &B::Device,
        trace: bool,
    ) -> Result<(Tensor<B, 2>, Option<VisionTrace<B>>)> {
        let batch = ImageBatch::new(images, self.info.patch_dim, self.info.pool)?;
        let (n, p, hv) = (batch.n, batch.patches, self.info.hidden);
        let pixels = Tensor::<B, 1>::from_data(
            TensorData::new(batch.pixels.clone(), [n * p * self.info.patch_dim]),
            device,
        )
        .reshape([n, p, self.info.patch_dim]);
        let patch_embeds = self.embed_patches(pixels, &batch, device)?;

        // Axial RoPE tables: first half of each head rotates with x, second half with y.
        let half = self.info.head_dim / 2;
        let inv: Vec<f32> = (0..half / 2)
            .map(|j| 1.0 / (self.info.rope_theta as f32).powf((2 * j) as f32 / half as f32))
            .collect();
        let coord = |axis: usize| {
            let v: Vec<f32> = batch.positions.iter().map(|xy| xy[axis] as f32).collect();
            Tensor::<B, 1>::from_data(TensorData::new(v, [n * p]), device).reshape([n, p])
        };
        let (cos_x, sin_x) = rotary_tables(coord(0), &inv);
        let (cos_y, sin_y) = rotary_tables(coord(1), &inv);
        let rope = |t: Tensor<B, 4>| {
            let a = apply_rotary(t.clone().narrow(3, 0, half), cos_x.clone(), sin_x.clone());
            let b = apply_rotary(t.narrow(3, half, half), cos_y.clone(), sin_y.clone());
            Tensor::cat(vec![a, b], 3)
        };
        // Padding patches are never keys.
        let mut mask = Vec::with_capacity(n * p * p);
        for img in 0..n {
            let row: Vec<bool> = (0..p).map(|k| !batch.real[img * p + k]).collect();
            for _ in 0..p {
                mask.extend_from_slice(&row);
            }
        }
        let blocked = Tensor::<B, 3, Bool>::from_data(TensorData::new(mask, [n, p, p]), device);

        let (heads, kvh, dv) = (self.info.heads, self.info.kv_heads, self.info.head_dim);
        let mut h = patch_embeds.clone();
        for layer in &self.layers {
            let a = &layer.self_attn;
            let x = layer.input_layernorm.forward(h.clone());
            let q = a
                .q_norm
                .forward(a.q_proj.forward(x.clone()).reshape([n, p, heads, dv]));
            let k = a
                .k_norm
                .forward(a.k_proj.forward(x.clone()).reshape([n, p, kvh, dv]));
            let v = a
                .v_norm
                .forward(a.v_proj.forward(x).reshape([n, p, kvh, dv]));
            let q = rope(q.swap_dims(1, 2));
            let k = rope(k.swap_dims(1, 2));
            let o = attention(q, k, v.swap_dims(1, 2), blocked.clone())
                .swap_dims(1, 2)
                .reshape([n, p, heads * dv]);
            h = h + layer.post_attention_layernorm.forward(a.o_proj.forward(o));
            let x = layer.pre_feedforward_layernorm.forward(h.clone());
            let m = &layer.mlp;
            let y = m
                .down_proj
                .forward(gelu_approximate(m.gate_proj.forward(x.clone())) * m.up_proj.forward(x));
            h = h + layer.post_feedforward_layernorm.forward(y);
        }
        let encoder_out = h;

        // Pooler: average of each k×k block of real patches (a [slots, N·P] matrix), × sqrt(Hv).
        let total_soft = batch.slots.len();
        let kk = (self.info.pool * self.info.pool) as f32;
        let mut weights = vec![0f32; total_soft * n * p];
        for (s, members) in batch.slots.iter().enumerate() {
            for &m in members {
                weights[s * n * p + m] = 1.0 / kk;
            }
        }
        let weights =
            Tensor::<B, 1>::from_data(TensorData::new(weights, [total_soft * n * p]), device)
                .reshape([total_soft, n * p]);
        let pooled =
            weights.matmul(encoder_out.clone().reshape([n * p, hv])) * ((hv as f64).sqrt() as f32);
        let embeds = self
            .embedding_projection
            .forward(self.pre_projection_norm.forward(pooled.clone()));
        let trace = trace.then(|| VisionTrace {
            patch_embeds,
            encoder_out,
            pooled,
        });
        Ok((embeds, trace))
    }

    /// `input_proj(2·(pixels − 0.5)) + table[0][x] + table[1][y]` (0 added on padding patches).
    fn embed_patches(
        &self,
        pixels: Tensor<B, 3>,
        batch: &ImageBatch,
        device: &B::Device,
    ) -> Result<Tensor<B, 3>> {
        let (n, p, hv, size) = (
            batch.n,
            batch.patches,
            self.info.hidden,
            self.info.table_size,
        );
        let x = self.input_proj.forward((pixels - 0.5) * 2.0);
        let mut xs = Vec::with_capacity(n * p);
        let mut ys = Vec::with_capacity(n * p);
        let mut real = Vec::with_capacity(n * p);
        for (i, xy) in batch.positions.iter().enumerate() {
            let r = batch.real[i];
            if r && (xy[0] as usize >= size || xy[1] as usize >= size) {
                bail!(
                    "patch position ({}, {}) is outside the {size}-entry position table",
                    xy[0],
                    xy[1]
                );
            }
            xs.push(if r { xy[0] } else { 0 });
            ys.push(if r { xy[1] } else { 0 });
            real.push(if r { 1f32 } else { 0.0 });
        }
        let idx = |v: Vec<i64>| Tensor::<B, 1, Int>::from_data(TensorData::new(v, [n * p]), device);
        let table = self.position_embedding_table.val();
        let tx = table
            .clone()
            .narrow(0, 0, 1)
            .reshape([size, hv])
            .select(0, idx(xs));
        let ty = table.narrow(0, 1, 1).reshape([size, hv]).select(0, idx(ys));
        let real =
            Tensor::<B, 1>::from_data(TensorData::new(real, [n * p]), device).reshape([n * p, 1]);
        let pos = ((tx + ty) * real).reshape([n, p, hv]);
        Ok(x + pos)
    }
}

/// Host-side layout of a batch of processed images.
struct ImageBatch {
    n: usize,
    patches: usize,
    pixels: Vec<f32>,
    /// `(x, y)` per patch, `N·P` entries.
    positions: Vec<[i64; 2]>,
    real: Vec<bool>,
    /// Per soft token (images in order, row-major over each pooled grid): its member patches
    /// as indices into the `N·P` patches.
    slots: Vec<Vec<usize>>,
}

impl ImageBatch {
    fn new(images: &[ProcessedImage], patch_dim: usize, pool: usize) -> Result<Self> {
        ensure!(!images.is_empty(), "no images to embed");
        let patches = images[0].shape.first().copied().unwrap_or(0);
        let mut pixels = Vec::with_capacity(images.len() * patches * patch_dim);
        let mut positions = Vec::with_capacity(images.len() * patches);
        let mut slots = Vec::new();
        for (i, img) in images.iter().enumerate() {
            ensure!(
                img.shape == [patches, patch_dim] && img.pixel_values.len() == patches * patch_dim,
                "image {i}: pixel values are {:?}, expected [{patches}, {patch_dim}]",
                img.shape
            );
            let pos = match &img.patch_positions {
                Some(p) if p.len() == patches => p,
                _ => bail!("image {i}: Gemma 4 needs {patches} patch positions"),
            };
            pixels.extend_from_slice(&img.pixel_values);
            positions.extend_from_slice(pos);
            // Pooling slots: (x / k) + (W / k) · (y / k), W = max x + 1 over real patches.
            let real: Vec<(usize, [i64; 2])> = pos
                .iter()
                .copied()
                .enumerate()
                .filter(|(_, xy)| xy[0] >= 0 && xy[1] >= 0)
                .collect();
            let width = real.iter().map(|(_, xy)| xy[0]).max().unwrap_or(-1) + 1;
            let k = pool as i64;
            let cols = width / k;
            let mut by_slot: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
            for (j, xy) in real {
                let slot = xy[0] / k + cols * (xy[1] / k);
                by_slot.entry(slot).or_default().push(i * patches + j);
            }
            ensure!(
                by_slot.len() == img.num_tokens,
                "image {i}: its patches pool into {} soft tokens but it declares {}",
                by_slot.len(),
                img.num_tokens
            );
            slots.extend(by_slot.into_values());
        }
        let real = positions
            .iter()
            .map(|xy| xy[0] >= 0 && xy[1] >= 0)
            .collect();
        Ok(Self {
            n: images.len(),
            patches,
            pixels,
            positions,
            real,
            slots,
        })
    }
}
