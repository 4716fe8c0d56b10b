//! The models' fixture parity checks (common/qwen_checks.rs, common/gemma4_checks.rs: forward,
//! KV-cached greedy decoding, gradients against transformers) on burn's GPU kernels through
//! Vulkan: the unfused `CubeBackend<WgpuRuntime>` (the fused `burn::backend::Vulkan` alias gets
//! KV-cached decoding wrong), `Autodiff` of it for the gradients, with the CPU tests' tolerances.
//! CI runs it on Mesa's software driver lavapipe (`CUBECL_AUTOTUNE_LEVEL=minimal`), which has no
//! bf16/f16: the reduced-precision checks stay CPU-only.
//!
//! Two kernel families of burn 0.21 / cubecl 0.10's matmul autotune failed these checks whenever
//! autotune's timing-based pick chose them (wrong products from `matmul_double_unit_*`, a panic
//! from `vecmat_unit_perpendicular` reused on a width it cannot launch on); the vendored
//! burn-cubecl leaves both out of the autotune set (vendor/README.md), and
//! `vulkan_batched_transposed_lhs_matmul_matches_host` pins the product that went wrong. Autotune
//! persists its picks in models/target/autotune: remove it to tune afresh.
//!
//! `cargo test --release -p flowrl-models --features vulkan --test vulkan`

#![cfg(feature = "vulkan")]

mod common;

use burn::backend::Autodiff;
use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use common::{gemma4_checks, kernel_checks, lora_checks, qwen_checks};

/// burn's wgpu kernels without the fusion layer (f32 floats, i32 ints, u8 bools as `Vulkan`).
type Gpu = CubeBackend<WgpuRuntime, f32, i32, u8>;

fn device() -> WgpuDevice {
    WgpuDevice::DefaultDevice
}

#[test]
fn qwen_vl_fixtures_match_transformers_on_vulkan() {
    qwen_checks::forward_matches_transformers::<Gpu>(&device(), qwen_checks::TOL);
}

#[test]
fn qwen_vl_kv_cached_decoding_on_vulkan() {
    qwen_checks::kv_cached_decoding_matches_transformers::<Gpu>(&device(), qwen_checks::TOL);
}

#[test]
fn qwen_vl_gradients_match_transformers_on_vulkan() {
    qwen_checks::gradients_match_transformers::<Autodiff<Gpu>>(&device(), qwen_checks::GRAD_TOL);
}

/// Gemma 4's tolerances are each case's `case.json → tolerances`, as on the CPU.
#[test]
fn gemma4_forward_matches_transformers_on_vulkan() {
    gemma4_checks::forward_matches_transformers::<Gpu>(&device());
}

/// With burn-cubecl's `vecmat_unit_perpendicular` in the autotune set this panicked in 4 of 9
/// runs with a fresh cache: tuned on the decode-step attention `q · kᵀ` at 80 keys, the pick was
/// reused at 81, where that kernel cannot launch ("Rhs dimension n=81 must be a multiple of plane
/// size 8", lavapipe's plane size).
#[test]
fn gemma4_kv_cached_decoding_on_vulkan() {
    gemma4_checks::greedy_decoding_through_kv_cache_matches_transformers::<Gpu>(&device());
}

/// Failed whenever autotune picked `matmul_double_unit_*` for the vision tower's attention
/// backward (see [`vulkan_batched_transposed_lhs_matmul_matches_host`]), before the vendored
/// burn-cubecl left those kernels out. Measured on batch_images: the gradient of `vision_tower.patch_embedder.input_proj.weight` had
/// 22941/24576 entries out of tolerance, max |diff| 5.8e-2 (atol 5.6e-4; CPU 1.2e-5); on
/// one_image max |diff| 1.5e-2 (atol 4e-4; CPU 1.5e-5). Compared with the CPU, the first
/// diverging gradient is layer 1's `v_proj` (1.4e-1), i.e. `Pᵀ · dO`; on batch_images every
/// other gradient the fixture checks stayed within tolerance.
#[test]
fn gemma4_gradients_match_transformers_on_vulkan() {
    gemma4_checks::gradients_match_transformers::<Autodiff<Gpu>>(&device());
}

/// The product behind the Gemma 4 gradient failure: a batched `aᵀ · b` with `a`
/// `[1, 2, 630, 630]` (a transposed view, as autodiff's matmul backward builds for the value
/// gradient `Pᵀ · dO` of attention over 630 patches, 2 heads) and `b` `[1, 2, 630, 16]`. When
/// autotune picked `matmul_double_unit_min_tile_size` (3 of 4 runs with a fresh autotune cache,
/// before the vendored burn-cubecl left it out) every batch entry but the last was wrong (max
/// |diff| 0.45); `matmul_simple_unit_min_tile_size` gets it right.
#[test]
fn vulkan_batched_transposed_lhs_matmul_matches_host() {
    use burn::prelude::*;
    let (h, k, n) = (2usize, 630usize, 16usize);
    let mut seed = 1u64;
    let mut values = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f32) / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    };
    let (a, b) = (values(h * k * k), values(h * k * n));
    let dev = device();
    let tensor = |v: &[f32], shape: [usize; 4]| {
        Tensor::<Gpu, 1>::from_data(TensorData::new(v.to_vec(), [v.len()]), &dev).reshape(shape)
    };
    let out = tensor(&a, [1, h, k, k])
        .transpose()
        .matmul(tensor(&b, [1, h, k, n]))
        .into_data()
        .into_vec::<f32>()
        .unwrap();
    for head in 0..h {
        let mut worst = 0f64;
        for i in 0..k {
            for j in 0..n {
                let e: f64 = (0..k)
                    .map(|t| a[(head * k + t) * k + i] as f64 * b[(head * k + t) * n + j] as f64)
                    .sum();
                worst = worst.max((out[(head * k + i) * n + j] as f64 - e).abs());
            }
        }
        assert!(worst < 1e-4, "batch entry {head}: max |diff| {worst:e}");
    }
}

/// PEFT's LoRA adapters on their bases (tests/fixtures/lora): logits, log-probs, loss and adapter
/// gradients, with each case's tolerances, as on the CPU.
#[test]
fn lora_adapters_match_peft_on_vulkan() {
    lora_checks::peft_adapters_match_peft::<Autodiff<Gpu>>(&device());
}

/// flowrl's flash attention (forward) against the composite on the CPU: left padding, packed
/// segments, a decode step over a cache, a sliding window.
#[test]
fn vulkan_flash_attention_matches_the_composite() {
    kernel_checks::flash_attention_matches_the_composite::<Gpu>(&device());
}

/// The flash backward's dQ, dK and dV against the composite's gradients on the CPU.
#[test]
fn vulkan_flash_attention_gradients_match_the_composite() {
    kernel_checks::flash_gradients_match_the_composite::<Autodiff<Gpu>>(&device());
}

/// The fused RMSNorm, SwiGLU gate and RoPE kernels against their composites on the CPU.
#[test]
fn vulkan_fused_elementwise_kernels_match_the_composites() {
    kernel_checks::fused_elementwise_matches_the_composites::<Gpu>(&device());
}

/// The device sampler: greedy tokens, keep thresholds, log-probs and drawn frequencies (χ²)
/// against the host rule; NaN and fully masked rows as errors.
#[test]
fn vulkan_device_sampler_matches_the_host_rule() {
    kernel_checks::device_sampler_matches_the_host_rule::<Gpu>(&device());
}

/// The fused RMSNorm, SwiGLU gate and RoPE backward kernels against the composites' gradients on
/// the CPU.
#[test]
fn vulkan_fused_elementwise_gradients_match_the_composites() {
    kernel_checks::fused_elementwise_gradients_match_the_composites::<Autodiff<Gpu>>(&device());
}
