//! `debug.print`: prints the values wired to it (as JSON, shortened) to stderr every N steps.
//!
//! For looking at what flows through a graph while building it: `inputs = { r = "rollout.rollouts" }`.

use flowrl_engine::{
    BuildContext, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec, Params, PortSpec,
    PortType, StepContext,
};
use serde::Deserialize;

pub struct DebugPrint;

#[derive(Deserialize, Params)]
struct PrintParams {
    /// print every N steps
    #[param(default = 1, min = 1)]
    every: u64,
    /// longest text printed per value
    #[param(default = 400, min = 16)]
    max_chars: usize,
}

impl NodeKind for DebugPrint {
    fn name(&self) -> &str {
        "debug.print"
    }
    fn doc(&self) -> &str {
        "Prints the values wired to it (as JSON, shortened) to stderr every N steps.\n\
         Inputs take any name and any port type: `inputs = { r = \"rollout.rollouts\" }`."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::variadic(PortType::ANY).doc("values to print, named as you like")]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }
    fn params(&self) -> Vec<ParamSpec> {
        PrintParams::param_specs()
    }
    /// Writes rows as they come: nothing the plan counts.
    fn footprint(&self, _: &flowrl_engine::PlanCtx) -> Option<flowrl_engine::Footprint> {
        Some(flowrl_engine::Footprint::default())
    }

    fn build(&self, params: &Params, _ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let p: PrintParams = params.parse()?;
        Ok(Box::new(PrintNode {
            every: p.every,
            max_chars: p.max_chars,
        }))
    }
}

struct PrintNode {
    every: u64,
    max_chars: usize,
}

/// The lines printed for one step: `[step N] node.input (Type): json…` (JSON cut after
/// `max_chars` characters; values that cannot be serialized show their Rust type).
pub fn render(step: u64, node: &str, inputs: &Inputs, max_chars: usize) -> Vec<String> {
    inputs
        .iter()
        .map(|(port, v)| {
            let shown = match v.to_json() {
                None => format!("<opaque {}>", v.type_name()),
                Some(j) => {
                    let text = j.to_string();
                    let head: String = text.chars().take(max_chars).collect();
                    if text.chars().count() > max_chars {
                        format!("{head}…")
                    } else {
                        head
                    }
                }
            };
            format!("[step {}] {node}.{port} ({}): {shown}", step + 1, v.ty)
        })
        .collect()
}

impl Node for PrintNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        if !ctx.step().is_multiple_of(self.every) {
            return Ok(Outputs::skipped());
        }
        for line in render(ctx.step(), ctx.node_name(), inputs, self.max_chars) {
            eprintln!("{line}");
        }
        Ok(Outputs::new())
    }
}

flowrl_engine::register_node_kind!(DebugPrint);

#[cfg(test)]
mod tests {
    use super::*;
    use flowrl_engine::{Payload, Value};

    #[test]
    fn renders_shortened_json_and_opaque_values() {
        let mut inputs = Inputs::new("dbg");
        inputs.insert(
            "a",
            Value::new(PortType::new("Scores"), Payload::new(vec![0.25f64; 100])),
        );
        inputs.insert(
            "b",
            Value::new(
                PortType::new("Blob"),
                Payload::opaque(std::time::Instant::now()),
            ),
        );
        let lines = render(4, "dbg", &inputs, 20);
        assert_eq!(lines[0], "[step 5] dbg.a (Scores): [0.25,0.25,0.25,0.25…");
        assert_eq!(
            lines[1],
            "[step 5] dbg.b (Blob): <opaque std::time::Instant>"
        );
    }
}
