//! The default GRPO graph on a Vulkan device (burn's wgpu backend: the cubecl kernels the CUDA
//! backend compiles too), through the `flowrl` binary, against the same run on the CPU.
//!
//! Needs a Vulkan driver; CI installs Mesa's software one (`mesa-vulkan-drivers`, lavapipe).
//! Tolerance: every metric within 2e-3 relative (absolute below 1e-2), as for replicas. The
//! kernels reduce in another order than Flex, so log-probs differ by ~1e-6; responses are
//! sampled from per-row RNGs by inverse CDF, so they are identical unless a draw falls within
//! that noise of a token boundary, and the update moves both models by the same AdamW steps.
//! A missing driver is an error that names the package to install.

#![cfg(feature = "vulkan")]

use std::process::Command;

mod common;

use common::{BIN, GRAPH, SMALL, assert_same_metrics, metrics, root};

fn run(device: &str, out: &std::path::Path) -> std::process::Output {
    Command::new(BIN)
        .current_dir(root())
        .args(["run", GRAPH, "--steps", "3", "--device", device])
        .args(["--out", out.to_str().unwrap()])
        .args(SMALL)
        .args(["--set", "run.checkpoint_every=0"])
        .output()
        .unwrap()
}

#[test]
fn vulkan_run_of_the_default_graph_matches_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let mut by_device = Vec::new();
    for device in ["cpu", "vulkan"] {
        let out = dir.path().join(device);
        let o = run(device, &out);
        assert!(
            o.status.success(),
            "flowrl run --device {device} failed:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let run_json = std::fs::read_to_string(out.join("run.json")).unwrap();
        assert!(run_json.contains(&format!("\"{device}:0\"")), "{run_json}");
        by_device.push(metrics(&out));
    }
    assert_eq!(
        by_device[0].len(),
        4,
        "step 0 (the evaluation before training) and 3 steps"
    );
    assert_same_metrics(&by_device[0], &by_device[1], "vulkan vs cpu");
}

#[test]
fn a_missing_vulkan_driver_is_an_error_that_names_the_package() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // The Vulkan loader reads its drivers from these lists: point them at nothing.
    let o = Command::new(BIN)
        .current_dir(root())
        .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
        .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
        .args(["run", GRAPH, "--steps", "1", "--device", "vulkan"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("no Vulkan adapter could be opened for vulkan:0")
            && stderr.contains("apt-get install mesa-vulkan-drivers"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
