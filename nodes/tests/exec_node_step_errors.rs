//! The `exec` node kind's failures at a step, end to end (the harness is `common::exec`): no
//! answer (timeouts), wrong batch size, garbage and contract-breaking answers, answers that do not
//! match their request (protocol 2's `step`), numbers that are not finite.

mod common;

use std::path::Path;

use common::exec::{Collect, HELLO, graph, script, session, step};
use flowrl_engine::Session;

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
