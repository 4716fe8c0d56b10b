//! The `exec` node kind's crashes, end to end (the harness is `common::exec`): restarts on
//! failure and their limit, a restarted program's handshake checked again, and the stderr log of
//! every start.

mod common;

use std::path::{Path, PathBuf};

use common::exec::{Collect, HELLO, graph, registry, script, session, step};
use flowrl_engine::{Session, compile};

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
    let mut s = Session::build(g, None, Some(run_dir.clone())).unwrap();
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
