//! Attention that never materialises its `[L, T]` scores: a flash-attention forward (online
//! softmax over key tiles held in shared memory, FlashAttention-2's loop order: Dao, 2023) and
//! its backward (recomputed scores; one kernel for dQ, one for dK and dV), with grouped-query
//! heads and the mask computed from the keys' segment ids instead of read from a bias tensor.
//!
//! Semantics, those of the composite `softmax(q·kᵀ·scale + bias)·v` of
//! [`crate::layers::attention`] with the bias of [`crate::layers::causal_padding_window_bias`]:
//! query i of a batch row (absolute position `p = T − L + i`, segment `s_q = segments[p]`) sees
//! key j (segment `s_k = segments[j]`) when `s_k ≠ 0`, `s_q = 0` or `s_q = s_k`, and, if causal,
//! `j ≤ p` and with a window W `j > p − W`. Query head `h` reads kv head `h / group`. Scores,
//! the softmax and the accumulation are f32 whatever the inputs' dtype; the output is written
//! once in it. A query that sees no key (a padding position before the first real token) gets
//! the mean of every value, as the composite's uniform softmax over equal masked scores does;
//! its log-sum-exp is stored as `+∞` (3e38), so it passes no gradient (its output is padding,
//! which no loss reads).
//!
//! Layout: one cube per block of `BLOCK_Q` query rows of one kv head of one batch row (the
//! `group` query heads of a kv head are stacked along the rows, so their keys and values are
//! loaded once), one thread per query row; key tiles of [`tile`] keys are staged in shared
//! memory. The dK/dV kernel turns it around: one thread per key, query tiles staged. These are
//! CUDA-core ("unit") kernels; a tensor-core variant is a later step.

use burn::prelude::*;

/// Query rows per cube (one thread each) in the forward and the dQ pass; keys per cube in the
/// dK/dV pass.
#[cfg(any(feature = "cuda", feature = "vulkan"))]
pub(crate) const BLOCK_Q: usize = 32;
/// Keys (or, in the dK/dV pass, query rows) per shared-memory tile: 32, fewer for heads wider
/// than 128 so that the two f32 tiles stay at 32 KiB (CUDA's default limit is 48 KiB a cube).
#[cfg(any(feature = "cuda", feature = "vulkan"))]
pub(crate) fn tile(d: usize) -> usize {
    (4096 / d.max(1)).clamp(1, 32)
}

/// Which keys each query attends to (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MaskRule {
    /// Keys after the query's position are masked.
    pub causal: bool,
    /// Sliding window W: keys at or before `p − W` are masked (causal only).
    pub window: Option<usize>,
}

/// Whether `B` has the flash kernels (a cubecl backend, bare or under autodiff).
pub fn available<B: Backend>() -> bool {
    #[cfg(any(feature = "cuda", feature = "vulkan"))]
    {
        super::cube::bare_runtime::<B>().is_some() || super::cube::autodiff_runtime::<B>().is_some()
    }
    #[cfg(not(any(feature = "cuda", feature = "vulkan")))]
    {
        false
    }
}

/// `softmax(q·kᵀ·scale + mask)·v` with q `[b, heads, L, d]`, k and v `[b, kv_heads, ≥T, d]`
/// (a reserved KV cache may be longer: its first T positions are read) and `segments` `[b, T]`,
/// without materialising the scores; `None` where `B` has no kernel for it.
pub fn flash_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    segments: &Tensor<B, 2, Int>,
    rule: MaskRule,
    scale: f64,
) -> Option<Tensor<B, 4>> {
    #[cfg(any(feature = "cuda", feature = "vulkan"))]
    {
        if let Some(out) = super::on_cube!(B, R => gpu::forward_bare::<B, R>(q.clone(), k.clone(), v.clone(), segments, rule, scale))
        {
            return Some(out);
        }
        super::on_autodiff_cube!(B, R, C => gpu::forward_tracked::<B, R, C>(q, k, v, segments, rule, scale))
    }
    #[cfg(not(any(feature = "cuda", feature = "vulkan")))]
    {
        let _ = (q, k, v, segments, rule, scale);
        None
    }
}

#[cfg(any(feature = "cuda", feature = "vulkan"))]
pub(crate) mod gpu {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::prelude::*;
    use burn::tensor::DType;
    use burn::tensor::TensorPrimitive;
    use cubecl::prelude::{CubeCount, CubeDim};

    use super::{BLOCK_Q, MaskRule};
    use crate::kernels::cube::{
        Cube, CubeRuntime, CubeTensor, empty, from_tracked, int_primitive, primitive, tensor,
        tracked,
    };

    mod kernel {
        use cubecl::prelude::*;

        use super::super::BLOCK_Q;

        // The log-sum-exp stored for a query that sees no key is 3e38 (`exp(s − 3e38) = 0`); the
        // running maximum starts at −3e38.

        /// Whether a query at absolute position `p` in segment `seg_q` sees key `j` of segment `seg_k`.
        #[cube]
        fn visible(
            seg_q: u32,
            seg_k: u32,
            p: u32,
            j: u32,
            window: u32,
            #[comptime] causal: bool,
        ) -> bool {
            let mut ok = seg_k != 0;
            if seg_q != 0 && seg_q != seg_k {
                ok = false;
            }
            if causal {
                if j > p {
                    ok = false;
                }
                if window > 0 && j + window <= p {
                    ok = false;
                }
            }
            ok
        }

        /// The range `[lo, hi)` of keys any of the query rows `first..=last` of a cube can see
        /// (rows stack the group's heads, each `queries` long).
        #[cube]
        fn key_range(
            first: u32,
            last: u32,
            queries: u32,
            keys: u32,
            window: u32,
            #[comptime] causal: bool,
        ) -> (u32, u32) {
            let past = keys - queries;
            let mut i_min = first % queries;
            let mut i_max = last % queries;
            if first / queries != last / queries {
                i_min = 0;
                i_max = queries - 1;
            }
            let mut lo = 0u32;
            let mut hi = keys;
            if causal {
                hi = past + i_max + 1;
                if window > 0 && past + i_min + 1 > window {
                    lo = past + i_min + 1 - window;
                }
            }
            (lo, hi)
        }

        /// Forward: `out` `[b, L, heads, d]` (contiguous) and, when `with_lse`, `lse` `[b, heads, L]`.
        #[cube(launch)]
        #[allow(clippy::too_many_arguments)]
        pub(super) fn forward_kernel<F: Float, I: Int>(
            q: &Tensor<F>,
            k: &Tensor<F>,
            v: &Tensor<F>,
            segments: &Tensor<I>,
            out: &mut Tensor<F>,
            lse: &mut Tensor<f32>,
            queries: u32,
            keys: u32,
            window: u32,
            scale: f32,
            #[comptime] d: usize,
            #[comptime] tile: usize,
            #[comptime] group: usize,
            #[comptime] causal: bool,
            #[comptime] with_lse: bool,
            #[define(F, I)] _dtypes: [StorageType; 2],
        ) {
            let batch = CUBE_POS_Z as usize;
            let kv_head = CUBE_POS_Y as usize;
            let t = UNIT_POS_X as usize;
            let rows = group as u32 * queries;
            let first = CUBE_POS_X * BLOCK_Q as u32;
            let row = first + t as u32;
            let active = row < rows;
            let head = kv_head * group + (row / queries) as usize;
            let i = row % queries;
            let past = keys - queries;
            let p = past + i;
            let heads = group * k.shape(1);

            let mut seg_q = 0u32;
            let mut qr = Array::<f32>::new(d);
            let mut acc = Array::<f32>::new(d);
            let q_base = batch * q.stride(0) + head * q.stride(1) + i as usize * q.stride(2);
            for e in 0..d {
                acc[e] = 0.0;
                qr[e] = 0.0;
            }
            if active {
                seg_q = u32::cast_from(
                    segments[batch * segments.stride(0) + p as usize * segments.stride(1)],
                );
                for e in 0..d {
                    qr[e] = f32::cast_from(q[q_base + e * q.stride(3)]) * scale;
                }
            }
            let mut m = f32::new(-3.0e38);
            let mut l = 0.0f32;

            let last = min(first + BLOCK_Q as u32, rows) - 1;
            let (lo, hi) = key_range(first, last, queries, keys, window, causal);
            let k_base = batch * k.stride(0) + kv_head * k.stride(1);
            let v_base = batch * v.stride(0) + kv_head * v.stride(1);
            let mut ks = SharedMemory::<f32>::new(tile * d);
            let mut vs = SharedMemory::<f32>::new(tile * d);
            let mut segs = SharedMemory::<u32>::new(tile);

            let mut start = lo;
            while start < hi {
                let mut idx = t;
                while idx < tile * d {
                    let j = start + (idx / d) as u32;
                    let e = idx % d;
                    if j < hi {
                        ks[idx] =
                            f32::cast_from(k[k_base + j as usize * k.stride(2) + e * k.stride(3)]);
                        vs[idx] =
                            f32::cast_from(v[v_base + j as usize * v.stride(2) + e * v.stride(3)]);
                    }
                    idx += BLOCK_Q;
                }
                let mut jj = t;
                while jj < tile {
                    let j = start + jj as u32;
                    let mut s = 0u32;
                    if j < hi {
                        s = u32::cast_from(
                            segments[batch * segments.stride(0) + j as usize * segments.stride(1)],
                        );
                    }
                    segs[jj] = s;
                    jj += BLOCK_Q;
                }
                sync_cube();
                if active {
                    let n = min(tile as u32, hi - start) as usize;
                    for jj in 0..n {
                        let j = start + jj as u32;
                        if visible(seg_q, segs[jj], p, j, window, causal) {
                            let mut s = 0.0f32;
                            for e in 0..d {
                                s += qr[e] * ks[jj * d + e];
                            }
                            if s > m {
                                let correction = f32::exp(m - s);
                                l *= correction;
                                for e in 0..d {
                                    acc[e] *= correction;
                                }
                                m = s;
                            }
                            let w = f32::exp(s - m);
                            l += w;
                            for e in 0..d {
                                acc[e] += w * vs[jj * d + e];
                            }
                        }
                    }
                }
                sync_cube();
                start += tile as u32;
            }

            if active {
                let out_base = ((batch * queries as usize + i as usize) * heads + head) * d;
                let mut log_sum = 3.0e38f32;
                if l > f32::new(0.0) {
                    let inv = f32::recip(l);
                    for e in 0..d {
                        out[out_base + e] = F::cast_from(acc[e] * inv);
                    }
                    log_sum = m + f32::ln(l);
                } else {
                    // No visible key: the composite's softmax over equal masked scores is uniform.
                    let inv = f32::recip(f32::cast_from(keys));
                    for e in 0..d {
                        let mut sum = 0.0f32;
                        for j in 0..keys as usize {
                            sum += f32::cast_from(v[v_base + j * v.stride(2) + e * v.stride(3)]);
                        }
                        out[out_base + e] = F::cast_from(sum * inv);
                    }
                }
                if with_lse {
                    lse[(batch * heads + head) * queries as usize + i as usize] = log_sum;
                }
            }
        }

        /// dQ `[b, L, heads, d]` (contiguous) and `delta = rowsum(dO ∘ O)` `[b, heads, L]`.
        #[cube(launch)]
        #[allow(clippy::too_many_arguments)]
        pub(super) fn backward_query_kernel<F: Float, I: Int>(
            q: &Tensor<F>,
            k: &Tensor<F>,
            v: &Tensor<F>,
            segments: &Tensor<I>,
            out: &Tensor<F>,
            grad_out: &Tensor<F>,
            lse: &Tensor<f32>,
            grad_q: &mut Tensor<F>,
            delta: &mut Tensor<f32>,
            queries: u32,
            keys: u32,
            window: u32,
            scale: f32,
            #[comptime] d: usize,
            #[comptime] tile: usize,
            #[comptime] group: usize,
            #[comptime] causal: bool,
            #[define(F, I)] _dtypes: [StorageType; 2],
        ) {
            let batch = CUBE_POS_Z as usize;
            let kv_head = CUBE_POS_Y as usize;
            let t = UNIT_POS_X as usize;
            let rows = group as u32 * queries;
            let first = CUBE_POS_X * BLOCK_Q as u32;
            let row = first + t as u32;
            let active = row < rows;
            let head = kv_head * group + (row / queries) as usize;
            let i = row % queries;
            let past = keys - queries;
            let p = past + i;
            let heads = group * k.shape(1);

            let mut seg_q = 0u32;
            let mut qr = Array::<f32>::new(d);
            let mut gr = Array::<f32>::new(d);
            let mut dq = Array::<f32>::new(d);
            let mut row_lse = 3.0e38f32;
            let mut row_delta = 0.0f32;
            for e in 0..d {
                qr[e] = 0.0;
                gr[e] = 0.0;
                dq[e] = 0.0;
            }
            if active {
                let q_base = batch * q.stride(0) + head * q.stride(1) + i as usize * q.stride(2);
                let g_base = batch * grad_out.stride(0)
                    + head * grad_out.stride(1)
                    + i as usize * grad_out.stride(2);
                let o_base =
                    batch * out.stride(0) + head * out.stride(1) + i as usize * out.stride(2);
                seg_q = u32::cast_from(
                    segments[batch * segments.stride(0) + p as usize * segments.stride(1)],
                );
                for e in 0..d {
                    qr[e] = f32::cast_from(q[q_base + e * q.stride(3)]) * scale;
                    gr[e] = f32::cast_from(grad_out[g_base + e * grad_out.stride(3)]);
                    row_delta += gr[e] * f32::cast_from(out[o_base + e * out.stride(3)]);
                }
                let lse_index = (batch * heads + head) * queries as usize + i as usize;
                row_lse = lse[lse_index];
                delta[lse_index] = row_delta;
            }

            let last = min(first + BLOCK_Q as u32, rows) - 1;
            let (lo, hi) = key_range(first, last, queries, keys, window, causal);
            let k_base = batch * k.stride(0) + kv_head * k.stride(1);
            let v_base = batch * v.stride(0) + kv_head * v.stride(1);
            let mut ks = SharedMemory::<f32>::new(tile * d);
            let mut vs = SharedMemory::<f32>::new(tile * d);
            let mut segs = SharedMemory::<u32>::new(tile);

            let mut start = lo;
            while start < hi {
                let mut idx = t;
                while idx < tile * d {
                    let j = start + (idx / d) as u32;
                    let e = idx % d;
                    if j < hi {
                        ks[idx] =
                            f32::cast_from(k[k_base + j as usize * k.stride(2) + e * k.stride(3)]);
                        vs[idx] =
                            f32::cast_from(v[v_base + j as usize * v.stride(2) + e * v.stride(3)]);
                    }
                    idx += BLOCK_Q;
                }
                let mut jj = t;
                while jj < tile {
                    let j = start + jj as u32;
                    let mut s = 0u32;
                    if j < hi {
                        s = u32::cast_from(
                            segments[batch * segments.stride(0) + j as usize * segments.stride(1)],
                        );
                    }
                    segs[jj] = s;
                    jj += BLOCK_Q;
                }
                sync_cube();
                if active {
                    let n = min(tile as u32, hi - start) as usize;
                    for jj in 0..n {
                        let j = start + jj as u32;
                        if visible(seg_q, segs[jj], p, j, window, causal) {
                            let mut s = 0.0f32;
                            let mut dp = 0.0f32;
                            for e in 0..d {
                                s += qr[e] * ks[jj * d + e];
                                dp += gr[e] * vs[jj * d + e];
                            }
                            let ds = f32::exp(s - row_lse) * (dp - row_delta);
                            for e in 0..d {
                                dq[e] += ds * ks[jj * d + e];
                            }
                        }
                    }
                }
                sync_cube();
                start += tile as u32;
            }

            if active {
                let base = ((batch * queries as usize + i as usize) * heads + head) * d;
                for e in 0..d {
                    grad_q[base + e] = F::cast_from(dq[e] * scale);
                }
            }
        }

        /// dK and dV `[b, kv_heads, T, d]` (contiguous): one thread per key, the query rows of the
        /// group's heads staged tile by tile.
        #[cube(launch)]
        #[allow(clippy::too_many_arguments)]
        pub(super) fn backward_key_kernel<F: Float, I: Int>(
            q: &Tensor<F>,
            k: &Tensor<F>,
            v: &Tensor<F>,
            segments: &Tensor<I>,
            grad_out: &Tensor<F>,
            lse: &Tensor<f32>,
            delta: &Tensor<f32>,
            grad_k: &mut Tensor<F>,
            grad_v: &mut Tensor<F>,
            queries: u32,
            keys: u32,
            window: u32,
            scale: f32,
            #[comptime] d: usize,
            #[comptime] tile: usize,
            #[comptime] group: usize,
            #[comptime] causal: bool,
            #[define(F, I)] _dtypes: [StorageType; 2],
        ) {
            let batch = CUBE_POS_Z as usize;
            let kv_head = CUBE_POS_Y as usize;
            let kv_heads = k.shape(1);
            let heads = group * kv_heads;
            let t = UNIT_POS_X as usize;
            let first_key = CUBE_POS_X * BLOCK_Q as u32;
            let j = first_key + t as u32;
            let active = j < keys;
            let past = keys - queries;

            let mut kr = Array::<f32>::new(d);
            let mut vr = Array::<f32>::new(d);
            let mut dk = Array::<f32>::new(d);
            let mut dv = Array::<f32>::new(d);
            let mut seg_k = 0u32;
            for e in 0..d {
                kr[e] = 0.0;
                vr[e] = 0.0;
                dk[e] = 0.0;
                dv[e] = 0.0;
            }
            if active {
                let k_base = batch * k.stride(0) + kv_head * k.stride(1) + j as usize * k.stride(2);
                let v_base = batch * v.stride(0) + kv_head * v.stride(1) + j as usize * v.stride(2);
                seg_k = u32::cast_from(
                    segments[batch * segments.stride(0) + j as usize * segments.stride(1)],
                );
                for e in 0..d {
                    kr[e] = f32::cast_from(k[k_base + e * k.stride(3)]);
                    vr[e] = f32::cast_from(v[v_base + e * v.stride(3)]);
                }
            }

            // Queries that can see a key of this block: causal ones at or after the first key,
            // windowed ones before the last key + W.
            let last_key = min(first_key + BLOCK_Q as u32, keys) - 1;
            let mut i_lo = 0u32;
            let mut i_hi = queries;
            if causal {
                if first_key > past {
                    i_lo = first_key - past;
                }
                if window > 0 {
                    let end = last_key + window;
                    if end <= past {
                        i_hi = 0;
                    } else {
                        i_hi = min(queries, end - past);
                    }
                }
            }

            let mut qs = SharedMemory::<f32>::new(tile * d);
            let mut gs = SharedMemory::<f32>::new(tile * d);
            let mut lses = SharedMemory::<f32>::new(tile);
            let mut deltas = SharedMemory::<f32>::new(tile);
            let mut segs = SharedMemory::<u32>::new(tile);

            for g in 0..group {
                let head = kv_head * group + g;
                let mut start = i_lo;
                while start < i_hi {
                    let mut idx = t;
                    while idx < tile * d {
                        let i = start + (idx / d) as u32;
                        let e = idx % d;
                        if i < i_hi {
                            qs[idx] = f32::cast_from(
                                q[batch * q.stride(0)
                                    + head * q.stride(1)
                                    + i as usize * q.stride(2)
                                    + e * q.stride(3)],
                            ) * scale;
                            gs[idx] = f32::cast_from(
                                grad_out[batch * grad_out.stride(0)
                                    + head * grad_out.stride(1)
                                    + i as usize * grad_out.stride(2)
                                    + e * grad_out.stride(3)],
                            );
                        }
                        idx += BLOCK_Q;
                    }
                    let mut rr = t;
                    while rr < tile {
                        let i = start + rr as u32;
                        if i < i_hi {
                            let index = (batch * heads + head) * queries as usize + i as usize;
                            lses[rr] = lse[index];
                            deltas[rr] = delta[index];
                            segs[rr] = u32::cast_from(
                                segments[batch * segments.stride(0)
                                    + (past + i) as usize * segments.stride(1)],
                            );
                        }
                        rr += BLOCK_Q;
                    }
                    sync_cube();
                    if active {
                        let n = min(tile as u32, i_hi - start) as usize;
                        for rr in 0..n {
                            let p = past + start + rr as u32;
                            if visible(segs[rr], seg_k, p, j, window, causal) {
                                let mut s = 0.0f32;
                                let mut dp = 0.0f32;
                                for e in 0..d {
                                    s += qs[rr * d + e] * kr[e];
                                    dp += gs[rr * d + e] * vr[e];
                                }
                                let prob = f32::exp(s - lses[rr]);
                                let ds = prob * (dp - deltas[rr]);
                                for e in 0..d {
                                    dv[e] += prob * gs[rr * d + e];
                                    dk[e] += ds * qs[rr * d + e];
                                }
                            }
                        }
                    }
                    sync_cube();
                    start += tile as u32;
                }
            }

            if active {
                let base = ((batch * kv_heads + kv_head) * keys as usize + j as usize) * d;
                for e in 0..d {
                    grad_k[base + e] = F::cast_from(dk[e]);
                    grad_v[base + e] = F::cast_from(dv[e]);
                }
            }
        }
    }

    /// The kernels' common sizes, checked.
    #[derive(Debug, Clone, Copy)]
    struct Sizes {
        batch: usize,
        heads: usize,
        kv_heads: usize,
        queries: usize,
        keys: usize,
        d: usize,
    }

    impl Sizes {
        fn of<R: CubeRuntime>(
            q: &CubeTensor<R>,
            k: &CubeTensor<R>,
            segments: &CubeTensor<R>,
        ) -> Self {
            let [batch, heads, queries, d] = dims4(q);
            let [_, kv_heads, _, _] = dims4(k);
            let keys = segments.meta.shape()[1];
            assert!(
                heads % kv_heads == 0 && keys >= queries && k.meta.shape()[2] >= keys,
                "flash attention: {heads} heads over {kv_heads} kv heads, {queries} queries, \
                 {keys} keys, {} cached",
                k.meta.shape()[2]
            );
            Self {
                batch,
                heads,
                kv_heads,
                queries,
                keys,
                d,
            }
        }

        fn group(&self) -> usize {
            self.heads / self.kv_heads
        }

        /// One cube per `BLOCK_Q` stacked query rows of one kv head of one batch row.
        fn query_cubes(&self) -> CubeCount {
            let blocks = (self.group() * self.queries).div_ceil(BLOCK_Q);
            CubeCount::Static(blocks as u32, self.kv_heads as u32, self.batch as u32)
        }

        /// One cube per `BLOCK_Q` keys of one kv head of one batch row.
        fn key_cubes(&self) -> CubeCount {
            let blocks = self.keys.div_ceil(BLOCK_Q);
            CubeCount::Static(blocks as u32, self.kv_heads as u32, self.batch as u32)
        }
    }

    fn dims4<R: CubeRuntime>(t: &CubeTensor<R>) -> [usize; 4] {
        let s = t.meta.shape();
        [s[0], s[1], s[2], s[3]]
    }

    /// `[b, L, heads, d]` contiguous seen as `[b, heads, L, d]` (dims 1 and 2 swapped).
    fn heads_forward<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
        Tensor::<Cube<R>, 4>::from_primitive(TensorPrimitive::Float(t))
            .swap_dims(1, 2)
            .into_primitive()
            .tensor()
    }

    /// The forward on the runtime's tensors: the output `[b, heads, L, d]` (a view of a
    /// contiguous `[b, L, heads, d]`) and, when asked, the log-sum-exp `[b, heads, L]`.
    fn forward<R: CubeRuntime>(
        q: &CubeTensor<R>,
        k: &CubeTensor<R>,
        v: &CubeTensor<R>,
        segments: &CubeTensor<R>,
        rule: MaskRule,
        scale: f64,
        with_lse: bool,
    ) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
        let s = Sizes::of(q, k, segments);
        let out = empty(q, vec![s.batch, s.queries, s.heads, s.d], q.dtype);
        let lse = empty(
            q,
            if with_lse {
                vec![s.batch, s.heads, s.queries]
            } else {
                vec![1]
            },
            DType::F32,
        );
        kernel::forward_kernel::launch::<R>(
            &q.client,
            s.query_cubes(),
            CubeDim::new_1d(BLOCK_Q as u32),
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            segments.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            s.queries as u32,
            s.keys as u32,
            rule.window.unwrap_or(0) as u32,
            scale as f32,
            s.d,
            super::tile(s.d),
            s.group(),
            rule.causal,
            with_lse,
            [q.dtype.into(), segments.dtype.into()],
        );
        (heads_forward(out), with_lse.then_some(lse))
    }

    /// The gradients of q, k and v (in their dtype: q's `[b, heads, L, d]` as a view of a
    /// contiguous `[b, L, heads, d]`, k's and v's `[b, kv_heads, T, d]` contiguous).
    #[allow(clippy::too_many_arguments)]
    fn backward<R: CubeRuntime>(
        q: &CubeTensor<R>,
        k: &CubeTensor<R>,
        v: &CubeTensor<R>,
        segments: &CubeTensor<R>,
        out: &CubeTensor<R>,
        lse: &CubeTensor<R>,
        grad_out: &CubeTensor<R>,
        rule: MaskRule,
        scale: f64,
    ) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
        let s = Sizes::of(q, k, segments);
        let grad_q = empty(q, vec![s.batch, s.queries, s.heads, s.d], q.dtype);
        let delta = empty(q, vec![s.batch, s.heads, s.queries], DType::F32);
        let window = rule.window.unwrap_or(0) as u32;
        kernel::backward_query_kernel::launch::<R>(
            &q.client,
            s.query_cubes(),
            CubeDim::new_1d(BLOCK_Q as u32),
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            segments.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            grad_out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            grad_q.clone().into_tensor_arg(),
            delta.clone().into_tensor_arg(),
            s.queries as u32,
            s.keys as u32,
            window,
            scale as f32,
            s.d,
            super::tile(s.d),
            s.group(),
            rule.causal,
            [q.dtype.into(), segments.dtype.into()],
        );
        let grad_k = empty(k, vec![s.batch, s.kv_heads, s.keys, s.d], k.dtype);
        let grad_v = empty(v, vec![s.batch, s.kv_heads, s.keys, s.d], v.dtype);
        kernel::backward_key_kernel::launch::<R>(
            &q.client,
            s.key_cubes(),
            CubeDim::new_1d(BLOCK_Q as u32),
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            segments.clone().into_tensor_arg(),
            grad_out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            delta.into_tensor_arg(),
            grad_k.clone().into_tensor_arg(),
            grad_v.clone().into_tensor_arg(),
            s.queries as u32,
            s.keys as u32,
            window,
            scale as f32,
            s.d,
            super::tile(s.d),
            s.group(),
            rule.causal,
            [q.dtype.into(), segments.dtype.into()],
        );
        (heads_forward(grad_q), grad_k, grad_v)
    }

    /// The forward on a bare cubecl backend (no gradient).
    pub(super) fn forward_bare<B: Backend, R: CubeRuntime>(
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        segments: &Tensor<B, 2, Int>,
        rule: MaskRule,
        scale: f64,
    ) -> Tensor<B, 4> {
        let (out, _) = forward::<R>(
            &primitive::<B, R, 4>(q),
            &primitive::<B, R, 4>(k),
            &primitive::<B, R, 4>(v),
            &int_primitive::<B, R, 2>(segments.clone()),
            rule,
            scale,
            false,
        );
        tensor::<B, R, 4>(out)
    }

    /// The backward op: the gradients of q, k and v from the recomputed scores.
    #[derive(Debug)]
    struct FlashBackward;

    /// What the backward keeps: q, k and v (checkpointed), the segments, the output and its
    /// log-sum-exp, the rule and the scale.
    type FlashState<R> = (
        NodeId,
        NodeId,
        NodeId,
        CubeTensor<R>,
        CubeTensor<R>,
        CubeTensor<R>,
        MaskRule,
        f64,
    );

    impl<R: CubeRuntime> Backward<Cube<R>, 3> for FlashBackward {
        type State = FlashState<R>;

        fn backward(
            self,
            ops: Ops<Self::State, 3>,
            grads: &mut Gradients,
            checkpointer: &mut Checkpointer,
        ) {
            let [node_q, node_k, node_v] = ops.parents;
            let grad_out = grads.consume::<Cube<R>>(&ops.node);
            let (q_id, k_id, v_id, segments, out, lse, rule, scale) = ops.state;
            let q: CubeTensor<R> = checkpointer.retrieve_node_output(q_id);
            let k: CubeTensor<R> = checkpointer.retrieve_node_output(k_id);
            let v: CubeTensor<R> = checkpointer.retrieve_node_output(v_id);
            let (grad_q, grad_k, grad_v) =
                backward::<R>(&q, &k, &v, &segments, &out, &lse, &grad_out, rule, scale);
            let keys = segments.meta.shape()[1];
            // A reserved cache is never differentiated, but k and v may be longer than the
            // keys read; their gradient beyond is 0.
            let pad = |g: CubeTensor<R>, like: &CubeTensor<R>| -> CubeTensor<R> {
                if like.meta.shape()[2] == keys {
                    return g;
                }
                let full = Tensor::<Cube<R>, 4>::zeros(
                    like.meta.shape().to_vec(),
                    (&like.device, like.dtype),
                );
                let [b, h, _, d] = dims4(&g);
                full.slice_assign(
                    [0..b, 0..h, 0..keys, 0..d],
                    Tensor::from_primitive(TensorPrimitive::Float(g)),
                )
                .into_primitive()
                .tensor()
            };
            if let Some(node) = node_q {
                grads.register::<Cube<R>>(node.id, grad_q);
            }
            if let Some(node) = node_k {
                grads.register::<Cube<R>>(node.id, pad(grad_k, &k));
            }
            if let Some(node) = node_v {
                grads.register::<Cube<R>>(node.id, pad(grad_v, &v));
            }
        }
    }

    /// The forward under burn's autodiff: a compute-bound op whose backward is
    /// [`FlashBackward`].
    pub(super) fn forward_tracked<B: Backend, R: CubeRuntime, C: CheckpointStrategy>(
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        segments: &Tensor<B, 2, Int>,
        rule: MaskRule,
        scale: f64,
    ) -> Tensor<B, 4> {
        type AD<R, C> = Autodiff<Cube<R>, C>;
        let (q, k, v) = (
            tracked::<B, AD<R, C>, 4>(q),
            tracked::<B, AD<R, C>, 4>(k),
            tracked::<B, AD<R, C>, 4>(v),
        );
        let segments: Tensor<AD<R, C>, 2, Int> = crate::kernels::switch::cast(segments.clone());
        let segments: CubeTensor<R> = segments.into_primitive();
        let out = match FlashBackward
            .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let (q_id, k_id, v_id) = (
                    prep.checkpoint(&q),
                    prep.checkpoint(&k),
                    prep.checkpoint(&v),
                );
                let (out, lse) = forward::<R>(
                    &q.primitive,
                    &k.primitive,
                    &v.primitive,
                    &segments,
                    rule,
                    scale,
                    true,
                );
                let lse = lse.expect("asked for the log-sum-exp");
                prep.finish(
                    (q_id, k_id, v_id, segments, out.clone(), lse, rule, scale),
                    out,
                )
            }
            OpsKind::UnTracked(prep) => {
                let (out, _) = forward::<R>(
                    &q.primitive,
                    &k.primitive,
                    &v.primitive,
                    &segments,
                    rule,
                    scale,
                    false,
                );
                prep.finish(out)
            }
        };
        from_tracked::<B, AD<R, C>, 4>(out)
    }
}
