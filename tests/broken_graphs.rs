//! Snapshot tests of the broken-graph corpus (`tests/broken_graphs/`), run through the real
//! `flowrl` binary: each `NAME.toml` (with the extra arguments in `NAME.args`, one per line) must
//! be rejected with exit code 78 and exactly the diagnostics in `NAME.expected`.
//! `FLOWRL_BLESS=1 cargo test --release --test broken_graphs` rewrites the expected files.
//! (`plugin/` holds cases that need the example plugin's kinds; its own tests run them.)

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn cases() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("tests/broken_graphs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    v
}

fn args_of(case: &Path) -> Vec<String> {
    std::fs::read_to_string(case.with_extension("args"))
        .map(|t| t.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

fn rel(case: &Path) -> String {
    case.strip_prefix(root()).unwrap().display().to_string()
}

#[test]
fn corpus_covers_every_required_mistake() {
    let names: Vec<String> = cases()
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().to_string())
        .collect();
    for want in [
        "syntax",
        "unknown_kind",
        "misspelled_key",
        "misspelled_port",
        "wrong_type",
        "missing_input",
        "bad_override",
        "type_mismatch",
        "unknown_resource",
        "bad_device_list",
        "node_off_run_devices",
        "device_conflict",
        "device_override",
    ] {
        assert!(names.iter().any(|n| n == want), "missing case {want}");
    }
    assert!(
        root()
            .join("tests/broken_graphs/plugin/cycle.toml")
            .exists()
    );
}

#[test]
fn every_broken_graph_is_rejected_with_its_expected_diagnostics() {
    let bless = std::env::var_os("FLOWRL_BLESS").is_some();
    let mut failures = Vec::new();
    for case in cases() {
        let out = Command::new(BIN)
            .current_dir(root())
            .arg("validate")
            .arg(rel(&case))
            .args(args_of(&case))
            .output()
            .unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(78), "{}:\n{stderr}", rel(&case));
        assert!(!stderr.contains("panicked"), "{stderr}");
        let expected_file = case.with_extension("expected");
        if bless {
            std::fs::write(&expected_file, &stderr).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_file)
            .unwrap_or_else(|_| panic!("{} is missing", expected_file.display()));
        if expected != stderr {
            failures.push(format!(
                "{}: expected\n{expected}\ngot\n{stderr}",
                rel(&case)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn run_rejects_broken_graphs_before_creating_a_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    for case in cases() {
        let out_dir = tmp.path().join(case.file_stem().unwrap());
        let out = Command::new(BIN)
            .current_dir(root())
            .arg("run")
            .arg(rel(&case))
            .args(args_of(&case))
            .arg("--out")
            .arg(&out_dir)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(78), "{}", rel(&case));
        assert!(!out_dir.exists(), "{}", rel(&case));
    }
}
