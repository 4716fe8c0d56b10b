//! The cubecl backends flowrl's kernels run on, and the moves between a generic `Tensor<B, D>`
//! and the runtime's own tensors.

use burn::prelude::*;
use burn::tensor::{DType, Shape, TensorPrimitive};
pub(crate) use burn_cubecl::CubeRuntime;
pub(crate) use burn_cubecl::tensor::CubeTensor;

use super::switch::{cast, enabled, same};

/// burn's cubecl backend as flowrl's GPU devices use it: f32 floats (bf16 tensors are a dtype
/// of the same backend), i32 ints, u8 bools, no fusion (nodes/src/runtime/backend.rs).
pub(crate) type Cube<R> = burn_cubecl::CubeBackend<R, f32, i32, u8>;

/// The cubecl runtimes compiled into this binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RuntimeKind {
    #[cfg(feature = "vulkan")]
    Wgpu,
    #[cfg(feature = "cuda")]
    Cuda,
}

/// The runtime of `B` when `B` is a bare [`Cube`] backend (and the kernels are
/// [`enabled`]).
pub(crate) fn bare_runtime<B: 'static>() -> Option<RuntimeKind> {
    if !enabled() {
        return None;
    }
    #[cfg(feature = "vulkan")]
    if same::<B, Cube<burn::backend::wgpu::WgpuRuntime>>() {
        return Some(RuntimeKind::Wgpu);
    }
    #[cfg(feature = "cuda")]
    if same::<B, Cube<cubecl::cuda::CudaRuntime>>() {
        return Some(RuntimeKind::Cuda);
    }
    None
}

/// burn-autodiff's checkpointing strategies, for [`autodiff_runtime`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checkpointing {
    None,
    Balanced,
}

/// The runtime and checkpointing strategy of `B` when `B` is `Autodiff<Cube<R>, C>` (and the
/// kernels are [`enabled`]).
pub(crate) fn autodiff_runtime<B: 'static>() -> Option<(RuntimeKind, Checkpointing)> {
    if !enabled() {
        return None;
    }
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
    #[cfg(feature = "vulkan")]
    {
        type R = burn::backend::wgpu::WgpuRuntime;
        if same::<B, Autodiff<Cube<R>, NoCheckpointing>>() {
            return Some((RuntimeKind::Wgpu, Checkpointing::None));
        }
        if same::<B, Autodiff<Cube<R>, BalancedCheckpointing>>() {
            return Some((RuntimeKind::Wgpu, Checkpointing::Balanced));
        }
    }
    #[cfg(feature = "cuda")]
    {
        type R = cubecl::cuda::CudaRuntime;
        if same::<B, Autodiff<Cube<R>, NoCheckpointing>>() {
            return Some((RuntimeKind::Cuda, Checkpointing::None));
        }
        if same::<B, Autodiff<Cube<R>, BalancedCheckpointing>>() {
            return Some((RuntimeKind::Cuda, Checkpointing::Balanced));
        }
    }
    None
}

/// The float primitive of a tensor of `B`, which [`bare_runtime`] said is `Cube<R>`.
pub(crate) fn primitive<B: Backend, R: CubeRuntime, const D: usize>(
    t: Tensor<B, D>,
) -> CubeTensor<R> {
    let t: Tensor<Cube<R>, D> = cast(t);
    t.into_primitive().tensor()
}

/// The int primitive of an int tensor of `B` (`Cube<R>`).
pub(crate) fn int_primitive<B: Backend, R: CubeRuntime, const D: usize>(
    t: Tensor<B, D, Int>,
) -> CubeTensor<R> {
    let t: Tensor<Cube<R>, D, Int> = cast(t);
    t.into_primitive()
}

/// A tensor of `B` (`Cube<R>`) from a float primitive.
pub(crate) fn tensor<B: Backend, R: CubeRuntime, const D: usize>(t: CubeTensor<R>) -> Tensor<B, D> {
    let t = Tensor::<Cube<R>, D>::from_primitive(TensorPrimitive::Float(t));
    cast(t)
}

/// A cube count covering `n` cubes along x (and y beyond the 65535 most runtimes take along one
/// axis); the kernel reads its index as `CUBE_POS_Y · CUBE_COUNT_X + CUBE_POS_X` and skips the
/// `x·y − n` extra cubes.
pub(crate) fn cube_count_1d(n: usize) -> burn_cubecl::cubecl::CubeCount {
    let x = n.clamp(1, 65_535);
    let y = n.div_ceil(x).max(1);
    burn_cubecl::cubecl::CubeCount::Static(x as u32, y as u32, 1)
}

/// An uninitialised tensor of `shape` and `dtype` on `like`'s device.
pub(crate) fn empty<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: impl Into<Shape>,
    dtype: DType,
) -> CubeTensor<R> {
    burn_cubecl::ops::numeric::empty_device_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        dtype,
    )
}

/// An uninitialised tensor of `like`'s shape in `dtype`, on its device.
pub(crate) fn empty_like<R: CubeRuntime>(like: &CubeTensor<R>, dtype: DType) -> CubeTensor<R> {
    empty(like, like.meta.shape().clone(), dtype)
}

/// The float primitive of a tensor of `B`, which is the autodiff backend `AD`
/// ([`autodiff_runtime`]): an autodiff tensor, its graph kept.
pub(crate) fn tracked<B: Backend, AD: Backend, const D: usize>(
    t: Tensor<B, D>,
) -> AD::FloatTensorPrimitive {
    let t: Tensor<AD, D> = cast(t);
    t.into_primitive().tensor()
}

/// A tensor of `B` (= the autodiff backend `AD`) from an autodiff float primitive.
pub(crate) fn from_tracked<B: Backend, AD: Backend, const D: usize>(
    t: AD::FloatTensorPrimitive,
) -> Tensor<B, D> {
    cast(Tensor::<AD, D>::from_primitive(TensorPrimitive::Float(t)))
}
