//! A harness for tests that compare node configurations: a graph's data and rollout nodes with
//! two fresh copies `a` and `b` of a model and the nodes under test, built on one CPU and run one
//! node at a time (token-budget and padding-free micro-batches against fixed, padded ones).

use std::sync::Arc;

use flowrl_engine::{
    BuildContext, DeviceSpec, Inputs, Node, Payload, Placement, Registry, Resources, StepContext,
    Value, ValueType, compile,
};
use flowrl_models::weights::Precision;
use flowrl_nodes::RolloutBatch;
use flowrl_nodes::resources::model::ModelResource;
use flowrl_nodes::values::{AdvantageBatch, TokenLogProbs, TokenMatrix, TokenValues, port_types};

use super::{close, f32_tensors, max_abs_diff, root};

/// The tiny policy of the main job.
pub const TINY_POLICY: &str = "assets/tiny-qwen2-vl";

/// The graph of `common::GRAPH`'s data and rollout, with `nodes` (TOML) appended and the models
/// `a` and `b` (two fresh copies of the tiny policy; `value = true` gives them value heads).
pub fn graph(nodes: &str, value: bool) -> String {
    graph_of(TINY_POLICY, nodes, value)
}

/// [`graph`] with the models `a` and `b` loaded from `model` (a directory under the repository).
pub fn graph_of(model: &str, nodes: &str, value: bool) -> String {
    let head = if value { "value_head = true\n" } else { "" };
    format!(
        r#"
[run]
steps = 2
seed = 11

[models.a]
path = "{model}"
{head}
[models.b]
path = "{model}"
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

/// One checkpoint per `model_type` among `assets/*/config.json` (in name order), as paths
/// relative to the repository.
pub fn families() -> Vec<(String, String)> {
    let assets = root().join("assets");
    let mut dirs: Vec<_> = std::fs::read_dir(&assets)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("config.json").is_file() && p.join("tokenizer.json").is_file())
        .collect();
    dirs.sort();
    let mut by_type = std::collections::BTreeMap::new();
    for dir in dirs {
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let model_type = config["model_type"].as_str().unwrap().to_string();
        let name = dir.file_name().unwrap().to_str().unwrap();
        by_type
            .entry(model_type)
            .or_insert_with(|| format!("assets/{name}"));
    }
    for family in ["qwen2_vl", "qwen3_vl", "gemma4"] {
        assert!(
            by_type.contains_key(family),
            "no {family} checkpoint in assets/"
        );
    }
    by_type.into_iter().collect()
}

/// The nodes comparing two `update.ppo` configurations: an `old` log-prob node on model `a` (and
/// `old_b` on `b`, as validation wants the trained model's log-probs; the tests hand both updates
/// `old`'s, equal at the first step), then node `first.0` on model `a` and node `second.0` on
/// model `b`, both in `loss_agg_mode = mode` with an entropy bonus and AdamW's first step made
/// smooth (lr 1, ε = 1: Δw = g / (|g| + 1)), each with its own further parameters (`first.1`,
/// `second.1`: TOML lines).
pub fn ppo_pair(mode: &str, first: (&str, &str), second: (&str, &str)) -> String {
    let update = |(name, extra): (&str, &str), model: &str, old: &str| {
        format!(
            r#"
[nodes.{name}]
kind = "update.ppo"
model = "{model}"
inputs = {{ rollouts = "rollout.rollouts", advantages = "adv.advantages", old_log_probs = "{old}.log_probs" }}
loss_agg_mode = "{mode}"
lr = 1.0
eps = 1.0
entropy_coeff = 0.01
{extra}
"#
        )
    };
    format!(
        r#"
[nodes.old]
kind = "logprob"
model = "a"
inputs = {{ rollouts = "rollout.rollouts" }}

[nodes.old_b]
kind = "logprob"
model = "b"
inputs = {{ rollouts = "rollout.rollouts" }}
{}{}"#,
        update(first, "a", "old"),
        update(second, "b", "old_b"),
    )
}

/// The nodes comparing two `update.critic` configurations: a `value` node `values` on model `a`
/// (plus `values_extra`, TOML), then node `first.0` on `a` and `second.0` on `b` with AdamW's
/// first step made smooth (lr 1, ε = 1), each with its further parameters.
pub fn critic_pair(values_extra: &str, first: (&str, &str), second: (&str, &str)) -> String {
    let update = |(name, extra): (&str, &str), model: &str| {
        format!(
            r#"
[nodes.{name}]
kind = "update.critic"
model = "{model}"
inputs = {{ rollouts = "rollout.rollouts", values = "values.values", advantages = "adv.advantages" }}
lr = 1.0
eps = 1.0
{extra}
"#
        )
    };
    format!(
        r#"
[nodes.values]
kind = "value"
model = "a"
inputs = {{ rollouts = "rollout.rollouts" }}
{values_extra}{}{}"#,
        update(first, "a"),
        update(second, "b"),
    )
}

/// A compiled graph's nodes, built over fresh copies of its models on one CPU.
pub struct Built {
    resources: Arc<Resources>,
    nodes: Vec<(String, Box<dyn Node>)>,
}

pub fn build(text: &str, value_head: bool) -> Built {
    std::env::set_current_dir(root()).unwrap();
    let registry = Registry::builtin();
    let (graph, _) = compile(&registry, "token_budget.toml", text, &[])
        .unwrap_or_else(|f| panic!("{}", f.render()));
    let mut resources = Resources::default();
    for r in &graph.resources {
        let path = r.params.get_str("path").expect("a model path");
        let mut m = ModelResource::load(
            &r.name,
            &root().join(path),
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
                graph: None,
            };
            (n.name.clone(), n.kind.build(&n.params, &ctx).unwrap())
        })
        .collect();
    Built { resources, nodes }
}

/// What one node run gave: outputs, metrics and warnings.
pub struct Ran {
    pub out: flowrl_engine::Outputs,
    pub metrics: Vec<(String, f64)>,
    pub warnings: Vec<String>,
}

impl Built {
    pub fn run(&mut self, name: &str, inputs: Inputs) -> Ran {
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
    pub fn weights(&self, name: &str) -> Vec<f32> {
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
            out.extend(f32_tensors(&f));
        }
        out
    }
}

pub fn value<T: std::any::Any + Send + Sync>(ty: ValueType<T>, v: Arc<T>) -> Value {
    Value::new(ty.port_type(), Payload::opaque_arc(v))
}

/// The rollouts of step 0 under the tiny policy.
pub fn rollouts() -> Arc<RolloutBatch> {
    rollouts_of(TINY_POLICY)
}

/// The rollouts of step 0 under the model in `model`.
pub fn rollouts_of(model: &str) -> Arc<RolloutBatch> {
    let mut b = build(&graph_of(model, "", false), false);
    let data = b.run("data", Inputs::new("data"));
    let prompts: Arc<flowrl_nodes::PromptBatch> = data.out.get_arc("prompts").unwrap();
    let mut i = Inputs::new("rollout");
    i.insert("prompts", value(port_types::PROMPTS, prompts));
    b.run("rollout", i).out.get_arc("rollouts").unwrap()
}

pub fn log_probs_of(
    b: &mut Built,
    node: &str,
    rollouts: &Arc<RolloutBatch>,
) -> (Arc<TokenLogProbs>, Vec<String>) {
    let mut i = Inputs::new(node);
    i.insert("rollouts", value(port_types::ROLLOUTS, rollouts.clone()));
    let ran = b.run(node, i);
    (ran.out.get_arc("log_probs").unwrap(), ran.warnings)
}

/// The values node `node` gives for `rollouts`.
pub fn values_of(b: &mut Built, node: &str, rollouts: &Arc<RolloutBatch>) -> Arc<TokenValues> {
    let mut i = Inputs::new(node);
    i.insert("rollouts", value(port_types::ROLLOUTS, rollouts.clone()));
    b.run(node, i).out.get_arc("values").unwrap()
}

/// The inputs of an `update.ppo` node `node`.
pub fn ppo_inputs(
    node: &str,
    rollouts: &Arc<RolloutBatch>,
    adv: &Arc<AdvantageBatch>,
    old: &Arc<TokenLogProbs>,
) -> Inputs {
    let mut i = Inputs::new(node);
    i.insert("rollouts", value(port_types::ROLLOUTS, rollouts.clone()));
    i.insert("advantages", value(port_types::ADVANTAGES, adv.clone()));
    i.insert(
        "old_log_probs",
        value(port_types::TOKEN_LOG_PROBS, old.clone()),
    );
    i
}

/// The inputs of an `update.critic` node `node`.
pub fn critic_inputs(
    node: &str,
    rollouts: &Arc<RolloutBatch>,
    values: &Arc<TokenValues>,
    adv: &Arc<AdvantageBatch>,
) -> Inputs {
    let mut i = Inputs::new(node);
    i.insert("rollouts", value(port_types::ROLLOUTS, rollouts.clone()));
    i.insert("values", value(port_types::VALUES, values.clone()));
    i.insert("advantages", value(port_types::ADVANTAGES, adv.clone()));
    i
}

/// Log-probs, entropies and Σπ² agree within 1e-6 relative (a micro-batch of one row runs other
/// gemm blocks than one of five).
pub fn assert_same_log_probs(x: &TokenLogProbs, y: &TokenLogProbs, what: &str) {
    assert_log_probs_within(x, y, 1e-6, what);
}

/// Log-probs, entropies and Σπ² agree within `rel` of the largest |value| (at least 1).
pub fn assert_log_probs_within(x: &TokenLogProbs, y: &TokenLogProbs, rel: f32, what: &str) {
    let parts = [
        ("log-probs", Some(&x.log_probs), Some(&y.log_probs)),
        ("entropy", x.entropy.as_ref(), y.entropy.as_ref()),
        ("Σπ²", x.sum_pi_squared.as_ref(), y.sum_pi_squared.as_ref()),
    ];
    for (name, a, b) in parts {
        let (a, b) = (a.expect(name), b.expect(name));
        let scale = a.data.iter().fold(1f32, |m, x| m.max(x.abs()));
        let d = max_abs_diff(&a.data, &b.data);
        assert!(
            d <= rel * scale,
            "{what}: {name} differ by {d} (largest |value| {scale})"
        );
    }
}

/// Advantages that differ per token and row, masked like verl's (`common::update`'s).
pub fn advantages(rollouts: &Arc<RolloutBatch>) -> Arc<AdvantageBatch> {
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
pub fn assert_same_update(before: &[f32], a: &[f32], b: &[f32], what: &str) {
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

pub fn assert_same_metrics(a: &[(String, f64)], b: &[(String, f64)], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: {a:?} vs {b:?}");
    for ((ka, va), (kb, vb)) in a.iter().zip(b) {
        assert_eq!(ka, kb);
        // Means over micro-batches depend on the grouping (as in verl); the losses and the
        // gradient norm do not.
        if ["loss", "grad_norm", "lr"].iter().any(|k| ka.ends_with(k)) {
            assert!(close(*va, *vb, 1e-5), "{what}: {ka} {va} vs {vb}");
        }
    }
}
