//! End-to-end tests of the `flowrl` binary: help, validate/graph/nodes on the shipped graphs, a
//! small real run (dataset → JSONL sink) for the run directory, refusal, resume and plots, and the
//! multi-process flags and variables.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn flowrl(args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(root())
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

fn shipped_graphs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("graphs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    v
}

#[test]
fn help_explains_the_commands() {
    let out = flowrl(&["--help"]);
    assert!(out.status.success());
    let h = text(&out.stdout);
    for cmd in [
        "run", "validate", "graph", "nodes", "plot", "data", "generate", "export",
    ] {
        assert!(h.contains(&format!("\n  {cmd} ")), "{h}");
    }
    let h = text(&flowrl(&["run", "--help"]).stdout);
    for flag in [
        "--resume",
        "--set",
        "--steps",
        "--device",
        "--out",
        "--force",
        "--rank",
        "--world",
        "--master",
        "--collective-timeout",
    ] {
        assert!(h.contains(flag), "{h}");
    }
    assert!(h.contains("Several processes"), "{h}");
    // The long help walks through a multi-process launch.
    assert!(
        h.contains("flowrl run g.toml --rank 1 --world 2 --master HOST0:29500"),
        "{h}"
    );
    assert!(h.contains("torchrun") && h.contains("SLURM_PROCID"), "{h}");
    let h = text(&flowrl(&["validate", "--help"]).stdout);
    assert!(h.contains("--world") && h.contains("[run] devices"), "{h}");
}

#[test]
fn every_shipped_graph_validates_and_exports() {
    let graphs = shipped_graphs();
    assert!(!graphs.is_empty());
    for g in graphs {
        let rel = g.strip_prefix(root()).unwrap().display().to_string();
        let out = flowrl(&["validate", &rel]);
        assert!(out.status.success(), "{rel}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains(": ok ("));
        for format in ["dot", "mermaid", "html", "json"] {
            let out = flowrl(&["graph", &rel, "--format", format]);
            assert!(
                out.status.success(),
                "{rel} {format}: {}",
                text(&out.stderr)
            );
            let body = text(&out.stdout);
            match format {
                "dot" => {
                    assert!(body.starts_with("digraph flowrl {") && body.trim_end().ends_with('}'));
                    check_with_graphviz(&body);
                }
                "html" => {
                    assert!(body.starts_with("<!DOCTYPE html>") && body.contains("<svg"));
                    assert!(!body.contains("<script") && !body.contains("https://"));
                }
                "json" => {
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    assert!(!v["nodes"].as_array().unwrap().is_empty());
                }
                _ => assert!(body.starts_with("flowchart LR")),
            }
        }
    }
}

/// Graphviz is optional: when `dot` is installed it must accept the export.
fn check_with_graphviz(dot: &str) {
    use std::io::Write;
    let Ok(mut child) = Command::new("dot")
        .arg("-Tsvg")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    else {
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(dot.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "dot rejected the export: {}",
        text(&out.stderr)
    );
}

#[test]
fn nodes_lists_and_describes_kinds() {
    let out = flowrl(&["nodes"]);
    let t = text(&out.stdout);
    assert!(t.contains("sink.jsonl") && t.contains("debug.print"), "{t}");
    let t = text(&flowrl(&["nodes", "sink.jsonl"]).stdout);
    assert!(
        t.contains("Parameters:\n  path : path, default \"values.jsonl\""),
        "{t}"
    );
    assert!(
        t.contains("Placement: once per process, on the run's first device (or its `device`)"),
        "{t}"
    );
    let out = flowrl(&["nodes", "sink.json"]);
    assert_eq!(out.status.code(), Some(78));
    assert!(text(&out.stderr).contains("did you mean `sink.jsonl`?"));
}

/// A typo in `--set nodes.NAME.key` makes a new node without a kind: the error says which
/// declared node was meant.
#[test]
fn a_misspelt_node_in_set_suggests_the_declared_one() {
    let out = flowrl(&[
        "validate",
        "graphs/grpo_vlm.toml",
        "--set",
        "nodes.rolout.n=4",
    ]);
    assert_eq!(out.status.code(), Some(78));
    let e = text(&out.stderr);
    assert!(
        e.contains("node `rolout` has no `kind`") && e.contains("did you mean `rollout`?"),
        "{e}"
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_device_without_cuda_build_is_a_configuration_error() {
    let g = shipped_graphs()[0].clone();
    let out = flowrl(&["validate", g.to_str().unwrap(), "--device", "cuda:0"]);
    assert_eq!(out.status.code(), Some(78));
    assert!(
        text(&out.stderr).contains("built without CUDA"),
        "{}",
        text(&out.stderr)
    );
    // Eight GPUs a CPU-only binary lacks are one error, not eight.
    let tmp = tempfile::tempdir().unwrap();
    let graph = tmp.path().join("eight.toml");
    let devices: Vec<String> = (0..8).map(|i| format!("\"cuda:{i}\"")).collect();
    std::fs::write(
        &graph,
        std::fs::read_to_string(root().join("graphs/grpo_vlm.toml"))
            .unwrap()
            .replace(
                "device = \"auto\"",
                &format!("devices = [{}]", devices.join(", ")),
            ),
    )
    .unwrap();
    let out = flowrl(&["validate", graph.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(78));
    let e = text(&out.stderr);
    assert_eq!(e.matches("error[E0701]").count(), 1, "{e}");
    assert!(
        e.contains("the run is placed on cuda:0, cuda:1, cuda:2, cuda:3, cuda:4, cuda:5, cuda:6, cuda:7, but this binary was built without CUDA"),
        "{e}"
    );
}

/// A real graph with the built-in data kind and the utility sinks (tiny, fast).
fn sink_graph(dir: &Path) -> PathBuf {
    let abs = |p: &str| root().join(p).display().to_string();
    let g = format!(
        r#"[run]
steps = 5
seed = 1
device = "cpu"
checkpoint_every = 2

[models.policy]
path = "{}"
init = "random"

[nodes.data]
kind = "dataset.parquet"
model = "policy"
path = "{}"
batch_size = 2

[nodes.sink]
kind = "sink.jsonl"
inputs = {{ p = "data.prompts" }}
"#,
        abs("assets/tiny-qwen2-vl-init"),
        abs("datasets/shapes/train.parquet")
    );
    let p = dir.join("sinkrun.toml");
    std::fs::write(&p, g).unwrap();
    p
}

fn run_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(cwd)
        .args(args)
        .output()
        .unwrap()
}

fn lines(p: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn run_writes_a_run_directory_refuses_reuse_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let g = sink_graph(tmp.path());
    let g = g.to_str().unwrap();
    let cwd = tmp.path();

    // Without --out: a new directory each time under runs/<graph stem>/.
    for _ in 0..2 {
        let out = run_in(cwd, &["run", g, "--progress", "plain", "--steps", "1"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("step 1/1"),
            "{}",
            text(&out.stdout)
        );
    }
    assert_eq!(
        std::fs::read_dir(cwd.join("runs/sinkrun")).unwrap().count(),
        2
    );

    let full = cwd.join("full");
    let out = run_in(
        cwd,
        &[
            "run",
            g,
            "--progress",
            "quiet",
            "--out",
            full.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    for f in ["graph.toml", "run.json", "metrics.jsonl", "values.jsonl"] {
        assert!(full.join(f).exists(), "{f}");
    }
    let m = lines(&full.join("metrics.jsonl"));
    assert_eq!(m.len(), 5);
    assert!(m[0]["timing_s/step"].as_f64().is_some() && m[0]["timing_s/data"].as_f64().is_some());
    assert_eq!(m[4]["step"], 5);
    assert!(
        full.join("checkpoints/step_000004").exists()
            && full.join("checkpoints/step_000005").exists()
    );

    // The same directory again: refused, untouched.
    let out = run_in(cwd, &["run", g, "--out", full.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("already holds a run"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(lines(&full.join("metrics.jsonl")).len(), 5);

    // Interrupted after 3 steps (checkpoint at 2 and 3), resumed to 5: the data position is
    // restored, so the recorded prompts equal the uninterrupted run's.
    let part = cwd.join("part");
    let out = run_in(
        cwd,
        &[
            "run",
            g,
            "--progress",
            "quiet",
            "--steps",
            "3",
            "--out",
            part.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run_in(
        cwd,
        &[
            "run",
            "--progress",
            "quiet",
            "--resume",
            part.to_str().unwrap(),
            "--steps",
            "5",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        lines(&part.join("values.jsonl")),
        lines(&full.join("values.jsonl"))
    );

    // --force replaces the run.
    let out = run_in(
        cwd,
        &[
            "run",
            g,
            "--progress",
            "quiet",
            "--steps",
            "2",
            "--force",
            "--out",
            full.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(lines(&full.join("metrics.jsonl")).len(), 2);
}

#[test]
fn plot_draws_the_main_curves() {
    let tmp = tempfile::tempdir().unwrap();
    let rows: String = (1..=4)
        .map(|s| {
            format!(
                "{{\"step\":{s},\"critic/score/mean\":{},\"actor/pg_loss\":0.1}}\n",
                s as f64 * 0.2
            )
        })
        .collect();
    std::fs::write(tmp.path().join("metrics.jsonl"), rows).unwrap();
    let out = flowrl(&["plot", tmp.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let svg = std::fs::read_to_string(tmp.path().join("plots.svg")).unwrap();
    assert!(svg.contains("critic/score/mean") && svg.contains("actor/pg_loss"));
    let out = flowrl(&["plot", tmp.path().join("nope").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
}

/// A graph of the test corpus's shape with two CPU replicas.
fn two_replica_graph(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(sink_graph(dir))
        .unwrap()
        .replace("device = \"cpu\"", "devices = [\"cpu:0\", \"cpu:1\"]");
    let p = dir.join("replicas.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn validate_reports_devices_and_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let g = two_replica_graph(tmp.path());
    let g = g.to_str().unwrap();
    let out = flowrl(&["validate", g]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("; devices: cpu:0, cpu:1)"),
        "{}",
        text(&out.stdout)
    );
    let out = flowrl(&[
        "validate",
        g,
        "--rank",
        "1",
        "--world",
        "2",
        "--master",
        "127.0.0.1:3000",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("; devices: cpu:0, cpu:1 × 2 processes)"),
        "{}",
        text(&out.stdout)
    );
    // `--device` replaces a list of devices, with a warning pointing at the argument.
    let out = flowrl(&["validate", g, "--device", "cpu"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let e = text(&out.stderr);
    assert!(
        e.contains("warning[E0704]: `--device cpu` replaces the graph's `[run] devices`")
            && e.contains("--> --device:1:12"),
        "{e}"
    );
    assert!(
        text(&out.stdout).contains("; devices: cpu:0)"),
        "{}",
        text(&out.stdout)
    );
    // The graph export shows the placement.
    let out = flowrl(&["graph", g, "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(v["devices"], serde_json::json!(["cpu:0", "cpu:1"]));
    assert_eq!(v["nodes"][0]["devices"], serde_json::json!(["cpu:0"]));
}

#[test]
fn cluster_flags_are_checked_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let g = sink_graph(tmp.path());
    let g = g.to_str().unwrap();
    let addrs = ["--master", "127.0.0.1:3000"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--rank", "2", "--world", "2"],
            "error: --rank 2 must be below --world 2 (ranks are 0..1)",
        ),
        (
            vec!["--world", "0"],
            "error: --world 0: a run needs at least one process",
        ),
        (
            vec!["--world", "2"],
            "error: a run of 2 processes needs rank 0's address: --master HOST:PORT",
        ),
        (
            vec!["--world", "2", "--master", "ws://127.0.0.1:3000"],
            "error: rank 0's address `ws://127.0.0.1:3000`: no host; expected HOST:PORT",
        ),
    ];
    for (flags, want) in cases {
        // `validate` connects to nothing: it needs no address.
        let needs_address = want.contains("address");
        for cmd in ["validate", "run"] {
            if cmd == "validate" && needs_address {
                continue;
            }
            let mut args = vec![cmd, g];
            args.extend(&flags);
            let out = run_in(tmp.path(), &args);
            assert_eq!(out.status.code(), Some(78), "{args:?}");
            assert!(
                text(&out.stderr).starts_with(want),
                "{args:?}: {}",
                text(&out.stderr)
            );
        }
    }
    assert!(!tmp.path().join("runs").exists());
    // One process: the address flags are accepted and ignored.
    let mut args = vec!["validate", g, "--world", "1"];
    args.extend(addrs);
    assert!(flowrl(&args).status.success());
    // `validate` checks the graph for W processes without addresses.
    let out = flowrl(&["validate", g, "--world", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(" × 2 processes)"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn each_process_of_a_run_writes_its_own_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let g = sink_graph(tmp.path());
    let g = g.to_str().unwrap();
    let out = run_in(
        tmp.path(),
        &[
            "run",
            g,
            "--progress",
            "quiet",
            "--steps",
            "1",
            "--rank",
            "1",
            "--world",
            "2",
            "--master",
            "127.0.0.1:3000",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dirs: Vec<String> = std::fs::read_dir(tmp.path().join("runs/sinkrun"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(dirs.len(), 1);
    assert!(dirs[0].ends_with("-rank1"), "{dirs:?}");
    let info: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            tmp.path()
                .join("runs/sinkrun")
                .join(&dirs[0])
                .join("run.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (info["rank"].clone(), info["world"].clone()),
        (1.into(), 2.into())
    );
    assert_eq!(info["devices"], "cpu:0");
}
