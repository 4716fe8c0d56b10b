//! The models' fixture parity checks (common/qwen_checks.rs, common/gemma4_checks.rs: forward,
//! KV-cached greedy decoding, gradients against transformers) on burn's CUDA kernels: the
//! unfused `CubeBackend<CudaRuntime>` that the nodes train on (nodes/src/runtime/backend.rs), `Autodiff`
//! of it for the gradients, at the CPU tests' tolerances, in f32. Needs an NVIDIA GPU and the
//! CUDA toolkit's NVRTC at run time, so it is not part of CI; bench/gpu/check.sh runs it:
//!
//!     CUDARC_CUDA_VERSION=13000 cargo test --release -p flowrl-models --features cuda-tests \
//!         --test cuda --no-run

#![cfg(feature = "cuda-tests")]

mod common;

use burn::backend::Autodiff;
use common::{gemma4_checks, qwen_checks};
use cubecl::cuda::{CudaDevice, CudaRuntime};

/// burn's CUDA kernels without the fusion layer (f32 floats, i32 ints, u8 bools).
type Gpu = burn_cubecl::CubeBackend<CudaRuntime, f32, i32, u8>;

fn device() -> CudaDevice {
    CudaDevice { index: 0 }
}

#[test]
fn qwen_vl_fixtures_match_transformers_on_cuda() {
    qwen_checks::forward_matches_transformers::<Gpu>(&device(), qwen_checks::TOL);
}

#[test]
fn qwen_vl_kv_cached_decoding_on_cuda() {
    qwen_checks::kv_cached_decoding_matches_transformers::<Gpu>(&device(), qwen_checks::TOL);
}

#[test]
fn qwen_vl_gradients_match_transformers_on_cuda() {
    qwen_checks::gradients_match_transformers::<Autodiff<Gpu>>(&device(), qwen_checks::GRAD_TOL);
}

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
