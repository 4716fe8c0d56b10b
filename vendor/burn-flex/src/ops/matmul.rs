//! Matrix multiplication via gemm crate.
//!
//! Optimizations:
//! - Strided gemm for f32/f64/f16 avoids copying non-contiguous tensors
//! - Enables parallelism for large matrices (with rayon feature)
//! - Batched matmul parallelized across batch dimension

use alloc::vec;
use alloc::vec::Vec;
use burn_backend::{DType, Element};
use burn_std::{Bytes, Shape, bf16, f16};

use crate::{FlexTensor, Layout};

/// Types that can be used with gemm-based matmul.
/// Only implement for types that `gemm::gemm` dispatches on via TypeId (f32, f64, f16).
trait GemmScalar: Element + bytemuck::Pod {
    fn zero() -> Self;
    fn one() -> Self;
}

impl GemmScalar for f32 {
    fn zero() -> Self {
        0.0
    }
    fn one() -> Self {
        1.0
    }
}

impl GemmScalar for f64 {
    fn zero() -> Self {
        0.0
    }
    fn one() -> Self {
        1.0
    }
}

impl GemmScalar for f16 {
    fn zero() -> Self {
        f16::from_f32(0.0)
    }
    fn one() -> Self {
        f16::from_f32(1.0)
    }
}

/// Checked multiplication for matrix sizes, panics on overflow.
#[inline]
fn checked_size(a: usize, b: usize) -> usize {
    a.checked_mul(b)
        .unwrap_or_else(|| panic!("matmul: matrix size overflow: {a} * {b}"))
}

/// Threshold for enabling parallelism (M*N*K operations).
/// 192^3 = ~7M ops - balance between 128x128 (no parallel) and 256x256 (parallel)
const PARALLEL_THRESHOLD: usize = 192 * 192 * 192;

/// Threshold for batch-level parallelism (total ops across all batches).
/// Use batch parallelism when individual matrices are small but total work is large.
#[cfg(feature = "rayon")]
const BATCH_PARALLEL_THRESHOLD: usize = 128 * 128 * 128; // ~2M ops total

/// Get parallelism setting based on matrix size.
fn get_parallelism(m: usize, n: usize, k: usize) -> gemm::Parallelism {
    let ops = m.saturating_mul(n).saturating_mul(k);
    if ops >= PARALLEL_THRESHOLD {
        #[cfg(feature = "rayon")]
        {
            gemm::Parallelism::Rayon(0) // 0 = use all available threads
        }
        #[cfg(not(feature = "rayon"))]
        {
            gemm::Parallelism::None
        }
    } else {
        gemm::Parallelism::None
    }
}

/// Dispatch matrix multiplication based on dtype.
pub fn matmul(lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    assert_eq!(lhs.dtype(), rhs.dtype(), "matmul: dtype mismatch");

    let lhs_shape = lhs.layout().shape();
    let rhs_shape = rhs.layout().shape();
    let lhs_rank = lhs_shape.num_dims();
    let rhs_rank = rhs_shape.num_dims();

    assert!(lhs_rank >= 2, "matmul requires at least 2D tensors");
    assert!(rhs_rank >= 2, "matmul requires at least 2D tensors");

    // Check inner dimensions match: lhs[..., M, K] x rhs[..., K, N]
    let k_lhs = lhs_shape[lhs_rank - 1];
    let k_rhs = rhs_shape[rhs_rank - 2];
    assert_eq!(k_lhs, k_rhs, "matmul: inner dimensions must match");

    match lhs.dtype() {
        DType::F32 => matmul_gemm::<f32>(lhs, rhs),
        DType::F64 => matmul_gemm::<f64>(lhs, rhs),
        DType::F16 => matmul_gemm::<f16>(lhs, rhs),
        DType::BF16 => matmul_bf16(lhs, rhs),
        _ => panic!("matmul: unsupported dtype {:?}", lhs.dtype()),
    }
}

/// Extract 2D matrix strides from a tensor layout.
/// Returns (row_stride, col_stride) for the last two dimensions.
fn get_2d_strides(layout: &Layout) -> (isize, isize) {
    let strides = layout.strides();
    let ndim = strides.len();
    let row_stride = strides[ndim - 2];
    let col_stride = strides[ndim - 1];
    (row_stride, col_stride)
}

/// Compute broadcast batch dimensions for batched matmul.
/// Returns (broadcast_shape, lhs_strides, rhs_strides) where strides map
/// output batch index to input batch offset (in matrices).
fn broadcast_batch_dims(
    lhs_batch: &[usize],
    rhs_batch: &[usize],
) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    // Pad shorter batch dims with 1s on the left
    let max_len = lhs_batch.len().max(rhs_batch.len());
    let lhs_padded: Vec<usize> = (0..max_len)
        .map(|i| {
            if i < max_len - lhs_batch.len() {
                1
            } else {
                lhs_batch[i - (max_len - lhs_batch.len())]
            }
        })
        .collect();
    let rhs_padded: Vec<usize> = (0..max_len)
        .map(|i| {
            if i < max_len - rhs_batch.len() {
                1
            } else {
                rhs_batch[i - (max_len - rhs_batch.len())]
            }
        })
        .collect();

    // Compute broadcast shape and strides
    let mut broadcast_shape = Vec::with_capacity(max_len);
    let mut lhs_strides = Vec::with_capacity(max_len);
    let mut rhs_strides = Vec::with_capacity(max_len);

    // Compute strides from right to left
    let mut lhs_stride = 1usize;
    let mut rhs_stride = 1usize;
    for i in (0..max_len).rev() {
        let ld = lhs_padded[i];
        let rd = rhs_padded[i];
        debug_assert!(
            ld == rd || ld == 1 || rd == 1,
            "matmul: batch dimensions not broadcastable: {:?} vs {:?}",
            lhs_batch,
            rhs_batch
        );
        broadcast_shape.push(ld.max(rd));
        // Stride is 0 if dimension is 1 (broadcast), otherwise actual stride
        lhs_strides.push(if ld == 1 { 0 } else { lhs_stride });
        rhs_strides.push(if rd == 1 { 0 } else { rhs_stride });
        lhs_stride *= ld;
        rhs_stride *= rd;
    }

    // Reverse to get correct order
    broadcast_shape.reverse();
    lhs_strides.reverse();
    rhs_strides.reverse();

    (broadcast_shape, lhs_strides, rhs_strides)
}

/// Convert a flat batch index to input batch offset using broadcast strides.
#[inline]
fn batch_index_to_offset(b: usize, broadcast_shape: &[usize], strides: &[usize]) -> usize {
    let mut offset = 0;
    let mut remaining = b;
    for i in (0..broadcast_shape.len()).rev() {
        let idx = remaining % broadcast_shape[i];
        offset += idx * strides[i];
        remaining /= broadcast_shape[i];
    }
    offset
}

/// Compute element-level batch strides for a tensor in a broadcast context.
/// Uses the actual layout strides so non-contiguous (transposed/sliced) tensors
/// work without a copy. Dimensions that are broadcast (size 1) get stride 0.
#[allow(clippy::needless_range_loop)]
fn broadcast_batch_elem_strides(
    batch_shape: &[usize],
    layout_strides: &[isize],
    broadcast_len: usize,
) -> Vec<isize> {
    let batch_ndim = batch_shape.len();
    debug_assert!(broadcast_len >= batch_ndim);
    let mut result = vec![0isize; broadcast_len];

    for i in 0..broadcast_len {
        let batch_idx = i as isize - (broadcast_len as isize - batch_ndim as isize);
        if batch_idx >= 0 {
            let bi = batch_idx as usize;
            if batch_shape[bi] > 1 {
                result[i] = layout_strides[bi];
            }
        }
    }

    result
}

/// Convert a flat batch index to an element offset using element-level strides.
#[inline]
fn batch_elem_offset(b: usize, broadcast_shape: &[usize], elem_strides: &[isize]) -> isize {
    let mut offset: isize = 0;
    let mut remaining = b;
    for i in (0..broadcast_shape.len()).rev() {
        let idx = remaining % broadcast_shape[i];
        offset += idx as isize * elem_strides[i];
        remaining /= broadcast_shape[i];
    }
    offset
}

// ============================================================================
// Generic gemm-based matmul (f32, f64, f16)
// ============================================================================

fn matmul_gemm<T: GemmScalar>(lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    let lhs_rank = lhs.layout().shape().num_dims();
    let rhs_rank = rhs.layout().shape().num_dims();

    if lhs_rank == 2 && rhs_rank == 2 {
        matmul_2d_strided::<T>(lhs, rhs)
    } else {
        matmul_batched_gemm::<T>(lhs, rhs)
    }
}

/// 2D matmul with strided support: [M, K] x [K, N] -> [M, N]
fn matmul_2d_strided<T: GemmScalar>(lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    matmul_2d_impl::<T>(lhs, rhs, true)
}

/// flowrl patch: how many f32 products this process computed on the small-row paths (the
/// direct kernel, or OpenBLAS with `openblas`) instead of gemm. flowrl's
/// `nodes/tests/cpu_kernels.rs` reads it to tell that KV-cached decoding runs on them.
pub fn small_row_products() -> u64 {
    SMALL_ROW_PRODUCTS.load(core::sync::atomic::Ordering::Relaxed)
}

static SMALL_ROW_PRODUCTS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// flowrl patch: `small_m` = whether f32 products of few rows may leave gemm.
fn matmul_2d_impl<T: GemmScalar>(lhs: FlexTensor, rhs: FlexTensor, small_m: bool) -> FlexTensor {
    let lhs_shape = lhs.layout().shape();
    let rhs_shape = rhs.layout().shape();

    let m = lhs_shape[0];
    let k = lhs_shape[1];
    let n = rhs_shape[1];

    let (lhs_row_stride, lhs_col_stride) = get_2d_strides(lhs.layout());
    let (rhs_row_stride, rhs_col_stride) = get_2d_strides(rhs.layout());

    let lhs_data: &[T] = lhs.storage();
    let rhs_data: &[T] = rhs.storage();
    let lhs_ptr = unsafe { lhs_data.as_ptr().add(lhs.layout().start_offset()) };
    let rhs_ptr = unsafe { rhs_data.as_ptr().add(rhs.layout().start_offset()) };

    let out_shape = Shape::from(vec![m, n]);
    let mut output = FlexTensor::empty(out_shape, T::dtype());
    let out_data: &mut [T] = output.storage_mut();

    let parallelism = get_parallelism(m, n, k);

    // flowrl patch: f32 products of a few rows (a decoding step's `x · Wᵀ`) skip gemm, which
    // packs the whole weight on every call: OpenBLAS with the `openblas` feature, else the direct
    // kernel below when both operands are contiguous along `k`.
    if small_m && T::dtype() == DType::F32 && small_m_size(m, k, n) {
        let (lhs_f, rhs_f, out_f) = (
            lhs_ptr as *const f32,
            rhs_ptr as *const f32,
            out_data.as_mut_ptr() as *mut f32,
        );
        #[cfg(feature = "openblas")]
        if m >= openblas::MIN_ROWS
            && unsafe {
                openblas::sgemm(
                    m,
                    k,
                    n,
                    lhs_f,
                    lhs_row_stride,
                    lhs_col_stride,
                    rhs_f,
                    rhs_row_stride,
                    rhs_col_stride,
                    out_f,
                )
            }
        {
            SMALL_ROW_PRODUCTS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            return output;
        }
        if small_m_layout(lhs_col_stride, rhs_row_stride) {
            #[cfg(all(target_arch = "x86_64", feature = "std"))]
            unsafe {
                small_m::matmul(
                    m,
                    k,
                    n,
                    lhs_f,
                    lhs_row_stride,
                    rhs_f,
                    rhs_col_stride,
                    out_f,
                    !matches!(parallelism, gemm::Parallelism::None),
                );
            }
            SMALL_ROW_PRODUCTS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            return output;
        }
    }

    unsafe {
        gemm_call(
            m,
            n,
            k,
            out_data.as_mut_ptr(),
            1,
            n as isize,
            lhs_ptr,
            lhs_col_stride,
            lhs_row_stride,
            rhs_ptr,
            rhs_col_stride,
            rhs_row_stride,
            parallelism,
        );
    }

    output
}

/// flowrl patch: burn-flex's f32 2-D matmul through gemm alone, as the release computes it (the
/// small-row paths off): the reference for the equivalence tests and the benchmark
/// (`bench/src/bin/blas.rs`).
#[doc(hidden)]
pub fn matmul_f32_gemm_reference(lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    assert_eq!(lhs.dtype(), DType::F32);
    assert_eq!(lhs.layout().shape().num_dims(), 2);
    assert_eq!(rhs.layout().shape().num_dims(), 2);
    matmul_2d_impl::<f32>(lhs, rhs, false)
}

/// Strided gemm call for one matrix. Wraps `gemm::gemm` with GemmScalar zero/one.
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_call<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    out: *mut T,
    out_cs: isize,
    out_rs: isize,
    lhs: *const T,
    lhs_cs: isize,
    lhs_rs: isize,
    rhs: *const T,
    rhs_cs: isize,
    rhs_rs: isize,
    parallelism: gemm::Parallelism,
) {
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out,
            out_cs,
            out_rs,
            false,
            lhs,
            lhs_cs,
            lhs_rs,
            rhs,
            rhs_cs,
            rhs_rs,
            T::zero(),
            T::one(),
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Batched matmul: [B..., M, K] x [B..., K, N] -> [B..., M, N]
/// Supports broadcasting on batch dimensions and strided (non-contiguous) inputs.
fn matmul_batched_gemm<T: GemmScalar>(lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    let lhs_shape = lhs.layout().shape();
    let rhs_shape = rhs.layout().shape();
    let lhs_rank = lhs_shape.num_dims();
    let rhs_rank = rhs_shape.num_dims();

    let m = lhs_shape[lhs_rank - 2];
    let k = lhs_shape[lhs_rank - 1];
    let n = rhs_shape[rhs_rank - 1];

    let lhs_batch: Vec<usize> = lhs_shape[..lhs_rank - 2].to_vec();
    let rhs_batch: Vec<usize> = rhs_shape[..rhs_rank - 2].to_vec();

    let (broadcast_shape, _, _) = broadcast_batch_dims(&lhs_batch, &rhs_batch);
    let batch_size: usize = broadcast_shape.iter().product();
    let broadcast_len = broadcast_shape.len();

    let lhs_batch_strides =
        broadcast_batch_elem_strides(&lhs_batch, lhs.layout().strides(), broadcast_len);
    let rhs_batch_strides =
        broadcast_batch_elem_strides(&rhs_batch, rhs.layout().strides(), broadcast_len);

    let (lhs_row_stride, lhs_col_stride) = get_2d_strides(lhs.layout());
    let (rhs_row_stride, rhs_col_stride) = get_2d_strides(rhs.layout());

    let out_matrix_size = checked_size(m, n);

    let mut out_dims = broadcast_shape.clone();
    out_dims.push(m);
    out_dims.push(n);
    let out_shape = Shape::from(out_dims);

    let mut output = FlexTensor::empty(out_shape, T::dtype());

    let lhs_data: &[T] = lhs.storage();
    let rhs_data: &[T] = rhs.storage();
    let lhs_start = lhs.layout().start_offset() as isize;
    let rhs_start = rhs.layout().start_offset() as isize;
    let out_data: &mut [T] = output.storage_mut();

    let per_matrix_ops = m.saturating_mul(n).saturating_mul(k);

    // Closure: run gemm for one batch slice at the given pointers
    let run_one = |out_ptr: *mut T, b: usize, parallelism: gemm::Parallelism| {
        let lhs_off = lhs_start + batch_elem_offset(b, &broadcast_shape, &lhs_batch_strides);
        let rhs_off = rhs_start + batch_elem_offset(b, &broadcast_shape, &rhs_batch_strides);
        unsafe {
            gemm_call::<T>(
                m,
                n,
                k,
                out_ptr,
                1,
                n as isize,
                lhs_data.as_ptr().offset(lhs_off),
                lhs_col_stride,
                lhs_row_stride,
                rhs_data.as_ptr().offset(rhs_off),
                rhs_col_stride,
                rhs_row_stride,
                parallelism,
            );
        }
    };

    // Strategy:
    // 1. Large matrices: let gemm parallelize internally
    // 2. Small matrices, large batch: parallelize batch loop
    // 3. Small total work: single-threaded
    #[cfg(feature = "rayon")]
    {
        let total_ops = batch_size.saturating_mul(per_matrix_ops);
        let prefer_batch_parallel = batch_size >= 4 && total_ops >= BATCH_PARALLEL_THRESHOLD;

        if per_matrix_ops >= PARALLEL_THRESHOLD && !prefer_batch_parallel {
            let parallelism = gemm::Parallelism::Rayon(0);
            for b in 0..batch_size {
                run_one(out_data[b * out_matrix_size..].as_mut_ptr(), b, parallelism);
            }
        } else if total_ops >= BATCH_PARALLEL_THRESHOLD && batch_size > 1 {
            use rayon::prelude::*;

            out_data
                .par_chunks_mut(out_matrix_size)
                .enumerate()
                .for_each(|(b, out_chunk)| {
                    run_one(out_chunk.as_mut_ptr(), b, gemm::Parallelism::None);
                });
        } else {
            for b in 0..batch_size {
                run_one(
                    out_data[b * out_matrix_size..].as_mut_ptr(),
                    b,
                    gemm::Parallelism::None,
                );
            }
        }
    }

    #[cfg(not(feature = "rayon"))]
    {
        let _ = per_matrix_ops;
        for b in 0..batch_size {
            run_one(
                out_data[b * out_matrix_size..].as_mut_ptr(),
                b,
                gemm::Parallelism::None,
            );
        }
    }

    output
}

// ============================================================================
// flowrl patch: f32 `X · Wᵀ` for a few rows of X (KV-cached decoding)
// ============================================================================

/// flowrl patch: the most lhs rows that take the direct kernel ([`small_m`]) instead of gemm.
/// A decoding step multiplies at most one row per sequence by every weight; gemm (which
/// transposes the problem so the weight becomes its packed lhs) copies the whole weight into its
/// packing buffer on every such call. The direct kernel reads the `[out, in]` weight in place.
/// The crossover was measured on the benchmark model's shapes (bench/results/blas.md).
const SMALL_M_MAX_ROWS: usize = 64;

/// flowrl patch: the fewest rhs elements (`k · n`) for the direct kernel (tiny products stay on
/// gemm, whose packing costs nothing there).
const SMALL_M_MIN_RHS: usize = 64 * 64;

/// flowrl patch: whether an f32 `[m, k] · [k, n]` is a small-row product (decoding).
#[inline]
fn small_m_size(m: usize, k: usize, n: usize) -> bool {
    (1..=SMALL_M_MAX_ROWS).contains(&m) && k >= 16 && k.saturating_mul(n) >= SMALL_M_MIN_RHS
}

/// flowrl patch: whether the direct kernel takes a small-row product: both operands contiguous
/// along `k` (`lhs` row-major, `rhs` the transposed view of a row-major `[n, k]` weight, any row
/// strides) and the CPU has AVX-512 or AVX2 with FMA (else gemm).
#[inline]
fn small_m_layout(lhs_cs: isize, rhs_rs: isize) -> bool {
    #[cfg(all(target_arch = "x86_64", feature = "std"))]
    {
        lhs_cs == 1 && rhs_rs == 1 && small_m::available()
    }
    #[cfg(not(all(target_arch = "x86_64", feature = "std")))]
    {
        let _ = (lhs_cs, rhs_rs);
        false
    }
}

/// flowrl patch: `out[i, j] = Σ_l lhs[i, l] · rhs[l, j]` as dot products of rows of `lhs` with
/// columns of `rhs` (both contiguous), in AVX-512 (4 × 4 output tiles of 16-lane accumulators) or,
/// on CPUs without it, AVX2 + FMA (4 × 2 tiles of 8 lanes, which fit the 16 vector registers),
/// the columns split across rayon's pool. Every weight element is read once per call from where
/// it is stored (the column block stays in L1 while all lhs rows pass over it), and nothing is
/// packed.
#[cfg(all(target_arch = "x86_64", feature = "std"))]
mod small_m {
    use core::arch::x86_64::*;

    /// The instruction set a kernel runs on.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Isa {
        Avx512,
        Avx2,
    }

    impl Isa {
        /// Output columns per tile.
        const fn columns(self) -> usize {
            match self {
                Isa::Avx512 => 4,
                Isa::Avx2 => 2,
            }
        }

        /// Whether this CPU runs the kernel.
        pub(super) fn runs(self) -> bool {
            match self {
                Isa::Avx512 => std::is_x86_feature_detected!("avx512f"),
                Isa::Avx2 => {
                    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
                }
            }
        }
    }

    /// The kernel small-row products take: the best this CPU runs (AVX-512F, else AVX2 with
    /// FMA, else none: gemm), or what `FLOWRL_SMALL_M_KERNEL` asks for (`avx2`: the AVX2 kernel
    /// where the CPU runs it; `gemm`: none), decided once per process.
    pub(super) fn best() -> Option<Isa> {
        static CHOICE: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
        *CHOICE.get_or_init(|| {
            let wanted: &[Isa] = match std::env::var("FLOWRL_SMALL_M_KERNEL").as_deref() {
                Ok("gemm") => &[],
                Ok("avx2") => &[Isa::Avx2],
                _ => &[Isa::Avx512, Isa::Avx2],
            };
            wanted.iter().copied().find(|isa| isa.runs())
        })
    }

    pub(super) fn available() -> bool {
        best().is_some()
    }

    #[derive(Clone, Copy)]
    struct Ptrs {
        lhs: *const f32,
        rhs: *const f32,
        out: *mut f32,
    }
    // Safety: the caller of `matmul` guarantees the pointers stay valid for the call, and the
    // tasks write disjoint columns of `out`.
    unsafe impl Send for Ptrs {}
    unsafe impl Sync for Ptrs {}

    /// Rows per tile.
    const MB: usize = 4;

    /// # Safety
    /// `lhs` valid for `m` rows of `k` contiguous elements `lhs_rs` apart, `rhs` for `n` columns
    /// of `k` contiguous elements `rhs_cs` apart, `out` for `m · n` writes (row-major), and
    /// [`available`] returned true.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul(
        m: usize,
        k: usize,
        n: usize,
        lhs: *const f32,
        lhs_rs: isize,
        rhs: *const f32,
        rhs_cs: isize,
        out: *mut f32,
        parallel: bool,
    ) {
        let isa = best().expect("the caller checked `available`");
        unsafe { matmul_on(isa, m, k, n, lhs, lhs_rs, rhs, rhs_cs, out, parallel) }
    }

    /// [`matmul`] on `isa`.
    ///
    /// # Safety
    /// As [`matmul`], and the CPU runs `isa`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul_on(
        isa: Isa,
        m: usize,
        k: usize,
        n: usize,
        lhs: *const f32,
        lhs_rs: isize,
        rhs: *const f32,
        rhs_cs: isize,
        out: *mut f32,
        parallel: bool,
    ) {
        let p = Ptrs { lhs, rhs, out };
        let run = move |j0: usize, j1: usize| {
            let p = p;
            unsafe {
                match isa {
                    Isa::Avx512 => {
                        columns_avx512(m, k, n, p.lhs, lhs_rs, p.rhs, rhs_cs, p.out, j0, j1)
                    }
                    Isa::Avx2 => columns_avx2(m, k, n, p.lhs, lhs_rs, p.rhs, rhs_cs, p.out, j0, j1),
                }
            }
        };
        #[cfg(feature = "rayon")]
        if parallel {
            use rayon::prelude::*;
            // A few tasks per thread, whole tiles each, so that a slow core does not hold the rest.
            let tasks = rayon::current_num_threads().max(1) * 4;
            let cols = n.div_ceil(tasks).next_multiple_of(isa.columns());
            (0..n.div_ceil(cols))
                .into_par_iter()
                .for_each(|t| run(t * cols, ((t + 1) * cols).min(n)));
            return;
        }
        let _ = parallel;
        run(0, n);
    }

    /// `columns_*`: the tiles of output columns `j0..j1`, `MB` rows × the ISA's
    /// [`Isa::columns`] at a time, each tile computed by the ISA's `tile::<R, C>`.
    macro_rules! columns {
        ($name:ident, $feature:literal, $tile:ident, $isa:expr, [$(($r:literal, $c:literal)),*]) => {
            #[target_feature(enable = $feature)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn $name(
                m: usize,
                k: usize,
                n: usize,
                lhs: *const f32,
                lhs_rs: isize,
                rhs: *const f32,
                rhs_cs: isize,
                out: *mut f32,
                j0: usize,
                j1: usize,
            ) {
                let mut j = j0;
                while j < j1 {
                    let nb = (j1 - j).min($isa.columns());
                    let b = rhs.wrapping_offset(j as isize * rhs_cs);
                    let mut i = 0;
                    while i < m {
                        let mb = (m - i).min(MB);
                        let a = lhs.wrapping_offset(i as isize * lhs_rs);
                        let o = out.wrapping_add(i * n + j);
                        match (mb, nb) {
                            $(($r, $c) => unsafe { $tile::<$r, $c>(k, a, lhs_rs, b, rhs_cs, o, n) },)*
                            _ => unreachable!(),
                        }
                        i += mb;
                    }
                    j += nb;
                }
            }
        };
    }

    columns!(
        columns_avx512,
        "avx512f",
        tile_avx512,
        Isa::Avx512,
        [
            (4, 4),
            (4, 3),
            (4, 2),
            (4, 1),
            (3, 4),
            (3, 3),
            (3, 2),
            (3, 1),
            (2, 4),
            (2, 3),
            (2, 2),
            (2, 1),
            (1, 4),
            (1, 3),
            (1, 2),
            (1, 1)
        ]
    );

    columns!(
        columns_avx2,
        "avx2,fma",
        tile_avx2,
        Isa::Avx2,
        [(4, 2), (4, 1), (3, 2), (3, 1), (2, 2), (2, 1), (1, 2), (1, 1)]
    );

    /// One `R × C` tile of `out` (row stride `ldo`): `R · C` accumulators of 16 lanes over `k`,
    /// the tail under a mask, then one horizontal sum each.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn tile_avx512<const R: usize, const C: usize>(
        k: usize,
        a: *const f32,
        lhs_rs: isize,
        b: *const f32,
        rhs_cs: isize,
        out: *mut f32,
        ldo: usize,
    ) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); C]; R];
            let mut l = 0;
            while l + 16 <= k {
                let mut bv = [_mm512_setzero_ps(); C];
                for c in 0..C {
                    bv[c] = _mm512_loadu_ps(b.offset(c as isize * rhs_cs).add(l));
                }
                for r in 0..R {
                    let av = _mm512_loadu_ps(a.offset(r as isize * lhs_rs).add(l));
                    for c in 0..C {
                        acc[r][c] = _mm512_fmadd_ps(av, bv[c], acc[r][c]);
                    }
                }
                l += 16;
            }
            if l < k {
                let mask = ((1u32 << (k - l)) - 1) as __mmask16;
                let mut bv = [_mm512_setzero_ps(); C];
                for c in 0..C {
                    bv[c] = _mm512_maskz_loadu_ps(mask, b.offset(c as isize * rhs_cs).add(l));
                }
                for r in 0..R {
                    let av = _mm512_maskz_loadu_ps(mask, a.offset(r as isize * lhs_rs).add(l));
                    for c in 0..C {
                        acc[r][c] = _mm512_fmadd_ps(av, bv[c], acc[r][c]);
                    }
                }
            }
            for r in 0..R {
                for c in 0..C {
                    *out.add(r * ldo + c) = _mm512_reduce_add_ps(acc[r][c]);
                }
            }
        }
    }

    /// [`tile_avx512`] in AVX2 + FMA: accumulators of 8 lanes, the tail under a
    /// `maskload`, the horizontal sum by halving.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn tile_avx2<const R: usize, const C: usize>(
        k: usize,
        a: *const f32,
        lhs_rs: isize,
        b: *const f32,
        rhs_cs: isize,
        out: *mut f32,
        ldo: usize,
    ) {
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            let mut l = 0;
            while l + 8 <= k {
                let mut bv = [_mm256_setzero_ps(); C];
                for c in 0..C {
                    bv[c] = _mm256_loadu_ps(b.offset(c as isize * rhs_cs).add(l));
                }
                for r in 0..R {
                    let av = _mm256_loadu_ps(a.offset(r as isize * lhs_rs).add(l));
                    for c in 0..C {
                        acc[r][c] = _mm256_fmadd_ps(av, bv[c], acc[r][c]);
                    }
                }
                l += 8;
            }
            if l < k {
                // Lanes below the remainder load; the others read as 0 (and are not touched).
                let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((k - l) as i32), lanes);
                let mut bv = [_mm256_setzero_ps(); C];
                for c in 0..C {
                    bv[c] = _mm256_maskload_ps(b.offset(c as isize * rhs_cs).add(l), mask);
                }
                for r in 0..R {
                    let av = _mm256_maskload_ps(a.offset(r as isize * lhs_rs).add(l), mask);
                    for c in 0..C {
                        acc[r][c] = _mm256_fmadd_ps(av, bv[c], acc[r][c]);
                    }
                }
            }
            for r in 0..R {
                for c in 0..C {
                    let v = acc[r][c];
                    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0b01));
                    *out.add(r * ldo + c) = _mm_cvtss_f32(s);
                }
            }
        }
    }
}

/// flowrl patch (`openblas` feature): small-row f32 products through the system OpenBLAS's
/// `cblas_sgemm` (`apt-get install libopenblas-dev`; linked by name, nothing is downloaded).
#[cfg(feature = "openblas")]
mod openblas {
    use core::ffi::c_int;

    /// Fewer rows than this stay on the direct kernel, which is faster there (measured in
    /// bench/results/blas.md: OpenBLAS 0.3.21 wins at 64 rows, the direct kernel at 8).
    pub(super) const MIN_ROWS: usize = 24;

    const ROW_MAJOR: c_int = 101;
    const NO_TRANS: c_int = 111;
    const TRANS: c_int = 112;

    #[link(name = "openblas")]
    unsafe extern "C" {
        fn cblas_sgemm(
            order: c_int,
            trans_a: c_int,
            trans_b: c_int,
            m: c_int,
            n: c_int,
            k: c_int,
            alpha: f32,
            a: *const f32,
            lda: c_int,
            b: *const f32,
            ldb: c_int,
            beta: f32,
            c: *mut f32,
            ldc: c_int,
        );
    }

    /// How cblas reads a `rows × cols` operand with these strides: (transposed, leading
    /// dimension), or `None` when neither stride is 1 (or the leading one too small / too big).
    fn operand(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<(c_int, c_int)> {
        // The leading dimension: the other stride, at least the contiguous extent (any value
        // for a single row or column, whose stride cblas never follows).
        let ld = |lines: usize, stride: isize, extent: usize| -> Option<c_int> {
            let ld = if lines == 1 { extent.max(1) as isize } else { stride };
            if ld < extent.max(1) as isize {
                return None;
            }
            c_int::try_from(ld).ok()
        };
        if cs == 1 {
            Some((NO_TRANS, ld(rows, rs, cols)?))
        } else if rs == 1 {
            Some((TRANS, ld(cols, cs, rows)?))
        } else {
            None
        }
    }

    /// `out = lhs · rhs` (`out` row-major `[m, n]`); false (nothing written) when cblas cannot
    /// read an operand's strides.
    ///
    /// # Safety
    /// The pointers are valid for the strided `[m, k]`, `[k, n]` and the `[m, n]` output.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn sgemm(
        m: usize,
        k: usize,
        n: usize,
        lhs: *const f32,
        lhs_rs: isize,
        lhs_cs: isize,
        rhs: *const f32,
        rhs_rs: isize,
        rhs_cs: isize,
        out: *mut f32,
    ) -> bool {
        let (Some((ta, lda)), Some((tb, ldb))) =
            (operand(m, k, lhs_rs, lhs_cs), operand(k, n, rhs_rs, rhs_cs))
        else {
            return false;
        };
        let (Ok(mi), Ok(ni), Ok(ki)) = (c_int::try_from(m), c_int::try_from(n), c_int::try_from(k))
        else {
            return false;
        };
        unsafe {
            cblas_sgemm(
                ROW_MAJOR, ta, tb, mi, ni, ki, 1.0, lhs, lda, rhs, ldb, 0.0, out, ni,
            );
        }
        true
    }
}

// ============================================================================
// bf16 matmul (via f32 conversion)
// ============================================================================

fn matmul_bf16(lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    // flowrl patch: the bf16 -> f32 conversions run on the thread pool (`par::map`), and an
    // operand whose view covers its whole storage (a contiguous or transposed weight) is converted
    // as stored, keeping its strides, instead of being copied contiguous first: a decode step's
    // `x · Wᵀ` no longer writes a transposed bf16 copy of every weight before converting it.
    let lhs_f32_tensor = bf16_operand_to_f32(lhs);
    let rhs_f32_tensor = bf16_operand_to_f32(rhs);

    // Compute matmul in f32
    let result_f32 = matmul_gemm::<f32>(lhs_f32_tensor, rhs_f32_tensor);

    // Convert f32 -> bf16
    let result_bf16: Vec<bf16> = crate::ops::par::map(result_f32.storage::<f32>(), bf16::from_f32);

    FlexTensor::new(
        Bytes::from_elems(result_bf16),
        result_f32.layout().clone(),
        DType::BF16,
    )
}

/// flowrl patch: a bf16 matmul operand as f32, converted in parallel; the layout is kept when the
/// view spans its storage exactly, else the view is made contiguous first.
fn bf16_operand_to_f32(t: FlexTensor) -> FlexTensor {
    let spans_storage = t.storage::<bf16>().len() == t.layout().num_elements();
    let t = if spans_storage { t } else { t.to_contiguous() };
    let layout = if spans_storage {
        t.layout().clone()
    } else {
        Layout::contiguous(t.layout().shape().clone())
    };
    let f32s: Vec<f32> = crate::ops::par::map(t.storage::<bf16>(), bf16::to_f32);
    FlexTensor::new(Bytes::from_elems(f32s), layout, DType::F32)
}

// ============================================================================
// Integer matmul (naive, with optional SIMD for i32)
// ============================================================================

/// Integer matrix multiplication dispatch.
pub fn int_matmul(lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    assert_eq!(lhs.dtype(), rhs.dtype(), "int_matmul: dtype mismatch");

    let lhs_shape = lhs.layout().shape();
    let rhs_shape = rhs.layout().shape();
    let lhs_rank = lhs_shape.num_dims();
    let rhs_rank = rhs_shape.num_dims();

    assert!(lhs_rank >= 2, "int_matmul requires at least 2D tensors");
    assert!(rhs_rank >= 2, "int_matmul requires at least 2D tensors");

    let k_lhs = lhs_shape[lhs_rank - 1];
    let k_rhs = rhs_shape[rhs_rank - 2];
    assert_eq!(k_lhs, k_rhs, "int_matmul: inner dimensions must match");

    match lhs.dtype() {
        DType::I32 => matmul_i32(lhs, rhs),
        DType::I64 => matmul_i64(lhs, rhs),
        _ => panic!("int_matmul: unsupported dtype {:?}", lhs.dtype()),
    }
}

/// i32 matmul using naive triple loop with SIMD dot product.
fn matmul_i32(lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    let lhs = lhs.to_contiguous();
    let rhs = rhs.to_contiguous();

    let lhs_shape = lhs.layout().shape();
    let rhs_shape = rhs.layout().shape();
    let lhs_rank = lhs_shape.num_dims();
    let rhs_rank = rhs_shape.num_dims();

    if lhs_rank == 2 && rhs_rank == 2 {
        matmul_2d_i32(&lhs, &rhs)
    } else {
        matmul_batched_i32(lhs, rhs)
    }
}

/// 2D i32 matmul: [M, K] x [K, N] -> [M, N]
/// Transposes rhs to enable contiguous access for dot product.
fn matmul_2d_i32(lhs: &FlexTensor, rhs: &FlexTensor) -> FlexTensor {
    let lhs_shape = lhs.layout().shape();
    let rhs_shape = rhs.layout().shape();

    let m = lhs_shape[0];
    let k = lhs_shape[1];
    let n = rhs_shape[1];

    let lhs_data: &[i32] = lhs.storage();
    let rhs_data: &[i32] = rhs.storage();

    // Transpose rhs [K, N] -> [N, K] for contiguous column access
    let mut rhs_t = vec![0i32; k * n];
    for i in 0..k {
        for j in 0..n {
            rhs_t[j * k + i] = rhs_data[i * n + j];
        }
    }

    let mut output = vec![0i32; m * n];

    // Now both lhs rows and rhs columns (transposed rows) are contiguous
    for i in 0..m {
        let lhs_row = &lhs_data[i * k..(i + 1) * k];
        for j in 0..n {
            let rhs_col = &rhs_t[j * k..(j + 1) * k];
            output[i * n + j] = dot_i32(lhs_row, rhs_col);
        }
    }

    let out_shape = Shape::from(vec![m, n]);
    FlexTensor::new(
        Bytes::from_elems(output),
        Layout::contiguous(out_shape),
        DType::I32,
    )
}

/// Dot product for i32 slices. Uses macerator SIMD when the `simd` feature is enabled.
#[inline]
fn dot_i32(a: &[i32], b: &[i32]) -> i32 {
    debug_assert_eq!(a.len(), b.len());

    #[cfg(feature = "simd")]
    {
        dot_i32_simd(a, b)
    }

    #[cfg(not(feature = "simd"))]
    {
        dot_i32_scalar(a, b)
    }
}

#[cfg(not(feature = "simd"))]
#[inline]
fn dot_i32_scalar(a: &[i32], b: &[i32]) -> i32 {
    let mut sum = 0i32;
    for i in 0..a.len() {
        sum = sum.wrapping_add(a[i].wrapping_mul(b[i]));
    }
    sum
}

#[cfg(feature = "simd")]
#[macerator::with_simd]
fn dot_i32_simd<S: macerator::Simd>(a: &[i32], b: &[i32]) -> i32 {
    use macerator::{Scalar, VMulAdd, vload_unaligned};

    let lanes = i32::lanes::<S>();
    let len = a.len();
    let simd_len = len / lanes * lanes;
    let mut acc = 0i32.splat::<S>();

    let mut i = 0;
    while i < simd_len {
        let va = unsafe { vload_unaligned(a.as_ptr().add(i)) };
        let vb = unsafe { vload_unaligned(b.as_ptr().add(i)) };
        acc = i32::vmul_add(va, vb, acc);
        i += lanes;
    }

    let mut sum = acc.reduce_add();
    while i < len {
        sum = sum.wrapping_add(a[i].wrapping_mul(b[i]));
        i += 1;
    }
    sum
}

/// Batched i32 matmul: [B..., M, K] x [B..., K, N] -> [B..., M, N]
///
/// Uses naive triple-loop with SIMD dot product and batch-level parallelism.
fn matmul_batched_i32(lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    let lhs_shape = lhs.layout().shape();
    let rhs_shape = rhs.layout().shape();
    let lhs_rank = lhs_shape.num_dims();
    let rhs_rank = rhs_shape.num_dims();

    let m = lhs_shape[lhs_rank - 2];
    let k = lhs_shape[lhs_rank - 1];
    let n = rhs_shape[rhs_rank - 1];

    let lhs_batch: Vec<usize> = lhs_shape[..lhs_rank - 2].to_vec();
    let rhs_batch: Vec<usize> = rhs_shape[..rhs_rank - 2].to_vec();

    let (broadcast_shape, lhs_strides, rhs_strides) = broadcast_batch_dims(&lhs_batch, &rhs_batch);

    let batch_size: usize = broadcast_shape.iter().product();
    let rhs_batch_size: usize = rhs_batch.iter().product();
    let lhs_matrix_size = checked_size(m, k);
    let rhs_matrix_size = checked_size(k, n);
    let out_matrix_size = checked_size(m, n);

    let mut out_dims = broadcast_shape.clone();
    out_dims.push(m);
    out_dims.push(n);
    let out_shape = Shape::from(out_dims);

    let lhs_data: &[i32] = lhs.storage();
    let rhs_data: &[i32] = rhs.storage();

    // Transpose rhs per actual rhs batch: [B_rhs, K, N] -> [B_rhs, N, K]
    let mut rhs_transposed = vec![0i32; rhs_batch_size * n * k];
    for b in 0..rhs_batch_size {
        let src_offset = b * rhs_matrix_size;
        let dst_offset = b * n * k;
        for i in 0..k {
            for j in 0..n {
                rhs_transposed[dst_offset + j * k + i] = rhs_data[src_offset + i * n + j];
            }
        }
    }

    let mut output = vec![0i32; batch_size * out_matrix_size];

    let run_one = |b: usize, out_slice: &mut [i32]| {
        let lhs_batch_idx = batch_index_to_offset(b, &broadcast_shape, &lhs_strides);
        let rhs_batch_idx = batch_index_to_offset(b, &broadcast_shape, &rhs_strides);
        let lhs_offset = lhs_batch_idx * lhs_matrix_size;
        let rhs_t_offset = rhs_batch_idx * n * k;

        let lhs_slice = &lhs_data[lhs_offset..lhs_offset + lhs_matrix_size];
        let rhs_t_slice = &rhs_transposed[rhs_t_offset..rhs_t_offset + n * k];

        for i in 0..m {
            let lhs_row = &lhs_slice[i * k..(i + 1) * k];
            for j in 0..n {
                let rhs_col = &rhs_t_slice[j * k..(j + 1) * k];
                out_slice[i * n + j] = dot_i32(lhs_row, rhs_col);
            }
        }
    };

    #[cfg(feature = "rayon")]
    {
        use rayon::prelude::*;
        output
            .par_chunks_mut(out_matrix_size)
            .enumerate()
            .for_each(|(b, out_slice)| run_one(b, out_slice));
    }

    #[cfg(not(feature = "rayon"))]
    {
        for b in 0..batch_size {
            let offset = b * out_matrix_size;
            run_one(b, &mut output[offset..offset + out_matrix_size]);
        }
    }

    FlexTensor::new(
        Bytes::from_elems(output),
        Layout::contiguous(out_shape),
        DType::I32,
    )
}

/// i64 matmul using naive triple loop.
fn matmul_i64(lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    let lhs = lhs.to_contiguous();
    let rhs = rhs.to_contiguous();

    let lhs_shape = lhs.layout().shape();
    let rhs_shape = rhs.layout().shape();
    let lhs_rank = lhs_shape.num_dims();
    let rhs_rank = rhs_shape.num_dims();

    if lhs_rank == 2 && rhs_rank == 2 {
        matmul_2d_i64(&lhs, &rhs)
    } else {
        matmul_batched_i64(lhs, rhs)
    }
}

/// 2D i64 matmul: [M, K] x [K, N] -> [M, N]
fn matmul_2d_i64(lhs: &FlexTensor, rhs: &FlexTensor) -> FlexTensor {
    let lhs_shape = lhs.layout().shape();
    let rhs_shape = rhs.layout().shape();

    let m = lhs_shape[0];
    let k = lhs_shape[1];
    let n = rhs_shape[1];

    let lhs_data: &[i64] = lhs.storage();
    let rhs_data: &[i64] = rhs.storage();

    let mut output = vec![0i64; m * n];

    for i in 0..m {
        for j in 0..n {
            let mut sum = 0i64;
            for l in 0..k {
                sum = sum.wrapping_add(lhs_data[i * k + l].wrapping_mul(rhs_data[l * n + j]));
            }
            output[i * n + j] = sum;
        }
    }

    let out_shape = Shape::from(vec![m, n]);
    FlexTensor::new(
        Bytes::from_elems(output),
        Layout::contiguous(out_shape),
        DType::I64,
    )
}

/// Batched i64 matmul with broadcast support
fn matmul_batched_i64(lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
    let lhs_shape = lhs.layout().shape();
    let rhs_shape = rhs.layout().shape();
    let lhs_rank = lhs_shape.num_dims();
    let rhs_rank = rhs_shape.num_dims();

    let m = lhs_shape[lhs_rank - 2];
    let k = lhs_shape[lhs_rank - 1];
    let n = rhs_shape[rhs_rank - 1];

    let lhs_batch: Vec<usize> = lhs_shape[..lhs_rank - 2].to_vec();
    let rhs_batch: Vec<usize> = rhs_shape[..rhs_rank - 2].to_vec();

    // Compute broadcast batch dimensions
    let (broadcast_shape, lhs_strides, rhs_strides) = broadcast_batch_dims(&lhs_batch, &rhs_batch);

    let batch_size: usize = broadcast_shape.iter().product();
    let lhs_matrix_size = checked_size(m, k);
    let rhs_matrix_size = checked_size(k, n);
    let out_matrix_size = checked_size(m, n);

    let mut out_dims = broadcast_shape.clone();
    out_dims.push(m);
    out_dims.push(n);
    let out_shape = Shape::from(out_dims);

    let lhs_data: &[i64] = lhs.storage();
    let rhs_data: &[i64] = rhs.storage();

    let mut output = vec![0i64; batch_size * out_matrix_size];

    for b in 0..batch_size {
        let lhs_batch_idx = batch_index_to_offset(b, &broadcast_shape, &lhs_strides);
        let rhs_batch_idx = batch_index_to_offset(b, &broadcast_shape, &rhs_strides);
        let lhs_offset = lhs_batch_idx * lhs_matrix_size;
        let rhs_offset = rhs_batch_idx * rhs_matrix_size;
        let out_offset = b * out_matrix_size;

        for i in 0..m {
            for j in 0..n {
                let mut sum = 0i64;
                for l in 0..k {
                    let lhs_idx = lhs_offset + i * k + l;
                    let rhs_idx = rhs_offset + l * n + j;
                    sum = sum.wrapping_add(lhs_data[lhs_idx].wrapping_mul(rhs_data[rhs_idx]));
                }
                output[out_offset + i * n + j] = sum;
            }
        }
    }

    FlexTensor::new(
        Bytes::from_elems(output),
        Layout::contiguous(out_shape),
        DType::I64,
    )
}

// ============================================================================
// Tests
// ============================================================================

// Tests kept here exercise flex-specific behavior of the matmul kernel:
// dtype-specific storage paths (F64, F16, BF16) that the generic
// FloatElem-parameterized backend-tests cannot reach. Plain contiguous
// F32/I32/I64 matmul, stride-through-matmul variants (transposed /
// swap_dims / broadcast-transposed), and other generic coverage have
// been migrated to burn-backend-tests so they run against every backend.
// When adding new tests, keep them here only if they probe a flex
// dtype-storage path; otherwise add them to
// crates/burn-backend-tests/tests/tensor/float/ops/matmul.rs.
#[cfg(test)]
mod tests {
    use alloc::vec;
    use burn_backend::TensorData;
    use burn_backend::ops::FloatTensorOps;
    use burn_std::{bf16, f16};

    use crate::{Flex, FlexTensor};

    #[test]
    fn test_matmul_f64() {
        let lhs = FlexTensor::from_data(TensorData::new(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]));
        let rhs = FlexTensor::from_data(TensorData::new(vec![5.0f64, 6.0, 7.0, 8.0], [2, 2]));

        let result = Flex::float_matmul(lhs, rhs);
        let values: Vec<f64> = result.into_data().to_vec().unwrap();

        assert_eq!(values, vec![19.0, 22.0, 43.0, 50.0]);
    }

    #[test]
    fn test_matmul_f16() {
        let lhs_vals: Vec<f16> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .copied()
            .map(f16::from_f32)
            .collect();
        let rhs_vals: Vec<f16> = [5.0f32, 6.0, 7.0, 8.0]
            .iter()
            .copied()
            .map(f16::from_f32)
            .collect();

        let lhs = FlexTensor::from_data(TensorData::new(lhs_vals, [2, 2]));
        let rhs = FlexTensor::from_data(TensorData::new(rhs_vals, [2, 2]));

        let result = Flex::float_matmul(lhs, rhs);
        let values: Vec<f16> = result.into_data().to_vec().unwrap();

        let expected = [19.0f32, 22.0, 43.0, 50.0];
        for (a, e) in values.iter().zip(expected.iter()) {
            assert!((a.to_f32() - e).abs() < 0.1, "f16 matmul mismatch");
        }
    }

    #[test]
    fn test_matmul_bf16() {
        let lhs_vals: Vec<bf16> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .copied()
            .map(bf16::from_f32)
            .collect();
        let rhs_vals: Vec<bf16> = [5.0f32, 6.0, 7.0, 8.0]
            .iter()
            .copied()
            .map(bf16::from_f32)
            .collect();

        let lhs = FlexTensor::from_data(TensorData::new(lhs_vals, [2, 2]));
        let rhs = FlexTensor::from_data(TensorData::new(rhs_vals, [2, 2]));

        let result = Flex::float_matmul(lhs, rhs);
        let values: Vec<bf16> = result.into_data().to_vec().unwrap();

        let expected = [19.0f32, 22.0, 43.0, 50.0];
        for (a, e) in values.iter().zip(expected.iter()) {
            assert!((a.to_f32() - e).abs() < 0.5, "bf16 matmul mismatch");
        }
    }

    #[test]
    fn test_matmul_batched_transposed_f64() {
        // Non-contiguous (swap_dims) batched matmul on the F64 dtype path.
        let q_data = TensorData::new(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [2, 2, 2]);
        let k_data = TensorData::new(vec![1.0f64, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0], [2, 2, 2]);

        let q = FlexTensor::from_data(q_data.clone());
        let k = FlexTensor::from_data(k_data.clone());
        let k_t = k.transpose(1, 2);
        let result = Flex::float_matmul(q, k_t);

        let q2 = FlexTensor::from_data(q_data);
        let k2 = FlexTensor::from_data(k_data)
            .transpose(1, 2)
            .to_contiguous();
        let expected = Flex::float_matmul(q2, k2);

        let values: Vec<f64> = result.into_data().to_vec().unwrap();
        let expected: Vec<f64> = expected.into_data().to_vec().unwrap();
        assert_eq!(values, expected);
    }

    #[test]
    fn test_matmul_batched_transposed_f16() {
        // Non-contiguous (swap_dims) batched matmul on the F16 dtype path.
        let f = f16::from_f32;
        let q_data = TensorData::new(
            vec![
                f(1.0),
                f(2.0),
                f(3.0),
                f(4.0),
                f(5.0),
                f(6.0),
                f(7.0),
                f(8.0),
            ],
            [2, 2, 2],
        );
        let k_data = TensorData::new(
            vec![
                f(1.0),
                f(0.0),
                f(0.0),
                f(1.0),
                f(2.0),
                f(0.0),
                f(0.0),
                f(2.0),
            ],
            [2, 2, 2],
        );

        let q = FlexTensor::from_data(q_data.clone());
        let k = FlexTensor::from_data(k_data.clone());
        let k_t = k.transpose(1, 2);
        let result = Flex::float_matmul(q, k_t);

        let q2 = FlexTensor::from_data(q_data);
        let k2 = FlexTensor::from_data(k_data)
            .transpose(1, 2)
            .to_contiguous();
        let expected = Flex::float_matmul(q2, k2);

        let values: Vec<f16> = result.into_data().to_vec().unwrap();
        let expected: Vec<f16> = expected.into_data().to_vec().unwrap();
        assert_eq!(values, expected);
    }

    // flowrl patch: the small-row paths (direct kernel, or OpenBLAS with `openblas`) against
    // gemm alone, on odd sizes, sliced (row-strided) operands and transposed views.
    fn lcg_matrix(seed: u64, rows: usize, cols: usize) -> FlexTensor {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let values: Vec<f32> = (0..rows * cols)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        FlexTensor::from_data(TensorData::new(values, [rows, cols]))
    }

    fn cols_slice(t: FlexTensor, cols: usize) -> FlexTensor {
        use burn_std::Slice;
        Flex::float_slice(
            t,
            &[
                Slice::new(0, None, 1),
                Slice::new(1, Some(1 + cols as isize), 1),
            ],
        )
    }

    /// `lhs · rhs` through `matmul` and through gemm alone; max |difference| over the largest
    /// |value| (the products' sums run in different orders).
    fn small_m_check(lhs: FlexTensor, rhs: FlexTensor) {
        let (m, n) = (lhs.layout().shape()[0], rhs.layout().shape()[1]);
        let got: Vec<f32> = Flex::float_matmul(lhs.clone(), rhs.clone())
            .into_data()
            .to_vec()
            .unwrap();
        let want: Vec<f32> = super::matmul_f32_gemm_reference(lhs, rhs)
            .into_data()
            .to_vec()
            .unwrap();
        assert_eq!(got.len(), m * n);
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let diff = got
            .iter()
            .zip(&want)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(
            diff <= 1e-5 * scale,
            "m={m} n={n}: max diff {diff} vs scale {scale}"
        );
    }

    /// Every direct kernel this CPU runs (AVX-512 and AVX2 here, AVX2 alone elsewhere), called
    /// on its own, against an f64 reference: row-strided operands, `k` not a multiple of a
    /// vector, `m` and `n` not multiples of a tile, serial and split over the pool.
    #[cfg(all(target_arch = "x86_64", feature = "std"))]
    #[test]
    fn test_small_m_kernels_match_a_reference_on_every_isa() {
        use super::small_m::{Isa, matmul_on};
        let isas: Vec<Isa> = [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .filter(|isa| isa.runs())
            .collect();
        eprintln!("direct kernels checked: {isas:?}");
        for (i, &(m, k, n)) in [(1, 512, 64), (4, 17, 9), (7, 1408, 130), (64, 100, 41), (5, 8, 3)]
            .iter()
            .enumerate()
        {
            let (lhs_rs, rhs_cs) = (k + 3, k + 5);
            let values = |t: FlexTensor| t.into_data().to_vec::<f32>().unwrap();
            let lhs = values(lcg_matrix(i as u64 * 2, m, lhs_rs));
            let rhs = values(lcg_matrix(i as u64 * 2 + 1, n, rhs_cs));
            for &isa in &isas {
                for parallel in [false, true] {
                    let mut out = vec![f32::NAN; m * n];
                    unsafe {
                        matmul_on(
                            isa,
                            m,
                            k,
                            n,
                            lhs.as_ptr(),
                            lhs_rs as isize,
                            rhs.as_ptr(),
                            rhs_cs as isize,
                            out.as_mut_ptr(),
                            parallel,
                        );
                    }
                    for r in 0..m {
                        for c in 0..n {
                            let (a, b) = (&lhs[r * lhs_rs..][..k], &rhs[c * rhs_cs..][..k]);
                            let exact: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
                            let scale: f64 = a.iter().zip(b).map(|(x, y)| (*x * *y).abs() as f64).sum();
                            let got = out[r * n + c] as f64;
                            assert!(
                                (got - exact).abs() <= 1e-5 * scale.max(1e-30),
                                "{isa:?} ({m}, {k}, {n}) parallel={parallel} [{r}, {c}]: {got} vs {exact}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn test_matmul_small_m_matches_gemm() {
        let shapes = [
            (1, 512, 512),
            (64, 512, 512),
            (64, 512, 256),
            (64, 1408, 512),
            (8, 512, 1408),
            (3, 17, 300),
            (5, 33, 257),
            (7, 1408, 130),
            (63, 100, 41),
            (2, 515, 77),
            (65, 64, 64),
        ];
        for (i, &(m, k, n)) in shapes.iter().enumerate() {
            let seed = i as u64 * 4;
            // `x · Wᵀ`, W stored [n, k] as the models store it.
            let x = lcg_matrix(seed, m, k);
            let w = lcg_matrix(seed + 1, n, k);
            small_m_check(x.clone(), Flex::float_transpose(w.clone()));
            // Row-strided operands: columns 1..=k of wider matrices.
            let xs = cols_slice(lcg_matrix(seed + 2, m, k + 5), k);
            let ws = cols_slice(lcg_matrix(seed + 3, n, k + 3), k);
            assert_ne!(xs.layout().strides()[0], k as isize);
            small_m_check(xs.clone(), Flex::float_transpose(ws));
            // Layouts the direct kernel does not take (gemm, or OpenBLAS): a row-major rhs,
            // a transposed lhs.
            small_m_check(x, lcg_matrix(seed + 5, k, n));
            small_m_check(
                Flex::float_transpose(lcg_matrix(seed + 6, k, m)),
                Flex::float_transpose(w),
            );
        }
    }
}
