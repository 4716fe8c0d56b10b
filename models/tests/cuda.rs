//! The models' fixture parity checks (common/qwen_checks.rs, common/gemma4_checks.rs: forward,
//! KV-cached greedy decoding, gradients against transformers) and flowrl's kernel checks
//! (common/kernel_checks.rs: flash attention forward and backward, the fused elementwise kernels,
//! the device sampler) on burn's CUDA kernels: the unfused `CubeBackend<CudaRuntime>` that the
//! nodes train on (nodes/src/runtime/backend.rs), `Autodiff` of it for the gradients, in f32.
//! Needs an NVIDIA GPU and the CUDA toolkit's NVRTC and headers at run time, so it is not part of
//! CI; bench/gpu/check.sh runs it with `--test-threads 1`:
//!
//!     CUDARC_CUDA_VERSION=13000 cargo test --release -p flowrl-models --features cuda-tests \
//!         --test cuda --no-run
//!
//! **Tolerances: f32 matmuls run as TF32 here.** cubek stages f32 operands as TF32 on the
//! accelerated (tensor-core) matmul kernels (cubek-matmul 0.2.0 src/definition/blueprint.rs
//! `adjust_dtypes`), and autotune picks those whenever they are fastest. TF32 keeps 10 explicit
//! mantissa bits of f32's 23: every matmul operand is rounded to within 2⁻¹¹ ≈ 4.9e-4 of its value,
//! so a K-term dot product errs by about 2⁻¹¹ · √(Σ (aᵢbᵢ)²), ~5e-4 of a typical output and a few
//! times that at the tails (PyTorch's TF32 note measures a worst error of 2.2e-3 of the mean
//! output at K = 10240), accumulated over the layers. The CPU tests' f16 forward, which rounds
//! every weight and activation to the same 10 bits (more rounding than TF32's matmul operands
//! only), deviates from the f32 logits by 2.5e-3–5.1e-3 of max(1, max |logit|) on the Qwen
//! fixtures (qwen_vl_fixtures.rs `reduced_precision_forward_stays_close`, measured on the CPU).
//! Hence [`TF32_TOL`] = 1e-2 for forward tensors (the CPU's [`qwen_checks::TOL`] is 2e-5, for a
//! faithful f32 port) and [`TF32_GRAD_TOL`] = 2e-2 for gradients, whose backward adds two more
//! TF32 products per linear map (dX = dY·W, dW = dYᵀ·X). Gemma 4's tolerances are per case
//! (`case.json → tolerances`, read by gemma4_checks.rs), so [`device`] points the fixture root
//! at a mirror whose Gemma 4 `case.json` files have those tolerances widened to the same rule
//! ([`tf32_fixture_root`]); lookups and exact entries keep theirs.
//!
//! **Greedy tokens stay exact.** A TF32 error flips a greedy token only where the reference's
//! top two logits are closer than the error. The fixtures' smallest top-1 − top-2 gaps over every
//! generated step are 1.15e-2 (qwen2_5_vl/text_only; the other Qwen cases 2.1e-2–6.2e-2) and
//! 7.8e-2 (gemma4/batch_images), against an expected TF32 logit error of ~5e-4 of max |logit| ≈ 10,
//! about 5e-3. qwen2_5_vl/text_only keeps only ~2× headroom: if its `generated_ids` differ, look
//! at the step logits' deviation in the same report first (qwen_checks checks them before the
//! tokens, and after a flipped token every later step's logits differ as well).
//!
//! The kernel checks keep kernel_checks.rs's tolerances: flowrl's kernels compute in f32 without
//! tensor cores.

#![cfg(feature = "cuda-tests")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use burn::backend::Autodiff;
use common::{gemma4_checks, kernel_checks, qwen_checks};
use cubecl::cuda::{CudaDevice, CudaRuntime};
use serde_json::Value;

/// burn's CUDA kernels without the fusion layer (f32 floats, i32 ints, u8 bools).
type Gpu = burn_cubecl::CubeBackend<CudaRuntime, f32, i32, u8>;

/// Forward tensors: max |diff| ≤ TF32_TOL · max(1, max |expected|) (see the module doc).
const TF32_TOL: f64 = 1e-2;
/// Gradients: max |diff| ≤ TF32_GRAD_TOL · max |expected| per tensor.
const TF32_GRAD_TOL: f64 = 2e-2;

/// The device, after pointing `FLOWRL_MODEL_FIXTURES` at [`tf32_fixture_root`] (once per
/// process). Every test calls this first, so no test of this binary has started its checks (or
/// a CUDA thread) while the variable is set.
fn device() -> CudaDevice {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = tf32_fixture_root(&common::fixtures_root());
        // SAFETY: set inside the OnceLock's initialiser, which every test of this binary runs
        // (through `device()`) before anything else; the others wait on it, so no thread of
        // this process reads the environment concurrently.
        unsafe { std::env::set_var("FLOWRL_MODEL_FIXTURES", &root) };
        root
    });
    CudaDevice { index: 0 }
}

/// A mirror of the fixture root `src` in a temporary folder: every entry a symlink to the
/// original, except each `gemma4/<case>/case.json`, rewritten with its tolerances widened to the
/// TF32 rule. A forward entry's `atol` becomes at least `TF32_TOL · max(1, max |e|)` and a
/// gradient's (`grad.*`) at least `TF32_GRAD_TOL · max |e|`, with `max |e|` from the case's
/// expected.safetensors: Qwen's rule in Gemma 4's `|a − e| ≤ atol + rtol·|e|`. Exact entries
/// (strings) and lookups (`*identity*`) are left as they are.
fn tf32_fixture_root(src: &Path) -> PathBuf {
    let dst =
        std::env::temp_dir().join(format!("flowrl-cuda-tf32-fixtures-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    let src = std::fs::canonicalize(src).unwrap_or_else(|_| src.to_path_buf());
    let Ok(entries) = std::fs::read_dir(&src) else {
        return src; // no fixtures: the checks skip as they do on the CPU
    };
    let link = |from: &Path, to: &Path| {
        std::os::unix::fs::symlink(from, to)
            .unwrap_or_else(|e| panic!("linking {} to {}: {e}", to.display(), from.display()))
    };
    for entry in entries.map(Result::unwrap) {
        let (path, name) = (entry.path(), entry.file_name());
        if name != "gemma4" || !path.is_dir() {
            link(&path, &dst.join(&name));
            continue;
        }
        std::fs::create_dir_all(dst.join("gemma4")).unwrap();
        for case in std::fs::read_dir(&path).unwrap().map(Result::unwrap) {
            let (case_path, case_name) = (case.path(), case.file_name());
            let case_dst = dst.join("gemma4").join(&case_name);
            if !case_path.join("case.json").is_file() {
                link(&case_path, &case_dst);
                continue;
            }
            std::fs::create_dir_all(&case_dst).unwrap();
            for file in std::fs::read_dir(&case_path).unwrap().map(Result::unwrap) {
                if file.file_name() != "case.json" {
                    link(&file.path(), &case_dst.join(file.file_name()));
                }
            }
            let text = std::fs::read_to_string(case_path.join("case.json")).unwrap();
            let mut json: Value = serde_json::from_str(&text).unwrap();
            let expected = case_path.join("expected.safetensors");
            if let (Some(tols), true) = (
                json.get_mut("tolerances").and_then(Value::as_object_mut),
                expected.is_file(),
            ) {
                let tensors = gemma4_checks::read_st(&expected);
                for (key, tol) in tols.iter_mut() {
                    let (Some(atol), false) = (
                        tol.get("atol").and_then(Value::as_f64),
                        key.contains("identity"),
                    ) else {
                        continue;
                    };
                    let scale = tensors
                        .get(key)
                        .map(|t| t.f.iter().fold(0f64, |m, &x| m.max(f64::from(x.abs()))))
                        .unwrap_or(1.0);
                    let floor = if key.starts_with("grad.") {
                        TF32_GRAD_TOL * scale
                    } else {
                        TF32_TOL * scale.max(1.0)
                    };
                    tol["atol"] = Value::from(atol.max(floor));
                }
            }
            std::fs::write(
                case_dst.join("case.json"),
                serde_json::to_string_pretty(&json).unwrap(),
            )
            .unwrap();
        }
    }
    eprintln!(
        "fixtures: {} (mirror of {} with Gemma 4's tolerances widened for TF32)",
        dst.display(),
        src.display()
    );
    dst
}

#[test]
fn qwen_vl_fixtures_match_transformers_on_cuda() {
    qwen_checks::forward_matches_transformers::<Gpu>(&device(), TF32_TOL);
}

#[test]
fn qwen_vl_kv_cached_decoding_on_cuda() {
    qwen_checks::kv_cached_decoding_matches_transformers::<Gpu>(&device(), TF32_TOL);
}

#[test]
fn qwen_vl_gradients_match_transformers_on_cuda() {
    qwen_checks::gradients_match_transformers::<Autodiff<Gpu>>(&device(), TF32_GRAD_TOL);
}

/// Gemma 4's tolerances are each case's `case.json → tolerances`, widened for TF32 (see
/// [`tf32_fixture_root`]).
#[test]
fn gemma4_forward_matches_transformers_on_cuda() {
    gemma4_checks::forward_matches_transformers::<Gpu>(&device());
}

#[test]
fn gemma4_kv_cached_decoding_on_cuda() {
    gemma4_checks::greedy_decoding_through_kv_cache_matches_transformers::<Gpu>(&device());
}

#[test]
fn gemma4_gradients_match_transformers_on_cuda() {
    gemma4_checks::gradients_match_transformers::<Autodiff<Gpu>>(&device());
}

/// flowrl's flash attention (forward) against the composite on the CPU: left padding, packed
/// segments, a decode step over a cache, a sliding window.
#[test]
fn cuda_flash_attention_matches_the_composite() {
    kernel_checks::flash_attention_matches_the_composite::<Gpu>(&device());
}

/// The flash backward's dQ, dK and dV against the composite's gradients on the CPU.
#[test]
fn cuda_flash_attention_gradients_match_the_composite() {
    kernel_checks::flash_gradients_match_the_composite::<Autodiff<Gpu>>(&device());
}

/// The fused RMSNorm, SwiGLU gate and RoPE kernels against their composites on the CPU.
#[test]
fn cuda_fused_elementwise_kernels_match_the_composites() {
    kernel_checks::fused_elementwise_matches_the_composites::<Gpu>(&device());
}

/// The device sampler: greedy tokens, keep thresholds, log-probs and drawn frequencies (χ²)
/// against the host rule; NaN and fully masked rows as errors.
#[test]
fn cuda_device_sampler_matches_the_host_rule() {
    kernel_checks::device_sampler_matches_the_host_rule::<Gpu>(&device());
}

/// The fused RMSNorm, SwiGLU gate and RoPE backward kernels against the composites' gradients on
/// the CPU.
#[test]
fn cuda_fused_elementwise_gradients_match_the_composites() {
    kernel_checks::fused_elementwise_gradients_match_the_composites::<Autodiff<Gpu>>(&device());
}
