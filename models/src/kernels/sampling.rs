//! Token sampling where the logits are: one cube per row chooses the next token and its
//! log-prob with the rule of [`crate::sampling`] (temperature, top-k, top-p, greedy, suppressed
//! tokens, the counter-based uniform of [`crate::sampling::uniform`]), so a decoding step reads
//! back `[rows, 3]` floats (token id, log-prob, keep threshold) instead of `[rows, vocab]`
//! logits.
//!
//! Per row, 256 threads: a strided pass for the maximum (greedy: the lowest id among equal
//! maxima) and a NaN check, one for `Z = Σ exp((x − max)/T)`; with top-k or top-p, a bisection
//! of the threshold over the order-preserving integer keys of the values (at most 32 counting
//! or summing passes each; it ends on a logit value); then the draw: each thread sums the kept weights of a contiguous chunk of
//! ids, thread 0 scans the chunk sums and walks the chunk where the cumulative weight passes
//! `u · Σ kept`.

use burn::prelude::*;

use crate::sampling::SamplingConfig;

/// Chosen tokens and their log-probs, on the device: `ids` `[rows]` (the next step's input) and
/// `picked` `[rows, 3]` for the host: the id as f32 (or an error code of
/// [`crate::sampling::device_error`]), its log-prob, and the keep threshold top-k and top-p set
/// (the smallest scaled logit kept; −3e38 when every token is kept), which the tests compare
/// with [`crate::sampling::threshold`].
pub struct DeviceSample<B: Backend> {
    pub ids: Tensor<B, 1, Int>,
    pub picked: Tensor<B, 2>,
}

/// Samples one token per row of `logits` `[rows, vocab]`: row r draws `uniform(seed_r,
/// position)` with its seed as four 16-bit parts `seeds[r]` (low first); the first `suppressed`
/// ids of `suppress` never come. `None` where `B` has no kernel.
pub fn sample_on_device<B: Backend>(
    logits: &Tensor<B, 2>,
    seeds: &Tensor<B, 2, Int>,
    position: usize,
    config: &SamplingConfig,
    suppress: &Tensor<B, 1, Int>,
    suppressed: usize,
) -> Option<DeviceSample<B>> {
    #[cfg(any(feature = "cuda", feature = "vulkan"))]
    {
        super::on_cube!(B, R => gpu::sample::<B, R>(logits, seeds, position, config, suppress, suppressed))
    }
    #[cfg(not(any(feature = "cuda", feature = "vulkan")))]
    {
        let _ = (logits, seeds, position, config, suppress, suppressed);
        None
    }
}

#[cfg(any(feature = "cuda", feature = "vulkan"))]
mod gpu {
    use burn::prelude::*;
    use burn::tensor::{DType, Shape};
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::ops::numeric::empty_device_dtype;
    use cubecl::prelude::CubeDim;

    use super::DeviceSample;
    use crate::kernels::cube::{Cube, CubeRuntime, cube_count_1d, int_primitive, primitive};
    use crate::sampling::SamplingConfig;
    use kernel::THREADS;

    mod kernel {
        use cubecl::prelude::*;

        pub(super) const THREADS: usize = 256;
        // Scaled logits at or below -3e38 (suppressed tokens, -inf) are masked.

        /// The counter-based hash of [`crate::sampling::uniform`] (Wellons' lowbias32).
        #[cube]
        fn mix(x: u32) -> u32 {
            let mut h = x;
            h ^= h >> 16;
            h *= 0x7feb352du32;
            h ^= h >> 15;
            h *= 0x846ca68bu32;
            h ^= h >> 16;
            h
        }

        /// An order-preserving integer key of an f32: `a < b` ⇔ `key(a) < key(b)` (finite values).
        #[cube]
        fn order_key(y: f32) -> u32 {
            let bits = u32::reinterpret(y);
            let mut key = bits | 0x8000_0000u32;
            if bits >= 0x8000_0000u32 {
                key = bits ^ 0xffff_ffffu32;
            }
            key
        }

        /// The f32 of an [`order_key`].
        #[cube]
        fn from_order_key(key: u32) -> f32 {
            let mut bits = key ^ 0xffff_ffffu32;
            if key >= 0x8000_0000u32 {
                bits = key & 0x7fff_ffffu32;
            }
            f32::reinterpret(bits)
        }

        /// `[0, 1)` with 24 bits, as [`crate::sampling::uniform`].
        #[cube]
        fn uniform(seed_lo: u32, seed_hi: u32, position: u32) -> f32 {
            let h = mix(seed_lo ^ mix(seed_hi ^ mix(position ^ 0x9e3779b9u32)));
            f32::cast_from(h >> 8) * 5.960_464_5e-8f32
        }

        /// The scaled logit of token `i` (−3e38 when suppressed or −∞).
        #[cube]
        fn scaled<I: Int>(
            logits: &Tensor<f32>,
            base: usize,
            i: usize,
            inv_t: f32,
            suppress: &Tensor<I>,
            suppressed: u32,
        ) -> f32 {
            let x = logits[base + i];
            let mut y = x * inv_t;
            for s in 0..suppressed as usize {
                if u32::cast_from(suppress[s]) == i as u32 {
                    y = f32::new(-3.0e38);
                }
            }
            if y < f32::new(-3.0e38) {
                y = f32::new(-3.0e38);
            }
            y
        }

        /// Σ over the cube of `value` (every thread gets the sum).
        #[cube]
        fn cube_sum(value: f32, shared: &mut SharedMemory<f32>, t: usize) -> f32 {
            shared[t] = value;
            sync_cube();
            let mut stride = (CUBE_DIM_X / 2) as usize;
            while stride > 0 {
                if t < stride {
                    shared[t] = shared[t] + shared[t + stride];
                }
                sync_cube();
                stride /= 2;
            }
            let total = shared[0];
            sync_cube();
            total
        }

        #[cube(launch)]
        #[allow(clippy::too_many_arguments)]
        pub(super) fn sample_kernel<I: Int>(
            logits: &Tensor<f32>,
            seeds: &Tensor<I>,
            suppress: &Tensor<I>,
            ids: &mut Tensor<I>,
            picked: &mut Tensor<f32>,
            rows: u32,
            vocab: u32,
            suppressed: u32,
            position: u32,
            inv_t: f32,
            top_k: u32,
            top_p: f32,
            #[comptime] greedy: bool,
            #[define(I)] _dtype: StorageType,
        ) {
            let row = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
            if row >= rows {
                terminate!();
            }
            let t = UNIT_POS_X as usize;
            let v = vocab as usize;
            let base = row as usize * v;
            let mut shared = SharedMemory::<f32>::new(THREADS);
            let mut shared_index = SharedMemory::<u32>::new(THREADS);

            // Maximum (lowest id among ties), NaN check.
            let mut best = f32::new(-3.0e38);
            let mut best_id = vocab;
            let mut nan = 0.0f32;
            let mut i = t;
            while i < v {
                let x = logits[base + i];
                if f32::is_nan(x) {
                    nan = 1.0;
                }
                let y = scaled::<I>(logits, base, i, inv_t, suppress, suppressed);
                if y > best {
                    best = y;
                    best_id = i as u32;
                }
                i += THREADS;
            }
            shared[t] = best;
            shared_index[t] = best_id;
            sync_cube();
            let mut stride = (CUBE_DIM_X / 2) as usize;
            while stride > 0 {
                if t < stride {
                    let (a, b) = (shared[t], shared[t + stride]);
                    let (ia, ib) = (shared_index[t], shared_index[t + stride]);
                    if b > a || (b == a && ib < ia) {
                        shared[t] = b;
                        shared_index[t] = ib;
                    }
                }
                sync_cube();
                stride /= 2;
            }
            let max = shared[0];
            let argmax = shared_index[0];
            sync_cube();
            let any_nan = cube_sum(nan, &mut shared, t);

            // Z = Σ exp(y − max).
            let mut z = 0.0f32;
            let mut i = t;
            while i < v {
                let y = scaled::<I>(logits, base, i, inv_t, suppress, suppressed);
                if y > f32::new(-3.0e38) {
                    z += f32::exp(y - max);
                }
                i += THREADS;
            }
            let total = cube_sum(z, &mut shared, t);

            // Threshold: keep the tokens whose scaled logit is ≥ `keep`, found by bisection over the
            // order-preserving integer keys of the values (≤ 32 steps, ends on a logit value).
            let mut keep = f32::new(-3.0e38);
            let top_k_on = top_k > 0 && top_k < vocab;
            if !greedy && (top_k_on || top_p < f32::new(1.0)) {
                let mut smallest = max;
                let mut i = t;
                while i < v {
                    let y = scaled::<I>(logits, base, i, inv_t, suppress, suppressed);
                    if y > f32::new(-3.0e38) && y < smallest {
                        smallest = y;
                    }
                    i += THREADS;
                }
                shared[t] = smallest;
                sync_cube();
                let mut stride = (CUBE_DIM_X / 2) as usize;
                while stride > 0 {
                    if t < stride && shared[t + stride] < shared[t] {
                        shared[t] = shared[t + stride];
                    }
                    sync_cube();
                    stride /= 2;
                }
                let smallest = shared[0];
                sync_cube();
                keep = smallest;
                if top_k_on {
                    // The largest value with at least top_k tokens at or above it.
                    let mut lo = order_key(smallest);
                    let mut hi = order_key(max);
                    while lo < hi {
                        let mid = lo + ((hi - lo + 1) >> 1);
                        let mut count = 0.0f32;
                        let mut i = t;
                        while i < v {
                            let y = scaled::<I>(logits, base, i, inv_t, suppress, suppressed);
                            if y > f32::new(-3.0e38) && order_key(y) >= mid {
                                count += 1.0;
                            }
                            i += THREADS;
                        }
                        if cube_sum(count, &mut shared, t) >= f32::cast_from(top_k) {
                            lo = mid;
                        } else {
                            hi = mid - 1;
                        }
                    }
                    keep = from_order_key(lo);
                }
                if top_p < f32::new(1.0) {
                    // The largest value whose tokens at or above it hold top_p of the kept mass.
                    let mut kept = 0.0f32;
                    let mut i = t;
                    while i < v {
                        let y = scaled::<I>(logits, base, i, inv_t, suppress, suppressed);
                        if y >= keep && y > f32::new(-3.0e38) {
                            kept += f32::exp(y - max);
                        }
                        i += THREADS;
                    }
                    let target = cube_sum(kept, &mut shared, t) * top_p;
                    let mut lo = order_key(keep);
                    let mut hi = order_key(max);
                    while lo < hi {
                        let mid = lo + ((hi - lo + 1) >> 1);
                        let mut mass = 0.0f32;
                        let mut i = t;
                        while i < v {
                            let y = scaled::<I>(logits, base, i, inv_t, suppress, suppressed);
                            if y >= keep && y > f32::new(-3.0e38) && order_key(y) >= mid {
                                mass += f32::exp(y - max);
                            }
                            i += THREADS;
                        }
                        if cube_sum(mass, &mut shared, t) >= target {
                            lo = mid;
                        } else {
                            hi = mid - 1;
                        }
                    }
                    keep = from_order_key(lo);
                }
            }

            // The draw, in id order: chunk sums, a scan by thread 0, a walk of one chunk.
            let chunk = v.div_ceil(THREADS);
            let first = t * chunk;
            let mut chunk_mass = 0.0f32;
            if !greedy {
                let mut i = first;
                while i < min(first + chunk, v) {
                    let y = scaled::<I>(logits, base, i, inv_t, suppress, suppressed);
                    if y >= keep && y > f32::new(-3.0e38) {
                        chunk_mass += f32::exp(y - max);
                    }
                    i += 1;
                }
            }
            shared[t] = chunk_mass;
            sync_cube();
            if t == 0 {
                let mut token = argmax;
                if !greedy {
                    let mut kept = 0.0f32;
                    for c in 0..THREADS {
                        kept += shared[c];
                    }
                    let part = row as usize * 4;
                    let seed_lo =
                        u32::cast_from(seeds[part]) | (u32::cast_from(seeds[part + 1]) << 16);
                    let seed_hi =
                        u32::cast_from(seeds[part + 2]) | (u32::cast_from(seeds[part + 3]) << 16);
                    let u = uniform(seed_lo, seed_hi, position);
                    let mut rest = u * kept;
                    let mut c = 0usize;
                    let mut found = false;
                    while c < THREADS && !found {
                        if rest < shared[c] {
                            found = true;
                        } else {
                            rest -= shared[c];
                            c += 1;
                        }
                    }
                    if !found {
                        // Rounding at the very end: the last chunk with weight.
                        c = THREADS - 1;
                        while c > 0 && shared[c] <= f32::new(0.0) {
                            c -= 1;
                        }
                        rest = shared[c];
                    }
                    let start = c * chunk;
                    let end = min(start + chunk, v);
                    let mut i = start;
                    let mut last_kept = start;
                    let mut chosen = false;
                    while i < end && !chosen {
                        let y = scaled::<I>(logits, base, i, inv_t, suppress, suppressed);
                        if y >= keep && y > f32::new(-3.0e38) {
                            last_kept = i;
                            let w = f32::exp(y - max);
                            if rest < w {
                                chosen = true;
                            } else {
                                rest -= w;
                            }
                        }
                        i += 1;
                    }
                    token = last_kept as u32;
                }
                let y = scaled::<I>(logits, base, token as usize, inv_t, suppress, suppressed);
                let mut log_prob = y - max - f32::ln(total);
                let mut id = f32::cast_from(token);
                if any_nan > f32::new(0.0) {
                    id = -1.0f32; // ERROR_NAN
                } else if max <= f32::new(-3.0e38) {
                    id = -2.0f32; // ERROR_ALL_MASKED
                    log_prob = 0.0;
                }
                ids[row as usize] = I::cast_from(token);
                picked[row as usize * 3] = id;
                picked[row as usize * 3 + 1] = log_prob;
                picked[row as usize * 3 + 2] = keep;
            }
        }
    }

    pub(super) fn sample<B: Backend, R: CubeRuntime>(
        logits: &Tensor<B, 2>,
        seeds: &Tensor<B, 2, Int>,
        position: usize,
        config: &SamplingConfig,
        suppress: &Tensor<B, 1, Int>,
        suppressed: usize,
    ) -> DeviceSample<B> {
        let logits = into_contiguous(primitive::<B, R, 2>(logits.clone().cast(DType::F32)));
        let seeds = into_contiguous(int_primitive::<B, R, 2>(seeds.clone()));
        let suppress = int_primitive::<B, R, 1>(suppress.clone());
        let [rows, vocab] = [logits.meta.shape()[0], logits.meta.shape()[1]];
        let ids = empty_device_dtype::<R>(
            logits.client.clone(),
            logits.device.clone(),
            Shape::from(vec![rows]),
            seeds.dtype,
        );
        let picked = empty_device_dtype::<R>(
            logits.client.clone(),
            logits.device.clone(),
            Shape::from(vec![rows, 3]),
            DType::F32,
        );
        // Greedy decoding reports the log-prob at temperature 1 (crate::sampling).
        let inv_t = if config.greedy {
            1.0
        } else {
            1.0 / config.temperature
        };
        let int_dtype = seeds.dtype;
        kernel::sample_kernel::launch::<R>(
            &logits.client.clone(),
            cube_count_1d(rows),
            CubeDim::new_1d(THREADS as u32),
            logits.into_tensor_arg(),
            seeds.into_tensor_arg(),
            suppress.into_tensor_arg(),
            ids.clone().into_tensor_arg(),
            picked.clone().into_tensor_arg(),
            rows as u32,
            vocab as u32,
            suppressed as u32,
            position as u32,
            inv_t,
            config.top_k.min(u32::MAX as usize) as u32,
            config.top_p,
            config.greedy,
            int_dtype.into(),
        );
        let ids = Tensor::<Cube<R>, 1, Int>::from_primitive(ids);
        let picked =
            Tensor::<Cube<R>, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(picked));
        DeviceSample {
            ids: crate::kernels::switch::cast(ids),
            picked: crate::kernels::switch::cast(picked),
        }
    }
}
