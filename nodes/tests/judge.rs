//! `reward.judge` against transformers: for the rows and responses of
//! tests/fixtures/judge/expected.json (made by make_reference.py beside it), the judge node's
//! score p+ / (p+ + p-) and its p+ and p- equal transformers' softmax probabilities of the label
//! tokens at the last position of the same rendered judge prompt, picture included, to 1e-5
//! (score) and 1e-4 relative (probabilities): f32 on both sides, reduction orders differing.

mod common;

use std::sync::Arc;

use common::{build_graph, input, root};
use flowrl_engine::DeviceSpec;
use flowrl_nodes::values::{RolloutBatch, ScoreBatch, TokenMatrix};
use serde_json::Value;

fn graph(expected: &Value) -> String {
    format!(
        r#"
[run]
steps = 1
seed = 1

[models.policy]
path = "assets/tiny-qwen2-vl"

[nodes.data]
kind = "dataset.parquet"
model = "policy"
path = "datasets/shapes/test.parquet"
batch_size = 3
shuffle = false
max_prompt_length = 128

[nodes.rollout]
kind = "rollout"
model = "policy"
inputs = {{ prompts = "data.prompts" }}
max_new_tokens = 4

[nodes.judge]
kind = "reward.judge"
model = "policy"
inputs = {{ rollouts = "rollout.rollouts" }}
template = {}
positive = {}
negative = {}
"#,
        expected["template"], expected["positive"], expected["negative"]
    )
}

#[test]
fn judge_scores_equal_transformers_probabilities() {
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/judge/expected.json")).unwrap(),
    )
    .unwrap();
    let cases = expected["cases"].as_array().unwrap();
    let mut built = build_graph(
        &graph(&expected),
        &root().join("assets/tiny-qwen2-vl"),
        vec![DeviceSpec::Cpu(0)],
        None,
    );
    let (out, _) = built.run("data", 0, flowrl_engine::Inputs::new("data"));
    let prompts = common::get::<flowrl_datasets::PromptBatch>(&out, "prompts");
    // The file's first rows, in order (shuffle = false).
    for c in cases {
        let row = c["row"].as_u64().unwrap() as usize;
        assert_eq!(prompts.prompts[row].source.row, row);
        assert_eq!(
            prompts.prompts[row].ground_truth,
            c["ground_truth"].as_str().unwrap()
        );
    }
    // The cases' responses as a rollout batch (the judge reads their text).
    let b = cases.len();
    let rollouts = RolloutBatch::for_prompts(
        prompts.clone(),
        cases
            .iter()
            .map(|c| c["row"].as_u64().unwrap() as usize)
            .collect(),
        vec![vec![1]; b],
        TokenMatrix::new(vec![1.0; b], b, 1).unwrap(),
        TokenMatrix::zeros(b, 1),
        cases
            .iter()
            .map(|c| c["response"].as_str().unwrap().to_string())
            .collect(),
        vec![false; b],
    );
    rollouts.check().unwrap();
    let (out, metrics) = built.run(
        "judge",
        0,
        input("judge", "rollouts", "Rollouts", Arc::new(rollouts)),
    );
    let scores = common::get::<ScoreBatch>(&out, "scores");
    for (r, c) in cases.iter().enumerate() {
        let want = c["score"].as_f64().unwrap();
        let got = scores.scores[r] as f64;
        assert!(
            (got - want).abs() <= 1e-5,
            "case {r}: score {got}, transformers {want}"
        );
        for (name, key) in [("p_positive", "p_positive"), ("p_negative", "p_negative")] {
            let (got, want) = (scores.components[name][r] as f64, c[key].as_f64().unwrap());
            assert!(
                (got - want).abs() <= 1e-4 * want,
                "case {r}: {name} {got}, transformers {want}"
            );
        }
    }
    // The responses differ in score: the comparison is not of a constant.
    let spread = scores.scores.iter().cloned().fold(f32::MIN, f32::max)
        - scores.scores.iter().cloned().fold(f32::MAX, f32::min);
    assert!(spread > 1e-3, "{:?}", scores.scores);
    assert!(
        metrics.iter().any(|(k, _)| k == "judge/seconds"),
        "{metrics:?}"
    );
}
