//! Scale-out end to end, through the `flowrl` binary: the default GRPO graph (small settings) run
//! on two CPU replicas in one process, and as two processes on loopback launched as torchrun
//! launches them, gives the metrics of the same run on one device. A process whose peer never
//! joins stops within its collective timeout; one whose peer runs another graph is refused at the
//! rendezvous; one whose peer dies or stops answering mid-run stops within 60 s, naming it. A
//! SIGTERM to one process stops both after the same step, and they resume; a ZeRO run's rank 0
//! checkpoint resumes in one process.

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

/// Process `rank` of two, told by flags (`torchrun = false`) or by torchrun's variables.
fn rank(rank: usize, port: u16, out: &Path, timeout: &str, steps: &str, torchrun: bool) -> Command {
    let master = format!("127.0.0.1:{port}");
    let r = rank.to_string();
    let mut args = vec![
        "run",
        GRAPH,
        "--steps",
        steps,
        "--out",
        out.to_str().unwrap(),
        "--device",
        "cpu",
        "--collective-timeout",
        timeout,
    ];
    if !torchrun {
        args.extend(["--rank", &r, "--world", "2", "--master", &master]);
    }
    let mut c = command(&args);
    if torchrun {
        c.env("RANK", &r)
            .env("WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// The training steps in the run's metrics.jsonl: its lines but the evaluation before training
/// (step 0).
fn steps_done(out: &Path) -> usize {
    std::fs::read_to_string(out.join("metrics.jsonl")).map_or(0, |m| {
        m.lines()
            .filter(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| v["step"] != 0))
            .count()
    })
}

/// Waits until the run in `out` has finished a step (its collectives are set up and working).
fn after_a_step(out: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while steps_done(out) == 0 {
        assert!(
            Instant::now() < deadline,
            "{} never finished a step",
            out.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_processes_on_loopback_match_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let expected = one_device(dir.path());
    let port = free_port();
    let outs: Vec<PathBuf> = (0..2)
        .map(|r| dir.path().join(format!("rank{r}")))
        .collect();
    // Launched as torchrun launches them: by environment variables alone.
    let children: Vec<Child> = (0..2)
        .map(|r| rank(r, port, &outs[r], "120", "2", true).spawn().unwrap())
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
    let start = Instant::now();
    let out = rank(0, free_port(), &dir.path().join("rank0"), "3", "2", false)
        .output()
        .unwrap();
    let waited = start.elapsed();
    let err = text(&out.stderr);
    assert!(!out.status.success(), "rank 0 alone succeeded:\n{err}");
    assert!(
        waited < Duration::from_secs(60),
        "it took {waited:?} to give up"
    );
    assert!(
        err.contains("rank 1") && err.contains("did not join within 3 s"),
        "{err}"
    );
}

#[test]
fn a_rank_with_another_graph_is_refused_at_the_rendezvous() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let first = rank(0, port, &dir.path().join("rank0"), "20", "2", false)
        .spawn()
        .unwrap();
    let mut other = rank(1, port, &dir.path().join("rank1"), "20", "2", false);
    other.args(["--set", "run.seed=5"]);
    let second = other.spawn().unwrap();
    for (r, c) in [first, second].into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert!(!out.status.success(), "rank {r} ran:\n{err}");
        assert!(
            err.contains("graph file and --set overrides"),
            "rank {r}: {err}"
        );
    }
}

#[test]
fn contradicting_launch_settings_are_a_configuration_error() {
    let out = command(&["run", GRAPH, "--world", "2", "--master", "127.0.0.1:1"])
        .env("WORLD_SIZE", "4")
        .env("RANK", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--world 2 contradicts WORLD_SIZE=4"),
        "{}",
        text(&out.stderr)
    );
}

/// A rank killed, or stopped (SIGSTOP), mid-run: the other stops within 60 s, naming it.
#[test]
fn a_process_that_dies_or_stalls_mid_run_stops_the_other_naming_it() {
    for signal in ["KILL", "STOP"] {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let outs: Vec<PathBuf> = (0..2)
            .map(|r| dir.path().join(format!("rank{r}")))
            .collect();
        let survivor = rank(0, port, &outs[0], "600", "200", false)
            .spawn()
            .unwrap();
        let victim = Killed(
            rank(1, port, &outs[1], "600", "200", false)
                .spawn()
                .unwrap(),
        );
        after_a_step(&outs[1]);
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &victim.0.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let at = Instant::now();
        let out = survivor.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert!(
            !out.status.success(),
            "SIG{signal}: rank 0 finished without its peer:\n{err}"
        );
        assert!(
            at.elapsed() < Duration::from_secs(60),
            "SIG{signal}: rank 0 took {:?} to stop",
            at.elapsed()
        );
        assert!(err.contains("rank 1"), "SIG{signal}: {err}");
        assert!(!err.contains("stack backtrace"), "{err}");
        drop(victim);
    }
}

/// Process `rank` of two resuming the run in `out` (launched as torchrun launches it).
fn resume_rank(rank: usize, port: u16, out: &Path, steps: &str) -> Command {
    let mut c = command(&[
        "run",
        "--resume",
        out.to_str().unwrap(),
        "--steps",
        steps,
        "--collective-timeout",
        "120",
    ]);
    c.env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn succeeded(r: usize, out: Output) -> String {
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "rank {r}:\n{stdout}\n{}",
        text(&out.stderr)
    );
    stdout
}

/// A SIGTERM to one process (a preemption) stops both after the same step, each with its
/// checkpoint and exit code 0; resumed, they end with the metrics of the uninterrupted run.
#[test]
fn a_sigterm_to_one_process_stops_both_after_the_same_step_and_they_resume() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("one");
    run(&[
        "run",
        GRAPH,
        "--steps",
        "4",
        "--out",
        full.to_str().unwrap(),
    ]);
    let expected = metrics(&full);
    let port = free_port();
    let outs: Vec<PathBuf> = (0..2)
        .map(|r| dir.path().join(format!("rank{r}")))
        .collect();
    let children: Vec<Child> = (0..2)
        .map(|r| rank(r, port, &outs[r], "120", "4", true).spawn().unwrap())
        .collect();
    after_a_step(&outs[1]);
    let term = Command::new("kill")
        .args(["-TERM", &children[1].id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let mut stopped = Vec::new();
    for (r, child) in children.into_iter().enumerate() {
        let stdout = succeeded(r, child.wait_with_output().unwrap());
        let done = steps_done(&outs[r]);
        assert!(
            (1..4).contains(&done),
            "rank {r} stopped after {done} steps"
        );
        assert!(
            stdout.contains(&format!("stopped by SIGTERM after step {done} of 4")),
            "rank {r}: {stdout}"
        );
        assert!(outs[r].join(format!("checkpoints/step_{done:06}")).is_dir());
        stopped.push(done);
    }
    assert_eq!(
        stopped[0], stopped[1],
        "the ranks stopped after different steps"
    );
    let port = free_port();
    let resumed: Vec<Child> = (0..2)
        .map(|r| resume_rank(r, port, &outs[r], "4").spawn().unwrap())
        .collect();
    for (r, c) in resumed.into_iter().enumerate() {
        succeeded(r, c.wait_with_output().unwrap());
        assert_same_metrics(&expected, &metrics(&outs[r]), &format!("rank {r} resumed"));
    }
}

/// The tensor names of a safetensors file.
fn tensor_names(file: &Path) -> Vec<String> {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut names: Vec<String> = header
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    names.sort();
    names
}

/// Two processes at ZeRO stage 1, computing in bf16 (the f32 masters sharded too): rank 0's
/// checkpoint holds the whole optimizer state (rank 1's only its own parameters'), every rank's
/// the whole masters, and rank 0's resumes in one process into the one-process run's metrics.
#[test]
fn a_sharded_two_process_checkpoint_resumes_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one");
    let every = [
        "--set",
        "run.checkpoint_every=2",
        "--set",
        "run.keep_checkpoints=2",
    ];
    // In bf16, so that the f32 masters are sharded too.
    let stage = ["--set", "nodes.update.zero_stage=1"];
    let bf16 = ["--set", "models.policy.precision=\"bf16\""];
    // After EXTRA's settings, which `command` adds.
    let run_with_checkpoints = |args: &[&str]| {
        succeeded(0, command(args).args(every).args(bf16).output().unwrap());
    };
    run_with_checkpoints(&["run", GRAPH, "--steps", "4", "--out", one.to_str().unwrap()]);
    let expected = metrics(&one);
    let port = free_port();
    let outs: Vec<PathBuf> = (0..2)
        .map(|r| dir.path().join(format!("rank{r}")))
        .collect();
    let children: Vec<Child> = (0..2)
        .map(|r| {
            let mut c = rank(r, port, &outs[r], "120", "2", true);
            c.args(every).args(bf16).args(stage);
            c.spawn().unwrap()
        })
        .collect();
    for (r, c) in children.into_iter().enumerate() {
        succeeded(r, c.wait_with_output().unwrap());
    }
    let state = |d: &Path| {
        tensor_names(&d.join("checkpoints/step_000002/resources/policy/optimizer.safetensors"))
    };
    let (whole, zero, own) = (state(&one), state(&outs[0]), state(&outs[1]));
    assert_eq!(
        zero, whole,
        "rank 0's checkpoint holds every parameter's moments"
    );
    assert!(
        !own.is_empty() && own.len() < whole.len() && own.iter().all(|k| whole.contains(k)),
        "rank 1 holds its own parameters' moments: {} of {}",
        own.len(),
        whole.len()
    );
    let weights = |d: &Path| {
        std::fs::read(d.join("checkpoints/step_000002/resources/policy/model/model.safetensors"))
            .unwrap()
    };
    assert!(
        weights(&outs[0]) == weights(&outs[1]),
        "the ranks saved different master weights"
    );
    // Resumed in one process, from rank 0's directory.
    run_with_checkpoints(&["run", "--resume", outs[0].to_str().unwrap(), "--steps", "4"]);
    // (Lines 1 and 2, steps 1 and 2, differ by the evaluation a run makes after its last step;
    // line 0 is the evaluation before training.)
    assert_same_metrics(
        &expected[3..],
        &metrics(&outs[0])[3..],
        "steps 3 and 4 resumed in one process",
    );
}

/// Processes resuming from checkpoints of different steps are refused at the rendezvous,
/// naming the steps (they would otherwise train on different weights).
#[test]
fn ranks_resuming_from_different_checkpoints_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let outs: Vec<PathBuf> = (0..2)
        .map(|r| dir.path().join(format!("rank{r}")))
        .collect();
    let children: Vec<Child> = (0..2)
        .map(|r| {
            let mut c = rank(r, port, &outs[r], "120", "2", true);
            c.args([
                "--set",
                "run.checkpoint_every=1",
                "--set",
                "run.keep_checkpoints=2",
            ]);
            c.spawn().unwrap()
        })
        .collect();
    for (r, c) in children.into_iter().enumerate() {
        succeeded(r, c.wait_with_output().unwrap());
    }
    std::fs::remove_dir_all(outs[1].join("checkpoints/step_000002")).unwrap();
    let port = free_port();
    let resumed: Vec<Child> = (0..2)
        .map(|r| resume_rank(r, port, &outs[r], "3").spawn().unwrap())
        .collect();
    for (r, c) in resumed.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert!(!out.status.success(), "rank {r} resumed:\n{err}");
        assert!(
            err.contains("--resume") && err.contains("step 2") && err.contains("step 1"),
            "rank {r}: {err}"
        );
    }
}
