//! Exact resume after SIGKILL at random moments: the default graph (small settings, a checkpoint
//! every step) is killed in several seeded trials — at a random time of the run, or inside the
//! write of a random step's checkpoint — and resumed; every resumed metrics.jsonl equals the
//! uninterrupted run's key for key (timings aside). A kill before the run directory holds a graph
//! starts the run over with `--force`; one before the first checkpoint resumes from step 1.
//!
//! `cargo test --release --test resume_kill -- --nocapture` prints where each kill landed;
//! `RESUME_KILL_SEED=N` draws other kill moments.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{BIN, GRAPH, SMALL, flowrl, metrics, root, training_steps};
use flowrl_engine::rundir::{Integrity, check_checkpoint};

const STEPS: &str = "6";
const TRIALS: u64 = 10;
const SEED: u64 = 20;

fn run_args(out: &Path) -> Vec<String> {
    let mut a: Vec<String> = [
        "run",
        GRAPH,
        "--out",
        out.to_str().unwrap(),
        "--steps",
        STEPS,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(SMALL.iter().map(|s| s.to_string()));
    a.extend(["--set".to_string(), "run.checkpoint_every=1".to_string()]);
    a
}

/// SplitMix64: the kill times are seeded, so a failing trial can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn spawn(out: &Path) -> std::process::Child {
    Command::new(BIN)
        .current_dir(root())
        .args(run_args(out))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The training steps in a run's metrics.jsonl (0 when there is none): its lines but the
/// evaluation before training (step 0).
fn lines(out: &Path) -> usize {
    std::fs::read_to_string(out.join("metrics.jsonl")).map_or(0, |t| {
        t.lines()
            .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_ok_and(|m| m["step"] != 0))
            .count()
    })
}

/// Where a killed run stopped, read from its directory.
fn landed(out: &Path) -> String {
    if !out.join("graph.toml").exists() {
        return "before the graph was written".into();
    }
    let lines = lines(out);
    let mut done = Vec::new();
    let mut writing = Vec::new();
    for e in std::fs::read_dir(out.join("checkpoints"))
        .into_iter()
        .flatten()
    {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        match name.strip_prefix(".tmp-step_") {
            Some(n) => writing.push(n.trim_start_matches('0').to_string()),
            None => done.push(
                name.trim_start_matches("step_")
                    .trim_start_matches('0')
                    .to_string(),
            ),
        }
    }
    done.sort();
    let mut s = format!("{lines} metrics lines, checkpoints [{}]", done.join(", "));
    if !writing.is_empty() {
        s += &format!(", inside the write of checkpoint {}", writing.join(", "));
    }
    s
}

#[test]
fn runs_killed_at_random_moments_resume_into_the_uninterrupted_metrics() {
    let dir = tempfile::tempdir().unwrap();
    // The uninterrupted run, timed: when it starts stepping (its first metrics line) and ends.
    let full = dir.path().join("full");
    let mut child = spawn(&full);
    let t0 = Instant::now();
    let mut first_line = None;
    while child.try_wait().unwrap().is_none() {
        if first_line.is_none() && lines(&full) > 0 {
            first_line = Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        child.wait().unwrap().success(),
        "the uninterrupted run failed"
    );
    let whole = t0.elapsed();
    let first_line = first_line.unwrap_or(whole);
    let want = metrics(&full);
    assert_eq!(training_steps(want.clone()).len(), 6);

    // RESUME_KILL_SEED=N explores other kill moments; the default is fixed.
    let seed = std::env::var("RESUME_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEED);
    let mut rng = Rng(seed);
    let mut report = Vec::new();
    for trial in 0..TRIALS {
        let out = dir.path().join(format!("trial{trial}"));
        let mut child = spawn(&out);
        let start = Instant::now();
        // Odd trials: inside the write of a random step's checkpoint (its temporary directory
        // exists), a few random milliseconds in; even ones: a random moment of the run (trial 0:
        // of the whole run, start-up included; the others: of its steps).
        let aim = if trial % 2 == 1 {
            let step = 1 + rng.next() % 5;
            let delay = Duration::from_micros(rng.next() % 3_000);
            let tmp = out.join(format!("checkpoints/.tmp-step_{step:06}"));
            while !tmp.exists() && child.try_wait().unwrap().is_none() {
                std::thread::sleep(Duration::from_micros(50));
            }
            std::thread::sleep(delay);
            format!(
                "writing checkpoint {step} + {:.1} ms",
                delay.as_secs_f64() * 1e3
            )
        } else {
            let from = if trial == 0 {
                Duration::ZERO
            } else {
                first_line.mul_f64(0.8)
            };
            let at = from + (whole - from).mul_f64(0.9 * rng.unit());
            while start.elapsed() < at && child.try_wait().unwrap().is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
            format!("{:.2} s of {:.2} s", at.as_secs_f64(), whole.as_secs_f64())
        };
        let finished = child.try_wait().unwrap().is_some();
        child.kill().ok(); // SIGKILL
        child.wait().unwrap();
        let where_ = if finished {
            "after the run ended".to_string()
        } else {
            landed(&out)
        };
        let resumed = if out.join("graph.toml").exists() {
            flowrl(&["run", "--resume", out.to_str().unwrap(), "--steps", STEPS])
        } else {
            let mut a = run_args(&out);
            a.push("--force".into());
            flowrl(&a.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let stderr = String::from_utf8_lossy(&resumed.stderr);
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("warning: "))
            .collect();
        assert_eq!(
            metrics(&out),
            want,
            "trial {trial} (kill at {aim}: {where_}) resumed into other metrics"
        );
        // What it leaves: complete checkpoints, no leftovers of the interrupted write.
        for e in std::fs::read_dir(out.join("checkpoints")).unwrap() {
            let p = e.unwrap().path();
            assert_eq!(
                check_checkpoint(&p, true),
                Integrity::Complete,
                "trial {trial}: {}",
                p.display()
            );
        }
        report.push(format!(
            "trial {trial}: kill at {aim}: {where_}; resume said {said:?}"
        ));
    }
    eprintln!("{}", report.join("\n"));
}

/// SIGTERM (a cluster's preemption) stops the run at the next step boundary with a checkpoint of
/// that step, even where the graph asks for none, and exit code 0; the resumed run ends with the
/// uninterrupted run's metrics.
#[test]
fn a_sigterm_checkpoints_the_step_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let args = |out: &Path| {
        let mut a = run_args(out);
        a.extend(["--set".to_string(), "run.checkpoint_every=0".to_string()]);
        a
    };
    let full = dir.path().join("full");
    let out = flowrl(&args(&full).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = metrics(&full);

    let stopped = dir.path().join("stopped");
    let mut child = Command::new(BIN)
        .current_dir(root())
        .args(args(&stopped))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while lines(&stopped) == 0 && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = lines(&stopped);
    assert!((1..6).contains(&done), "stopped after {done} steps");
    assert!(
        stdout.contains(&format!("stopped by SIGTERM after step {done} of 6")),
        "{stdout}"
    );
    let ckpt = stopped.join(format!("checkpoints/step_{done:06}"));
    assert_eq!(
        check_checkpoint(&ckpt, true),
        Integrity::Complete,
        "{}",
        ckpt.display()
    );

    let resumed = flowrl(&[
        "run",
        "--resume",
        stopped.to_str().unwrap(),
        "--steps",
        STEPS,
    ]);
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert_eq!(metrics(&stopped), want, "the resumed run's metrics");
}
