//! `#[derive(Params)]` / `#[derive(ParamChoice)]` give exactly the specs a kind used to write by
//! hand (copies of `advantage.grpo`'s and part of `update.ppo`'s lists, and the test kinds'), the
//! defaults the compiler fills in deserialize into the struct, and typed ports read and write
//! values.
// Most fields exist for the schema they declare, not to be read.
#![allow(dead_code)]

mod testkit;

use flowrl_engine::*;
use serde::Deserialize;
use serde_json::json;
use std::path::PathBuf;

/// nodes/src/kinds/advantage/grpo.rs, as a derived struct.
#[derive(Deserialize, Params)]
struct GrpoParams {
    /// divide by the group std (verl norm_adv_by_std_in_grpo); false = Dr.GRPO
    #[param(default = true)]
    norm_by_std: bool,
    /// added to the group std
    #[param(default = 1e-6, gt = 0.0)]
    epsilon: f64,
}

#[test]
fn grpo_specs_equal_the_hand_written_ones() {
    let hand = vec![
        ParamSpec::bool("norm_by_std")
            .default(true)
            .doc("divide by the group std (verl norm_adv_by_std_in_grpo); false = Dr.GRPO"),
        ParamSpec::float("epsilon")
            .default(1e-6)
            .gt(0.0)
            .doc("added to the group std"),
    ];
    assert_eq!(GrpoParams::param_specs(), hand);
}

/// verl's loss aggregation modes, as algorithms/src/agg_loss.rs names them.
#[derive(Clone, Copy, Debug, PartialEq, ParamChoice)]
#[serde(rename_all = "kebab-case")]
enum LossAggMode {
    TokenMean,
    TokenSum,
    SeqMeanTokenSum,
    SeqMeanTokenMean,
    SeqMeanTokenSumNorm,
}

const KL_ESTIMATORS: [&str; 14] = [
    "kl",
    "k1",
    "abs",
    "mse",
    "k2",
    "low_var_kl",
    "k3",
    "kl+",
    "k1+",
    "abs+",
    "mse+",
    "k2+",
    "low_var_kl+",
    "k3+",
];

#[derive(Debug, Deserialize, Params)]
struct KlParams {
    /// KL estimator (verl kl_loss_type)
    #[param(one_of = &KL_ESTIMATORS, default = "low_var_kl")]
    estimator: String,
    /// KL loss coefficient (verl kl_loss_coef)
    #[param(default = 0.001, min = 0.0)]
    coef: f64,
}

/// nodes/src/train/micro_batches.rs's two keys, flattened into the update's table.
#[derive(Debug, Deserialize, Params)]
struct MicroBatches {
    /// responses per forward/backward (verl ppo_micro_batch_size_per_gpu); default: the
    /// mini-batch
    #[param(min = 1.0)]
    micro_batch_size: Option<usize>,
    /// token budget per micro-batch instead of a row count
    #[param(min = 1.0)]
    max_tokens_per_micro_batch: Option<usize>,
}

/// Part of nodes/src/kinds/update/ppo.rs: a resource, an optional bound int, a flattened struct, an
/// enum, a switch table, an array default.
#[derive(Debug, Deserialize, Params)]
struct PpoParams {
    /// the policy to train
    #[param(resource = "model", required)]
    model: String,
    /// prompts per optimizer step (verl ppo_mini_batch_size); default: the whole batch
    #[param(min = 1.0)]
    mini_batch_size: Option<usize>,
    #[serde(flatten)]
    micro: MicroBatches,
    /// passes over the batch
    #[param(default = 1, min = 1.0)]
    ppo_epochs: usize,
    /// dual-clip constant (vanilla); importance-ratio truncation (dppo_*)
    #[param(default = 3.0, gt = 1.0)]
    clip_ratio_c: f64,
    /// kl_cov: fraction of the tokens (largest covariance) that get the KL penalty
    #[param(default = 0.0002, gt = 0.0, max = 1.0)]
    kl_cov_ratio: f64,
    /// loss aggregation (verl loss_agg_mode)
    #[param(default = LossAggMode::TokenMean)]
    loss_agg_mode: LossAggMode,
    /// KL loss against `ref_log_probs` (verl use_kl_loss; absent = no KL loss)
    #[param(switch)]
    kl: Option<KlParams>,
    /// AdamW (β1, β2)
    #[param(default = [0.9, 0.999])]
    betas: Vec<f64>,
}

fn ppo_hand_written() -> Vec<ParamSpec> {
    vec![
        ParamSpec::resource("model", "model")
            .required()
            .doc("the policy to train"),
        ParamSpec::int("mini_batch_size").min(1.0).doc(
            "prompts per optimizer step (verl ppo_mini_batch_size); default: the whole batch",
        ),
        ParamSpec::int("micro_batch_size").min(1.0).doc(
            "responses per forward/backward (verl ppo_micro_batch_size_per_gpu); default: the mini-batch",
        ),
        ParamSpec::int("max_tokens_per_micro_batch")
            .min(1.0)
            .doc("token budget per micro-batch instead of a row count"),
        ParamSpec::int("ppo_epochs")
            .default(1)
            .min(1.0)
            .doc("passes over the batch"),
        ParamSpec::float("clip_ratio_c")
            .default(3.0)
            .gt(1.0)
            .doc("dual-clip constant (vanilla); importance-ratio truncation (dppo_*)"),
        ParamSpec::float("kl_cov_ratio")
            .default(0.0002)
            .gt(0.0)
            .max(1.0)
            .doc("kl_cov: fraction of the tokens (largest covariance) that get the KL penalty"),
        ParamSpec::one_of(
            "loss_agg_mode",
            &[
                "token-mean",
                "token-sum",
                "seq-mean-token-sum",
                "seq-mean-token-mean",
                "seq-mean-token-sum-norm",
            ],
        )
        .default("token-mean")
        .doc("loss aggregation (verl loss_agg_mode)"),
        ParamSpec::table(
            "kl",
            vec![
                ParamSpec::one_of("estimator", &KL_ESTIMATORS)
                    .default("low_var_kl")
                    .doc("KL estimator (verl kl_loss_type)"),
                ParamSpec::float("coef")
                    .default(0.001)
                    .min(0.0)
                    .doc("KL loss coefficient (verl kl_loss_coef)"),
            ],
        )
        .switch()
        .doc("KL loss against `ref_log_probs` (verl use_kl_loss; absent = no KL loss)"),
        ParamSpec::array("betas", ParamType::Float)
            .default(json!([0.9, 0.999]))
            .doc("AdamW (β1, β2)"),
    ]
}

#[test]
fn table_enum_resource_and_flatten_specs_equal_the_hand_written_ones() {
    let derived = PpoParams::param_specs();
    for (d, h) in derived.iter().zip(ppo_hand_written()) {
        assert_eq!(*d, h);
    }
    assert_eq!(derived, ppo_hand_written());
}

/// What the compiler hands `build` when only `model` is written: every default filled in.
fn filled_defaults(specs: &[ParamSpec], written: serde_json::Value) -> Params {
    let serde_json::Value::Object(mut map) = written else {
        unreachable!()
    };
    for s in specs {
        if let (false, Some(d)) = (map.contains_key(&s.name), &s.default) {
            map.insert(s.name.clone(), d.clone());
        }
    }
    Params::from_map(map)
}

#[test]
fn defaults_declared_once_are_what_serde_reads() {
    let p: PpoParams = filled_defaults(&PpoParams::param_specs(), json!({"model": "policy"}))
        .parse()
        .unwrap();
    assert_eq!(p.model, "policy");
    assert_eq!(p.ppo_epochs, 1);
    assert_eq!(p.loss_agg_mode, LossAggMode::TokenMean);
    assert!(p.kl.is_none() && p.mini_batch_size.is_none());
    assert!(p.micro.micro_batch_size.is_none());
    assert_eq!(p.betas, [0.9, 0.999]);
    let p: PpoParams = filled_defaults(
        &PpoParams::param_specs(),
        json!({"model": "policy", "loss_agg_mode": "seq-mean-token-sum",
               "kl": {"estimator": "k3", "coef": 0.1}, "micro_batch_size": 4}),
    )
    .parse()
    .unwrap();
    assert_eq!(p.loss_agg_mode, LossAggMode::SeqMeanTokenSum);
    assert_eq!(p.kl.unwrap().estimator, "k3");
    assert_eq!(p.micro.micro_batch_size, Some(4));
}

#[test]
fn choices_are_strings_both_ways() {
    assert_eq!(
        LossAggMode::SeqMeanTokenSumNorm.to_string(),
        "seq-mean-token-sum-norm"
    );
    assert_eq!("token-sum".parse(), Ok(LossAggMode::TokenSum));
    let e = "token_sum".parse::<LossAggMode>().unwrap_err().to_string();
    assert!(
        e.starts_with("\"token_sum\" is not one of \"token-mean\" | \"token-sum\""),
        "{e}"
    );
    assert_eq!(LossAggMode::ALL[1], (LossAggMode::TokenSum, "token-sum"));
    assert_eq!(
        serde_json::to_value(LossAggMode::TokenMean).unwrap(),
        json!("token-mean")
    );
    let e = serde_json::from_value::<LossAggMode>(json!("mean"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown variant `mean`"), "{e}");

    #[derive(Clone, Copy, Debug, PartialEq, ParamChoice)]
    enum Schedule {
        Constant,
        #[serde(rename = "cosine")]
        CosineDecay,
        WarmupStable,
    }
    assert_eq!(
        Schedule::NAMES,
        ["constant", "cosine", "warmup_stable"].as_slice()
    );
}

#[test]
fn field_types_rename_and_nested_tables() {
    #[derive(Deserialize, Params)]
    struct Inner {
        #[param(default = 2)]
        k: u32,
    }
    #[derive(Deserialize, Params)]
    struct Outer {
        /// where to write
        #[param(required)]
        path: PathBuf,
        #[serde(rename = "type")]
        #[param(default = "a")]
        kind: String,
        extra: Option<serde_json::Value>,
        #[param(default = json!([]))]
        names: Vec<String>,
        inner: Inner,
        #[serde(skip)]
        #[allow(dead_code)]
        cache: Vec<u8>,
        #[serde(default)]
        flag: bool,
        /// integer defaults of float fields are floats, as written integers are
        #[param(default = 1)]
        coef: f64,
        #[param(default = [1, 2])]
        weights: Option<Vec<f32>>,
    }
    assert_eq!(
        Outer::param_specs(),
        vec![
            ParamSpec::path("path").required().doc("where to write"),
            ParamSpec::string("type").default("a"),
            ParamSpec::any("extra"),
            ParamSpec::array("names", ParamType::String).default(json!([])),
            ParamSpec::table("inner", vec![ParamSpec::int("k").default(2)]),
            ParamSpec::bool("flag"),
            ParamSpec::float("coef")
                .default(1.0)
                .doc("integer defaults of float fields are floats, as written integers are"),
            ParamSpec::array("weights", ParamType::Float).default(json!([1.0, 2.0])),
        ]
    );
}

#[test]
fn the_test_kinds_declare_what_they_did_by_hand() {
    use testkit::*;
    assert_eq!(
        Source.params(),
        vec![
            ParamSpec::int("count").default(3).min(1.0),
            ParamSpec::float("scale").default(1.0).gt(0.0),
            ParamSpec::one_of("mode", &["uniform", "normal"]).default("uniform"),
            ParamSpec::table("opts", vec![ParamSpec::float("coef").default(0.5).min(0.0)]),
        ]
    );
    assert_eq!(
        WeightKind.params(),
        vec![
            ParamSpec::float("init").default(0.0),
            ParamSpec::resource("from", "model").doc("copy another model"),
        ]
    );
    assert_eq!(
        Train.params(),
        vec![
            ParamSpec::resource("model", "model").required(),
            ParamSpec::float("lr").default(0.1).gt(0.0),
        ]
    );
    assert_eq!(
        Sink.params(),
        vec![ParamSpec::int("fail_at").doc("1-based step that fails")]
    );
    assert_eq!(
        Every.params(),
        vec![ParamSpec::int("every").default(2).min(1.0)]
    );
    assert_eq!(
        Score.params(),
        vec![ParamSpec::int("micro").default(1).min(1.0)]
    );
}

#[test]
fn typed_ports_read_and_write_their_rust_type() {
    const SCALAR: ValueType<f64> = ValueType::new("Scalar");
    const X: Port<f64> = Port::new("x", SCALAR);
    const Y: Port<f64> = Port::new("y", SCALAR);
    let spec = X.spec().optional();
    assert_eq!(
        (spec.name.as_str(), spec.ty, spec.optional),
        ("x", PortType::new("Scalar"), true)
    );

    let out = Outputs::new().with(X, 2.5);
    assert_eq!(*out.get_arc(X).unwrap(), 2.5);
    // The string API still works on the same values.
    assert_eq!(*out.get_arc::<f64>("x").unwrap(), 2.5);
    let mut inputs = Inputs::new("n");
    inputs.insert(
        X.name(),
        Value::new(X.port_type(), Payload::new(*out.get_arc(X).unwrap())),
    );
    assert_eq!(*inputs.get(X).unwrap(), 2.5);
    assert_eq!(inputs.get_opt(Y).unwrap(), None);
    assert_eq!(*inputs.get_arc(X).unwrap(), 2.5);
    let e = inputs.get(Y).unwrap_err().to_string();
    assert_eq!(e, "node `n` has no value on input `y`");
}

/// Reports, as warnings, what its `validate` hook finds upstream; with `strict`, parses a struct
/// that does not match its schema.
struct Probe;
#[derive(Deserialize)]
struct Mismatched {
    n: usize,
}
impl NodeKind for Probe {
    fn name(&self) -> &str {
        "test.probe"
    }
    fn doc(&self) -> &str {
        "upstream questions"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![Port::new("n", testkit::NUMBERS).spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec::bool("strict").default(false),
            ParamSpec::int("n"),
        ]
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        if ctx.params().get_bool("strict") == Some(true) {
            return match ctx.parse::<Mismatched>() {
                Ok(_) => vec![],
                Err(d) => d,
            };
        }
        let me = ctx.node().unwrap();
        let name = |n: Option<NodeView>| n.map_or("none".to_string(), |n| n.name().to_string());
        vec![ctx.warning(
            "strict",
            format!(
                "producing Numbers: {}, with draws: {}, producing Scores: {}",
                name(me.find_upstream_producing(testkit::NUMBERS)),
                name(me.find_upstream_with(testkit::DRAWS)),
                name(me.find_upstream_producing(testkit::SCORES)),
            ),
        )]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        anyhow::bail!("not built")
    }
}

const PROBED: &str = r#"
[nodes.src]
kind = "test.source"

[nodes.add]
kind = "test.add"
inputs = { a = "src.n" }

[nodes.probe]
kind = "test.probe"
inputs = { n = "add.sum" }
"#;

#[test]
fn validate_finds_upstream_nodes_by_port_type_and_capability() {
    let registry = testkit::registry().with_kind(Probe);
    let (_, warnings) = compile(&registry, "g.toml", PROBED, &[]).unwrap();
    let messages: Vec<&str> = warnings.iter().map(|d| d.message.as_str()).collect();
    assert_eq!(
        messages,
        ["producing Numbers: add, with draws: src, producing Scores: none"]
    );
    let sets = Override::sets(&["nodes.probe.strict=true".to_string()]);
    let Err(f) = compile(&registry, "g.toml", PROBED, &sets) else {
        panic!("a struct that does not match the schema is an error")
    };
    let d: Vec<(Code, &str)> = f
        .diagnostics
        .iter()
        .map(|d| (d.code, d.message.as_str()))
        .collect();
    assert_eq!(
        d,
        [(
            Code::InvalidValue,
            "`probe`: invalid parameters: missing field `n` (the kind's parameter struct does not \
             match its schema)"
        )]
    );
}

/// Specs that a helper builds with arguments (as nodes' `micro_batches::param_specs(default,
/// doc)` does), for a flattened field.
fn rows_specs(doc: &str) -> Vec<ParamSpec> {
    vec![ParamSpec::int("rows").min(1.0).doc(doc)]
}

#[test]
fn a_flattened_field_may_take_its_specs_from_an_expression() {
    #[derive(Deserialize)]
    struct Rows {
        rows: Option<usize>,
    }
    #[derive(Deserialize, Params)]
    struct P {
        #[param(default = 0.5)]
        a: f64,
        #[serde(flatten)]
        #[param(specs = rows_specs("rows per micro-batch"))]
        rows: Rows,
    }
    assert_eq!(
        P::param_specs(),
        vec![
            ParamSpec::float("a").default(0.5),
            ParamSpec::int("rows").min(1.0).doc("rows per micro-batch"),
        ]
    );
    let p: P = filled_defaults(&P::param_specs(), json!({"rows": 3}))
        .parse()
        .unwrap();
    assert_eq!((p.a, p.rows.rows), (0.5, Some(3)));
}

/// An enum of a crate that does not depend on the engine: names by `FromStr`, no `ParamChoice`.
#[derive(Debug, PartialEq)]
enum Foreign {
    Vanilla,
    ClipCov,
}
impl Foreign {
    const ALL: [(Foreign, &'static str); 2] = [
        (Foreign::Vanilla, "vanilla"),
        (Foreign::ClipCov, "clip_cov"),
    ];
}
impl std::str::FromStr for Foreign {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "vanilla" => Ok(Foreign::Vanilla),
            "clip_cov" => Ok(Foreign::ClipCov),
            _ => Err(format!("unknown policy loss `{s}`")),
        }
    }
}

#[test]
fn a_foreign_enum_is_read_by_name_with_its_choices_declared() {
    #[derive(Deserialize, Params)]
    struct P {
        /// policy loss by verl's name
        #[serde(deserialize_with = "flowrl_engine::params::by_name")]
        #[param(one_of = &Foreign::ALL.map(|(_, n)| n), default = "vanilla")]
        policy_loss: Foreign,
    }
    assert_eq!(
        P::param_specs(),
        vec![
            ParamSpec::one_of("policy_loss", &["vanilla", "clip_cov"])
                .default("vanilla")
                .doc("policy loss by verl's name")
        ]
    );
    let p: P = filled_defaults(&P::param_specs(), json!({}))
        .parse()
        .unwrap();
    assert_eq!(p.policy_loss, Foreign::Vanilla);
    let e = filled_defaults(&P::param_specs(), json!({"policy_loss": "gspo"}))
        .parse::<P>()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("unknown policy loss `gspo`"), "{e}");
}
