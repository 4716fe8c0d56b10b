//! flowrl patch: elementwise loops over large tensors split across rayon's thread pool.
//!
//! burn-flex 0.21.0 runs every unary, binary and scalar op on the calling thread; only matmuls,
//! reductions and softmax use the pool. In a training step on 2 cores the elementwise ops (the
//! autodiff backward's included) were about half of the wall time with the second core idle.
//! These helpers run the same per-element loops over chunks in parallel; every element gets the
//! same value as before (no reduction changes order).

#[cfg(feature = "rayon")]
use rayon::prelude::*;

/// Element counts below this stay on the calling thread (task overhead would dominate).
pub(crate) const MIN_PARALLEL: usize = 1 << 15;
/// Elements per task.
const CHUNK: usize = 1 << 13;

#[inline]
fn parallel(len: usize) -> bool {
    cfg!(feature = "rayon") && len >= MIN_PARALLEL
}

/// Runs `f` over consecutive chunks of `xs` (whole when small), chunks of `multiple` elements'
/// multiples so that row-structured kernels see whole rows.
pub(crate) fn chunks_mut<E, F>(xs: &mut [E], multiple: usize, f: F)
where
    E: Send,
    F: Fn(&mut [E]) + Sync + Send,
{
    let step = CHUNK.div_ceil(multiple.max(1)) * multiple.max(1);
    if !parallel(xs.len()) || xs.len() <= step {
        f(xs);
        return;
    }
    #[cfg(feature = "rayon")]
    xs.par_chunks_mut(step).for_each(|c| f(c));
    #[cfg(not(feature = "rayon"))]
    f(xs);
}

/// Runs `f` over chunks of whole rows of `xs` (rows of `row_len` elements) together with the
/// matching items of `per_row` (one per row).
pub(crate) fn rows_mut<E, R, F>(xs: &mut [E], row_len: usize, per_row: &[R], f: F)
where
    E: Send,
    R: Sync,
    F: Fn(&mut [E], &[R]) + Sync + Send,
{
    let rows = CHUNK.div_ceil(row_len.max(1));
    if !parallel(xs.len()) || per_row.len() <= rows {
        f(xs, per_row);
        return;
    }
    #[cfg(feature = "rayon")]
    xs.par_chunks_mut(rows * row_len)
        .zip(per_row.par_chunks(rows))
        .for_each(|(x, r)| f(x, r));
    #[cfg(not(feature = "rayon"))]
    f(xs, per_row);
}

/// Runs `f` over matching chunks of `xs` and `ys` (same length).
pub(crate) fn zip_chunks_mut<E, R, F>(xs: &mut [E], ys: &[R], f: F)
where
    E: Send,
    R: Sync,
    F: Fn(&mut [E], &[R]) + Sync + Send,
{
    debug_assert_eq!(xs.len(), ys.len());
    if !parallel(xs.len()) {
        f(xs, ys);
        return;
    }
    #[cfg(feature = "rayon")]
    xs.par_chunks_mut(CHUNK)
        .zip(ys.par_chunks(CHUNK))
        .for_each(|(x, y)| f(x, y));
    #[cfg(not(feature = "rayon"))]
    f(xs, ys);
}

/// `xs` with `f` applied to each element, in order.
pub(crate) fn map<E, R, F>(xs: &[E], f: F) -> alloc::vec::Vec<R>
where
    E: Copy + Sync,
    R: Send,
    F: Fn(E) -> R + Sync + Send,
{
    if !parallel(xs.len()) {
        return xs.iter().map(|&x| f(x)).collect();
    }
    #[cfg(feature = "rayon")]
    return xs.par_iter().with_min_len(CHUNK).map(|&x| f(x)).collect();
    #[cfg(not(feature = "rayon"))]
    xs.iter().map(|&x| f(x)).collect()
}

/// `f(xs[i], ys[i])` for every `i`, in order (same length).
pub(crate) fn zip_map<E, R, F>(xs: &[E], ys: &[E], f: F) -> alloc::vec::Vec<R>
where
    E: Copy + Sync,
    R: Send,
    F: Fn(E, E) -> R + Sync + Send,
{
    debug_assert_eq!(xs.len(), ys.len());
    if !parallel(xs.len()) {
        return xs.iter().zip(ys).map(|(&a, &b)| f(a, b)).collect();
    }
    #[cfg(feature = "rayon")]
    return xs
        .par_iter()
        .zip(ys.par_iter())
        .with_min_len(CHUNK)
        .map(|(&a, &b)| f(a, b))
        .collect();
    #[cfg(not(feature = "rayon"))]
    xs.iter().zip(ys).map(|(&a, &b)| f(a, b)).collect()
}
