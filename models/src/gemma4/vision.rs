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

use super::config::VisionConfig;
use super::layers::{ClippedLinear, LinearMap, block_norm_weights, geglu, new_block_norms};
use crate::capabilities::ProcessedImage;
use crate::layers::{
    Linear, MASKED, RmsNorm, apply_rotary, attention, inv_freq, repeat_kv, rms_normalize,
    rope_tables,
};
use crate::weights::{Init, WeightNames, Weights, join, shaped};

const TOWER: &str = "model.vision_tower";
const EMBED: &str = "model.embed_vision";

/// GeGLU MLP with clipped linears.
#[derive(Module, Debug)]
pub struct VisionMlp<B: Backend> {
    pub gate_proj: ClippedLinear<B>,
    pub up_proj: ClippedLinear<B>,
    pub down_proj: ClippedLinear<B>,
}

/// Bidirectional self-attention with clipped projections, q/k norms and a weightless v norm.
#[derive(Module, Debug)]
pub struct VisionAttention<B: Backend> {
    pub q_proj: ClippedLinear<B>,
    pub k_proj: ClippedLinear<B>,
    pub v_proj: ClippedLinear<B>,
    pub o_proj: ClippedLinear<B>,
    pub q_norm: RmsNorm<B>,
    pub k_norm: RmsNorm<B>,
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
    pub eps: f64,
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

/// The four block norms, `self_attn.{q,k,v,o}_proj`, `self_attn.{q,k}_norm`,
/// `mlp.{gate,up,down}_proj`.
impl<B: Backend> Weights<B> for VisionLayer<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let norms = [
            &mut self.input_layernorm,
            &mut self.post_attention_layernorm,
            &mut self.pre_feedforward_layernorm,
            &mut self.post_feedforward_layernorm,
        ];
        block_norm_weights(w, prefix, norms);
        let (a, ap) = (&mut self.self_attn, join(prefix, "self_attn"));
        a.q_proj.weights(w, &join(&ap, "q_proj"));
        a.k_proj.weights(w, &join(&ap, "k_proj"));
        a.v_proj.weights(w, &join(&ap, "v_proj"));
        a.o_proj.weights(w, &join(&ap, "o_proj"));
        a.q_norm.weights(w, &join(&ap, "q_norm"));
        a.k_norm.weights(w, &join(&ap, "k_norm"));
        let (m, mp) = (&mut self.mlp, join(prefix, "mlp"));
        m.gate_proj.weights(w, &join(&mp, "gate_proj"));
        m.up_proj.weights(w, &join(&mp, "up_proj"));
        m.down_proj.weights(w, &join(&mp, "down_proj"));
    }
}

impl<B: Backend> VisionLayer<B> {
    fn new(device: &B::Device, c: &VisionConfig) -> Self {
        let (hv, iv, eps) = (c.hidden_size, c.intermediate_size, c.rms_norm_eps);
        let heads = c.num_attention_heads;
        let kv_heads = c.num_key_value_heads.unwrap_or(heads);
        let dv = c.head_dim;
        let [
            input_layernorm,
            post_attention_layernorm,
            pre_feedforward_layernorm,
            post_feedforward_layernorm,
        ] = new_block_norms(device, hv, eps);
        Self {
            input_layernorm,
            post_attention_layernorm,
            pre_feedforward_layernorm,
            post_feedforward_layernorm,
            self_attn: VisionAttention {
                q_proj: ClippedLinear::new(device, hv, heads * dv),
                k_proj: ClippedLinear::new(device, hv, kv_heads * dv),
                v_proj: ClippedLinear::new(device, hv, kv_heads * dv),
                o_proj: ClippedLinear::new(device, heads * dv, hv),
                q_norm: RmsNorm::new(device, dv, eps),
                k_norm: RmsNorm::new(device, dv, eps),
            },
            mlp: VisionMlp {
                gate_proj: ClippedLinear::new(device, hv, iv),
                up_proj: ClippedLinear::new(device, hv, iv),
                down_proj: ClippedLinear::new(device, iv, hv),
            },
        }
    }
}

/// `model.vision_tower.encoder.layers.{i}`, `model.vision_tower.patch_embedder.*`,
/// `model.embed_vision.embedding_projection`.
impl<B: Backend> Weights<B> for VisionTower<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let (tower, embed) = (join(prefix, TOWER), join(prefix, EMBED));
        for (i, layer) in self.layers.iter_mut().enumerate() {
            layer.weights(w, &format!("{tower}.encoder.layers.{i}"));
        }
        let patch = join(&tower, "patch_embedder");
        self.input_proj.weights(w, &join(&patch, "input_proj"));
        let table = join(&patch, "position_embedding_table");
        w.tensor(&table, &mut self.position_embedding_table, Init::Embedding);
        self.embedding_projection
            .weights(w, &join(&embed, "embedding_projection"));
    }
}

impl<B: Backend> VisionTower<B> {
    /// The tower of `c` projecting into the text width `text_hidden`, with placeholder weights.
    pub fn new(device: &B::Device, c: &VisionConfig, text_hidden: usize) -> Self {
        let hv = c.hidden_size;
        let heads = c.num_attention_heads;
        let patch_dim = 3 * c.patch_size * c.patch_size;
        Self {
            input_proj: Linear::new(device, patch_dim, hv, false),
            position_embedding_table: shaped(device, [2, c.position_embedding_size, hv]),
            layers: (0..c.num_hidden_layers)
                .map(|_| VisionLayer::new(device, c))
                .collect(),
            embedding_projection: Linear::new(device, hv, text_hidden, false),
            info: VisionInfo {
                hidden: hv,
                heads,
                kv_heads: c.num_key_value_heads.unwrap_or(heads),
                head_dim: c.head_dim,
                patch_dim,
                pool: c.pooling_kernel_size,
                table_size: c.position_embedding_size,
                rope_theta: c.rope_parameters.rope_theta,
                eps: c.rms_norm_eps,
            },
        }
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

        // Axial 2-D RoPE: the first half of each head rotates with x, the second with y, each
        // with rotate_half inside its half; inv_freq = 1/θ^(2j/(Dv/2)).
        let half = self.info.head_dim / 2;
        let inv = inv_freq(self.info.rope_theta, half);
        let table = |axis: usize| {
            let v: Vec<i64> = batch.positions.iter().map(|xy| xy[axis]).collect();
            let pos = Tensor::<B, 1, Int>::from_data(TensorData::new(v, [n * p]), device)
                .reshape([1, n, p]);
            let (cos, sin) = rope_tables(pos, &inv, &[]);
            (cos.reshape([n, 1, p, half]), sin.reshape([n, 1, p, half]))
        };
        let ((cos_x, sin_x), (cos_y, sin_y)) = (table(0), table(1));
        let rope = |t: Tensor<B, 4>| {
            let [a, h, l, _] = t.dims();
            let dims = [a, h, l, half];
            let x = apply_rotary(
                t.clone().narrow(3, 0, half),
                cos_x.clone().expand(dims),
                sin_x.clone().expand(dims),
            );
            let y = apply_rotary(
                t.narrow(3, half, half),
                cos_y.clone().expand(dims),
                sin_y.clone().expand(dims),
            );
            Tensor::cat(vec![x, y], 3)
        };
        // Bidirectional attention; padding patches are never keys.
        let key_bias: Vec<f32> = batch
            .real
            .iter()
            .map(|&r| if r { 0.0 } else { MASKED })
            .collect();
        let bias = Tensor::<B, 1>::from_data(TensorData::new(key_bias, [n * p]), device)
            .reshape([n, 1, 1, p]);

        let (heads, kvh, dv, eps) = (
            self.info.heads,
            self.info.kv_heads,
            self.info.head_dim,
            self.info.eps,
        );
        let mut h = patch_embeds.clone();
        for layer in &self.layers {
            let a = &layer.self_attn;
            let x = layer.input_layernorm.forward(h.clone());
            let q = a
                .q_norm
                .forward(a.q_proj.apply(x.clone()).reshape([n, p, heads, dv]));
            let k = a
                .k_norm
                .forward(a.k_proj.apply(x.clone()).reshape([n, p, kvh, dv]));
            let v = rms_normalize(a.v_proj.apply(x).reshape([n, p, kvh, dv]), eps);
            let q = rope(q.swap_dims(1, 2));
            let k = rope(k.swap_dims(1, 2));
            let group = heads / kvh;
            let o = attention(
                q,
                repeat_kv(k, group),
                repeat_kv(v.swap_dims(1, 2), group),
                Some(bias.clone()),
                1.0,
            )
            .swap_dims(1, 2)
            .reshape([n, p, heads * dv]);
            h = h + layer.post_attention_layernorm.forward(a.o_proj.apply(o));
            let x = layer.pre_feedforward_layernorm.forward(h.clone());
            let m = &layer.mlp;
            let y = geglu(&m.gate_proj, &m.up_proj, &m.down_proj, x);
            h = h + layer.post_feedforward_layernorm.forward(y);
        }
        let encoder_out = h;

        // Pooler: mean of each k×k block of real patches (a [slots, N·P] matrix of 1/k²),
        // then × sqrt(Hv).
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
        // Projector: weightless RMSNorm, then the projection into the text width.
        let embeds = self
            .embedding_projection
            .forward(rms_normalize(pooled.clone(), eps));
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
