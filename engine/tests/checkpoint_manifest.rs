//! Crash-safe checkpoints on test-only kinds: a damaged newest checkpoint (truncated, deleted or
//! changed file, lost manifest) is passed over with a message naming the file, the previous
//! complete one resumes into the uninterrupted run's metrics; no complete checkpoint is an error;
//! a checkpoint of another graph is refused; a checkpoint without a manifest (older flowrl) is
//! accepted with a warning.

mod testkit;

use flowrl_engine::Graph;
use flowrl_engine::run::{RunSummary, run};
use flowrl_engine::rundir::{Integrity, Manifest, check_checkpoint};
use std::path::{Path, PathBuf};
use testkit::{copy_dir, metrics, run_options as opts};

const GRAPH: &str = r#"
[run]
steps = 6
seed = 5
device = "cpu"
checkpoint_every = 1
keep_checkpoints = 3
plot = false

[models.policy]
init = 0.5

[nodes.src]
kind = "test.source"
count = 4
[nodes.score]
kind = "test.score"
inputs = { n = "src.n" }
[nodes.train]
kind = "test.train"
model = "policy"
inputs = { n = "src.n" }
"#;

fn graph(text: &str, sets: &[&str]) -> Graph {
    testkit::graph(&testkit::registry(), text, sets)
}

type Rows = Vec<Vec<(String, f64)>>;

/// A run of 4 of the 6 steps (checkpoints 2, 3, 4 kept) and the uninterrupted run's metrics.
struct Fixture {
    _tmp: tempfile::TempDir,
    part: PathBuf,
    want: Rows,
    root: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full");
    run(graph(GRAPH, &[]), &opts(&full, false)).unwrap();
    let part = tmp.path().join("part");
    run(graph(GRAPH, &["run.steps=4"]), &opts(&part, false)).unwrap();
    Fixture {
        want: metrics(&full),
        part,
        root: tmp.path().to_path_buf(),
        _tmp: tmp,
    }
}

impl Fixture {
    /// A copy of the 4-step run, damaged by `damage` (given its checkpoints directory).
    fn damaged(&self, name: &str, damage: impl FnOnce(&Path)) -> PathBuf {
        let dir = self.root.join(name);
        copy_dir(&self.part, &dir);
        damage(&dir.join("checkpoints"));
        dir
    }

    fn resume(&self, dir: &Path) -> anyhow::Result<RunSummary> {
        let text = std::fs::read_to_string(dir.join("graph.toml")).unwrap();
        run(graph(&text, &["run.steps=6"]), &opts(dir, true))
    }
}

/// What a test does to a run's checkpoints directory.
type Damage = Box<dyn FnOnce(&Path)>;

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_previous_complete_one() {
    let f = fixture();
    let w4 = "step_000004/resources/policy/w.txt";
    let len = std::fs::metadata(f.part.join("checkpoints").join(w4))
        .unwrap()
        .len();
    // (name, damage, the warning it starts with, the step the resume continues from)
    let cases: Vec<(&str, Damage, String, u64)> = vec![
        (
            "truncated",
            Box::new(move |c: &Path| truncate(&c.join(w4), 2)),
            format!(
                "checkpoint step_000004 is incomplete (resources/policy/w.txt: 2 bytes, manifest \
                 says {len}): resuming from step_000003"
            ),
            3,
        ),
        (
            "deleted",
            Box::new(|c: &Path| {
                std::fs::remove_file(c.join("step_000004/nodes/src.json")).unwrap()
            }),
            "checkpoint step_000004 is incomplete (nodes/src.json is missing): resuming from \
             step_000003"
                .into(),
            3,
        ),
        (
            "changed",
            // Same size, other bytes: only the checksum sees it.
            Box::new(move |c: &Path| {
                let p = c.join(w4);
                let mut b = std::fs::read(&p).unwrap();
                b[0] = if b[0] == b'9' { b'8' } else { b'9' };
                std::fs::write(&p, b).unwrap();
            }),
            "checkpoint step_000004 is incomplete (resources/policy/w.txt: CRC-32 ".into(),
            3,
        ),
        (
            "no_manifest",
            Box::new(|c: &Path| std::fs::remove_file(c.join("step_000004/manifest.json")).unwrap()),
            "checkpoint step_000004 is incomplete (manifest.json is missing): resuming from \
             step_000003"
                .into(),
            3,
        ),
        (
            "bad_manifest",
            Box::new(|c: &Path| truncate(&c.join("step_000004/manifest.json"), 40)),
            "checkpoint step_000004 is incomplete (manifest.json is not valid: ".into(),
            3,
        ),
        (
            "stray_file",
            Box::new(|c: &Path| std::fs::write(c.join("step_000004/nodes/x.json"), "{}").unwrap()),
            "checkpoint step_000004 is incomplete (nodes/x.json is not in the manifest): \
             resuming from step_000003"
                .into(),
            3,
        ),
        (
            "two_damaged",
            Box::new(move |c: &Path| {
                truncate(&c.join(w4), 0);
                std::fs::remove_file(c.join("step_000003/run_state.json")).unwrap();
            }),
            format!(
                "checkpoint step_000004 is incomplete (resources/policy/w.txt: 0 bytes, manifest \
                 says {len}); checkpoint step_000003 is incomplete (run_state.json is missing): \
                 resuming from step_000002"
            ),
            2,
        ),
    ];
    for (name, damage, message, from) in cases {
        let dir = f.damaged(name, damage);
        let s = f.resume(&dir).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(s.first_step, from, "{name}");
        assert_eq!(s.warnings.len(), 1, "{name}: {:?}", s.warnings);
        assert!(
            s.warnings[0].starts_with(&message),
            "{name}: {}\nwanted: {message}",
            s.warnings[0]
        );
        assert_eq!(metrics(&dir), f.want, "{name}: resumed metrics");
        // What the resumed run leaves: complete checkpoints only, the newest three.
        let left: Vec<String> = std::fs::read_dir(dir.join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(
            left,
            ["step_000004", "step_000005", "step_000006"],
            "{name}"
        );
        for c in &left {
            let p = dir.join("checkpoints").join(c);
            assert_eq!(
                check_checkpoint(&p, true),
                Integrity::Complete,
                "{name}: {c}"
            );
        }
    }
}

#[test]
fn no_complete_checkpoint_is_an_error_naming_each_fault_and_no_checkpoint_starts_over() {
    let f = fixture();
    let dir = f.damaged("all", |c| {
        for s in 2..=4 {
            truncate(&c.join(format!("step_{s:06}/resources/policy/w.txt")), 1);
        }
    });
    let e = format!("{:#}", f.resume(&dir).unwrap_err());
    assert!(
        e.contains(
            "holds no complete checkpoint to resume from: checkpoint step_000004 is \
                    incomplete (resources/policy/w.txt: 1 bytes, manifest says"
        ) && e.contains("checkpoint step_000002 is incomplete")
            && e.contains("help: start the run over with `flowrl run --force`"),
        "{e}"
    );
    // Nothing was touched: the metrics of the 4 steps are still there.
    assert_eq!(metrics(&dir).len(), 4);

    // Killed before its first checkpoint: the resume starts over and says so.
    let dir = f.damaged("none", |c| std::fs::remove_dir_all(c).unwrap());
    let s = f.resume(&dir).unwrap();
    assert_eq!(s.first_step, 0);
    assert!(
        s.warnings[0].ends_with("holds no checkpoint yet: the run starts over at step 1"),
        "{:?}",
        s.warnings
    );
    assert_eq!(metrics(&dir), f.want);
}

#[test]
fn a_checkpoint_of_another_graph_is_refused_naming_the_difference() {
    let f = fixture();
    let cases = [
        (
            GRAPH.replace("[nodes.score]", "[nodes.judge]"),
            "restoring checkpoint ",
            "step_000004: run_state.json belongs to another graph: node `score` (kind `test.score`) is not in the graph; the \
             graph's node `judge` (kind `test.score`) is not in the checkpoint",
        ),
        (
            GRAPH.replace(
                "kind = \"test.score\"\ninputs = { n = \"src.n\" }",
                "kind = \"test.add\"\ninputs = { a = \"src.n\" }",
            ),
            "restoring checkpoint ",
            "step_000004: run_state.json belongs to another graph: node `score` has kind `test.score` in the checkpoint, \
             `test.add` in the graph",
        ),
    ];
    for (i, (changed, a, b)) in cases.into_iter().enumerate() {
        let dir = f.damaged(&format!("graph{i}"), |_| {});
        let e = format!(
            "{:#}",
            run(graph(&changed, &["run.steps=6"]), &opts(&dir, true)).unwrap_err()
        );
        assert!(e.contains(a) && e.contains(b), "{e}");
    }

    // The state of a node the graph lacks, listed in the manifest (so the files are whole).
    let dir = f.damaged("ghost", |c| {
        let ckpt = c.join("step_000004");
        std::fs::write(ckpt.join("nodes/ghost.json"), "{}").unwrap();
        Manifest::write(&ckpt).unwrap();
    });
    let e = format!("{:#}", f.resume(&dir).unwrap_err());
    assert!(
        e.contains("nodes/ghost.json is not the state of a node of the graph (its nodes: src, score, train)"),
        "{e}"
    );
    let dir = f.damaged("ghost_resource", |c| {
        let ckpt = c.join("step_000004");
        std::fs::create_dir_all(ckpt.join("resources/critic")).unwrap();
        std::fs::write(ckpt.join("resources/critic/w.txt"), "1").unwrap();
        Manifest::write(&ckpt).unwrap();
    });
    let e = format!("{:#}", f.resume(&dir).unwrap_err());
    assert!(
        e.contains(
            "resources/critic holds the state of resource `critic`, which the graph does not have"
        ),
        "{e}"
    );
}

#[test]
fn a_checkpoint_without_a_manifest_from_an_older_flowrl_resumes_with_a_warning() {
    let f = fixture();
    let dir = f.damaged("old", |c| {
        for s in 2..=4 {
            let ckpt = c.join(format!("step_{s:06}"));
            std::fs::remove_file(ckpt.join("manifest.json")).unwrap();
            std::fs::write(
                ckpt.join("run_state.json"),
                format!("{{\"completed_steps\": {s}, \"seed\": 5}}"),
            )
            .unwrap();
        }
    });
    let s = f.resume(&dir).unwrap();
    assert_eq!(s.first_step, 4);
    assert_eq!(
        s.warnings,
        [
            "checkpoint step_000004 has no manifest.json (written by a flowrl before checkpoint \
          manifests): its files cannot be verified"
        ]
    );
    assert_eq!(metrics(&dir), f.want);
}
