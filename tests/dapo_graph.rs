//! graphs/dapo_vlm.toml: it validates and runs, and its dynamic sampling keeps no uniform group —
//! shown with a reward that makes exactly the groups of even-numbered prompts uniform, so every
//! step needs exactly two generation batches.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use flowrl_engine::{
    BuildContext, Inputs, Node, NodeKind, Outputs, ParamSpec, Params, PortSpec, Registry, Session,
    StepContext, compile,
};
use flowrl_nodes::ScoreBatch;
use flowrl_nodes::values::port_types;

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");
const GRAPH: &str = "graphs/dapo_vlm.toml";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn prompt_number(uid: &str) -> usize {
    uid.rsplit('-').next().unwrap().parse().unwrap()
}

/// `acc` is 1 for every response of an even-numbered prompt (a uniform group), and alternates
/// 1, 0, 1, … within the group of an odd-numbered one.
struct ParityReward;
impl NodeKind for ParityReward {
    fn name(&self) -> &str {
        "test.parity_reward"
    }
    fn doc(&self) -> &str {
        "uniform groups for even prompts"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("rollouts", port_types::ROLLOUTS)]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("scores", port_types::SCORES)]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(ParityNode))
    }
}
struct ParityNode;
impl Node for ParityNode {
    fn run(&mut self, inputs: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
        let rollouts = inputs.get_arc::<flowrl_nodes::RolloutBatch>("rollouts")?;
        let mut seen = std::collections::HashMap::new();
        let acc: Vec<f32> = rollouts
            .uid
            .iter()
            .map(|uid| {
                let k = seen.entry(uid.clone()).or_insert(0usize);
                *k += 1;
                if prompt_number(uid).is_multiple_of(2) {
                    1.0
                } else {
                    (*k % 2) as f32
                }
            })
            .collect();
        let batch = ScoreBatch {
            rollouts,
            scores: acc.clone(),
            components: [("acc".to_string(), acc)].into(),
        };
        Ok(Outputs::new().with_opaque("scores", batch))
    }
}

/// Per step: (uid, acc) of every response the probe saw.
type Seen = Arc<Mutex<Vec<Vec<(String, f32)>>>>;

/// Records the uids and `acc` values of the scores the update's advantage estimator receives.
struct Probe(Seen);
impl NodeKind for Probe {
    fn name(&self) -> &str {
        "test.probe"
    }
    fn doc(&self) -> &str {
        "records scores"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("scores", port_types::SCORES)]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(ProbeNode(self.0.clone())))
    }
}
struct ProbeNode(Seen);
impl Node for ProbeNode {
    fn run(&mut self, inputs: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
        let s = inputs.get_arc::<ScoreBatch>("scores")?;
        let rows = s
            .rollouts
            .uid
            .iter()
            .cloned()
            .zip(s.components["acc"].iter().copied())
            .collect();
        self.0.lock().unwrap().push(rows);
        Ok(Outputs::new())
    }
}

#[test]
fn no_uniform_group_reaches_the_update_and_extra_batches_are_counted() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::new();
    flowrl_nodes::register_builtin(&mut registry);
    let registry = registry
        .with_kind(ParityReward)
        .with_kind(Probe(seen.clone()));
    let text = std::fs::read_to_string(root().join(GRAPH))
        .unwrap()
        .replace("kind = \"reward.geo3k\"", "kind = \"test.parity_reward\"")
        + "\n[nodes.probe]\nkind = \"test.probe\"\ninputs = { scores = \"filter.scores\" }\n";
    let (graph, warnings) = match compile(&registry, GRAPH, &text, &[]) {
        Ok(g) => g,
        Err(f) => panic!("{}", f.render()),
    };
    assert!(warnings.is_empty());
    let mut session = Session::build(graph, None, None).unwrap();
    for step in 0..3 {
        let report = session.run_step(step, &mut |_| {}).unwrap();
        // 16 prompts per generation batch, 8 of them (the odd ones) kept: two batches a step.
        assert_eq!(report.metrics["train/num_gen_batches"], 2.0, "step {step}");
        assert!(report.metrics["actor/pg_loss"].is_finite());
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for (step, rows) in seen.iter().enumerate() {
        assert_eq!(rows.len(), 16 * 8, "step {step}: 16 groups of 8 responses");
        let mut groups: std::collections::BTreeMap<&str, Vec<f32>> = Default::default();
        for (uid, acc) in rows {
            groups.entry(uid).or_default().push(*acc);
        }
        assert_eq!(groups.len(), 16, "step {step}");
        for (uid, acc) in &groups {
            assert!(
                acc.iter().any(|&a| a != acc[0]),
                "step {step}: the uniform group {uid} ({acc:?}) reached the update"
            );
            assert!(!prompt_number(uid).is_multiple_of(2), "{uid}");
        }
    }
}

#[test]
fn the_dapo_graph_validates_and_runs_three_steps() {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(BIN)
        .current_dir(root())
        .args(["run", GRAPH, "--steps", "3", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let metrics = std::fs::read_to_string(out.path().join("metrics.jsonl")).unwrap();
    let mut lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Step 0, the evaluation before training (the dataset is repeated by the filter: the pass
    // runs it for its validation prompts), then the three steps.
    assert_eq!(lines[0]["step"], 0, "{metrics}");
    assert!(lines[0]["val/score"].is_number(), "{metrics}");
    lines.remove(0);
    assert_eq!(lines.len(), 3);
    for l in &lines {
        assert!(l["train/num_gen_batches"].as_f64().unwrap() >= 1.0, "{l}");
        assert!(
            l["critic/score/overlong_reward/mean"].as_f64().unwrap() <= 0.0,
            "{l}"
        );
        assert!(l["actor/pg_clipfrac_lower"].is_number(), "{l}");
    }
}
