//! The Qwen2-VL / Qwen2.5-VL vision tower (HF `Qwen2VisionTransformerPretrainedModel`,
//! `Qwen2_5_VisionTransformerPretrainedModel`).
//!
//! Patch embedding (the Conv3d as a matmul over flattened patches) → blocks with 2-D rotary
//! attention, block-diagonal per image (Qwen2.5-VL: per window, except in the full-attention
//! blocks) → patch merger (norm per patch, 2×2 patches concatenated, Linear → exact GELU →
//! Linear). Patch rows arrive in merge-block order (see the processor), so four consecutive rows
//! form one merged token.

use anyhow::{Result, ensure};
use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::activation::softmax;

use super::config::{Flavor, VisionConfig};
use crate::capabilities::ProcessedImage;
use crate::layers::{
    LayerNorm, Linear, MASKED, RmsNorm, Rotary, SwiGluMlp, gelu_erf, inv_freq, quick_gelu,
};
use crate::weights::{Init, WeightNames, Weights, join, shaped};

/// Vision RoPE base (hard-coded in the reference `VisionRotaryEmbedding`).
const VISION_ROPE_THETA: f64 = 10000.0;
/// Vision norm epsilon (hard-coded in the reference).
const VISION_NORM_EPS: f64 = 1e-6;

/// LayerNorm (Qwen2-VL) or RMSNorm (Qwen2.5-VL).
#[derive(Module, Debug)]
pub enum VisionNorm<B: Backend> {
    Layer(LayerNorm<B>),
    Rms(RmsNorm<B>),
}

impl<B: Backend> Weights<B> for VisionNorm<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        match self {
            Self::Layer(n) => n.weights(w, prefix),
            Self::Rms(n) => n.weights(w, prefix),
        }
    }
}

impl<B: Backend> VisionNorm<B> {
    fn new(device: &B::Device, dim: usize, flavor: Flavor) -> Self {
        match flavor {
            Flavor::Qwen2Vl => Self::Layer(LayerNorm::new(device, dim, VISION_NORM_EPS)),
            Flavor::Qwen25Vl => Self::Rms(RmsNorm::new(device, dim, VISION_NORM_EPS)),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            Self::Layer(n) => n.forward(x),
            Self::Rms(n) => n.forward(x),
        }
    }
}

/// Qwen2-VL block MLP `fc2(quick_gelu(fc1(x)))`.
#[derive(Module, Debug)]
pub struct QuickGeluMlp<B: Backend> {
    pub fc1: Linear<B>,
    pub fc2: Linear<B>,
}

/// Block MLP of either family.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum VisionMlp<B: Backend> {
    QuickGelu(QuickGeluMlp<B>),
    Gated(SwiGluMlp<B>),
}

impl<B: Backend> Weights<B> for VisionMlp<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        match self {
            Self::QuickGelu(m) => {
                m.fc1.weights(w, &join(prefix, "fc1"));
                m.fc2.weights(w, &join(prefix, "fc2"));
            }
            Self::Gated(m) => m.weights(w, prefix),
        }
    }
}

impl<B: Backend> VisionMlp<B> {
    fn new(device: &B::Device, c: &VisionConfig, flavor: Flavor) -> Self {
        match flavor {
            Flavor::Qwen2Vl => Self::QuickGelu(QuickGeluMlp {
                fc1: Linear::new(device, c.width, c.mlp_hidden, true),
                fc2: Linear::new(device, c.mlp_hidden, c.width, true),
            }),
            Flavor::Qwen25Vl => Self::Gated(SwiGluMlp::new(device, c.width, c.mlp_hidden, true)),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            Self::QuickGelu(m) => m.fc2.forward(quick_gelu(m.fc1.forward(x))),
            Self::Gated(m) => m.forward(x),
        }
    }
}

/// One pre-norm vision block.
#[derive(Module, Debug)]
pub struct VisionBlock<B: Backend> {
    pub norm1: VisionNorm<B>,
    pub norm2: VisionNorm<B>,
    pub qkv: Linear<B>,
    pub proj: Linear<B>,
    pub mlp: VisionMlp<B>,
    pub num_heads: usize,
}

impl<B: Backend> Weights<B> for VisionBlock<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let at = |name: &str| join(prefix, name);
        self.norm1.weights(w, &at("norm1"));
        self.norm2.weights(w, &at("norm2"));
        self.qkv.weights(w, &at("attn.qkv"));
        self.proj.weights(w, &at("attn.proj"));
        self.mlp.weights(w, &at("mlp"));
    }
}

impl<B: Backend> VisionBlock<B> {
    fn new(device: &B::Device, c: &VisionConfig, flavor: Flavor) -> Self {
        Self {
            norm1: VisionNorm::new(device, c.width, flavor),
            norm2: VisionNorm::new(device, c.width, flavor),
            qkv: Linear::new(device, c.width, 3 * c.width, true),
            proj: Linear::new(device, c.width, c.width, true),
            mlp: VisionMlp::new(device, c, flavor),
            num_heads: c.num_heads,
        }
    }

    /// `x` `[N, width]`; `rope` for `[1, N, heads, head_dim]`; attention within `groups`
    /// (frames, or windows inside them). RoPE is applied in the `[N, heads, head_dim]` layout,
    /// before the heads are moved forward (see [`Rotary`]).
    fn forward(
        &self,
        x: Tensor<B, 2>,
        rope: &Rotary<B>,
        groups: &PatchGroups<'_, B>,
    ) -> Tensor<B, 2> {
        let qkv = self.qkv.forward(self.norm1.forward(x.clone()));
        let attn = segment_attention(qkv, self.num_heads, rope, groups);
        let x = x + self.proj.forward(attn);
        let m = self.mlp.forward(self.norm2.forward(x.clone()));
        x + m
    }
}

/// Host-side layout of a batch of images for the vision tower.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionLayout {
    /// (h, w) patch coordinates per patch row, `pixel_values` order.
    pub rope_pos_hw: Vec<[i64; 2]>,
    /// Full-attention segment boundaries in patches (one segment per frame).
    pub cu_seqlens: Vec<usize>,
    /// Qwen2.5-VL: merged-token permutation into window order.
    pub window_index: Option<Vec<usize>>,
    /// Qwen2.5-VL: window boundaries in patches (window order, empty windows removed).
    pub cu_window_seqlens: Option<Vec<usize>>,
}

/// Intermediate vision outputs for parity tests.
pub struct VisionTrace<B: Backend> {
    pub patch_embeds: Option<Tensor<B, 2>>,
    /// Output of each block (Qwen2.5-VL: window order).
    pub block_out: Vec<Tensor<B, 2>>,
}

impl<B: Backend> Default for VisionTrace<B> {
    fn default() -> Self {
        Self {
            patch_embeds: None,
            block_out: Vec::new(),
        }
    }
}

/// The whole vision tower.
#[derive(Module, Debug)]
pub struct VisionTower<B: Backend> {
    /// Conv3d weight `[width, in_channels, temporal, patch, patch]`, applied as a matmul over
    /// flattened patches.
    pub patch_embed: Param<Tensor<B, 5>>,
    pub blocks: Vec<VisionBlock<B>>,
    pub merger_norm: VisionNorm<B>,
    pub merger_fc1: Linear<B>,
    pub merger_fc2: Linear<B>,
    pub config: VisionConfig,
    pub inv_freq: Vec<f32>,
}

/// `visual.patch_embed`, `visual.blocks.{i}`, `visual.merger`.
impl<B: Backend> Weights<B> for VisionTower<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let at = |name: &str| join(prefix, name);
        w.tensor(
            &at("visual.patch_embed.proj.weight"),
            &mut self.patch_embed,
            Init::Matrix,
        );
        for (i, b) in self.blocks.iter_mut().enumerate() {
            b.weights(w, &at(&format!("visual.blocks.{i}")));
        }
        self.merger_norm.weights(w, &at("visual.merger.ln_q"));
        self.merger_fc1.weights(w, &at("visual.merger.mlp.0"));
        self.merger_fc2.weights(w, &at("visual.merger.mlp.2"));
    }
}

impl<B: Backend> VisionTower<B> {
    pub fn new(device: &B::Device, c: &VisionConfig, flavor: Flavor) -> Self {
        let p = c.patch_size;
        let merged = c.width * c.spatial_merge_size * c.spatial_merge_size;
        let head_dim = c.width / c.num_heads;
        Self {
            patch_embed: shaped(
                device,
                [c.width, c.in_channels, c.temporal_patch_size, p, p],
            ),
            blocks: (0..c.depth)
                .map(|_| VisionBlock::new(device, c, flavor))
                .collect(),
            merger_norm: VisionNorm::new(device, c.width, flavor),
            merger_fc1: Linear::new(device, merged, merged, true),
            merger_fc2: Linear::new(device, merged, c.out_width, true),
            config: c.clone(),
            // VisionRotaryEmbedding(head_dim / 2): 1/theta^(2j/(head_dim/2)), j < head_dim/4.
            inv_freq: inv_freq(VISION_ROPE_THETA, head_dim / 2),
        }
    }

    /// Patch coordinates, attention segments and (Qwen2.5-VL) the window permutation of images
    /// with grids `[t, gh, gw]` (HF `rot_pos_emb`, `get_window_index`; see the fixtures README
    /// §5.1–5.2).
    pub fn layout(&self, grids: &[[usize; 3]]) -> VisionLayout {
        let m = self.config.spatial_merge_size;
        let mut pos = Vec::new();
        let mut cu = vec![0usize];
        for &[t, gh, gw] in grids {
            for _ in 0..t {
                for bh in 0..gh / m {
                    for bw in 0..gw / m {
                        for mh in 0..m {
                            for mw in 0..m {
                                pos.push([(bh * m + mh) as i64, (bw * m + mw) as i64]);
                            }
                        }
                    }
                }
                cu.push(cu.last().copied().unwrap_or(0) + gh * gw);
            }
        }
        let (window_index, cu_window) = if self.config.window_size > 0 {
            let (w, c) = self.window_index(grids);
            (Some(w), Some(c))
        } else {
            (None, None)
        };
        VisionLayout {
            rope_pos_hw: pos,
            cu_seqlens: cu,
            window_index,
            cu_window_seqlens: cu_window,
        }
    }

    /// Qwen2.5-VL window order: per frame, the merged grid `lh × lw` is cut into
    /// `vws × vws` windows (`vws = window_size / merge / patch`, bottom/right windows partial),
    /// windows row-major, tokens row-major inside a window.
    fn window_index(&self, grids: &[[usize; 3]]) -> (Vec<usize>, Vec<usize>) {
        let c = &self.config;
        let m = c.spatial_merge_size;
        let unit = m * m;
        let vws = (c.window_size / m / c.patch_size).max(1);
        let mut index = Vec::new();
        let mut cu = vec![0usize];
        let mut offset = 0;
        for &[t, gh, gw] in grids {
            let (lh, lw) = (gh / m, gw / m);
            for tt in 0..t {
                let base = offset + tt * lh * lw;
                for wy in 0..lh.div_ceil(vws) {
                    for wx in 0..lw.div_ceil(vws) {
                        let mut count = 0;
                        for y in wy * vws..((wy + 1) * vws).min(lh) {
                            for x in wx * vws..((wx + 1) * vws).min(lw) {
                                index.push(base + y * lw + x);
                                count += 1;
                            }
                        }
                        cu.push(cu.last().copied().unwrap_or(0) + count * unit);
                    }
                }
            }
            offset += t * lh * lw;
        }
        (index, cu)
    }

    /// Embeddings `[Σ tokens, out_width]` of `pixel_values` `[N, patch_dim]` for images with
    /// `grids`, in raster order of the merged tokens.
    pub fn forward(
        &self,
        pixel_values: Tensor<B, 2>,
        grids: &[[usize; 3]],
        mut trace: Option<&mut VisionTrace<B>>,
    ) -> Tensor<B, 2> {
        let c = &self.config;
        let device = pixel_values.device();
        let layout = self.layout(grids);
        let n = layout.rope_pos_hw.len();
        let unit = c.spatial_merge_size * c.spatial_merge_size;
        let head_dim = c.width / c.num_heads;

        let weight = self.patch_embed.val().reshape([c.width, c.patch_dim()]);
        let mut x = pixel_values.cast(weight.dtype()).matmul(weight.transpose());
        if let Some(t) = trace.as_deref_mut() {
            t.patch_embeds = Some(x.clone());
        }

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
        let (mut cos, mut sin) = (emb.clone().cos(), emb.sin());

        // Qwen2.5-VL: permute rows (in groups of one merged token) into window order.
        let window = layout.window_index.as_ref();
        if let Some(wi) = window {
            let idx = index_tensor::<B>(wi, &device);
            let permute = |t: Tensor<B, 2>| {
                let w = t.dims()[1];
                t.reshape([n / unit, unit * w])
                    .select(0, idx.clone())
                    .reshape([n, w])
            };
            x = permute(x.clone());
            cos = permute(cos.clone());
            sin = permute(sin.clone());
        }
        let rope = Rotary::new(
            cos.unsqueeze_dim(0),
            sin.unsqueeze_dim(0),
            c.num_heads,
            x.dtype(),
        );

        let frames: Vec<(usize, usize)> = layout
            .cu_seqlens
            .windows(2)
            .map(|w| (w[0], w[1] - w[0]))
            .collect();
        let frame_groups = PatchGroups::frames(&frames, &device);
        // Window attention inside each frame: a block-diagonal bias over that frame's windows.
        let window_biases: Option<Vec<Option<Tensor<B, 2>>>> =
            layout.cu_window_seqlens.as_ref().map(|cw| {
                frames
                    .iter()
                    .map(|&(start, len)| Some(window_bias::<B>(cw, start, len, &device)))
                    .collect()
            });
        let window_groups = layout
            .cu_window_seqlens
            .as_ref()
            .zip(window_biases.as_deref())
            .map(|(cw, biases)| PatchGroups::windows(&frames, cw, biases, &device));

        for (i, block) in self.blocks.iter().enumerate() {
            let groups = match &window_groups {
                Some(windows) if !c.fullatt_block_indexes.contains(&i) => windows,
                _ => &frame_groups,
            };
            x = block.forward(x, &rope, groups);
            if let Some(t) = trace.as_deref_mut() {
                t.block_out.push(x.clone());
            }
        }

        let x = self
            .merger_norm
            .forward(x)
            .reshape([n / unit, unit * c.width]);
        let merged = self
            .merger_fc2
            .forward(gelu_erf(self.merger_fc1.forward(x)));
        match window {
            Some(wi) => {
                let mut reverse = vec![0usize; wi.len()];
                for (j, &w) in wi.iter().enumerate() {
                    reverse[w] = j;
                }
                merged.select(0, index_tensor::<B>(&reverse, &device))
            }
            None => merged,
        }
    }

    /// Concatenated pixel values and grids of processed images.
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

/// Which patches attend to which in a vision block: each patch to the patches of its group, a
/// frame (`(start, len)` of `segments`), or with `biases` a window inside its frame (an additive
/// bias per frame, the composite's form of Qwen2.5-VL's windows). `ids` `[1, N]` numbers the
/// groups from 1, patch by patch: what the flash kernel reads ([`crate::kernels::attention`]).
pub struct PatchGroups<'a, B: Backend> {
    pub segments: &'a [(usize, usize)],
    pub biases: Option<&'a [Option<Tensor<B, 2>>]>,
    pub ids: Tensor<B, 2, Int>,
}

impl<'a, B: Backend> PatchGroups<'a, B> {
    /// One group per frame.
    pub fn frames(segments: &'a [(usize, usize)], device: &B::Device) -> Self {
        let mut ids = Vec::new();
        for (f, &(_, len)) in segments.iter().enumerate() {
            ids.extend(std::iter::repeat_n(f as i64 + 1, len));
        }
        Self {
            segments,
            biases: None,
            ids: group_ids(ids, device),
        }
    }

    /// One group per window of a frame: the windows `cu_window` bounds (global patch
    /// indices), cut at the frame boundaries; `biases` the same windows per frame.
    pub fn windows(
        segments: &'a [(usize, usize)],
        cu_window: &[usize],
        biases: &'a [Option<Tensor<B, 2>>],
        device: &B::Device,
    ) -> Self {
        let n = segments
            .iter()
            .map(|&(start, len)| start + len)
            .max()
            .unwrap_or(0);
        let mut window_of = vec![0usize; n];
        for (w, pair) in cu_window.windows(2).enumerate() {
            let end = pair[1].min(n);
            if pair[0] < end {
                window_of[pair[0]..end].fill(w);
            }
        }
        let mut ids = Vec::with_capacity(n);
        let mut next = 0i64;
        for &(start, len) in segments {
            let mut last = None;
            for &w in &window_of[start..start + len] {
                if last != Some(w) {
                    next += 1;
                    last = Some(w);
                }
                ids.push(next);
            }
        }
        Self {
            segments,
            biases: Some(biases),
            ids: group_ids(ids, device),
        }
    }
}

fn group_ids<B: Backend>(ids: Vec<i64>, device: &B::Device) -> Tensor<B, 2, Int> {
    let n = ids.len();
    Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), device).reshape([1, n])
}

/// Attention of a Qwen vision block: `qkv` `[N, 3·width]` split into heads, q and k rotated by
/// `rope` (for `[1, N, heads, head_dim]`, applied before the heads are moved forward, see
/// [`Rotary`]), non-causal attention within each of `groups`, softmax in f32; returns
/// `[N, width]`. On the GPU backends one flash kernel over every patch (the groups' ids as its
/// segments); elsewhere one composite per frame, with its window bias when given. Shared by the
/// Qwen2-VL, Qwen2.5-VL and Qwen3-VL towers.
pub fn segment_attention<B: Backend>(
    qkv: Tensor<B, 2>,
    heads: usize,
    rope: &Rotary<B>,
    groups: &PatchGroups<'_, B>,
) -> Tensor<B, 2> {
    let n = qkv.dims()[0];
    let width = qkv.dims()[1] / 3;
    let d = width / heads;
    let qkv = qkv.reshape([n, 3, heads, d]);
    let part = |i: usize| qkv.clone().narrow(1, i, 1).reshape([n, heads, d]);
    let rotated = |i: usize| {
        rope.apply(part(i).reshape([1, n, heads, d]))
            .reshape([n, heads, d])
            .swap_dims(0, 1)
    };
    let q = rotated(0);
    let k = rotated(1);
    let v = part(2).swap_dims(0, 1);
    let scale = 1.0 / (d as f64).sqrt();
    if crate::kernels::attention::available::<B>() {
        let rule = crate::layers::MaskRule {
            causal: false,
            window: None,
        };
        let batched = |t: Tensor<B, 3>| t.unsqueeze_dim::<4>(0);
        if let Some(out) = crate::kernels::attention::flash_attention(
            batched(q.clone()),
            batched(k.clone()),
            batched(v.clone()),
            &groups.ids,
            rule,
            scale,
        ) {
            return out
                .reshape([heads, n, d])
                .swap_dims(0, 1)
                .reshape([n, width]);
        }
    }
    let mut outs = Vec::with_capacity(groups.segments.len());
    for (s, &(start, len)) in groups.segments.iter().enumerate() {
        let qs = q.clone().narrow(1, start, len);
        let ks = k.clone().narrow(1, start, len);
        let vs = v.clone().narrow(1, start, len);
        let dtype = qs.dtype();
        let mut scores = (qs.matmul(ks.transpose()) * scale).cast(DType::F32);
        if let Some(Some(b)) = groups.biases.map(|b| &b[s]) {
            scores = scores + b.clone().cast(DType::F32).unsqueeze_dim(0);
        }
        outs.push(softmax(scores, 2).cast(dtype).matmul(vs));
    }
    Tensor::cat(outs, 1).swap_dims(0, 1).reshape([n, width])
}

/// The `[t, h, w]` grid of image `k`, checked to have three entries.
pub(crate) fn grid_thw(k: usize, img: &ProcessedImage) -> Result<[usize; 3]> {
    ensure!(
        img.grid.len() == 3,
        "image {k}: grid {:?} is not [t, h, w]",
        img.grid
    );
    Ok([img.grid[0], img.grid[1], img.grid[2]])
}

/// Concatenated pixel values `[Σ patches, patch_dim]` and `[t, h, w]` grids of processed
/// images, checked: a 3-entry grid, `patch_dim` values per patch, `h` and `w` multiples of
/// `merge`. Shared by the Qwen towers.
pub fn pixel_inputs<B: Backend>(
    images: &[ProcessedImage],
    dim: usize,
    m: usize,
    device: &B::Device,
) -> Result<(Tensor<B, 2>, Vec<[usize; 3]>)> {
    let mut values = Vec::new();
    let mut grids = Vec::with_capacity(images.len());
    for (k, img) in images.iter().enumerate() {
        let grid = grid_thw(k, img)?;
        let patches = grid[0] * grid[1] * grid[2];
        ensure!(
            img.pixel_values.len() == patches * dim,
            "image {k}: {} pixel values, grid {:?} needs {patches}×{dim}",
            img.pixel_values.len(),
            img.grid
        );
        ensure!(
            grid[1] % m == 0 && grid[2] % m == 0,
            "image {k}: grid {:?} is not divisible by the merge size {m}",
            img.grid
        );
        values.extend_from_slice(&img.pixel_values);
        grids.push(grid);
    }
    let rows = values.len() / dim;
    let t = Tensor::<B, 1>::from_data(TensorData::new(values, [rows * dim]), device)
        .reshape([rows, dim]);
    Ok((t, grids))
}

fn index_tensor<B: Backend>(idx: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    Tensor::from_data(
        TensorData::new(idx.iter().map(|&i| i as i64).collect(), [idx.len()]),
        device,
    )
}

/// `[len, len]` additive bias allowing attention only inside the windows (boundaries
/// `cu_window`, global patch indices) that lie in the frame `[start, start + len)`.
fn window_bias<B: Backend>(
    cu_window: &[usize],
    start: usize,
    len: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    let mut window_of = vec![0usize; len];
    for (w, pair) in cu_window.windows(2).enumerate() {
        for p in pair[0].max(start)..pair[1].min(start + len) {
            window_of[p - start] = w;
        }
    }
    let mut bias = Vec::with_capacity(len * len);
    for i in 0..len {
        for j in 0..len {
            bias.push(if window_of[i] == window_of[j] {
                0.0f32
            } else {
                MASKED
            });
        }
    }
    Tensor::<B, 1>::from_data(TensorData::new(bias, [len * len]), device).reshape([len, len])
}
