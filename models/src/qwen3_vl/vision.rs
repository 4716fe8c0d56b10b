//! The Qwen3-VL vision tower with its DeepStack mergers (transformers `Qwen3VLVisionModel`,
//! `Qwen3VLVisionBlock`, `Qwen3VLVisionPatchMerger` in `modeling_qwen3_vl.py`).
//!
//! For `pixel_values` `[N, C·T·P·P]` (patch rows in merge-block order, see the processor):
//!
//! ```text
//! x = pixel_values·Wᵀ + b                              Conv3d patch embedding, with bias
//! x += Σ_k w_k · pos_embed[idx_k]                      learned grid, bilinearly resampled per image
//! for block i:  x += proj(attn(LN1(x)));  x += fc2(act(fc1(LN2(x))))
//!               (2-D RoPE, full attention inside each image frame; act = gelu_pytorch_tanh)
//!               if i = deepstack_visual_indexes[k]: feature_k = fc2(gelu(fc1(LN_4D(view(x, [N/4, 4D])))))
//! image_embeds = fc2(gelu(fc1(view(LN_D(x), [N/4, 4D]))))      main merger
//! ```
//!
//! The DeepStack mergers normalise after the 2×2 concatenation (`use_postshuffle_norm=True`),
//! the main merger before it; both use the exact (erf) GELU. Four consecutive patch rows form
//! one merged token. No window attention.

use anyhow::Result;
use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::gelu_approximate;

use super::config::{VisionAct, VisionConfig};
use crate::capabilities::ProcessedImage;
use crate::layers::{LayerNorm, Linear, Rotary, gelu_erf, inv_freq};
use crate::qwen2_vl::vision::{PatchGroups, pixel_inputs, segment_attention};
use crate::weights::{Init, WeightNames, Weights, join, shaped};

/// Checkpoint prefix of the tower.
pub const PREFIX: &str = "model.visual";
/// Vision LayerNorm epsilon (hard-coded in the reference, not in the config).
const VISION_NORM_EPS: f64 = 1e-6;

/// One pre-norm vision block.
#[derive(Module, Debug)]
pub struct VisionBlock<B: Backend> {
    pub norm1: LayerNorm<B>,
    pub norm2: LayerNorm<B>,
    pub qkv: Linear<B>,
    pub proj: Linear<B>,
    pub fc1: Linear<B>,
    pub fc2: Linear<B>,
    pub num_heads: usize,
    pub gelu_tanh: bool,
}

impl<B: Backend> Weights<B> for VisionBlock<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let at = |name: &str| join(prefix, name);
        self.norm1.weights(w, &at("norm1"));
        self.norm2.weights(w, &at("norm2"));
        self.qkv.weights(w, &at("attn.qkv"));
        self.proj.weights(w, &at("attn.proj"));
        self.fc1.weights(w, &at("mlp.linear_fc1"));
        self.fc2.weights(w, &at("mlp.linear_fc2"));
    }
}

impl<B: Backend> VisionBlock<B> {
    fn new(device: &B::Device, c: &VisionConfig) -> Self {
        let w = c.width;
        Self {
            norm1: LayerNorm::new(device, w, VISION_NORM_EPS),
            norm2: LayerNorm::new(device, w, VISION_NORM_EPS),
            qkv: Linear::new(device, w, 3 * w, true),
            proj: Linear::new(device, w, w, true),
            fc1: Linear::new(device, w, c.mlp_hidden, true),
            fc2: Linear::new(device, c.mlp_hidden, w, true),
            num_heads: c.num_heads,
            gelu_tanh: c.hidden_act == VisionAct::GeluTanh,
        }
    }

    /// `x` `[N, width]`; `rope` for `[1, N, heads, head_dim]`; attention inside each frame of
    /// `frames`, non-causal, `softmax` in f32.
    fn forward(
        &self,
        x: Tensor<B, 2>,
        rope: &Rotary<B>,
        frames: &PatchGroups<'_, B>,
    ) -> Tensor<B, 2> {
        let qkv = self.qkv.forward(self.norm1.forward(x.clone()));
        let attn = segment_attention(qkv, self.num_heads, rope, frames);
        let x = x + self.proj.forward(attn);
        let z = self.fc1.forward(self.norm2.forward(x.clone()));
        let z = if self.gelu_tanh {
            gelu_approximate(z)
        } else {
            gelu_erf(z)
        };
        x + self.fc2.forward(z)
    }
}

/// A patch merger: 2×2 patches → one token of the text width, `fc2(gelu(fc1(·)))` with a
/// LayerNorm before the concatenation (main merger, width D) or after it (DeepStack, width 4D).
#[derive(Module, Debug)]
pub struct PatchMerger<B: Backend> {
    pub norm: LayerNorm<B>,
    pub fc1: Linear<B>,
    pub fc2: Linear<B>,
    /// `use_postshuffle_norm`: normalise the concatenated `[N/4, 4D]` rows.
    pub postshuffle_norm: bool,
}

impl<B: Backend> Weights<B> for PatchMerger<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        self.norm.weights(w, &join(prefix, "norm"));
        self.fc1.weights(w, &join(prefix, "linear_fc1"));
        self.fc2.weights(w, &join(prefix, "linear_fc2"));
    }
}

impl<B: Backend> PatchMerger<B> {
    fn new(device: &B::Device, c: &VisionConfig, postshuffle_norm: bool) -> Self {
        let merged = c.width * c.spatial_merge_size * c.spatial_merge_size;
        let norm_width = if postshuffle_norm { merged } else { c.width };
        Self {
            norm: LayerNorm::new(device, norm_width, VISION_NORM_EPS),
            fc1: Linear::new(device, merged, merged, true),
            fc2: Linear::new(device, merged, c.out_width, true),
            postshuffle_norm,
        }
    }

    /// `x` `[N, D]` → `[N/unit, out]` (`unit` = merge²).
    fn forward(&self, x: Tensor<B, 2>, unit: usize) -> Tensor<B, 2> {
        let [n, d] = x.dims();
        let x = if self.postshuffle_norm {
            self.norm.forward(x.reshape([n / unit, unit * d]))
        } else {
            self.norm.forward(x).reshape([n / unit, unit * d])
        };
        self.fc2.forward(gelu_erf(self.fc1.forward(x)))
    }
}

/// Host-side layout of a batch of images for the vision tower.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionLayout {
    /// (h, w) patch coordinates per patch row, `pixel_values` order.
    pub rope_pos_hw: Vec<[i64; 2]>,
    /// Attention segment boundaries in patches (one segment per frame).
    pub cu_seqlens: Vec<usize>,
    /// Per patch row: the 4 rows of `pos_embed` its bilinear resampling reads.
    pub pos_interp_indices: Vec<[i64; 4]>,
    /// Their weights (f32, sum 1).
    pub pos_interp_weights: Vec<[f32; 4]>,
}

/// Intermediate vision outputs for parity tests.
pub struct VisionTrace<B: Backend> {
    pub patch_embeds: Option<Tensor<B, 2>>,
    pub pos_embeds: Option<Tensor<B, 2>>,
    /// Output of each block.
    pub block_out: Vec<Tensor<B, 2>>,
}

impl<B: Backend> Default for VisionTrace<B> {
    fn default() -> Self {
        Self {
            patch_embeds: None,
            pos_embeds: None,
            block_out: Vec::new(),
        }
    }
}

/// Bilinear taps of patch coordinate `p` on a grid axis of `n` patches over a learned axis of
/// `side` rows (transformers `get_vision_interpolation_indices_and_weights`, `align_corners=True`,
/// border clamping), in f32: `src = f32(p)·(side−1) / max(n−1, 1)`, `p0 = ⌊src⌋`, taps
/// `[clamp(p0), clamp(p0+1)]`, weights `[max(0, 1−|src−p0|), max(0, 1−|src−p0−1|)]`.
fn axis_taps(p: usize, n: usize, side: usize) -> ([i64; 2], [f32; 2]) {
    let src = p as f32 * (side - 1) as f32 / (n.max(2) - 1) as f32;
    let p0 = src.floor();
    let clamp = |x: f32| (x as i64).clamp(0, side as i64 - 1);
    let frac = src - p0;
    (
        [clamp(p0), clamp(p0 + 1.0)],
        [
            (1.0 - frac.abs()).max(0.0),
            (1.0 - (frac - 1.0).abs()).max(0.0),
        ],
    )
}

/// The whole vision tower.
#[derive(Module, Debug)]
pub struct VisionTower<B: Backend> {
    /// Conv3d weight `[width, in_channels, temporal, patch, patch]`, applied as a matmul over
    /// flattened patches.
    pub patch_embed: Param<Tensor<B, 5>>,
    pub patch_bias: Param<Tensor<B, 1>>,
    /// Learned position grid `[side², width]`, row `gy·side + gx`.
    pub pos_embed: Param<Tensor<B, 2>>,
    pub blocks: Vec<VisionBlock<B>>,
    pub merger: PatchMerger<B>,
    /// One merger per entry of `deepstack_visual_indexes`, in that order.
    pub deepstack_mergers: Vec<PatchMerger<B>>,
    pub config: VisionConfig,
    pub inv_freq: Vec<f32>,
}

/// `model.visual.{patch_embed, pos_embed, blocks.{i}, merger, deepstack_merger_list.{k}}`.
impl<B: Backend> Weights<B> for VisionTower<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let at = |name: &str| join(&join(prefix, PREFIX), name);
        let patch = at("patch_embed.proj");
        w.tensor(&join(&patch, "weight"), &mut self.patch_embed, Init::Matrix);
        w.tensor(&join(&patch, "bias"), &mut self.patch_bias, Init::Zeros);
        w.tensor(
            &at("pos_embed.weight"),
            &mut self.pos_embed,
            Init::Embedding,
        );
        for (i, b) in self.blocks.iter_mut().enumerate() {
            b.weights(w, &at(&format!("blocks.{i}")));
        }
        self.merger.weights(w, &at("merger"));
        for (k, m) in self.deepstack_mergers.iter_mut().enumerate() {
            m.weights(w, &at(&format!("deepstack_merger_list.{k}")));
        }
    }
}

impl<B: Backend> VisionTower<B> {
    pub fn new(device: &B::Device, c: &VisionConfig) -> Self {
        let p = c.patch_size;
        let head_dim = c.width / c.num_heads;
        Self {
            patch_embed: shaped(
                device,
                [c.width, c.in_channels, c.temporal_patch_size, p, p],
            ),
            patch_bias: shaped(device, [c.width]),
            pos_embed: shaped(device, [c.num_position_embeddings, c.width]),
            blocks: (0..c.depth).map(|_| VisionBlock::new(device, c)).collect(),
            merger: PatchMerger::new(device, c, false),
            deepstack_mergers: (0..c.deepstack_visual_indexes.len())
                .map(|_| PatchMerger::new(device, c, true))
                .collect(),
            config: c.clone(),
            // Qwen3VLVisionRotaryEmbedding(head_dim / 2): 1/theta^(2j/(head_dim/2)), j < head_dim/4.
            inv_freq: inv_freq(c.rope_theta, head_dim / 2),
        }
    }

    /// Patch coordinates, attention segments and position-embedding taps of images with grids
    /// `[t, gh, gw]`, in `pixel_values` row order: per frame, row
    /// `((bh·(gw/m) + bw)·m + mh)·m + mw` is patch `(h, w) = (m·bh+mh, m·bw+mw)`; its taps are
    /// the products of `axis_taps` on each axis, ordered (h0,w0), (h0,w1), (h1,w0), (h1,w1),
    /// index `h·side + w` (every frame repeats the table).
    pub fn layout(&self, grids: &[[usize; 3]]) -> VisionLayout {
        let m = self.config.spatial_merge_size;
        let side = self.config.pos_grid_side();
        let mut layout = VisionLayout {
            rope_pos_hw: Vec::new(),
            cu_seqlens: vec![0],
            pos_interp_indices: Vec::new(),
            pos_interp_weights: Vec::new(),
        };
        for &[t, gh, gw] in grids {
            for _ in 0..t {
                for bh in 0..gh / m {
                    for bw in 0..gw / m {
                        for mh in 0..m {
                            for mw in 0..m {
                                let (h, w) = (bh * m + mh, bw * m + mw);
                                layout.rope_pos_hw.push([h as i64, w as i64]);
                                let (th, wh) = axis_taps(h, gh, side);
                                let (tw, ww) = axis_taps(w, gw, side);
                                let s = side as i64;
                                layout.pos_interp_indices.push([
                                    th[0] * s + tw[0],
                                    th[0] * s + tw[1],
                                    th[1] * s + tw[0],
                                    th[1] * s + tw[1],
                                ]);
                                layout.pos_interp_weights.push([
                                    wh[0] * ww[0],
                                    wh[0] * ww[1],
                                    wh[1] * ww[0],
                                    wh[1] * ww[1],
                                ]);
                            }
                        }
                    }
                }
                let last = layout.cu_seqlens.last().copied().unwrap_or(0);
                layout.cu_seqlens.push(last + gh * gw);
            }
        }
        layout
    }

    /// Image embeddings `[Σ tokens, out_width]` and the DeepStack features (one
    /// `[Σ tokens, out_width]` per DeepStack block, in block order) of `pixel_values`
    /// `[N, patch_dim]` for images with `grids`, in raster order of the merged tokens.
    pub fn forward(
        &self,
        pixel_values: Tensor<B, 2>,
        grids: &[[usize; 3]],
        mut trace: Option<&mut VisionTrace<B>>,
    ) -> (Tensor<B, 2>, Vec<Tensor<B, 2>>) {
        let c = &self.config;
        let device = pixel_values.device();
        let layout = self.layout(grids);
        let n = layout.rope_pos_hw.len();
        let unit = c.spatial_merge_size * c.spatial_merge_size;
        let head_dim = c.width / c.num_heads;

        let weight = self.patch_embed.val().reshape([c.width, c.patch_dim()]);
        let x = pixel_values.cast(weight.dtype()).matmul(weight.transpose())
            + self.patch_bias.val().unsqueeze_dim(0);
        if let Some(t) = trace.as_deref_mut() {
            t.patch_embeds = Some(x.clone());
        }

        // Learned positions: Σ_k w_k · pos_embed[idx_k], summed in tap order.
        let table = self.pos_embed.val();
        let mut pos: Option<Tensor<B, 2>> = None;
        for k in 0..4 {
            let idx: Vec<i64> = layout.pos_interp_indices.iter().map(|t| t[k]).collect();
            let w: Vec<f32> = layout.pos_interp_weights.iter().map(|t| t[k]).collect();
            let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [n]), &device);
            let w = Tensor::<B, 1>::from_data(TensorData::new(w, [n]), &device)
                .reshape([n, 1])
                .cast(table.dtype());
            let term = table.clone().select(0, idx) * w;
            pos = Some(match pos {
                Some(p) => p + term,
                None => term,
            });
        }
        let pos = pos.expect("four taps");
        if let Some(t) = trace.as_deref_mut() {
            t.pos_embeds = Some(pos.clone());
        }
        let mut x = x + pos;

        // 2-D rotary tables: angles [h·inv_freq, w·inv_freq], emb = [a, a].
        let q = self.inv_freq.len();
        let mut angles = Vec::with_capacity(n * head_dim);
        for &[h, w] in &layout.rope_pos_hw {
            let a: Vec<f32> = (0..2 * q)
                .map(|j| {
                    if j < q {
                        h as f32 * self.inv_freq[j]
                    } else {
                        w as f32 * self.inv_freq[j - q]
                    }
                })
                .collect();
            angles.extend_from_slice(&a);
            angles.extend_from_slice(&a);
        }
        let emb = Tensor::<B, 1>::from_data(TensorData::new(angles, [n * head_dim]), &device)
            .reshape([n, head_dim]);
        let rope = Rotary::new(
            emb.clone().cos().unsqueeze_dim(0),
            emb.sin().unsqueeze_dim(0),
            c.num_heads,
            x.dtype(),
        );

        let frames: Vec<(usize, usize)> = layout
            .cu_seqlens
            .windows(2)
            .map(|w| (w[0], w[1] - w[0]))
            .collect();
        let frame_groups = PatchGroups::frames(&frames, &device);
        let mut deepstack = Vec::with_capacity(self.deepstack_mergers.len());
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(x, &rope, &frame_groups);
            if let Some(t) = trace.as_deref_mut() {
                t.block_out.push(x.clone());
            }
            if let Some(k) = c.deepstack_visual_indexes.iter().position(|&b| b == i) {
                deepstack.push(self.deepstack_mergers[k].forward(x.clone(), unit));
            }
        }
        (self.merger.forward(x, unit), deepstack)
    }

    /// Concatenated pixel values and grids of processed images, checked against the config.
    pub fn inputs(
        &self,
        images: &[ProcessedImage],
        device: &B::Device,
    ) -> Result<(Tensor<B, 2>, Vec<[usize; 3]>)> {
        pixel_inputs(
            images,
            self.config.patch_dim(),
            self.config.spatial_merge_size,
            device,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::axis_taps;

    /// The README's worked example: a 4-row grid on a 6-row table, and the identity at 6.
    #[test]
    fn bilinear_taps_follow_the_reference() {
        let rows: Vec<_> = (0..4).map(|h| axis_taps(h, 4, 6)).collect();
        assert_eq!(rows[0], ([0, 1], [1.0, 0.0]));
        assert_eq!(rows[1].0, [1, 2]);
        assert_eq!(rows[1].1, [0.33333337, 0.6666666]);
        assert_eq!(rows[2].0, [3, 4]);
        assert_eq!(rows[3], ([5, 5], [1.0, 0.0]));
        assert_eq!(axis_taps(3, 6, 6), ([3, 4], [1.0, 0.0]));
    }
}
