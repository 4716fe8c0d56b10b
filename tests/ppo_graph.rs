//! The shipped PPO graph with a critic (`graphs/ppo_vlm.toml`) through the binary: it validates,
//! runs 3 steps with verl's critic metrics finite at every step, skips the actor during the
//! critic warm-up, checkpoints the value model (head and optimizer state), and a resumed run
//! reproduces the uninterrupted one.

mod common;

use std::path::Path;

use common::{assert_identical_metrics, flowrl, metrics, training_steps};

const PPO_GRAPH: &str = "graphs/ppo_vlm.toml";

/// `steps` steps of the PPO graph into `out` with a checkpoint every 2 steps (or resumes it).
fn run(out: &Path, steps: &str, resume: bool) {
    let out = out.to_str().unwrap();
    if resume {
        flowrl(&["run", "--resume", out, "--steps", steps]);
    } else {
        flowrl(&[
            "run",
            PPO_GRAPH,
            "--out",
            out,
            "--steps",
            steps,
            "--set",
            "run.checkpoint_every=2",
        ]);
    }
}

#[test]
fn the_ppo_graph_validates() {
    let out = flowrl(&["validate", PPO_GRAPH]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(": ok ("), "{stdout}");
    assert!(
        String::from_utf8_lossy(&out.stderr).is_empty(),
        "no warnings expected: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_ppo_graph_trains_the_critic_then_the_actor_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (full, resumed) = (dir.path().join("full"), dir.path().join("resumed"));
    run(&full, "3", false);
    let m = training_steps(metrics(&full));
    assert_eq!(m.len(), 3);
    let vf_loss: Vec<f64> = m
        .iter()
        .map(|s| s["critic/vf_loss"].as_f64().unwrap())
        .collect();
    eprintln!("critic/vf_loss over 3 steps: {vf_loss:?}");
    for (step, s) in m.iter().enumerate() {
        for k in [
            "critic/vf_loss",
            "critic/vf_clipfrac",
            "critic/vpred_mean",
            "critic/vf_explained_var",
            "critic/grad_norm",
            "critic/lr",
            "critic/values/mean",
            "critic/values/max",
            "critic/values/min",
            "critic/returns/mean",
            "critic/advantages/mean",
        ] {
            let v = s[k]
                .as_f64()
                .unwrap_or_else(|| panic!("step {}: no {k}: {s}", step + 1));
            assert!(v.is_finite(), "step {}: {k} = {v}", step + 1);
        }
        let clipfrac = s["critic/vf_clipfrac"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&clipfrac));
        // critic_warmup = 3: verl updates the actor from step 3 on.
        assert_eq!(
            s.get("actor/pg_loss").is_some(),
            step + 1 >= 3,
            "step {}: {s}",
            step + 1
        );
    }
    assert!(m[2]["actor/pg_loss"].as_f64().unwrap().is_finite());

    // The value model's checkpoint: the backbone in the Hugging Face layout with the value head
    // beside it, and AdamW moments for backbone and head.
    let ckpt = full.join("checkpoints/step_000002/resources/critic");
    assert!(ckpt.join("model/model.safetensors").is_file());
    assert!(ckpt.join("model/value_head.safetensors").is_file());
    let bytes = std::fs::read(ckpt.join("optimizer.safetensors")).unwrap();
    let opt = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let names = opt.names();
    assert!(
        names
            .iter()
            .any(|n| n.contains("head") && n.contains("score"))
    );
    assert!(names.iter().any(|n| n.contains("layers")));

    // Resume after step 2: steps 3 (the first actor update) and 4 as if uninterrupted.
    run(&full, "4", true);
    run(&resumed, "2", false);
    run(&resumed, "4", true);
    // A run evaluates at its last step: compare the training metrics.
    let training = |dir: &Path| -> Vec<serde_json::Value> {
        let mut m = metrics(dir);
        for s in &mut m {
            s.as_object_mut()
                .unwrap()
                .retain(|k, _| !k.starts_with("val"));
        }
        m
    };
    let (a, b) = (training(&full), training(&resumed));
    assert_eq!(
        a.len(),
        5,
        "step 0 (the evaluation before training) and 4 steps"
    );
    assert_identical_metrics(&a, &b, "a resumed PPO run reproduces the uninterrupted one");
}
