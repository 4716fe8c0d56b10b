//! `eval` scored by a reward node of the graph (`repeat`): the same numbers as its built-in rule,
//! (to f32 rounding), and the training reward's metrics untouched.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");

fn run(graph: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("graph.toml");
    std::fs::write(&file, graph).unwrap();
    let out = dir.path().join("run");
    let run = Command::new(BIN)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .arg("run")
        .arg(&file)
        .args(["--steps", "1", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    serde_json::from_str(metrics.lines().next().unwrap()).unwrap()
}

/// The default graph with `eval` scored by a node `val_reward` of the given table body.
fn with_val_reward(body: &str) -> (String, String) {
    let default =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/grpo_vlm.toml"))
            .unwrap();
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
