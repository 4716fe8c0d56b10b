//! The main job's node kinds driven through the engine on the tiny shipped policy
//! (`assets/tiny-qwen2-vl`) and the embedded shapes task: rollout ↔ log-prob consistency (KV-cache
//! decoding against one full forward), determinism, the PPO update (metrics, micro-batch
//! normalisation, a NaN in the loss skipped and counted), model resource errors.
//!
//! Rewards and advantages come from flowrl-algorithms through two test-only kinds (the built-in
//! reward/advantage kinds belong to another part of the project); a capture kind keeps the values
//! for inspection.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use flowrl_algorithms::{AdvantageEstimator, compute_advantages_host, rewards::geo3k::geo3k_score};
use flowrl_engine::{
    BuildContext, DeviceSpec, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec, Params,
    Port, PortSpec, Registry, Session, StepContext, compile,
};
use flowrl_nodes::resources::model::ModelResource;
use flowrl_nodes::runtime::backend::CpuBackend;
use flowrl_nodes::values::{
    AdvantageBatch, RolloutBatch, ScoreBatch, TokenLogProbs, TokenMatrix, port_types,
};

const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);
const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);
const ADVANTAGES: Port<AdvantageBatch> = Port::new("advantages", port_types::ADVANTAGES);
const LOG_PROBS: Port<TokenLogProbs> = Port::new("log_probs", port_types::TOKEN_LOG_PROBS);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// geo3k score per response (test-only kind).
struct TestReward;
impl NodeKind for TestReward {
    fn name(&self) -> &str {
        "test.reward"
    }
    fn doc(&self) -> &str {
        "geo3k score"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![ROLLOUTS.spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![SCORES.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        struct N;
        impl Node for N {
            fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
                let r = inputs.get_arc(ROLLOUTS)?;
                let scores: Vec<f32> = (0..r.len())
                    .map(|i| geo3k_score(&r.response_text[i], &r.ground_truth[i]).score as f32)
                    .collect();
                ctx.metric(
                    "critic/score/mean",
                    scores.iter().sum::<f32>() as f64 / scores.len() as f64,
                );
                Ok(Outputs::new().with_opaque(
                    SCORES,
                    ScoreBatch {
                        rollouts: r,
                        scores,
                        components: Default::default(),
                    },
                ))
            }
        }
        Ok(Box::new(N))
    }
}

/// GRPO advantages; with `nan_at_step`, the advantages of that step are NaN (fault injection).
struct TestAdvantage;

#[derive(serde::Deserialize, flowrl_engine::Params)]
struct TestAdvantageParams {
    #[param(default = -1)]
    nan_at_step: i64,
}
impl NodeKind for TestAdvantage {
    fn name(&self) -> &str {
        "test.advantage"
    }
    fn doc(&self) -> &str {
        "GRPO advantages"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![SCORES.spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![ADVANTAGES.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        TestAdvantageParams::param_specs()
    }
    fn build(&self, params: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let nan_at = params.parse::<TestAdvantageParams>()?.nan_at_step;
        struct N(i64);
        impl Node for N {
            fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
                let s = inputs.get_arc(SCORES)?;
                let r = s.rollouts.clone();
                let (b, t) = (r.len(), r.response_len());
                let mask: Vec<f64> = r.response_mask.data.iter().map(|&x| x as f64).collect();
                let mut rewards = vec![0.0; b * t];
                for (i, len) in r.response_lengths().into_iter().enumerate() {
                    rewards[i * t + len - 1] = s.scores[i] as f64;
                }
                let a = compute_advantages_host(
                    &rewards,
                    &mask,
                    b,
                    t,
                    &r.uid,
                    AdvantageEstimator::GRPO,
                )?;
                let mut adv: Vec<f32> = a.advantages.iter().map(|&x| x as f32).collect();
                if ctx.step() as i64 == self.0 {
                    adv.iter_mut().for_each(|x| *x = f32::NAN);
                }
                let ret = a.returns.iter().map(|&x| x as f32).collect();
                Ok(Outputs::new().with_opaque(
                    ADVANTAGES,
                    AdvantageBatch {
                        rollouts: r,
                        advantages: TokenMatrix::new(adv, b, t)?,
                        returns: TokenMatrix::new(ret, b, t)?,
                    },
                ))
            }
        }
        Ok(Box::new(N(nan_at)))
    }
}

type Captured = Arc<Mutex<Vec<(Arc<RolloutBatch>, Option<TokenLogProbs>)>>>;

/// Keeps the rollouts and (optionally) log-probs it is given.
struct Capture(Captured);
impl NodeKind for Capture {
    fn name(&self) -> &str {
        "test.capture"
    }
    fn doc(&self) -> &str {
        "capture"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![ROLLOUTS.spec(), LOG_PROBS.spec().optional()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        struct N(Captured);
        impl Node for N {
            fn run(&mut self, inputs: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
                let r = inputs.get_arc(ROLLOUTS)?;
                let lp = inputs.get_opt(LOG_PROBS)?.cloned();
                self.0.lock().unwrap().push((r, lp));
                Ok(Outputs::new())
            }
        }
        Ok(Box::new(N(self.0.clone())))
    }
}

fn session(text: &str, captured: &Captured) -> Session {
    let registry = Registry::builtin()
        .with_kind(TestReward)
        .with_kind(TestAdvantage)
        .with_kind(Capture(captured.clone()));
    std::env::set_current_dir(root()).unwrap();
    let (graph, _) = match compile(&registry, "graph.toml", text, &[]) {
        Ok(g) => g,
        Err(f) => panic!("{}", f.render()),
    };
    Session::build(graph, None, None).unwrap()
}

const DATA: &str = r#"
[models.policy]
path = "assets/tiny-qwen2-vl"
[models.reference]
from = "policy"

[nodes.data]
kind = "dataset.parquet"
model = "policy"
path = "datasets/shapes/test.parquet"
batch_size = 4
max_prompt_length = 128
"#;

fn grpo_graph(steps: u64, update_extra: &str, adv_extra: &str) -> String {
    format!(
        r#"[run]
steps = {steps}
seed = 3
{DATA}
[nodes.rollout]
kind = "rollout"
model = "policy"
inputs = {{ prompts = "data.prompts" }}
n = 4
max_new_tokens = 12

[nodes.old]
kind = "logprob"
model = "policy"
inputs = {{ rollouts = "rollout.rollouts" }}

[nodes.ref]
kind = "logprob"
model = "reference"
timing = "ref"
inputs = {{ rollouts = "rollout.rollouts" }}

[nodes.reward]
kind = "test.reward"
inputs = {{ rollouts = "rollout.rollouts" }}

[nodes.adv]
kind = "test.advantage"
inputs = {{ scores = "reward.scores" }}
{adv_extra}

[nodes.update]
kind = "update.ppo"
model = "policy"
inputs = {{ rollouts = "rollout.rollouts", advantages = "adv.advantages", old_log_probs = "old.log_probs", ref_log_probs = "ref.log_probs" }}
kl = {{ estimator = "low_var_kl", coef = 0.01 }}
lr = 1e-3
{update_extra}

[nodes.capture]
kind = "test.capture"
inputs = {{ rollouts = "rollout.rollouts", log_probs = "old.log_probs" }}
"#
    )
}

fn weights(s: &Session) -> Vec<f32> {
    let m = s.resources().get::<ModelResource>("policy").unwrap();
    let dir = tempfile::tempdir().unwrap();
    m.lock::<CpuBackend>()
        .unwrap()
        .model
        .save(dir.path(), None)
        .unwrap();
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn rollout_groups_masks_and_log_probs_match_a_full_forward() {
    let captured = Captured::default();
    let mut s = session(&grpo_graph(1, "", ""), &captured);
    let report = s.run_step(0, &mut |_| {}).unwrap();
    let (r, lp) = captured.lock().unwrap()[0].clone();
    r.check().unwrap();
    assert_eq!(r.len(), 16, "4 prompts × n 4");
    for p in 0..4 {
        let uids: Vec<&String> = r.uid[p * 4..p * 4 + 4].iter().collect();
        assert!(uids.iter().all(|u| *u == uids[0]), "a group shares its uid");
        assert!(r.prompt_index[p * 4..p * 4 + 4].iter().all(|&i| i == p));
    }
    assert_ne!(r.uid[0], r.uid[4]);
    assert!(r.response_len() <= 12);
    // Sinks see the responses as JSON.
    let json = serde_json::to_value(&*r).unwrap();
    assert_eq!(json["response_text"].as_array().unwrap().len(), 16);
    assert_eq!(json["uid"][0], serde_json::json!(r.uid[0]));
    // Sampling log-probs (KV-cache decoding, temperature 1, no truncation) equal the log-probs
    // of one full forward over prompt + response, up to f32 rounding and the suppressed vision
    // tokens: the two paths sum attention and matmuls in different orders, which moves a few
    // low-probability tokens' log-probs by up to ~2.5e-3 (seen at log-probs ≈ −6), and sampling
    // renormalises without the image and video tokens, which adds −log(1 − p(image, video)) to
    // every sampled token (5.4e-3 at most in this batch, 2.7e-4 on average).
    let lp = lp.unwrap();
    let mut worst = 0f32;
    let mut total = 0f64;
    for (a, b) in r.sampling_log_probs.data.iter().zip(&lp.log_probs.data) {
        worst = worst.max((a - b).abs());
        total += f64::from((a - b).abs());
    }
    let mean = total / r.sampling_log_probs.data.len() as f64;
    assert!(worst < 1e-2, "max |sampling − recomputed| = {worst}");
    assert!(mean < 5e-4, "mean |sampling − recomputed| = {mean}");
    for key in [
        "response_length/mean",
        "response_length/clip_ratio",
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/grad_norm",
        "actor/ppo_kl",
        "actor/entropy",
        "actor/lr",
        "timing_s/gen",
        "timing_s/old_log_prob",
        "timing_s/ref",
        "timing_s/update_actor",
    ] {
        let v = report
            .metrics
            .get(key)
            .unwrap_or_else(|| panic!("missing {key}"));
        assert!(v.is_finite(), "{key} = {v}");
    }
    // Before the first update the policy equals the reference and the old policy.
    assert!(report.metrics["actor/kl_loss"].abs() < 1e-6);
    assert!(report.metrics["actor/ppo_kl"].abs() < 1e-6);
    assert_eq!(report.metrics["actor/skipped_steps"], 0.0);
}

#[test]
fn same_seed_same_rollouts_and_weights() {
    let run = || {
        let captured = Captured::default();
        let mut s = session(&grpo_graph(2, "", ""), &captured);
        for step in 0..2 {
            s.run_step(step, &mut |_| {}).unwrap();
        }
        let c = captured.lock().unwrap();
        let ids: Vec<Vec<Vec<u32>>> = c.iter().map(|(r, _)| r.response_ids.clone()).collect();
        (ids, weights(&s))
    };
    let (a_ids, a_w) = run();
    let (b_ids, b_w) = run();
    assert_eq!(a_ids, b_ids);
    assert_eq!(a_w, b_w);
}

#[test]
fn micro_batches_accumulate_to_the_mini_batch_gradient() {
    let step = |extra: &str| {
        let captured = Captured::default();
        let mut s = session(&grpo_graph(1, extra, ""), &captured);
        let report = s.run_step(0, &mut |_| {}).unwrap();
        (weights(&s), report.metrics["actor/grad_norm"])
    };
    let (whole, norm_whole) = step("");
    let (micro, norm_micro) = step("micro_batch_size = 4");
    assert!(
        (norm_whole - norm_micro).abs() < 1e-4 * norm_whole.max(1.0),
        "grad norm {norm_whole} vs {norm_micro}"
    );
    let worst = whole
        .iter()
        .zip(&micro)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    // Adam's first step is ≈ lr · g/|g| per weight, so float noise in near-zero gradients moves a
    // weight by up to a fraction of lr (1e-3); a normalisation error would move every weight.
    assert!(worst < 5e-5, "weights differ by {worst}");
}

#[test]
fn nan_in_the_loss_skips_the_step_and_counts_it() {
    let captured = Captured::default();
    let mut s = session(&grpo_graph(2, "", "nan_at_step = 1"), &captured);
    let r0 = s.run_step(0, &mut |_| {}).unwrap();
    assert_eq!(r0.metrics["actor/skipped_steps"], 0.0);
    let before = weights(&s);
    let r1 = s.run_step(1, &mut |_| {}).unwrap();
    assert_eq!(r1.metrics["actor/skipped_steps"], 1.0);
    assert_eq!(
        weights(&s),
        before,
        "a skipped step leaves the weights alone"
    );
    let m = s.resources().get::<ModelResource>("policy").unwrap();
    let c = m.lock::<CpuBackend>().unwrap().counters;
    assert_eq!((c.optimizer_steps, c.skipped_steps), (1, 1));
}

#[test]
fn missing_model_directory_and_vocabulary_mismatch_are_clear_errors() {
    let err = ModelResource::load(
        "policy",
        Path::new("/nonexistent/model"),
        true,
        None,
        DeviceSpec::Cpu(0),
        None,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("model `policy`")
            && err.contains("/nonexistent/model")
            && err.contains("does not exist"),
        "{err}"
    );

    // A tokenizer with more tokens than the model's vocabulary.
    let dir = tempfile::tempdir().unwrap();
    let src = root().join("assets/tiny-qwen2-vl");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        config.replace("\"vocab_size\": 424", "\"vocab_size\": 300"),
    )
    .unwrap();
    let err = ModelResource::load("policy", dir.path(), true, None, DeviceSpec::Cpu(0), None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("422 tokens") && err.contains("300"), "{err}");
}

#[test]
fn kl_without_reference_log_probs_is_rejected_before_the_run() {
    let text = grpo_graph(1, "", "").replace(", ref_log_probs = \"ref.log_probs\"", "");
    let registry = Registry::builtin()
        .with_kind(TestReward)
        .with_kind(TestAdvantage)
        .with_kind(Capture(Captured::default()));
    std::env::set_current_dir(root()).unwrap();
    let failure = compile(&registry, "graph.toml", &text, &[])
        .err()
        .expect("rejected");
    let text = failure.render();
    assert!(text.contains("ref_log_probs"), "{text}");
}

#[test]
fn sft_from_random_weights_lowers_the_loss() {
    let text = r#"
[run]
steps = 8
seed = 7

[models.policy]
path = "assets/tiny-qwen2-vl-init"
init = "random"

[nodes.data]
kind = "dataset.parquet"
model = "policy"
path = "datasets/shapes/test.parquet"
batch_size = 8
max_prompt_length = 128

[nodes.sft]
kind = "update.sft"
model = "policy"
inputs = { prompts = "data.prompts" }
response_template = "<think> </think> \\boxed{{answer}}"
lr = 3e-3
micro_batch_size = 4
"#;
    let mut s = session(text, &Captured::default());
    let losses: Vec<f64> = (0..8)
        .map(|step| s.run_step(step, &mut |_| {}).unwrap().metrics["train/loss"])
        .collect();
    // Random init: about ln(424) ≈ 6.05 nats per token.
    assert!((losses[0] - (424f64).ln()).abs() < 0.5, "{losses:?}");
    assert!(losses[7] < losses[0] - 1.0, "{losses:?}");
}
