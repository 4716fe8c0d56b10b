//! Devices: where a node runs. `auto` resolves to CUDA when the binary was built with the `cuda`
//! feature and a GPU is present, else to the CPU (burn's Flex backend).
//!
//! `cpu:N` names a logical CPU replica: several replicas on the CPU share its cores, which is how
//! data parallelism is tested without GPUs. `vulkan:N` is a Vulkan adapter (burn's wgpu backend,
//! feature `vulkan`): it runs the same cubecl kernels as CUDA, which is how the GPU code path is
//! tested on machines without a GPU (Mesa's software driver). `cpu` is `cpu:0`, `cuda` is
//! `cuda:0`, `vulkan` is `vulkan:0`.
//!
//! GPU presence is detected from the NVIDIA kernel driver's `/proc/driver/nvidia/gpus` entries, which
//! never panics and needs no CUDA library; the CUDA runtime itself is only touched by the nodes that
//! create tensors on the device. Mapping a [`DeviceSpec`] to a burn device is the nodes' job.

use std::fmt;
use std::str::FromStr;

/// A concrete device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DeviceSpec {
    /// Logical CPU replica `N` (all replicas share the CPU's cores).
    Cpu(usize),
    /// NVIDIA GPU `N`.
    Cuda(usize),
    /// Vulkan adapter `N`.
    Vulkan(usize),
}

impl DeviceSpec {
    /// `"cpu"`, `"cuda"` or `"vulkan"`: devices of one run must all have the same type.
    pub fn type_name(self) -> &'static str {
        match self {
            DeviceSpec::Cpu(_) => "cpu",
            DeviceSpec::Cuda(_) => "cuda",
            DeviceSpec::Vulkan(_) => "vulkan",
        }
    }

    /// The device's index within its type.
    pub fn index(self) -> usize {
        match self {
            DeviceSpec::Cpu(n) | DeviceSpec::Cuda(n) | DeviceSpec::Vulkan(n) => n,
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.type_name(), self.index())
    }
}

/// Devices shown as `cpu:0, cpu:1`.
pub fn device_list(devices: &[DeviceSpec]) -> String {
    devices
        .iter()
        .map(DeviceSpec::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A device as written by a user: `auto`, or a device of a type with an optional index
/// (`cpu`, `cpu:N`, `cuda`, `cuda:N`, `vulkan`, `vulkan:N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceRequest {
    Auto,
    Device(DeviceSpec),
}

impl FromStr for DeviceRequest {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(DeviceRequest::Auto);
        }
        let (kind, index) = match s.split_once(':') {
            Some((kind, index)) => (kind, index.parse::<usize>().ok()),
            None => (s, Some(0)),
        };
        let device = match (kind, index) {
            ("cpu", Some(n)) => DeviceSpec::Cpu(n),
            ("cuda", Some(n)) => DeviceSpec::Cuda(n),
            ("vulkan", Some(n)) => DeviceSpec::Vulkan(n),
            _ => {
                return Err(format!(
                    "`{s}` is not a device; expected `auto`, `cpu`, `cpu:N`, `cuda`, `cuda:N`, \
                     `vulkan` or `vulkan:N`"
                ));
            }
        };
        Ok(DeviceRequest::Device(device))
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRequest::Auto => f.write_str("auto"),
            DeviceRequest::Device(d) => d.fmt(f),
        }
    }
}

/// Whether this binary was built with the `cuda` feature.
pub const fn cuda_compiled() -> bool {
    cfg!(feature = "cuda")
}

/// Whether this binary was built with the `vulkan` feature.
pub const fn vulkan_compiled() -> bool {
    cfg!(feature = "vulkan")
}

/// Number of NVIDIA GPUs the kernel driver reports (0 without a driver).
pub fn gpu_count() -> usize {
    std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|d| d.filter_map(Result::ok).count())
        .unwrap_or(0)
}

/// What a graph's devices are checked against: whether CUDA and Vulkan are compiled in and how
/// many GPUs there are. [`Machine::detect`] reads this machine; tests construct other machines (a
/// 2-GPU machine, say) to check placement messages without the hardware. Vulkan adapters are not
/// counted here (that needs the Vulkan loader): a missing one is reported when the node that
/// uses it creates the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Machine {
    pub cuda_compiled: bool,
    pub gpus: usize,
    pub vulkan_compiled: bool,
}

impl Machine {
    /// This binary on this machine.
    pub fn detect() -> Self {
        Machine {
            cuda_compiled: cuda_compiled(),
            gpus: gpu_count(),
            vulkan_compiled: vulkan_compiled(),
        }
    }

    /// Resolves a request; `auto` is `cuda:0` when CUDA is compiled in and a GPU is present, else
    /// `cpu:0`. An unavailable CUDA device is an error that says why, to be completed by the
    /// caller as "`<what>` is placed on cuda:N, but `<reason>`".
    pub fn resolve(&self, req: DeviceRequest) -> Result<DeviceSpec, Unavailable> {
        match req {
            DeviceRequest::Auto if self.cuda_compiled && self.gpus > 0 => Ok(DeviceSpec::Cuda(0)),
            DeviceRequest::Auto => Ok(DeviceSpec::Cpu(0)),
            DeviceRequest::Device(d @ DeviceSpec::Cpu(_)) => Ok(d),
            DeviceRequest::Device(d @ DeviceSpec::Cuda(n)) => {
                if !self.cuda_compiled {
                    Err(Unavailable::NoCudaBuild)
                } else if n >= self.gpus {
                    Err(Unavailable::NoSuchGpu { gpus: self.gpus })
                } else {
                    Ok(d)
                }
            }
            DeviceRequest::Device(d @ DeviceSpec::Vulkan(_)) => {
                if self.vulkan_compiled {
                    Ok(d)
                } else {
                    Err(Unavailable::NoVulkanBuild)
                }
            }
        }
    }
}

/// Why a requested CUDA device cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The binary was built without the `cuda` feature.
    NoCudaBuild,
    /// The binary was built without the `vulkan` feature.
    NoVulkanBuild,
    /// The index is not below the number of GPUs.
    NoSuchGpu { gpus: usize },
}

impl fmt::Display for Unavailable {
    /// The reason, e.g. "this machine has 2 GPUs (cuda:0, cuda:1)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Unavailable::NoCudaBuild => f.write_str("this binary was built without CUDA"),
            Unavailable::NoVulkanBuild => f.write_str("this binary was built without Vulkan"),
            Unavailable::NoSuchGpu { gpus: 0 } => f.write_str("this machine has no NVIDIA GPU"),
            Unavailable::NoSuchGpu { gpus } => {
                let all: Vec<DeviceSpec> = (0..gpus).map(DeviceSpec::Cuda).collect();
                let s = if gpus == 1 { "" } else { "s" };
                write!(f, "this machine has {gpus} GPU{s} ({})", device_list(&all))
            }
        }
    }
}

impl Unavailable {
    /// What to do about it.
    pub fn help(&self) -> &'static str {
        match self {
            Unavailable::NoCudaBuild => "rebuild with `cargo build --release --features cuda`",
            Unavailable::NoVulkanBuild => {
                "rebuild with `cargo build --release --features vulkan` (and install a Vulkan \
                 driver, e.g. Debian's `mesa-vulkan-drivers`)"
            }
            Unavailable::NoSuchGpu { .. } => {
                "place it on one of the GPUs listed, or on the CPU (`cpu:N`)"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests() {
        assert_eq!("auto".parse(), Ok(DeviceRequest::Auto));
        let dev = DeviceRequest::Device;
        assert_eq!("cpu".parse(), Ok(dev(DeviceSpec::Cpu(0))));
        assert_eq!("cpu:5".parse(), Ok(dev(DeviceSpec::Cpu(5))));
        assert_eq!("cuda".parse(), Ok(dev(DeviceSpec::Cuda(0))));
        assert_eq!("cuda:3".parse(), Ok(dev(DeviceSpec::Cuda(3))));
        assert_eq!("vulkan".parse(), Ok(dev(DeviceSpec::Vulkan(0))));
        assert_eq!("vulkan:1".parse(), Ok(dev(DeviceSpec::Vulkan(1))));
        for bad in [
            "gpu", "cuda:x", "cpu:", "cpu:-1", "CPU", "vulkan:", "auto:0",
        ] {
            let err = bad.parse::<DeviceRequest>().unwrap_err();
            assert!(err.contains("`vulkan:N`"), "{bad}: {err}");
        }
        assert_eq!(
            Machine::detect().resolve(dev(DeviceSpec::Cpu(2))),
            Ok(DeviceSpec::Cpu(2))
        );
        assert_eq!(DeviceSpec::Cpu(0).to_string(), "cpu:0");
        assert_eq!(DeviceSpec::Cuda(1).to_string(), "cuda:1");
        assert_eq!(DeviceSpec::Vulkan(0).to_string(), "vulkan:0");
    }

    #[test]
    fn auto_falls_back_to_cpu_without_cuda() {
        let d = Machine::detect().resolve(DeviceRequest::Auto).unwrap();
        if !cuda_compiled() || gpu_count() == 0 {
            assert_eq!(d, DeviceSpec::Cpu(0));
        }
    }

    #[test]
    fn machines_resolve_with_the_numbers() {
        let cuda = |n| DeviceRequest::Device(DeviceSpec::Cuda(n));
        let two = Machine {
            cuda_compiled: true,
            gpus: 2,
            vulkan_compiled: false,
        };
        assert_eq!(two.resolve(DeviceRequest::Auto), Ok(DeviceSpec::Cuda(0)));
        assert_eq!(two.resolve(cuda(1)), Ok(DeviceSpec::Cuda(1)));
        let err = two.resolve(cuda(3)).unwrap_err();
        assert_eq!(err.to_string(), "this machine has 2 GPUs (cuda:0, cuda:1)");
        let one = Machine { gpus: 1, ..two };
        assert_eq!(
            one.resolve(cuda(1)).unwrap_err().to_string(),
            "this machine has 1 GPU (cuda:0)"
        );
        let none = Machine { gpus: 0, ..two };
        assert_eq!(none.resolve(DeviceRequest::Auto), Ok(DeviceSpec::Cpu(0)));
        let cpu_only = Machine {
            cuda_compiled: false,
            gpus: 4,
            vulkan_compiled: false,
        };
        assert_eq!(
            cpu_only.resolve(DeviceRequest::Auto),
            Ok(DeviceSpec::Cpu(0))
        );
        assert_eq!(cpu_only.resolve(cuda(0)), Err(Unavailable::NoCudaBuild));
        let vulkan = DeviceRequest::Device(DeviceSpec::Vulkan(0));
        assert_eq!(cpu_only.resolve(vulkan), Err(Unavailable::NoVulkanBuild));
        let with_vulkan = Machine {
            vulkan_compiled: true,
            ..cpu_only
        };
        assert_eq!(with_vulkan.resolve(vulkan), Ok(DeviceSpec::Vulkan(0)));
        // `auto` never picks Vulkan: it is a test and portability backend, not a default.
        assert_eq!(
            with_vulkan.resolve(DeviceRequest::Auto),
            Ok(DeviceSpec::Cpu(0))
        );
    }
}
