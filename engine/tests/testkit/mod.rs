//! Test-only node and resource kinds (never registered in a shipped binary).
#![allow(dead_code)]

use flowrl_engine::*;
use rand::Rng;
use serde::Deserialize;
use std::any::Any;
use std::path::Path;
use std::sync::{Arc, Barrier, Mutex};

pub const NUMBERS: PortType = PortType::new("Numbers");
pub const SCORES: PortType = PortType::new("Scores");

/// Emits `count` uniform draws scaled by `scale`, plus a running counter in its state.
pub struct Source;
#[derive(Deserialize)]
struct SourceP {
    count: usize,
    scale: f64,
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
        vec![PortSpec::new("n", NUMBERS)]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec::int("count").default(3).min(1.0),
            ParamSpec::float("scale").default(1.0).gt(0.0),
            ParamSpec::one_of("mode", &["uniform", "normal"]).default("uniform"),
            ParamSpec::table("opts", vec![ParamSpec::float("coef").default(0.5).min(0.0)]),
        ]
    }
    fn timing_key(&self) -> Option<&str> {
        Some("gen")
    }
    fn build(&self, p: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let p: SourceP = p.parse()?;
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
        Ok(Outputs::new().with("n", v))
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
impl NodeKind for Add {
    fn name(&self) -> &str {
        "test.add"
    }
    fn doc(&self) -> &str {
        "a + b"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            PortSpec::new("a", NUMBERS),
            PortSpec::new("b", NUMBERS).optional(),
        ]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("sum", NUMBERS)]
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
        let a: &Vec<f64> = i.get("a")?;
        let s: Vec<f64> = match i.get_opt::<Vec<f64>>("b")? {
            Some(b) => a.iter().zip(b).map(|(x, y)| x + y).collect(),
            None => a.clone(),
        };
        ctx.metric("add/sum", s.iter().sum());
        Ok(Outputs::new().with("sum", s))
    }
}

/// Numbers → Scores (mean), with a constraint: `count` of the upstream source divisible by `micro`.
pub struct Score;
impl NodeKind for Score {
    fn name(&self) -> &str {
        "test.score"
    }
    fn doc(&self) -> &str {
        "mean score"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("n", NUMBERS)]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("scores", SCORES)]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::int("micro").default(1).min(1.0)]
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let micro = ctx.params().get_i64("micro").unwrap();
        let Some(src) = ctx
            .node()
            .and_then(|n| n.find_upstream(|k| k == "test.source"))
        else {
            return vec![];
        };
        let count = src.params().get_i64("count").unwrap();
        if count % micro != 0 {
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
        let n: &Vec<f64> = i.get("n")?;
        let m = n.iter().sum::<f64>() / n.len() as f64;
        ctx.metric("critic/score/mean", m);
        Ok(Outputs::new().with("scores", vec![m]))
    }
}

/// Consumes Scores (for type mismatch tests), optionally fails at a step.
pub struct Sink;
impl NodeKind for Sink {
    fn name(&self) -> &str {
        "test.sink"
    }
    fn doc(&self) -> &str {
        "takes scores"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("scores", SCORES)]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::int("fail_at").doc("1-based step that fails")]
    }
    fn build(&self, p: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(SinkNode {
            fail_at: p.get_i64("fail_at").map(|x| x as u64),
        }))
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
        vec![PortSpec::new("n", NUMBERS)]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::int("every").default(2).min(1.0)]
    }
    fn build(&self, p: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(EveryNode(p.get_i64("every").unwrap() as u64)))
    }
}
struct EveryNode(u64);
impl Node for EveryNode {
    fn run(&mut self, _: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        if !ctx.step().is_multiple_of(self.0) {
            return Ok(Outputs::skipped());
        }
        Ok(Outputs::new().with("n", vec![1.0f64]))
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
        vec![PortSpec::new("n", NUMBERS)]
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
        Ok(Outputs::new().with("n", vec![0.0f64]))
    }
}

/// A resource: a scalar "weight" behind a mutex, saved as text.
pub struct Weight(pub Mutex<f64>);
pub struct WeightKind;
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
        vec![
            ParamSpec::float("init").default(0.0),
            ParamSpec::resource("from", "model").doc("copy another model"),
        ]
    }
    fn build(&self, p: &Params, ctx: &BuildContext) -> anyhow::Result<ResourceValue> {
        let init = match p.get_str("from") {
            Some(src) => *ctx.resource::<Weight>(src)?.0.lock().unwrap(),
            None => p.get_f64("init").unwrap(),
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
impl NodeKind for Train {
    fn name(&self) -> &str {
        "test.train"
    }
    fn doc(&self) -> &str {
        "train"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("n", NUMBERS)]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec::resource("model", "model").required(),
            ParamSpec::float("lr").default(0.1).gt(0.0),
        ]
    }
    fn build(&self, p: &Params, ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(TrainNode {
            model: ctx.resource::<Weight>(p.get_str("model").unwrap())?,
            lr: p.get_f64("lr").unwrap(),
        }))
    }
}
struct TrainNode {
    model: Arc<Weight>,
    lr: f64,
}
impl Node for TrainNode {
    fn run(&mut self, i: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        let n: &Vec<f64> = i.get("n")?;
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
        vec![PortSpec::new("n", NUMBERS)]
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
        let Some(src) = ctx
            .node()
            .and_then(|n| n.find_upstream(|k| k == "test.source"))
        else {
            return vec![];
        };
        let count = src.params().get_i64("count").unwrap() as usize;
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
