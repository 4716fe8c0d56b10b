//! The harness of the `exec` node tests (`exec_node_*.rs`): graphs compiled with the built-in
//! registry plus a small rollout source and a score collector defined here, external programs
//! written as small Python scripts into a temporary directory, steps run through the engine's
//! `Session`.

use std::path::Path;
use std::sync::{Arc, Mutex};

use flowrl_engine::{
    BuildContext, Inputs, Node, NodeKind, Outputs, ParamSpec, Params, Port, PortSpec, Registry,
    Session, StepContext, StepReport, compile,
};
use flowrl_nodes::values::port_types;
use flowrl_nodes::{PromptBatch, RolloutBatch, ScoreBatch, TokenMatrix};

const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);
const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);

/// Responses and ground truths of the fake rollout source.
pub const RESPONSES: &[(&str, &str)] = &[
    ("<think>2+2</think> so \\boxed{4}", "4"),
    ("<think>hm</think> \\boxed{5}", "4"),
    ("\\boxed{ 7 }", "7"),
    ("no box at all", "3"),
    ("  3  ", "3"),
    ("<think>a\nb</think>\n\\boxed{x^2}", "x^2"),
];

pub fn rollouts(repeat: usize) -> RolloutBatch {
    let b = RESPONSES.len();
    let t = 4;
    let mut mask = TokenMatrix::zeros(b, t);
    let response_ids: Vec<Vec<u32>> = (0..b).map(|i| vec![7; 1 + i % t]).collect();
    for (i, ids) in response_ids.iter().enumerate() {
        mask.row_mut(i)[..ids.len()].fill(1.0);
    }
    RolloutBatch {
        prompts: Arc::new(PromptBatch {
            prompts: Vec::new(),
            pad_token_id: 0,
            image_token_id: None,
            epoch: 0,
        }),
        prompt_index: vec![0; b],
        uid: (0..b).map(|i| format!("u{}", i / 2)).collect(),
        prompt_ids: vec![vec![1, 2]; b],
        response_ids,
        response_mask: mask,
        sampling_log_probs: TokenMatrix::zeros(b, t),
        ground_truth: RESPONSES.iter().map(|r| r.1.to_string()).collect(),
        data_source: vec!["test".into(); b],
        response_text: RESPONSES.iter().map(|r| r.0.repeat(repeat)).collect(),
        truncated: vec![false; b],
        trajectories: Vec::new(),
    }
}

/// `test.rollouts`: emits the fixed batch above every step (each text repeated `copies` times; `repeat` is an engine key).
pub struct FakeRollouts;
impl NodeKind for FakeRollouts {
    fn name(&self) -> &str {
        "test.rollouts"
    }
    fn doc(&self) -> &str {
        "Fixed rollouts for tests."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![ROLLOUTS.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::int("copies").default(1).min(1)]
    }
    fn build(&self, params: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let repeat = params.get_i64("copies").unwrap_or(1) as usize;
        Ok(Box::new(FakeRolloutsNode(repeat)))
    }
}
struct FakeRolloutsNode(usize);
impl Node for FakeRolloutsNode {
    fn run(&mut self, _: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
        Ok(Outputs::new().with_opaque(ROLLOUTS, rollouts(self.0)))
    }
}

/// `test.collect`: keeps every `ScoreBatch` it receives (a downstream consumer of typed values).
#[derive(Clone, Default)]
pub struct Collect(pub Arc<Mutex<Vec<ScoreBatch>>>);
impl NodeKind for Collect {
    fn name(&self) -> &str {
        "test.collect"
    }
    fn doc(&self) -> &str {
        "Collects scores for tests."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![SCORES.spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }
    fn params(&self) -> Vec<ParamSpec> {
        Vec::new()
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(self.clone()))
    }
}
impl Node for Collect {
    fn run(&mut self, inputs: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
        let s = inputs.get(SCORES)?;
        self.0.lock().unwrap().push(s.clone());
        Ok(Outputs::new())
    }
}

pub fn registry(collect: &Collect) -> Registry {
    flowrl_nodes::builtin_registry()
        .with_kind(FakeRollouts)
        .with_kind(collect.clone())
}

/// The example program, from the `nodes` package directory (where `cargo test` runs).
pub fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/python_reward/reward.py")
        .display()
        .to_string()
}

/// A graph: fake rollouts → `reward` (exec, running `command`) → collector. `extra` is added to
/// the exec node's table.
pub fn graph(command: &[&str], extra: &str) -> String {
    let cmd: Vec<String> = command.iter().map(|c| format!("{c:?}")).collect();
    format!(
        r#"[run]
steps = 3

[nodes.rollout]
kind = "test.rollouts"

[nodes.reward]
kind = "exec"
command = [{}]
inputs = {{ rollouts = "rollout.rollouts" }}
{extra}

[nodes.sink]
kind = "test.collect"
inputs = {{ scores = "reward.scores" }}
"#,
        cmd.join(", ")
    )
}

/// Writes a Python script into `dir` and returns its path.
pub fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path.display().to_string()
}

/// The handshake of a scorer program (one `rollouts` input, one `scores` output).
pub const HELLO: &str = r#"
import json, sys, os, time
def hello(outputs_type="Scores", params=None):
    print(json.dumps({"hello": {"protocol": 1, "name": "t", "version": "0",
        "inputs": [{"name": "rollouts", "type": "Rollouts"}],
        "outputs": [{"name": "scores", "type": outputs_type}],
        "params": params or []}}), flush=True)
def answer(obj):
    print(json.dumps(obj), flush=True)
def ones(req):
    n = req["inputs"]["rollouts"]["size"]
    return {"outputs": {"scores": {"scores": [1.0] * n}}}
"#;

pub fn check_fails(text: &str) -> String {
    let collect = Collect::default();
    match compile(&registry(&collect), "graph.toml", text, &[]) {
        Ok(_) => panic!("the graph compiled"),
        Err(f) => f.render(),
    }
}

pub fn session(text: &str, collect: &Collect) -> Session {
    let (graph, _) = compile(&registry(collect), "graph.toml", text, &[])
        .unwrap_or_else(|f| panic!("{}", f.render()));
    Session::build(graph, None, None).unwrap()
}

pub fn step(s: &mut Session, i: u64) -> anyhow::Result<StepReport> {
    s.run_step(i, &mut |_| {})
}

/// `(1 - w)·exact_match + w·format`, the rule the example implements, from flowrl's Rust rewards.
pub fn rust_score(response: &str, truth: &str, w: f64) -> f64 {
    use flowrl_algorithms::rewards::{exact_match_reward, format_reward};
    (1.0 - w) * exact_match_reward(response, truth) + w * format_reward(response)
}
