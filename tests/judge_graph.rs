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
