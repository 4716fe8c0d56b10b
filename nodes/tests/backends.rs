//! The main job's nodes on another backend or precision than the CPU's f32: the same inputs give
//! the same log-probs, updates and weights within the tolerance of the difference.
//!
//! - Vulkan (feature `vulkan`; CI runs it on Mesa's software driver): burn's cubecl kernels, the
//!   ones CUDA compiles too, against Flex.
//! - Mixed precision (`precision = "bf16"`) on the CPU: bf16 forward passes against f32 ones, with
//!   f32 master weights and AdamW moments in the checkpoint.

mod common;

use common::{
    Built, build, build_with, close, f32_tensors, log_probs, max_abs_diff, rollout, update,
};
use flowrl_engine::DeviceSpec;
use flowrl_models::weights::Precision;

/// rollout, logprob, update.ppo (its gradients, through the metrics and the weights they move)
/// and update.sft on a Vulkan device against the CPU, at the replica test's tolerances.
#[cfg(feature = "vulkan")]
#[test]
fn vulkan_nodes_match_the_cpu() {
    let mut cpu = build(1);
    let mut vulkan = common::build_on(vec![DeviceSpec::Vulkan(0)]);
    common::assert_same_steps(&mut cpu, &mut vulkan, "vulkan vs cpu", 1e-4, 1e-3, 1e-4);
}

/// The share of weights whose update has the same sign under `b` as under `a` (both moved from
/// `start`), among those that moved by more than `eps` under `a`.
fn same_direction(start: &[f32], a: &[f32], b: &[f32], eps: f32) -> f64 {
    let (mut same, mut moved) = (0usize, 0usize);
    for ((s, x), y) in start.iter().zip(a).zip(b) {
        let (dx, dy) = (x - s, y - s);
        if dx.abs() > eps {
            moved += 1;
            same += usize::from(dx.signum() == dy.signum());
        }
    }
    same as f64 / moved.max(1) as f64
}

fn metric(metrics: &[(String, f64)], key: &str) -> f64 {
    metrics
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key} in {metrics:?}"))
        .1
}

#[test]
fn bf16_mixed_precision_tracks_f32_and_keeps_f32_masters() {
    let cpu = || vec![DeviceSpec::Cpu(0)];
    let mut f32_run: Built = build(1);
    let mut bf16_run = build_with(cpu(), Some(Precision::BF16));
    let start = f32_run.weights();
    // The bf16 policy starts from the same f32 weights (its masters).
    assert_eq!(bf16_run.weights(), start);

    // The same rollouts for both (sampled in f32), scored by each.
    let (prompts, rollouts) = rollout(&mut f32_run, 0);
    let lp32 = log_probs(&mut f32_run, 0, &rollouts);
    let lp16 = log_probs(&mut bf16_run, 0, &rollouts);
    let mask = &rollouts.response_mask.data;
    let diffs: Vec<f32> = lp32
        .log_probs
        .data
        .iter()
        .zip(&lp16.log_probs.data)
        .zip(mask)
        .filter(|(_, m)| **m > 0.0)
        .map(|((a, b), _)| (a - b).abs())
        .collect();
    let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
    let worst = diffs.iter().fold(0f32, |m, d| m.max(*d));
    // bf16 keeps 8 bits of mantissa (relative error 2^-9 per rounding): token log-probs move by
    // thousandths (measured: mean 0.0016, max 0.029), and are not equal to the f32 ones.
    assert!(mean > 1e-5 && mean < 0.01, "mean |Δ log-prob| {mean}");
    assert!(worst < 0.1, "max |Δ log-prob| {worst}");

    let (ppo32, sft32) = update(&mut f32_run, 0, &prompts, &rollouts, &lp32);
    let (ppo16, sft16) = update(&mut bf16_run, 0, &prompts, &rollouts, &lp32);
    eprintln!("mean |Δ log-prob| {mean}, max {worst}");
    eprintln!("ppo f32 {ppo32:?}\nppo bf16 {ppo16:?}\nsft f32 {sft32:?}\nsft bf16 {sft16:?}");
    // pg_loss is a mean of ±advantage · ratio terms that nearly cancel, so it is compared
    // absolutely: the ratios move by the log-prob differences above.
    let (a, b) = (
        metric(&ppo32, "actor/pg_loss"),
        metric(&ppo16, "actor/pg_loss"),
    );
    assert!(
        (a - b).abs() < 0.05,
        "update.ppo actor/pg_loss: f32 {a} vs bf16 {b}"
    );
    let (a, b) = (
        metric(&ppo32, "actor/grad_norm"),
        metric(&ppo16, "actor/grad_norm"),
    );
    assert!(
        close(a, b, 0.1),
        "update.ppo actor/grad_norm: f32 {a} vs bf16 {b}"
    );
    let (a, b) = (metric(&sft32, "train/loss"), metric(&sft16, "train/loss"));
    assert!(
        close(a, b, 0.02),
        "update.sft train/loss: f32 {a} vs bf16 {b}"
    );

    // The masters stay f32 in memory and in the checkpoint (f32_tensors panics on any other
    // dtype), and the bf16 update moved the weights the way the f32 one did: AdamW's first steps
    // are ≈ lr · sign(gradient).
    let dtypes = bf16_run.cpu_weight_dtypes();
    assert!(!dtypes.is_empty());
    assert!(
        dtypes.iter().all(|d| *d == burn::tensor::DType::F32),
        "{dtypes:?}"
    );
    let (w32, w16) = (f32_run.weights(), bf16_run.weights());
    let moved = max_abs_diff(&w16, &start);
    assert!(
        moved > 1e-3,
        "the bf16 updates moved the weights by only {moved}"
    );
    let agree = same_direction(&start, &w32, &w16, 1e-4);
    assert!(
        agree > 0.9,
        "only {agree:.3} of the weights moved the same way"
    );
    let dir = tempfile::tempdir().unwrap();
    bf16_run.save(dir.path());
    let moments = f32_tensors(&dir.path().join("optimizer.safetensors"));
    assert!(moments.len() >= 2 * w16.len(), "{} moments", moments.len());
}
