//! The real-scale geo3k graph (`graphs/real/`, for a downloaded Qwen2.5-VL-3B and verl's geo3k
//! parquet) validates with its paths pointed at the repository's fixtures, and the main job's
//! arithmetic checks reject bad numbers before anything loads (exit code 78, numbers in the message).

use std::path::Path;
use std::process::{Command, Output};
use std::sync::LazyLock;

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");
const GRAPH: &str = "graphs/real/geo3k_qwen2_5_vl_3b.toml";
/// The overrides that put the real graph on the fixtures: a tiny Qwen2.5-VL checkpoint and
/// verl's geo3k sample.
static FIXTURES: LazyLock<Vec<String>> = LazyLock::new(|| {
    vec![
        "--set".into(),
        format!("models.policy.path={}", qwen2_5_vl_fixture()),
        "--set".into(),
        "nodes.data.path=tests/fixtures/data/verl_geo3k_sample/train.parquet".into(),
        "--set".into(),
        "nodes.data.val_path=tests/fixtures/data/verl_geo3k_sample/test.parquet".into(),
    ]
});

/// A Qwen2.5-VL checkpoint among the model fixtures, found by content: the first case (in name
/// order) whose config.json is a `qwen2_5_vl` model and that holds weights and an image
/// processor; relative to the repository.
fn qwen2_5_vl_fixture() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let models = root.join("tests/fixtures/models");
    let mut cases: Vec<_> = std::fs::read_dir(&models)
        .unwrap()
        .flat_map(|family| std::fs::read_dir(family.unwrap().path()).unwrap())
        .map(|case| case.unwrap().path())
        .filter(|dir| {
            let config = std::fs::read_to_string(dir.join("config.json")).unwrap_or_default();
            let config: serde_json::Value = serde_json::from_str(&config).unwrap_or_default();
            config["model_type"] == "qwen2_5_vl"
                && ["model.safetensors", "preprocessor_config.json"]
                    .iter()
                    .all(|f| dir.join(f).is_file())
        })
        .collect();
    cases.sort();
    let case = cases
        .first()
        .expect("a Qwen2.5-VL model among tests/fixtures/models");
    case.strip_prefix(root).unwrap().display().to_string()
}

/// `flowrl validate` of the real graph on the fixtures. `--force`: the recipe's batch (512
/// prompts × n 5 × 3072 tokens) does not fit this machine's memory on a CPU, which is what the
/// memory check says (tests/plan.rs); these tests check the rest of the graph.
fn validate(extra: &[&str]) -> Output {
    let mut args = vec!["validate", GRAPH, "--force"];
    args.extend_from_slice(extra);
    on_fixtures(args)
}

/// The binary with `args` and the fixtures' overrides, in the repository root.
fn on_fixtures(mut args: Vec<&str>) -> Output {
    args.extend(FIXTURES.iter().map(String::as_str));
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
    // On an H200 (datasheet figures) the real recipe's rollout, log-prob and update fit.
    let out = on_fixtures(vec![
        "plan", GRAPH, "--json", "--gpu", "h200", "--device", "cuda:0",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["devices"]["cuda:0"]["fits"], true, "{plan}");
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
    args.extend(FIXTURES.iter().map(String::as_str));
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

/// A `max_new_tokens` that cuts every answer used to train on score 0 and grad_norm 1e-11 without
/// a word: the rollout says every response was cut, and the advantage node that its advantages
/// have been zero for three steps, with the likely cause.
#[test]
fn a_run_that_cannot_learn_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .args(["run", "graphs/grpo_vlm.toml", "--steps", "3", "--out"])
        .arg(dir.path().join("run"))
        .args([
            "--set",
            "nodes.rollout.max_new_tokens=4",
            "--set",
            "nodes.eval.every=100",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Step warnings are printed with the progress (standard output without a terminal).
    let e = String::from_utf8_lossy(&out.stdout);
    assert!(
        e.contains(
            "node `rollout`: every response of this step (128) was cut at max_new_tokens = 4"
        ),
        "{e}"
    );
    assert!(
        e.contains("node `advantage`: the advantages have been all zero for 3 steps in a row"),
        "{e}"
    );
}

/// Swapping `old_log_probs` and `ref_log_probs` used to validate "ok" and train wrong: each wire
/// is now checked against the model it must come from, pointing at the override.
#[test]
fn swapped_log_prob_wires_are_configuration_errors() {
    let out = Command::new(BIN)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .args([
            "validate",
            "graphs/grpo_vlm.toml",
            "--set",
            "nodes.update.inputs.old_log_probs=\"ref.log_probs\"",
            "--set",
            "nodes.update.inputs.ref_log_probs=\"old.log_probs\"",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let e = stderr(&out);
    assert!(
        e.contains("`old_log_probs` comes from node `ref` on model `reference`, but this update trains `policy`")
            && e.contains("`ref_log_probs` comes from node `old` on model `policy`, which `update` trains")
            && e.contains("--set #1"),
        "{e}"
    );
}

/// A hub id resolves through a Hugging Face cache laid out as `huggingface_hub` lays it out
/// (`refs/main` holds the commit, `snapshots/<commit>/` links into `blobs/`), with no network;
/// an id the cache lacks is a configuration error with the command that downloads it.
#[test]
fn hub_ids_resolve_through_the_local_cache() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cache = tempfile::tempdir().unwrap();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = cache.path().join("models--flowrl--tiny-qwen2-vl");
    let snapshot = repo.join("snapshots").join(commit);
    for dir in [&snapshot, &repo.join("blobs"), &repo.join("refs")] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    for (i, entry) in std::fs::read_dir(root.join("assets/tiny-qwen2-vl"))
        .unwrap()
        .enumerate()
    {
        let entry = entry.unwrap();
        let blob = repo.join("blobs").join(format!("blob{i}"));
        std::fs::copy(entry.path(), &blob).unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(blob.file_name().unwrap()),
            snapshot.join(entry.file_name()),
        )
        .unwrap();
    }
    let out_dir = tempfile::tempdir().unwrap();
    let run = |path: &str| {
        Command::new(BIN)
            .current_dir(root)
            .env("HF_HUB_CACHE", cache.path())
            .args(["run", "graphs/grpo_vlm.toml", "--steps", "1", "--out"])
            .arg(out_dir.path().join(path.replace('/', "_")))
            .args(["--set", &format!("models.policy.path=\"{path}\"")])
            .output()
            .unwrap()
    };
    let out = run("flowrl/tiny-qwen2-vl");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run("flowrl/tiny-qwen2-vl@v2");
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains("has no snapshot for revision `v2`")
            && e.contains("`huggingface-cli download flowrl/tiny-qwen2-vl --revision v2`"),
        "{e}"
    );
    let out = run("Qwen/Qwen2.5-VL-7B-Instruct");
    let e = stderr(&out);
    assert!(
        e.contains("models--Qwen--Qwen2.5-VL-7B-Instruct does not exist")
            && e.contains("`huggingface-cli download Qwen/Qwen2.5-VL-7B-Instruct`"),
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

/// `policy_loss` picks a loss of verl's registry by its name; an option the loss ignores (as
/// verl ignores it) is a warning at the key (W0501), and the graph still validates.
#[test]
fn a_policy_loss_warns_at_each_option_it_ignores() {
    let vanilla = validate(&[]);
    assert!(vanilla.status.success(), "{}", stderr(&vanilla));
    // No diagnostic warning (the memory check's `--force` warning aside).
    assert!(
        !stderr(&vanilla).contains("warning["),
        "{}",
        stderr(&vanilla)
    );

    // gspo reads the clip ratios but always aggregates seq-mean-token-mean.
    let out = validate(&["--set", "nodes.update.policy_loss=\"gspo\""]);
    assert!(out.status.success(), "{}", stderr(&out));
    let e = stderr(&out);
    assert_eq!(e.matches("warning[W0501]").count(), 1, "{e}");
    assert!(e.contains(&format!("{GRAPH}:77:1")), "{e}");
    assert!(
        e.contains("always aggregates its policy loss with seq-mean-token-mean")
            && e.contains("it still applies to the KL and entropy terms"),
        "{e}"
    );

    // sapo reads neither the clip ratio nor the mode; an override is located at the override.
    let out = validate(&[
        "--set",
        "nodes.update.policy_loss=\"sapo\"",
        "--set",
        "nodes.update.kl_cov_ratio=0.5",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let e = stderr(&out);
    assert_eq!(e.matches("warning[W0501]").count(), 3, "{e}");
    assert!(
        e.contains(&format!("{GRAPH}:76:1"))
            && e.contains(
                "`clip_ratio` has no effect with policy_loss = \"sapo\" (it reads tau_pos, tau_neg)"
            ),
        "{e}"
    );
    assert!(
        e.contains("`kl_cov_ratio` has no effect") && e.contains("--set"),
        "{e}"
    );

    // geo_mean ignores the mode and the mini-batch normalisation.
    let out = validate(&["--set", "nodes.update.policy_loss=\"geo_mean\""]);
    assert!(out.status.success(), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains(&format!("{GRAPH}:74:1"))
            && e.contains("the mini-batch's policy loss is the sum of its micro-batch means"),
        "{e}"
    );
    assert!(e.contains(&format!("{GRAPH}:77:1")), "{e}");
}

#[test]
fn a_policy_loss_is_checked_by_name_and_dro_needs_its_beta() {
    let out = validate(&["--set", "nodes.update.policy_loss=\"gpso\""]);
    assert_eq!(out.status.code(), Some(78));
    assert!(
        stderr(&out).contains("did you mean `gspo`?"),
        "{}",
        stderr(&out)
    );

    let out = validate(&["--set", "nodes.update.policy_loss=\"dro\""]);
    assert_eq!(out.status.code(), Some(78));
    assert!(
        stderr(&out).contains("policy_loss.dro_beta must be a positive value when using DRO"),
        "{}",
        stderr(&out)
    );
    let out = validate(&[
        "--set",
        "nodes.update.policy_loss=\"dro\"",
        "--set",
        "nodes.update.dro_beta=0.1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// One step of the main job with a loss that reports no clip metrics (verl's `gpg` returns an
/// empty metrics dict) and one that draws its token subset at random (`clip_cov`).
#[test]
fn a_registry_loss_trains_and_logs_only_its_own_metrics() {
    let small = [
        "--set",
        "nodes.data.batch_size=4",
        "--set",
        "nodes.rollout.n=2",
        "--set",
        "nodes.update.mini_batch_size=4",
        "--set",
        "nodes.update.micro_batch_size=8",
    ];
    for (loss, logged, absent) in [
        (
            "gpg",
            &["actor/pg_loss"][..],
            &["actor/pg_clipfrac", "actor/ppo_kl"][..],
        ),
        (
            "clip_cov",
            &["actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl"][..],
            &["actor/pg_clipfrac_lower"][..],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out_dir = dir.path().join("run");
        let set = format!("nodes.update.policy_loss=\"{loss}\"");
        let out = Command::new(BIN)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
            .args(["run", "graphs/grpo_vlm.toml", "--steps", "1", "--out"])
            .arg(&out_dir)
            .args(small)
            .args(["--set", &set])
            .output()
            .unwrap();
        assert!(out.status.success(), "{loss}: {}", stderr(&out));
        let metrics = std::fs::read_to_string(out_dir.join("metrics.jsonl")).unwrap();
        for key in logged {
            assert!(metrics.contains(&format!("\"{key}\"")), "{loss}: {metrics}");
        }
        for key in absent {
            assert!(
                !metrics.contains(&format!("\"{key}\"")),
                "{loss}: {metrics}"
            );
        }
    }
}
