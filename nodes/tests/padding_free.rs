//! Padding-free micro-batches (`padding_free = true`, verl `use_remove_padding`) against padded
//! ones, for every model family in `assets/` (one checkpoint per `model_type`: Qwen2-VL's
//! multimodal RoPE, Qwen3-VL's interleaved one with DeepStack, Gemma 4's plain RoPE with sliding
//! windows), on the family's rollouts (3 prompts with an image each × 4 responses), their
//! responses replaced by 1 to (prompt + 10) tokens so that the sequences differ in length and short ones
//! share a packed row (checked):
//!
//! - `logprob`: the same log-probs, entropies and Σπ² (within 1e-5 relative: the packed rows run
//!   other matmul shapes);
//! - `value` (Qwen2-VL with a value head): the same values, within 1e-5 relative;
//! - `update.ppo` in the token- and sequence-normalised modes, and `update.critic` (Qwen2-VL with a
//!   value head): the same step (weights after one AdamW step within 1e-5 of their largest change,
//!   losses and gradient norm within 1e-5 relative). As in `token_budget.rs`, the step is AdamW's
//!   first with ε = 1, lr 1: Δw = g / (|g| + 1), a smooth function of the gradient.
//!
//! Wrong positions, attention that crossed sequences or hidden states gathered from the wrong
//! places would each move the log-probs far beyond these tolerances.

mod common;

use std::sync::Arc;

use common::graph::{
    advantages, assert_log_probs_within, assert_same_metrics, assert_same_update, build,
    critic_inputs, critic_pair, families, graph_of, log_probs_of, ppo_inputs, ppo_pair,
    rollouts_of, values_of,
};
use flowrl_nodes::RolloutBatch;
use flowrl_nodes::train::sequences::{Layout, SequenceBatch};
use flowrl_nodes::values::TokenMatrix;

/// Serialises this file's tests (burn 0.21's autodiff, tracel-ai/burn#5573: see
/// `chunked_backward.rs`).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The response length of test row r with a prompt of `p` tokens: every third row as long as
/// its prompt and 10 tokens more, the others 1 to 4 tokens or 15 + r, so that two short
/// sequences fit in the longest one's row.
fn response_length(r: usize, p: usize) -> usize {
    match r % 3 {
        0 => p + 10,
        1 => r / 3 + 1,
        _ => 15 + r,
    }
}

/// `rollouts` with response r replaced by [`response_length`] tokens: its own, then its prompt's text
/// tokens over and over (any token is a response whose log-probs can be scored).
fn mixed_lengths(rollouts: &RolloutBatch) -> Arc<RolloutBatch> {
    let mut out = rollouts.clone();
    let t = (0..out.len())
        .map(|r| response_length(r, out.prompt_ids[r].len()))
        .max()
        .unwrap();
    out.response_mask = TokenMatrix::zeros(out.len(), t);
    out.sampling_log_probs = TokenMatrix::zeros(out.len(), t);
    let image = out.prompts.image_token_id;
    for r in 0..out.len() {
        let text: Vec<u32> = out.prompt_ids[r]
            .iter()
            .copied()
            .filter(|&id| Some(id) != image)
            .collect();
        let ids: Vec<u32> = out.response_ids[r]
            .iter()
            .copied()
            .chain(text.iter().copied().cycle())
            .take(response_length(r, out.prompt_ids[r].len()))
            .collect();
        out.response_mask.row_mut(r)[..ids.len()].fill(1.0);
        out.response_ids[r] = ids;
        out.truncated[r] = false;
    }
    out.check().unwrap();
    Arc::new(out)
}

/// The family's rollouts with mixed lengths, checked to pack several sequences to a row.
fn packable_rollouts(model: &str) -> Arc<RolloutBatch> {
    let rollouts = mixed_lengths(&rollouts_of(model));
    let rows: Vec<usize> = (0..rollouts.len()).collect();
    let packed = SequenceBatch::with_layout(&rollouts, &rows, Layout::PaddingFree).unwrap();
    let padded = SequenceBatch::new(&rollouts, &rows).unwrap();
    assert!(
        packed.tokens.batch < rows.len(),
        "{model}: {} sequences in {} packed rows",
        rows.len(),
        packed.tokens.batch
    );
    let real: usize = padded
        .tokens
        .attention_mask
        .iter()
        .map(|&m| m as usize)
        .sum();
    eprintln!(
        "{model}: {} real tokens; padded {} × {}, packed {} × {}",
        real, padded.tokens.batch, padded.tokens.len, packed.tokens.batch, packed.tokens.len
    );
    assert!(packed.tokens.batch * packed.tokens.len < padded.tokens.batch * padded.tokens.len);
    rollouts
}

#[test]
fn logprob_gives_the_padded_values_padding_free_for_every_family() {
    let _s = serial();
    for (model_type, model) in families() {
        let rollouts = packable_rollouts(&model);
        let nodes = ["padded", "packed"]
            .iter()
            .map(|name| {
                format!(
                    r#"
[nodes.{name}]
kind = "logprob"
model = "a"
inputs = {{ rollouts = "rollout.rollouts" }}
micro_batch_size = 6
entropy = true
sum_pi_squared = true
padding_free = {}
"#,
                    *name == "packed"
                )
            })
            .collect::<String>();
        let mut b = build(&graph_of(&model, &nodes, false), false);
        let (padded, _) = log_probs_of(&mut b, "padded", &rollouts);
        let (packed, _) = log_probs_of(&mut b, "packed", &rollouts);
        assert_log_probs_within(&padded, &packed, 1e-5, &model_type);
    }
}

#[test]
fn update_ppo_takes_the_padded_step_padding_free_for_every_family() {
    let _s = serial();
    for (model_type, model) in families() {
        let rollouts = packable_rollouts(&model);
        let adv = advantages(&rollouts);
        for mode in ["token-mean", "seq-mean-token-mean"] {
            let nodes = ppo_pair(
                mode,
                ("padded", "micro_batch_size = 6"),
                ("packed", "micro_batch_size = 6\npadding_free = true"),
            );
            let mut b = build(&graph_of(&model, &nodes, false), false);
            let before = b.weights("a");
            assert_eq!(before, b.weights("b"));
            let (old, _) = log_probs_of(&mut b, "old", &rollouts);
            let padded = b.run("padded", ppo_inputs("padded", &rollouts, &adv, &old));
            let packed = b.run("packed", ppo_inputs("packed", &rollouts, &adv, &old));
            let what = format!("{model_type} {mode}");
            assert_same_metrics(&padded.metrics, &packed.metrics, &what);
            assert_same_update(&before, &b.weights("a"), &b.weights("b"), &what);
        }
    }
}

#[test]
fn value_and_update_critic_give_the_padded_values_and_step_padding_free() {
    let _s = serial();
    let model = common::graph::TINY_POLICY;
    let rollouts = packable_rollouts(model);
    let adv = advantages(&rollouts);
    let values_packed = r#"
[nodes.values_packed]
kind = "value"
model = "a"
inputs = { rollouts = "rollout.rollouts" }
padding_free = true
"#;
    let nodes = critic_pair(
        values_packed,
        ("padded", "micro_batch_size = 6"),
        ("packed", "micro_batch_size = 6\npadding_free = true"),
    );
    let mut b = build(&graph_of(model, &nodes, true), true);
    let before = b.weights("a");
    let values = values_of(&mut b, "values", &rollouts);
    let packed = values_of(&mut b, "values_packed", &rollouts);
    let scale = values.values.data.iter().fold(1f32, |m, x| m.max(x.abs()));
    let d = common::max_abs_diff(&values.values.data, &packed.values.data);
    assert!(
        d <= 1e-5 * scale,
        "values differ by {d} (largest |value| {scale})"
    );
    let padded = b.run("padded", critic_inputs("padded", &rollouts, &values, &adv));
    let packed = b.run("packed", critic_inputs("packed", &rollouts, &values, &adv));
    assert_same_metrics(&padded.metrics, &packed.metrics, "critic");
    assert_same_update(&before, &b.weights("a"), &b.weights("b"), "critic");
}
