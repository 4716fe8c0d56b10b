//! The one place where a device becomes a burn backend.
//!
//! | device      | backend (training)                                   | cargo feature |
//! |-------------|------------------------------------------------------|---------------|
//! | `cpu:N`     | `Autodiff<Flex, BalancedCheckpointing>`              | (always)      |
//! | `cuda:N`    | `Autodiff<CubeBackend<CudaRuntime>, Balanced…>`      | `cuda`        |
//! | `vulkan:N`  | `Autodiff<CubeBackend<WgpuRuntime>, Balanced…>`      | `vulkan`      |
//!
//! Generation and log-probs without gradients run on each backend's inner backend, reached
//! through `AutodiffModule::valid`, so no autodiff graph is ever built there. Everything above this
//! module (the model resource, the node kinds, the optimizer, the data-parallel replicas) is
//! generic over [`FlowBackend`]; a node picks the monomorphised code of its model's backend once
//! per call with `on_backend!`. Edge values are plain host data ([`crate::values`]), so the node
//! kinds' interfaces do not depend on the backend.
//!
//! With `BalancedCheckpointing`, burn-autodiff keeps only the outputs of compute-bound operations
//! (matmuls, reductions, ...) for the backward pass and recomputes the memory-bound ones
//! (elementwise ops, reshapes) from them when their gradient is needed, on every backend.
//!
//! The GPU backends are burn's cubecl backends *without* burn-fusion: fused CUDA has known
//! wrong-result bugs in burn 0.21 (tracel-ai/burn #5122), and fused kernels with autotune break
//! KV-cached incremental forwards (#5257, also on Vulkan), while the unfused backends pass every
//! fixture check.

use anyhow::{Result, bail};
use burn::backend::Autodiff;
use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use flowrl_engine::DeviceSpec;
use flowrl_models::weights::Precision;

/// The backend of models on the CPU.
pub type CpuBackend = Autodiff<Flex, BalancedCheckpointing>;

/// The backend of models on NVIDIA GPUs (unfused: see the module doc).
#[cfg(feature = "cuda")]
pub type CudaBackend = Autodiff<
    burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>,
    BalancedCheckpointing,
>;

/// The backend of models on Vulkan adapters (unfused: see the module doc).
#[cfg(feature = "vulkan")]
pub type VulkanBackend = Autodiff<
    burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u8>,
    BalancedCheckpointing,
>;

/// The backend of host-side collectives ([`crate::runtime::data_parallel`]): replicas exchange host
/// vectors, whatever backend their models compute on.
pub type HostBackend = Flex;

/// Which backend a model lives on: one variant per backend compiled into this binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda,
    #[cfg(feature = "vulkan")]
    Vulkan,
}

impl BackendKind {
    /// The backend of `device`, or an error when this binary was built without it.
    pub fn of(device: DeviceSpec) -> Result<Self> {
        match device {
            DeviceSpec::Cpu(_) => Ok(BackendKind::Cpu),
            #[cfg(feature = "cuda")]
            DeviceSpec::Cuda(_) => Ok(BackendKind::Cuda),
            #[cfg(feature = "vulkan")]
            DeviceSpec::Vulkan(_) => Ok(BackendKind::Vulkan),
            #[allow(unreachable_patterns)]
            other => bail!(
                "device {other} needs a binary built with `--features {}`",
                other.type_name()
            ),
        }
    }

    /// The precision a model on this backend computes in when its resource names none
    /// ([`FlowBackend::default_precision`]).
    pub fn default_precision(self) -> Precision {
        crate::runtime::backend::on_backend!(self, B => B::default_precision())
    }
}

/// What the nodes need of a backend beyond burn's traits: the burn device of a [`DeviceSpec`]
/// and the precision models default to on it.
pub trait FlowBackend: AutodiffBackend {
    /// This backend's [`BackendKind`].
    const KIND: BackendKind;

    /// The burn device of `spec` (an error naming the driver to install when it cannot be
    /// created).
    fn device(spec: DeviceSpec) -> Result<Self::Device>;

    /// The weight precision of models whose resource does not name one: f32 on the CPU and on
    /// Vulkan (lavapipe has no 16-bit floats), bf16 on CUDA.
    fn default_precision() -> Precision {
        Precision::F32
    }

    /// Response positions per LM-head block when a node names none (`chunk`): 16 on the CPU
    /// (small blocks stay in cache), 128 on a GPU (a micro-batch of 16 rows makes a GEMM of
    /// 2048 rows, a tensor-core-friendly shape; ~1.2 GB of f32 logits at a 152k vocabulary).
    const LM_HEAD_CHUNK: usize = 16;
}

/// [`FlowBackend::LM_HEAD_CHUNK`] of the GPU backends.
pub const GPU_LM_HEAD_CHUNK: usize = 128;

/// [`FlowBackend::LM_HEAD_CHUNK`] of `device`'s backend, also for a device this binary was
/// built without (the plan of a GPU machine).
pub fn lm_head_chunk_of(device: DeviceSpec) -> usize {
    match device {
        DeviceSpec::Cpu(_) => CpuBackend::LM_HEAD_CHUNK,
        DeviceSpec::Cuda(_) | DeviceSpec::Vulkan(_) => GPU_LM_HEAD_CHUNK,
    }
}

/// [`FlowBackend::default_precision`] of `device`'s backend, also for a device this binary was
/// built without.
pub fn default_precision_of(device: DeviceSpec) -> Precision {
    match device {
        DeviceSpec::Cuda(_) => Precision::BF16,
        DeviceSpec::Cpu(_) | DeviceSpec::Vulkan(_) => Precision::F32,
    }
}

impl FlowBackend for CpuBackend {
    const KIND: BackendKind = BackendKind::Cpu;

    /// Every `cpu:N` is the one Flex device: CPU replicas share the machine's cores.
    fn device(spec: DeviceSpec) -> Result<Self::Device> {
        match spec {
            DeviceSpec::Cpu(_) => Ok(Default::default()),
            other => bail!("{other} is not a CPU device"),
        }
    }
}

#[cfg(feature = "cuda")]
impl FlowBackend for CudaBackend {
    const KIND: BackendKind = BackendKind::Cuda;
    const LM_HEAD_CHUNK: usize = GPU_LM_HEAD_CHUNK;

    fn device(spec: DeviceSpec) -> Result<Self::Device> {
        let DeviceSpec::Cuda(index) = spec else {
            bail!("{spec} is not a CUDA device");
        };
        let device = burn::backend::cuda::CudaDevice { index };
        probe::<Self>(&device, spec).map_err(|e| {
            anyhow::anyhow!(
                "CUDA device {spec} could not be used: {e}. The CUDA backend needs the NVIDIA \
                 driver and, at run time, the CUDA toolkit's NVRTC library (set \
                 CUDARC_CUDA_VERSION when building for another CUDA version)"
            )
        })?;
        Ok(device)
    }

    fn default_precision() -> Precision {
        default_precision_of(DeviceSpec::Cuda(0))
    }
}

#[cfg(feature = "vulkan")]
impl FlowBackend for VulkanBackend {
    const KIND: BackendKind = BackendKind::Vulkan;
    const LM_HEAD_CHUNK: usize = GPU_LM_HEAD_CHUNK;

    /// `vulkan:0` is the adapter wgpu prefers (a discrete GPU before an integrated one before a
    /// software driver); `vulkan:N` (N ≥ 1) is discrete GPU N in wgpu's order.
    fn device(spec: DeviceSpec) -> Result<Self::Device> {
        use burn::backend::wgpu::WgpuDevice;
        let DeviceSpec::Vulkan(index) = spec else {
            bail!("{spec} is not a Vulkan device");
        };
        let device = match index {
            0 => WgpuDevice::DefaultDevice,
            n => WgpuDevice::DiscreteGpu(n),
        };
        probe::<Self>(&device, spec).map_err(|e| {
            anyhow::anyhow!(
                "no Vulkan adapter could be opened for {spec} ({e}). Install a Vulkan driver: \
                 on Debian or Ubuntu `apt-get install mesa-vulkan-drivers` (Mesa's lavapipe, a \
                 software driver, runs everywhere), or run on `--device cpu`"
            )
        })?;
        Ok(device)
    }
}

/// Creates a tensor on `device` and reads it back: device creation in cubecl panics (no adapter,
/// no driver), so the panic is caught here and becomes an error before any model is loaded.
/// Each device is probed once per process.
#[cfg(any(feature = "cuda", feature = "vulkan"))]
fn probe<B: Backend>(device: &B::Device, spec: DeviceSpec) -> Result<()> {
    static WORKING: std::sync::Mutex<Vec<DeviceSpec>> = std::sync::Mutex::new(Vec::new());
    let mut working = WORKING.lock().unwrap_or_else(|e| e.into_inner());
    if working.contains(&spec) {
        return Ok(());
    }
    let device = device.clone();
    // The device is created on cubecl's own thread, whose panic (the cause: "No possible
    // adapter available ...") reaches this thread as a second one; the default hook would print
    // both with backtraces. Record the messages instead, and report the first.
    let messages = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let previous = std::panic::take_hook();
    let record = messages.clone();
    std::panic::set_hook(Box::new(move |info| {
        let text = panic_message(info.payload());
        record.lock().unwrap_or_else(|e| e.into_inner()).push(text);
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let t = Tensor::<B, 1>::from_floats([1.0, 2.0], &device).sum();
        t.into_scalar().elem::<f32>()
    }));
    std::panic::set_hook(previous);
    match result {
        Ok(v) if v == 3.0 => {
            working.push(spec);
            Ok(())
        }
        Ok(v) => bail!("a test sum on {spec} gave {v} instead of 3"),
        Err(payload) => {
            let messages = messages.lock().unwrap_or_else(|e| e.into_inner());
            let first = messages
                .first()
                .cloned()
                .unwrap_or_else(|| panic_message(payload.as_ref()));
            Err(anyhow::anyhow!("{first}"))
        }
    }
}

/// The text of a panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)")
        .to_string()
}

/// The device a module's parameters live on.
pub fn device_of<B: Backend, M: burn::module::Module<B>>(module: &M) -> B::Device {
    module.devices().into_iter().next().unwrap_or_default()
}

/// Runs `$body` with the type alias `$B` set to the backend of `$kind` (a [`BackendKind`]): the
/// single dispatch from a runtime device to monomorphised code.
///
/// ```ignore
/// on_backend!(model.backend(), B => run_on::<B>(&model, inputs))
/// ```
macro_rules! on_backend {
    ($kind:expr, $B:ident => $body:expr) => {
        match $kind {
            $crate::runtime::backend::BackendKind::Cpu => {
                type $B = $crate::runtime::backend::CpuBackend;
                $body
            }
            #[cfg(feature = "cuda")]
            $crate::runtime::backend::BackendKind::Cuda => {
                type $B = $crate::runtime::backend::CudaBackend;
                $body
            }
            #[cfg(feature = "vulkan")]
            $crate::runtime::backend::BackendKind::Vulkan => {
                type $B = $crate::runtime::backend::VulkanBackend;
                $body
            }
        }
    };
}
pub(crate) use on_backend;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_map_to_their_backend_or_name_the_feature() {
        assert_eq!(
            BackendKind::of(DeviceSpec::Cpu(3)).unwrap(),
            BackendKind::Cpu
        );
        #[cfg(not(feature = "cuda"))]
        {
            let e = BackendKind::of(DeviceSpec::Cuda(0))
                .unwrap_err()
                .to_string();
            assert!(e.contains("--features cuda"), "{e}");
        }
        #[cfg(not(feature = "vulkan"))]
        {
            let e = BackendKind::of(DeviceSpec::Vulkan(0))
                .unwrap_err()
                .to_string();
            assert!(e.contains("--features vulkan"), "{e}");
        }
        let e = CpuBackend::device(DeviceSpec::Cuda(0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cuda:0"), "{e}");
    }
}
