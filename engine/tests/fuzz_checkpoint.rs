//! Property tests of the checkpoint directory's parsers: run_state.json, manifest.json, node
//! state JSON (`nodes/<node>.json`) and a resource's files, as `--resume` reads them.
//!
//! The properties, for every input:
//! - [`RunState::parse`] and [`Manifest::parse`] return `Ok` or an error with a message, never
//!   panic, on mutated valid files and on arbitrary text;
//! - any change to a file of a complete checkpoint (truncated, a byte flipped, bytes inserted,
//!   replaced by random bytes, deleted) makes [`check_checkpoint`] report it as incomplete,
//!   naming the file;
//! - with the manifest written again over the damaged files (so that verification passes and
//!   the parsers see them), [`Session::load_checkpoint`] returns `Ok` or an error with a message.
//!
//! Memory stays bounded: the parsers read whole files at most (no size field is trusted), and
//! run_state.json / manifest.json over 64 MiB are refused before parsing (a test below).
//!
//! Cases (fixed seed, no persistence file): 512 + 512 texts, 256 damaged checkpoints (each
//! copied, damaged and its manifest written and synced again); 1-6 s on one busy core.

mod testkit;

use flowrl_engine::rundir::{Integrity, Manifest, check_checkpoint, read_small};
use flowrl_engine::{
    BuildContext, Graph, Inputs, Node, NodeKind, Outputs, ParamSpec, Params, PortSpec, RunState,
    Session, StepContext,
};
use proptest::prelude::*;
use proptest::test_runner::Config;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use testkit::copy_dir;

fn config(cases: u32) -> Config {
    testkit::proptest_config(cases, 0x5eed_0c4e)
}

/// A node whose state is a typed struct, read as a node kind should: a wrong shape is an error.
struct Counter;
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CounterState {
    calls: u64,
    history: Vec<f64>,
}
impl NodeKind for Counter {
    fn name(&self) -> &str {
        "fuzz.counter"
    }
    fn doc(&self) -> &str {
        "Counts its calls."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("n", testkit::NUMBERS)]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(CounterNode(CounterState {
            calls: 0,
            history: Vec::new(),
        })))
    }
}
struct CounterNode(CounterState);
impl Node for CounterNode {
    fn run(&mut self, _: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        self.0.calls += 1;
        self.0.history.push(self.0.calls as f64 / 3.0);
        ctx.metric("counter/calls", self.0.calls as f64);
        Ok(Outputs::new().with("n", vec![self.0.calls as f64]))
    }
    fn save_state(&self) -> anyhow::Result<Option<serde_json::Value>> {
        Ok(Some(serde_json::to_value(&self.0)?))
    }
    fn load_state(&mut self, s: serde_json::Value) -> anyhow::Result<()> {
        self.0 = serde_json::from_value(s)?;
        Ok(())
    }
}

const GRAPH: &str = r#"
[run]
steps = 2
seed = 3
device = "cpu"

[models.policy]
init = 0.5

[nodes.count]
kind = "fuzz.counter"
[nodes.train]
kind = "test.train"
model = "policy"
inputs = { n = "count.n" }
"#;

fn graph() -> Graph {
    testkit::graph(&testkit::registry().with_kind(Counter), GRAPH, &[])
}

/// A complete checkpoint after 2 steps, written once per test binary.
fn good_checkpoint() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = Session::build(graph(), None, None).unwrap();
        s.run_step(0, &mut |_| {}).unwrap();
        s.run_step(1, &mut |_| {}).unwrap();
        let dir = tmp.path().join("step_000002");
        s.save_checkpoint(&dir, 2).unwrap();
        (tmp, dir)
    })
    .1
}

/// The files of the good checkpoint, relative (the manifest last).
const FILES: &[&str] = &[
    "run_state.json",
    "nodes/count.json",
    "resources/policy/w.txt",
    "manifest.json",
];

#[derive(Debug, Clone)]
enum Damage {
    Truncate(usize),
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Replace(Vec<u8>),
    Delete,
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        any::<usize>().prop_map(Damage::Truncate),
        (any::<usize>(), 1..=255u8).prop_map(|(i, x)| Damage::Flip(i, x)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Damage::Insert(i, b)),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Damage::Replace),
        Just(Damage::Delete),
    ]
}

/// Applies `d` to `bytes`; `None` deletes the file.
fn apply(bytes: &[u8], d: &Damage) -> Option<Vec<u8>> {
    let mut b = bytes.to_vec();
    match d {
        Damage::Truncate(n) => b.truncate(n % b.len().max(1)),
        Damage::Flip(i, x) => {
            let i = i % b.len().max(1);
            if let Some(c) = b.get_mut(i) {
                *c ^= x;
            }
        }
        Damage::Insert(i, extra) => {
            let i = i % (b.len() + 1);
            b.splice(i..i, extra.iter().copied());
        }
        Damage::Replace(r) => b = r.clone(),
        Damage::Delete => return None,
    }
    Some(b)
}

/// Text edits of a valid JSON file: JSON-looking values spliced in, lines cut.
fn json_edit(base: &'static str) -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just("-1".to_string()),
        Just("18446744073709551616".to_string()),
        Just("1e999".to_string()),
        Just("null".to_string()),
        Just("\"\"".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("\"../../etc/passwd\"".to_string()),
        Just("\"ffffffff\"".to_string()),
        Just("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[".to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        "\\PC{0,12}".prop_map(|s| format!("{s:?}")),
    ];
    (any::<usize>(), any::<usize>(), value).prop_map(move |(at, cut, v)| {
        let bytes = base.as_bytes();
        let at = at % (bytes.len() + 1);
        let cut = (at + cut % 8).min(bytes.len());
        let mut out = String::from_utf8_lossy(&bytes[..at]).to_string();
        out += &v;
        out += &String::from_utf8_lossy(&bytes[cut..]);
        out
    })
}

fn run_state_text() -> &'static str {
    static T: OnceLock<String> = OnceLock::new();
    T.get_or_init(|| std::fs::read_to_string(good_checkpoint().join("run_state.json")).unwrap())
}

fn manifest_text() -> &'static str {
    static T: OnceLock<String> = OnceLock::new();
    T.get_or_init(|| std::fs::read_to_string(good_checkpoint().join("manifest.json")).unwrap())
}

fn err_has_message(e: anyhow::Error) -> Result<(), TestCaseError> {
    prop_assert!(!format!("{e:#}").trim().is_empty(), "an empty message");
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn run_state_text_parses_or_reports(
        text in prop_oneof![json_edit_run_state(), "\\PC{0,120}"]
    ) {
        if let Err(e) = RunState::parse(&text) {
            err_has_message(e)?;
        }
    }

    #[test]
    fn manifest_text_parses_or_reports(
        text in prop_oneof![json_edit_manifest(), "\\PC{0,120}"]
    ) {
        match Manifest::parse(&text) {
            Ok(m) => {
                // What parses is safe to check against a directory.
                let tmp = tempfile::tempdir().unwrap();
                if let Err(e) = m.verify(tmp.path(), true) {
                    err_has_message(e)?;
                }
            }
            Err(e) => err_has_message(e)?,
        }
    }
}

fn json_edit_run_state() -> impl Strategy<Value = String> {
    json_edit(run_state_text())
}

fn json_edit_manifest() -> impl Strategy<Value = String> {
    json_edit(manifest_text())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn a_damaged_checkpoint_is_reported_and_loads_or_reports(
        file in prop::sample::select(FILES),
        d in damage(),
        nodes_text in prop_oneof![
            Just(None),
            prop_oneof![
                "\\PC{0,40}".prop_map(Some),
                Just(Some("{\"calls\": 1, \"history\": [1e999]}".to_string())),
                Just(Some("{\"calls\": -1, \"history\": []}".to_string())),
                Just(Some("{\"calls\": 1, \"history\": [], \"x\": 0}".to_string())),
            ],
        ],
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("step_000002");
        copy_dir(good_checkpoint(), &dir);
        let path = dir.join(file);
        let before = std::fs::read(&path).unwrap();
        let after = apply(&before, &d);
        match &after {
            Some(b) => std::fs::write(&path, b).unwrap(),
            None => std::fs::remove_file(&path).unwrap(),
        }
        if let Some(t) = &nodes_text {
            std::fs::write(dir.join("nodes/count.json"), t).unwrap();
        }
        let changed = after.as_deref() != Some(&before[..])
            || nodes_text.as_ref().is_some_and(|t| {
                std::fs::read(good_checkpoint().join("nodes/count.json")).unwrap() != t.as_bytes()
            });
        match check_checkpoint(&dir, true) {
            // The manifest is not checksummed itself: a change that leaves its meaning (e.g.
            // one whitespace byte for another) is harmless.
            Integrity::Complete => prop_assert!(
                !changed
                    || (file == "manifest.json"
                        && Manifest::parse(&String::from_utf8_lossy(after.as_deref().unwrap_or(&[])))
                            .ok()
                            == Manifest::parse(manifest_text()).ok()),
                "a change went unnoticed"
            ),
            // This flowrl's run_state.json says a manifest belongs beside it.
            Integrity::Unverified => prop_assert!(false, "taken for an older checkpoint: {d:?}"),
            Integrity::Incomplete(why) => {
                prop_assert!(changed);
                prop_assert!(!why.trim().is_empty());
            }
        }
        // The parsers behind the manifest: the manifest rewritten over the damaged files.
        if Manifest::write(&dir).is_ok() {
            let mut s = Session::build(graph(), None, None).unwrap();
            if let Err(e) = s.load_checkpoint(&dir) {
                err_has_message(e)?;
            }
        }
    }
}

#[test]
fn oversized_metadata_files_are_refused_before_parsing() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("run_state.json");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len((64 << 20) + 1).unwrap(); // sparse: no disk used
    let e = format!("{:#}", read_small(&p).unwrap_err());
    assert_eq!(e, "run_state.json is larger than 64 MiB");
}

#[test]
fn a_good_checkpoint_round_trips() {
    let dir = good_checkpoint();
    assert_eq!(check_checkpoint(dir, true), Integrity::Complete);
    let mut s = Session::build(graph(), None, None).unwrap();
    let state = s.load_checkpoint(dir).unwrap();
    assert_eq!(state.completed_steps, 2);
    assert_eq!(
        std::fs::read_to_string(dir.join("nodes/count.json")).unwrap(),
        "{\n  \"calls\": 2,\n  \"history\": [\n    0.3333333333333333,\n    0.6666666666666666\n  ]\n}"
    );
}
