//! What every model family's graph test (`tests/<family>_graph.rs`) runs and checks: the
//! family's GRPO graph for two steps on the small shapes task through the `flowrl` binary, with
//! the checks that hold for any family. Included by those tests alone (`#[path]`), so that the
//! other test binaries do not compile it.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{flowrl, metrics, small_task, training_steps};

/// A metric of a metrics line; panics naming it when it is missing.
pub fn num(m: &Value, key: &str) -> f64 {
    m[key]
        .as_f64()
        .unwrap_or_else(|| panic!("metric `{key}` missing in {m}"))
}

/// Runs `graph` for two GRPO steps under `dir` (4 prompts × 4 responses of the shapes task, one
/// mini-batch per step, evaluation every step, a checkpoint at step 2) and checks what holds for
/// every family:
/// - each step's losses, entropy, gradient norm, score and validation score are finite, no
///   update step is skipped, and the score is in [0, 1];
/// - with one mini-batch the ratio π/π_old is 1 up to rounding (the rollout's positions and the
///   update's agree): `actor/ppo_kl` < 1e-4 and nothing is clipped;
/// - before the first update the policy is the reference: the KL loss of step 1 is < 1e-4.
///
/// Gives the training steps' metrics and the run directory.
pub fn two_grpo_steps(graph: &str, dir: &Path) -> (Vec<Value>, PathBuf) {
    let (train, test) = small_task(dir);
    let run = dir.join("run");
    let run_s = run.display().to_string();
    let sets = [
        "run.steps=2".to_string(),
        "run.checkpoint_every=2".to_string(),
        format!("nodes.data.path={train}"),
        format!("nodes.data.val_path={test}"),
        "nodes.data.batch_size=4".to_string(),
        "nodes.rollout.n=4".to_string(),
        // One mini-batch per step: the update's first forward is the old policy itself.
        "nodes.update.mini_batch_size=4".to_string(),
        "nodes.update.micro_batch_size=8".to_string(),
        "nodes.eval.every=1".to_string(),
    ];
    let mut args = vec!["run", graph, "--out", &run_s, "--progress", "plain"];
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    flowrl(&args);
    let m = training_steps(metrics(&run));
    assert_eq!(m.len(), 2, "{m:?}");
    for (k, step) in m.iter().enumerate() {
        assert_eq!(step["step"].as_u64(), Some(k as u64 + 1));
        for key in [
            "actor/pg_loss",
            "actor/kl_loss",
            "actor/entropy",
            "actor/grad_norm",
            "critic/score/mean",
            "val/score",
        ] {
            assert!(num(step, key).is_finite(), "{key} = {}", step[key]);
        }
        assert_eq!(num(step, "actor/skipped_steps"), 0.0);
        let score = num(step, "critic/score/mean");
        assert!((0.0..=1.0).contains(&score), "{score}");
        let ppo_kl = num(step, "actor/ppo_kl").abs();
        assert!(ppo_kl < 1e-4, "ppo_kl {ppo_kl}");
        assert_eq!(num(step, "actor/pg_clipfrac"), 0.0);
    }
    let kl0 = num(&m[0], "actor/kl_loss").abs();
    assert!(kl0 < 1e-4, "kl at step 1 = {kl0}");
    (m, run)
}

/// The policy the run saved at step 2 (a Hugging Face directory) and its config.json.
pub fn saved_policy(run: &Path) -> (PathBuf, Value) {
    let ckpt = run.join("checkpoints/step_000002/resources/policy/model");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("config.json")).unwrap()).unwrap();
    (ckpt, config)
}
