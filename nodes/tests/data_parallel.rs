//! Data parallelism at the node level: the data-parallel node kinds (`rollout`, `logprob`,
//! `update.ppo`, `update.sft`) built with several CPU replicas in one process give what one
//! replica gives — the same responses, the same log-probs, and the same update (gradients
//! all-reduced through burn-collective) within float tolerance. With the `vulkan` feature, the
//! same nodes on a Vulkan device (the GPU backend's kernels) give what they give on the CPU.

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

/// The graph's nodes built on some devices, over a fresh copy of the policy.
struct Built {
    resources: Arc<Resources>,
    nodes: Vec<(String, Box<dyn Node>)>,
}

/// The nodes on `replicas` CPU replicas.
fn build(replicas: usize) -> Built {
    build_on((0..replicas).map(DeviceSpec::Cpu).collect())
}

/// The nodes with the policy on `devices[0]` and the data-parallel kinds on every device.
fn build_on(devices: Vec<DeviceSpec>) -> Built {
    let first = devices[0];
    std::env::set_current_dir(root()).unwrap();
    let registry = Registry::builtin();
    let (graph, _) =
        compile(&registry, "dp.toml", GRAPH, &[]).unwrap_or_else(|f| panic!("{}", f.render()));
    let mut resources = Resources::default();
    let policy = ModelResource::load(
        "policy",
        &root().join("assets/tiny-qwen2-vl"),
        true,
        None,
        first,
    )
    .unwrap();
    resources.insert(
        "policy",
        graph.resources[0].kind.clone(),
        Arc::new(policy) as Arc<dyn std::any::Any + Send + Sync>,
    );
    let resources = Arc::new(resources);
    let placement = Placement {
        devices,
        cluster: None,
    };
    let nodes = graph
        .nodes
        .iter()
        .map(|n| {
            let ctx = BuildContext {
                node: n.name.clone(),
                device: first,
                placement: if n.kind.data_parallel() {
                    placement.clone()
                } else {
                    Placement::single(first)
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

    /// The policy's weights as saved (in checkpoint order), whatever its backend.
    fn weights(&self) -> Vec<f32> {
        let m = self.resources.get::<ModelResource>("policy").unwrap();
        let dir = tempfile::tempdir().unwrap();
        m.save_to(dir.path()).unwrap();
        let bytes = std::fs::read(dir.path().join("model/model.safetensors")).unwrap();
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

/// `b` computed what `a` computed over two steps: the same responses, log-probs within `lp_tol`,
/// every update metric within `rel`, and weights within `w_tol` after the steps.
fn assert_same_steps(a: &mut Built, b: &mut Built, what: &str, lp_tol: f32, rel: f64, w_tol: f32) {
    for s in 0..2 {
        let x = step(a, s);
        let y = step(b, s);
        // Responses: each row has its own RNG, so neither the split nor the backend changes them
        // (a token would flip only for a draw within float noise of a CDF boundary).
        assert_eq!(
            x.rollouts.response_ids, y.rollouts.response_ids,
            "{what}, step {s}: responses"
        );
        let worst = max_abs_diff(
            &x.rollouts.sampling_log_probs.data,
            &y.rollouts.sampling_log_probs.data,
        );
        assert!(
            worst < lp_tol,
            "{what}, step {s}: sampling log-probs differ by {worst}"
        );
        let worst = max_abs_diff(&x.log_probs.log_probs.data, &y.log_probs.log_probs.data);
        assert!(
            worst < lp_tol,
            "{what}, step {s}: log-probs differ by {worst}"
        );
        assert!(y.log_probs.entropy.is_some());
        for (metrics_a, metrics_b) in [
            (&x.update_metrics, &y.update_metrics),
            (&x.sft_metrics, &y.sft_metrics),
        ] {
            assert_eq!(metrics_a.len(), metrics_b.len());
            for ((ka, va), (kb, vb)) in metrics_a.iter().zip(metrics_b) {
                assert_eq!(ka, kb);
                assert!(close(*va, *vb, rel), "{what}, step {s}: {ka} {va} vs {vb}");
            }
        }
        let names: Vec<&str> = y.update_metrics.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            names.contains(&"actor/pg_loss") && names.contains(&"actor/grad_norm"),
            "{names:?}"
        );
    }
    // Two PPO epochs × one mini-batch + one SFT step, twice: the weights stay together.
    let (wa, wb) = (a.weights(), b.weights());
    assert_eq!(wa.len(), wb.len());
    let worst = max_abs_diff(&wa, &wb);
    assert!(
        worst < w_tol,
        "{what}: weights differ by {worst} after 2 steps"
    );
    let moved = max_abs_diff(&wa, &build(1).weights());
    assert!(
        moved > 1e-3,
        "{what}: the updates moved the weights by only {moved}"
    );
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn replicas_in_one_process_match_one_device() {
    // Adam's steps are ≈ lr = 1e-3 per weight; reduction-order noise stays far below that.
    assert_same_steps(
        &mut build(1),
        &mut build(3),
        "3 replicas vs 1",
        1e-4,
        1e-3,
        1e-4,
    );
}

/// rollout, logprob, update.ppo (its gradients, through the metrics and the weights they move)
/// and update.sft on a Vulkan device against the CPU. The kernels sum in another order than
/// Flex's, so log-probs differ by float noise (~1e-6 here); the tolerances are the replica test's.
#[cfg(feature = "vulkan")]
#[test]
fn vulkan_nodes_match_the_cpu() {
    let mut cpu = build(1);
    let mut vulkan = build_on(vec![DeviceSpec::Vulkan(0)]);
    assert_same_steps(&mut cpu, &mut vulkan, "vulkan vs cpu", 1e-4, 1e-3, 1e-4);
}
