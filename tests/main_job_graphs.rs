//! The real-scale geo3k graph (`graphs/real/`, for a downloaded Qwen2.5-VL-3B and verl's geo3k
//! parquet) validates with its paths pointed at the repository's fixtures, and the main job's
//! arithmetic checks reject bad numbers before anything loads (exit code 78, numbers in the message).

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");
const GRAPH: &str = "graphs/real/geo3k_qwen2_5_vl_3b.toml";
const FIXTURES: &[&str] = &[
    "--set",
    "models.policy.path=tests/fixtures/models/qwen2_5_vl/one_image",
    "--set",
    "nodes.data.path=tests/fixtures/data/verl_geo3k_sample/train.parquet",
    "--set",
    "nodes.data.val_path=tests/fixtures/data/verl_geo3k_sample/test.parquet",
];

fn validate(extra: &[&str]) -> Output {
    let mut args = vec!["validate", GRAPH];
    args.extend_from_slice(FIXTURES);
    args.extend_from_slice(extra);
    Command::new(BIN)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .args(&args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn the_geo3k_graph_validates_against_the_fixtures() {
    let out = validate(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(": ok ("));
}

#[test]
fn micro_batches_that_do_not_divide_the_mini_batch_are_rejected_with_the_numbers() {
    let out = validate(&["--set", "nodes.update.micro_batch_size=7"]);
    assert_eq!(out.status.code(), Some(78));
    let e = stderr(&out);
    assert!(
        e.contains("128 prompts × n 5 = 640 responses is not divisible by micro_batch_size 7"),
        "{e}"
    );
}

#[test]
fn a_response_that_cannot_fit_the_context_is_rejected_with_the_numbers() {
    let out = validate(&["--set", "nodes.rollout.max_new_tokens=4000"]);
    assert_eq!(out.status.code(), Some(78));
    let e = stderr(&out);
    assert!(
        e.contains("1024 + max_new_tokens 4000 = 5024 exceeds the context"),
        "{e}"
    );
    assert!(e.contains("4096 tokens"), "{e}");
}

#[test]
fn a_kl_loss_without_reference_log_probs_is_rejected() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(GRAPH))
        .unwrap()
        .replace(", ref_log_probs = \"ref.log_probs\"", "");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("g.toml");
    std::fs::write(&file, text).unwrap();
    let mut args = vec!["validate", file.to_str().unwrap()];
    args.extend_from_slice(FIXTURES);
    let out = Command::new(BIN)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(
        stderr(&out).contains("wire `ref_log_probs`"),
        "{}",
        stderr(&out)
    );
}

fn run_default(extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut args = vec![
        "run",
        "graphs/grpo_vlm.toml",
        "--steps",
        "1",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Command::new(BIN)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .args(&args)
        .output()
        .unwrap()
}

#[test]
fn a_dataset_without_the_column_the_graph_needs_is_a_clear_error() {
    let out = run_default(&["--set", "nodes.data.prompt_key=\"question\""]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("datasets/shapes/train.parquet")
            && e.contains("column `question`: missing column"),
        "{e}"
    );
}

#[test]
fn a_missing_model_directory_is_a_configuration_error() {
    let out = run_default(&["--set", "models.policy.path=\"assets/no-such-model\""]);
    assert_eq!(out.status.code(), Some(78));
    let e = stderr(&out);
    assert!(
        e.contains("model directory `assets/no-such-model` does not exist"),
        "{e}"
    );
}

/// verl's `use_kl_loss = False`: leaving out the `kl` table turns the KL loss off, so the
/// reference log-probs need not be wired (on-policy runs without a reference model).
#[test]
fn without_a_kl_table_the_update_needs_no_reference_and_logs_no_kl_loss() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text: String = std::fs::read_to_string(root.join("graphs/grpo_vlm.toml"))
        .unwrap()
        .replace(", ref_log_probs = \"ref.log_probs\"", "")
        .lines()
        .filter(|l| !l.starts_with("kl ="))
        .map(|l| format!("{l}\n"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("no_kl.toml");
    std::fs::write(&file, text).unwrap();
    let out_dir = dir.path().join("run");
    let out = Command::new(BIN)
        .current_dir(root)
        .args(["run", file.to_str().unwrap(), "--steps", "1", "--out"])
        .arg(&out_dir)
        .args([
            "--set",
            "nodes.data.batch_size=4",
            "--set",
            "nodes.rollout.n=2",
        ])
        .args([
            "--set",
            "nodes.update.mini_batch_size=4",
            "--set",
            "nodes.update.micro_batch_size=8",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let metrics = std::fs::read_to_string(out_dir.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("\"actor/pg_loss\""), "{metrics}");
    assert!(!metrics.contains("actor/kl_loss"), "{metrics}");
}
