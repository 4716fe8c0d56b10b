//! The combination's tests: its parameters, the problems of its wiring, and the combined
//! scores of a step.

use std::sync::Arc;

use super::*;
use crate::kinds::reward::support::test_support::*;
use crate::values::{RolloutBatch, ScoreBatch};
use flowrl_engine::{Inputs, Payload, StepContext, Value};

/// Scores of `rollouts` with the given components.
fn scored(
    rollouts: &Arc<RolloutBatch>,
    scores: &[f32],
    components: &[(&str, &[f32])],
) -> ScoreBatch {
    ScoreBatch {
        rollouts: rollouts.clone(),
        scores: scores.to_vec(),
        components: components
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect(),
    }
}

/// Inputs of node `c`: `rollouts` when given, and each scores input by name.
fn wired(rollouts: Option<&Arc<RolloutBatch>>, scores: Vec<(&str, ScoreBatch)>) -> Inputs {
    let mut inputs = Inputs::new("c");
    if let Some(r) = rollouts {
        inputs.insert(
            ROLLOUTS.name(),
            Value::new(ROLLOUTS.port_type(), Payload::opaque_arc(r.clone())),
        );
    }
    for (name, batch) in scores {
        inputs.insert(name, Value::new(SCORES.port_type(), Payload::opaque(batch)));
    }
    inputs
}

/// Builds `reward.combined` with `weights` and runs it on `inputs`: its scores and metrics.
fn run(weights: Json, inputs: &Inputs) -> Result<(Arc<ScoreBatch>, StepContext)> {
    let p = params(serde_json::json!({ "weights": weights }));
    let mut node = CombinedRewardKind.build(&p, &build_ctx("c"))?;
    let mut c = ctx("c");
    let out = node.run(inputs, &mut c)?;
    Ok((out.get_arc(SCORES).expect("scores"), c))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

/// Two responses of one prompt, without the think/boxed format.
fn two_responses() -> Arc<RolloutBatch> {
    rollouts(&["7", "\\boxed{8}"], &["7", "7"], &["a", "a"], &[2, 2])
}

#[test]
fn weighted_sum_and_component_metrics() {
    let r = rollouts(
        &["<think>t</think> \\boxed{0.5}", "\\boxed{7}"],
        &["\\frac{1}{2}", "7"],
        &["a", "a"],
        &[2, 2],
    );
    let p =
        params(serde_json::json!({"weights": {"geo3k": 1.0, "exact_match": 0.5, "format": 0.0}}));
    let mut node = CombinedRewardKind.build(&p, &build_ctx("c")).unwrap();
    let mut c = ctx("c");
    node.run(&inputs("c", ROLLOUTS, (*r).clone()), &mut c)
        .unwrap();
    // Row 0: geo3k 1.0, exact 0 → 1.0. Row 1: geo3k 0.9, exact 1 → 1.4.
    assert!((metric(&c, "critic/score/mean") - 1.2).abs() < 1e-6);
    assert!((metric(&c, "critic/score/geo3k/mean") - 0.95).abs() < 1e-6);
    assert!((metric(&c, "critic/score/exact_match/mean") - 0.5).abs() < 1e-6);
    assert!((metric(&c, "critic/score/geo3k/format/mean") - 0.5).abs() < 1e-6);
    // geo3k is the one term with an accuracy: both answers are right.
    assert!((metric(&c, "critic/score/acc/mean") - 1.0).abs() < 1e-6);
    assert!(
        c.metrics()
            .iter()
            .all(|(n, _)| !n.starts_with("critic/score/format"))
    );
}

#[test]
fn all_zero_weights_cannot_build() {
    let p = params(serde_json::json!({"weights": {"geo3k": 0.0}}));
    assert!(CombinedRewardKind.build(&p, &build_ctx("c")).is_err());
}

#[test]
fn scores_inputs_are_weighted_and_logged_by_input_name() {
    let r = two_responses();
    let judge = scored(
        &r,
        &[1.0, 0.5],
        &[("acc", &[1.0, 0.0]), ("parse_failures", &[0.0, 1.0])],
    );
    // An input named like a built-in rule is that input: the `format` rule would give 0, 0.
    let format = scored(&r, &[1.0, 0.0], &[]);
    let inputs = wired(None, vec![("judge", judge), ("format", format)]);
    let (s, c) = run(serde_json::json!({"judge": 0.9, "format": 0.1}), &inputs).unwrap();
    // Σ wᵢ·sᵢ: 0.9·1 + 0.1·1 = 1, 0.9·0.5 + 0.1·0 = 0.45.
    assert_eq!(s.scores, [1.0, 0.45]);
    assert!(Arc::ptr_eq(&s.rollouts, &r));
    for (name, want) in [
        ("critic/score/mean", 0.725),
        ("critic/score/max", 1.0),
        ("critic/rewards/min", 0.45),
        ("critic/score/judge/mean", 0.75),
        ("critic/score/format/mean", 0.5),
        ("critic/score/judge/acc/mean", 0.5),
        ("critic/score/judge/parse_failures/mean", 0.5),
        ("critic/score/acc/mean", 0.5),
    ] {
        assert!(
            close(metric(&c, name), want),
            "{name}: {}",
            metric(&c, name)
        );
    }
    assert_eq!(
        s.components.keys().collect::<Vec<_>>(),
        [
            "acc",
            "format",
            "judge",
            "judge/acc",
            "judge/parse_failures"
        ]
    );
}

#[test]
fn rules_and_scores_inputs_mix_and_several_accuracies_give_no_acc() {
    let r = rollouts(
        &["<think>t</think> \\boxed{7}", "\\boxed{8}"],
        &["7", "7"],
        &["a", "a"],
        &[2, 2],
    );
    let judge = scored(&r, &[0.5, 0.5], &[("acc", &[1.0, 1.0])]);
    let inputs = wired(Some(&r), vec![("judge", judge)]);
    let (s, c) = run(serde_json::json!({"judge": 2.0, "geo3k": 1.0}), &inputs).unwrap();
    // geo3k: 1.0 and 0 (wrong, unformatted); judge 0.5 each, weighed 2.
    assert_eq!(s.scores, [2.0, 1.0]);
    assert!(close(metric(&c, "critic/score/geo3k/acc/mean"), 0.5));
    assert!(close(metric(&c, "critic/score/judge/acc/mean"), 1.0));
    assert!(
        !s.components.contains_key("acc"),
        "two terms have an accuracy"
    );

    // The rollouts of a rule that no input shadows, unwired: an error naming the rule.
    let inputs = wired(None, vec![("judge", scored(&r, &[0.5, 0.5], &[]))]);
    let e = run(serde_json::json!({"judge": 1.0, "geo3k": 1.0}), &inputs)
        .err()
        .expect("an error");
    assert!(e.to_string().contains("rule `geo3k`"), "{e}");
}

#[test]
fn terms_of_different_responses_are_an_error_naming_both() {
    let r = two_responses();
    let three = rollouts(
        &["a", "b", "c"],
        &["7", "7", "7"],
        &["a", "a", "b"],
        &[1, 1, 1],
    );
    let inputs = wired(
        None,
        vec![
            ("judge", scored(&r, &[1.0, 0.0], &[])),
            ("rm", scored(&three, &[1.0, 0.0, 1.0], &[])),
        ],
    );
    let e = run(serde_json::json!({"judge": 0.5, "rm": 0.5}), &inputs)
        .err()
        .expect("an error");
    let e = e.to_string();
    assert!(
        e.contains("input `judge` scores 2 responses and input `rm` 3"),
        "{e}"
    );

    let other_uids = rollouts(&["7", "7"], &["7", "7"], &["a", "b"], &[1, 1]);
    let inputs = wired(
        Some(&r),
        vec![("judge", scored(&other_uids, &[1.0, 0.0], &[]))],
    );
    let e = run(serde_json::json!({"judge": 1.0}), &inputs)
        .err()
        .expect("an error");
    let e = e.to_string();
    assert!(
        e.contains("input `rollouts` and input `judge` score different responses")
            && e.contains("response 1 has uid `a` in the one and `b` in the other"),
        "{e}"
    );
}

#[test]
fn a_zero_weight_leaves_its_input_out() {
    let r = two_responses();
    let inputs = wired(
        None,
        vec![
            ("judge", scored(&r, &[1.0, 0.0], &[("acc", &[1.0, 0.0])])),
            ("rm", scored(&r, &[0.25, 0.75], &[])),
        ],
    );
    let (s, c) = run(serde_json::json!({"judge": 0.0, "rm": 2.0}), &inputs).unwrap();
    assert_eq!(s.scores, [0.5, 1.5]);
    assert!(
        c.metrics()
            .iter()
            .all(|(n, _)| !n.contains("judge") && n != "critic/score/acc/mean"),
        "{:?}",
        c.metrics()
    );
}

#[test]
fn a_wired_input_without_a_value_skips_the_step() {
    let mut node = CombinedRewardNode {
        terms: vec![Term {
            name: "judge".into(),
            weight: 1.0,
            rule: None,
        }],
        wired: vec!["judge".into()],
    };
    let out = node.run(&Inputs::new("c"), &mut ctx("c")).unwrap();
    assert!(out.is_skipped());
}

#[test]
fn weights_must_be_a_table_of_finite_numbers() {
    let e = Weights(serde_json::json!(1.0)).by_name().unwrap_err();
    assert!(e.starts_with("`weights` must be a table of numbers"), "{e}");
    let e = Weights(serde_json::json!({"judge": "high"}))
        .by_name()
        .unwrap_err();
    assert_eq!(e, "`weights.judge` must be a finite number, got \"high\"");
    let w = Weights(serde_json::json!({"judge": 1, "format": 0.5}))
        .by_name()
        .unwrap();
    assert_eq!(w, [("format".to_string(), 0.5), ("judge".to_string(), 1.0)]);
}

/// The problems of `weights` on node `reward` with these scores inputs and `rollouts` wired
/// or not.
fn problems(weights: &[(&str, f64)], scores_inputs: &[&str], rollouts: bool) -> Vec<TermProblem> {
    let weights: Vec<(String, f64)> = weights.iter().map(|&(n, w)| (n.to_string(), w)).collect();
    let wiring = Wiring {
        node: "reward",
        scores_inputs: scores_inputs.to_vec(),
        rollouts,
        rollouts_producer: Some("rollout.rollouts".into()),
    };
    term_problems(&weights, &wiring)
}

#[test]
fn weights_that_fit_the_wiring_have_no_problem() {
    assert!(problems(&[("geo3k", 1.0)], &[], true).is_empty());
    let both = [("judge", 0.9), ("format", 0.1)];
    assert!(problems(&both, &["judge", "format"], false).is_empty());
    assert!(problems(&both, &["judge"], true).is_empty());
    // A zero weight on a rule needs no rollouts.
    assert!(problems(&[("judge", 1.0), ("geo3k", 0.0)], &["judge"], false).is_empty());
}

#[test]
fn a_weight_naming_nothing_says_what_it_could_name() {
    let p = problems(&[("jugde", 0.9), ("judge", 0.1)], &["judge"], false);
    assert_eq!(
        p,
        [TermProblem {
            at: ProblemAt::Weights,
            message: "`weights.jugde` names nothing: neither a scores input of `reward` \
                      (judge) nor a built-in rule (geo3k, exact_match, format)"
                .into(),
            help: Some("did you mean `judge`?".into()),
        }]
    );
    let p = problems(&[("geo3kk", 1.0)], &[], true);
    assert_eq!(p.len(), 1);
    assert!(p[0].message.contains("(none is wired)"), "{}", p[0].message);
    assert_eq!(p[0].help.as_deref(), Some("did you mean `geo3k`?"));
    let p = problems(&[("rollouts", 1.0)], &[], true);
    assert!(
        p[0].help
            .as_deref()
            .is_some_and(|h| h.contains("inputs = { rollouts = \"<node>.scores\" }")),
        "{p:?}"
    );
}

#[test]
fn a_scores_input_without_a_weight_is_a_problem_at_the_input() {
    let p = problems(&[("judge", 1.0)], &["judge", "rm"], false);
    assert_eq!(
        p,
        [TermProblem {
            at: ProblemAt::Input("rm".into()),
            message: "scores input `rm` of `reward` has no weight".into(),
            help: Some("add `rm = <weight>` to `weights` (0 leaves the term out)".into()),
        }]
    );
}

#[test]
fn a_rule_needs_rollouts_and_some_weight_must_be_non_zero() {
    let p = problems(&[("judge", 1.0), ("geo3k", 0.5)], &["judge"], false);
    assert_eq!(p.len(), 1);
    assert_eq!(
        p[0].message,
        "`weights.geo3k` weighs the built-in rule `geo3k`, which scores the `rollouts` input, \
         and `rollouts` is not wired"
    );
    assert_eq!(
        p[0].help.as_deref(),
        Some("wire it: `inputs = { rollouts = \"rollout.rollouts\" }`")
    );
    let p = problems(&[("judge", 0.0)], &["judge"], false);
    assert_eq!(
        p.iter().map(|p| p.message.as_str()).collect::<Vec<_>>(),
        [
            "`reward` needs at least one non-zero weight, on a scores input or a built-in rule \
          (geo3k, exact_match, format)"
        ]
    );
    assert_eq!(problems(&[], &[], true).len(), 1);
}
