//! Parity with verl for every loss of the policy-loss registry: every case of every vector file
//! of the registry layout (`policy_loss*.json` with a top-level `losses` object, e.g.
//! `policy_losses.json`) in `$FLOWRL_GRPO_FIXTURES`, or the repository's `tests/fixtures/grpo`.
//! Losses, settings, modes, cases and shapes are all read from the files.
//!
//! Shared by two test binaries, one per float type (the Flex device's default dtype is set once
//! per process): `policy_losses_f32` compares with the float32 fields within
//! 1e-5·max(1, |want|) and skips the results flagged `f32_sensitive` (their float32 value is an
//! artefact of summation order); `policy_losses_f64` computes in float64 and compares every
//! result with the `_f64` fields within 1e-6·max(1, |want|) (fixture README). Compared per
//! result: `pg_loss`, the set of metric keys and their values, `grad_log_prob` (autodiff);
//! per setting: `per_token_loss` (token-sum, no weights, at valid tokens), the clip_cov /
//! kl_cov token selection (exactly; clip_cov replays the recorded `randperm`) and the recorded
//! errors. A result marked `same_for_all_loss_agg_modes` is checked under all five modes. The
//! file's `losses` metadata (fields read, metric keys, whether the mode and the global info are
//! used, randomness) must agree with [`PolicyLossMode`]'s declarations, which `update.ppo`'s
//! warnings rely on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::DType;
use serde_json::Value;

use flowrl_algorithms::*;

type Ad = Autodiff<Flex>;

/// The float type a run computes in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Float {
    F32,
    F64,
}

impl Float {
    /// The field suffix compared against and the relative tolerance.
    fn field(self) -> (&'static str, f64) {
        match self {
            Float::F32 => ("", 1e-5),
            Float::F64 => ("_f64", 1e-6),
        }
    }
}

fn fixture_dir() -> PathBuf {
    match std::env::var_os("FLOWRL_GRPO_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/grpo"),
    }
}

/// The documents of the registry layout, by file name.
fn documents() -> Vec<(String, Value)> {
    let dir = fixture_dir();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fixture directory {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("policy_loss") && name.ends_with(".json")
        })
        .collect();
    paths.sort();
    let docs: Vec<(String, Value)> = paths
        .into_iter()
        .map(|p| {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), v)
        })
        .filter(|(_, v)| v.get("losses").is_some())
        .collect();
    if std::env::var_os("FLOWRL_GRPO_FIXTURES").is_some() && docs.is_empty() {
        eprintln!(
            "no policy-loss registry vectors in {}: skipped",
            dir.display()
        );
    } else {
        assert!(
            !docs.is_empty(),
            "no policy_loss*.json with `losses` in {}",
            dir.display()
        );
    }
    for (file, v) in &docs {
        assert!(
            v["cases"].as_array().is_some_and(|c| !c.is_empty()),
            "{file}: no cases"
        );
    }
    docs
}

/// Flattens a number, bool or nested list (row-major); null is NaN.
fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(a) => a.iter().flat_map(flat).collect(),
        Value::Number(n) => vec![n.as_f64().unwrap()],
        Value::Null => vec![f64::NAN],
        Value::Bool(b) => vec![if *b { 1.0 } else { 0.0 }],
        other => panic!("not numeric: {other}"),
    }
}

/// One comparison run: counts and failures, per loss.
struct Report {
    float: Float,
    checked: usize,
    skipped_sensitive: usize,
    results: BTreeMap<String, usize>,
    failures: Vec<String>,
}

impl Report {
    fn close(&self, got: f64, want: f64) -> bool {
        let tol = self.float.field().1;
        (got.is_nan() && want.is_nan()) || (got - want).abs() <= tol * want.abs().max(1.0)
    }

    /// Compares `got` with `obj[key + suffix]`.
    fn field(&mut self, ctx: &str, got: &[f64], obj: &Value, key: &str) {
        let name = format!("{key}{}", self.float.field().0);
        let Some(want) = obj.get(&name).map(flat) else {
            self.failures.push(format!("{ctx}: no field {name}"));
            return;
        };
        self.values(&format!("{ctx}.{name}"), got, &want);
    }

    fn values(&mut self, ctx: &str, got: &[f64], want: &[f64]) {
        if got.len() != want.len() {
            self.failures.push(format!(
                "{ctx}: got {} values, want {}",
                got.len(),
                want.len()
            ));
            return;
        }
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            self.checked += 1;
            if !self.close(g, w) {
                self.failures
                    .push(format!("{ctx}[{i}]: got {g}, want {w} (diff {:e})", g - w));
            }
        }
    }
}

/// The case's inputs as tensors of the run's float type.
struct Case<'a> {
    value: &'a Value,
    rows: usize,
    cols: usize,
    float: Float,
}

impl Case<'_> {
    fn tensor(&self, key: &str) -> Tensor<Ad, 2> {
        let v = flat(&self.value["inputs"][key]);
        let shape = [self.rows, self.cols];
        let data = match self.float {
            Float::F32 => TensorData::new(v.into_iter().map(|x| x as f32).collect(), shape),
            Float::F64 => TensorData::new(v, shape),
        };
        let t = Tensor::from_data(data, &Default::default());
        let want = match self.float {
            Float::F32 => DType::F32,
            Float::F64 => DType::F64,
        };
        assert_eq!(t.dtype(), want, "the run's float type");
        t
    }

    fn mask(&self) -> Vec<f64> {
        flat(&self.value["inputs"]["response_mask"])
    }
}

/// verl's actor configuration for a `setting` (fields not listed keep verl's defaults; a null
/// `clip_ratio_low` / `clip_ratio_high` falls back to `clip_ratio`).
fn config(loss: PolicyLossMode, s: &Value) -> PolicyLossConfig {
    let num =
        |v: &Value, key: &str, default: f64| v.get(key).and_then(Value::as_f64).unwrap_or(default);
    let bound = |key: &str| match s.get(key) {
        Some(v) => v.as_f64(),
        None => Some(0.2),
    };
    let pl = &s["policy_loss"];
    PolicyLossConfig {
        loss_mode: loss,
        clip: ClipConfig {
            clip_ratio: num(s, "clip_ratio", 0.2),
            clip_ratio_low: bound("clip_ratio_low"),
            clip_ratio_high: bound("clip_ratio_high"),
            clip_ratio_c: num(s, "clip_ratio_c", 3.0),
        },
        tau_pos: num(s, "tau_pos", 1.0),
        tau_neg: num(s, "tau_neg", 1.05),
        clip_cov: ClipCovConfig {
            ratio: num(pl, "clip_cov_ratio", 0.0002),
            lb: num(pl, "clip_cov_lb", 1.0),
            ub: num(pl, "clip_cov_ub", 5.0),
        },
        kl_cov: KlCovConfig {
            ratio: num(pl, "kl_cov_ratio", 0.0002),
            coef: num(pl, "ppo_kl_coef", 0.1),
        },
        dro_beta: pl.get("dro_beta").and_then(Value::as_f64),
    }
}

fn batch_info(v: &Value) -> GlobalBatchInfo {
    GlobalBatchInfo {
        dp_size: v.get("dp_size").and_then(Value::as_u64).unwrap_or(1) as usize,
        batch_num_tokens: v.get("batch_num_tokens").and_then(Value::as_f64),
        global_batch_size: v.get("global_batch_size").and_then(Value::as_f64),
        loss_scale_factor: v.get("loss_scale_factor").and_then(Value::as_f64),
    }
}

fn host<const D: usize>(t: Tensor<Ad, D>) -> Vec<f64> {
    t.into_data().iter::<f64>().collect()
}

/// One call of the loss: its output and d pg_loss / d log_prob.
fn call(
    case: &Case,
    config: &PolicyLossConfig,
    mode: LossAggMode,
    info: &GlobalBatchInfo,
    weights: bool,
    randperm: Option<&[usize]>,
) -> flowrl_algorithms::Result<(PolicyLossOutput<Ad>, Vec<f64>)> {
    let log_prob = case.tensor("log_prob").require_grad();
    let inputs = PolicyLossInputs {
        old_log_prob: case.tensor("old_log_prob"),
        log_prob: log_prob.clone(),
        advantages: case.tensor("advantages"),
        response_mask: case.tensor("response_mask"),
        rollout_is_weights: weights.then(|| case.tensor("rollout_is_weights")),
    };
    // Replays the reference's permutation; an unrecorded draw returns none, which the loss
    // refuses (and the test reports).
    let mut replay = |_k: usize| randperm.map(<[usize]>::to_vec).unwrap_or_default();
    let out = compute_policy_loss(config, inputs, mode, info, &mut replay)?;
    let grads = out.pg_loss.backward();
    let grad = log_prob
        .grad(&grads)
        .map(|g| g.into_data().iter::<f64>().collect())
        .unwrap_or_else(|| vec![0.0; case.rows * case.cols]);
    Ok((out, grad))
}

/// The declarations of [`PolicyLossMode`] against the file's `losses` metadata.
fn check_metadata(r: &mut Report, file: &str, losses: &Value) {
    for (name, meta) in losses.as_object().unwrap() {
        let ctx = format!("{file}:losses.{name}");
        let Ok(mode) = name.parse::<PolicyLossMode>() else {
            r.failures
                .push(format!("{ctx}: no implementation of this loss"));
            continue;
        };
        let strings = |key: &str| -> BTreeSet<String> {
            meta[key]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| s.as_str().unwrap().to_string())
                .collect()
        };
        let read: BTreeSet<String> = strings("config_fields_read")
            .into_iter()
            .filter(|f| f != "global_batch_info")
            .map(|f| f.trim_start_matches("policy_loss.").to_string())
            .collect();
        let ours: BTreeSet<String> = mode.reads().iter().map(|s| s.to_string()).collect();
        let agg = mode.aggregation();
        let metric_keys: BTreeSet<String> =
            mode.metric_keys().iter().map(|s| s.to_string()).collect();
        let checks = [
            ("config_fields_read", read == ours),
            ("metric_keys", strings("metric_keys") == metric_keys),
            (
                "same_for_all_loss_agg_modes",
                meta["same_for_all_loss_agg_modes"].as_bool()
                    == Some(agg != LossAggregation::Configured),
            ),
            (
                "uses_global_batch_info",
                meta["uses_global_batch_info"].as_bool() == Some(agg != LossAggregation::RowMean),
            ),
            (
                "draws_random_numbers",
                meta["draws_random_numbers"].as_bool() == Some(mode.draws_random_numbers()),
            ),
        ];
        for (what, ok) in checks {
            r.checked += 1;
            if !ok {
                r.failures.push(format!(
                    "{ctx}.{what}: the file says {}, PolicyLossMode::{mode:?} disagrees",
                    meta.get(what).unwrap_or(&Value::Null)
                ));
            }
        }
    }
}

/// A recorded `error`: the call must fail; with verl's message where verl raised a `ValueError`
/// of its own (an `AssertionError` or torch's `RuntimeError` only has to be an error).
fn check_error(r: &mut Report, ctx: &str, got: flowrl_algorithms::Result<()>, want: &Value) {
    r.checked += 1;
    let msg = match want["error"].as_str() {
        Some("ValueError") => want["error_message"].as_str().unwrap_or(""),
        _ => "",
    };
    match got {
        Ok(()) => r
            .failures
            .push(format!("{ctx}: want error {}, got a loss", want["error"])),
        Err(e) if !e.to_string().contains(msg) => r
            .failures
            .push(format!("{ctx}: error {e}, want message {msg:?}")),
        Err(_) => {}
    }
}

fn check_per_setting(r: &mut Report, file: &str, case: &Case, ps: &Value) {
    let loss = ps["loss"].as_str().unwrap();
    let ctx = format!(
        "{file}:{}:{loss}:setting{}",
        case.value["name"], ps["setting_index"]
    );
    let Ok(mode) = loss.parse::<PolicyLossMode>() else {
        r.failures
            .push(format!("{ctx}: no implementation of this loss"));
        return;
    };
    let cfg = config(mode, &ps["setting"]);
    let randperm: Option<Vec<usize>> = ps["selection"]["randperm"]
        .as_array()
        .map(|a| a.iter().map(|x| x.as_u64().unwrap() as usize).collect());
    let local = GlobalBatchInfo::default();
    let got = call(
        case,
        &cfg,
        LossAggMode::TokenSum,
        &local,
        false,
        randperm.as_deref(),
    );
    if ps.get("error").is_some() {
        check_error(r, &ctx, got.map(|_| ()), ps);
        return;
    }
    let (out, _) = match got {
        Ok(x) => x,
        Err(e) => {
            r.failures.push(format!("{ctx}: unexpected error {e}"));
            return;
        }
    };
    if ps.get("per_token_loss").is_some() {
        match out.per_token_loss {
            Some(pt) => {
                let masked: Vec<f64> = host(pt)
                    .iter()
                    .zip(case.mask())
                    .map(|(l, m)| if m != 0.0 { l * m } else { 0.0 })
                    .collect();
                r.field(&format!("{ctx}:per_token"), &masked, ps, "per_token_loss");
            }
            None => r.failures.push(format!("{ctx}: no per-token loss")),
        }
    }
    if let Some(sel) = ps.get("selection") {
        r.checked += 1;
        let want: Vec<bool> = flat(&sel["selected"]).iter().map(|&x| x != 0.0).collect();
        match &out.selected {
            Some(got) if *got == want => {}
            got => r
                .failures
                .push(format!("{ctx}: selected {got:?}, want {want:?}")),
        }
    }
}

fn check_result(r: &mut Report, file: &str, case: &Case, res: &Value, per_setting: &[Value]) {
    let loss = res["loss"].as_str().unwrap();
    let ctx = format!(
        "{file}:{}:{loss}:setting{}:{}:{}:w={}",
        case.value["name"],
        res["setting_index"],
        res["loss_agg_mode"].as_str().unwrap_or(""),
        res["global_batch_info_name"].as_str().unwrap_or(""),
        res["rollout_is_weights"]
    );
    let Ok(loss_mode) = loss.parse::<PolicyLossMode>() else {
        r.failures
            .push(format!("{ctx}: no implementation of this loss"));
        return;
    };
    if r.float == Float::F32 && res["f32_sensitive"].as_bool().unwrap_or(false) {
        r.skipped_sensitive += 1;
        return;
    }
    *r.results.entry(loss.to_string()).or_default() += 1;
    let cfg = config(loss_mode, &res["setting"]);
    let info = batch_info(&res["global_batch_info"]);
    let weights = res["rollout_is_weights"].as_bool().unwrap_or(false);
    let randperm: Option<Vec<usize>> = per_setting
        .iter()
        .find(|p| p["loss"] == res["loss"] && p["setting_index"] == res["setting_index"])
        .and_then(|p| p["selection"]["randperm"].as_array())
        .map(|a| a.iter().map(|x| x.as_u64().unwrap() as usize).collect());
    let ignores_mode = loss_mode.aggregation() != LossAggregation::Configured;
    let recorded: LossAggMode = match res["loss_agg_mode"].as_str().unwrap_or("").parse() {
        Ok(m) => m,
        // A loss that ignores the mode takes any name; the others raise verl's error.
        Err(_) if ignores_mode => LossAggMode::TokenMean,
        Err(e) => {
            match res.get("error") {
                Some(_) => check_error(r, &ctx, Err(e), res),
                None => r.failures.push(format!("{ctx}: {e}")),
            }
            return;
        }
    };
    // A loss that ignores the mode must give the recorded numbers under every mode.
    let modes: Vec<LossAggMode> = if res["same_for_all_loss_agg_modes"].as_bool() == Some(true) {
        LossAggMode::ALL.map(|(m, _)| m).to_vec()
    } else {
        vec![recorded]
    };
    for mode in modes {
        let ctx = format!("{ctx}:as {mode}");
        let got = call(case, &cfg, mode, &info, weights, randperm.as_deref());
        if res.get("error").is_some() {
            check_error(r, &ctx, got.map(|_| ()), res);
            continue;
        }
        let (out, grad) = match got {
            Ok(x) => x,
            Err(e) => {
                r.failures.push(format!("{ctx}: unexpected error {e}"));
                continue;
            }
        };
        r.field(&ctx, &host(out.pg_loss.clone()), res, "pg_loss");
        r.field(&ctx, &grad, res, "grad_log_prob");
        let suffix = r.float.field().0;
        let want = res[format!("metrics{suffix}")]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let metrics = out.metrics();
        let got_keys: BTreeSet<&str> = metrics.iter().map(|(k, _)| *k).collect();
        let want_keys: BTreeSet<&str> = want.keys().map(String::as_str).collect();
        r.checked += 1;
        if got_keys != want_keys {
            r.failures.push(format!(
                "{ctx}: metric keys {got_keys:?}, want {want_keys:?}"
            ));
        }
        for (key, value) in metrics {
            if let Some(w) = want.get(key) {
                r.values(
                    &format!("{ctx}.metrics{suffix}.{key}"),
                    &host(value),
                    &flat(w),
                );
            }
        }
    }
}

/// Runs every case of every registry document in `float` and asserts there is no mismatch.
pub fn run(float: Float) {
    if float == Float::F64 {
        let device = Default::default();
        burn::tensor::set_default_dtypes::<Ad>(&device, DType::F64, DType::I64)
            .expect("the f64 test binary sets the device's dtypes before any tensor");
    }
    let mut r = Report {
        float,
        checked: 0,
        skipped_sensitive: 0,
        results: BTreeMap::new(),
        failures: Vec::new(),
    };
    for (file, doc) in documents() {
        check_metadata(&mut r, &file, &doc["losses"]);
        for value in doc["cases"].as_array().unwrap() {
            let shape: Vec<usize> = value["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            let case = Case {
                value,
                rows: shape[0],
                cols: shape[1],
                float,
            };
            let per_setting = value["per_setting"].as_array().cloned().unwrap_or_default();
            for ps in &per_setting {
                check_per_setting(&mut r, &file, &case, ps);
            }
            for res in value["results"].as_array().unwrap() {
                check_result(&mut r, &file, &case, res, &per_setting);
            }
        }
    }
    let per_loss: Vec<String> = r.results.iter().map(|(k, n)| format!("{k} {n}")).collect();
    eprintln!(
        "policy losses ({float:?}): {} values checked; results per loss: {}; {} f32-sensitive results left to the f64 run; {} mismatches",
        r.checked,
        per_loss.join(", "),
        r.skipped_sensitive,
        r.failures.len()
    );
    if std::env::var_os("FLOWRL_GRPO_FIXTURES").is_none() {
        assert!(r.checked > 0, "nothing checked");
    }
    assert!(
        r.failures.is_empty(),
        "{} mismatches:\n{}",
        r.failures.len(),
        r.failures.join("\n")
    );
}
