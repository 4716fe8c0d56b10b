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

use std::sync::Arc;

use flowrl_engine::{
    BuildContext, DeviceSpec, Inputs, Node, Payload, Placement, Registry, Resources, StepContext,
    Value, ValueType, compile,
};
use flowrl_models::weights::Precision;
use flowrl_nodes::RolloutBatch;
use flowrl_nodes::model_resource::ModelResource;
use flowrl_nodes::train::micro_batches::{MicroBatching, row_tokens};
use flowrl_nodes::values::{AdvantageBatch, TokenLogProbs, TokenMatrix, TokenValues, port_types};

/// Serialises this file's tests (burn 0.21's autodiff, tracel-ai/burn#5573: see
/// `chunked_backward.rs`).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The graph of `common::GRAPH`'s data and rollout, with `nodes` (TOML) appended and the models
/// `a` and `b` (two fresh copies of the tiny policy; `value = true` gives them value heads).
fn graph(nodes: &str, value: bool) -> String {
    let head = if value { "value_head = true\n" } else { "" };
    format!(
        r#"
[run]
steps = 2
seed = 11

[models.a]
path = "assets/tiny-qwen2-vl"
{head}
[models.b]
path = "assets/tiny-qwen2-vl"
{head}
[nodes.data]
kind = "dataset.parquet"
model = "a"
path = "datasets/shapes/test.parquet"
batch_size = 3
max_prompt_length = 128

[nodes.rollout]
kind = "rollout"
model = "a"
inputs = {{ prompts = "data.prompts" }}
n = 4
max_new_tokens = 10

[nodes.reward]
kind = "reward.exact_match"
inputs = {{ rollouts = "rollout.rollouts" }}

[nodes.adv]
kind = "advantage.grpo"
inputs = {{ scores = "reward.scores" }}
{nodes}
"#
    )
}

/// A compiled graph's nodes, built over fresh copies of its models on one CPU.
struct Built {
    resources: Arc<Resources>,
    nodes: Vec<(String, Box<dyn Node>)>,
}

fn build(text: &str, value_head: bool) -> Built {
    std::env::set_current_dir(common::root()).unwrap();
    let registry = Registry::builtin();
    let (graph, _) = compile(&registry, "token_budget.toml", text, &[])
        .unwrap_or_else(|f| panic!("{}", f.render()));
    let mut resources = Resources::default();
    for r in &graph.resources {
        let mut m = ModelResource::load(
            &r.name,
            &common::root().join("assets/tiny-qwen2-vl"),
            true,
            None,
            DeviceSpec::Cpu(0),
            Some(Precision::F32),
        )
        .unwrap();
        if value_head {
            // The same seed for both models: the same fresh head.
            m.attach_value_head(7).unwrap();
        }
        resources.insert(
            &r.name,
            r.kind.clone(),
            Arc::new(m) as Arc<dyn std::any::Any + Send + Sync>,
        );
    }
    let resources = Arc::new(resources);
    let nodes = graph
        .nodes
        .iter()
        .map(|n| {
            let ctx = BuildContext {
                node: n.name.clone(),
                device: DeviceSpec::Cpu(0),
                placement: Placement::single(DeviceSpec::Cpu(0)),
                seed: graph.run.seed,
                total_steps: graph.run.steps,
                resources: resources.clone(),
                run_dir: None,
            };
            (n.name.clone(), n.kind.build(&n.params, &ctx).unwrap())
        })
        .collect();
    Built { resources, nodes }
}

/// What one node run gave: outputs, metrics and warnings.
struct Ran {
    out: flowrl_engine::Outputs,
    metrics: Vec<(String, f64)>,
    warnings: Vec<String>,
}

impl Built {
    fn run(&mut self, name: &str, inputs: Inputs) -> Ran {
        let mut ctx = StepContext::new(name, 0, 2, 11, DeviceSpec::Cpu(0), self.resources.clone());
        let node = &mut self.nodes.iter_mut().find(|(n, _)| n == name).unwrap().1;
        let out = node.run(&inputs, &mut ctx).unwrap();
        Ran {
            out,
            metrics: ctx.metrics().to_vec(),
            warnings: ctx.warnings().to_vec(),
        }
    }

    /// Model `name`'s weights as its checkpoint saves them.
    fn weights(&self, name: &str) -> Vec<f32> {
        let dir = tempfile::tempdir().unwrap();
        let m = self.resources.get::<ModelResource>(name).unwrap();
        m.save_to(dir.path()).unwrap();
        let mut out = Vec::new();
        let mut files: Vec<_> = std::fs::read_dir(dir.path().join("model"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        for f in files {
            out.extend(common::f32_tensors(&f));
        }
        out
    }
}

fn value<T: std::any::Any + Send + Sync>(ty: ValueType<T>, v: Arc<T>) -> Value {
    Value::new(ty.port_type(), Payload::opaque_arc(v))
}

/// The rollouts of step 0 under the tiny policy.
fn rollouts() -> Arc<RolloutBatch> {
    let mut b = build(&graph("", false), false);
    let data = b.run("data", Inputs::new("data"));
    let prompts: Arc<flowrl_nodes::PromptBatch> = data.out.get_arc("prompts").unwrap();
    let mut i = Inputs::new("rollout");
    i.insert("prompts", value(port_types::PROMPTS, prompts));
    b.run("rollout", i).out.get_arc("rollouts").unwrap()
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

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    common::max_abs_diff(a, b)
}

fn log_probs_of(
    b: &mut Built,
    node: &str,
    rollouts: &Arc<RolloutBatch>,
) -> (Arc<TokenLogProbs>, Vec<String>) {
    let mut i = Inputs::new(node);
    i.insert("rollouts", value(port_types::ROLLOUTS, rollouts.clone()));
    let ran = b.run(node, i);
    (ran.out.get_arc("log_probs").unwrap(), ran.warnings)
}

fn assert_same_log_probs(x: &TokenLogProbs, y: &TokenLogProbs, what: &str) {
    let parts = [
        ("log-probs", Some(&x.log_probs), Some(&y.log_probs)),
        ("entropy", x.entropy.as_ref(), y.entropy.as_ref()),
        ("Σπ²", x.sum_pi_squared.as_ref(), y.sum_pi_squared.as_ref()),
    ];
    for (name, a, b) in parts {
        let (a, b) = (a.expect(name), b.expect(name));
        // 1e-6 relative: a micro-batch of one row runs other gemm blocks than one of five.
        let scale = a.data.iter().fold(1f32, |m, x| m.max(x.abs()));
        let d = max_abs_diff(&a.data, &b.data);
        assert!(
            d <= 1e-6 * scale,
            "{what}: {name} differ by {d} (largest |value| {scale})"
        );
    }
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

/// Advantages that differ per token and row, masked like verl's (`common::update`'s).
fn advantages(rollouts: &Arc<RolloutBatch>) -> Arc<AdvantageBatch> {
    let [rows, cols] = rollouts.response_mask.shape();
    let mut adv = TokenMatrix::zeros(rows, cols);
    for r in 0..rows {
        for t in 0..cols {
            adv.row_mut(r)[t] =
                rollouts.response_mask.row(r)[t] * (((r * 7 + t * 3) % 11) as f32 / 5.0 - 1.0);
        }
    }
    Arc::new(AdvantageBatch {
        rollouts: rollouts.clone(),
        returns: adv.clone(),
        advantages: adv,
    })
}

/// `after_a − before` and `after_b − before` agree within `1e-5` of the largest change, and the
/// update moved the weights.
fn assert_same_update(before: &[f32], a: &[f32], b: &[f32], what: &str) {
    let da: Vec<f32> = a.iter().zip(before).map(|(x, w)| x - w).collect();
    let db: Vec<f32> = b.iter().zip(before).map(|(x, w)| x - w).collect();
    let scale = da.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(
        scale > 1e-4,
        "{what}: the update moved the weights by only {scale}"
    );
    let d = max_abs_diff(&da, &db);
    assert!(
        d <= 1e-5 * scale,
        "{what}: the updates differ by {d} (largest change {scale})"
    );
}

fn assert_same_metrics(a: &[(String, f64)], b: &[(String, f64)], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: {a:?} vs {b:?}");
    for ((ka, va), (kb, vb)) in a.iter().zip(b) {
        assert_eq!(ka, kb);
        // Means over micro-batches depend on the grouping (as in verl); the losses and the
        // gradient norm do not.
        if ["loss", "grad_norm", "lr"].iter().any(|k| ka.ends_with(k)) {
            assert!(common::close(*va, *vb, 1e-5), "{what}: {ka} {va} vs {vb}");
        }
    }
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
        let update = |name: &str, model: &str, micro: &str| {
            format!(
                r#"
[nodes.{name}]
kind = "update.ppo"
model = "{model}"
inputs = {{ rollouts = "rollout.rollouts", advantages = "adv.advantages", old_log_probs = "old.log_probs" }}
loss_agg_mode = "{mode}"
lr = 1.0
eps = 1.0
entropy_coeff = 0.01
{micro}
"#
            )
        };
        let nodes = format!(
            r#"
[nodes.old]
kind = "logprob"
model = "a"
inputs = {{ rollouts = "rollout.rollouts" }}
{}{}"#,
            update("rows", "a", "micro_batch_size = 2"),
            update(
                "tokens",
                "b",
                &format!("max_tokens_per_micro_batch = {budget}")
            ),
        );
        let mut b = build(&graph(&nodes, false), false);
        let before = b.weights("a");
        assert_eq!(before, b.weights("b"));
        let (old, _) = log_probs_of(&mut b, "old", &rollouts);
        let inputs = |node: &str| {
            let mut i = Inputs::new(node);
            i.insert("rollouts", value(port_types::ROLLOUTS, rollouts.clone()));
            i.insert("advantages", value(port_types::ADVANTAGES, adv.clone()));
            i.insert(
                "old_log_probs",
                value(port_types::TOKEN_LOG_PROBS, old.clone()),
            );
            i
        };
        let rows = b.run("rows", inputs("rows"));
        let tokens = b.run("tokens", inputs("tokens"));
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
    let nodes = r#"
[nodes.values]
kind = "value"
model = "a"
inputs = { rollouts = "rollout.rollouts" }
"#
    .to_string()
        + &["rows", "tokens"]
            .iter()
            .map(|name| {
                let (model, micro) = if *name == "rows" {
                    ("a", "micro_batch_size = 2".to_string())
                } else {
                    ("b", format!("max_tokens_per_micro_batch = {budget}"))
                };
                format!(
                    r#"
[nodes.{name}]
kind = "update.critic"
model = "{model}"
inputs = {{ rollouts = "rollout.rollouts", values = "values.values", advantages = "adv.advantages" }}
lr = 1.0
eps = 1.0
{micro}
"#
                )
            })
            .collect::<String>();
    let mut b = build(&graph(&nodes, true), true);
    let before = b.weights("a");
    let mut i = Inputs::new("values");
    i.insert("rollouts", value(port_types::ROLLOUTS, rollouts.clone()));
    let values: Arc<TokenValues> = b.run("values", i).out.get_arc("values").unwrap();
    let inputs = |node: &str| {
        let mut i = Inputs::new(node);
        i.insert("rollouts", value(port_types::ROLLOUTS, rollouts.clone()));
        i.insert("values", value(port_types::VALUES, values.clone()));
        i.insert("advantages", value(port_types::ADVANTAGES, adv.clone()));
        i
    };
    let rows = b.run("rows", inputs("rows"));
    let tokens = b.run("tokens", inputs("tokens"));
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
