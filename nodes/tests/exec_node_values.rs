//! The `exec` node kind's steps, end to end (the harness is `common::exec`): the Python reward
//! example (its scores equal the Rust rules' and appear in the metrics), one process per run, and
//! per-token values out of a program padded to the batch.

mod common;

use std::sync::{Arc, Mutex};

use common::exec::{
    Collect, FakeRollouts, HELLO, RESPONSES, example, graph, rollouts, rust_score, script, session,
    step,
};
use flowrl_engine::{
    BuildContext, Inputs, Node, NodeKind, Outputs, ParamSpec, Params, PortSpec, PortType, Session,
    StepContext, compile,
};

#[test]
fn python_example_scores_match_the_rust_rules_and_reach_the_metrics() {
    let collect = Collect::default();
    let mut s = session(&graph(&["python3", &example()], ""), &collect);
    for i in 0..2 {
        let report = step(&mut s, i).unwrap();
        let got = &collect.0.lock().unwrap()[i as usize];
        let want: Vec<f64> = RESPONSES
            .iter()
            .map(|(r, t)| rust_score(r, t, 0.1))
            .collect();
        assert_eq!(got.scores.len(), RESPONSES.len());
        for (k, (g, w)) in got.scores.iter().zip(&want).enumerate() {
            assert!(
                (*g as f64 - w).abs() < 1e-6,
                "response {k}: python {g}, rust {w}"
            );
        }
        let mean = want.iter().sum::<f64>() / want.len() as f64;
        // flowrl logs the f32 scores like a built-in reward's.
        assert!((report.metrics["critic/score/mean"] - mean).abs() < 1e-6);
        assert!((report.metrics["critic/score/acc/mean"] - 4.0 / 6.0).abs() < 1e-6);
        assert_eq!(report.metrics["critic/score/format/mean"], 0.5);
        assert_eq!(
            report.metrics["reward/boxed_fraction"],
            4.0 / 6.0,
            "the program's own"
        );
        assert_eq!(got.components["acc"], vec![1.0, 0.0, 1.0, 0.0, 1.0, 1.0]);
        assert_eq!(got.components["format"], vec![1.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
        assert_eq!(
            got.rollouts.len(),
            RESPONSES.len(),
            "scores attached to the rollouts"
        );
        assert!(report.metrics.contains_key("timing_s/reward"));
    }
}

#[test]
fn the_program_starts_once_per_run() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("starts.log");
    let body = format!(
        "{HELLO}\nopen({log:?}, 'a').write('start\\n')\nhello()\nfor line in sys.stdin:\n    answer(ones(json.loads(line)))\n",
        log = log.display().to_string()
    );
    let prog = script(dir.path(), "once.py", &body);
    let collect = Collect::default();
    let mut s = session(&graph(&["python3", &prog], ""), &collect);
    for i in 0..3 {
        step(&mut s, i).unwrap();
    }
    drop(s);
    let starts = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        starts.lines().count(),
        1,
        "validation, build and three steps: one process"
    );
    assert_eq!(collect.0.lock().unwrap().len(), 3);
}

/// `test.any`: keeps every value wired to it, by port.
#[derive(Clone, Default)]
struct CollectAny(Arc<Mutex<Vec<(String, flowrl_engine::Value)>>>);
impl NodeKind for CollectAny {
    fn name(&self) -> &str {
        "test.any"
    }
    fn doc(&self) -> &str {
        "Collects any values for tests."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::variadic(PortType::ANY)]
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
impl Node for CollectAny {
    fn run(&mut self, inputs: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
        let mut v = self.0.lock().unwrap();
        for (port, value) in inputs.iter() {
            v.push((port.to_string(), value.clone()));
        }
        Ok(Outputs::new())
    }
}

#[test]
fn scores_in_and_per_token_values_out_are_padded_to_the_batch() {
    // rollouts → Python reward → a second program (Scores in; Advantages and TokenLogProbs out).
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        dir.path(),
        "adv.py",
        r#"
import json, sys
print(json.dumps({"hello": {"protocol": 1, "name": "adv", "version": "0",
    "inputs": [{"name": "scores", "type": "Scores"}],
    "outputs": [{"name": "advantages", "type": "Advantages"}, {"name": "logp", "type": "TokenLogProbs"}],
    "params": [{"name": "extra_token", "type": "bool", "default": False}]}}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    s = req["inputs"]["scores"]
    lens = s["rollouts"]["response_length"]
    assert s["size"] == len(s["scores"]) == len(lens) and set(s["components"]) == {"acc", "format"}
    m = sum(s["scores"]) / len(s["scores"])
    extra = 1 if req["params"]["extra_token"] else 0
    adv = [[x - m] * (n + extra) for x, n in zip(s["scores"], lens)]
    print(json.dumps({"outputs": {"advantages": {"advantages": adv},
                                  "logp": {"log_probs": [[-0.5] * n for n in lens]}}}), flush=True)
"#,
    );
    let text = |extra: &str| {
        format!(
            r#"[nodes.rollout]
kind = "test.rollouts"

[nodes.reward]
kind = "exec"
command = ["python3", {example:?}]
inputs = {{ rollouts = "rollout.rollouts" }}

[nodes.adv]
kind = "exec"
command = ["python3", {prog:?}]
inputs = {{ scores = "reward.scores" }}
{extra}

[nodes.sink]
kind = "test.any"
inputs = {{ adv = "adv.advantages", lp = "adv.logp" }}
"#,
            example = example()
        )
    };
    let sink = CollectAny::default();
    let registry = || {
        flowrl_nodes::builtin_registry()
            .with_kind(FakeRollouts)
            .with_kind(sink.clone())
    };
    let (g, _) = compile(&registry(), "graph.toml", &text(""), &[])
        .unwrap_or_else(|f| panic!("{}", f.render()));
    let mut s = Session::build(g, None, None).unwrap();
    s.run_step(0, &mut |_| {}).unwrap();
    let got = sink.0.lock().unwrap().clone();
    let value = |port: &str| got.iter().find(|(p, _)| p == port).unwrap().1.clone();
    let adv = value("adv");
    let adv = adv.downcast_ref::<flowrl_nodes::AdvantageBatch>().unwrap();
    let scores: Vec<f64> = RESPONSES
        .iter()
        .map(|(r, t)| rust_score(r, t, 0.1))
        .collect();
    let mean = scores.iter().sum::<f64>() / scores.len() as f64;
    let r = rollouts(1);
    assert_eq!(adv.advantages.shape(), [RESPONSES.len(), r.response_len()]);
    for (i, n) in r.response_lengths().into_iter().enumerate() {
        let row = adv.advantages.row(i);
        assert!(
            row[..n]
                .iter()
                .all(|&x| (x as f64 - (scores[i] - mean)).abs() < 1e-6),
            "{row:?}"
        );
        assert!(row[n..].iter().all(|&x| x == 0.0), "padding: {row:?}");
    }
    assert_eq!(
        adv.returns, adv.advantages,
        "returns default to the advantages"
    );
    let lp = value("lp");
    let lp = lp.downcast_ref::<flowrl_nodes::TokenLogProbs>().unwrap();
    assert_eq!(
        lp.log_probs.data.iter().filter(|&&x| x == -0.5).count(),
        r.response_lengths().iter().sum::<usize>()
    );
    assert!(lp.entropy.is_none());

    let (g, _) = compile(
        &registry(),
        "graph.toml",
        &text("params = { extra_token = true }"),
        &[],
    )
    .unwrap();
    let mut s = Session::build(g, None, None).unwrap();
    let e = format!("{:#}", s.run_step(0, &mut |_| {}).unwrap_err());
    assert!(
        e.contains(
            "output `advantages` has 2 values in row 0 of advantages, but response 0 has 1 tokens"
        ),
        "{e}"
    );
}
