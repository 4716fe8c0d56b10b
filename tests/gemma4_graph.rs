//! `graphs/grpo_gemma4.toml` through the real `flowrl` binary: it is the Qwen GRPO graph with
//! another model directory (same nodes, kinds, ports, edges and parameter names), and it runs GRPO steps on
//! the tiny Gemma 4 policy (`assets/tiny-gemma4`) with consistent log-probs along the way.
//!
//! The run is shrunk with `--set` overrides to stay at a few seconds of compute: a 16-row
//! training file and an 8-row validation file written by the shapes generator, 4 prompts × 4
//! responses per step.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

mod common;
#[path = "common/family.rs"]
mod family;
use family::{num, saved_policy, two_grpo_steps};

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn flowrl(args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(root())
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// `flowrl graph FILE --format json` (the graph as compiled, defaults filled in).
fn compiled(graph: &str) -> Value {
    let out = flowrl(&["graph", graph, "--format", "json"]);
    assert!(out.status.success(), "{graph}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn gemma4_graph_is_the_qwen_graph_with_another_model() {
    let gemma = compiled("graphs/grpo_gemma4.toml");
    let qwen = compiled("graphs/grpo_vlm.toml");
    // Same nodes in the same order, same kinds, ports, edges, resources and parameter names;
    // parameter values (learning rate, ...) are per-model hyperparameters and may differ.
    assert_eq!(gemma["order"], qwen["order"]);
    let (g_nodes, q_nodes) = (
        gemma["nodes"].as_array().unwrap(),
        qwen["nodes"].as_array().unwrap(),
    );
    assert_eq!(g_nodes.len(), q_nodes.len());
    for (g, q) in g_nodes.iter().zip(q_nodes) {
        let keys = |v: &Value| -> Vec<String> {
            v["params"].as_object().unwrap().keys().cloned().collect()
        };
        assert_eq!(keys(g), keys(q), "parameters of node {}", g["name"]);
        let (mut g, mut q) = (g.clone(), q.clone());
        g.as_object_mut().unwrap().remove("params");
        q.as_object_mut().unwrap().remove("params");
        assert_eq!(g, q);
    }
    assert!(
        g_nodes.iter().any(|n| n["kind"] == "update.ppo")
            && g_nodes.iter().any(|n| n["kind"] == "rollout")
    );
    // Only the policy's directory differs.
    let (mut g, mut q) = (gemma["resources"].clone(), qwen["resources"].clone());
    assert_ne!(g, q);
    let path = |v: &Value| v.to_string();
    assert!(path(&g).contains("assets/tiny-gemma4"), "{g}");
    assert!(path(&q).contains("assets/tiny-qwen2-vl"), "{q}");
    let strip = |v: &mut Value, dir: &str| {
        *v = serde_json::from_str(&v.to_string().replace(dir, "MODEL")).unwrap();
    };
    strip(&mut g, "assets/tiny-gemma4");
    strip(&mut q, "assets/tiny-qwen2-vl");
    assert_eq!(g, q);
    // And the policy really is a Gemma 4 checkpoint.
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("assets/tiny-gemma4/config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["model_type"], "gemma4");
}

#[test]
fn grpo_gemma4_runs_two_steps_with_consistent_log_probs() {
    let dir = tempfile::tempdir().unwrap();
    let (m, run) = two_grpo_steps("graphs/grpo_gemma4.toml", dir.path());
    for step in &m {
        // 4 prompts of 98–101 tokens (64 image soft tokens each), responses of ≤ 16 tokens.
        let plen = num(step, "prompt_length/mean");
        assert!((95.0..=105.0).contains(&plen), "prompt length {plen}");
        let rlen = num(step, "response_length/mean");
        assert!((1.0..=16.0).contains(&rlen), "response length {rlen}");
    }
    // The warm start answers in the trained format: most of the 32 sampled responses of the two
    // steps score the format part (one step's 16 draws range over 0.44–0.88 across seeds).
    let formats: Vec<f64> = m
        .iter()
        .map(|s| num(s, "critic/score/format/mean"))
        .collect();
    let format = formats.iter().sum::<f64>() / formats.len() as f64;
    assert!(format >= 0.5, "format scores {formats:?}");
    // The checkpoint holds a Gemma 4 Hugging Face directory that loads again.
    let (ckpt, config) = saved_policy(&run);
    assert_eq!(config["model_type"], "gemma4");
    let model = flowrl_models::Model::<burn::backend::Flex>::load(&ckpt, &Default::default())
        .expect("the saved policy loads");
    assert!(model.multimodal_positions().is_none());
    assert!(model.vision().is_some());
    assert_eq!(model.causal_lm().eos_token_ids(), vec![5, 1]);
}
