//! The `advantage.<verl name>` kinds beyond GRPO/RLOO/REINFORCE++ in real graphs: what
//! `flowrl validate` says about them (warnings for options their estimator ignores, at the key;
//! errors for wiring that cannot work), and one step of the tiny policy on the embedded task with
//! every kind wired (ReMax's greedy baseline rollout, the optimal token baselines' Σπ² from the
//! `logprob` node), checked against the estimators of flowrl-algorithms.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use flowrl_algorithms::{
    OTB_EPSILON, PathVariance, TokenRewards, compute_optimal_token_baseline_advantage,
};
use flowrl_engine::{
    BuildContext, Code, Inputs, Node, NodeKind, Outputs, ParamSpec, Params, Port, PortSpec,
    Registry, Session, Severity, StepContext, compile,
};
use flowrl_nodes::values::{AdvantageBatch, ScoreBatch, TokenLogProbs, port_types};

const ADVANTAGES: Port<AdvantageBatch> = Port::new("advantages", port_types::ADVANTAGES);
const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);
const LOG_PROBS: Port<TokenLogProbs> = Port::new("log_probs", port_types::TOKEN_LOG_PROBS);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What one capture node received.
#[derive(Default, Clone)]
struct Seen {
    advantages: Option<AdvantageBatch>,
    scores: Option<ScoreBatch>,
    log_probs: Option<TokenLogProbs>,
}

type Captured = Arc<Mutex<BTreeMap<String, Seen>>>;

/// Keeps whatever is wired to it, by node name (test-only kind).
struct Capture(Captured);
impl NodeKind for Capture {
    fn name(&self) -> &str {
        "test.capture"
    }
    fn doc(&self) -> &str {
        "keeps its inputs"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            ADVANTAGES.spec().optional(),
            SCORES.spec().optional(),
            LOG_PROBS.spec().optional(),
        ]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        struct N(Captured, String);
        impl Node for N {
            fn run(&mut self, inputs: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
                let seen = Seen {
                    advantages: inputs.get_opt(ADVANTAGES)?.cloned(),
                    scores: inputs.get_opt(SCORES)?.cloned(),
                    log_probs: inputs.get_opt(LOG_PROBS)?.cloned(),
                };
                self.0.lock().unwrap().insert(self.1.clone(), seen);
                Ok(Outputs::new())
            }
        }
        Ok(Box::new(N(self.0.clone(), ctx.node.clone())))
    }
}

/// Sampled and greedy rollouts of the same prompts, their geo3k scores, old log-probs with Σπ²,
/// and one node of every kind; `extra` is appended (more keys for the last node, say).
fn graph(extra: &str) -> String {
    let mut text = String::from(
        r#"
[run]
steps = 1
seed = 5

[models.policy]
path = "assets/tiny-qwen2-vl"

[nodes.data]
kind = "dataset.parquet"
model = "policy"
path = "datasets/shapes/test.parquet"
batch_size = 3
max_prompt_length = 128

[nodes.rollout]
kind = "rollout"
model = "policy"
inputs = { prompts = "data.prompts" }
n = 4
max_new_tokens = 8

[nodes.greedy]
kind = "rollout"
model = "policy"
inputs = { prompts = "data.prompts" }
greedy = true
max_new_tokens = 8

[nodes.reward]
kind = "reward.geo3k"
inputs = { rollouts = "rollout.rollouts" }

[nodes.greedy_reward]
kind = "reward.geo3k"
inputs = { rollouts = "greedy.rollouts" }

[nodes.old]
kind = "logprob"
model = "policy"
inputs = { rollouts = "rollout.rollouts" }
sum_pi_squared = true

[nodes.seen_inputs]
kind = "test.capture"
inputs = { scores = "reward.scores", log_probs = "old.log_probs" }

[nodes.seen_greedy]
kind = "test.capture"
inputs = { scores = "greedy_reward.scores" }

[nodes.remax]
kind = "advantage.remax"
inputs = { scores = "reward.scores", baseline_scores = "greedy_reward.scores" }
"#,
    );
    for kind in ["optimal_token_baseline", "tir_optimal_token_baseline"] {
        text += &format!(
            "\n[nodes.{kind}]\nkind = \"advantage.{kind}\"\n\
             inputs = {{ scores = \"reward.scores\", old_log_probs = \"old.log_probs\" }}\n"
        );
    }
    text += "\n[nodes.gdpo]\nkind = \"advantage.gdpo\"\ninputs = { scores = \"reward.scores\" }\n\
             gdpo_reward_keys = [\"acc\", \"format\"]\n";
    for kind in ["grpo_passk", "opo", "gpg"] {
        text += &format!(
            "\n[nodes.{kind}]\nkind = \"advantage.{kind}\"\ninputs = {{ scores = \"reward.scores\" }}\n"
        );
    }
    let kinds = [
        "remax",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
        "gdpo",
        "grpo_passk",
        "opo",
        "gpg",
    ];
    for kind in kinds {
        text += &format!(
            "\n[nodes.seen_{kind}]\nkind = \"test.capture\"\ninputs = {{ advantages = \"{kind}.advantages\" }}\n"
        );
    }
    text + extra
}

fn registry(captured: &Captured) -> Registry {
    Registry::builtin().with_kind(Capture(captured.clone()))
}

/// `(code, line, message)` of every diagnostic of a graph that compiles, or of one that fails.
fn diagnostics(text: &str) -> Vec<(Severity, &'static str, usize, String)> {
    std::env::set_current_dir(root()).unwrap();
    let (diags, sources) = match compile(&registry(&Captured::default()), "g.toml", text, &[]) {
        Ok((g, w)) => (w, g.sources),
        Err(f) => (f.diagnostics, f.sources),
    };
    diags
        .iter()
        .map(|d| {
            let line = d.span.map_or(0, |s| sources.line_col(s).0);
            (d.severity, d.code.as_str(), line, d.message.clone())
        })
        .collect()
}

fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.starts_with(needle))
        .unwrap_or_else(|| panic!("no line {needle:?}"))
        + 1
}

#[test]
fn validate_warns_at_options_the_estimator_ignores() {
    // The last node table is seen_gpg's: append keys to a new table for each kind instead.
    let extra = r#"
[nodes.opo2]
kind = "advantage.opo"
inputs = { scores = "reward.scores" }
norm_adv_by_std_in_grpo = false
gamma = 0.99

[nodes.gpg2]
kind = "advantage.gpg"
inputs = { scores = "reward.scores" }
alpha = 3.0
f_norm = 0.5

[nodes.passk2]
kind = "advantage.grpo_passk"
inputs = { scores = "reward.scores" }
norm_adv_by_std_in_grpo = false
lam = 0.95

[nodes.gdpo2]
kind = "advantage.gdpo"
inputs = { scores = "reward.scores" }
gdpo_reward_keys = ["acc"]
gdpo_reward_weights = [1.0, 0.5]
norm_adv_by_std_in_grpo = false
"#;
    let text = graph(extra);
    let diags = diagnostics(&text);
    let warnings: Vec<_> = diags.iter().filter(|d| d.0 == Severity::Warning).collect();
    let expect = [
        (
            "norm_adv_by_std_in_grpo = false\ngamma",
            "norm_adv_by_std_in_grpo",
            "advantage.opo",
        ),
        ("gamma = 0.99", "gamma", "advantage.opo"),
        ("alpha = 3.0", "alpha", "advantage.gpg"),
        ("lam = 0.95", "lam", "advantage.grpo_passk"),
        (
            "gdpo_reward_weights",
            "gdpo_reward_weights",
            "the last 1 are ignored",
        ),
    ];
    for (at, key, what) in expect {
        let first = at.lines().next().unwrap();
        let line = line_of(&text, first);
        assert!(
            warnings.iter().any(|w| w.1 == Code::IgnoredParam.as_str()
                && w.2 == line
                && w.3.contains(key)
                && w.3.contains(what)),
            "no warning for `{key}` at line {line}: {diags:#?}"
        );
    }
    // gdpo2's norm flag (the last one in the file) warns; passk2's (read by pass@k) does not.
    let norm_lines: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("norm_adv_by_std_in_grpo"))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(norm_lines.len(), 3);
    let warned = |line: usize| warnings.iter().any(|w| w.2 == line);
    assert!(warned(norm_lines[0]) && !warned(norm_lines[1]) && warned(norm_lines[2]));
    assert!(!warned(line_of(&text, "f_norm")));
    assert_eq!(warnings.len(), 6, "{warnings:#?}");
    assert!(diags.iter().all(|d| d.0 == Severity::Warning), "{diags:#?}");
}

#[test]
fn validate_rejects_wiring_that_cannot_work() {
    let text = graph("")
        .replace("greedy = true\n", "")
        .replace("sum_pi_squared = true\n", "")
        .replace(
            "gdpo_reward_keys = [\"acc\", \"format\"]",
            "gdpo_reward_keys = []",
        )
        .replace("n = 4\n", "n = 1\n");
    let errors: Vec<String> = diagnostics(&text)
        .into_iter()
        .filter(|d| d.0 == Severity::Error)
        .map(|d| d.3)
        .collect();
    for want in [
        "set `greedy = true` on rollout node `greedy`",
        "`advantage.optimal_token_baseline` needs Σπ² of the old policy: set `sum_pi_squared = true` on logprob node `old`",
        "`advantage.tir_optimal_token_baseline` needs Σπ²",
        "GDPO needs at least one reward component key",
        "pass@k GRPO needs at least 2 responses per prompt, but the rollout upstream has n = 1",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "no error {want:?}: {errors:#?}"
        );
    }
    let same = graph("").replace(
        "baseline_scores = \"greedy_reward.scores\"",
        "baseline_scores = \"reward.scores\"",
    );
    let errors: Vec<String> = diagnostics(&same).into_iter().map(|d| d.3).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("set `greedy = true` on rollout node `rollout`")),
        "{errors:#?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("both come from rollout node `rollout`")),
        "{errors:#?}"
    );
}

#[test]
fn one_step_with_every_kind() {
    let captured = Captured::default();
    std::env::set_current_dir(root()).unwrap();
    let (graph, warnings) = compile(&registry(&captured), "g.toml", &graph(""), &[])
        .unwrap_or_else(|f| panic!("{}", f.render()));
    assert!(warnings.is_empty());
    let mut s = Session::build(graph, None, None).unwrap();
    s.run_step(0, &mut |_| {}).unwrap();
    let seen = captured.lock().unwrap().clone();
    let inputs = &seen["seen_inputs"];
    let scores = inputs.scores.as_ref().unwrap();
    let lp = inputs.log_probs.as_ref().unwrap();
    let rollouts = &scores.rollouts;
    let [b, t] = rollouts.response_mask.shape();
    assert_eq!(b, 12);
    let mask = &rollouts.response_mask.data;
    let adv = |kind: &str| seen[&format!("seen_{kind}")].advantages.clone().unwrap();

    // Σπ² lies between π² and π² + (1 − π)² at the sampled token, and is 0 at padding.
    let sq = lp.sum_pi_squared.as_ref().expect("sum_pi_squared");
    for ((&m, &lp), &s) in mask.iter().zip(&lp.log_probs.data).zip(&sq.data) {
        let (p, s) = ((lp as f64).exp(), s as f64);
        if m == 0.0 {
            assert_eq!(s, 0.0);
        } else {
            assert!(
                s >= p * p - 1e-5 && s <= p * p + (1.0 - p).powi(2) + 1e-5,
                "{p} {s}"
            );
        }
    }

    // ReMax: the score minus the greedy score of the same prompt, at every valid token.
    let greedy = seen["seen_greedy"].scores.clone().unwrap();
    let remax = adv("remax");
    for r in 0..b {
        let g = greedy
            .rollouts
            .uid
            .iter()
            .position(|u| *u == rollouts.uid[r])
            .unwrap();
        let want = scores.scores[r] - greedy.scores[g];
        for (a, m) in remax
            .advantages
            .row(r)
            .iter()
            .zip(rollouts.response_mask.row(r))
        {
            assert!((a - want * m).abs() < 1e-6, "row {r}: {a} vs {want}");
        }
    }

    // The optimal token baseline from the captured inputs; the multi-turn variant agrees (no
    // holes in the masks).
    let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let (m64, old, sq64) = (f64s(mask), f64s(&lp.log_probs.data), f64s(&sq.data));
    let mut rewards = vec![0.0; b * t];
    for r in 0..b {
        let len = rollouts
            .response_mask
            .row(r)
            .iter()
            .filter(|&&m| m != 0.0)
            .count();
        rewards[r * t + len.max(1) - 1] = scores.scores[r] as f64;
    }
    let want = compute_optimal_token_baseline_advantage(
        TokenRewards::new(&rewards, &m64, b, t).unwrap(),
        &rollouts.uid,
        PathVariance {
            old_log_probs: &old,
            sum_pi_squared: &sq64,
            rollout_is_weights: None,
        },
        true,
        OTB_EPSILON,
    )
    .unwrap();
    let otb = adv("optimal_token_baseline");
    for (g, w) in otb.advantages.data.iter().zip(&want.advantages) {
        assert!((*g as f64 - w).abs() < 1e-5, "{g} vs {w}");
    }
    assert_eq!(otb.advantages, adv("tir_optimal_token_baseline").advantages);

    // Pass@k: at most one non-zero response per prompt; the others are finite and masked.
    let passk = adv("grpo_passk");
    for uid in rollouts.uid.iter() {
        let moving = (0..b)
            .filter(|&r| {
                rollouts.uid[r] == *uid && passk.advantages.row(r).iter().any(|&a| a != 0.0)
            })
            .count();
        assert!(moving <= 1, "{uid}: {moving}");
    }
    for kind in ["gdpo", "opo", "gpg", "grpo_passk"] {
        let a = adv(kind);
        for (x, m) in a.advantages.data.iter().zip(mask) {
            assert!(
                x.is_finite() && (*m != 0.0 || *x == 0.0),
                "{kind}: {x} at mask {m}"
            );
        }
    }
}
