//! `reward.combined` over other reward nodes' scores, through the `flowrl` binary: the default
//! GRPO graph with its reward replaced by 0.9 × `reward.geo3k` + 0.1 × `reward.format` trains
//! one step, logging the combined score as the weighted sum of the logged terms, each term's
//! components and the one term's accuracy; `eval` scores validation with a copy of the
//! combination (or a repeated instance of it): the same sum, and geo3k's accuracy; `flowrl
//! validate` names a weight that names nothing, an input without a weight, a rule without
//! rollouts and an input that is not Scores.

mod common;

use std::process::Command;

use common::{BIN, GRAPH, SMALL, flowrl, metrics, root, small_task, training_steps};
use serde_json::Value;

/// The default graph's reward node, which the tests replace.
const DEFAULT_REWARD: &str =
    "[nodes.reward]\nkind = \"reward.geo3k\"\ninputs = { rollouts = \"rollout.rollouts\" }\n";

/// The default graph's eval inputs.
const DEFAULT_EVAL_INPUTS: &str =
    "inputs = { prompts = \"data.val_prompts\", after = \"update.done\" }";

/// Two reward nodes on the rollouts and their combination, `combined_inputs` and
/// `combined_weights` being its `inputs` and `weights` tables.
fn reward_nodes(combined_inputs: &str, combined_weights: &str) -> String {
    format!(
        "[nodes.geo3k_reward]\nkind = \"reward.geo3k\"\ninputs = {{ rollouts = \"rollout.rollouts\" }}\n\n\
         [nodes.format_reward]\nkind = \"reward.format\"\ninputs = {{ rollouts = \"rollout.rollouts\" }}\n\n\
         [nodes.reward]\nkind = \"reward.combined\"\ninputs = {combined_inputs}\nweights = {combined_weights}\n"
    )
}

/// The default graph with `rewards` instead of its reward node.
fn graph_with_rewards(rewards: &str) -> String {
    let text = std::fs::read_to_string(root().join(GRAPH)).unwrap();
    assert!(
        text.contains(DEFAULT_REWARD),
        "{GRAPH} changed its reward node"
    );
    text.replace(DEFAULT_REWARD, rewards)
}

/// Two reward nodes on the rollouts, geo3k and format, and `reward` = 0.9 × geo3k + 0.1 × format.
fn combination() -> String {
    reward_nodes(
        "{ geo = \"geo3k_reward.scores\", fmt = \"format_reward.scores\" }",
        "{ geo = 0.9, fmt = 0.1 }",
    )
}

/// The default graph with [`combination`] as its reward; `eval` scores validation with its
/// default, a copy of `reward` and of the reward nodes it reads.
fn combined_graph() -> String {
    graph_with_rewards(&combination())
}

/// [`combined_graph`] with its validation scored by another instance of the combination, which
/// `eval` repeats on each chunk of its responses.
fn combined_graph_with_repeated_validation() -> String {
    let validation = combination()
        .replace("[nodes.", "[nodes.val_")
        .replace("\"rollout.rollouts\"", "\"eval.rollouts\"")
        .replace("= \"geo3k_reward.", "= \"val_geo3k_reward.")
        .replace("= \"format_reward.", "= \"val_format_reward.")
        .replace("\ninputs", "\ntiming = \"eval\"\ninputs");
    let text = combined_graph();
    assert!(
        text.contains(DEFAULT_EVAL_INPUTS),
        "{GRAPH} changed its eval node"
    );
    let eval = "repeat = [\"val_geo3k_reward\", \"val_format_reward\", \"val_reward\"]\n\
         inputs = { prompts = \"data.val_prompts\", after = \"update.done\", scores = \"val_reward.scores\" }";
    format!("{}\n{validation}", text.replace(DEFAULT_EVAL_INPUTS, eval))
}

/// `flowrl validate` of `graph` (its text): (success, stderr).
fn validate(graph: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("graph.toml");
    std::fs::write(&file, graph).unwrap();
    let out = Command::new(BIN)
        .current_dir(root())
        .arg("validate")
        .arg(&file)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn number(line: &Value, key: &str) -> f64 {
    line[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no metric {key}: {line}"))
}

/// The metrics lines of a one-step run of `graph` (its text) on a small task with small
/// settings, with `args` appended.
fn run_one_step(graph: &str, args: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("graph.toml");
    std::fs::write(&file, graph).unwrap();
    let (train, val) = small_task(dir.path());
    let (train, val) = (
        format!("nodes.data.path={train}"),
        format!("nodes.data.val_path={val}"),
    );
    let run = dir.path().join("run");
    let mut all = vec!["run", file.to_str().unwrap(), "--steps", "1"];
    all.extend([
        "--out",
        run.to_str().unwrap(),
        "--set",
        &train,
        "--set",
        &val,
    ]);
    all.extend(SMALL);
    all.extend(args);
    flowrl(&all);
    metrics(&run)
}

#[test]
fn the_combined_score_is_the_weighted_sum_of_the_reward_nodes_scores() {
    let lines = run_one_step(&combined_graph(), &[]);
    assert!(
        lines[1].get("val/score").is_some(),
        "the last step evaluates"
    );
    let step = &training_steps(lines)[0];
    assert_eq!(step["step"], 1);
    // Per response score = 0.9·geo3k + 0.1·format in f32, so the means agree to f32 rounding.
    let (score, geo, fmt) = (
        number(step, "critic/score/mean"),
        number(step, "critic/score/geo/mean"),
        number(step, "critic/score/fmt/mean"),
    );
    assert!(
        (score - (0.9 * geo + 0.1 * fmt)).abs() <= 1e-6,
        "score {score}, geo3k {geo}, format {fmt}"
    );
    assert!(
        score > 0.0,
        "the warm-started policy earns some reward: {step}"
    );
    assert_eq!(number(step, "critic/rewards/mean"), score);
    // geo3k's components under its term's name, and its accuracy, the only one, as `acc`.
    for key in ["critic/score/geo/acc/mean", "critic/score/geo/format/mean"] {
        assert!((0.0..=1.0).contains(&number(step, key)), "{key}: {step}");
    }
    assert_eq!(
        number(step, "critic/score/acc/mean"),
        number(step, "critic/score/geo/acc/mean")
    );
}

#[test]
fn validation_scores_with_the_combination_its_weighted_sum_and_one_accuracy() {
    // The evaluation before training generates the same greedy responses in every run: scored
    // by a copy of the combination (eval's default), by the repeated instance, by geo3k alone
    // and by format alone.
    let before_training = |lines: Vec<Value>| lines.into_iter().next().expect("step 0");
    let by_default = before_training(run_one_step(&combined_graph(), &[]));
    let repeated = before_training(run_one_step(
        &combined_graph_with_repeated_validation(),
        &[],
    ));
    let [geo3k, format] = ["geo3k", "format"].map(|rule| {
        let choice = format!("nodes.eval.reward={rule}");
        before_training(run_one_step(&combined_graph(), &["--set", &choice]))
    });
    for key in ["val/score", "val/accuracy"] {
        assert_eq!(number(&by_default, key), number(&repeated, key), "{key}");
    }
    let (score, geo, fmt) = (
        number(&by_default, "val/score"),
        number(&geo3k, "val/score"),
        number(&format, "val/score"),
    );
    assert!(
        (score - (0.9 * geo + 0.1 * fmt)).abs() <= 1e-6,
        "val/score {score}, geo3k {geo}, format {fmt}"
    );
    // The accuracy is geo3k's, the one term with an `acc` component.
    assert_eq!(
        number(&by_default, "val/accuracy"),
        number(&geo3k, "val/accuracy")
    );
}

#[test]
fn the_combined_graphs_and_the_rule_form_validate() {
    for graph in [combined_graph(), combined_graph_with_repeated_validation()] {
        let (ok, stderr) = validate(&graph);
        assert!(ok, "{stderr}");
        assert!(!stderr.contains("cannot size"), "{stderr}");
    }
    let rules = graph_with_rewards(
        "[nodes.reward]\nkind = \"reward.combined\"\ninputs = { rollouts = \"rollout.rollouts\" }\n\
         weights = { geo3k = 0.9, format = 0.1 }\n",
    );
    let (ok, stderr) = validate(&rules);
    assert!(ok, "{stderr}");
}

#[test]
fn validate_names_a_weight_that_names_nothing() {
    let rewards = reward_nodes(
        "{ geo = \"geo3k_reward.scores\", fmt = \"format_reward.scores\" }",
        "{ geo = 0.9, fmtt = 0.1 }",
    );
    let (ok, stderr) = validate(&graph_with_rewards(&rewards));
    assert!(!ok);
    for want in [
        "`weights.fmtt` names nothing: neither a scores input of `reward` (geo, fmt) nor a \
         built-in rule (geo3k, exact_match, format)",
        "did you mean `fmt`?",
        "scores input `fmt` of `reward` has no weight",
        "add `fmt = <weight>` to `weights` (0 leaves the term out)",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
    }
}

#[test]
fn validate_names_an_input_without_a_weight_and_a_rule_without_rollouts() {
    let rewards = reward_nodes(
        "{ geo = \"geo3k_reward.scores\", fmt = \"format_reward.scores\" }",
        "{ geo = 0.9, exact_match = 0.1 }",
    );
    let (ok, stderr) = validate(&graph_with_rewards(&rewards));
    assert!(!ok);
    for want in [
        "scores input `fmt` of `reward` has no weight",
        "`weights.exact_match` weighs the built-in rule `exact_match`, which scores the \
         `rollouts` input, and `rollouts` is not wired",
        "wire it: `inputs = { rollouts = \"rollout.rollouts\" }`",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
    }
}

#[test]
fn validate_rejects_an_input_that_is_not_scores() {
    let rewards = reward_nodes(
        "{ geo = \"geo3k_reward.scores\", fmt = \"rollout.rollouts\" }",
        "{ geo = 0.9, fmt = 0.1 }",
    );
    let (ok, stderr) = validate(&graph_with_rewards(&rewards));
    assert!(!ok);
    let want = "`reward.fmt` expects Scores, got Rollouts from `rollout.rollouts`";
    assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
}
