//! The test harness of the data-parallel and backend tests: the main job's nodes built on some
//! devices over a fresh copy of the tiny policy, run one step at a time with inputs the test
//! controls, and compared.

#![allow(dead_code)] // each test binary uses its own subset

pub mod exec;
pub mod grads;
pub mod graph;

use std::path::PathBuf;
use std::sync::Arc;

use flowrl_engine::{
    BuildContext, DeviceSpec, Inputs, Node, Payload, Placement, PortType, Registry, Resources,
    StepContext, Value, compile,
};
use flowrl_models::weights::Precision;
use flowrl_nodes::resources::model::ModelResource;
use flowrl_nodes::values::{AdvantageBatch, TokenLogProbs, TokenMatrix};
use flowrl_nodes::{PromptBatch, RolloutBatch};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub const GRAPH: &str = r#"
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
pub struct Built {
    resources: Arc<Resources>,
    nodes: Vec<(String, Box<dyn Node>)>,
}

/// The nodes on `replicas` CPU replicas.
pub fn build(replicas: usize) -> Built {
    build_on((0..replicas).map(DeviceSpec::Cpu).collect())
}

/// The nodes with the policy on `devices[0]` and the data-parallel kinds on every device.
pub fn build_on(devices: Vec<DeviceSpec>) -> Built {
    build_with(devices, None)
}

/// [`build_on`] with the policy computing in `precision` (`None`: the backend's default).
pub fn build_with(devices: Vec<DeviceSpec>, precision: Option<Precision>) -> Built {
    build_graph(
        GRAPH,
        &root().join("assets/tiny-qwen2-vl"),
        devices,
        precision,
    )
}

/// The nodes of `graph` (whose one model resource is `policy`) with the policy loaded from
/// `policy_dir` on `devices[0]`, the data-parallel kinds on every device.
pub fn build_graph(
    graph: &str,
    policy_dir: &std::path::Path,
    devices: Vec<DeviceSpec>,
    precision: Option<Precision>,
) -> Built {
    let policy =
        ModelResource::load("policy", policy_dir, true, None, devices[0], precision).unwrap();
    build_over(graph, policy, devices).unwrap()
}

/// The nodes of `graph` (whose one model resource is `policy`) over the given `policy`, on
/// `devices[0]`, the data-parallel kinds on every device; the first node that does not build is
/// the error.
pub fn build_over(
    graph: &str,
    policy: ModelResource,
    devices: Vec<DeviceSpec>,
) -> anyhow::Result<Built> {
    let first = devices[0];
    std::env::set_current_dir(root()).unwrap();
    let registry = Registry::builtin();
    let (graph, _) =
        compile(&registry, "dp.toml", graph, &[]).unwrap_or_else(|f| panic!("{}", f.render()));
    let mut resources = Resources::default();
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
                graph: None,
            };
            Ok((n.name.clone(), n.kind.build(&n.params, &ctx)?))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Built { resources, nodes })
}

impl Built {
    pub fn node(&mut self, name: &str) -> &mut Box<dyn Node> {
        &mut self.nodes.iter_mut().find(|(n, _)| n == name).unwrap().1
    }

    pub fn run(
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

    /// The policy's weights as its checkpoint saves them (tensors in name order), whatever its
    /// backend; every tensor must be stored as F32.
    pub fn weights(&self) -> Vec<f32> {
        let dir = tempfile::tempdir().unwrap();
        self.save(dir.path());
        f32_tensors(&dir.path().join("model/model.safetensors"))
    }

    /// The dtypes of the policy's weights in memory (a CPU policy).
    pub fn cpu_weight_dtypes(&self) -> Vec<burn::tensor::DType> {
        use burn::module::{Module, ModuleVisitor, Param};
        use burn::prelude::{Backend, Tensor};
        struct Dtypes(Vec<burn::tensor::DType>);
        impl<B: Backend> ModuleVisitor<B> for Dtypes {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                self.0.push(param.val().dtype());
            }
        }
        let m = self.resources.get::<ModelResource>("policy").unwrap();
        let mut d = Dtypes(Vec::new());
        m.lock::<flowrl_nodes::runtime::backend::CpuBackend>()
            .unwrap()
            .model
            .visit(&mut d);
        d.0
    }

    /// f32 values of AdamW moments each local replica holds: the policy's own optimizer first,
    /// then its copies' (by local replica index).
    pub fn optimizer_values(&self) -> Vec<usize> {
        let m = self.resources.get::<ModelResource>("policy").unwrap();
        let s = m
            .lock::<flowrl_nodes::runtime::backend::CpuBackend>()
            .unwrap();
        let mut out = vec![s.optimizer.as_ref().map_or(0, |o| o.state_values())];
        for c in s.copies.iter().flatten() {
            out.push(c.optimizer.as_ref().map_or(0, |o| o.state_values()));
        }
        out
    }

    /// f32 values of trainable weights (master weights) each local replica holds: the policy's
    /// own first, then its copies' (by local replica index).
    pub fn master_values(&self) -> Vec<usize> {
        use burn::module::{Module, ModuleVisitor, Param};
        use burn::prelude::{Backend, Tensor};
        struct Masters(usize);
        impl<B: Backend> ModuleVisitor<B> for Masters {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let v = param.val();
                if v.is_require_grad() && v.dtype() == burn::tensor::DType::F32 {
                    self.0 += v.shape().num_elements();
                }
            }
        }
        let count = |m: &flowrl_models::Model<flowrl_nodes::runtime::backend::CpuBackend>| {
            let mut c = Masters(0);
            m.visit(&mut c);
            c.0
        };
        let m = self.resources.get::<ModelResource>("policy").unwrap();
        let s = m
            .lock::<flowrl_nodes::runtime::backend::CpuBackend>()
            .unwrap();
        let mut out = vec![count(&s.model)];
        out.extend(s.copies.iter().flatten().map(|c| count(&c.model)));
        out
    }

    /// The weights of the policy's copies on its other replicas, each as [`Built::model_values`]
    /// lists them.
    pub fn copies_values(&self) -> Vec<Vec<f32>> {
        let m = self.resources.get::<ModelResource>("policy").unwrap();
        let s = m
            .lock::<flowrl_nodes::runtime::backend::CpuBackend>()
            .unwrap();
        s.copies
            .iter()
            .flatten()
            .map(|c| float_values(&c.model))
            .collect()
    }

    /// The policy's own weights in memory, parameter after parameter in module order.
    pub fn model_values(&self) -> Vec<f32> {
        let m = self.resources.get::<ModelResource>("policy").unwrap();
        let s = m
            .lock::<flowrl_nodes::runtime::backend::CpuBackend>()
            .unwrap();
        float_values(&s.model)
    }

    /// Saves the policy's checkpoint into `dir`.
    pub fn save(&self, dir: &std::path::Path) {
        let m = self.resources.get::<ModelResource>("policy").unwrap();
        m.save_to(dir).unwrap();
    }
}

/// Every float parameter's values of `module`, in module order.
fn float_values<B: burn::prelude::Backend, M: burn::module::Module<B>>(module: &M) -> Vec<f32> {
    use burn::module::{ModuleVisitor, Param};
    use burn::prelude::Tensor;
    struct Values(Vec<f32>);
    impl<B: burn::prelude::Backend> ModuleVisitor<B> for Values {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let v = param.val().into_data().convert::<f32>();
            self.0.extend_from_slice(v.as_slice::<f32>().unwrap());
        }
    }
    let mut v = Values(Vec::new());
    module.visit(&mut v);
    v.0
}

pub fn input<T: std::any::Any + Send + Sync>(
    node: &str,
    port: &str,
    ty: &'static str,
    v: Arc<T>,
) -> Inputs {
    let mut i = Inputs::new(node);
    i.insert(port, Value::new(PortType::new(ty), Payload::opaque_arc(v)));
    i
}

pub fn get<T: std::any::Any + Send + Sync>(out: &flowrl_engine::Outputs, port: &str) -> Arc<T> {
    out.get_arc::<T>(port).unwrap()
}

/// Every value of the F32 tensors of a safetensors file, tensors in name order; panics on a
/// tensor of another dtype.
pub fn f32_tensors(path: &std::path::Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(|s| s.to_string()).collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let t = st.tensor(&name).unwrap();
        assert_eq!(
            t.dtype(),
            safetensors::Dtype::F32,
            "{}: {name}",
            path.display()
        );
        out.extend(
            t.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
    }
    out
}

/// Everything one step of the graph produced.
pub struct Step {
    pub rollouts: Arc<RolloutBatch>,
    pub log_probs: Arc<TokenLogProbs>,
    pub update_metrics: Vec<(String, f64)>,
    pub sft_metrics: Vec<(String, f64)>,
}

/// One step: data, rollout and old log-probs of `b`, then [`update`].
pub fn step(b: &mut Built, step: u64) -> Step {
    let (prompts, rollouts) = rollout(b, step);
    let log_probs = log_probs(b, step, &rollouts);
    let (update_metrics, sft_metrics) = update(b, step, &prompts, &rollouts, &log_probs);
    Step {
        rollouts,
        log_probs,
        update_metrics,
        sft_metrics,
    }
}

/// The step's prompts and their rollouts under `b`'s policy.
pub fn rollout(b: &mut Built, step: u64) -> (Arc<PromptBatch>, Arc<RolloutBatch>) {
    let (out, _) = b.run("data", step, Inputs::new("data"));
    let prompts: Arc<PromptBatch> = get(&out, "prompts");
    let (out, _) = b.run(
        "rollout",
        step,
        input("rollout", "prompts", "Prompts", prompts.clone()),
    );
    (prompts, get(&out, "rollouts"))
}

/// The log-probs (and entropies) of `rollouts` under `b`'s policy.
pub fn log_probs(b: &mut Built, step: u64, rollouts: &Arc<RolloutBatch>) -> Arc<TokenLogProbs> {
    let (out, _) = b.run(
        "old",
        step,
        input("old", "rollouts", "Rollouts", rollouts.clone()),
    );
    get(&out, "log_probs")
}

/// The metrics of `b`'s update.ppo (fixed per-token advantages, `log_probs` as the old policy)
/// and update.sft on the step's inputs.
#[allow(clippy::type_complexity)]
pub fn update(
    b: &mut Built,
    step: u64,
    prompts: &Arc<PromptBatch>,
    rollouts: &Arc<RolloutBatch>,
    log_probs: &Arc<TokenLogProbs>,
) -> (Vec<(String, f64)>, Vec<(String, f64)>) {
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
    let (_, sft_metrics) = b.run(
        "sft",
        step,
        input("sft", "prompts", "Prompts", prompts.clone()),
    );
    (update_metrics, sft_metrics)
}

pub fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-3)
}

/// `b` computed what `a` computed over two steps: the same responses, log-probs within `lp_tol`,
/// every update metric within `rel`, and weights within `w_tol` after the steps.
pub fn assert_same_steps(
    a: &mut Built,
    b: &mut Built,
    what: &str,
    lp_tol: f32,
    rel: f64,
    w_tol: f32,
) {
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

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}
