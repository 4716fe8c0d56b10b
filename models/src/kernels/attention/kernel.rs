//! The `#[cube]` kernels: the forward (online softmax over shared-memory key tiles), the dQ pass
//! and the dK/dV pass, with the mask computed from the keys' segment ids.

use cubecl::prelude::*;

use super::params::BLOCK_Q;

// The log-sum-exp stored for a query that sees no key is 3e38 (`exp(s − 3e38) = 0`); the
// running maximum starts at −3e38.

/// Whether a query at absolute position `p` in segment `seg_q` sees key `j` of segment `seg_k`.
#[cube]
fn visible(seg_q: u32, seg_k: u32, p: u32, j: u32, window: u32, #[comptime] causal: bool) -> bool {
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
        seg_q =
            u32::cast_from(segments[batch * segments.stride(0) + p as usize * segments.stride(1)]);
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
                ks[idx] = f32::cast_from(k[k_base + j as usize * k.stride(2) + e * k.stride(3)]);
                vs[idx] = f32::cast_from(v[v_base + j as usize * v.stride(2) + e * v.stride(3)]);
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
        let o_base = batch * out.stride(0) + head * out.stride(1) + i as usize * out.stride(2);
        seg_q =
            u32::cast_from(segments[batch * segments.stride(0) + p as usize * segments.stride(1)]);
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
                ks[idx] = f32::cast_from(k[k_base + j as usize * k.stride(2) + e * k.stride(3)]);
                vs[idx] = f32::cast_from(v[v_base + j as usize * v.stride(2) + e * v.stride(3)]);
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
        seg_k =
            u32::cast_from(segments[batch * segments.stride(0) + j as usize * segments.stride(1)]);
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
                        segments
                            [batch * segments.stride(0) + (past + i) as usize * segments.stride(1)],
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
