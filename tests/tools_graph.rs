//! `rollout.multi_turn` in a graph, through the real `flowrl` binary: GRPO steps with a tool
//! declared, the trajectories written by `sink.trajectories`, and the tool declarations
//! checked before the run like nodes.
//!
//! The run is shrunk to a few seconds: a 16-row training file and an 8-row validation file of
//! the shapes task, 4 prompts × 4 responses per step, on the tiny Qwen2-VL policy.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::small_task;

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// The default graph with a multi-turn rollout (tools `tools`) and a trajectory sink.
fn graph(dir: &Path, tools: &str) -> String {
    let (train, test) = small_task(dir);
    let default = std::fs::read_to_string(root().join("graphs/grpo_vlm.toml")).unwrap();
    let text = default
        .replace("datasets/shapes/train.parquet", &train)
        .replace("datasets/shapes/test.parquet", &test)
        .replace(
            "[nodes.rollout]\nkind = \"rollout\"",
            "[nodes.rollout]\nkind = \"rollout.multi_turn\"\nmax_turns = 3",
        );
    let text = format!(
        "{text}\n[nodes.rollout.tools]\n{tools}\n\n[nodes.trajectories]\nkind = \"sink.trajectories\"\ninputs = {{ scores = \"reward.scores\" }}\n"
    );
    let path = dir.join("tools.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The default graph's small settings, no checkpoints.
const SMALL: &[&str] = &["--set", "run.checkpoint_every=0"];

fn flowrl(args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(root())
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_multi_turn_graph_runs_and_writes_readable_trajectories() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = graph(tmp.path(), "zoom_in = { coordinates = \"pixel\" }");
    let out = tmp.path().join("run");
    let mut args = vec![
        "run",
        graph.as_str(),
        "--steps",
        "2",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(common::SMALL);
    args.extend_from_slice(SMALL);
    let run = flowrl(&args);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let metrics: Vec<Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let metrics = common::training_steps(metrics);
    assert_eq!(metrics.len(), 2);
    for m in &metrics {
        // A response is the prompt and at least one assistant turn (verl counts both).
        assert!(m["num_turns/mean"].as_f64().unwrap() >= 2.0, "{m}");
        for key in [
            "tool_calls/rate",
            "tool_errors/mean",
            "tool_images/mean",
            "actor/pg_loss",
        ] {
            assert!(m[key].is_number(), "`{key}` missing in {m}");
        }
    }
    for step in 1..=2 {
        let file = out.join(format!("rollouts/step_{step:06}.jsonl"));
        let lines: Vec<Value> = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 16, "{}", file.display());
        for l in &lines {
            let ids = l["token_ids"].as_array().unwrap().len();
            let prompt = l["prompt_length"].as_u64().unwrap() as usize;
            let mask = l["loss_mask"].as_array().unwrap();
            assert_eq!(ids, prompt + mask.len(), "{l}");
            let turns: u64 = l["turn_lengths"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
                .sum();
            let ones = mask.iter().filter(|m| m.as_u64() == Some(1)).count() as u64;
            assert_eq!(turns, ones, "the turns are the masked tokens: {l}");
            assert!(l["score"].is_number() && l["finish"].is_string(), "{l}");
            let messages = l["messages"].as_array().unwrap();
            assert_eq!(messages.last().unwrap()["role"], "assistant", "{l}");
            // Every image part names a file under the run directory.
            for m in messages {
                for part in m["content"].as_array().into_iter().flatten() {
                    if part["type"] == "image" {
                        let f = part["image"].as_str().unwrap();
                        assert!(out.join(f).is_file(), "{f} missing");
                    }
                }
            }
        }
    }
}

#[test]
fn tool_declarations_are_checked_before_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let graph = graph(
        tmp.path(),
        "zoom = {}\nlook = { kind = \"crop\", coordinates = \"polar\" }",
    );
    let out = flowrl(&["validate", &graph]);
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("unknown tool kind `zoom` (did you mean `zoom_in`?)"),
        "{err}"
    );
    assert!(
        err.contains("tool `look`: unknown variant `polar`"),
        "{err}"
    );
    assert!(
        err.contains("tools.toml:"),
        "diagnostics point into the graph: {err}"
    );
}

/// `flowrl graph FILE --format json` (the graph as compiled, defaults filled in).
fn compiled(graph: &str) -> Value {
    let out = flowrl(&["graph", graph, "--format", "json"]);
    assert!(out.status.success(), "{graph}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The shipped tool graph and its twin without tools are the same graph but for the tools:
/// the same nodes, wiring and parameters, except the rollout's kind and the turn parameters.
#[test]
fn the_no_tools_twin_is_the_tools_graph_without_tools() {
    let tools = compiled("graphs/grpo_vlm_tools.toml");
    let twin = compiled("graphs/grpo_vlm_no_tools.toml");
    assert_eq!(tools["order"], twin["order"]);
    let turn_keys = [
        "tools",
        "max_turns",
        "max_tool_calls",
        "max_parallel_calls",
        "max_tokens_per_turn",
        "format",
        "replay_turns",
    ];
    let strip = |g: &Value| -> Vec<Value> {
        g["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                let mut n = n.clone();
                if n["kind"] == "rollout.multi_turn" {
                    n["kind"] = "rollout".into();
                }
                if let Some(p) = n.get_mut("params").and_then(Value::as_object_mut) {
                    for k in turn_keys {
                        p.remove(k);
                    }
                }
                n
            })
            .collect()
    };
    assert_eq!(strip(&tools), strip(&twin));
    let rollout = |g: &Value| {
        g["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "rollout")
            .unwrap()["kind"]
            .clone()
    };
    assert_eq!(rollout(&tools), "rollout.multi_turn");
    assert_eq!(rollout(&twin), "rollout");
}
