//! `sink.jsonl`: appends the values wired to it to a JSONL file, one line per step.
//!
//! Inputs are named by the graph (`inputs = { scores = "reward.scores", adv = "advantage.advantages" }`)
//! and accept any port type; each line is `{"step": N, "<input>": <value as JSON>, ...}`. Every
//! built-in port type has a JSON form (scores with their components, advantages and returns,
//! rollouts, log-probs, values, prompts); a plugin's value that cannot be serialized is recorded as
//! `{"opaque": "<Rust type>"}`. Lines are flushed per step, and a resumed run truncates nothing:
//! the file is append-only and its lines carry the step.

use flowrl_engine::{
    BuildContext, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec, Params, PortSpec,
    PortType, StepContext,
};
use serde::Deserialize;
use std::io::Write;
use std::path::PathBuf;

pub struct SinkJsonl;

#[derive(Deserialize, Params)]
struct SinkParams {
    /// output file; a relative path is inside the run directory
    #[param(default = "values.jsonl")]
    path: PathBuf,
    /// write every N steps (and at the last step)
    #[param(default = 1, min = 1)]
    every: u64,
}

impl NodeKind for SinkJsonl {
    fn name(&self) -> &str {
        "sink.jsonl"
    }
    fn doc(&self) -> &str {
        "Appends the values wired to it to a JSONL file, one line per step.\n\
         Inputs take any name and any port type: `inputs = { scores = \"reward.scores\" }`."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::variadic(PortType::ANY).doc("values to record, named as you like")]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }
    fn params(&self) -> Vec<ParamSpec> {
        SinkParams::param_specs()
    }
    /// Writes rows as they come: nothing the plan counts.
    fn footprint(&self, _: &flowrl_engine::PlanCtx) -> Option<flowrl_engine::Footprint> {
        Some(flowrl_engine::Footprint::default())
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let p: SinkParams = params.parse()?;
        let path = p.path;
        let path = match (&ctx.run_dir, path.is_relative()) {
            (Some(dir), true) => dir.join(path),
            _ => path,
        };
        Ok(Box::new(SinkNode {
            path,
            every: p.every,
        }))
    }
}

struct SinkNode {
    path: PathBuf,
    every: u64,
}

/// One JSON object with the step and every input's value.
pub fn record(step: u64, inputs: &Inputs) -> serde_json::Value {
    let mut obj = serde_json::Map::new();
    obj.insert("step".into(), (step + 1).into());
    for (port, v) in inputs.iter() {
        let json = v
            .to_json()
            .unwrap_or_else(|| serde_json::json!({ "opaque": v.type_name() }));
        obj.insert(port.to_string(), json);
    }
    serde_json::Value::Object(obj)
}

impl Node for SinkNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        if !(ctx.step() + 1).is_multiple_of(self.every) && !ctx.is_last_step() {
            return Ok(Outputs::skipped());
        }
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", self.path.display()))?;
        writeln!(f, "{}", serde_json::to_string(&record(ctx.step(), inputs))?)?;
        f.flush()?;
        Ok(Outputs::new())
    }
}

flowrl_engine::register_node_kind!(SinkJsonl);

#[cfg(test)]
mod tests {
    use super::*;
    use flowrl_engine::{DeviceSpec, Payload, Resources, Value};
    use std::sync::Arc;

    #[test]
    fn writes_one_line_per_step_with_values() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = BuildContext {
            node: "sink".into(),
            device: DeviceSpec::Cpu(0),
            placement: flowrl_engine::Placement::single(DeviceSpec::Cpu(0)),
            seed: 0,
            total_steps: 3,
            resources: Arc::new(Resources::default()),
            run_dir: Some(dir.path().to_path_buf()),
            graph: None,
        };
        let params = Params::from_map(
            serde_json::json!({"path": "v.jsonl", "every": 2})
                .as_object()
                .unwrap()
                .clone(),
        );
        let mut node = SinkJsonl.build(&params, &ctx).unwrap();
        for step in 0..3 {
            let mut inputs = Inputs::new("sink");
            let v = Value::new(PortType::new("Scores"), Payload::new(vec![step as f64]));
            inputs.insert("scores", v);
            let mut sc = StepContext::new(
                "sink",
                step,
                3,
                0,
                DeviceSpec::Cpu(0),
                Arc::new(Resources::default()),
            );
            node.run(&inputs, &mut sc).unwrap();
        }
        let text = std::fs::read_to_string(dir.path().join("v.jsonl")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        // every = 2: step 2, and the last step (3).
        assert_eq!(
            lines,
            vec![
                r#"{"scores":[1.0],"step":2}"#,
                r#"{"scores":[2.0],"step":3}"#
            ]
        );
    }
}
