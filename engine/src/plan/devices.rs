//! What the plan knows of a device: its memory and its throughput, each with where the number
//! comes from (this machine, or a datasheet for a machine described by `--gpu`).

use crate::device::DeviceSpec;

/// A device's memory and throughput.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceInfo {
    /// Bytes the device can hold, and where that number comes from.
    pub memory: Option<(u64, String)>,
    /// Floating-point operations per second by precision (`"f32"`, `"bf16"`), and the source.
    pub flops: Vec<(String, f64)>,
    pub flops_source: String,
}

impl DeviceInfo {
    /// Operations per second in `precision` (f32's when that precision has no figure).
    pub fn flops_per_second(&self, precision: &str) -> Option<f64> {
        let find = |p: &str| self.flops.iter().find(|(q, _)| q == p).map(|(_, f)| *f);
        find(precision).or_else(|| find("f32"))
    }
}

/// Measures this machine's devices (the crate that links the backends implements it: a CPU's
/// matmul speed is burn's).
pub trait DeviceProbe: Send + Sync {
    /// Memory and throughput of `device`.
    fn probe(&self, device: DeviceSpec) -> DeviceInfo;
    /// The most memory `device` has held so far in this process (a CPU device: the process's
    /// resident peak), for `perf/max_memory_allocated_gb`.
    fn max_memory_allocated(&self, device: DeviceSpec) -> Option<u64> {
        let _ = device;
        None
    }
}

/// A GPU model's datasheet figures (dense, without sparsity), for planning on a machine that
/// is not this one (`flowrl plan --gpu h200 --gpus 8`) and for a GPU this machine has.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuModel {
    /// What `--gpu` takes, and what `nvidia-smi` names contain (lowercase).
    pub name: &'static str,
    pub memory_bytes: u64,
    /// Tensor-core bf16 operations per second.
    pub bf16_flops: f64,
    /// f32 operations per second (CUDA cores; TF32 tensor cores are not used for f32).
    pub f32_flops: f64,
    /// Where the figures come from.
    pub source: &'static str,
}

/// Datasheet figures of the GPUs flowrl's users train on.
pub const GPU_MODELS: &[GpuModel] = &[
    GpuModel {
        name: "h200",
        memory_bytes: 141_000_000_000,
        bf16_flops: 989e12,
        f32_flops: 67e12,
        source: "NVIDIA H200 SXM datasheet: 141 GB, 989 TFLOPS bf16 dense, 67 TFLOPS fp32",
    },
    GpuModel {
        name: "h100",
        memory_bytes: 80_000_000_000,
        bf16_flops: 989e12,
        f32_flops: 67e12,
        source: "NVIDIA H100 SXM datasheet: 80 GB, 989 TFLOPS bf16 dense, 67 TFLOPS fp32",
    },
    GpuModel {
        name: "a100",
        memory_bytes: 80_000_000_000,
        bf16_flops: 312e12,
        f32_flops: 19.5e12,
        source: "NVIDIA A100 80GB SXM datasheet: 80 GB, 312 TFLOPS bf16 dense, 19.5 TFLOPS fp32",
    },
];

impl GpuModel {
    /// The model `--gpu` names (case-insensitive).
    pub fn named(name: &str) -> Option<&'static GpuModel> {
        let name = name.to_ascii_lowercase();
        GPU_MODELS.iter().find(|g| g.name == name)
    }

    /// The device description the datasheet gives.
    pub fn info(&self) -> DeviceInfo {
        DeviceInfo {
            memory: Some((
                self.memory_bytes,
                format!("{} (datasheet)", self.name.to_uppercase()),
            )),
            flops: vec![
                ("bf16".into(), self.bf16_flops),
                ("f32".into(), self.f32_flops),
            ],
            flops_source: self.source.to_string(),
        }
    }

    /// The GPU `nvidia-smi` reports as device `index` on this machine, with its total memory
    /// (`None` without the driver's tool or for a model not in [`GPU_MODELS`]: then only the
    /// memory is known).
    pub fn detect(index: usize) -> (Option<&'static GpuModel>, Option<u64>) {
        let out = std::process::Command::new("nvidia-smi")
            .args([
                "--query-gpu=name,memory.total",
                "--format=csv,noheader,nounits",
            ])
            .args(["-i", &index.to_string()])
            .output();
        let Ok(out) = out else { return (None, None) };
        let text = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
        let mut fields = text.trim().split(',').map(str::trim);
        let name = fields.next().unwrap_or("");
        let mib = fields.next().and_then(|m| m.parse::<u64>().ok());
        let model = GPU_MODELS.iter().find(|g| name.contains(g.name));
        (model, mib.map(|m| m << 20))
    }
}

/// `MemAvailable` of `/proc/meminfo`: what the host can give this process without swapping.
pub fn host_available_bytes() -> Option<u64> {
    meminfo_kib("/proc/meminfo", "MemAvailable:").map(|k| k << 10)
}

/// This process's resident set now (`VmRSS` of `/proc/self/status`).
pub fn process_rss_bytes() -> Option<u64> {
    meminfo_kib("/proc/self/status", "VmRSS:").map(|k| k << 10)
}

/// This process's resident peak so far (`VmHWM` of `/proc/self/status`), what `/usr/bin/time`
/// reports as maximum resident set size.
pub fn process_peak_rss_bytes() -> Option<u64> {
    meminfo_kib("/proc/self/status", "VmHWM:").map(|k| k << 10)
}

/// A `KEY: N kB` line of a /proc file.
fn meminfo_kib(file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}
