//! The `exec` node kind through the `flowrl` binary: the Python reward example validated, shown
//! by `flowrl nodes --graph` and `flowrl graph`, and run on real rollouts of the tiny model, with
//! its metrics in metrics.jsonl; a failing program stops `validate` (exit 78) and `run` (exit 1)
//! with the node's name and the program's stderr.

mod common;

use serde_json::Value as Json;
use std::path::Path;
use std::process::{Command, Output};

const GRAPH: &str = "examples/python_reward/score_rollouts.toml";
const GRPO: &str = "examples/python_reward/grpo_python_reward.toml";

fn flowrl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowrl"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn metrics(run_dir: &Path) -> Vec<Json> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The example graph with the reward node's command and params replaced.
fn graph_with(dir: &Path, program: &str, body: &str) -> String {
    let prog = dir.join(program);
    std::fs::write(&prog, body).unwrap();
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(GRAPH))
        .unwrap()
        .replace(
            "command = [\"python3\", \"examples/python_reward/reward.py\"]",
            &format!("command = [\"python3\", {:?}]", prog.display().to_string()),
        )
        .replace("params = { format_score = 0.1 }", "");
    let path = dir.join("graph.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn the_example_validates_and_shows_its_declared_ports() {
    let out = flowrl(&["validate", GRAPH]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("order: data → rollout → reward"));

    let out = flowrl(&["nodes", "--graph", GRAPH]);
    let s = text(&out.stdout);
    assert!(
        s.contains("reward   exec             Think-then-box reward with an exact-match verifier, in Python."),
        "{s}"
    );
    let out = flowrl(&["nodes", "--graph", GRAPH, "reward"]);
    let s = text(&out.stdout);
    assert!(
        s.contains("Inputs:\n  rollouts : Rollouts — the responses to score"),
        "{s}"
    );
    assert!(s.contains("Outputs:\n  scores : Scores"), "{s}");
    assert!(
        s.contains("params.format_score : float, default 0.1, [0, 1]"),
        "{s}"
    );
    assert!(s.contains("program `python_reward` version 1.0.0"), "{s}");

    let out = flowrl(&["graph", GRAPH, "--format", "json"]);
    let g: Json = serde_json::from_str(&text(&out.stdout)).unwrap();
    let reward = g["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "reward")
        .unwrap();
    assert_eq!(reward["kind"], "exec");
    assert_eq!(reward["outputs"][0]["type"], "Scores", "{reward}");

    let out = flowrl(&[
        "validate",
        GRAPH,
        "--set",
        "nodes.reward.params.format_score=3",
    ]);
    assert_eq!(out.status.code(), Some(78));
    assert!(text(&out.stderr).contains("`params.format_score` must be [0, 1], got 3"));
}

#[test]
fn the_python_reward_runs_on_real_rollouts_and_its_rewards_reach_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = flowrl(&[
        "run",
        GRAPH,
        "--out",
        run.to_str().unwrap(),
        "--progress",
        "plain",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let m = metrics(&run);
    assert_eq!(m.len(), 2);
    let log = std::fs::read_to_string(run.join("exec/reward.stderr.log")).unwrap();
    assert_eq!(
        log,
        "[python_reward] step 0: scored 4 responses\n[python_reward] step 1: scored 4 responses\n"
    );
    for line in &m {
        let mean = line["critic/score/mean"].as_f64().unwrap();
        let (lo, hi) = (
            line["critic/score/min"].as_f64().unwrap(),
            line["critic/score/max"].as_f64().unwrap(),
        );
        assert!(
            (0.0..=1.0).contains(&mean) && lo <= mean && mean <= hi,
            "{line}"
        );
        let acc = line["critic/score/acc/mean"].as_f64().unwrap();
        let fmt = line["critic/score/format/mean"].as_f64().unwrap();
        assert!((mean - (0.9 * acc + 0.1 * fmt)).abs() < 1e-6, "{line}");
        assert_eq!(line["critic/rewards/mean"], line["critic/score/mean"]);
        let boxed = line["reward/boxed_fraction"].as_f64().unwrap();
        assert!(
            (0.0..=1.0).contains(&boxed),
            "the program's own metric: {line}"
        );
        assert!(line["timing_s/reward"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn the_program_sees_the_same_rollouts_as_the_engine() {
    // Reports the mean response length it received; the rollout node reports its own.
    let dir = tempfile::tempdir().unwrap();
    let body = r#"
import json, sys, os
open(os.environ["STARTS_LOG"], "a").write(os.environ["FLOWRL_NODE"] + "\n")
print(json.dumps({"hello": {"protocol": 1, "name": "lens", "version": "0",
    "inputs": [{"name": "rollouts", "type": "Rollouts"}],
    "outputs": [{"name": "scores", "type": "Scores"}]}}), flush=True)
for line in sys.stdin:
    r = json.loads(line)["inputs"]["rollouts"]
    lens = r["response_length"]
    assert lens == [len(ids) for ids in r["response_ids"]]
    assert len(r["response"]) == r["size"] == len(r["ground_truth"]) == len(set(r["uid"])) * 2
    print(json.dumps({"outputs": {"scores": {"scores": [0.0] * r["size"]}},
                      "metrics": {"test/len": sum(lens) / len(lens), "test/size": r["size"]}}), flush=True)
"#;
    let graph = graph_with(dir.path(), "lens.py", body);
    let run = dir.path().join("run");
    let starts = dir.path().join("starts.log");
    let out = Command::new(env!("CARGO_BIN_EXE_flowrl"))
        .args([
            "run",
            &graph,
            "--out",
            run.to_str().unwrap(),
            "--steps",
            "2",
        ])
        .env("STARTS_LOG", &starts)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(&starts).unwrap(),
        "reward\n",
        "one start for the whole run (check, build and two steps)"
    );
    let m = &metrics(&run)[0];
    assert_eq!(m["test/size"], 4.0, "batch_size 2 × n 2");
    assert_eq!(m["test/len"], m["response_length/mean"], "{m}");
}

#[test]
fn a_broken_program_stops_validate_and_run_with_its_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let graph = graph_with(dir.path(), "garbage.py", "print('starting up...')\n");
    let out = flowrl(&["validate", &graph]);
    assert_eq!(out.status.code(), Some(78));
    let e = text(&out.stderr);
    assert!(e.contains("error[E0106]: exec node `reward`"), "{e}");
    assert!(
        e.contains("printed something that is not a JSON handshake"),
        "{e}"
    );

    let body = r#"
import json, sys
print(json.dumps({"hello": {"protocol": 1, "name": "crash", "version": "0",
    "inputs": [{"name": "rollouts", "type": "Rollouts"}],
    "outputs": [{"name": "scores", "type": "Scores"}]}}), flush=True)
for line in sys.stdin:
    raise RuntimeError("reward model weights not found")
"#;
    let graph = graph_with(dir.path(), "crash.py", body);
    let run = dir.path().join("run");
    let out = flowrl(&["run", &graph, "--out", run.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    assert!(
        e.contains("node `reward` (kind `exec`) failed at step 1"),
        "{e}"
    );
    assert!(
        e.contains("exited (exit status: 1) while handling step 1"),
        "{e}"
    );
    assert!(
        e.contains("| RuntimeError: reward model weights not found"),
        "{e}"
    );
    assert!(
        e.contains("all 2 restarts allowed by max_restarts are used"),
        "{e}"
    );
    let m = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default();
    assert_eq!(m.lines().count(), 0, "the failed step wrote no metrics");
}

#[test]
fn the_grpo_example_is_the_default_graph_with_the_python_reward() {
    let (r_ours, r_default) = common::reward_swapped(GRPO);
    assert_eq!(r_ours["kind"], "exec");
    for key in ["inputs", "outputs", "timing_key"] {
        assert_eq!(r_ours[key], r_default[key], "the reward's {key}");
    }
}

#[test]
fn grpo_with_the_python_reward_trains_exactly_like_the_same_rule_in_rust() {
    // The same GRPO run twice: once with the Python reward, once with the built-in
    // `reward.combined` computing the same rule (0.9·exact_match + 0.1·format). Same seed, same
    // rollouts: the rewards, the advantages and the update must agree.
    let dir = tempfile::tempdir().unwrap();
    let rust_graph = dir.path().join("rust_reward.toml");
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(GRPO)).unwrap();
    let exec_table = src
        .split("[nodes.reward]")
        .nth(1)
        .unwrap()
        .split("\n\n")
        .next()
        .unwrap();
    let rust = src.replace(
        exec_table,
        "\nkind = \"reward.combined\"\ninputs = { rollouts = \"rollout.rollouts\" }\n\
         weights = { exact_match = 0.9, format = 0.1 }",
    );
    assert!(!rust.contains("kind = \"exec\""), "{rust}");
    std::fs::write(&rust_graph, rust).unwrap();
    let (py_run, rust_run) = (dir.path().join("py"), dir.path().join("rust"));
    for (graph, run) in [(GRPO, &py_run), (rust_graph.to_str().unwrap(), &rust_run)] {
        let out = flowrl(&["run", graph, "--steps", "2", "--out", run.to_str().unwrap()]);
        assert!(out.status.success(), "{graph}: {}", text(&out.stderr));
    }
    let (py, rust) = (metrics(&py_run), metrics(&rust_run));
    assert_eq!(
        py.len(),
        3,
        "step 0 (the evaluation before training) and 2 steps"
    );
    let close = |a: &Json, b: &Json, what: &str| {
        let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
        assert!(
            (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
            "{what}: python {a}, rust {b}"
        );
    };
    // Each graph's eval scores with its training reward: the same validation numbers.
    close(&py[0]["val/score"], &rust[0]["val/score"], "val/score");
    for (p, r) in py.iter().zip(&rust).skip(1) {
        close(&p["critic/score/mean"], &r["critic/score/mean"], "score");
        close(
            &p["critic/score/acc/mean"],
            &r["critic/score/exact_match/mean"],
            "accuracy",
        );
        close(
            &p["critic/score/format/mean"],
            &r["critic/score/format/mean"],
            "format",
        );
        for key in [
            "critic/advantages/mean",
            "actor/pg_loss",
            "actor/kl_loss",
            "actor/grad_norm",
        ] {
            close(&p[key], &r[key], key);
        }
    }
    assert!(
        py.iter()
            .any(|m| m["critic/score/mean"].as_f64().is_some_and(|s| s > 0.0)),
        "the tiny warm-started policy earns some reward: {py:?}"
    );
}

#[test]
fn a_program_that_answers_twice_or_answers_nan_stops_the_run_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let program = |answer: &str| {
        format!(
            r#"
import json, sys
print(json.dumps({{"hello": {{"protocol": 2, "name": "bad", "version": "0",
    "inputs": [{{"name": "rollouts", "type": "Rollouts"}}],
    "outputs": [{{"name": "scores", "type": "Scores"}}]}}}}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    n = req["inputs"]["rollouts"]["size"]
{answer}
"#
        )
    };
    let twice = "    a = {'step': req['step'], 'outputs': {'scores': {'scores': [0.0] * n}}}\n    \
                 print(json.dumps(a), flush=True)\n    print(json.dumps(a), flush=True)";
    let nan = "    print(json.dumps({'step': req['step'], 'outputs': {'scores': {'scores': \
               [float('nan')] * n}}}), flush=True)";
    for (name, answer, want) in [
        ("twice.py", twice, "the program answered step 1 twice"),
        (
            "nan.py",
            nan,
            "the program answered step 1 with NaN at `outputs.scores.scores[0]`: scores, metrics \
             and every other number in an answer must be finite",
        ),
    ] {
        let graph = graph_with(dir.path(), name, &program(answer));
        let run = dir.path().join(format!("run-{name}"));
        let out = flowrl(&["run", &graph, "--out", run.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let e = text(&out.stderr);
        assert!(
            e.contains("node `reward` (kind `exec`) failed at step"),
            "{e}"
        );
        assert!(e.contains(want), "{name}: {e}");
        assert!(
            !e.contains("restarting"),
            "a contract error is not retried: {e}"
        );
    }
}

#[test]
fn a_protocol_1_program_validates_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"
import json, sys
print(json.dumps({"hello": {"protocol": 1, "name": "old", "version": "0",
    "inputs": [{"name": "rollouts", "type": "Rollouts"}],
    "outputs": [{"name": "scores", "type": "Scores"}]}}), flush=True)
for line in sys.stdin:
    pass
"#;
    let graph = graph_with(dir.path(), "old.py", body);
    let out = flowrl(&["validate", &graph]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let e = text(&out.stderr);
    assert!(
        e.contains("warning[W0502]: exec node `reward`: program `old` speaks protocol 1"),
        "{e}"
    );
}
