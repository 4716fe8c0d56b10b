//! Data parallelism at the node level: the data-parallel node kinds (`rollout`, `logprob`,
//! `update.ppo`, `update.sft`) built with several CPU replicas in one process give what one
//! replica gives — the same responses, the same log-probs, and the same update (gradients
//! all-reduced through burn-collective) within float tolerance.

use std::path::PathBuf;
use std::sync::Arc;

use flowrl_engine::{
    BuildContext, DeviceSpec, Inputs, Node, Payload, Placement, PortType, Registry, Resources,
    StepContext, Value, compile,
};
use flowrl_nodes::model_resource::ModelResource;
use flowrl_nodes::values::{AdvantageBatch, TokenLogProbs, TokenMatrix};
use flowrl_nodes::{PromptBatch, RolloutBatch};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

const GRAPH: &str = r#"
[run]
steps = 2
seed = 11

[models.policy]
path = "assets/tiny-qwen2-vl"

[nodes.data]
kind = "dataset.parquet"
model = "policy"
path = "datasets/shapes/test.parquet"
batch_size = 3
max_prompt_length = 128

[nodes.rollout]
kind = "rollout"
model = "policy"
inputs = { prompts = "data.prompts" }
n = 4
max_new_tokens = 10

[nodes.old]
kind = "logprob"
model = "policy"
inputs = { rollouts = "rollout.rollouts" }
micro_batch_size = 5
entropy = true

# Wired for the compiler's checks; the test feeds the update its own advantages.
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
mini_batch_size = 3
micro_batch_size = 2
ppo_epochs = 2
lr = 1e-3
entropy_coeff = 0.01

[nodes.sft]
kind = "update.sft"
model = "policy"
inputs = { prompts = "data.prompts" }
micro_batch_size = 2
lr = 1e-3
"#;

/// The graph's nodes built on `replicas` CPU replicas, over a fresh copy of the policy.
struct Built {
    resources: Arc<Resources>,
    nodes: Vec<(String, Box<dyn Node>)>,
}

fn build(replicas: usize) -> Built {
    std::env::set_current_dir(root()).unwrap();
    let registry = Registry::builtin();
    let (graph, _) =
        compile(&registry, "dp.toml", GRAPH, &[]).unwrap_or_else(|f| panic!("{}", f.render()));
    let mut resources = Resources::default();
    let policy =
        ModelResource::load("policy", &root().join("assets/tiny-qwen2-vl"), true, None).unwrap();
    resources.insert(
        "policy",
        graph.resources[0].kind.clone(),
        Arc::new(policy) as Arc<dyn std::any::Any + Send + Sync>,
    );
    let resources = Arc::new(resources);
    let placement = Placement {
        devices: (0..replicas).map(DeviceSpec::Cpu).collect(),
        cluster: None,
    };
    let nodes = graph
        .nodes
        .iter()
        .map(|n| {
            let ctx = BuildContext {
                node: n.name.clone(),
                device: DeviceSpec::Cpu(0),
                placement: if n.kind.data_parallel() {
                    placement.clone()
                } else {
                    Placement::single(DeviceSpec::Cpu(0))
                },
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

impl Built {
    fn node(&mut self, name: &str) -> &mut Box<dyn Node> {
        &mut self.nodes.iter_mut().find(|(n, _)| n == name).unwrap().1
    }

    fn run(
        &mut self,
        name: &str,
        step: u64,
        inputs: Inputs,
    ) -> (flowrl_engine::Outputs, Vec<(String, f64)>) {
        let resources = self.resources.clone();
        let mut ctx = StepContext::new(name, step, 2, 11, DeviceSpec::Cpu(0), resources);
        let out = self.node(name).run(&inputs, &mut ctx).unwrap();
        (out, ctx.metrics().to_vec())
    }

    fn weights(&self) -> Vec<f32> {
        let m = self.resources.get::<ModelResource>("policy").unwrap();
        let dir = tempfile::tempdir().unwrap();
        m.lock().model.save(dir.path(), None).unwrap();
        let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

fn input<T: std::any::Any + Send + Sync>(
    node: &str,
    port: &str,
    ty: &'static str,
    v: Arc<T>,
) -> Inputs {
    let mut i = Inputs::new(node);
    i.insert(port, Value::new(PortType::new(ty), Payload::opaque_arc(v)));
    i
}

fn get<T: std::any::Any + Send + Sync>(out: &flowrl_engine::Outputs, port: &str) -> Arc<T> {
    out.get_arc::<T>(port).unwrap()
}

/// Everything one step of the graph produced.
struct Step {
    rollouts: Arc<RolloutBatch>,
    log_probs: Arc<TokenLogProbs>,
    update_metrics: Vec<(String, f64)>,
    sft_metrics: Vec<(String, f64)>,
}

fn step(b: &mut Built, step: u64) -> Step {
    let (out, _) = b.run("data", step, Inputs::new("data"));
    let prompts: Arc<PromptBatch> = get(&out, "prompts");
    let (out, _) = b.run(
        "rollout",
        step,
        input("rollout", "prompts", "Prompts", prompts.clone()),
    );
    let rollouts: Arc<RolloutBatch> = get(&out, "rollouts");
    let (out, _) = b.run(
        "old",
        step,
        input("old", "rollouts", "Rollouts", rollouts.clone()),
    );
    let log_probs: Arc<TokenLogProbs> = get(&out, "log_probs");
    // Advantages that differ per token and row, masked like verl's.
    let [rows, cols] = rollouts.response_mask.shape();
    let mut adv = TokenMatrix::zeros(rows, cols);
    for r in 0..rows {
        for t in 0..cols {
            adv.row_mut(r)[t] =
                rollouts.response_mask.row(r)[t] * (((r * 7 + t * 3) % 11) as f32 / 5.0 - 1.0);
        }
    }
    let advantages = Arc::new(AdvantageBatch {
        rollouts: rollouts.clone(),
        returns: adv.clone(),
        advantages: adv,
    });
    let mut inputs = input("update", "rollouts", "Rollouts", rollouts.clone());
    inputs.insert(
        "advantages",
        Value::new(PortType::new("Advantages"), Payload::opaque_arc(advantages)),
    );
    inputs.insert(
        "old_log_probs",
        Value::new(
            PortType::new("TokenLogProbs"),
            Payload::opaque_arc(log_probs.clone()),
        ),
    );
    let (_, update_metrics) = b.run("update", step, inputs);
    let (_, sft_metrics) = b.run("sft", step, input("sft", "prompts", "Prompts", prompts));
    Step {
        rollouts,
        log_probs,
        update_metrics,
        sft_metrics,
    }
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-3)
}

#[test]
fn replicas_in_one_process_match_one_device() {
    let mut one = build(1);
    let mut three = build(3);
    for s in 0..2 {
        let a = step(&mut one, s);
        let b = step(&mut three, s);
        // Responses: each row has its own RNG, so the split does not change them.
        assert_eq!(
            a.rollouts.response_ids, b.rollouts.response_ids,
            "step {s}: responses"
        );
        let worst = a
            .rollouts
            .sampling_log_probs
            .data
            .iter()
            .zip(&b.rollouts.sampling_log_probs.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-4,
            "step {s}: sampling log-probs differ by {worst}"
        );
        let worst = a
            .log_probs
            .log_probs
            .data
            .iter()
            .zip(&b.log_probs.log_probs.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-4, "step {s}: log-probs differ by {worst}");
        assert!(b.log_probs.entropy.is_some());
        for (metrics_a, metrics_b) in [
            (&a.update_metrics, &b.update_metrics),
            (&a.sft_metrics, &b.sft_metrics),
        ] {
            assert_eq!(metrics_a.len(), metrics_b.len());
            for ((ka, va), (kb, vb)) in metrics_a.iter().zip(metrics_b) {
                assert_eq!(ka, kb);
                assert!(
                    close(*va, *vb, 1e-3),
                    "step {s}: {ka} {va} (1 replica) vs {vb} (3 replicas)"
                );
            }
        }
        let names: Vec<&str> = b.update_metrics.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            names.contains(&"actor/pg_loss") && names.contains(&"actor/grad_norm"),
            "{names:?}"
        );
    }
    // Two PPO epochs × one mini-batch + one SFT step, twice: the weights stay together.
    let (wa, wb) = (one.weights(), three.weights());
    assert_eq!(wa.len(), wb.len());
    let worst = wa
        .iter()
        .zip(&wb)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    // Adam's steps are ≈ lr = 1e-3 per weight; reduction-order noise stays far below that.
    assert!(worst < 1e-4, "weights differ by {worst} after 2 steps");
    let moved = wa
        .iter()
        .zip(build(1).weights())
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        moved > 1e-3,
        "the updates moved the weights by only {moved}"
    );
}
