//! The main job's nodes on another backend or precision than the CPU's f32: the same inputs give
//! the same log-probs, updates and weights within the tolerance of the difference.
//!
//! - Vulkan (feature `vulkan`; CI runs it on Mesa's software driver): burn's cubecl kernels, the
//!   ones CUDA compiles too, against Flex.
//! - Mixed precision (`precision = "bf16"`) on the CPU: bf16 forward passes against f32 ones, with
//!   f32 master weights and AdamW moments in the checkpoint.

mod common;

use common::{
    Built, build, build_with, close, f32_tensors, log_probs, max_abs_diff, rollout, update,
};
use flowrl_engine::DeviceSpec;
use flowrl_models::weights::Precision;

/// rollout, logprob, update.ppo (its gradients, through the metrics and the weights they move)
/// and update.sft on a Vulkan device against the CPU, at the replica test's tolerances.
#[cfg(feature = "vulkan")]
#[test]
fn vulkan_nodes_match_the_cpu() {
    let mut cpu = build(1);
    let mut vulkan = common::build_on(vec![DeviceSpec::Vulkan(0)]);
    common::assert_same_steps(&mut cpu, &mut vulkan, "vulkan vs cpu", 1e-4, 1e-3, 1e-4);
}

/// The share of weights whose update has the same sign under `b` as under `a` (both moved from
/// `start`), among those that moved by more than `eps` under `a`.
fn same_direction(start: &[f32], a: &[f32], b: &[f32], eps: f32) -> f64 {
    let (mut same, mut moved) = (0usize, 0usize);
    for ((s, x), y) in start.iter().zip(a).zip(b) {
        let (dx, dy) = (x - s, y - s);
        if dx.abs() > eps {
            moved += 1;
            same += usize::from(dx.signum() == dy.signum());
        }
    }
    same as f64 / moved.max(1) as f64
}

fn metric(metrics: &[(String, f64)], key: &str) -> f64 {
    metrics
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key} in {metrics:?}"))
        .1
}

#[test]
fn bf16_mixed_precision_tracks_f32_and_keeps_f32_masters() {
    let cpu = || vec![DeviceSpec::Cpu(0)];
    let mut f32_run: Built = build(1);
    let mut bf16_run = build_with(cpu(), Some(Precision::BF16));
    let start = f32_run.weights();
    // The bf16 policy starts from the same f32 weights (its masters).
    assert_eq!(bf16_run.weights(), start);

    // The same rollouts for both (sampled in f32), scored by each.
    let (prompts, rollouts) = rollout(&mut f32_run, 0);
    let lp32 = log_probs(&mut f32_run, 0, &rollouts);
    let lp16 = log_probs(&mut bf16_run, 0, &rollouts);
    let mask = &rollouts.response_mask.data;
    let diffs: Vec<f32> = lp32
        .log_probs
        .data
        .iter()
        .zip(&lp16.log_probs.data)
        .zip(mask)
        .filter(|(_, m)| **m > 0.0)
        .map(|((a, b), _)| (a - b).abs())
        .collect();
    let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
    let worst = diffs.iter().fold(0f32, |m, d| m.max(*d));
    // bf16 keeps 8 bits of mantissa (relative error 2^-9 per rounding): token log-probs move by
    // thousandths (measured: mean 0.0016, max 0.029), and are not equal to the f32 ones.
    assert!(mean > 1e-5 && mean < 0.01, "mean |Δ log-prob| {mean}");
    assert!(worst < 0.1, "max |Δ log-prob| {worst}");

    let (ppo32, sft32) = update(&mut f32_run, 0, &prompts, &rollouts, &lp32);
    let (ppo16, sft16) = update(&mut bf16_run, 0, &prompts, &rollouts, &lp32);
    eprintln!("mean |Δ log-prob| {mean}, max {worst}");
    eprintln!("ppo f32 {ppo32:?}\nppo bf16 {ppo16:?}\nsft f32 {sft32:?}\nsft bf16 {sft16:?}");
    // pg_loss is a mean of ±advantage · ratio terms that nearly cancel, so it is compared
    // absolutely: the ratios move by the log-prob differences above.
    let (a, b) = (
        metric(&ppo32, "actor/pg_loss"),
        metric(&ppo16, "actor/pg_loss"),
    );
    assert!(
        (a - b).abs() < 0.05,
        "update.ppo actor/pg_loss: f32 {a} vs bf16 {b}"
    );
    let (a, b) = (
        metric(&ppo32, "actor/grad_norm"),
        metric(&ppo16, "actor/grad_norm"),
    );
    assert!(
        close(a, b, 0.1),
        "update.ppo actor/grad_norm: f32 {a} vs bf16 {b}"
    );
    let (a, b) = (metric(&sft32, "train/loss"), metric(&sft16, "train/loss"));
    assert!(
        close(a, b, 0.02),
        "update.sft train/loss: f32 {a} vs bf16 {b}"
    );

    // The masters stay f32 in memory and in the checkpoint (f32_tensors panics on any other
    // dtype), and the bf16 update moved the weights the way the f32 one did: AdamW's first steps
    // are ≈ lr · sign(gradient).
    let dtypes = bf16_run.cpu_weight_dtypes();
    assert!(!dtypes.is_empty());
    assert!(
        dtypes.iter().all(|d| *d == burn::tensor::DType::F32),
        "{dtypes:?}"
    );
    let (w32, w16) = (f32_run.weights(), bf16_run.weights());
    let moved = max_abs_diff(&w16, &start);
    assert!(
        moved > 1e-3,
        "the bf16 updates moved the weights by only {moved}"
    );
    let agree = same_direction(&start, &w32, &w16, 1e-4);
    assert!(
        agree > 0.9,
        "only {agree:.3} of the weights moved the same way"
    );
    let dir = tempfile::tempdir().unwrap();
    bf16_run.save(dir.path());
    let moments = f32_tensors(&dir.path().join("optimizer.safetensors"));
    assert!(moments.len() >= 2 * w16.len(), "{} moments", moments.len());
}

/// The long-context graph: the policy's log-probs and one PPO step on one row at a time.
#[cfg(feature = "vulkan")]
const LONG_CONTEXT_GRAPH: &str = r#"
[run]
steps = 1
seed = 11

[models.policy]
path = "assets/tiny-qwen2-vl"

[nodes.data]
kind = "dataset.parquet"
model = "policy"
path = "datasets/shapes/test.parquet"
batch_size = 1
max_prompt_length = 128

[nodes.rollout]
kind = "rollout"
model = "policy"
inputs = { prompts = "data.prompts" }
max_new_tokens = 8

[nodes.old]
kind = "logprob"
model = "policy"
inputs = { rollouts = "rollout.rollouts" }
micro_batch_size = 1
entropy = true

[nodes.reward]
kind = "reward.exact_match"
inputs = { rollouts = "rollout.rollouts" }

[nodes.adv]
kind = "advantage.grpo"
inputs = { scores = "reward.scores" }

[nodes.update]
kind = "update.ppo"
model = "policy"
inputs = { rollouts = "rollout.rollouts", advantages = "adv.advantages", old_log_probs = "old.log_probs" }
mini_batch_size = 1
micro_batch_size = 1
lr = 1e-3
"#;

/// Tokens in the long-context row: half prompt, half response.
#[cfg(feature = "vulkan")]
const LONG_CONTEXT: usize = 4096;

/// A model of the tiny policy's architecture and tokenizer with 16 attention heads (width 8,
/// over 4 kv heads), one layer and room for `LONG_CONTEXT` tokens, random weights, in `dir`.
/// A materialised `[16, 4096, 4096]` f32 score tensor of it is 1 GiB: eight times what a
/// lavapipe buffer holds.
#[cfg(feature = "vulkan")]
fn long_context_policy(dir: &std::path::Path) {
    use flowrl_models::Model;
    let asset = common::root().join("assets/tiny-qwen2-vl");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(asset.join("config.json")).unwrap()).unwrap();
    let t = &mut config["text_config"];
    t["hidden_size"] = 128.into();
    t["intermediate_size"] = 128.into();
    t["num_attention_heads"] = 16.into();
    t["num_key_value_heads"] = 4.into();
    t["num_hidden_layers"] = 1.into();
    t["max_position_embeddings"] = (2 * LONG_CONTEXT).into();
    t["rope_parameters"]["mrope_section"] = serde_json::json!([2, 1, 1]);
    config["vision_config"]["hidden_size"] = 128.into();
    let model =
        Model::<burn::backend::Flex>::random(&config.to_string(), &Default::default(), 5).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    model.save(dir, None).unwrap();
    for entry in std::fs::read_dir(&asset).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap();
        if !name.ends_with(".safetensors") && name != "config.json" && path.is_file() {
            std::fs::copy(&path, dir.join(name)).unwrap();
        }
    }
}

/// One row of `LONG_CONTEXT` text tokens (no image): the data node's first prompt with its ids
/// replaced, and a response of the other half.
#[cfg(feature = "vulkan")]
fn long_context_rollout(b: &mut Built) -> std::sync::Arc<flowrl_nodes::RolloutBatch> {
    use flowrl_nodes::values::TokenMatrix;
    let (out, _) = b.run("data", 0, flowrl_engine::Inputs::new("data"));
    let prompts: std::sync::Arc<flowrl_nodes::PromptBatch> = common::get(&out, "prompts");
    let mut prompts = (*prompts).clone();
    prompts.prompts.truncate(1);
    let half = LONG_CONTEXT / 2;
    let token = |i: usize| (5 + (i * 37) % 400) as u32; // text ids below the special ones
    prompts.prompts[0].input_ids = (0..half).map(token).collect();
    prompts.prompts[0].images.clear();
    let response: Vec<u32> = (half..LONG_CONTEXT).map(token).collect();
    let rollouts = flowrl_nodes::RolloutBatch::for_prompts(
        std::sync::Arc::new(prompts),
        vec![0],
        vec![response],
        TokenMatrix::new(vec![1.0; half], 1, half).unwrap(),
        TokenMatrix::zeros(1, half),
        vec![String::new()],
        vec![true],
    );
    rollouts.check().unwrap();
    std::sync::Arc::new(rollouts)
}

/// The log-prob pass and one PPO step over one 4,096-token row of a 16-head model on Vulkan,
/// against the CPU. On lavapipe a materialised score tensor (1 GiB) could not exist, so this runs
/// only because the flash kernels build none, forward or backward. Log-probs and entropies within
/// 2e-4, every update metric within 1e-3 relative, the weights within 1e-4 after the step.
#[cfg(feature = "vulkan")]
#[test]
fn vulkan_long_context_logprob_and_update_match_the_cpu() {
    use flowrl_nodes::values::{AdvantageBatch, TokenMatrix};
    let dir = tempfile::tempdir().unwrap();
    long_context_policy(dir.path());
    let mut runs = Vec::new();
    for device in [DeviceSpec::Cpu(0), DeviceSpec::Vulkan(0)] {
        let mut b = common::build_graph(LONG_CONTEXT_GRAPH, dir.path(), vec![device], None);
        let rollouts = long_context_rollout(&mut b);
        let old = log_probs(&mut b, 0, &rollouts);
        let half = LONG_CONTEXT / 2;
        let adv: Vec<f32> = (0..half)
            .map(|t| ((t * 7) % 11) as f32 / 5.0 - 1.0)
            .collect();
        let adv = TokenMatrix::new(adv, 1, half).unwrap();
        let advantages = std::sync::Arc::new(AdvantageBatch {
            rollouts: rollouts.clone(),
            returns: adv.clone(),
            advantages: adv,
        });
        let mut inputs = common::input("update", "rollouts", "Rollouts", rollouts.clone());
        inputs.insert(
            "advantages",
            flowrl_engine::Value::new(
                flowrl_engine::PortType::new("Advantages"),
                flowrl_engine::Payload::opaque_arc(advantages),
            ),
        );
        inputs.insert(
            "old_log_probs",
            flowrl_engine::Value::new(
                flowrl_engine::PortType::new("TokenLogProbs"),
                flowrl_engine::Payload::opaque_arc(old.clone()),
            ),
        );
        let (_, metrics) = b.run("update", 0, inputs);
        runs.push((old, metrics, b.weights()));
    }
    let ((cpu_lp, cpu_metrics, cpu_weights), (gpu_lp, gpu_metrics, gpu_weights)) =
        (&runs[0], &runs[1]);
    let worst = max_abs_diff(&cpu_lp.log_probs.data, &gpu_lp.log_probs.data);
    assert!(worst < 2e-4, "log-probs differ by {worst}");
    let entropy = |x: &flowrl_nodes::values::TokenLogProbs| x.entropy.clone().unwrap().data;
    let worst = max_abs_diff(&entropy(cpu_lp), &entropy(gpu_lp));
    assert!(worst < 2e-4, "entropies differ by {worst}");
    assert_eq!(cpu_metrics.len(), gpu_metrics.len());
    for ((k, a), (_, b)) in cpu_metrics.iter().zip(gpu_metrics) {
        assert!(close(*a, *b, 1e-3), "{k}: {a} (cpu) vs {b} (vulkan)");
    }
    assert!(cpu_metrics.iter().any(|(k, _)| k == "actor/grad_norm"));
    let worst = max_abs_diff(cpu_weights, gpu_weights);
    assert!(worst < 1e-4, "weights differ by {worst} after the step");
}
