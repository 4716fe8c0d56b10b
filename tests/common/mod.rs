//! Helpers shared by the end-to-end tests that run the default GRPO graph through the `flowrl`
//! binary (main_job_grpo.rs, scale_out.rs, vulkan.rs, lora_graph.rs, and the other families'
//! and the tools' graphs).

#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// The `flowrl` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_flowrl");
/// The default graph.
pub const GRAPH: &str = "graphs/grpo_vlm.toml";

/// Runs the binary in the repository root; panics with its stderr unless it succeeds.
pub fn flowrl(args: &[&str]) -> Output {
    let out = Command::new(BIN)
        .current_dir(root())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "flowrl {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The repository root (graphs and assets are relative to it).
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Small, fast settings of the default graph (same code paths): 4 prompts × n 4, two
/// mini-batches of 8 responses, micro-batches of 4.
pub const SMALL: &[&str] = &[
    "--set",
    "nodes.data.batch_size=4",
    "--set",
    "nodes.rollout.n=4",
    "--set",
    "nodes.update.mini_batch_size=2",
    "--set",
    "nodes.update.micro_batch_size=4",
];

/// A 16-row training file and an 8-row validation file of the shapes task in `dir` (the
/// generator's default seed): (train path, validation path).
pub fn small_task(dir: &Path) -> (String, String) {
    use flowrl_datasets::synth::{DEFAULT_SEED, sample, write_split};
    let mut paths = Vec::new();
    for (split, n) in [("train", 16u64), ("test", 8)] {
        let samples: Vec<_> = (0..n).map(|i| sample(DEFAULT_SEED, split, i)).collect();
        let path = dir.join(format!("{split}.parquet"));
        write_split(&path, split, &samples).unwrap();
        paths.push(path.display().to_string());
    }
    (paths[0].clone(), paths[1].clone())
}

/// The lines of a JSONL file, parsed.
pub fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A run directory's metrics.jsonl without the wall-clock entries (timings, throughput).
pub fn metrics(dir: &Path) -> Vec<Value> {
    let mut lines = jsonl(&dir.join("metrics.jsonl"));
    for v in &mut lines {
        let map = v.as_object_mut().unwrap();
        map.retain(|k, _| !k.starts_with("timing_s/") && !k.starts_with("perf/"));
    }
    lines
}

/// `flowrl graph --format json` of a graph file.
pub fn graph_json(path: &str) -> Value {
    serde_json::from_slice(&flowrl(&["graph", path, "--format", "json"]).stdout).unwrap()
}

/// Asserts that the graph file `example` is the default graph but for its node `reward` (the
/// same other nodes, resources and order), and gives both graphs' `reward` nodes: the
/// example's, then the default's.
pub fn reward_swapped(example: &str) -> (Value, Value) {
    let (mut ours, mut default) = (graph_json(example), graph_json(GRAPH));
    let take_reward = |g: &mut Value| {
        let nodes = g["nodes"].as_array_mut().unwrap();
        let i = nodes.iter().position(|n| n["name"] == "reward").unwrap();
        nodes.remove(i)
    };
    let (r_ours, r_default) = (take_reward(&mut ours), take_reward(&mut default));
    assert_eq!(
        ours["nodes"], default["nodes"],
        "every other node must be as in {GRAPH}: copy its changes into {example}"
    );
    assert_eq!(ours["resources"], default["resources"]);
    assert_eq!(ours["order"], default["order"]);
    (r_ours, r_default)
}

/// The training steps' lines (step ≥ 1) of `lines`, after checking that the first line is the
/// evaluation before training (step 0, `val/*` only), which a graph with an eval node logs.
pub fn training_steps(mut lines: Vec<Value>) -> Vec<Value> {
    let first = lines.first().expect("a metrics line");
    assert_eq!(
        first["step"], 0,
        "the evaluation before training comes first: {first}"
    );
    assert!(first.get("val/score").is_some(), "{first}");
    assert!(first.get("critic/score/mean").is_none(), "{first}");
    lines.remove(0);
    lines
}

/// `b` holds exactly `a`'s metrics, step for step and key for key. A failure lists the metrics
/// that differ (step, name, both values) instead of printing both runs whole.
pub fn assert_identical_metrics(a: &[Value], b: &[Value], what: &str) {
    let mut diffs = Vec::new();
    if a.len() != b.len() {
        diffs.push(format!("{} steps vs {}", a.len(), b.len()));
    }
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x.as_object().unwrap(), y.as_object().unwrap());
        let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
        keys.sort();
        keys.dedup();
        for k in keys {
            if x.get(k) != y.get(k) {
                let value = |m: &serde_json::Map<String, Value>| {
                    m.get(k).map_or("absent".into(), |v| v.to_string())
                };
                diffs.push(format!(
                    "step {}: {k}: {} vs {}",
                    x["step"],
                    value(x),
                    value(y)
                ));
            }
        }
    }
    assert!(
        diffs.is_empty(),
        "{what}: {} metrics differ:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

/// Every metric of `b` equals `a`'s within 2e-3 relative (absolute below 1e-2; timings and
/// throughput excepted), and the run is not trivially equal: it sampled, scored and updated.
pub fn assert_same_metrics(a: &[Value], b: &[Value], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: steps");
    for (step, (x, y)) in a.iter().zip(b).enumerate() {
        let (x, y) = (x.as_object().unwrap(), y.as_object().unwrap());
        let keys = |m: &serde_json::Map<String, Value>| -> Vec<String> {
            m.keys()
                .filter(|k| !k.starts_with("timing") && !k.starts_with("perf/"))
                .cloned()
                .collect()
        };
        assert_eq!(keys(x), keys(y), "{what}: metric names at step {step}");
        for k in keys(x) {
            match (x[&k].as_f64(), y[&k].as_f64()) {
                (Some(u), Some(v)) => assert!(
                    (u - v).abs() <= 2e-3 * u.abs().max(v.abs()).max(1e-2),
                    "{what}: step {step} {k}: {u} vs {v}"
                ),
                _ => assert_eq!(x[&k], y[&k], "{what}: step {step} {k}"),
            }
        }
    }
    // The run is not trivially equal: it sampled, scored and updated.
    let last = a.last().unwrap();
    assert!(last["actor/grad_norm"].as_f64().unwrap() > 1e-3);
    assert!(
        a.iter()
            .any(|m| m["critic/score/mean"].as_f64().is_some_and(|s| s > 0.0))
    );
    assert!(last["response_length/mean"].as_f64().unwrap() > 0.0);
}
