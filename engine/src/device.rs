//! Devices: where a node runs. `auto` resolves at run time to CUDA when the binary was built with
//! the `cuda` feature and a GPU is present, else to the CPU (burn's Flex backend).
//!
//! GPU presence is detected from the NVIDIA kernel driver's `/proc/driver/nvidia/gpus` entries, which
//! never panics and needs no CUDA library; the CUDA runtime itself is only touched by the nodes that
//! create tensors on the device. Mapping a [`DeviceSpec`] to a burn device is the nodes' job.

use std::fmt;
use std::str::FromStr;

/// A concrete device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A device as written by a user: `auto`, `cpu`, `cuda`, `cuda:N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceRequest {
    Auto,
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceRequest {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" => Ok(DeviceRequest::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DeviceRequest::Cuda(n)),
                _ => Err(format!(
                    "`{s}` is not a device; expected `auto`, `cpu`, `cuda` or `cuda:N`"
                )),
            },
        }
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRequest::Auto => f.write_str("auto"),
            DeviceRequest::Cpu => f.write_str("cpu"),
            DeviceRequest::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Whether this binary was built with the `cuda` feature.
pub const fn cuda_compiled() -> bool {
    cfg!(feature = "cuda")
}

/// Number of NVIDIA GPUs the kernel driver reports (0 without a driver).
pub fn gpu_count() -> usize {
    std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|d| d.filter_map(Result::ok).count())
        .unwrap_or(0)
}

impl DeviceRequest {
    /// Resolves the request on this machine; an error says why a CUDA device is unavailable.
    pub fn resolve(self) -> Result<DeviceSpec, String> {
        match self {
            DeviceRequest::Cpu => Ok(DeviceSpec::Cpu),
            DeviceRequest::Auto => {
                if cuda_compiled() && gpu_count() > 0 {
                    Ok(DeviceSpec::Cuda(0))
                } else {
                    Ok(DeviceSpec::Cpu)
                }
            }
            DeviceRequest::Cuda(n) => {
                if !cuda_compiled() {
                    return Err(format!(
                        "device cuda:{n} requested, but this binary was built without CUDA \
                         (rebuild with `--features cuda`)"
                    ));
                }
                let count = gpu_count();
                if n >= count {
                    return Err(format!(
                        "device cuda:{n} requested, but {count} NVIDIA GPU(s) are visible"
                    ));
                }
                Ok(DeviceSpec::Cuda(n))
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
        assert_eq!("cuda".parse(), Ok(DeviceRequest::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceRequest::Cuda(3)));
        assert!("gpu".parse::<DeviceRequest>().is_err());
        assert!("cuda:x".parse::<DeviceRequest>().is_err());
        assert_eq!(DeviceRequest::Cpu.resolve(), Ok(DeviceSpec::Cpu));
    }

    #[test]
    fn auto_falls_back_to_cpu_without_cuda() {
        let d = DeviceRequest::Auto.resolve().unwrap();
        if !cuda_compiled() || gpu_count() == 0 {
            assert_eq!(d, DeviceSpec::Cpu);
        }
    }
}
