//! What the kernels, their launchers and the autodiff op share: the mask rule ([`MaskRule`]) and
//! the block and tile sizes.

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
