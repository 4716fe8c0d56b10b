//! The `exec` node kind end to end: graphs compiled with the built-in registry (plus a small
//! rollout source and a score collector defined here), external programs written as small Python
//! scripts into a temporary directory, steps run through the engine's `Session`.
//!
//! Covers the handshake at validation time (ports and params type-checked like a built-in kind),
//! the Python reward example (its scores equal the Rust rules' and appear in the metrics), and the
//! failure cases: garbage output, unknown port type, wrong batch size, exit at start, no answer
//! (timeouts), crashes with and without restarts.

use flowrl_engine::{
    BuildContext, DeviceSpec, Inputs, Node, NodeKind, Outputs, ParamSpec, Params, Port, PortSpec,
    PortType, Registry, Session, StepContext, StepReport, compile,
};
use flowrl_nodes::values::port_types;
use flowrl_nodes::{PromptBatch, RolloutBatch, ScoreBatch, TokenMatrix};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);
const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);

/// Responses and ground truths of the fake rollout source.
const RESPONSES: &[(&str, &str)] = &[
    ("<think>2+2</think> so \\boxed{4}", "4"),
    ("<think>hm</think> \\boxed{5}", "4"),
    ("\\boxed{ 7 }", "7"),
    ("no box at all", "3"),
    ("  3  ", "3"),
    ("<think>a\nb</think>\n\\boxed{x^2}", "x^2"),
];

fn rollouts(repeat: usize) -> RolloutBatch {
    let b = RESPONSES.len();
    let t = 4;
    let mut mask = TokenMatrix::zeros(b, t);
    let response_ids: Vec<Vec<u32>> = (0..b).map(|i| vec![7; 1 + i % t]).collect();
    for (i, ids) in response_ids.iter().enumerate() {
        mask.row_mut(i)[..ids.len()].fill(1.0);
    }
    RolloutBatch {
        prompts: Arc::new(PromptBatch {
            prompts: Vec::new(),
            pad_token_id: 0,
            image_token_id: None,
            epoch: 0,
        }),
        prompt_index: vec![0; b],
        uid: (0..b).map(|i| format!("u{}", i / 2)).collect(),
        prompt_ids: vec![vec![1, 2]; b],
        response_ids,
        response_mask: mask,
        sampling_log_probs: TokenMatrix::zeros(b, t),
        ground_truth: RESPONSES.iter().map(|r| r.1.to_string()).collect(),
        data_source: vec!["test".into(); b],
        response_text: RESPONSES.iter().map(|r| r.0.repeat(repeat)).collect(),
        truncated: vec![false; b],
        trajectories: Vec::new(),
    }
}

/// `test.rollouts`: emits the fixed batch above every step (each text repeated `copies` times; `repeat` is an engine key).
struct FakeRollouts;
impl NodeKind for FakeRollouts {
    fn name(&self) -> &str {
        "test.rollouts"
    }
    fn doc(&self) -> &str {
        "Fixed rollouts for tests."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![ROLLOUTS.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::int("copies").default(1).min(1)]
    }
    fn build(&self, params: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let repeat = params.get_i64("copies").unwrap_or(1) as usize;
        Ok(Box::new(FakeRolloutsNode(repeat)))
    }
}
struct FakeRolloutsNode(usize);
impl Node for FakeRolloutsNode {
    fn run(&mut self, _: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
        Ok(Outputs::new().with_opaque(ROLLOUTS, rollouts(self.0)))
    }
}

/// `test.collect`: keeps every `ScoreBatch` it receives (a downstream consumer of typed values).
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<ScoreBatch>>>);
impl NodeKind for Collect {
    fn name(&self) -> &str {
        "test.collect"
    }
    fn doc(&self) -> &str {
        "Collects scores for tests."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![SCORES.spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }
    fn params(&self) -> Vec<ParamSpec> {
        Vec::new()
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(self.clone()))
    }
}
impl Node for Collect {
    fn run(&mut self, inputs: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
        let s = inputs.get(SCORES)?;
        self.0.lock().unwrap().push(s.clone());
        Ok(Outputs::new())
    }
}

fn registry(collect: &Collect) -> Registry {
    flowrl_nodes::builtin_registry()
        .with_kind(FakeRollouts)
        .with_kind(collect.clone())
}

/// The example program, from the `nodes` package directory (where `cargo test` runs).
fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/python_reward/reward.py")
        .display()
        .to_string()
}

/// A graph: fake rollouts → `reward` (exec, running `command`) → collector. `extra` is added to
/// the exec node's table.
fn graph(command: &[&str], extra: &str) -> String {
    let cmd: Vec<String> = command.iter().map(|c| format!("{c:?}")).collect();
    format!(
        r#"[run]
steps = 3

[nodes.rollout]
kind = "test.rollouts"

[nodes.reward]
kind = "exec"
command = [{}]
inputs = {{ rollouts = "rollout.rollouts" }}
{extra}

[nodes.sink]
kind = "test.collect"
inputs = {{ scores = "reward.scores" }}
"#,
        cmd.join(", ")
    )
}

/// Writes a Python script into `dir` and returns its path.
fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path.display().to_string()
}

/// The handshake of a scorer program (one `rollouts` input, one `scores` output).
const HELLO: &str = r#"
import json, sys, os, time
def hello(outputs_type="Scores", params=None):
    print(json.dumps({"hello": {"protocol": 1, "name": "t", "version": "0",
        "inputs": [{"name": "rollouts", "type": "Rollouts"}],
        "outputs": [{"name": "scores", "type": outputs_type}],
        "params": params or []}}), flush=True)
def answer(obj):
    print(json.dumps(obj), flush=True)
def ones(req):
    n = req["inputs"]["rollouts"]["size"]
    return {"outputs": {"scores": {"scores": [1.0] * n}}}
"#;

fn check_fails(text: &str) -> String {
    let collect = Collect::default();
    match compile(&registry(&collect), "graph.toml", text, &[]) {
        Ok(_) => panic!("the graph compiled"),
        Err(f) => f.render(),
    }
}

fn session(text: &str, collect: &Collect) -> Session {
    let (graph, _) = compile(&registry(collect), "graph.toml", text, &[])
        .unwrap_or_else(|f| panic!("{}", f.render()));
    Session::build(graph, vec![DeviceSpec::Cpu(0)], None, None).unwrap()
}

fn step(s: &mut Session, i: u64) -> anyhow::Result<StepReport> {
    s.run_step(i, &mut |_| {})
}

/// `(1 - w)·exact_match + w·format`, the rule the example implements, from flowrl's Rust rewards.
fn rust_score(response: &str, truth: &str, w: f64) -> f64 {
    use flowrl_algorithms::rewards::{exact_match_reward, format_reward};
    (1.0 - w) * exact_match_reward(response, truth) + w * format_reward(response)
}

#[test]
fn python_example_scores_match_the_rust_rules_and_reach_the_metrics() {
    let collect = Collect::default();
    let mut s = session(&graph(&["python3", &example()], ""), &collect);
    for i in 0..2 {
        let report = step(&mut s, i).unwrap();
        let got = &collect.0.lock().unwrap()[i as usize];
        let want: Vec<f64> = RESPONSES
            .iter()
            .map(|(r, t)| rust_score(r, t, 0.1))
            .collect();
        assert_eq!(got.scores.len(), RESPONSES.len());
        for (k, (g, w)) in got.scores.iter().zip(&want).enumerate() {
            assert!(
                (*g as f64 - w).abs() < 1e-6,
                "response {k}: python {g}, rust {w}"
            );
        }
        let mean = want.iter().sum::<f64>() / want.len() as f64;
        // flowrl logs the f32 scores like a built-in reward's.
        assert!((report.metrics["critic/score/mean"] - mean).abs() < 1e-6);
        assert!((report.metrics["critic/score/acc/mean"] - 4.0 / 6.0).abs() < 1e-6);
        assert_eq!(report.metrics["critic/score/format/mean"], 0.5);
        assert_eq!(
            report.metrics["reward/boxed_fraction"],
            4.0 / 6.0,
            "the program's own"
        );
        assert_eq!(got.components["acc"], vec![1.0, 0.0, 1.0, 0.0, 1.0, 1.0]);
        assert_eq!(got.components["format"], vec![1.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
        assert_eq!(
            got.rollouts.len(),
            RESPONSES.len(),
            "scores attached to the rollouts"
        );
        assert!(report.metrics.contains_key("timing_s/reward"));
    }
}

#[test]
fn params_are_forwarded_and_checked_against_the_handshake() {
    let collect = Collect::default();
    let mut s = session(
        &graph(&["python3", &example()], "params = { format_score = 0.5 }"),
        &collect,
    );
    step(&mut s, 0).unwrap();
    let got = collect.0.lock().unwrap()[0].scores.clone();
    let want: Vec<f32> = RESPONSES
        .iter()
        .map(|(r, t)| rust_score(r, t, 0.5) as f32)
        .collect();
    assert_eq!(got, want);

    let e = check_fails(&graph(
        &["python3", &example()],
        "params = { format_scor = 0.2 }",
    ));
    assert!(e.contains("unknown key `params.format_scor`"), "{e}");
    assert!(e.contains("format_score"), "did-you-mean: {e}");
    let e = check_fails(&graph(
        &["python3", &example()],
        "params = { format_score = 2.0 }",
    ));
    assert!(e.contains("`params.format_score` must be"), "{e}");
    assert!(e.contains("got 2"), "{e}");
    let e = check_fails(&graph(
        &["python3", &example()],
        "params = { format_score = \"x\" }",
    ));
    assert!(
        e.contains("`params.format_score` must be a number, found a string"),
        "{e}"
    );
}

#[test]
fn wiring_is_type_checked_against_the_declared_ports() {
    let text = graph(&["python3", &example()], "").replace(
        "[nodes.sink]",
        "[nodes.again]\nkind = \"exec\"\ncommand = [\"python3\", \"EX\"]\n\
         inputs = { rollouts = \"reward.scores\" }\n\n[nodes.sink]",
    );
    let e = check_fails(&text.replace("EX", &example()));
    assert!(
        e.contains("`again.rollouts` expects Rollouts, got Scores from `reward.scores`"),
        "{e}"
    );
    let text = graph(&["python3", &example()], "").replace("\"reward.scores\"", "\"reward.score\"");
    let e = check_fails(&text);
    assert!(
        e.contains("node `reward` (kind `exec`) has no output port `score`"),
        "{e}"
    );
    assert!(e.contains("scores"), "{e}");
}

#[test]
fn the_graph_and_its_export_show_the_programs_ports() {
    let collect = Collect::default();
    let (g, _) = compile(
        &registry(&collect),
        "graph.toml",
        &graph(&["python3", &example()], ""),
        &[],
    )
    .unwrap();
    let id = g.node_id("reward").unwrap();
    let kind = &g.nodes[id].kind;
    assert_eq!(kind.name(), "exec");
    assert!(
        kind.doc().starts_with("Think-then-box reward"),
        "{}",
        kind.doc()
    );
    assert!(kind.doc().contains("program `python_reward` version 1.0.0"));
    let outs: Vec<(String, &str)> = kind
        .outputs()
        .iter()
        .map(|p| (p.name.clone(), p.ty.name()))
        .collect();
    assert_eq!(outs, vec![("scores".to_string(), "Scores")]);
    let params: Vec<String> = kind.params().iter().map(|p| p.name.clone()).collect();
    assert!(params.contains(&"params".to_string()) && params.contains(&"timeout_s".to_string()));
    let json = flowrl_engine::export::to_json(&g);
    let node = json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "reward")
        .unwrap()
        .clone();
    assert_eq!(node["kind"], "exec");
    assert_eq!(node["outputs"][0]["type"], "Scores", "{node}");
}

#[test]
fn the_program_starts_once_per_run() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("starts.log");
    let body = format!(
        "{HELLO}\nopen({log:?}, 'a').write('start\\n')\nhello()\nfor line in sys.stdin:\n    answer(ones(json.loads(line)))\n",
        log = log.display().to_string()
    );
    let prog = script(dir.path(), "once.py", &body);
    let collect = Collect::default();
    let mut s = session(&graph(&["python3", &prog], ""), &collect);
    for i in 0..3 {
        step(&mut s, i).unwrap();
    }
    drop(s);
    let starts = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        starts.lines().count(),
        1,
        "validation, build and three steps: one process"
    );
    assert_eq!(collect.0.lock().unwrap().len(), 3);
}

#[test]
fn garbage_handshake_is_a_validation_error() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        dir.path(),
        "g.py",
        "print('Loading model...', flush=True)\nimport time; time.sleep(5)\n",
    );
    let e = check_fails(&graph(&["python3", &prog], ""));
    assert!(e.contains("exec node `reward`"), "{e}");
    assert!(
        e.contains("printed something that is not a JSON handshake"),
        "{e}"
    );
    assert!(e.contains("`Loading model...`"), "{e}");
    assert!(e.contains("graph.toml:9:"), "points at `command`: {e}");
}

#[test]
fn unknown_port_type_in_the_handshake_is_a_validation_error() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(dir.path(), "u.py", &format!("{HELLO}\nhello('Tensor')\n"));
    let e = check_fails(&graph(&["python3", &prog], ""));
    assert!(
        e.contains("program `t` (`python3 ") && e.contains("declares output port `scores` of unknown port type `Tensor` (known port types: Prompts, Rollouts, Scores, TokenLogProbs, Advantages)"),
        "{e}"
    );
    // The node is left out of the wiring checks: one error, not a cascade.
    assert!(e.contains("1 error found"), "{e}");
}

#[test]
fn exit_at_start_is_a_validation_error_with_the_stderr_tail() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        dir.path(),
        "x.py",
        "import sys\nprint('ImportError: no module named torch', file=sys.stderr)\nsys.exit(3)\n",
    );
    let e = check_fails(&graph(&["python3", &prog], ""));
    assert!(
        e.contains("exited (exit status: 3) before its handshake"),
        "{e}"
    );
    assert!(e.contains("| ImportError: no module named torch"), "{e}");

    let e = check_fails(&graph(&["/nonexistent/prog"], ""));
    assert!(
        e.contains("`/nonexistent/prog` could not be started: `/nonexistent/prog`"),
        "{e}"
    );
}

#[test]
fn a_silent_program_times_out_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        dir.path(),
        "s.py",
        "import time, sys\nprint('thinking', file=sys.stderr, flush=True)\ntime.sleep(30)\n",
    );
    let t = std::time::Instant::now();
    let e = check_fails(&graph(&["python3", &prog], "start_timeout_s = 3"));
    assert!(e.contains("printed no handshake within 3 s"), "{e}");
    assert!(e.contains("| thinking"), "{e}");
    assert!(t.elapsed().as_secs_f64() < 10.0, "killed, not waited for");
}

#[test]
fn never_answering_a_request_is_a_timeout_error() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        dir.path(),
        "h.py",
        &format!(
            "{HELLO}\nhello()\nfor line in sys.stdin:\n    print('stuck on', len(line), file=sys.stderr, flush=True)\n    time.sleep(30)\n"
        ),
    );
    let collect = Collect::default();
    let mut s = session(&graph(&["python3", &prog], "timeout_s = 2.5"), &collect);
    let t = std::time::Instant::now();
    let e = format!("{:#}", step(&mut s, 0).unwrap_err());
    assert!(t.elapsed().as_secs_f64() < 10.0);
    assert!(
        e.contains("node `reward` (kind `exec`) failed at step 1"),
        "{e}"
    );
    assert!(e.contains("exec node `reward` (`python3 "), "{e}");
    assert!(
        e.contains("the program did not answer step 1 within 2.5 s"),
        "{e}"
    );
    assert!(e.contains("| stuck on"), "{e}");
    assert!(e.contains("restart = \"never\""), "{e}");
    assert!(
        collect.0.lock().unwrap().is_empty(),
        "nothing downstream ran"
    );
}

#[test]
fn a_program_that_stops_reading_cannot_block_a_large_request() {
    // About 1.7 MB of request, far more than a pipe buffer, to a program that never reads stdin.
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        dir.path(),
        "nr.py",
        &format!("{HELLO}\nhello()\ntime.sleep(30)\n"),
    );
    let collect = Collect::default();
    let text = graph(&["python3", &prog], "timeout_s = 1").replace(
        "kind = \"test.rollouts\"",
        "kind = \"test.rollouts\"\ncopies = 10000",
    );
    let mut s = session(&text, &collect);
    let t = std::time::Instant::now();
    let e = format!("{:#}", step(&mut s, 0).unwrap_err());
    assert!(
        e.contains("the program did not answer step 1 within 1 s"),
        "{e}"
    );
    drop(s);
    assert!(t.elapsed().as_secs_f64() < 10.0, "{:?}", t.elapsed());
}

#[test]
fn wrong_batch_size_is_a_step_error() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        dir.path(),
        "b.py",
        &format!(
            "{HELLO}\nhello()\nfor line in sys.stdin:\n    answer({{'outputs': {{'scores': {{'scores': [1.0, 0.5]}}}}, 'metrics': {{'x': 1}}}})\n"
        ),
    );
    let collect = Collect::default();
    let mut s = session(
        &graph(&["python3", &prog], "restart = \"on-failure\""),
        &collect,
    );
    let e = format!("{:#}", step(&mut s, 0).unwrap_err());
    assert!(
        e.contains("step 1: output `scores` has 2 scores for a batch of 6 responses (one per response expected)"),
        "{e}"
    );
    // A contract error is not retried (the program is alive and would answer the same).
    assert!(!e.contains("restart"), "{e}");
}

#[test]
fn garbage_answer_is_a_step_error() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        dir.path(),
        "ga.py",
        &format!(
            "{HELLO}\nhello()\nfor line in sys.stdin:\n    print('debug: got request', flush=True)\n"
        ),
    );
    let collect = Collect::default();
    let mut s = session(&graph(&["python3", &prog], ""), &collect);
    let e = format!("{:#}", step(&mut s, 0).unwrap_err());
    assert!(
        e.contains("the program answered step 1 with a line that is not JSON")
            && e.contains("`debug: got request`"),
        "{e}"
    );
}

#[test]
fn contract_errors_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "{'error': 'ground truth missing'}",
            "the program reported an error: ground truth missing",
        ),
        (
            "{'outputs': {}}",
            "the program did not return output `scores` (Scores)",
        ),
        (
            "dict(ones(json.loads(line)), metrics={'m': 'high'})",
            "metric `m` is not a finite number: \"high\"",
        ),
        (
            "{'outputs': {'scores': {'scores': [1]*6}, 'extra': 1}}",
            "returned output `extra`, which it did not declare",
        ),
        (
            "{'outputs': {'scores': {'score': [1]*6}}}",
            "output `scores` is not a valid Scores value (unknown field `score`",
        ),
        (
            "{'outptus': {}}",
            "invalid response (unknown field `outptus`",
        ),
    ];
    for (i, (answer, want)) in cases.iter().enumerate() {
        let prog = script(
            dir.path(),
            &format!("c{i}.py"),
            &format!("{HELLO}\nhello()\nfor line in sys.stdin:\n    answer({answer})\n"),
        );
        let collect = Collect::default();
        let mut s = session(&graph(&["python3", &prog], ""), &collect);
        let e = format!("{:#}", step(&mut s, 0).unwrap_err());
        assert!(e.contains(want), "case {i}: {e}");
    }
}

/// A program that crashes on its first `crashes` requests over the run (counted in a file), then
/// answers; every start is logged.
fn crashing(dir: &Path, crashes: usize) -> (String, PathBuf) {
    let log = dir.join("events.log");
    let body = format!(
        "{HELLO}\nLOG = {log:?}\nopen(LOG, 'a').write('start\\n')\nhello()\n\
         for line in sys.stdin:\n\
         \x20   seen = open(LOG).read().count('request')\n\
         \x20   open(LOG, 'a').write('request\\n')\n\
         \x20   if seen < {crashes}:\n\
         \x20       print('segfault in reward', file=sys.stderr, flush=True)\n\
         \x20       os._exit(139)\n\
         \x20   answer(ones(json.loads(line)))\n",
        log = log.display().to_string()
    );
    (script(dir, "crash.py", &body), log)
}

#[test]
fn on_failure_restarts_the_program_and_resends_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let (prog, log) = crashing(dir.path(), 2);
    let collect = Collect::default();
    let mut s = session(
        &graph(
            &["python3", &prog],
            "restart = \"on-failure\"\nmax_restarts = 2",
        ),
        &collect,
    );
    let report = step(&mut s, 0).unwrap();
    let warnings: Vec<&String> = report.nodes.iter().flat_map(|n| &n.warnings).collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("exec node `reward`: the program exited (exit status: 139) while handling step 1; restarting it (1 of 2 restarts)"),
        "{warnings:?}"
    );
    step(&mut s, 1).unwrap();
    assert_eq!(collect.0.lock().unwrap().len(), 2, "each step applied once");
    let events = std::fs::read_to_string(&log).unwrap();
    assert_eq!(events.matches("start").count(), 3);
    assert_eq!(
        events.matches("request").count(),
        4,
        "the first step sent three times, the second once"
    );
}

#[test]
fn restarts_are_limited_and_the_run_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (prog, log) = crashing(dir.path(), 100);
    let collect = Collect::default();
    let mut s = session(
        &graph(
            &["python3", &prog],
            "restart = \"on-failure\"\nmax_restarts = 2",
        ),
        &collect,
    );
    let e = format!("{:#}", step(&mut s, 0).unwrap_err());
    assert!(
        e.contains("the program exited (exit status: 139) while handling step 1"),
        "{e}"
    );
    assert!(e.contains("| segfault in reward"), "{e}");
    assert!(
        e.contains("(all 2 restarts allowed by max_restarts are used)"),
        "{e}"
    );
    assert!(collect.0.lock().unwrap().is_empty());
    drop(s);
    let events = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        events.matches("start").count(),
        3,
        "first start + 2 restarts"
    );
}

#[test]
fn a_restarted_program_must_declare_what_was_checked() {
    // Declares version = number of earlier starts, and crashes on its first request.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("starts.log");
    let body = format!(
        "import json, os, sys\nLOG = {log:?}\n\
         n = open(LOG).read().count('s') if os.path.exists(LOG) else 0\n\
         open(LOG, 'a').write('s')\n\
         print(json.dumps({{'hello': {{'protocol': 1, 'name': 't', 'version': str(n),\n\
         \x20   'inputs': [{{'name': 'rollouts', 'type': 'Rollouts'}}],\n\
         \x20   'outputs': [{{'name': 'scores', 'type': 'Scores'}}]}}}}), flush=True)\n\
         for line in sys.stdin:\n\
         \x20   os._exit(1)\n",
        log = log.display().to_string()
    );
    let prog = script(dir.path(), "v.py", &body);
    let collect = Collect::default();
    let mut s = session(
        &graph(&["python3", &prog], "restart = \"on-failure\""),
        &collect,
    );
    let e = format!("{:#}", step(&mut s, 0).unwrap_err());
    assert!(
        e.contains("the program's handshake changed since the graph was checked (now `t` 1)"),
        "{e}"
    );
}

/// `test.any`: keeps every value wired to it, by port.
#[derive(Clone, Default)]
struct CollectAny(Arc<Mutex<Vec<(String, flowrl_engine::Value)>>>);
impl NodeKind for CollectAny {
    fn name(&self) -> &str {
        "test.any"
    }
    fn doc(&self) -> &str {
        "Collects any values for tests."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::variadic(PortType::ANY)]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }
    fn params(&self) -> Vec<ParamSpec> {
        Vec::new()
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(self.clone()))
    }
}
impl Node for CollectAny {
    fn run(&mut self, inputs: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
        let mut v = self.0.lock().unwrap();
        for (port, value) in inputs.iter() {
            v.push((port.to_string(), value.clone()));
        }
        Ok(Outputs::new())
    }
}

#[test]
fn scores_in_and_per_token_values_out_are_padded_to_the_batch() {
    // rollouts → Python reward → a second program (Scores in; Advantages and TokenLogProbs out).
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        dir.path(),
        "adv.py",
        r#"
import json, sys
print(json.dumps({"hello": {"protocol": 1, "name": "adv", "version": "0",
    "inputs": [{"name": "scores", "type": "Scores"}],
    "outputs": [{"name": "advantages", "type": "Advantages"}, {"name": "logp", "type": "TokenLogProbs"}],
    "params": [{"name": "extra_token", "type": "bool", "default": False}]}}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    s = req["inputs"]["scores"]
    lens = s["rollouts"]["response_length"]
    assert s["size"] == len(s["scores"]) == len(lens) and set(s["components"]) == {"acc", "format"}
    m = sum(s["scores"]) / len(s["scores"])
    extra = 1 if req["params"]["extra_token"] else 0
    adv = [[x - m] * (n + extra) for x, n in zip(s["scores"], lens)]
    print(json.dumps({"outputs": {"advantages": {"advantages": adv},
                                  "logp": {"log_probs": [[-0.5] * n for n in lens]}}}), flush=True)
"#,
    );
    let text = |extra: &str| {
        format!(
            r#"[nodes.rollout]
kind = "test.rollouts"

[nodes.reward]
kind = "exec"
command = ["python3", {example:?}]
inputs = {{ rollouts = "rollout.rollouts" }}

[nodes.adv]
kind = "exec"
command = ["python3", {prog:?}]
inputs = {{ scores = "reward.scores" }}
{extra}

[nodes.sink]
kind = "test.any"
inputs = {{ adv = "adv.advantages", lp = "adv.logp" }}
"#,
            example = example()
        )
    };
    let sink = CollectAny::default();
    let registry = || {
        flowrl_nodes::builtin_registry()
            .with_kind(FakeRollouts)
            .with_kind(sink.clone())
    };
    let (g, _) = compile(&registry(), "graph.toml", &text(""), &[])
        .unwrap_or_else(|f| panic!("{}", f.render()));
    let mut s = Session::build(g, vec![DeviceSpec::Cpu(0)], None, None).unwrap();
    s.run_step(0, &mut |_| {}).unwrap();
    let got = sink.0.lock().unwrap().clone();
    let value = |port: &str| got.iter().find(|(p, _)| p == port).unwrap().1.clone();
    let adv = value("adv");
    let adv = adv.downcast_ref::<flowrl_nodes::AdvantageBatch>().unwrap();
    let scores: Vec<f64> = RESPONSES
        .iter()
        .map(|(r, t)| rust_score(r, t, 0.1))
        .collect();
    let mean = scores.iter().sum::<f64>() / scores.len() as f64;
    let r = rollouts(1);
    assert_eq!(adv.advantages.shape(), [RESPONSES.len(), r.response_len()]);
    for (i, n) in r.response_lengths().into_iter().enumerate() {
        let row = adv.advantages.row(i);
        assert!(
            row[..n]
                .iter()
                .all(|&x| (x as f64 - (scores[i] - mean)).abs() < 1e-6),
            "{row:?}"
        );
        assert!(row[n..].iter().all(|&x| x == 0.0), "padding: {row:?}");
    }
    assert_eq!(
        adv.returns, adv.advantages,
        "returns default to the advantages"
    );
    let lp = value("lp");
    let lp = lp.downcast_ref::<flowrl_nodes::TokenLogProbs>().unwrap();
    assert_eq!(
        lp.log_probs.data.iter().filter(|&&x| x == -0.5).count(),
        r.response_lengths().iter().sum::<usize>()
    );
    assert!(lp.entropy.is_none());

    let (g, _) = compile(
        &registry(),
        "graph.toml",
        &text("params = { extra_token = true }"),
        &[],
    )
    .unwrap();
    let mut s = Session::build(g, vec![DeviceSpec::Cpu(0)], None, None).unwrap();
    let e = format!("{:#}", s.run_step(0, &mut |_| {}).unwrap_err());
    assert!(
        e.contains(
            "output `advantages` has 2 values in row 0 of advantages, but response 0 has 1 tokens"
        ),
        "{e}"
    );
}

/// The handshake of a protocol-2 scorer, and `ones2(req)`: an answer that echoes the step.
const HELLO2: &str = r#"
import json, sys, os, time
print(json.dumps({"hello": {"protocol": 2, "name": "t2", "version": "0",
    "inputs": [{"name": "rollouts", "type": "Rollouts"}],
    "outputs": [{"name": "scores", "type": "Scores"}]}}), flush=True)
def answer(obj):
    print(json.dumps(obj), flush=True)
def ones2(req, step=None):
    n = req["inputs"]["rollouts"]["size"]
    return {"step": req["step"] if step is None else step, "outputs": {"scores": {"scores": [1.0] * n}}}
"#;

/// A session on a program: `head` (a handshake and helpers), then a request loop whose body is
/// `body` (`req` is the parsed request).
fn session_on(dir: &Path, head: &str, body: &str, extra: &str) -> (Session, Collect) {
    let src = format!("{head}\nfor line in sys.stdin:\n    req = json.loads(line)\n{body}");
    let prog = script(dir, "p.py", &src);
    let collect = Collect::default();
    (
        session(&graph(&["python3", &prog], extra), &collect),
        collect,
    )
}

/// Gives the program's stdout reader time to pass on a line written right after an answer.
fn let_extra_lines_arrive() {
    std::thread::sleep(std::time::Duration::from_millis(300));
}

#[test]
fn a_program_that_answers_twice_stops_the_run() {
    let dir = tempfile::tempdir().unwrap();
    // The second line is found unread before the next request is sent.
    let twice = "    answer(ones2(req))\n    if req['step'] == 0:\n        answer(ones2(req))\n";
    let (mut s, collect) = session_on(dir.path(), HELLO2, twice, "restart = \"on-failure\"");
    step(&mut s, 0).unwrap();
    let_extra_lines_arrive();
    let e = format!("{:#}", step(&mut s, 1).unwrap_err());
    assert!(
        e.contains("node `reward` (kind `exec`) failed at step 2: exec node `reward` (`python3 ")
            && e.contains(", request `\"step\": 1`): "),
        "{e}"
    );
    assert!(
        e.contains(
            "the program answered step 1 twice (a second line with `\"step\": 0`: \
             `{\"step\": 0, \"outputs\""
        ),
        "{e}"
    );
    assert!(
        e.contains("it must write exactly one answer line per request"),
        "{e}"
    );
    assert!(
        !e.contains("restart"),
        "a protocol error is not retried: {e}"
    );
    assert_eq!(collect.0.lock().unwrap().len(), 1, "step 2 applied nothing");

    // A stale answer read as the answer to the next request: its `step` gives it away.
    let stale = "    answer(ones2(req, step=0))\n";
    let (mut s, _) = session_on(dir.path(), HELLO2, stale, "");
    step(&mut s, 0).unwrap();
    let e = format!("{:#}", step(&mut s, 1).unwrap_err());
    assert!(
        e.contains(
            "the program answered step 1 twice: the answer read for step 2 (`\"step\": 1`) \
             carries `\"step\": 0`"
        ),
        "{e}"
    );

    // Any other id that is not the request's.
    let wrong = "    answer(ones2(req, step=req['step'] + 5))\n";
    let (mut s, _) = session_on(dir.path(), HELLO2, wrong, "");
    let e = format!("{:#}", step(&mut s, 0).unwrap_err());
    assert!(
        e.contains(
            "the program's answer carries `\"step\": 5`, but the request was `\"step\": 0` \
             (step 1); each answer must echo its request's `step`"
        ),
        "{e}"
    );

    // Protocol 2 answers carry their step.
    let no_step = "    answer({'outputs': {'scores': {'scores': [1.0] * 6}}})\n";
    let (mut s, _) = session_on(dir.path(), HELLO2, no_step, "");
    let e = format!("{:#}", step(&mut s, 0).unwrap_err());
    assert!(
        e.contains("the program's answer to step 1 has no `step`: protocol 2 answers echo"),
        "{e}"
    );

    // Protocol 1 answers have no step: an extra line is still caught before the next request.
    let v1 = "    answer(ones(req))\n    print('done', flush=True)\n";
    let (mut s, _) = session_on(dir.path(), &format!("{HELLO}\nhello()\n"), v1, "");
    step(&mut s, 0).unwrap();
    let_extra_lines_arrive();
    let e = format!("{:#}", step(&mut s, 1).unwrap_err());
    assert!(
        e.contains(
            "the program wrote an extra line after its answer to step 1 (`\"step\": 0`): `done`"
        ),
        "{e}"
    );
}

#[test]
fn a_nan_answer_is_a_contract_error_that_says_scores_must_be_finite() {
    let dir = tempfile::tempdir().unwrap();
    // Python's json.dumps writes `NaN`, which is not JSON.
    let nan = "    a = ones2(req)\n    a['outputs']['scores']['scores'][2] = float('nan')\n    answer(a)\n";
    let (mut s, collect) = session_on(dir.path(), HELLO2, nan, "restart = \"on-failure\"");
    let e = format!("{:#}", step(&mut s, 0).unwrap_err());
    assert!(
        e.contains(
            "the program answered step 1 with NaN at `outputs.scores.scores[2]`: scores, metrics \
             and every other number in an answer must be finite"
        ),
        "{e}"
    );
    assert!(
        !e.contains("not JSON") && !e.contains("logs belong on stderr"),
        "{e}"
    );
    assert!(!e.contains("restart"), "not a crash to restart: {e}");
    assert!(collect.0.lock().unwrap().is_empty());

    let inf = "    a = ones2(req)\n    a['metrics'] = {'m': float('-inf')}\n    answer(a)\n";
    let (mut s, _) = session_on(dir.path(), HELLO2, inf, "");
    let e = format!("{:#}", step(&mut s, 0).unwrap_err());
    assert!(
        e.contains("answered step 1 with -Infinity at `metrics.m`"),
        "{e}"
    );
}

#[test]
fn protocol_1_programs_still_run_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        dir.path(),
        "v1.py",
        &format!("{HELLO}\nhello()\nfor line in sys.stdin:\n    answer(ones(json.loads(line)))\n"),
    );
    let collect = Collect::default();
    let text = graph(&["python3", &prog], "");
    let (_, warnings) = compile(&registry(&collect), "graph.toml", &text, &[]).unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].code.as_str(), "W0502");
    assert!(
        warnings[0].message.contains(
            "program `t` speaks protocol 1, whose answers do not carry the request's `step`"
        ),
        "{}",
        warnings[0].message
    );
    assert!(
        warnings[0]
            .help
            .as_deref()
            .unwrap()
            .contains("declare \"protocol\": 2")
    );
    let mut s = session(&text, &collect);
    step(&mut s, 0).unwrap();
    step(&mut s, 1).unwrap();
    assert_eq!(collect.0.lock().unwrap().len(), 2);
    // The example speaks protocol 2: no warning.
    let text = graph(&["python3", &example()], "");
    let (_, warnings) = compile(&registry(&collect), "graph.toml", &text, &[]).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn a_program_parameter_at_the_top_level_is_pointed_into_params() {
    let e = check_fails(&graph(&["python3", &example()], "format_score = 0.2"));
    assert!(
        e.contains(
            "`format_score` is a parameter of exec node `reward`'s program, not of the node"
        ),
        "{e}"
    );
    assert!(
        e.contains(
            "help: program parameters go in the `params` table: `params = { format_score = 0.2 }`"
        ),
        "{e}"
    );
    assert!(e.contains("1 error found"), "{e}");
}

#[test]
fn the_stderr_log_keeps_every_start_up_and_a_failed_retry_names_the_restart() {
    // Every process logs a line before its handshake and one per request, then exits.
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts.log");
    let body = format!(
        "import json, os, sys\nLOG = {starts:?}\n\
         n = open(LOG).read().count('s') if os.path.exists(LOG) else 0\n\
         open(LOG, 'a').write('s')\n\
         print(f'booting process {{n}}', file=sys.stderr, flush=True)\n\
         print(json.dumps({{'hello': {{'protocol': 2, 'name': 't', 'version': '0',\n\
         \x20   'inputs': [{{'name': 'rollouts', 'type': 'Rollouts'}}],\n\
         \x20   'outputs': [{{'name': 'scores', 'type': 'Scores'}}]}}}}), flush=True)\n\
         for line in sys.stdin:\n\
         \x20   step = json.loads(line)['step']\n\
         \x20   print(f'process {{n}} got step {{step}}', file=sys.stderr, flush=True)\n\
         \x20   os._exit(3)\n",
        starts = starts.display().to_string()
    );
    let prog = script(dir.path(), "r.py", &body);
    let collect = Collect::default();
    let text = graph(
        &["python3", &prog],
        "restart = \"on-failure\"\nmax_restarts = 1",
    );
    let (g, _) = compile(&registry(&collect), "graph.toml", &text, &[]).unwrap();
    let run_dir = dir.path().join("run");
    let mut s = Session::build(g, vec![DeviceSpec::Cpu(0)], None, Some(run_dir.clone())).unwrap();
    let e = format!("{:#}", step(&mut s, 0).unwrap_err());
    assert!(
        e.contains("(all 1 restarts allowed by max_restarts are used)"),
        "{e}"
    );
    assert!(
        e.contains(
            "(earlier in this step: the program exited (exit status: 3) while handling step 1; \
             restarted it (1 of 1 restarts))"
        ),
        "the restart warning of the failed step: {e}"
    );
    drop(s);
    let log = std::fs::read_to_string(run_dir.join("exec/reward.stderr.log")).unwrap();
    assert_eq!(
        log, "booting process 0\nprocess 0 got step 0\nbooting process 1\nprocess 1 got step 0\n",
        "the start-up before each handshake included (process 0 started when the graph was \
         checked)"
    );
}
