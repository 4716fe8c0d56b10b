//! The scheduler, the step loop, checkpoints/resume and graph export on test-only kinds.

mod testkit;

use flowrl_engine::Session;
use flowrl_engine::export::{Format, export};
use flowrl_engine::run::run;
use flowrl_engine::rundir::read_metrics;
use std::sync::{Arc, Barrier};
use testkit::{graph, metrics, run_options as opts};

const TRAIN: &str = r#"
[run]
steps = 10
seed = 5
device = "cpu"
checkpoint_every = 3
keep_checkpoints = 2
plot = true

[models.policy]
init = 0.5
[models.reference]
from = "policy"

[nodes.src]
kind = "test.source"
count = 4
[nodes.other]
kind = "test.source"
count = 4
[nodes.add]
kind = "test.add"
inputs = { a = "src.n", b = "other.n" }
[nodes.score]
kind = "test.score"
inputs = { n = "add.sum" }
[nodes.train]
kind = "test.train"
model = "policy"
inputs = { n = "add.sum" }
"#;

#[test]
fn independent_nodes_run_concurrently() {
    let barrier = Arc::new(Barrier::new(2));
    let reg = testkit::registry().with_kind(testkit::Rendezvous(barrier));
    let g = graph(
        &reg,
        "[run]\nworkers = 2\n[nodes.x]\nkind = \"test.rendezvous\"\n[nodes.y]\nkind = \"test.rendezvous\"\n\
         [nodes.sum]\nkind = \"test.add\"\ninputs = { a = \"x.n\", b = \"y.n\" }\n",
        &[],
    );
    let mut s = Session::build(g, None, None).unwrap();
    // With sequential execution the first rendezvous would wait forever.
    let r = s.run_step(0, &mut |_| {}).unwrap();
    assert_eq!(r.metrics["add/sum"], 0.0);
    assert!(r.metrics.contains_key("timing_s/x") && r.metrics.contains_key("timing_s/step"));
}

#[test]
fn failing_node_names_itself_and_the_cause() {
    let g = graph(
        &testkit::registry(),
        "[nodes.src]\nkind = \"test.source\"\n[nodes.score]\nkind = \"test.score\"\ninputs = { n = \"src.n\" }\n\
         [nodes.sink]\nkind = \"test.sink\"\ninputs = { scores = \"score.scores\" }\nfail_at = 2\n",
        &[],
    );
    let mut s = Session::build(g, None, None).unwrap();
    s.run_step(0, &mut |_| {}).unwrap();
    let e = format!("{:#}", s.run_step(1, &mut |_| {}).unwrap_err());
    assert_eq!(
        e,
        "node `sink` (kind `test.sink`) failed at step 2: loss is NaN"
    );
    // The session stays usable: every node came back from the workers.
    s.run_step(2, &mut |_| {}).unwrap();
}

#[test]
fn skipped_producer_skips_required_consumers_but_not_optional_ones() {
    let g = graph(
        &testkit::registry(),
        "[nodes.e]\nkind = \"test.every\"\nevery = 2\n[nodes.src]\nkind = \"test.source\"\ncount = 1\n\
         [nodes.req]\nkind = \"test.add\"\ninputs = { a = \"e.n\" }\n\
         [nodes.opt]\nkind = \"test.add\"\ninputs = { a = \"src.n\", b = \"e.n\" }\n\
         [nodes.after]\nkind = \"test.score\"\ninputs = { n = \"req.sum\" }\n",
        &[],
    );
    let mut s = Session::build(g, None, None).unwrap();
    let r0 = s.run_step(0, &mut |_| {}).unwrap();
    assert!(r0.nodes.iter().all(|n| !n.skipped));
    let r1 = s.run_step(1, &mut |_| {}).unwrap();
    let skipped: Vec<&str> = r1
        .nodes
        .iter()
        .filter(|n| n.skipped)
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(skipped.len(), 3, "{skipped:?}");
    assert!(skipped.contains(&"e") && skipped.contains(&"req") && skipped.contains(&"after"));
    assert!(!r1.metrics.contains_key("critic/score/mean"));
    assert!(!r1.metrics.contains_key("timing_s/req"));
}

#[test]
fn resume_reproduces_the_uninterrupted_run_exactly() {
    let reg = testkit::registry();
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full");
    let s = run(graph(&reg, TRAIN, &[]), &opts(&full, false)).unwrap();
    assert_eq!((s.first_step, s.steps), (0, 10));
    assert!(full.join("plots.svg").exists());
    let want = metrics(&full);
    assert_eq!(want.len(), 10);

    // Interrupted: 7 steps (checkpoints at 3, 6, 7; two kept), then metrics of a "killed" 8th step
    // appended by hand, then resume to 10.
    let part = tmp.path().join("part");
    run(graph(&reg, TRAIN, &["run.steps=7"]), &opts(&part, false)).unwrap();
    let kept: Vec<String> = std::fs::read_dir(part.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(kept, vec!["step_000006", "step_000007"]);
    // `keep_checkpoints = 0` keeps every one (verl's `max_actor_ckpt_to_keep = null`).
    let all = tmp.path().join("all");
    run(
        graph(&reg, TRAIN, &["run.steps=7", "run.keep_checkpoints=0"]),
        &opts(&all, false),
    )
    .unwrap();
    assert_eq!(
        std::fs::read_dir(all.join("checkpoints")).unwrap().count(),
        3
    );
    std::fs::remove_dir_all(part.join("checkpoints/step_000007")).unwrap();
    use std::io::Write;
    writeln!(
        std::fs::OpenOptions::new()
            .append(true)
            .open(part.join("metrics.jsonl"))
            .unwrap(),
        "{{\"step\":7,\"bogus\":1}}"
    )
    .unwrap();
    let text = std::fs::read_to_string(part.join("graph.toml")).unwrap();
    let s = run(graph(&reg, &text, &["run.steps=10"]), &opts(&part, true)).unwrap();
    assert_eq!(s.first_step, 6);
    let got = metrics(&part);
    assert_eq!(got, want);
    let w: f64 =
        std::fs::read_to_string(part.join("checkpoints/step_000010/resources/policy/w.txt"))
            .unwrap()
            .parse()
            .unwrap();
    assert_eq!(
        Some(&("actor/pg_loss".to_string(), w)),
        want[9].iter().find(|(k, _)| k == "actor/pg_loss")
    );
}

#[test]
fn run_dir_holding_a_run_is_refused_unless_forced() {
    let reg = testkit::registry();
    let tmp = tempfile::tempdir().unwrap();
    let mut o = opts(&tmp.path().join("r"), false);
    run(graph(&reg, TRAIN, &["run.steps=1"]), &o).unwrap();
    let e = run(graph(&reg, TRAIN, &["run.steps=1"]), &o)
        .unwrap_err()
        .to_string();
    assert!(e.contains("already holds a run"), "{e}");
    o.force = true;
    run(graph(&reg, TRAIN, &["run.steps=2"]), &o).unwrap();
    assert_eq!(
        read_metrics(&tmp.path().join("r/metrics.jsonl"))
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn exports_show_kinds_types_resources_devices() {
    let g = graph(&testkit::registry(), TRAIN, &[]);
    let dot = export(&g, Format::Dot);
    assert!(dot.starts_with("digraph flowrl {\n") && dot.ends_with("}\n"));
    assert!(
        dot.contains("\"n:add\" -> \"n:score\" [label=\"sum → n\\nNumbers\"];"),
        "{dot}"
    );
    assert!(
        dot.contains("\"r:policy\" -> \"n:train\" [style=dashed"),
        "{dot}"
    );
    assert!(dot.contains("kind: test.train\\ndevice: cpu:0\""), "{dot}");
    // Structure: every line between the braces is one `;`-terminated statement with balanced
    // (unescaped) quotes and brackets.
    for line in dot.lines().skip(1).take_while(|l| *l != "}") {
        let unescaped = line.replace("\\\\", "").replace("\\\"", "");
        assert_eq!(unescaped.matches('"').count() % 2, 0, "{line}");
        assert_eq!(
            unescaped.matches('[').count(),
            unescaped.matches(']').count(),
            "{line}"
        );
        assert!(line.ends_with(';'), "{line}");
    }
    if let Ok(mut child) = std::process::Command::new("dot")
        .arg("-Tsvg")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(dot.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "dot rejected: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mm = export(&g, Format::Mermaid);
    assert!(
        mm.starts_with("flowchart LR\n")
            && mm.contains("n_add -- \"Numbers: sum → n\" --> n_score"),
        "{mm}"
    );
    let html = export(&g, Format::Html);
    assert!(html.contains("<svg") && html.contains("test.train") && html.contains("Numbers"));
    assert!(
        !html.contains("<script") && !html.contains("https://") && !html.contains("src=\"http")
    );
    let json: serde_json::Value = serde_json::from_str(&export(&g, Format::Json)).unwrap();
    assert_eq!(json["nodes"][4]["resources"][0]["resource"], "policy");
    assert_eq!(json["nodes"][2]["inputs"][0]["type"], "Numbers");
}

#[test]
fn a_failed_build_leaves_no_run_behind() {
    let reg = testkit::registry().with_kind(testkit::Unbuildable);
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(&tmp.path().join("r"), false);
    let g = || graph(&reg, "[nodes.x]\nkind = \"test.unbuildable\"\n", &[]);
    let e = format!("{:#}", run(g(), &o).unwrap_err());
    assert_eq!(
        e,
        "building node `x` (kind `test.unbuildable`): weights file not found"
    );
    // The same directory can be used again (no "already holds a run").
    let e = format!("{:#}", run(g(), &o).unwrap_err());
    assert!(e.starts_with("building node `x`"), "{e}");
}
