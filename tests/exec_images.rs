//! `images = true` on an `exec` node, through the `flowrl` binary: a recording program gets, per
//! response, the paths of its prompt's pictures as PNG files that exist while it answers and hold
//! the dataset's pictures, only the latest step's folder is kept, and without the flag the
//! request is unchanged; the image-judge example trains a step of the default graph (its eval
//! scoring validation with a copy of it) and its scores, read from the pictures, reach the metrics.

mod common;

use common::{BIN, SMALL, jsonl, reward_swapped, root, small_task, training_steps};
use flowrl_datasets::images::decode_rgb;
use flowrl_datasets::synth::{DEFAULT_SEED, IMAGE_SIZE, sample};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROLLOUTS_ONLY: &str = "examples/python_reward/score_rollouts.toml";
const EXAMPLE: &str = "examples/python_reward/grpo_image_judge.toml";

/// Records each request with, per response, whether each picture file exists as it is read.
const RECORDER: &str = r#"import json, os, sys
record = open(sys.argv[1], "a")
print(json.dumps({"hello": {"protocol": 2, "name": "recorder", "version": "1",
    "inputs": [{"name": "rollouts", "type": "Rollouts"}],
    "outputs": [{"name": "scores", "type": "Scores"}]}}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    r = request["inputs"]["rollouts"]
    present = [[os.path.isfile(p) for p in paths] for paths in r.get("images", [])]
    record.write(json.dumps({"request": request, "present": present}) + "\n")
    record.flush()
    print(json.dumps({"step": request["step"],
                      "outputs": {"scores": {"scores": [0.0] * r["size"]}}}), flush=True)
"#;

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(root())
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `score_rollouts.toml` (data → rollout → exec reward, 2 steps, no eval) with the recorder as
/// its program; the graph's path and the record's.
fn recorder_graph(dir: &Path) -> (String, PathBuf) {
    let program = dir.join("recorder.py");
    std::fs::write(&program, RECORDER).unwrap();
    let record = dir.join("requests.jsonl");
    let graph = std::fs::read_to_string(root().join(ROLLOUTS_ONLY))
        .unwrap()
        .replace(
            "command = [\"python3\", \"examples/python_reward/reward.py\"]",
            &format!("command = [\"python3\", {:?}, {:?}]", program, record),
        )
        .replace("params = { format_score = 0.1 }", "");
    let path = dir.join("graph.toml");
    std::fs::write(&path, graph).unwrap();
    (path.display().to_string(), record)
}

#[test]
fn with_images_each_response_gets_its_prompts_pictures_and_without_them_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = small_task(dir.path());
    let data = format!("nodes.data.path={train}");
    let (graph, record) = recorder_graph(dir.path());

    let on = dir.path().join("on");
    let out = run(&[
        "run",
        &graph,
        "--out",
        on.to_str().unwrap(),
        "--set",
        &data,
        "--set",
        "nodes.reward.images=true",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got = jsonl(&record);
    assert_eq!(got.len(), 2, "one request per step");
    for (step, rec) in got.iter().enumerate() {
        let r = &rec["request"]["inputs"]["rollouts"];
        let size = r["size"].as_u64().unwrap() as usize;
        assert_eq!(size, 4, "2 prompts × n 2");
        let (images, tools) = (
            r["images"].as_array().unwrap(),
            r["tool_images"].as_array().unwrap(),
        );
        assert_eq!((images.len(), tools.len()), (size, size), "{r}");
        for i in 0..size {
            let prompt = r["prompt_index"][i].as_u64().unwrap();
            let expected = on
                .join(format!(
                    "exec_images/reward/step_{step:06}/prompt{prompt}_image0.png"
                ))
                .display()
                .to_string();
            assert_eq!(
                images[i],
                serde_json::json!([expected]),
                "response {i} of step {step}"
            );
            assert_eq!(
                tools[i],
                serde_json::json!([]),
                "single-turn: no tool pictures"
            );
            assert_eq!(
                rec["present"][i],
                serde_json::json!([true]),
                "the file exists while read"
            );
        }
    }
    // Only the latest step's pictures are kept; they are the dataset's, 56×56.
    assert!(!on.join("exec_images/reward/step_000000").exists());
    let last = &got[1]["request"]["inputs"]["rollouts"];
    for (i, paths) in last["images"].as_array().unwrap().iter().enumerate() {
        let png = std::fs::read(paths[0].as_str().unwrap()).unwrap();
        let picture = decode_rgb(&png).unwrap();
        assert_eq!(
            (picture.width(), picture.height()),
            (IMAGE_SIZE, IMAGE_SIZE)
        );
        assert_eq!(IMAGE_SIZE, 56);
        let row = last["extra_info"][i]["index"].as_u64().unwrap();
        assert!(
            picture == sample(DEFAULT_SEED, "train", row).image,
            "response {i}: the picture of training row {row}"
        );
    }

    std::fs::remove_file(&record).unwrap();
    let off = dir.path().join("off");
    let out = run(&[
        "run",
        &graph,
        "--out",
        off.to_str().unwrap(),
        "--set",
        &data,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for rec in jsonl(&record) {
        let r = &rec["request"]["inputs"]["rollouts"];
        assert!(
            r.get("images").is_none() && r.get("tool_images").is_none(),
            "{r}"
        );
        assert!(r.get("response").is_some());
    }
    assert!(!off.join("exec_images").exists());
}

#[test]
fn keep_images_without_images_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (graph, _) = recorder_graph(dir.path());
    let out = run(&["validate", &graph, "--set", "nodes.reward.keep_images=true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let e = text(&out.stderr);
    assert!(
        e.contains("W0501") && e.contains("`keep_images` does nothing without `images = true`"),
        "{e}"
    );
}

#[test]
fn the_image_judge_example_is_the_default_graph_with_its_reward() {
    let (r_ours, r_default) = reward_swapped(EXAMPLE);
    assert_eq!(r_ours["kind"], "exec");
    for key in ["inputs", "outputs"] {
        assert_eq!(r_ours[key], r_default[key], "the reward's {key}");
    }
}

fn number(line: &Json, key: &str) -> f64 {
    line[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no metric {key}: {line}"))
}

#[test]
fn the_image_judge_example_trains_a_step_and_its_scores_reach_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (train, val) = small_task(dir.path());
    let (train, val) = (
        format!("nodes.data.path={train}"),
        format!("nodes.data.val_path={val}"),
    );
    let out_dir = dir.path().join("run");
    let mut args = vec![
        "run",
        EXAMPLE,
        "--steps",
        "1",
        "--out",
        out_dir.to_str().unwrap(),
        "--set",
        &train,
        "--set",
        &val,
    ];
    args.extend(SMALL);
    let out = run(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let lines = common::metrics(&out_dir);
    let before = lines[0].clone();
    let step = &training_steps(lines)[0];
    // Validation is scored by the eval node's copy of the program, on the pictures too.
    let val_score = number(&before, "val/score");
    assert!((0.0..=1.0).contains(&val_score), "{before}");
    let (score, acc, light) = (
        number(step, "critic/score/mean"),
        number(step, "critic/score/acc/mean"),
        number(step, "critic/score/brightness/mean"),
    );
    assert!(
        light > 0.3 && light < 1.0,
        "the shapes' light pictures: {light}"
    );
    assert!(
        (score - (0.9 * acc + 0.1 * light)).abs() <= 1e-5,
        "score {score} = 0.9·acc {acc} + 0.1·brightness {light}"
    );
    assert_eq!(
        number(step, "judge/pictures_read"),
        4.0,
        "4 prompts, one picture each"
    );

    let folders = |node: &str| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(out_dir.join("exec_images").join(node))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    };
    let train_folders = folders("reward");
    assert_eq!(
        train_folders,
        vec![out_dir.join("exec_images/reward/step_000000")]
    );
    assert_eq!(std::fs::read_dir(&train_folders[0]).unwrap().count(), 4);
    let eval_folders = folders("eval/reward");
    assert_eq!(
        eval_folders.len(),
        1,
        "only the latest step's: {eval_folders:?}"
    );
    assert!(
        std::fs::read_dir(&eval_folders[0]).unwrap().count() >= 8,
        "8 validation prompts"
    );
}
