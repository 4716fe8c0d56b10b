//! How `eval` scores and when: by a reward node of the graph (`repeat`), the same numbers as its
//! built-in rule (to f32 rounding), the training reward's metrics untouched; by default with the
//! graph's training reward, a Python program included; on verl's schedule (after steps k, 2k, …,
//! the last, and before training as step 0).

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");

/// The metrics lines of a run of `graph` (its text) with `args`.
fn run_lines(graph: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("graph.toml");
    std::fs::write(&file, graph).unwrap();
    let out = dir.path().join("run");
    let run = Command::new(BIN)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .arg("run")
        .arg(&file)
        .args(args)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The metrics of step 1 of a one-step run.
fn run(graph: &str) -> serde_json::Value {
    run_lines(graph, &["--steps", "1"])
        .into_iter()
        .find(|m| m["step"] == 1)
        .expect("a line for step 1")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// The steps of `lines` that have `val/score`.
fn evaluated(lines: &[serde_json::Value]) -> Vec<u64> {
    lines
        .iter()
        .filter(|m| m.get("val/score").is_some())
        .map(|m| m["step"].as_u64().unwrap())
        .collect()
}

#[test]
fn eval_runs_on_verls_schedule_and_before_training() {
    let graph = read("graphs/grpo_vlm.toml");
    let args = ["--steps", "5", "--set", "nodes.eval.every=2"];
    let lines = run_lines(&graph, &args);
    // verl's test_freq = 2 over 5 steps: 2, 4 and the last; val_before_train: step 0.
    assert_eq!(evaluated(&lines), [0, 2, 4, 5]);
    let before = &lines[0];
    assert_eq!(before["step"], 0);
    assert!(before.get("critic/score/mean").is_none(), "{before}");
    assert!(before["timing_s/eval"].as_f64().unwrap() > 0.0, "{before}");

    let mut args = args.to_vec();
    args.extend(["--set", "nodes.eval.before_train=false"]);
    assert_eq!(evaluated(&run_lines(&graph, &args)), [2, 4, 5]);
}

#[test]
fn eval_scores_with_the_training_reward_unless_told_otherwise() {
    // The Python reward at format_score 0 is its accuracy alone: val/score = val/accuracy. The
    // built-in geo3k rule (0.9 accuracy + 0.1 format) differs on these responses.
    let graph = read("examples/python_reward/grpo_python_reward.toml").replace(
        "params = { format_score = 0.1 }",
        "params = { format_score = 0.0 }",
    );
    let step0 = |extra: &[&str]| {
        let mut args = vec!["--steps", "1", "--set", "nodes.eval.every=100"];
        args.extend(extra);
        run_lines(&graph, &args).remove(0)
    };
    let python = step0(&[]);
    assert_eq!(python["step"], 0);
    let (score, acc) = (
        python["val/score"].as_f64(),
        python["val/accuracy"].as_f64(),
    );
    assert_eq!(score, acc, "{python}");
    let rule = step0(&["--set", "nodes.eval.reward=geo3k"]);
    assert_eq!(rule["val/accuracy"], python["val/accuracy"], "{rule}");
    assert_ne!(rule["val/score"], rule["val/accuracy"], "{rule}");
}

#[test]
fn eval_with_several_training_rewards_must_be_told_which() {
    let graph = read("graphs/grpo_vlm.toml")
        + "\n[nodes.format]\nkind = \"reward.format\"\ninputs = { rollouts = \"rollout.rollouts\" }\n";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("graph.toml");
    std::fs::write(&file, &graph).unwrap();
    let out = Command::new(BIN)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .arg("validate")
        .arg(&file)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{e}");
    assert!(
        e.contains(
            "the graph has 2 reward nodes (`reward`, `format`): say which scores validation"
        ),
        "{e}"
    );
}

/// The default graph with `eval` scored by a node `val_reward` of the given table body.
fn with_val_reward(body: &str) -> (String, String) {
    let default = read("graphs/grpo_vlm.toml");
    let with_node = default.replace(
        "inputs = { prompts = \"data.val_prompts\", after = \"update.done\" }",
        "repeat = [\"val_reward\"]\n\
         inputs = { prompts = \"data.val_prompts\", after = \"update.done\", scores = \"val_reward.scores\" }",
    ) + "\n[nodes.val_reward]\n" + body + "timing = \"eval\"\ninputs = { rollouts = \"eval.rollouts\" }\n";
    (default, with_node)
}

#[test]
fn eval_scored_by_an_exec_reward_runs_a_request_per_chunk() {
    // 200 validation prompts in chunks of 64: four requests to the program within one step.
    let (_, graph) = with_val_reward(
        "kind = \"exec\"\ncommand = [\"python3\", \"examples/python_reward/reward.py\"]\n",
    );
    let m = run(&graph);
    let score = m["val/score"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&score), "{m}");
    assert!(m["val/flowrl/shapes/accuracy"].is_number(), "{m}");
}

#[test]
fn eval_scored_by_a_reward_node_matches_its_builtin_rule() {
    let (default, with_node) = with_val_reward("kind = \"reward.geo3k\"\n");
    assert_ne!(default, with_node);
    let (a, b) = (run(&default), run(&with_node));
    let keys: Vec<&String> = a
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("val/") || k.starts_with("critic/"))
        .collect();
    assert!(keys.iter().any(|k| k.as_str() == "val/score"), "{a}");
    // The reward node's scores travel as f32 (ScoreBatch), the built-in rule's as f64.
    for k in keys {
        let (x, y) = (a[k].as_f64().unwrap(), b[k].as_f64().unwrap());
        assert!((x - y).abs() <= 1e-6, "{k}: {x} vs {y}");
    }
    assert!(b["timing_s/eval"].as_f64().unwrap() > 0.0);
}

/// DAPO's graph repeats the dataset inside its filter and shapes the reward with `overlong`:
/// the evaluation before training still gets the validation prompts, and scores through the
/// shaping node too (its component is in the validation metrics).
#[test]
fn eval_of_the_dapo_graph_runs_before_training_and_scores_through_its_shaping() {
    let graph = read("graphs/dapo_vlm.toml");
    let lines = run_lines(&graph, &["--steps", "1"]);
    let before = &lines[0];
    assert_eq!(before["step"], 0, "{before}");
    assert!(
        before["val-aux/flowrl/shapes/overlong/mean@1"].is_number(),
        "{before}"
    );
    assert_eq!(evaluated(&lines), [0, 1]);
}
