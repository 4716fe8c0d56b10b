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
//! loaded once), one thread per query row; key tiles of `params::tile` keys are staged in
//! shared memory. The dK/dV kernel turns it around: one thread per key, query tiles staged. These
//! are CUDA-core ("unit") kernels; a tensor-core variant is a later step.

use burn::prelude::*;

#[cfg(any(feature = "cuda", feature = "vulkan"))]
mod autodiff;
#[cfg(any(feature = "cuda", feature = "vulkan"))]
mod kernel;
#[cfg(any(feature = "cuda", feature = "vulkan"))]
mod launch;
mod params;

pub use params::MaskRule;

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
        if let Some(out) = super::on_cube!(B, R => launch::forward_bare::<B, R>(q.clone(), k.clone(), v.clone(), segments, rule, scale))
        {
            return Some(out);
        }
        super::on_autodiff_cube!(B, R, C => autodiff::forward_tracked::<B, R, C>(q, k, v, segments, rule, scale))
    }
    #[cfg(not(any(feature = "cuda", feature = "vulkan")))]
    {
        let _ = (q, k, v, segments, rule, scale);
        None
    }
}
