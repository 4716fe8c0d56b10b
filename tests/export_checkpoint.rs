//! `flowrl export` checks checkpoints against their manifest as `--resume` does: a damaged newest
//! checkpoint is passed over with a warning, a damaged requested one is an error.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");

fn flowrl(args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn export_passes_over_a_damaged_newest_checkpoint_and_refuses_a_damaged_requested_one() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_s = run.to_str().unwrap();
    let out = flowrl(&[
        "run",
        "graphs/grpo_vlm.toml",
        "--steps",
        "2",
        "--set",
        "run.checkpoint_every=1",
        "--out",
        run_s,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Truncate the newest checkpoint's optimizer file, as a kill or a full disk would.
    let optimizer = run.join("checkpoints/step_000002/resources/policy/optimizer.safetensors");
    let len = std::fs::metadata(&optimizer).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&optimizer)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let newest = dir.path().join("newest");
    let out = flowrl(&["export", run_s, "--out", newest.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("step_000002 is incomplete (resources/policy/optimizer.safetensors")
            && stderr.contains("exporting step_000001"),
        "{stderr}"
    );
    assert!(newest.join("config.json").is_file());

    let requested = dir.path().join("requested");
    let out = flowrl(&[
        "export",
        run_s,
        "--step",
        "2",
        "--out",
        requested.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("step_000002 is incomplete (resources/policy/optimizer.safetensors"),
        "{stderr}"
    );
}
