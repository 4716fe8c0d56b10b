//! Scale-out end to end, through the `flowrl` binary: the default GRPO graph (small settings) run
//! on two CPU replicas in one process, and as two processes joined by `flowrl orchestrator` on
//! loopback, gives the metrics of the same run on one device; a process whose peer never joins
//! stops with an error within its collective timeout instead of hanging.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{BIN, GRAPH, SMALL, assert_same_metrics, metrics, root};

/// Per test run, besides [`SMALL`]: no checkpoints.
const EXTRA: &[&str] = &["--set", "run.checkpoint_every=0"];

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn command(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(root()).args(args).args(SMALL).args(EXTRA);
    c
}

fn run(args: &[&str]) -> Output {
    let out = command(args).output().unwrap();
    assert!(
        out.status.success(),
        "flowrl {args:?} failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

fn one_device(dir: &Path) -> Vec<Value> {
    let out = dir.join("one");
    run(&["run", GRAPH, "--steps", "2", "--out", out.to_str().unwrap()]);
    metrics(&out)
}

#[test]
fn two_replicas_in_one_process_match_one_device() {
    let dir = tempfile::tempdir().unwrap();
    let expected = one_device(dir.path());
    let out = dir.path().join("two");
    let graph = dir.path().join("two_replicas.toml");
    let g = std::fs::read_to_string(root().join(GRAPH))
        .unwrap()
        .replace("device = \"auto\"", "devices = [\"cpu:0\", \"cpu:1\"]");
    assert!(g.contains("devices = [\"cpu:0\", \"cpu:1\"]"));
    std::fs::write(&graph, g).unwrap();
    run(&[
        "run",
        graph.to_str().unwrap(),
        "--steps",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_same_metrics(&expected, &metrics(&out), "2 replicas in one process");
}

/// A port nothing listens on (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Kills the child when dropped (a failing assertion must not leave processes behind).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn orchestrator() -> (Killed, u16) {
    let port = free_port();
    let child = Command::new(BIN)
        .args(["orchestrator", "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the orchestrator does not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (Killed(child), port)
}

fn rank(rank: usize, orchestrator: u16, out: &Path, timeout: &str, steps: &str) -> Command {
    let node = format!("ws://127.0.0.1:{}", free_port());
    let orch = format!("ws://127.0.0.1:{orchestrator}");
    let r = rank.to_string();
    let mut c = command(&[
        "run",
        GRAPH,
        "--steps",
        steps,
        "--out",
        out.to_str().unwrap(),
        "--device",
        "cpu",
        "--rank",
        &r,
        "--world",
        "2",
        "--orchestrator",
        &orch,
        "--node-address",
        &node,
        "--collective-timeout",
        timeout,
    ]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

#[test]
fn two_processes_on_loopback_match_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let expected = one_device(dir.path());
    let (_orchestrator, port) = orchestrator();
    let outs: Vec<PathBuf> = (0..2)
        .map(|r| dir.path().join(format!("rank{r}")))
        .collect();
    let children: Vec<Child> = (0..2)
        .map(|r| rank(r, port, &outs[r], "120", "2").spawn().unwrap())
        .collect();
    for (r, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "rank {r} failed:\n{}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    let (m0, m1) = (metrics(&outs[0]), metrics(&outs[1]));
    assert_same_metrics(&expected, &m0, "rank 0 of 2 processes");
    // Both processes hold the whole batch after every gather, so they log the same numbers.
    assert_same_metrics(&m0, &m1, "rank 1 vs rank 0");
}

#[test]
fn a_process_whose_peer_never_joins_stops_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (_orchestrator, port) = orchestrator();
    let start = Instant::now();
    let out = rank(0, port, &dir.path().join("rank0"), "3", "2")
        .output()
        .unwrap();
    let waited = start.elapsed();
    let err = text(&out.stderr);
    assert!(!out.status.success(), "rank 0 alone succeeded:\n{err}");
    assert!(
        waited < Duration::from_secs(90),
        "it took {waited:?} to give up"
    );
    assert!(
        err.contains("not every process joined within 3 s"),
        "{err}"
    );
    assert!(err.contains("process 0 of 2"), "{err}");
}

#[test]
fn a_process_whose_peer_dies_mid_run_stops_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (_orchestrator, port) = orchestrator();
    let outs: Vec<PathBuf> = (0..2)
        .map(|r| dir.path().join(format!("rank{r}")))
        .collect();
    let survivor = rank(0, port, &outs[0], "5", "200").spawn().unwrap();
    let mut victim = Killed(rank(1, port, &outs[1], "5", "200").spawn().unwrap());
    // Kill rank 1 once it has finished a step (the collective is set up and working).
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_to_string(outs[1].join("metrics.jsonl")).map_or(true, |m| m.is_empty()) {
        assert!(Instant::now() < deadline, "rank 1 never finished a step");
        std::thread::sleep(Duration::from_millis(50));
    }
    victim.0.kill().unwrap();
    let killed_at = Instant::now();
    let out = survivor.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "rank 0 finished without its peer:\n{err}"
    );
    assert!(
        killed_at.elapsed() < Duration::from_secs(60),
        "rank 0 took {:?} to stop",
        killed_at.elapsed()
    );
    // Either the broken connection or the 5 s wait ends it, with the same explanation.
    assert!(
        err.contains("collective") && err.contains("a process failed or exited"),
        "{err}"
    );
    assert!(!err.contains("stack backtrace"), "{err}");
}
