//! PPO's critic on the tiny shipped policy and the embedded shapes task: a value model resource
//! (`value_head = true`), the `value` node (values at the positions that predict the response
//! tokens, masked), `advantage.gae` (returns = score with γ = λ = 1), `update.critic` (the value
//! loss falls over repeated updates on a fixed batch; its checkpoint restores head and optimizer),
//! critic warm-up on `update.ppo`, and what `flowrl validate` says about these kinds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use flowrl_algorithms::rewards::geo3k::geo3k_score;
use flowrl_engine::{
    BuildContext, DeviceSpec, Inputs, Node, NodeKind, Outputs, ParamSpec, Params, Payload,
    Placement, Port, PortSpec, Registry, Session, Severity, StepContext, Value, compile,
};
use flowrl_nodes::resources::model::ModelResource;
use flowrl_nodes::runtime::backend::CpuBackend;
use flowrl_nodes::values::{AdvantageBatch, RolloutBatch, TokenValues, port_types};

const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);
const VALUES: Port<TokenValues> = Port::new("values", port_types::VALUES);
const ADVANTAGES: Port<AdvantageBatch> = Port::new("advantages", port_types::ADVANTAGES);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What the capture node received.
#[derive(Default, Clone)]
struct Seen {
    rollouts: Option<Arc<RolloutBatch>>,
    values: Option<Arc<TokenValues>>,
    advantages: Option<Arc<AdvantageBatch>>,
}

type Captured = Arc<Mutex<Seen>>;

/// Keeps the rollouts, values and advantages wired to it (test-only kind).
struct Capture(Captured);
impl NodeKind for Capture {
    fn name(&self) -> &str {
        "test.capture"
    }
    fn doc(&self) -> &str {
        "keeps its inputs"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![ROLLOUTS.spec(), VALUES.spec(), ADVANTAGES.spec()]
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
                *self.0.lock().unwrap() = Seen {
                    rollouts: Some(inputs.get_arc(ROLLOUTS)?),
                    values: Some(inputs.get_arc(VALUES)?),
                    advantages: Some(inputs.get_arc(ADVANTAGES)?),
                };
                Ok(Outputs::new())
            }
        }
        Ok(Box::new(N(self.0.clone())))
    }
}

const GRAPH: &str = r#"
[run]
steps = 2
seed = 5

[models.policy]
path = "assets/tiny-qwen2-vl"

[models.critic]
path = "assets/tiny-qwen2-vl"
value_head = true

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
max_new_tokens = 10

[nodes.values]
kind = "value"
model = "critic"
inputs = { rollouts = "rollout.rollouts" }
micro_batch_size = 5

[nodes.reward]
kind = "reward.geo3k"
inputs = { rollouts = "rollout.rollouts" }

[nodes.advantage]
kind = "advantage.gae"
inputs = { scores = "reward.scores", values = "values.values" }

[nodes.capture]
kind = "test.capture"
inputs = { rollouts = "rollout.rollouts", values = "values.values", advantages = "advantage.advantages" }

[nodes.critic]
kind = "update.critic"
model = "critic"
inputs = { rollouts = "rollout.rollouts", values = "values.values", advantages = "advantage.advantages" }
mini_batch_size = 3
micro_batch_size = 4
lr = 1e-4

[nodes.update]
kind = "update.ppo"
model = "policy"
inputs = { rollouts = "rollout.rollouts", advantages = "advantage.advantages" }
critic_warmup = 2
lr = 1e-4
"#;

fn registry(captured: &Captured) -> Registry {
    Registry::builtin().with_kind(Capture(captured.clone()))
}

fn session(text: &str, captured: &Captured) -> Session {
    std::env::set_current_dir(root()).unwrap();
    let (graph, warnings) = compile(&registry(captured), "critic.toml", text, &[])
        .unwrap_or_else(|f| panic!("{}", f.render()));
    assert!(warnings.is_empty(), "{warnings:?}");
    Session::build(graph, None, None).unwrap()
}

/// `(severity, line, message)` of every diagnostic of a graph.
fn diagnostics(text: &str) -> Vec<(Severity, usize, String)> {
    std::env::set_current_dir(root()).unwrap();
    let (diags, sources) = match compile(&registry(&Captured::default()), "g.toml", text, &[]) {
        Ok((g, w)) => (w, g.sources),
        Err(f) => (f.diagnostics, f.sources),
    };
    diags
        .iter()
        .map(|d| {
            let line = d.span.map_or(0, |s| sources.line_col(s).0);
            let mut m = d.message.clone();
            if let Some(h) = &d.help {
                m.push_str(&format!(" | help: {h}"));
            }
            (d.severity, line, m)
        })
        .collect()
}

/// The 1-based line where `needle` (possibly several lines) starts in `text`.
fn line_of(text: &str, needle: &str) -> usize {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("no {needle:?} in the graph"));
    text[..at].matches('\n').count() + 1
}

/// The values of the response tokens of row `r`, from one unpadded forward of that row alone:
/// the value head on the hidden state at prompt position P − 1 + t.
fn row_values(critic: &ModelResource, rollouts: &RolloutBatch, r: usize) -> Vec<f32> {
    let (model, head) = critic.value_model_inference::<CpuBackend>().unwrap();
    let device = Default::default();
    let prompt = &rollouts.prompt_ids[r];
    let mut ids = prompt.clone();
    ids.extend(&rollouts.response_ids[r]);
    let batch = flowrl_models::PaddedBatch::left_pad(&[ids], 0);
    let images = rollouts.prompts.prompts[rollouts.prompt_index[r]]
        .images
        .clone();
    let embeds = model.input_embeddings(&batch, &images, &device).unwrap();
    let positions = model.position_ids(&batch, &images).unwrap();
    let hidden = model.causal_lm().forward_hidden(
        batch.ids_tensor(&device),
        embeds,
        positions.tensor(&device),
        batch.mask_tensor(&device),
        None,
    );
    let n = rollouts.response_ids[r].len();
    let v = head.forward(hidden.narrow(1, prompt.len() - 1, n));
    v.into_data().to_vec::<f32>().unwrap()
}

/// Runs a node built from the session's graph on `inputs`, returning its metrics.
fn run_node(
    s: &Session,
    node: &mut Box<dyn Node>,
    name: &str,
    step: u64,
    inputs: &Inputs,
) -> BTreeMap<String, f64> {
    let mut ctx = StepContext::new(name, step, 2, 5, DeviceSpec::Cpu(0), s.resources().clone());
    node.run(inputs, &mut ctx).unwrap();
    ctx.metrics().iter().cloned().collect()
}

/// Inserts `v` on `port`.
fn insert<T: std::any::Any + Send + Sync>(i: &mut Inputs, port: Port<T>, v: Arc<T>) {
    i.insert(
        port.name(),
        Value::new(port.port_type(), Payload::opaque_arc(v)),
    );
}

fn critic_inputs(seen: &Seen) -> Inputs {
    let mut i = Inputs::new("critic2");
    insert(&mut i, ROLLOUTS, seen.rollouts.clone().unwrap());
    insert(&mut i, VALUES, seen.values.clone().unwrap());
    insert(&mut i, ADVANTAGES, seen.advantages.clone().unwrap());
    i
}

#[test]
fn values_gae_and_the_critic_update_on_the_tiny_policy() {
    let captured = Captured::default();
    let mut s = session(GRAPH, &captured);
    let report = s.run_step(0, &mut |_| {}).unwrap();
    let m = &report.metrics;
    let seen = captured.lock().unwrap().clone();
    let rollouts = seen.rollouts.clone().unwrap();
    let values = seen.values.clone().unwrap();
    let adv = seen.advantages.clone().unwrap();
    let [b, t] = rollouts.response_mask.shape();
    assert_eq!(values.values.shape(), [b, t]);

    // Warm-up: critic_warmup = 2 skips the actor at step 1 (0-based 0); the critic trained.
    assert!(!m.contains_key("actor/pg_loss"), "{m:?}");
    for k in [
        "critic/vf_loss",
        "critic/vf_clipfrac",
        "critic/vpred_mean",
        "critic/vf_explained_var",
        "critic/grad_norm",
        "critic/lr",
        "critic/values/mean",
        "critic/returns/mean",
        "timing_s/values",
        "timing_s/update_critic",
    ] {
        assert!(m[k].is_finite(), "{k}: {m:?}");
    }
    assert_eq!(m["critic/lr"], 1e-4);

    // The value of response token t is the head on the hidden state that predicts it (one
    // unpadded forward per row), and 0 at padding. The captured values are those before the
    // update, so compare against a value model restored from the initial weights.
    let fresh = session(GRAPH, &Captured::default());
    let critic0 = fresh.resources().get::<ModelResource>("critic").unwrap();
    for r in [0, b - 1] {
        let want = row_values(&critic0, &rollouts, r);
        let got = values.values.row(r);
        for (k, w) in want.iter().enumerate() {
            assert!(
                (got[k] - w).abs() < 1e-4,
                "row {r} token {k}: {} vs {w}",
                got[k]
            );
        }
        assert!(got[want.len()..].iter().all(|&v| v == 0.0));
    }

    // GAE with γ = λ = 1: every valid token's return is the response's geo3k score.
    for r in 0..b {
        let score = geo3k_score(&rollouts.response_text[r], &rollouts.ground_truth[r]).score;
        let n = rollouts.response_ids[r].len();
        for (k, ret) in adv.returns.row(r)[..n].iter().enumerate() {
            assert!(
                (*ret as f64 - score).abs() < 1e-5,
                "row {r} token {k}: {ret} vs {score}"
            );
        }
    }
    assert!(m.contains_key("critic/advantages/mean"));

    // The critic's loss falls over repeated updates on this fixed batch (values and returns
    // fixed), each update one optimizer step per mini-batch.
    let builtin = Registry::builtin();
    let kind = builtin.kind("update.critic").unwrap();
    let params = s
        .graph
        .nodes
        .iter()
        .find(|n| n.name == "critic")
        .unwrap()
        .params
        .clone();
    let ctx = BuildContext {
        node: "critic2".into(),
        device: DeviceSpec::Cpu(0),
        placement: Placement::single(DeviceSpec::Cpu(0)),
        seed: 5,
        total_steps: 2,
        resources: s.resources().clone(),
        run_dir: None,
        graph: None,
    };
    let mut node = kind.build(&params, &ctx).unwrap();
    let inputs = critic_inputs(&seen);
    let losses: Vec<f64> = (0..4)
        .map(|k| run_node(&s, &mut node, "critic2", k, &inputs)["critic/vf_loss"])
        .collect();
    eprintln!("vf_loss over 4 updates on one batch: {losses:?}");
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "the value loss does not fall: {losses:?}"
    );

    // Checkpoint: the value head and the critic's AdamW state are saved and restored; a value
    // model whose `path` is the checkpoint's model directory starts from the trained head.
    let critic = s.resources().get::<ModelResource>("critic").unwrap();
    let dir = tempfile::tempdir().unwrap();
    critic.save_to(dir.path()).unwrap();
    let model_dir = dir.path().join("model");
    assert!(model_dir.join("value_head.safetensors").is_file());
    let bytes = std::fs::read(dir.path().join("optimizer.safetensors")).unwrap();
    let opt = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert!(
        opt.names()
            .iter()
            .any(|n| n.contains("head") && n.contains("score")),
        "no optimizer state for the value head: {:?}",
        opt.names().iter().take(5).collect::<Vec<_>>()
    );
    let trained = row_values(&critic, &rollouts, 0);
    critic0.load_from(dir.path()).unwrap();
    assert_eq!(row_values(&critic0, &rollouts, 0), trained);
    let mut again =
        ModelResource::load("again", &model_dir, true, None, DeviceSpec::Cpu(0), None).unwrap();
    again.attach_value_head(99).unwrap();
    assert_eq!(row_values(&again, &rollouts, 0), trained);

    // Step 2: the actor updates (critic_warmup = 2 <= 2).
    let report = s.run_step(1, &mut |_| {}).unwrap();
    assert!(report.metrics["actor/pg_loss"].is_finite());
}

#[test]
fn validate_checks_the_critic_kinds() {
    // The kinds' own checks: the value node on a model without a value head; the critic
    // update's micro-batches; critic_warmup = 1; a value head on a frozen copy.
    let text = GRAPH
        .replace(
            "kind = \"value\"\nmodel = \"critic\"",
            "kind = \"value\"\nmodel = \"policy\"",
        )
        .replace("micro_batch_size = 4\nlr", "micro_batch_size = 5\nlr")
        .replace("critic_warmup = 2", "critic_warmup = 1")
        + "\n[models.frozen]\nfrom = \"critic\"\nvalue_head = true\n";
    let d = diagnostics(&text);
    let has = |sev, line, needle| has_in(&d, sev, line, needle);
    let value_model = line_of(&text, "kind = \"value\"\nmodel = \"policy\"") + 1;
    assert!(
        has(
            Severity::Error,
            value_model,
            "`values` needs a value model, but model `policy` has no value head"
        ) && has(
            Severity::Error,
            value_model,
            "`value_head = true` in `[models.policy]`"
        ),
        "{d:#?}"
    );
    assert!(
        has(
            Severity::Error,
            line_of(&text, "micro_batch_size = 5\nlr"),
            "a mini-batch of 3 prompts × n 4 = 12 responses is not divisible by micro_batch_size 5"
        ),
        "{d:#?}"
    );
    assert!(
        has(
            Severity::Warning,
            line_of(&text, "critic_warmup = 1"),
            "skips no actor update"
        ),
        "{d:#?}"
    );
    assert!(
        has(
            Severity::Error,
            line_of(&text, "[models.frozen]") + 2,
            "a `from` copy is frozen and has no value head"
        ),
        "{d:#?}"
    );
    assert_eq!(d.len(), 4, "{d:#?}");

    // What the compiler checks before the kinds: unknown keys (with a did-you-mean) and port
    // types across edges.
    let text = GRAPH.replace(
        "lr = 1e-4\n\n[nodes.update]",
        "lr = 1e-4\ncliprange_values = 0.2\n\n[nodes.update]",
    ) + "\n[nodes.bad_gae]\nkind = \"advantage.gae\"\ninputs = { scores = \"values.values\", values = \"values.values\" }\n";
    let d = diagnostics(&text);
    assert!(
        has_in(
            &d,
            Severity::Error,
            line_of(&text, "cliprange_values"),
            "did you mean `cliprange_value`?"
        ),
        "{d:#?}"
    );
    assert!(
        d.iter().any(|(s, _, m)| *s == Severity::Error
            && m.contains("`bad_gae.scores` expects Scores, got Values from `values.values`")),
        "{d:#?}"
    );
}

fn has_in(d: &[(Severity, usize, String)], sev: Severity, line: usize, needle: &str) -> bool {
    d.iter()
        .any(|(s, l, m)| *s == sev && *l == line && m.contains(needle))
}
