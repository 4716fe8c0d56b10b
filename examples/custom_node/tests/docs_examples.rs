//! The plugin docs cannot rot: the code blocks of docs/plugins.md and docs/exec-protocol.md marked
//! `<!-- verbatim: PATH -->` equal their files (which cargo builds and these tests run), the port
//! table lists the port types of nodes/src/values/mod.rs, and the plugin binary runs the default GRPO
//! graph with the docs' length-penalty reward, in Rust and in Python, with the docs' own commands
//! and TOML: both train identically.

use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_flowrl-custom");
const DOCS: [&str; 2] = ["docs/plugins.md", "docs/exec-protocol.md"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The fenced code block right after the first line of `doc` that contains `marker`.
fn block_after(doc: &str, marker: &str) -> String {
    let start = doc
        .find(marker)
        .unwrap_or_else(|| panic!("no `{marker}` in the docs"));
    let rest = &doc[start..];
    let open = rest.find("```").expect("a code block after the marker");
    let body = &rest[open..];
    let body = &body[body.find('\n').unwrap() + 1..];
    body[..body.find("\n```").expect("a closed code block")].to_string()
}

#[test]
fn verbatim_blocks_of_the_docs_equal_their_files() {
    let mut checked = Vec::new();
    for doc_path in DOCS {
        let doc = read(doc_path);
        for (at, _) in doc.match_indices("<!-- verbatim: ") {
            let line = &doc[at..at + doc[at..].find('\n').unwrap()];
            let file = line["<!-- verbatim: ".len()..]
                .trim_end_matches(" -->")
                .trim();
            let block = block_after(&doc[at..], "<!-- verbatim: ");
            assert_eq!(
                block,
                read(file).trim_end_matches('\n'),
                "the block under `{line}` in {doc_path} differs from {file}: copy the file into \
                 the docs"
            );
            checked.push(file.to_string());
        }
    }
    for f in [
        "examples/custom_node/src/main.rs",
        "examples/custom_node/src/length_penalty.rs",
        "examples/python_reward/length_penalty.py",
    ] {
        assert!(
            checked.iter().any(|c| c == f),
            "{f} is not in the docs: {checked:?}"
        );
    }
}

#[test]
fn the_port_table_lists_every_port_type_of_values_rs() {
    let names = |lines: Vec<&str>| -> Vec<String> {
        lines
            .into_iter()
            .filter_map(|l| l.strip_prefix("| `"))
            .map(|l| l[..l.find('`').unwrap()].to_string())
            .collect()
    };
    let values = read("nodes/src/values/mod.rs");
    let source = names(
        values
            .lines()
            .filter_map(|l| l.strip_prefix("//! "))
            .collect(),
    );
    let doc = read("docs/plugins.md");
    let table = &doc[doc
        .find("<!-- port types: nodes/src/values/mod.rs -->")
        .unwrap()..];
    let table = &table[..table.find("\n\n").unwrap()];
    let documented = names(table.lines().collect());
    assert!(source.contains(&"Rollouts".to_string()), "{source:?}");
    assert_eq!(
        documented, source,
        "docs/plugins.md's port table vs nodes/src/values/mod.rs"
    );
}

#[test]
fn the_plugin_binary_has_every_built_in_kind_and_its_own() {
    let out = Command::new(BIN).arg("nodes").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for kind in [
        "rollout",
        "reward.geo3k",
        "exec",
        "update.ppo",
        "reward.length_penalty",
    ] {
        assert!(
            text.contains(kind),
            "{kind} missing from `flowrl-custom nodes`:\n{text}"
        );
    }
    let out = Command::new(BIN)
        .args(["nodes", "reward.length_penalty"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("max_tokens : integer, default 12, > 0"),
        "{text}"
    );
}

/// The training steps' metrics of the run in `dir` (step 0, the evaluation before training, left
/// out).
fn metrics(dir: &Path) -> Vec<Json> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Json>(l).unwrap())
        .filter(|m| m["step"] != 0)
        .collect()
}

/// Runs the shell command of the docs' "or, without editing the file:" block of `doc` at the
/// repository root, with `flowrl`/`flowrl-custom` being this plugin's binary, into `out`.
fn run_docs_command(doc: &str, out: &Path) {
    let block = block_after(&read(doc), "or, without editing the file:");
    let line = block.replace("\\\n", " ");
    let args = line
        .strip_prefix("flowrl-custom ")
        .or_else(|| line.strip_prefix("flowrl "))
        .unwrap_or_else(|| panic!("{doc}: not a flowrl command: {line}"));
    let script = format!("\"$BIN\" {args} --progress quiet --out \"$OUT\"");
    let run = Command::new("sh")
        .args(["-c", &script])
        .env("BIN", BIN)
        .env("OUT", out)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{doc}: {script}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn the_default_graph_trains_with_the_docs_reward_in_rust_and_in_python_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let (rust, python) = (tmp.path().join("rust"), tmp.path().join("python"));
    run_docs_command("docs/plugins.md", &rust);
    run_docs_command("docs/exec-protocol.md", &python);
    let (r, p) = (metrics(&rust), metrics(&python));
    assert_eq!(r.len(), 2);
    assert_eq!(p.len(), 2);
    for (a, b) in r.iter().zip(&p) {
        for key in [
            "critic/score/mean",
            "critic/score/min",
            "critic/score/acc/mean",
            "critic/advantages/mean",
            "actor/pg_loss",
            "actor/grad_norm",
        ] {
            let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-6 * (1.0 + x.abs()),
                "{key}: rust {x}, python {y}"
            );
        }
        assert!(a["timing_s/reward"].as_f64().is_some(), "{a}");
    }
    assert!(
        r.iter()
            .any(|m| m["critic/score/min"].as_f64().unwrap() < 0.0),
        "some responses are long enough to be penalized: {r:?}"
    );
    let log = std::fs::read_to_string(python.join("exec/reward.stderr.log")).unwrap();
    assert_eq!(log, "step 0: 128 responses\nstep 1: 128 responses\n");
}

#[test]
fn the_docs_toml_drops_into_the_default_graph() {
    let default = read("graphs/grpo_vlm.toml");
    let geo3k =
        "[nodes.reward]\nkind = \"reward.geo3k\"\ninputs = { rollouts = \"rollout.rollouts\" }\n";
    assert!(
        default.contains(geo3k),
        "graphs/grpo_vlm.toml's reward changed"
    );
    let tmp = tempfile::tempdir().unwrap();
    for (doc, marker) in [
        ("docs/plugins.md", "kind = \"reward.length_penalty\""),
        (
            "docs/exec-protocol.md",
            "examples/python_reward/length_penalty.py\"]\ninputs",
        ),
    ] {
        let text = read(doc);
        let at = text
            .find(marker)
            .unwrap_or_else(|| panic!("{doc}: no `{marker}`"));
        let table = block_after(&text[text[..at].rfind("```toml").unwrap()..], "```toml");
        let graph = tmp.path().join("g.toml");
        std::fs::write(&graph, default.replace(geo3k, &format!("{table}\n"))).unwrap();
        let out = Command::new(BIN)
            .arg("validate")
            .arg(&graph)
            .current_dir(root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{doc}'s table:\n{table}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
