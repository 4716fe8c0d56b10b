//! graphs/grpo_vlm_judge.toml: GRPO rewarded by a VLM judge (reward.judge) combined with the
//! format reward (reward.combined over both nodes' scores) trains, from the judge's logits or
//! from its written verdicts; and a judge's bad settings are errors before the run (a label of
//! several tokens, a template without `{response}`, a context too short for prompt + response +
//! template, a verdict pattern without a capture group, an empty range).

mod common;

use std::process::Command;

use common::{BIN, SMALL, flowrl, metrics, root, training_steps};

const GRAPH: &str = "graphs/grpo_vlm_judge.toml";

#[test]
fn the_judge_graph_trains_three_steps_on_the_weighted_sum() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut args = vec!["run", GRAPH, "--steps", "3", "--out", out.to_str().unwrap()];
    args.extend_from_slice(SMALL);
    flowrl(&args);
    let lines = metrics(&out);
    // The eval node scores validation with the same combined reward (its copy of the chain).
    assert!(
        lines[0]["val-aux/flowrl/shapes/judge/mean@1"].is_number(),
        "{}",
        lines[0]
    );
    let steps = training_steps(lines);
    assert_eq!(steps.len(), 3);
    for m in &steps {
        let num = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("{k}: {m}"));
        let (judge, format) = (
            num("critic/score/judge/mean"),
            num("critic/score/format/mean"),
        );
        assert!(judge > 0.0 && judge < 1.0, "{m}");
        let want = 0.9 * judge + 0.1 * format;
        assert!(
            (num("critic/score/mean") - want).abs() <= 1e-6,
            "score {} vs 0.9·{judge} + 0.1·{format}",
            num("critic/score/mean")
        );
        assert!(num("critic/score/judge/p_positive/mean") > 0.0, "{m}");
        assert!(m["actor/grad_norm"].as_f64().unwrap() > 0.0, "{m}");
    }
}

#[test]
fn a_judge_that_writes_verdicts_scores_them_and_counts_what_does_not_parse() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut args = vec![
        "run",
        GRAPH,
        "--steps",
        "1",
        "--out",
        out.to_str().unwrap(),
        "--set",
        "nodes.judge.mode=\"generate\"",
        "--set",
        "nodes.judge.template=\"Question: {prompt}\\nAnswer: {response}\\nRate it from 0 to 10 in \\\\boxed{}.\"",
        "--set",
        "nodes.judge.range=[0, 10]",
        "--set",
        "nodes.judge.max_verdict_tokens=12",
        "--set",
        "nodes.judge.unparsable_score=0.25",
    ];
    args.extend_from_slice(SMALL);
    flowrl(&args);
    let m = &training_steps(metrics(&out))[0];
    let num = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("{k}: {m}"));
    // 4 prompts × 4 responses; each verdict parses or is counted.
    let (failures, parsed) = (
        num("judge/parse_failures"),
        num("critic/score/judge/parsed/mean"),
    );
    assert!((failures - 16.0 * (1.0 - parsed)).abs() < 1e-9, "{m}");
    let judge = num("critic/score/judge/mean");
    assert!((0.0..=1.0).contains(&judge), "{m}");
    if failures == 16.0 {
        // The tiny policy as a judge never boxes a number: every verdict takes the default.
        assert!((judge - 0.25).abs() < 1e-6, "{m}");
    }
}

/// `flowrl validate` of the judge graph with `sets`: its standard error (it must fail).
fn refused(sets: &[&str]) -> String {
    let mut c = Command::new(BIN);
    c.current_dir(root()).args(["validate", GRAPH]);
    for s in sets {
        c.args(["--set", s]);
    }
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(78), "{err}");
    err
}

#[test]
fn a_judges_bad_settings_are_errors_before_the_run() {
    let err = refused(&["nodes.judge.positive=\"Yes\""]);
    assert!(
        err.contains(
            "label `Yes` is 3 tokens of the judge's tokenizer (`Y` = 56, `e` = 68, `s` = 82): a \
             label must be one token"
        ),
        "{err}"
    );
    let err = refused(&["nodes.judge.template=\"Is this right? {prompt}\""]);
    assert!(
        err.contains("the template has no `{response}` slot"),
        "{err}"
    );
    let err = refused(&[
        "nodes.judge.mode=\"generate\"",
        "nodes.judge.verdict=\"Score: \\\\d+\"",
    ]);
    assert!(err.contains("has no capture group"), "{err}");
    let err = refused(&["nodes.judge.mode=\"generate\"", "nodes.judge.range=[1, 1]"]);
    assert!(
        err.contains("`range` must be [lo, hi] with hi > lo"),
        "{err}"
    );
    let err = refused(&["nodes.data.max_prompt_length=480"]);
    assert!(
        err.contains("the judge's context is 512 tokens")
            && err.contains("`data.max_prompt_length` 480 + max_new_tokens 16"),
        "{err}"
    );
}

/// The judge graph on two CPU devices, the judge (its model and its node) on `judge_device`
/// when given: the graph file's path in `dir`.
fn on_two_devices(dir: &std::path::Path, judge_device: Option<&str>) -> String {
    let mut text = std::fs::read_to_string(root().join(GRAPH))
        .unwrap()
        .replace("device = \"auto\"", "devices = [\"cpu:0\", \"cpu:1\"]");
    if let Some(d) = judge_device {
        for section in ["[models.judge]", "[nodes.judge]"] {
            text = text.replace(section, &format!("{section}\ndevice = \"{d}\""));
        }
    }
    let path = dir.join(format!("judge_{}.toml", judge_device.unwrap_or("first")));
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn a_judge_on_its_own_device_scores_as_on_the_policys() {
    let dir = tempfile::tempdir().unwrap();
    let run = |graph: &str, name: &str| {
        let out = dir.path().join(name);
        let mut args = vec!["run", graph, "--steps", "2", "--out", out.to_str().unwrap()];
        args.extend_from_slice(SMALL);
        flowrl(&args);
        let mut lines = metrics(&out);
        for line in &mut lines {
            line.as_object_mut().unwrap().remove("judge/seconds"); // wall clock
        }
        lines
    };
    let apart = on_two_devices(dir.path(), Some("cpu:1"));
    let graph = common::graph_json(&apart);
    let resources = graph["resources"].as_array().unwrap();
    let device = |name: &str| {
        let r = resources.iter().find(|r| r["name"] == name).unwrap();
        r["device"].as_str().unwrap().to_string()
    };
    assert_eq!(
        (device("policy"), device("judge")),
        ("cpu:0".into(), "cpu:1".into())
    );
    let together = run(&on_two_devices(dir.path(), None), "together");
    let apart = run(&apart, "apart");
    assert_eq!(training_steps(apart.clone()).len(), 2);
    common::assert_identical_metrics(&together, &apart, "the judge on cpu:1");
}

#[test]
fn a_model_placed_where_it_cannot_be_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let graph = on_two_devices(dir.path(), Some("cpu:1"));
    let validate = |sets: &[&str]| {
        let mut c = Command::new(BIN);
        c.current_dir(root()).args(["validate", &graph]);
        for s in sets {
            c.args(["--set", s]);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = validate(&["models.judge.device=\"cpu:2\""]);
    assert_eq!(code, Some(78), "{err}");
    assert!(
        err.contains("resource `judge` is placed on cpu:2, which is not one of the run's devices [cpu:0, cpu:1]"),
        "{err}"
    );
    let (code, err) = validate(&["models.policy.device=\"cpu:1\""]);
    assert_eq!(code, Some(78), "{err}");
    assert!(
        err.contains("a trained model lives on the run's first device"),
        "{err}"
    );
    // The node left on the first device: a warning that the plan counts its pass there.
    let (code, err) = validate(&["nodes.judge.device=\"cpu:0\""]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("the judge runs where its model `judge` lives, on cpu:1"),
        "{err}"
    );
}

#[test]
fn the_plan_counts_a_judge_that_writes_verdicts_as_a_rollout() {
    let phases = |sets: &[&str]| {
        let mut args = vec!["plan", GRAPH, "--json"];
        for s in sets {
            args.extend(["--set", s]);
        }
        let plan: serde_json::Value = serde_json::from_slice(&flowrl(&args).stdout).unwrap();
        let judge = plan["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "judge" && n["kind"] == "reward.judge")
            .unwrap()
            .clone();
        let names: Vec<String> = judge["phases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["phase"].as_str().unwrap().to_string())
            .collect();
        names
    };
    assert_eq!(phases(&[]), ["forward"]);
    // The verdicts' prefill and their KV cache while they decode.
    assert_eq!(
        phases(&["nodes.judge.mode=\"generate\""]),
        ["prefill", "decode"]
    );
}
