//! The shipped LoRA graph (`graphs/grpo_vlm_lora.toml`) end to end through the binary: it trains
//! only the adapters (the checkpoint holds a PEFT adapter and optimizer state for adapters only),
//! a resumed run reproduces the uninterrupted one's metrics, `flowrl export` writes a PEFT adapter
//! and a merged model whose logits equal the adapter's, and bad LoRA settings are refused.

mod common;

use std::path::Path;
use std::process::Command;

use burn::backend::Flex;
use common::{BIN, SMALL, assert_identical_metrics, flowrl, metrics, root, training_steps};
use flowrl_models::lora::{AdapterInit, read_peft_adapter};
use flowrl_models::weights::Precision;
use flowrl_models::{Model, PaddedBatch};
use serde_json::Value;

const LORA_GRAPH: &str = "graphs/grpo_vlm_lora.toml";

/// `steps` steps of the LoRA graph (small settings, a checkpoint every 2 steps, evaluation every
/// step; a run always evaluates at its last step) into `out`.
fn run(out: &Path, steps: &str, resume: bool) {
    let mut args: Vec<&str> = if resume {
        vec!["run", "--resume", out.to_str().unwrap(), "--steps", steps]
    } else {
        vec![
            "run",
            LORA_GRAPH,
            "--out",
            out.to_str().unwrap(),
            "--steps",
            steps,
        ]
    };
    if !resume {
        args.extend_from_slice(SMALL);
        args.extend_from_slice(&[
            "--set",
            "run.checkpoint_every=2",
            "--set",
            "nodes.eval.every=1",
            // Dropout masks must be reproduced on resume too.
            "--set",
            "models.policy.lora.dropout=0.1",
        ]);
    }
    flowrl(&args);
}

#[test]
fn lora_run_checkpoints_adapters_only_resumes_exactly_and_exports() {
    let dir = tempfile::tempdir().unwrap();
    let (full, resumed) = (dir.path().join("full"), dir.path().join("resumed"));
    run(&full, "4", false);
    run(&resumed, "2", false);
    run(&resumed, "4", true);
    let m = training_steps(metrics(&full));
    assert_eq!(m.len(), 4);
    assert!(
        m.iter()
            .all(|s| s["actor/grad_norm"].as_f64().unwrap() > 0.0)
    );
    assert_identical_metrics(
        &metrics(&resumed),
        &metrics(&full),
        "a resumed LoRA run reproduces the uninterrupted one",
    );

    // The checkpoint: a PEFT adapter, AdamW moments of adapter weights only, no full model.
    let ckpt = full.join("checkpoints/step_000004/resources/policy");
    assert!(ckpt.join("adapter/adapter_config.json").is_file());
    assert!(ckpt.join("adapter/adapter_model.safetensors").is_file());
    assert!(!ckpt.join("model").exists());
    let bytes = std::fs::read(ckpt.join("optimizer.safetensors")).unwrap();
    let opt = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let names = opt.names();
    assert!(!names.is_empty());
    assert!(
        names.iter().all(|n| n.contains(".lora.")),
        "optimizer state for a non-adapter weight: {:?}",
        names.iter().find(|n| !n.contains(".lora."))
    );

    // Export: adapter (PEFT layout) + merged model; merged logits == base + adapter logits.
    let out = dir.path().join("export");
    flowrl(&[
        "export",
        full.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    for f in [
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
        "merged/config.json",
        "merged/tokenizer.json",
        "merged/preprocessor_config.json",
    ] {
        assert!(out.join(f).is_file(), "export lacks {f}");
    }
    let device = Default::default();
    let base = root().join("assets/tiny-qwen2-vl");
    let (config, stored) = read_peft_adapter(&out.join("adapter")).unwrap();
    assert_eq!((config.rank, config.alpha), (8, 16.0));
    let (adapted, _) = Model::<Flex>::load_adapted(
        &base,
        &device,
        Precision::F32,
        &config,
        AdapterInit::Stored(stored),
    )
    .unwrap();
    let merged = Model::<Flex>::load(&out.join("merged"), &device).unwrap();
    let batch = PaddedBatch::left_pad(&[vec![5, 17, 42, 9, 77, 3], vec![11, 23, 8, 64]], 0);
    let (a, b) = (logits(&adapted, &batch), logits(&merged, &batch));
    let base_logits = logits(&Model::<Flex>::load(&base, &device).unwrap(), &batch);
    let diff = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0f32, f32::max)
    };
    let scale = a.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    assert!(
        diff(&a, &b) <= 1e-5 * scale,
        "merged vs adapter: {}",
        diff(&a, &b)
    );
    assert!(
        diff(&a, &base_logits) > 1e-4,
        "four updates must have moved the adapter"
    );

    // `flowrl generate --adapter` on the base answers as the merged model does (greedy).
    let generate = |args: &[&str]| -> Value {
        let mut all = vec![
            "generate",
            "--prompt",
            "How many shapes?",
            "--temperature",
            "0",
        ];
        all.extend_from_slice(&["--max-new-tokens", "12", "--json", "--device", "cpu"]);
        all.extend_from_slice(args);
        serde_json::from_slice(&flowrl(&all).stdout).unwrap()
    };
    let adapter = out.join("adapter");
    let merged_dir = out.join("merged");
    let with_adapter = generate(&[
        "--model",
        base.to_str().unwrap(),
        "--adapter",
        adapter.to_str().unwrap(),
    ]);
    let from_merged = generate(&["--model", merged_dir.to_str().unwrap()]);
    assert_eq!(with_adapter["response_ids"], from_merged["response_ids"]);
    assert_eq!(with_adapter["prompt_ids"], from_merged["prompt_ids"]);
}

fn logits(model: &Model<Flex>, batch: &PaddedBatch) -> Vec<f32> {
    model
        .logits(batch, &[], &Default::default())
        .unwrap()
        .into_data()
        .convert::<f32>()
        .into_vec()
        .unwrap()
}

/// Mixed precision: a bf16 base (held in bf16, never updated) with f32 adapters trains, and the
/// checkpoint's adapter is f32.
#[test]
fn lora_on_a_bf16_base_trains_f32_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bf16");
    let mut args = vec![
        "run",
        LORA_GRAPH,
        "--out",
        out.to_str().unwrap(),
        "--steps",
        "2",
    ];
    args.extend_from_slice(SMALL);
    args.extend_from_slice(&[
        "--set",
        "models.policy.precision=\"bf16\"",
        "--set",
        "run.checkpoint_every=2",
    ]);
    flowrl(&args);
    let m = training_steps(metrics(&out));
    assert!(
        m.iter()
            .all(|s| s["actor/grad_norm"].as_f64().unwrap() > 0.0)
    );
    let bytes = std::fs::read(
        out.join("checkpoints/step_000002/resources/policy/adapter/adapter_model.safetensors"),
    )
    .unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert!(
        st.tensors()
            .iter()
            .all(|(_, t)| t.dtype() == safetensors::Dtype::F32)
    );
}

/// `flowrl validate` and `flowrl run` on bad LoRA settings: the message and where it points.
#[test]
fn bad_lora_settings_are_refused() {
    let check = |args: &[&str], code: i32, needles: &[&str]| {
        let out = Command::new(BIN)
            .current_dir(root())
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {text}");
        for n in needles {
            assert!(text.contains(n), "{args:?}: expected `{n}` in:\n{text}");
        }
    };
    check(
        &["validate", LORA_GRAPH, "--set", "models.policy.lora.rank=0"],
        78,
        &["lora.rank", ">= 1"],
    );
    check(
        &[
            "validate",
            LORA_GRAPH,
            "--set",
            "models.reference.lora={rank=4}",
        ],
        78,
        &["already is its base"],
    );
    let dir = tempfile::tempdir().unwrap();
    check(
        &[
            "run",
            LORA_GRAPH,
            "--steps",
            "1",
            "--out",
            dir.path().join("r").to_str().unwrap(),
            "--set",
            "models.policy.lora.target_modules=[\"q_proj\", \"query_key_value\"]",
        ],
        1,
        &[
            "`query_key_value` matches no linear module",
            "q_proj",
            "gate_proj",
            "qkv (vision tower)",
        ],
    );
}
