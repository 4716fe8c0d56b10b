//! The `exec` node kind at validation time, end to end (the harness is `common::exec`): the
//! handshake's ports and params type-checked like a built-in kind's, the graph and its export, and
//! the failures before a step: garbage output, unknown port type, exit at start, no handshake
//! (timeout), a program parameter outside `params`, the warning on protocol 1.

mod common;

use common::exec::{
    Collect, HELLO, RESPONSES, check_fails, example, graph, registry, rust_score, script, session,
    step,
};
use flowrl_engine::compile;

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
