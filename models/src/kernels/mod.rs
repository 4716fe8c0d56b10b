//! flowrl's own GPU kernels, written in cubecl, for burn's cubecl backends (CUDA, and Vulkan
//! through wgpu): fused replacements of the composite tensor-op chains the layers would
//! otherwise launch kernel by kernel.
//!
//! The layers stay generic over burn's `Backend`. Each kernel has one entry point that returns
//! `None` when `B` is not a backend it has a kernel for (the CPU's Flex, or a binary built
//! without `cuda` and `vulkan`); the layer then runs its composite, which is also the kernel's
//! reference in the tests. Which backend `B` is gets decided by its type id (`on_cube!`): the
//! two cubecl runtimes compiled in, each bare or under burn's autodiff (with either
//! checkpointing strategy).
//!
//! What a kernel file holds: the `#[cube]` kernel(s), the launcher over burn-cubecl's tensors
//! and, where the kernel is used under autodiff, its backward as a burn-autodiff op.
//!
//! Deliberately not here: anything a burn op already does in one kernel (matmuls, gathers).

pub mod attention;
#[cfg(any(feature = "cuda", feature = "vulkan"))]
pub(crate) mod cube;
pub mod elementwise;
pub mod norm;
pub mod sampling;
pub(crate) mod switch;

pub use switch::{enabled, set_enabled};

/// Evaluates to `Some($body)` with `$R` the cubecl runtime of backend `$B` when `$B` is one of
/// burn's bare cubecl backends compiled into this binary ([`cube::Cube`]), to `None` for every
/// other backend (the autodiff ones included: [`on_autodiff_cube!`]).
#[allow(unused_macros)]
macro_rules! on_cube {
    ($B:ty, $R:ident => $body:expr) => {{
        #[cfg(any(feature = "cuda", feature = "vulkan"))]
        {
            match $crate::kernels::cube::bare_runtime::<$B>() {
                #[cfg(feature = "vulkan")]
                Some($crate::kernels::cube::RuntimeKind::Wgpu) => {
                    #[allow(dead_code)]
                    type $R = burn::backend::wgpu::WgpuRuntime;
                    Some($body)
                }
                #[cfg(feature = "cuda")]
                Some($crate::kernels::cube::RuntimeKind::Cuda) => {
                    #[allow(dead_code)]
                    type $R = cubecl::cuda::CudaRuntime;
                    Some($body)
                }
                None => None,
            }
        }
        #[cfg(not(any(feature = "cuda", feature = "vulkan")))]
        {
            None
        }
    }};
}
#[allow(unused_imports)]
pub(crate) use on_cube;

/// Evaluates to `Some($body)` with `$R` the cubecl runtime and `$C` the checkpointing strategy
/// of backend `$B` when `$B` is `Autodiff<Cube<R>, C>` ([`cube::autodiff_runtime`]), else to
/// `None`. Only for code compiled with `cuda` or `vulkan`.
#[cfg(any(feature = "cuda", feature = "vulkan"))]
macro_rules! on_autodiff_cube {
    ($B:ty, $R:ident, $C:ident => $body:expr) => {{
        use burn::backend::autodiff::checkpoint::strategy as strategies;
        use $crate::kernels::cube::{Checkpointing, RuntimeKind};
        match $crate::kernels::cube::autodiff_runtime::<$B>() {
            #[cfg(feature = "vulkan")]
            Some((RuntimeKind::Wgpu, Checkpointing::None)) => {
                type $R = burn::backend::wgpu::WgpuRuntime;
                type $C = strategies::NoCheckpointing;
                Some($body)
            }
            #[cfg(feature = "vulkan")]
            Some((RuntimeKind::Wgpu, Checkpointing::Balanced)) => {
                type $R = burn::backend::wgpu::WgpuRuntime;
                type $C = strategies::BalancedCheckpointing;
                Some($body)
            }
            #[cfg(feature = "cuda")]
            Some((RuntimeKind::Cuda, Checkpointing::None)) => {
                type $R = cubecl::cuda::CudaRuntime;
                type $C = strategies::NoCheckpointing;
                Some($body)
            }
            #[cfg(feature = "cuda")]
            Some((RuntimeKind::Cuda, Checkpointing::Balanced)) => {
                type $R = cubecl::cuda::CudaRuntime;
                type $C = strategies::BalancedCheckpointing;
                Some($body)
            }
            None => None,
        }
    }};
}
#[cfg(any(feature = "cuda", feature = "vulkan"))]
pub(crate) use on_autodiff_cube;
