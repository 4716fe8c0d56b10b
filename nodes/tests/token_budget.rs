//! Token-budget micro-batches (`max_tokens_per_micro_batch`, verl `use_dynamic_bsz`) against
//! fixed ones (`micro_batch_size`), on the tiny policy and its rollouts (3 prompts with an image
//! each × 4 responses of up to 10 tokens):
//!
//! - `logprob`: the same log-probs, entropies and Σπ² (within 1e-6 relative) when the rows are
//!   regrouped;
//! - `update.ppo` in every `loss_agg_mode` and `update.critic`: the same update (weights after
//!   one optimizer step within 1e-5 of their largest change, the losses and gradient norm within
//!   1e-5 relative), since the losses are normalised over the mini-batch, not the micro-batch.
//!   The step is AdamW's first with ε = 1, lr 1: Δw = g / (|g| + 1) (+ weight decay), a smooth
//!   function of the gradient. With torch's ε = 1e-8 the first step is ≈ lr · sign(g), which the
//!   float noise of a different summation order flips for gradients within noise of 0;
//! - a row longer than the budget runs alone, with a warning, and changes nothing;
//! - setting both options is a validation error.
//!
//! The budget is chosen from the rollouts' lengths so that the token-budget split groups the rows
//! differently from the fixed one (checked), with more than one row in some micro-batch.

mod common;

use common::graph::{
    advantages, assert_same_log_probs, assert_same_metrics, assert_same_update, build,
    critic_inputs, critic_pair, graph, log_probs_of, ppo_inputs, ppo_pair, rollouts, values_of,
};
use flowrl_engine::{Registry, compile};
use flowrl_nodes::RolloutBatch;
use flowrl_nodes::train::micro_batches::{MicroBatching, row_tokens};

/// Serialises this file's tests (burn 0.21's autodiff, tracel-ai/burn#5573: see
/// `chunked_backward.rs`).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A budget that regroups the rows: about 2.5 rows' worth of tokens, so micro-batches hold two
/// or three rows, by length rather than in order.
fn budget_for(rollouts: &RolloutBatch, fixed_rows: usize) -> usize {
    let rows: Vec<usize> = (0..rollouts.len()).collect();
    let lengths: Vec<usize> = rows.iter().map(|&r| row_tokens(rollouts, r)).collect();
    let longest = *lengths.iter().max().unwrap();
    let mean = lengths.iter().sum::<usize>() as f64 / lengths.len() as f64;
    let budget = ((2.5 * mean) as usize).max(longest);
    let tokens = MicroBatching::Tokens(budget).split(rollouts, &rows);
    let fixed = MicroBatching::Rows(fixed_rows).split(rollouts, &rows);
    assert_ne!(
        tokens, fixed,
        "the budget {budget} does not regroup the rows"
    );
    assert!(tokens.iter().any(|m| m.len() > 1), "{tokens:?}");
    for m in &tokens {
        let sum: usize = m.iter().map(|&r| lengths[r]).sum();
        assert!(m.len() == 1 || sum <= budget, "{m:?}: {sum} > {budget}");
    }
    eprintln!("lengths {lengths:?}, budget {budget}: {tokens:?}");
    budget
}

#[test]
fn logprob_gives_the_same_values_with_a_token_budget() {
    let _s = serial();
    let rollouts = rollouts();
    let budget = budget_for(&rollouts, 5);
    let nodes = format!(
        r#"
[nodes.rows]
kind = "logprob"
model = "a"
inputs = {{ rollouts = "rollout.rollouts" }}
micro_batch_size = 5
entropy = true
sum_pi_squared = true

[nodes.tokens]
kind = "logprob"
model = "a"
inputs = {{ rollouts = "rollout.rollouts" }}
max_tokens_per_micro_batch = {budget}
entropy = true
sum_pi_squared = true

[nodes.tight]
kind = "logprob"
model = "a"
inputs = {{ rollouts = "rollout.rollouts" }}
max_tokens_per_micro_batch = 8
entropy = true
sum_pi_squared = true
"#
    );
    let mut b = build(&graph(&nodes, false), false);
    let (fixed, w) = log_probs_of(&mut b, "rows", &rollouts);
    assert!(w.is_empty(), "{w:?}");
    let (tokens, w) = log_probs_of(&mut b, "tokens", &rollouts);
    assert!(w.is_empty(), "{w:?}");
    assert_same_log_probs(&fixed, &tokens, "budget");
    // Every row is longer than 8 tokens: each alone, with a warning.
    let (tight, w) = log_probs_of(&mut b, "tight", &rollouts);
    assert_same_log_probs(&fixed, &tight, "one row per micro-batch");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains(&format!(
            "{} row(s) longer than max_tokens_per_micro_batch = 8",
            rollouts.len()
        )),
        "{w:?}"
    );
}

#[test]
fn update_ppo_takes_the_same_step_with_a_token_budget_in_every_loss_agg_mode() {
    let _s = serial();
    let rollouts = rollouts();
    let budget = budget_for(&rollouts, 2);
    let adv = advantages(&rollouts);
    let modes = [
        "token-mean",
        "token-sum",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    ];
    for mode in modes {
        let nodes = ppo_pair(
            mode,
            ("rows", "micro_batch_size = 2"),
            ("tokens", &format!("max_tokens_per_micro_batch = {budget}")),
        );
        let mut b = build(&graph(&nodes, false), false);
        let before = b.weights("a");
        assert_eq!(before, b.weights("b"));
        let (old, _) = log_probs_of(&mut b, "old", &rollouts);
        let rows = b.run("rows", ppo_inputs("rows", &rollouts, &adv, &old));
        let tokens = b.run("tokens", ppo_inputs("tokens", &rollouts, &adv, &old));
        assert!(tokens.warnings.is_empty(), "{:?}", tokens.warnings);
        assert_same_metrics(&rows.metrics, &tokens.metrics, mode);
        assert_same_update(&before, &b.weights("a"), &b.weights("b"), mode);
    }
}

#[test]
fn update_critic_takes_the_same_step_with_a_token_budget() {
    let _s = serial();
    let rollouts = rollouts();
    let budget = budget_for(&rollouts, 2);
    let adv = advantages(&rollouts);
    let nodes = critic_pair(
        "",
        ("rows", "micro_batch_size = 2"),
        ("tokens", &format!("max_tokens_per_micro_batch = {budget}")),
    );
    let mut b = build(&graph(&nodes, true), true);
    let before = b.weights("a");
    let values = values_of(&mut b, "values", &rollouts);
    let rows = b.run("rows", critic_inputs("rows", &rollouts, &values, &adv));
    let tokens = b.run("tokens", critic_inputs("tokens", &rollouts, &values, &adv));
    assert_same_metrics(&rows.metrics, &tokens.metrics, "critic");
    assert_same_update(&before, &b.weights("a"), &b.weights("b"), "critic");
}

#[test]
fn setting_both_micro_batch_options_is_a_validation_error() {
    for kind in ["logprob", "update.ppo"] {
        let inputs = if kind == "logprob" {
            r#"{ rollouts = "rollout.rollouts" }"#
        } else {
            r#"{ rollouts = "rollout.rollouts", advantages = "adv.advantages" }"#
        };
        let nodes = format!(
            r#"
[nodes.both]
kind = "{kind}"
model = "a"
inputs = {inputs}
micro_batch_size = 4
max_tokens_per_micro_batch = 512
"#
        );
        std::env::set_current_dir(common::root()).unwrap();
        let e = compile(
            &Registry::builtin(),
            "both.toml",
            &graph(&nodes, false),
            &[],
        )
        .err()
        .unwrap_or_else(|| panic!("{kind}: both options compiled"))
        .render();
        assert!(e.contains("not both"), "{kind}: {e}");
    }
}
