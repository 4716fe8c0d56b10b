//! `graphs/grpo_qwen3_vl.toml` through the real `flowrl` binary: it is the default GRPO graph
//! (`graphs/grpo_vlm.toml`) with another model directory — same nodes, kinds, ports, edges and
//! parameters — and it runs GRPO steps on the tiny Qwen3-VL policy (`assets/tiny-qwen3-vl`) with
//! consistent log-probs along the way. Adding the family touched no node: the graph is the
//! evidence.
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
const GRAPH: &str = "graphs/grpo_qwen3_vl.toml";
const POLICY: &str = "assets/tiny-qwen3-vl";

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
fn qwen3_vl_graph_is_the_default_graph_with_another_model() {
    let qwen3 = compiled(GRAPH);
    let default = compiled("graphs/grpo_vlm.toml");
    // Same nodes in the same order, with the same kinds, ports, edges and parameters.
    assert_eq!(qwen3["order"], default["order"]);
    assert_eq!(qwen3["nodes"], default["nodes"]);
    assert!(
        qwen3["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["kind"] == "update.ppo")
    );
    // Only the policy's directory differs.
    let (mut a, mut b) = (qwen3["resources"].clone(), default["resources"].clone());
    assert!(a.to_string().contains(POLICY), "{a}");
    let strip = |v: &mut Value, dir: &str| {
        *v = serde_json::from_str(&v.to_string().replace(dir, "MODEL")).unwrap();
    };
    strip(&mut a, POLICY);
    strip(&mut b, "assets/tiny-qwen2-vl");
    assert_eq!(a, b);
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join(POLICY).join("config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["model_type"], "qwen3_vl");
}

#[test]
fn grpo_qwen3_vl_runs_two_steps_with_consistent_log_probs() {
    let dir = tempfile::tempdir().unwrap();
    let (m, run) = two_grpo_steps(GRAPH, dir.path());
    for step in &m {
        // Chat-templated prompts of ~40–50 tokens with 4 image tokens (a 56×56 picture → 64×64
        // → 4×4 patches of 16 px → 2×2 merged), responses of ≤ 16 tokens.
        let plen = num(step, "prompt_length/mean");
        assert!((30.0..=70.0).contains(&plen), "prompt length {plen}");
        let rlen = num(step, "response_length/mean");
        assert!((1.0..=16.0).contains(&rlen), "response length {rlen}");
    }
    // The warm start knows the answer format (a random policy never produces it).
    let format = num(&m[0], "critic/score/format/mean");
    assert!(format > 0.0, "format score {format}");
    // The checkpoint holds a Qwen3-VL Hugging Face directory that loads again.
    let (ckpt, config) = saved_policy(&run);
    assert_eq!(config["model_type"], "qwen3_vl");
    let model = flowrl_models::Model::<burn::backend::Flex>::load(&ckpt, &Default::default())
        .expect("the saved policy loads");
    assert_eq!(model.model_type(), "qwen3_vl");
    assert!(model.multimodal_positions().is_some());
    assert!(model.vision().is_some());
    assert_eq!(model.causal_lm().eos_token_ids(), vec![410]);
}
