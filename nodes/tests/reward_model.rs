//! `reward.model` against transformers: for the rows and responses of
//! tests/fixtures/reward_model/expected.json (made by make_reference.py beside it, with the
//! reward model tests/fixtures/reward_model/model: the tiny Qwen2-VL plus a `score` head stored
//! in its model.safetensors, the `*ForSequenceClassification` layout), the node's score equals
//! transformers' `score(last_hidden_state[0, -1])` over the same prompt (picture included) and
//! response ids, to 1e-4 (f32 on both sides, reduction orders differing). A value model whose
//! directory stores no head is refused, at validation and at build.

mod common;

use std::sync::Arc;

use common::{input, root};
use flowrl_engine::{DeviceSpec, Inputs, Registry, compile};
use flowrl_models::weights::Precision;
use flowrl_nodes::resources::model::ModelResource;
use flowrl_nodes::values::{RolloutBatch, ScoreBatch, TokenMatrix};
use serde_json::Value;

const MODEL: &str = "tests/fixtures/reward_model/model";

fn graph(model_dir: &str) -> String {
    format!(
        r#"
[run]
steps = 1
seed = 1

[models.policy]
path = "{model_dir}"
value_head = true
trainable = false
precision = "f32"

[nodes.data]
kind = "dataset.parquet"
model = "policy"
path = "datasets/shapes/test.parquet"
batch_size = 2
shuffle = false
max_prompt_length = 128

[nodes.rollout]
kind = "rollout"
model = "policy"
inputs = {{ prompts = "data.prompts" }}
max_new_tokens = 16

[nodes.rm]
kind = "reward.model"
model = "policy"
inputs = {{ rollouts = "rollout.rollouts" }}
micro_batch_size = 4
"#
    )
}

/// The reward model of [`MODEL`] (or of `dir`), as `graph`'s `[models.policy]` loads it.
fn reward_model(dir: &str) -> ModelResource {
    ModelResource::load_value_model(
        "policy",
        &root().join(dir),
        false,
        None,
        DeviceSpec::Cpu(0),
        Some(Precision::F32),
        7,
    )
    .unwrap()
}

fn build(policy: ModelResource) -> anyhow::Result<common::Built> {
    common::build_over(&graph(MODEL), policy, vec![DeviceSpec::Cpu(0)])
}

#[test]
fn reward_model_scores_equal_transformers_sequence_classification() {
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/reward_model/expected.json")).unwrap(),
    )
    .unwrap();
    let cases = expected["cases"].as_array().unwrap();
    let mut built = build(reward_model(MODEL)).unwrap();
    let (out, _) = built.run("data", 0, Inputs::new("data"));
    let prompts = common::get::<flowrl_datasets::PromptBatch>(&out, "prompts");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    // The file's first rows, in order (shuffle = false), encoded as transformers' side was.
    for c in cases {
        let row = c["row"].as_u64().unwrap() as usize;
        assert_eq!(prompts.prompts[row].source.row, row);
        assert_eq!(
            prompts.prompts[row].input_ids,
            ids(&c["prompt_ids"]),
            "row {row}'s prompt ids"
        );
    }
    let b = cases.len();
    let responses: Vec<Vec<u32>> = cases.iter().map(|c| ids(&c["response_ids"])).collect();
    let t = responses.iter().map(Vec::len).max().unwrap();
    let mut mask = TokenMatrix::zeros(b, t);
    for (r, ids) in responses.iter().enumerate() {
        mask.row_mut(r)[..ids.len()].fill(1.0);
    }
    assert!(responses.iter().any(Vec::is_empty) && responses.iter().any(|r| r.len() == t));
    let rollouts = RolloutBatch::for_prompts(
        prompts.clone(),
        cases
            .iter()
            .map(|c| c["row"].as_u64().unwrap() as usize)
            .collect(),
        responses,
        mask,
        TokenMatrix::zeros(b, t),
        cases
            .iter()
            .map(|c| c["response"].as_str().unwrap().to_string())
            .collect(),
        vec![false; b],
    );
    rollouts.check().unwrap();
    let (out, _) = built.run(
        "rm",
        0,
        input("rm", "rollouts", "Rollouts", Arc::new(rollouts)),
    );
    let scores = common::get::<ScoreBatch>(&out, "scores");
    let mut max_diff = 0f64;
    for (r, c) in cases.iter().enumerate() {
        let want = c["score"].as_f64().unwrap();
        let got = scores.scores[r] as f64;
        max_diff = max_diff.max((got - want).abs());
        assert!(
            (got - want).abs() <= 1e-4,
            "case {r} ({:?}): score {got}, transformers {want}",
            c["response"]
        );
    }
    eprintln!("reward.model vs transformers: max |difference| {max_diff:e}");
    // The responses differ in score: the comparison is not of a constant.
    let spread = scores.scores.iter().cloned().fold(f32::MIN, f32::max)
        - scores.scores.iter().cloned().fold(f32::MAX, f32::min);
    assert!(spread > 0.1, "{:?}", scores.scores);
}

#[test]
fn a_reward_model_without_a_stored_head_is_refused() {
    // At validation: the directory is read.
    std::env::set_current_dir(root()).unwrap();
    let failure = compile(
        &Registry::builtin(),
        "rm.toml",
        &graph("assets/tiny-qwen2-vl"),
        &[],
    )
    .err()
    .expect("a reward model without a head validates");
    let text = failure.render();
    for needle in [
        "has no `score` head",
        "assets/tiny-qwen2-vl",
        "value_head.safetensors",
        "*ForSequenceClassification",
    ] {
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    // At build: a value model whose head was drawn fresh.
    let err = match build(reward_model("assets/tiny-qwen2-vl")) {
        Ok(_) => panic!("a reward model with a fresh head was built"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("has no `score` head") && err.contains("tiny-qwen2-vl"),
        "{err}"
    );
}
