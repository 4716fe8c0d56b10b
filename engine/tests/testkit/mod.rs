//! Test-only node and resource kinds (never registered in a shipped binary).
#![allow(dead_code)]

use flowrl_engine::progress::ProgressMode;
use flowrl_engine::run::RunOptions;
use flowrl_engine::rundir::read_metrics;
use flowrl_engine::*;
use rand::Rng;
use serde::Deserialize;
use std::any::Any;
use std::path::Path;
use std::sync::{Arc, Barrier, Mutex};

/// The graph most tests start from: two models, a source (plus `$src_line`, if given), an add, a
/// score and a train node; it compiles with [`registry`].
#[allow(unused_macros)]
macro_rules! good_graph {
    ($($src_line:literal)?) => {
        concat!(
            r#"
[run]
steps = 4
seed = 1

[models.policy]
init = 1.0
[models.reference]
from = "policy"

[nodes.src]
kind = "test.source"
count = 4
"#,
            $($src_line, "\n",)?
            r#"
[nodes.add]
kind = "test.add"
inputs = { a = "src.n" }

[nodes.score]
kind = "test.score"
inputs = { n = "add.sum" }
micro = 2

[nodes.train]
kind = "test.train"
model = "policy"
inputs = { n = "src.n" }
"#
        )
    };
}
#[allow(unused_imports)]
pub(crate) use good_graph;

/// `text` compiled as `g.toml` with `registry` and the `--set` arguments `sets`.
pub fn compile_sets(
    registry: &Registry,
    text: &str,
    sets: &[&str],
) -> Result<(Graph, Vec<Diagnostic>), Failure> {
    let o: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    compile(registry, "g.toml", text, &Override::sets(&o))
}

/// The graph of a compilation that must succeed; panics with the report otherwise.
pub fn compiled(result: Result<(Graph, Vec<Diagnostic>), Failure>) -> Graph {
    match result {
        Ok((g, _)) => g,
        Err(f) => panic!("{}", f.render()),
    }
}

/// [`compile_sets`], which must succeed.
pub fn graph(registry: &Registry, text: &str, sets: &[&str]) -> Graph {
    compiled(compile_sets(registry, text, sets))
}

/// (code, message) of every diagnostic of a compilation of `text` that must fail, and the
/// rendered report.
pub fn failed(
    result: Result<(Graph, Vec<Diagnostic>), Failure>,
    text: &str,
) -> (Vec<(Code, String)>, String) {
    match result {
        Ok(_) => panic!("expected errors for\n{text}"),
        Err(f) => (
            f.diagnostics
                .iter()
                .map(|d| (d.code, d.message.clone()))
                .collect(),
            f.render(),
        ),
    }
}

/// [`compile_sets`], which must fail: see [`failed`].
pub fn errors(registry: &Registry, text: &str, sets: &[&str]) -> (Vec<(Code, String)>, String) {
    failed(compile_sets(registry, text, sets), text)
}

/// Quiet options for a run into `out`, resumed or not.
pub fn run_options(out: &Path, resume: bool) -> RunOptions {
    RunOptions {
        graph_file: None,
        out: Some(out.to_path_buf()),
        resume,
        force: false,
        progress: ProgressMode::Quiet,
        cluster: None,
        plan: None,
    }
}

/// The metrics rows of the run in `dir`, without the wall-clock keys (`timing_s/`,
/// `perf/time_per_step`), which vary.
pub fn metrics(dir: &Path) -> Vec<Vec<(String, f64)>> {
    read_metrics(&dir.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .map(|r| {
            r.into_iter()
                .filter(|(k, _)| !k.starts_with("timing_s/") && k != "perf/time_per_step")
                .collect()
        })
        .collect()
}

/// A proptest configuration: `cases` cases from the fixed `seed`, no persistence file.
pub fn proptest_config(cases: u32, seed: u64) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 256,
        ..proptest::test_runner::Config::default()
    }
}

/// Copies the directory tree `from` to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

pub const NUMBERS: ValueType<Vec<f64>> = ValueType::new("Numbers");
pub const SCORES: ValueType<Vec<f64>> = ValueType::new("Scores");
/// A kind that draws `count` numbers per step; its parameters are [`SourceParams`].
pub const DRAWS: Capability = Capability::new("draws");

const N: Port<Vec<f64>> = Port::new("n", NUMBERS);

/// Emits `count` uniform draws scaled by `scale`, plus a running counter in its state.
pub struct Source;
#[derive(Clone, Copy, Debug, PartialEq, ParamChoice)]
pub enum Mode {
    Uniform,
    Normal,
}
#[derive(Deserialize, Params)]
pub struct SourceParams {
    #[param(default = 3, min = 1.0)]
    pub count: usize,
    #[param(default = 1.0, gt = 0.0)]
    pub scale: f64,
    #[param(default = Mode::Uniform)]
    pub mode: Mode,
    pub opts: SourceOpts,
}
#[derive(Deserialize, Params)]
pub struct SourceOpts {
    #[param(default = 0.5, min = 0.0)]
    pub coef: f64,
}
impl NodeKind for Source {
    fn name(&self) -> &str {
        "test.source"
    }
    fn doc(&self) -> &str {
        "Uniform numbers."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![N.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        SourceParams::param_specs()
    }
    fn capabilities(&self) -> Vec<Capability> {
        vec![DRAWS]
    }
    fn timing_key(&self) -> Option<&str> {
        Some("gen")
    }
    fn build(&self, p: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let p: SourceParams = p.parse()?;
        Ok(Box::new(SourceNode {
            count: p.count,
            scale: p.scale,
            calls: 0,
        }))
    }
}
struct SourceNode {
    count: usize,
    scale: f64,
    calls: u64,
}
impl Node for SourceNode {
    fn run(&mut self, _: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        self.calls += 1;
        let v: Vec<f64> = (0..self.count)
            .map(|_| ctx.rng().random::<f64>() * self.scale)
            .collect();
        ctx.metric("source/calls", self.calls as f64);
        Ok(Outputs::new().with(N, v))
    }
    fn save_state(&self) -> anyhow::Result<Option<serde_json::Value>> {
        Ok(Some(serde_json::json!({ "calls": self.calls })))
    }
    fn load_state(&mut self, s: serde_json::Value) -> anyhow::Result<()> {
        self.calls = s["calls"].as_u64().unwrap();
        Ok(())
    }
}

/// Sums its inputs element-wise; `b` optional.
pub struct Add;
const A: Port<Vec<f64>> = Port::new("a", NUMBERS);
const B: Port<Vec<f64>> = Port::new("b", NUMBERS);
const SUM: Port<Vec<f64>> = Port::new("sum", NUMBERS);
impl NodeKind for Add {
    fn name(&self) -> &str {
        "test.add"
    }
    fn doc(&self) -> &str {
        "a + b"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![A.spec(), B.spec().optional()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![SUM.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(AddNode))
    }
}
struct AddNode;
impl Node for AddNode {
    fn run(&mut self, i: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        let a = i.get(A)?;
        let s: Vec<f64> = match i.get_opt(B)? {
            Some(b) => a.iter().zip(b).map(|(x, y)| x + y).collect(),
            None => a.clone(),
        };
        ctx.metric("add/sum", s.iter().sum());
        Ok(Outputs::new().with(SUM, s))
    }
}

/// Numbers → Scores (mean), with a constraint: `count` of the upstream source divisible by `micro`.
pub struct Score;
const SCORES_PORT: Port<Vec<f64>> = Port::new("scores", SCORES);
#[derive(Deserialize, Params)]
struct ScoreParams {
    #[param(default = 1, min = 1.0)]
    micro: usize,
}
impl NodeKind for Score {
    fn name(&self) -> &str {
        "test.score"
    }
    fn doc(&self) -> &str {
        "mean score"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![N.spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![SCORES_PORT.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        ScoreParams::param_specs()
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let micro = match ctx.parse::<ScoreParams>() {
            Ok(p) => p.micro,
            Err(d) => return d,
        };
        let Some(src) = ctx.node().and_then(|n| n.find_upstream_with(DRAWS)) else {
            return vec![];
        };
        let count = src.params().parse::<SourceParams>().unwrap().count;
        if !count.is_multiple_of(micro) {
            return vec![
                ctx.error(
                    "micro",
                    format!(
                        "count {count} of `{}` is not divisible by micro = {micro}",
                        src.name()
                    ),
                )
                .with_help("choose a micro that divides count"),
            ];
        }
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(ScoreNode))
    }
}
struct ScoreNode;
impl Node for ScoreNode {
    fn run(&mut self, i: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        let n = i.get(N)?;
        let m = n.iter().sum::<f64>() / n.len() as f64;
        ctx.metric("critic/score/mean", m);
        Ok(Outputs::new().with(SCORES_PORT, vec![m]))
    }
}

/// Consumes Scores (for type mismatch tests), optionally fails at a step.
pub struct Sink;
#[derive(Deserialize, Params)]
struct SinkParams {
    /// 1-based step that fails
    fail_at: Option<u64>,
}
impl NodeKind for Sink {
    fn name(&self) -> &str {
        "test.sink"
    }
    fn doc(&self) -> &str {
        "takes scores"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![SCORES_PORT.spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn params(&self) -> Vec<ParamSpec> {
        SinkParams::param_specs()
    }
    fn build(&self, p: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let p: SinkParams = p.parse()?;
        Ok(Box::new(SinkNode { fail_at: p.fail_at }))
    }
}
struct SinkNode {
    fail_at: Option<u64>,
}
impl Node for SinkNode {
    fn run(&mut self, _: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        if self.fail_at == Some(ctx.step() + 1) {
            anyhow::bail!("loss is NaN");
        }
        Ok(Outputs::new())
    }
}

/// Emits only every `every` steps (skips otherwise).
pub struct Every;
#[derive(Deserialize, Params)]
struct EveryParams {
    #[param(default = 2, min = 1.0)]
    every: u64,
}
impl NodeKind for Every {
    fn name(&self) -> &str {
        "test.every"
    }
    fn doc(&self) -> &str {
        "sometimes"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![N.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        EveryParams::param_specs()
    }
    fn build(&self, p: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(EveryNode(p.parse::<EveryParams>()?.every)))
    }
}
struct EveryNode(u64);
impl Node for EveryNode {
    fn run(&mut self, _: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        if !ctx.step().is_multiple_of(self.0) {
            return Ok(Outputs::skipped());
        }
        Ok(Outputs::new().with(N, vec![1.0]))
    }
}

/// Waits on a shared barrier: two of these finish only if they run at the same time.
pub struct Rendezvous(pub Arc<Barrier>);
impl NodeKind for Rendezvous {
    fn name(&self) -> &str {
        "test.rendezvous"
    }
    fn doc(&self) -> &str {
        "barrier"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![N.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(RendezvousNode(self.0.clone())))
    }
}
struct RendezvousNode(Arc<Barrier>);
impl Node for RendezvousNode {
    fn run(&mut self, _: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
        self.0.wait();
        Ok(Outputs::new().with(N, vec![0.0]))
    }
}

/// A resource: a scalar "weight" behind a mutex, saved as text.
pub struct Weight(pub Mutex<f64>);
pub struct WeightKind;
#[derive(Deserialize, Params)]
struct WeightParams {
    #[param(default = 0.0)]
    init: f64,
    /// copy another model
    #[param(resource = "model")]
    from: Option<String>,
}
impl ResourceKind for WeightKind {
    fn name(&self) -> &str {
        "model"
    }
    fn section(&self) -> &str {
        "models"
    }
    fn doc(&self) -> &str {
        "a scalar model"
    }
    fn params(&self) -> Vec<ParamSpec> {
        WeightParams::param_specs()
    }
    fn build(&self, p: &Params, ctx: &BuildContext) -> anyhow::Result<ResourceValue> {
        let p: WeightParams = p.parse()?;
        let init = match &p.from {
            Some(src) => *ctx.resource::<Weight>(src)?.0.lock().unwrap(),
            None => p.init,
        };
        Ok(Arc::new(Weight(Mutex::new(init))))
    }
    fn save(&self, v: &(dyn Any + Send + Sync), dir: &Path) -> anyhow::Result<()> {
        let w = v.downcast_ref::<Weight>().unwrap();
        std::fs::write(dir.join("w.txt"), format!("{:?}", *w.0.lock().unwrap()))?;
        Ok(())
    }
    fn load(&self, v: &(dyn Any + Send + Sync), dir: &Path) -> anyhow::Result<()> {
        let w = v.downcast_ref::<Weight>().unwrap();
        *w.0.lock().unwrap() = std::fs::read_to_string(dir.join("w.txt"))?.parse()?;
        Ok(())
    }
}

/// Moves the model's weight by lr × mean(numbers) + noise; reports actor/pg_loss.
pub struct Train;
#[derive(Deserialize, Params)]
struct TrainParams {
    #[param(resource = "model", required)]
    model: String,
    #[param(default = 0.1, gt = 0.0)]
    lr: f64,
}
impl NodeKind for Train {
    fn name(&self) -> &str {
        "test.train"
    }
    fn doc(&self) -> &str {
        "train"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![N.spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn params(&self) -> Vec<ParamSpec> {
        TrainParams::param_specs()
    }
    fn build(&self, p: &Params, ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let p: TrainParams = p.parse()?;
        Ok(Box::new(TrainNode {
            model: ctx.resource::<Weight>(&p.model)?,
            lr: p.lr,
        }))
    }
}
struct TrainNode {
    model: Arc<Weight>,
    lr: f64,
}
impl Node for TrainNode {
    fn run(&mut self, i: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        let n = i.get(N)?;
        let noise: f64 = ctx.rng().random();
        let mut w = self.model.0.lock().unwrap();
        *w += self.lr * (n.iter().sum::<f64>() / n.len() as f64) + 1e-3 * noise;
        ctx.metric("actor/pg_loss", *w);
        Ok(Outputs::new())
    }
}

pub fn registry() -> Registry {
    Registry::new()
        .with_kind(Source)
        .with_kind(Add)
        .with_kind(Score)
        .with_kind(Sink)
        .with_kind(Every)
        .with_resource_kind(WeightKind)
        .with_kind(Train)
        .with_kind(Shard)
}

/// A data-parallel kind: its upstream source's numbers are split over all replicas, so their
/// `count` must divide evenly over `world_replicas` (checked by `validate`, as a real update
/// checks its mini-batch rows). Reports its placement as metrics.
pub struct Shard;
impl NodeKind for Shard {
    fn name(&self) -> &str {
        "test.shard"
    }
    fn doc(&self) -> &str {
        "numbers split over replicas"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![N.spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn data_parallel(&self) -> bool {
        true
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let Some(src) = ctx.node().and_then(|n| n.find_upstream_with(DRAWS)) else {
            return vec![];
        };
        let count = src.params().parse::<SourceParams>().unwrap().count;
        let replicas = ctx.world_replicas();
        if !count.is_multiple_of(replicas) {
            return vec![ctx.error(
                "inputs.n",
                format!(
                    "count {count} of `{}` does not split over {replicas} replicas ({} devices × {} processes)",
                    src.name(),
                    ctx.devices().len(),
                    ctx.world()
                ),
            )];
        }
        vec![]
    }
    fn build(&self, _: &Params, ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(ShardNode(ctx.placement.clone())))
    }
}
struct ShardNode(Placement);
impl Node for ShardNode {
    fn run(&mut self, _: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        ctx.metric("shard/local_replicas", self.0.local_replicas() as f64);
        ctx.metric("shard/world_replicas", self.0.world_replicas() as f64);
        ctx.metric("shard/first_replica", self.0.first_replica() as f64);
        Ok(Outputs::new())
    }
}

/// A kind whose build always fails (a missing file, say).
pub struct Unbuildable;
impl NodeKind for Unbuildable {
    fn name(&self) -> &str {
        "test.unbuildable"
    }
    fn doc(&self) -> &str {
        "fails to build"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        anyhow::bail!("weights file not found")
    }
}
