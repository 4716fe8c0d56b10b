//! Builds the example plugin binary (cargo does, for this test) and runs its graph end to end:
//! validate, run, resume, and a constraint error from the plugin's `validate` hook.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_flowrl-custom");

fn graph() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("graph.toml")
        .display()
        .to_string()
}

fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn plugin_kinds_are_listed_and_graph_validates() {
    let out = Command::new(BIN).arg("nodes").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("walk.gaussian") && text.contains("walk.ema"),
        "{text}"
    );
    let out = Command::new(BIN)
        .args(["validate", &graph()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn graph_runs_and_resume_matches_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full");
    let out = Command::new(BIN)
        .args(["run", &graph(), "--progress", "plain", "--out"])
        .arg(&full)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = metrics(&full);
    assert_eq!(m.len(), 20);
    // The EMA really smooths the walk: m_t = 0.2 x_t + 0.8 m_{t-1}.
    for w in m.windows(2) {
        let expect =
            0.2 * w[1]["walk/x"].as_f64().unwrap() + 0.8 * w[0]["walk/ema"].as_f64().unwrap();
        assert!((w[1]["walk/ema"].as_f64().unwrap() - expect).abs() < 1e-12);
    }
    assert!(m[0]["timing_s/walk"].as_f64().is_some());

    // Stop after 12 steps (checkpoint at 10), then resume to 20.
    let part = tmp.path().join("part");
    let out = Command::new(BIN)
        .args([
            "run",
            &graph(),
            "--progress",
            "quiet",
            "--steps",
            "12",
            "--out",
        ])
        .arg(&part)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(BIN)
        .args(["run", "--progress", "quiet", "--steps", "20", "--resume"])
        .arg(&part)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = metrics(&part);
    assert_eq!(r.len(), 20);
    for (a, b) in m.iter().zip(&r) {
        assert_eq!(a["step"], b["step"]);
        assert_eq!(a["walk/x"], b["walk/x"], "step {}", a["step"]);
        assert_eq!(a["walk/ema"], b["walk/ema"], "step {}", a["step"]);
    }
}

#[test]
fn plugin_constraint_is_reported_with_exit_78() {
    let out = Command::new(BIN)
        .args(["validate", &graph(), "--set", "nodes.smooth.alpha=0.0001"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error[E0501]: alpha = 0.0001 is below sigma / 1000 = 0.0005"),
        "{err}"
    );
    assert!(err.contains("--> --set #1:1:20"), "{err}");
}

/// The broken-graph corpus cases that need this plugin's kinds (`tests/broken_graphs/plugin/`):
/// exit code 78 and exactly the expected diagnostics.
#[test]
fn plugin_corpus_cases_are_rejected_with_expected_diagnostics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = root.join("tests/broken_graphs/plugin");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let case = e.unwrap().path();
        if case.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let rel = format!(
            "tests/broken_graphs/plugin/{}",
            case.file_name().unwrap().to_string_lossy()
        );
        let out = Command::new(BIN)
            .current_dir(&root)
            .args(["validate", &rel])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(78), "{rel}");
        let expected = std::fs::read_to_string(case.with_extension("expected")).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stderr), expected, "{rel}");
        n += 1;
    }
    assert!(n >= 1);
}
