//! One GRPO step of the default graph on a verl-style parquet with a `videos` column
//! (`tests/fixtures/data/verl_video_sample/`, frame lists of 2–4 frames, one row with a picture
//! too), with the tiny Qwen2-VL policy: the dataset node reads the videos, rollout samples with
//! the video embeddings in the prompts, and the update runs through them.

mod common;

use common::{SMALL, flowrl, metrics, training_steps};

#[test]
fn one_grpo_step_runs_on_a_video_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let data = "tests/fixtures/data/verl_video_sample";
    let train = format!("nodes.data.path={data}/train.parquet");
    let val = format!("nodes.data.val_path={data}/test.parquet");
    let mut args = vec![
        "run",
        common::GRAPH,
        "--out",
        out.to_str().unwrap(),
        "--steps",
        "1",
        "--set",
        &train,
        "--set",
        &val,
        "--set",
        "nodes.data.max_prompt_length=256",
    ];
    args.extend_from_slice(SMALL);
    flowrl(&args);
    let m = training_steps(metrics(&out));
    assert_eq!(m.len(), 1);
    let step = m[0].as_object().unwrap();
    let prompt_max = step["prompt_length/max"].as_f64().unwrap();
    // The longest prompt holds a video of 2 temporal patches (8 tokens) besides its text.
    assert!(prompt_max > 40.0, "prompt_length/max {prompt_max}");
    assert!(
        step.keys().any(|k| k.starts_with("actor/")),
        "no update metrics: {step:?}"
    );
}
