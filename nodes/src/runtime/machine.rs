//! What this machine's devices hold and compute, for the plan ([`flowrl_engine::plan`]): a
//! CPU's matmul throughput measured once per process (a short calibration on the Flex backend
//! the CPU nodes run on), a GPU's memory from `nvidia-smi` and its throughput from its
//! datasheet, and how much memory a CPU device has held so far (`perf/max_memory_allocated_gb`).

use std::sync::OnceLock;
use std::time::Instant;

use burn::backend::Flex;
use burn::prelude::*;
use flowrl_engine::DeviceSpec;
use flowrl_engine::plan::{DeviceInfo, DeviceProbe, GpuModel, process_peak_rss_bytes};

/// The probe of this machine's devices.
pub struct MachineProbe;

/// Rows, inner and output widths of the calibration matmul (a decoder layer's projection of a
/// micro-batch: large enough for gemm's packed kernels, small enough to run in about 0.1 s).
const CALIBRATION: [usize; 3] = [512, 1024, 1024];

/// f32 operations per second of the Flex backend's matmul on this machine: the best of five
/// timed products after one warm-up.
fn cpu_flops() -> f64 {
    static FLOPS: OnceLock<f64> = OnceLock::new();
    *FLOPS.get_or_init(|| {
        let [m, k, n] = CALIBRATION;
        let device = Default::default();
        let a = Tensor::<Flex, 2>::ones([m, k], &device);
        let b = Tensor::<Flex, 2>::ones([k, n], &device);
        let _ = a.clone().matmul(b.clone()).into_data();
        let best = (0..5)
            .map(|_| {
                let start = Instant::now();
                let _ = a.clone().matmul(b.clone()).into_data();
                start.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        2.0 * (m * k * n) as f64 / best.max(1e-9)
    })
}

impl DeviceProbe for MachineProbe {
    fn probe(&self, device: DeviceSpec) -> DeviceInfo {
        match device {
            DeviceSpec::Cpu(_) => {
                let [m, k, n] = CALIBRATION;
                DeviceInfo {
                    memory: None,
                    flops: vec![("f32".into(), cpu_flops())],
                    flops_source: format!(
                        "measured: a {m}×{k} by {k}×{n} f32 matmul on this machine's {} threads",
                        rayon_threads()
                    ),
                }
            }
            DeviceSpec::Cuda(i) => {
                let (model, memory) = GpuModel::detect(i);
                let mut info = model.map(GpuModel::info).unwrap_or_default();
                if let Some(bytes) = memory {
                    info.memory = Some((bytes, "nvidia-smi memory.total".into()));
                }
                info
            }
            DeviceSpec::Vulkan(_) => DeviceInfo::default(),
        }
    }

    /// A CPU device's: the process's resident peak. A GPU's is not known: cubecl 0.10 keeps its
    /// memory accounts per stream (one per thread) and no high-water mark, so no thread can read
    /// the peak of the node threads' buffers.
    fn max_memory_allocated(&self, device: DeviceSpec) -> Option<u64> {
        match device {
            DeviceSpec::Cpu(_) => process_peak_rss_bytes(),
            _ => None,
        }
    }
}

/// Threads burn's CPU kernels use.
fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
