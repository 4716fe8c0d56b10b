//! Parity with verl: runs every case of every vector file in the fixture directory.
//!
//! The directory is `$FLOWRL_GRPO_FIXTURES`, or the repository's `tests/fixtures/grpo`.
//! Files are recognised by name (`advantage*.json`, `policy_loss*.json`, `kl*.json`,
//! `agg_loss*.json`, `entropy*.json`, `geo3k_reward*.json`) and cases by iteration, so other
//! vector sets of the same format can be substituted. A `policy_loss*.json` in the registry
//! layout (a top-level `losses` object: `policy_losses.json`) is left to
//! `tests/policy_losses_f32.rs` and `tests/policy_losses_f64.rs`.
//!
//! Tolerances (fixture README): a value passes when it is within 1e-5·max(1, |want|) of the
//! float32 field or of its `_f64` twin. Cases flagged `f32_sensitive` (the float32 reference
//! depends on summation order) are compared with the `_f64` field only, at 2e-4·max(1, |want|);
//! a `*_vectorized` estimator may instead match the `_f64` field of its non-vectorised twin
//! (same kwargs), since its own `_f64` fields can still carry float32 statistics. geo3k verdicts
//! must agree exactly. Computations run in float32 on the Flex backend (autodiff for gradients),
//! except the advantage estimators outside [`AdvantageEstimator`] (GAE, GDPO, pass@k, OPO,
//! ReMax, GPG, the optimal token baselines: `advantage_more.json`), which compute on the host in
//! f64 and must match the `_f64` field within 1e-6·max(1, |want|) and the float32 field within
//! 1e-5·max(1, |want|) (only the former when flagged `f32_sensitive`); an estimator name that
//! flowrl does not implement is a failure.

use std::path::PathBuf;

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use serde_json::Value;

use flowrl_algorithms::rewards::{acc_reward, extract_boxed_content, format_reward, geo3k_score};
use flowrl_algorithms::*;

type Cpu = Flex;
type Ad = Autodiff<Flex>;

fn fixture_dir() -> PathBuf {
    match std::env::var_os("FLOWRL_GRPO_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/grpo"),
    }
}

/// The JSON documents whose file name starts with `prefix` and ends with `.json`.
fn documents(prefix: &str) -> Vec<(String, Value)> {
    let dir = fixture_dir();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fixture directory {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(prefix) && name.ends_with(".json")
        })
        .collect();
    paths.sort();
    // The repository's own set must be complete; a substituted set may hold only some kinds.
    if std::env::var_os("FLOWRL_GRPO_FIXTURES").is_some() && paths.is_empty() {
        eprintln!("no {prefix}*.json in {}: skipped", dir.display());
    } else {
        assert!(!paths.is_empty(), "no {prefix}*.json in {}", dir.display());
    }
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let v: Value = serde_json::from_str(&text).unwrap();
            assert!(
                v["cases"].as_array().is_some_and(|c| !c.is_empty()),
                "{}: no cases",
                p.display()
            );
            (p.file_name().unwrap().to_string_lossy().into_owned(), v)
        })
        .collect()
}

/// Collects mismatches so that one run reports all of them.
#[derive(Default)]
struct Report {
    checked: usize,
    failures: Vec<String>,
}

impl Report {
    /// Compares `got` with the plain field and its `_f64` twin (see the module docs).
    fn values(
        &mut self,
        ctx: &str,
        got: &[f64],
        plain: Option<&[f64]>,
        f64_twin: Option<&[f64]>,
        sensitive: bool,
    ) {
        let close = |g: f64, w: f64, tol: f64| {
            (g.is_nan() && w.is_nan()) || (g - w).abs() <= tol * w.abs().max(1.0)
        };
        for (i, &g) in got.iter().enumerate() {
            self.checked += 1;
            let ok = if sensitive {
                let w = f64_twin.unwrap_or_else(|| panic!("{ctx}: f32_sensitive without _f64"));
                close(g, w[i], 2e-4)
            } else {
                plain.is_some_and(|p| close(g, p[i], 1e-5))
                    || f64_twin.is_some_and(|f| close(g, f[i], 1e-5))
            };
            if !ok {
                self.failures.push(format!(
                    "{ctx}[{i}]: got {g}, want {:?} (f64 {:?})",
                    plain.map(|p| p[i]),
                    f64_twin.map(|f| f[i])
                ));
            }
        }
        let want_len = plain.or(f64_twin).map(|w| w.len()).unwrap_or(0);
        if want_len != got.len() {
            self.failures
                .push(format!("{ctx}: got {} values, want {want_len}", got.len()));
        }
    }

    fn field(&mut self, ctx: &str, got: &[f64], obj: &Value, key: &str, sensitive: bool) {
        let plain = obj.get(key).map(flat);
        let twin = obj.get(format!("{key}_f64")).map(flat);
        self.values(
            &format!("{ctx}.{key}"),
            got,
            plain.as_deref(),
            twin.as_deref(),
            sensitive,
        );
    }

    fn finish(self, what: &str) {
        eprintln!(
            "{what}: {} values checked, {} mismatches",
            self.checked,
            self.failures.len()
        );
        if std::env::var_os("FLOWRL_GRPO_FIXTURES").is_none() {
            assert!(self.checked > 0, "{what}: nothing checked");
        }
        assert!(
            self.failures.is_empty(),
            "{what}: {} mismatches:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

/// Flattens a number or nested list of numbers (row-major).
fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(a) => a.iter().flat_map(flat).collect(),
        Value::Number(n) => vec![n.as_f64().unwrap()],
        Value::Null => vec![f64::NAN],
        Value::Bool(b) => vec![if *b { 1.0 } else { 0.0 }],
        other => panic!("not numeric: {other}"),
    }
}

fn shape(case: &Value) -> Vec<usize> {
    case["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn t2<BK: Backend>(v: &Value, rows: usize, cols: usize) -> Tensor<BK, 2> {
    let data: Vec<f32> = flat(v).into_iter().map(|x| x as f32).collect();
    Tensor::from_data(TensorData::new(data, [rows, cols]), &Default::default())
}

fn host<BK: Backend, const D: usize>(t: Tensor<BK, D>) -> Vec<f64> {
    t.into_data().iter::<f64>().collect()
}

fn sensitive(case: &Value) -> bool {
    case["f32_sensitive"].as_bool().unwrap_or(false)
}

fn opt_f64(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn batch_info(kwargs: &Value) -> GlobalBatchInfo {
    GlobalBatchInfo {
        dp_size: kwargs.get("dp_size").and_then(|v| v.as_u64()).unwrap_or(1) as usize,
        batch_num_tokens: kwargs.get("batch_num_tokens").and_then(opt_f64),
        global_batch_size: kwargs.get("global_batch_size").and_then(opt_f64),
        loss_scale_factor: kwargs.get("loss_scale_factor").and_then(opt_f64),
    }
}

fn estimator(name: &str, kwargs: &Value) -> AdvantageEstimator {
    match name {
        "grpo" | "grpo_vectorized" => AdvantageEstimator::Grpo {
            norm_by_std: kwargs["norm_adv_by_std_in_grpo"].as_bool().unwrap_or(true),
            epsilon: kwargs["epsilon"].as_f64().unwrap_or(1e-6),
        },
        "reinforce_plus_plus" => AdvantageEstimator::ReinforcePlusPlus {
            gamma: kwargs["config"]["gamma"].as_f64().unwrap_or(1.0),
        },
        other => other.parse().unwrap(),
    }
}

#[test]
fn advantage_vectors() {
    let mut r = Report::default();
    for (file, doc) in documents("advantage") {
        for case in doc["cases"].as_array().unwrap() {
            let (rows, cols) = (shape(case)[0], shape(case)[1]);
            let inputs = &case["inputs"];
            let index: Vec<String> = inputs["index"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect();
            let results = case["results"].as_array().unwrap();
            for res in results {
                let name = res["estimator"].as_str().unwrap();
                let ctx = format!("{file}:{}:{name}:{}", case["name"], res["kwargs"]);
                if name.parse::<AdvantageEstimator>().is_err() {
                    check_host_estimator(&mut r, &ctx, case, res);
                    continue;
                }
                let out = compute_advantages(
                    t2::<Cpu>(&inputs["token_level_rewards"], rows, cols),
                    t2::<Cpu>(&inputs["response_mask"], rows, cols),
                    &index,
                    estimator(name, &res["kwargs"]),
                )
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                let (adv, ret) = (host(out.advantages), host(out.returns));
                let sens = sensitive(case);
                let mut own = Report::default();
                own.field(&ctx, &adv, res, "advantages", sens);
                own.field(&ctx, &ret, res, "returns", sens);
                // In f32-sensitive cases a `*_vectorized` `_f64` may still carry float32
                // statistics; the non-vectorised twin's `_f64` is then the exact answer.
                let twin = name.strip_suffix("_vectorized").and_then(|base| {
                    results
                        .iter()
                        .find(|x| x["estimator"] == base && x["kwargs"] == res["kwargs"])
                });
                if let (true, false, Some(twin)) = (sens, own.failures.is_empty(), twin) {
                    let mut alt = Report::default();
                    alt.field(&ctx, &adv, twin, "advantages", sens);
                    alt.field(&ctx, &ret, twin, "returns", sens);
                    if alt.failures.is_empty() {
                        own = alt;
                    }
                }
                r.checked += own.checked;
                r.failures.extend(own.failures);
            }
        }
    }
    r.finish("advantage");
}

/// A `[B, T]` (or `[B]`) input of an advantage case as f64 (float32 values, read exactly).
fn input(case: &Value, key: &str) -> Vec<f64> {
    flat(&case["inputs"][key])
}

/// The estimators computed on the host in f64 (every registered one but the outcome estimators
/// of [`AdvantageEstimator`]), called as the case's `tensor_args` and `kwargs` say; `None` for a
/// name flowrl does not know.
fn host_estimator(case: &Value, res: &Value) -> Option<flowrl_algorithms::Result<HostAdvantages>> {
    let (rows, cols) = (shape(case)[0], shape(case)[1]);
    let kwargs = &res["kwargs"];
    let config = &kwargs["config"];
    let index: Vec<String> = case["inputs"]["index"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    let passed = |key: &str| {
        res["tensor_args"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == key))
    };
    let (rewards, mask) = (
        input(case, "token_level_rewards"),
        input(case, "response_mask"),
    );
    let batch = match TokenRewards::new(&rewards, &mask, rows, cols) {
        Ok(b) => b,
        Err(e) => return Some(Err(e)),
    };
    let epsilon = |default: f64| kwargs["epsilon"].as_f64().unwrap_or(default);
    let norm = |v: &Value| v.as_bool().unwrap_or(true);
    Some(match res["estimator"].as_str().unwrap() {
        "gae" => compute_gae_advantage_return(
            batch,
            &input(case, "values"),
            kwargs["gamma"].as_f64().unwrap(),
            kwargs["lam"].as_f64().unwrap(),
        ),
        "gdpo" => {
            // The components path (verl's trainer) when the raw batch was passed, else the
            // fallback on the summed token-level rewards.
            let keys: Vec<&str> = config["gdpo_reward_keys"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|k| k.as_str().unwrap())
                .collect();
            let scores: Vec<Vec<f64>> = keys
                .iter()
                .map(|k| flat(&case["inputs"]["gdpo_components"][k]))
                .collect();
            let weights = config["gdpo_reward_weights"].as_array();
            let components: Vec<GdpoComponent> = scores
                .iter()
                .enumerate()
                .map(|(k, s)| GdpoComponent {
                    scores: s,
                    weight: weights.map_or(1.0, |w| w[k].as_f64().unwrap()),
                })
                .collect();
            let components_path = passed("gdpo_components") && !keys.is_empty();
            compute_gdpo_outcome_advantage(
                batch,
                &index,
                components_path.then_some(components.as_slice()),
                epsilon(1e-6),
                norm(&kwargs["norm_adv_by_std_in_grpo"]),
            )
        }
        // verl reads the flag from the config, not from its own argument.
        "grpo_passk" => compute_grpo_passk_outcome_advantage(
            batch,
            &index,
            epsilon(1e-6),
            norm(&config["norm_adv_by_std_in_grpo"]),
        ),
        "opo" => compute_opo_outcome_advantage(batch, &index),
        "remax" => compute_remax_outcome_advantage(batch, &input(case, "reward_baselines")),
        "gpg" => {
            compute_gpg_outcome_advantage(batch, &index, kwargs["f_norm"].as_f64().unwrap_or(1.0))
        }
        name @ ("optimal_token_baseline" | "tir_optimal_token_baseline") => {
            let (old, sq) = (input(case, "old_log_probs"), input(case, "sum_pi_squared"));
            let weights = passed("rollout_is_weights").then(|| input(case, "rollout_is_weights"));
            let policy = PathVariance {
                old_log_probs: &old,
                sum_pi_squared: &sq,
                rollout_is_weights: weights.as_deref(),
            };
            let zero_tail = kwargs["handle_zero_tail"].as_bool().unwrap_or(true);
            let eps = epsilon(OTB_EPSILON);
            if name == "optimal_token_baseline" {
                compute_optimal_token_baseline_advantage(batch, &index, policy, zero_tail, eps)
            } else {
                compute_multi_turn_optimal_token_baseline_advantage(
                    batch, &index, policy, zero_tail, eps,
                )
            }
        }
        _ => return None,
    })
}

/// Checks one result of a host (f64) estimator: against the `_f64` field within
/// 1e-6·max(1, |want|) and, unless the result or case is `f32_sensitive`, against the float32
/// field within 1e-5·max(1, |want|) (fixture README). A recorded `error` must be an error, with
/// verl's message where flowrl reproduces it.
fn check_host_estimator(r: &mut Report, ctx: &str, case: &Value, res: &Value) {
    let Some(got) = host_estimator(case, res) else {
        r.failures
            .push(format!("{ctx}: no implementation of this estimator"));
        return;
    };
    r.checked += 1;
    let out = match (got, res.get("error")) {
        (Ok(out), None) => out,
        (Err(e), Some(_)) => {
            let verl_text = !matches!(e, AlgoError::TooFewTokens(_));
            if let Some(msg) = res["error_message"].as_str()
                && verl_text
                && e.to_string() != msg
            {
                r.failures
                    .push(format!("{ctx}: error {e:?}, want message {msg:?}"));
            }
            return;
        }
        (Ok(_), Some(err)) => {
            r.failures
                .push(format!("{ctx}: want error {err}, got values"));
            return;
        }
        (Err(e), None) => {
            r.failures.push(format!("{ctx}: unexpected error {e}"));
            return;
        }
    };
    let sensitive = sensitive(case) || res["f32_sensitive"].as_bool().unwrap_or(false);
    for (key, got) in [("advantages", &out.advantages), ("returns", &out.returns)] {
        let twin = res.get(format!("{key}_f64")).map(flat);
        let plain = res.get(key).map(flat);
        let mut checks = vec![(twin, "_f64", 1e-6)];
        if !sensitive {
            checks.push((plain, "", 1e-5));
        }
        for (want, suffix, tol) in checks {
            let Some(want) = want else {
                r.failures.push(format!("{ctx}: no field {key}{suffix}"));
                continue;
            };
            if want.len() != got.len() {
                r.failures.push(format!(
                    "{ctx}.{key}{suffix}: got {} values, want {}",
                    got.len(),
                    want.len()
                ));
                continue;
            }
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                r.checked += 1;
                if (g - w).abs() > tol * w.abs().max(1.0) {
                    r.failures
                        .push(format!("{ctx}.{key}{suffix}[{i}]: got {g}, want {w}"));
                }
            }
        }
    }
}

fn clip_config(s: &Value) -> ClipConfig {
    ClipConfig {
        clip_ratio: s["clip_ratio"].as_f64().unwrap(),
        clip_ratio_low: s["clip_ratio_low"].as_f64(),
        clip_ratio_high: s["clip_ratio_high"].as_f64(),
        clip_ratio_c: s["clip_ratio_c"].as_f64().unwrap(),
    }
}

#[test]
fn policy_loss_vectors() {
    let mut r = Report::default();
    for (file, doc) in documents("policy_loss") {
        // The registry layout (`losses` + per-loss results) is checked by tests/policy_losses.rs.
        if doc.get("losses").is_some() {
            continue;
        }
        for case in doc["cases"].as_array().unwrap() {
            let (rows, cols) = (shape(case)[0], shape(case)[1]);
            let inp = &case["inputs"];
            let sens = sensitive(case);
            let run =
                |setting: &Value, mode: LossAggMode, info: &GlobalBatchInfo, weights: bool| {
                    let log_prob = t2::<Ad>(&inp["log_prob"], rows, cols).require_grad();
                    let w = weights.then(|| t2::<Ad>(&inp["rollout_is_weights"], rows, cols));
                    let out = policy_loss_vanilla(
                        t2::<Ad>(&inp["old_log_prob"], rows, cols),
                        log_prob.clone(),
                        t2::<Ad>(&inp["advantages"], rows, cols),
                        t2::<Ad>(&inp["response_mask"], rows, cols),
                        w,
                        &clip_config(setting),
                        mode,
                        info,
                    )
                    .unwrap();
                    let grads = out.pg_loss.backward();
                    let grad = log_prob
                        .grad(&grads)
                        .map(host)
                        .unwrap_or_else(|| vec![0.0; rows * cols]);
                    (out, grad)
                };
            for per_token in case["per_token_pg_loss"].as_array().into_iter().flatten() {
                let ctx = format!("{file}:{}:per_token:{}", case["name"], per_token["setting"]);
                let (out, _) = run(
                    &per_token["setting"],
                    LossAggMode::TokenSum,
                    &GlobalBatchInfo::default(),
                    false,
                );
                r.field(
                    &ctx,
                    &host(out.per_token_loss.unwrap()),
                    per_token,
                    "values",
                    sens,
                );
            }
            for res in case["results"].as_array().unwrap() {
                let mode: LossAggMode = res["loss_agg_mode"].as_str().unwrap().parse().unwrap();
                let info = batch_info(&res["global_batch_info"]);
                let weights = res["rollout_is_weights"].as_bool().unwrap_or(false);
                let ctx = format!(
                    "{file}:{}:{}:{mode}:{}:w={weights}",
                    case["name"], res["setting"], res["global_batch_info_name"]
                );
                let (out, grad) = run(&res["setting"], mode, &info, weights);
                r.field(&ctx, &host(out.pg_loss), res, "pg_loss", sens);
                r.field(
                    &ctx,
                    &host(out.pg_clipfrac.unwrap()),
                    res,
                    "pg_clipfrac",
                    sens,
                );
                r.field(&ctx, &host(out.ppo_kl.unwrap()), res, "ppo_kl", sens);
                r.field(
                    &ctx,
                    &host(out.pg_clipfrac_lower.unwrap()),
                    res,
                    "pg_clipfrac_lower",
                    sens,
                );
                r.field(&ctx, &grad, res, "grad_log_prob", sens);
            }
        }
    }
    r.finish("policy_loss");
}

#[test]
fn kl_vectors() {
    let mut r = Report::default();
    for (file, doc) in documents("kl") {
        for case in doc["cases"].as_array().unwrap() {
            let (rows, cols) = (shape(case)[0], shape(case)[1]);
            let inp = &case["inputs"];
            for res in case["results"].as_array().unwrap() {
                let name = res["kl_penalty"].as_str().unwrap();
                let ctx = format!("{file}:{}:{name}", case["name"]);
                let parsed = name.parse::<KlEstimator>();
                if let Some(err) = res.get("error") {
                    r.checked += 1;
                    match (err.as_str(), &parsed) {
                        (Some("NotImplementedError"), Err(AlgoError::NotImplemented(_))) => {}
                        (_, Err(AlgoError::Unknown { .. })) if err != "NotImplementedError" => {}
                        _ => r
                            .failures
                            .push(format!("{ctx}: want error {err}, got {parsed:?}")),
                    }
                    continue;
                }
                let x = t2::<Ad>(&inp["logprob"], rows, cols).require_grad();
                let y = t2::<Ad>(&inp["ref_logprob"], rows, cols);
                let values = kl_penalty(x.clone(), y, parsed.unwrap()).unwrap();
                let grads = values.clone().sum().backward();
                let grad = x.grad(&grads).map(host).unwrap();
                r.field(&ctx, &host(values), res, "values", sensitive(case));
                r.field(&ctx, &grad, res, "grad_logprob", sensitive(case));
            }
        }
    }
    r.finish("kl");
}

#[test]
fn agg_loss_vectors() {
    let mut r = Report::default();
    for (file, doc) in documents("agg_loss") {
        for case in doc["cases"].as_array().unwrap() {
            let (rows, cols) = (shape(case)[0], shape(case)[1]);
            let inp = &case["inputs"];
            for res in case["results"].as_array().unwrap() {
                let mode_name = res["loss_agg_mode"].as_str().unwrap();
                let ctx = format!("{file}:{}:{mode_name}:{}", case["name"], res["kwargs"]);
                let got = mode_name.parse::<LossAggMode>().and_then(|mode| {
                    agg_loss(
                        t2::<Cpu>(&inp["loss_mat"], rows, cols),
                        t2::<Cpu>(&inp["loss_mask"], rows, cols),
                        mode,
                        &batch_info(&res["kwargs"]),
                    )
                });
                match (res.get("error"), got) {
                    (Some(_), Err(e)) => {
                        r.checked += 1;
                        if let Some(msg) = res["error_message"].as_str()
                            && e.to_string() != msg
                        {
                            r.failures
                                .push(format!("{ctx}: error {e:?}, want message {msg:?}"));
                        }
                    }
                    (Some(err), Ok(v)) => r
                        .failures
                        .push(format!("{ctx}: want {err}, got {}", host(v)[0])),
                    (None, Err(e)) => r.failures.push(format!("{ctx}: unexpected error {e}")),
                    (None, Ok(v)) => r.field(&ctx, &host(v), res, "loss", sensitive(case)),
                }
            }
        }
    }
    r.finish("agg_loss");
}

#[test]
fn entropy_vectors() {
    let mut r = Report::default();
    for (file, doc) in documents("entropy") {
        for case in doc["cases"].as_array().unwrap() {
            let s = shape(case);
            let (b, t, v) = (s[0], s[1], s[2]);
            let inp = &case["inputs"];
            let out = &case["outputs"];
            let sens = sensitive(case);
            let ctx = format!("{file}:{}", case["name"]);
            let logits = || {
                let data: Vec<f32> = flat(&inp["logits"]).into_iter().map(|x| x as f32).collect();
                Tensor::<Cpu, 3>::from_data(TensorData::new(data, [b, t, v]), &Default::default())
            };
            let labels = || {
                let data: Vec<i32> = flat(&inp["labels"]).into_iter().map(|x| x as i32).collect();
                Tensor::<Cpu, 2, Int>::from_data(TensorData::new(data, [b, t]), &Default::default())
            };
            let entropy = host(entropy_from_logits(logits()).unwrap());
            r.field(&ctx, &entropy, out, "entropy", sens);
            let logp = host(logprobs_from_logits(logits(), labels()).unwrap());
            r.field(&ctx, &logp, out, "logprobs", sens);
            r.field(
                &format!("{ctx}:vs_naive"),
                &logp,
                out,
                "logprobs_naive",
                sens,
            );
            for chunk in [1, 2, t.max(1)] {
                let (e, l) = entropy_and_logprobs_chunked(logits(), labels(), chunk).unwrap();
                let c = format!("{ctx}:chunk{chunk}");
                // entropy_chunked has no _f64 twin: its exact value is entropy_f64.
                let plain = out.get("entropy_chunked").map(flat);
                let twin = out.get("entropy_f64").map(flat);
                r.values(
                    &format!("{c}.entropy_chunked"),
                    &host(e),
                    plain.as_deref(),
                    twin.as_deref(),
                    sens,
                );
                r.field(&c, &host(l), out, "logprobs", sens);
                // Hidden states = logits with an identity lm_head and temperature 1.
                let (e, l) =
                    entropy_and_logprobs_from_hidden(logits(), labels(), |h| h, 1.0, chunk)
                        .unwrap();
                let c = format!("{ctx}:hidden{chunk}");
                r.field(&c, &host(e), out, "entropy", sens);
                r.field(&c, &host(l), out, "logprobs", sens);
            }
            let mask = t2::<Cpu>(&inp["mask"], b, t);
            for (mode_name, _) in out["entropy_loss"].as_object().unwrap() {
                let mode: LossAggMode = mode_name.parse().unwrap();
                let loss = host(entropy_loss(logits(), mask.clone(), mode).unwrap());
                let plain = out["entropy_loss"].get(mode_name).map(flat);
                let twin = out
                    .get("entropy_loss_f64")
                    .and_then(|o| o.get(mode_name))
                    .map(flat);
                r.values(
                    &format!("{ctx}:entropy_loss:{mode_name}"),
                    &loss,
                    plain.as_deref(),
                    twin.as_deref(),
                    sens,
                );
            }
        }
    }
    r.finish("entropy");
}

#[test]
fn geo3k_reward_vectors() {
    let mut r = Report::default();
    for (file, doc) in documents("geo3k_reward") {
        check_geo3k(&mut r, &file, &doc);
    }
    r.finish("geo3k_reward");
}

/// Extra verdicts of the real mathruler 0.1.0 grader (sympy 1.14.0, pylatexenc 2.11) on a
/// cross product of answer forms and ground truths (`tests/data/gen_geo3k_crosscheck.py`).
#[test]
fn geo3k_grader_crosscheck() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/geo3k_grader_crosscheck.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut r = Report::default();
    check_geo3k(&mut r, "geo3k_grader_crosscheck.json", &doc);
    r.finish("geo3k_grader_crosscheck");
}

fn check_geo3k(r: &mut Report, file: &str, doc: &Value) {
    {
        for case in doc["cases"].as_array().unwrap() {
            let response = case["response"].as_str().unwrap();
            let truth = case["ground_truth"].as_str().unwrap();
            let ctx = format!("{file}:{}: {response:?} vs {truth:?}", case["name"]);
            let s = geo3k_score(response, truth);
            let checks = [
                (
                    "format",
                    format_reward(response),
                    case["format"].as_f64().unwrap(),
                ),
                (
                    "acc",
                    acc_reward(response, truth),
                    case["acc"].as_f64().unwrap(),
                ),
                ("score", s.score, case["score"].as_f64().unwrap()),
                ("score.acc", s.acc, case["acc"].as_f64().unwrap()),
                ("score.format", s.format, case["format"].as_f64().unwrap()),
            ];
            for (what, got, want) in checks {
                r.checked += 1;
                if got != want {
                    r.failures
                        .push(format!("{ctx}: {what} got {got}, want {want}"));
                }
            }
            r.checked += 1;
            let extracted = extract_boxed_content(response);
            if extracted != case["extracted"].as_str().unwrap() {
                r.failures.push(format!(
                    "{ctx}: extracted {extracted:?}, want {}",
                    case["extracted"]
                ));
            }
        }
    }
}
