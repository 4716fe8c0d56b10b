//! What a run leaves to watch and compare: TensorBoard event files that TensorBoard's own reader
//! reads back equal to metrics.jsonl, with the graph and the validation generations (text and
//! pictures); the generations as JSONL; `sink.jsonl` with every built-in value type written out;
//! `sink.trajectories` sampling responses with their advantages; verl's `perf/*` and `val-core/*`
//! names; a tracker that cannot write stops the run before its first step.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{BIN, GRAPH, SMALL, jsonl, root};
use serde_json::Value;

/// A Python with the `tensorboard` package: a virtual environment under `target/`, made on first
/// use (the version the reader script was written against).
fn tensorboard_python() -> PathBuf {
    let venv = root().join("target/tensorboard-venv");
    let python = venv.join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import tensorboard"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .output()
            .expect("python3");
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let pip = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "tensorboard==2.21.0"])
            .output()
            .unwrap();
        assert!(
            pip.status.success(),
            "{}",
            String::from_utf8_lossy(&pip.stderr)
        );
    }
    python
}

/// `tests/fixtures/tensorboard/read_events.py` on `dir`: scalars, texts and images by tag.
fn read_events(dir: &Path) -> Value {
    let out = Command::new(tensorboard_python())
        .arg(root().join("tests/fixtures/tensorboard/read_events.py"))
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The default graph with a `sink.jsonl` of every value the step makes and a
/// `sink.trajectories` of 3 sampled responses with their advantages.
fn graph_with_sinks(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(root().join(GRAPH)).unwrap()
        + r#"
[nodes.values]
kind = "sink.jsonl"
inputs = { prompts = "data.prompts", rollouts = "rollout.rollouts", old = "old.log_probs", scores = "reward.scores", advantages = "advantage.advantages", done = "update.done" }

[nodes.samples]
kind = "sink.trajectories"
samples = 3
inputs = { scores = "reward.scores", advantages = "advantage.advantages" }
"#;
    let path = dir.join("graph.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_tensorboard_run_reads_back_equal_to_its_metrics_with_graph_and_generations() {
    let dir = tempfile::tempdir().unwrap();
    let graph = graph_with_sinks(dir.path());
    let out = dir.path().join("run");
    let mut args = vec![
        "run",
        graph.to_str().unwrap(),
        "--steps",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--set",
        "nodes.eval.every=1",
        "--set",
        "run.tracking=[\"jsonl\", \"tensorboard\"]",
    ];
    args.extend_from_slice(SMALL);
    common::flowrl(&args);

    // Every metric of every line, at its step, as TensorBoard reads it (32-bit floats).
    let metrics = jsonl(&out.join("metrics.jsonl"));
    assert_eq!(metrics.len(), 3, "step 0 and two steps");
    let tb = read_events(&out.join("tensorboard"));
    let mut compared = 0;
    for m in &metrics {
        let step = m["step"].as_u64().unwrap();
        for (key, v) in m.as_object().unwrap() {
            if key == "step" {
                continue;
            }
            let series = tb["scalars"][key]
                .as_array()
                .unwrap_or_else(|| panic!("{key}"));
            let [s, got] = &series
                .iter()
                .find(|p| p[0] == step)
                .unwrap_or_else(|| panic!("{key} at step {step}: {series:?}"))
                .as_array()
                .unwrap()[..]
            else {
                panic!("{key}: {series:?}")
            };
            assert_eq!(s.as_u64(), Some(step));
            match (v.as_f64(), got.as_f64()) {
                (Some(a), Some(b)) => assert!(
                    (a - b).abs() <= 1e-6 * a.abs().max(1e-3),
                    "{key} at step {step}: {a} vs {b}"
                ),
                // metrics.jsonl writes a non-finite value as null; TensorBoard keeps it.
                _ => assert!(v.is_null() && got.is_string(), "{key}: {v} vs {got}"),
            }
            compared += 1;
        }
    }
    let tags = tb["scalars"].as_object().unwrap().len();
    assert!(
        compared > 100 && tags > 40,
        "{compared} values, {tags} tags"
    );

    // The graph once, as text; four validation generations per evaluation (steps 0, 1, 2),
    // each with its prompt's picture.
    let graph_text = tb["texts"]["graph"][0].as_array().unwrap();
    assert_eq!(graph_text[0], 0);
    assert!(graph_text[1].as_str().unwrap().contains("[nodes.rollout]"));
    for k in 0..4 {
        let text = &tb["texts"][format!("val/generations/{k}")];
        let steps: Vec<u64> = text
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[0].as_u64().unwrap())
            .collect();
        assert_eq!(steps, [0, 1, 2], "{text}");
        assert!(
            text[0][1].as_str().unwrap().contains("**response**"),
            "{text}"
        );
        let image = &tb["images"][format!("val/generations/{k}/image")];
        assert_eq!(image[0], serde_json::json!([0, 56, 56]), "{image}");
    }

    // The same generations as JSONL, their pictures in the run directory.
    let generations = jsonl(&out.join("generations/val_step_000002.jsonl"));
    assert_eq!(generations.len(), 4);
    for g in &generations {
        assert_eq!(g["step"], 2);
        assert!(g["score_components"]["acc"].is_number(), "{g}");
        let picture = g["messages"][0]["content"][0]["image"].as_str().unwrap();
        assert!(out.join(picture).is_file(), "{picture}");
    }

    // sink.jsonl: every built-in type as values.
    let values = std::fs::read_to_string(out.join("values.jsonl")).unwrap();
    assert!(
        !values.contains("opaque"),
        "{}",
        &values[..values.len().min(2000)]
    );
    let first: Value = serde_json::from_str(values.lines().next().unwrap()).unwrap();
    assert_eq!(first["scores"]["scores"].as_array().unwrap().len(), 16);
    assert!(
        first["scores"]["components"]["acc"].is_array(),
        "{}",
        first["scores"]
    );
    assert_eq!(first["advantages"]["advantages"]["rows"], 16);

    // sink.trajectories: 3 of the 16 responses, each with its advantage.
    let sampled = jsonl(&out.join("rollouts/step_000001.jsonl"));
    assert_eq!(sampled.len(), 3);
    assert!(
        sampled.iter().all(|s| s["advantage"].is_number()),
        "{sampled:?}"
    );

    // verl's names.
    let step1 = &metrics[1];
    let tokens = step1["perf/total_num_tokens"].as_f64().unwrap();
    let seconds = step1["perf/time_per_step"].as_f64().unwrap();
    assert_eq!(seconds, step1["timing_s/step"].as_f64().unwrap());
    let throughput = step1["perf/throughput"].as_f64().unwrap();
    assert!(
        (throughput - tokens / seconds).abs() <= 1e-9 * throughput,
        "{step1}"
    );
    let before = &metrics[0];
    assert_eq!(
        before["val-core/flowrl/shapes/acc/mean@1"], before["val/flowrl/shapes/accuracy"],
        "{before}"
    );
    assert!(
        before["val-aux/flowrl/shapes/reward/mean@1"].is_number(),
        "{before}"
    );

    // The run's plot: training and validation accuracy on one panel, no per-source duplicate.
    let svg = std::fs::read_to_string(out.join("plots.svg")).unwrap();
    assert!(
        svg.contains("accuracy: critic/score/acc/mean · val/accuracy"),
        "plots.svg"
    );
    assert!(!svg.contains("val/flowrl/shapes/accuracy"), "plots.svg");
}

#[test]
fn a_tracker_that_cannot_write_stops_the_run_before_its_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // The run directory exists (a fresh run needs --force then) and `tensorboard` in it is a file.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("tensorboard"), "not a folder").unwrap();
    let run = Command::new(BIN)
        .current_dir(root())
        .args(["run", GRAPH, "--steps", "2", "--force", "--out"])
        .arg(&out)
        .args(["--set", "run.tracking=[\"tensorboard\"]"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{err}");
    assert!(err.contains("[run] tracking = tensorboard"), "{err}");
    assert!(
        err.contains(&out.join("tensorboard").display().to_string()),
        "{err}"
    );
    assert!(!out.join("metrics.jsonl").exists() || jsonl(&out.join("metrics.jsonl")).is_empty());
}
