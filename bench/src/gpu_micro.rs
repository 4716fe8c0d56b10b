//! `bench-gpu-micro`: the micro-benchmarks that settle the GPU performance model's assumptions
//! (shared/research/gpu_path.md §1.6, §1.7, §6), measured with burn's tensor API on the unfused
//! cubecl backend the nodes run on (`CubeBackend<R, f32, i32, u8>`), generic over the cubecl
//! runtime `R`: CUDA on a GPU (bench/gpu/check.sh's `micro` step, bf16), Vulkan here (lavapipe:
//! a dry run of the same code at reduced sizes, f32, since lavapipe has no bf16 and caps a
//! buffer at 128 MiB).
//!
//!     bench-gpu-micro --device cuda   [--budget-s 50] [--jsonl FILE]
//!     bench-gpu-micro --device vulkan                          (reduced sizes: --small)
//!
//! `--small` (the default on Vulkan) divides the GEMMs' N and K by 8 and takes M = 512, 64 and
//! 1024, the reads by 10, the elementwise tensors by 16: every buffer stays under lavapipe's
//! 128 MiB. `--help` lists the other options.
//!
//! Sections, in this order (each record is printed as one JSON line when it is measured, and
//! appended to `--jsonl`, so a run cut by a timeout keeps what it measured; a markdown table of
//! everything follows at the end):
//!
//! 1. **launch**: µs per kernel launch, 10 000 `add_scalar`s on a 1-element tensor, timed from a
//!    synced device to a synced device; also the host's issue time alone (before the final sync).
//! 2. **read**: device → host bandwidth of `into_data` for 100 MB and 311 MB f32 tensors (311 MB is
//!    the rollout's logits read, 512 rows × 151 936 f32), median of 3 after a warm-up read.
//! 3. **elementwise**: GB/s of `a + b` over 256 MB tensors, contiguous and with a row broadcast.
//! 4. **first pass**: build, first and second forward, first and second forward + backward of a
//!    small model, under `Autodiff` as the update runs it: on CUDA a 2-layer slice of
//!    `bench/gpu/qwen2_5_vl_3b/config.json` (the 3B's widths, vocabulary and vision blocks, so
//!    its kernels and autotune keys are those of the 3B step, which then finds them in the
//!    caches), 16 rows of a 109-token prompt with one 224×224 image each (the 3B step's prefill);
//!    on Vulkan `assets/tiny-qwen2-vl/config.json`, 2 rows. first − second ≈ kernel
//!    compilation and autotune. It comes before the GEMMs because that cost is only measurable with cold
//!    caches (a first run), while the GEMMs' throughput is the same on a second run.
//! 5. **gemm**: TFLOP/s of `x · Wᵀ` (`W` stored `[N, K]` as `layers::Linear` holds it) at the
//!    Qwen2.5-VL-3B shapes N×K = 2048×2048 (o_proj, q_proj), 2560×2048 (q/k/v fused width),
//!    11008×2048 (gate, up), 2048×11008 (down), 151936×2048 (LM head), for M = 4096, then 512,
//!    then 26 624 rows. Per shape: the first call (kernel compilation and autotune of a new
//!    autotune key, unless the caches hold it) and the steady time over enough repetitions for
//!    ~0.25 s.
//!
//! 6. **nccl** (CUDA only, measured right after the `info` record since it takes a second):
//!    NCCL loaded as the run loads it (`flowrl_nodes::runtime::collective::nccl`: by its soname
//!    `libnccl.so.2`, or from a pip wheel), a communicator of one rank on the device, and a
//!    bucketed in-place all-reduce of 96 MB (two buckets) on a CUDA stream: its time, and that
//!    the values came back unchanged (the sum over one rank). Without NCCL the record carries the
//!    loader's one-line error, which names the package to install.
//!
//! Sections 4 and 5 start no new measurement (a first-pass phase, a GEMM) once `--budget-s`
//! seconds have passed since start; a `skipped` record says so.
//!
//! cubecl's configuration is not set here: a `cubecl.toml` in the working directory or an
//! ancestor applies (bench/gpu/check.sh installs bench/gpu/cubecl.toml for its run), and the
//! `info` record prints the compilation and autotune caches it resolved.

#[cfg(any(feature = "cuda", feature = "vulkan"))]
#[path = "gpu_micro/mod.rs"]
mod micro;

#[cfg(any(feature = "cuda", feature = "vulkan"))]
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = micro::parse(&args)?;
    let index = |d: &str| -> usize {
        d.split(':')
            .nth(1)
            .and_then(|i| i.parse().ok())
            .unwrap_or(0)
    };
    match args.device.split(':').next().unwrap_or("") {
        #[cfg(feature = "cuda")]
        "cuda" => micro::run::<burn_cubecl::cubecl::cuda::CudaRuntime>(
            burn::backend::cuda::CudaDevice {
                index: index(&args.device),
            },
            &args,
        ),
        #[cfg(feature = "vulkan")]
        "vulkan" => {
            use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
            let device = match index(&args.device) {
                0 => WgpuDevice::DefaultDevice,
                n => WgpuDevice::DiscreteGpu(n),
            };
            micro::run::<WgpuRuntime>(device, &args)
        }
        other => anyhow::bail!("--device {other}: this build has {}", built_with()),
    }
}

/// The runtimes this build has.
#[cfg(any(feature = "cuda", feature = "vulkan"))]
fn built_with() -> String {
    [
        cfg!(feature = "cuda").then_some("cuda"),
        cfg!(feature = "vulkan").then_some("vulkan"),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ")
}

#[cfg(not(any(feature = "cuda", feature = "vulkan")))]
fn main() {
    eprintln!(
        "bench-gpu-micro needs a GPU backend: cargo build --release -p flowrl-bench --features cuda \
         (or vulkan) --bin bench-gpu-micro"
    );
    std::process::exit(2);
}

/// The flowrl binary's allocator (the weight draw of the first pass allocates on the host).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
