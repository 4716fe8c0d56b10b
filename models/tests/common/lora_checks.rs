//! The LoRA parity check against PEFT, generic over the backend (run on the CPU by lora.rs, on
//! the GPU kernels by vulkan.rs).

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use flowrl_models::Model;
use flowrl_models::lora::{AdapterInit, read_peft_adapter};
use flowrl_models::weights::Precision;

use super::{Array, padded_batch, qwen_images, read_safetensors};

/// `FLOWRL_LORA_FIXTURES`, or the repository's copy `tests/fixtures/lora`.
pub fn lora_fixtures_root() -> PathBuf {
    match std::env::var_os("FLOWRL_LORA_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/lora"),
    }
}

/// `|a − e| ≤ atol + rtol·|e|` everywhere `keep` holds, with the case's tolerance `name`.
pub fn assert_close(
    case: &str,
    what: &str,
    tol: &serde_json::Value,
    actual: &[f32],
    expected: &Array,
    keep: impl Fn(usize) -> bool,
) {
    let atol = tol["atol"].as_f64().unwrap();
    let rtol = tol["rtol"].as_f64().unwrap_or(0.0);
    assert_eq!(actual.len(), expected.values.len(), "{case}: {what} length");
    let mut worst = (0.0f64, 0usize);
    for (i, (&a, &e)) in actual.iter().zip(&expected.values).enumerate() {
        if !keep(i) {
            continue;
        }
        let excess = (a as f64 - e).abs() - (atol + rtol * e.abs());
        if excess > worst.0 {
            worst = (excess, i);
        }
    }
    assert!(
        worst.0 <= 0.0,
        "{case}: {what}[{}] = {} vs PEFT {} (atol {atol}, rtol {rtol})",
        worst.1,
        actual[worst.1],
        expected.values[worst.1]
    );
}

/// PEFT's adapters (tests/fixtures/lora, made by make_fixtures.py with peft + transformers):
/// loaded onto their base through `read_peft_adapter`, the logits, the token log-probs of the
/// labels, the loss `−Σ logp·mask / Σ mask` and its gradient w.r.t. every lora_A / lora_B match
/// PEFT's within each case's tolerances.
pub fn peft_adapters_match_peft<AD: AutodiffBackend>(device: &AD::Device) {
    let root = lora_fixtures_root();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("case.json").is_file())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no LoRA cases under {}", root.display());
    for dir in cases {
        let name = dir.display().to_string();
        let case: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let tol = &case["tolerances"];
        let base = repo.join(case["base_model"].as_str().unwrap());
        let (config, stored) = read_peft_adapter(&dir.join("adapter")).unwrap();
        let (model, adapted) = Model::<AD>::load_adapted(
            &base,
            device,
            Precision::F32,
            &config,
            AdapterInit::Stored(stored),
        )
        .unwrap();
        if let Some(n) = case["n_adapted_modules"].as_u64() {
            assert_eq!(adapted.len() as u64, n, "{name}: adapted modules");
        }
        let inputs = read_safetensors(&dir.join("inputs.safetensors"));
        let outputs = read_safetensors(&dir.join("outputs.safetensors"));
        let batch = padded_batch(&inputs);
        let (b, l) = (batch.batch, batch.len);
        let (images, _) = qwen_images(&inputs);
        let logits = model.logits(&batch, &images, device).unwrap();
        let vocab = logits.dims()[2];
        let real = |i: usize| batch.attention_mask[i / vocab] == 1;
        let host: Vec<f32> = logits
            .clone()
            .into_data()
            .convert::<f32>()
            .into_vec()
            .unwrap();
        assert_close(
            &name,
            "logits_adapter",
            &tol["logits_adapter"],
            &host,
            &outputs["logits_adapter"],
            real,
        );

        // Token log-probs of the labels and the masked-mean loss.
        let labels = &inputs["labels"];
        let mask = &inputs["response_mask"];
        let logp = burn::tensor::activation::log_softmax(logits.narrow(1, 0, l - 1), 2);
        let label_ids = Tensor::<AD, 3, Int>::from_data(
            TensorData::new(
                labels.values.iter().map(|&v| v as i64).collect::<Vec<_>>(),
                [b, l - 1, 1],
            ),
            device,
        );
        let token_logp = logp.gather(2, label_ids).reshape([b, l - 1]);
        let m = Tensor::<AD, 2>::from_data(
            TensorData::new(
                mask.values.iter().map(|&v| v as f32).collect::<Vec<_>>(),
                [b, l - 1],
            ),
            device,
        );
        let host_lp: Vec<f32> = token_logp
            .clone()
            .into_data()
            .convert::<f32>()
            .into_vec()
            .unwrap();
        let real_label = |i: usize| batch.attention_mask[(i / (l - 1)) * l + i % (l - 1) + 1] == 1;
        assert_close(
            &name,
            "token_logprobs_adapter",
            &tol["token_logprobs_adapter"],
            &host_lp,
            &outputs["token_logprobs_adapter"],
            real_label,
        );
        let loss = (token_logp * m.clone()).sum().neg() / m.sum();
        assert_close(
            &name,
            "loss",
            &tol["loss"],
            &[loss.clone().into_scalar().elem::<f32>()],
            &outputs["loss"],
            |_| true,
        );

        // Gradients of every adapter weight, under PEFT's key names.
        let grads = loss.backward();
        let grad_tol = &tol["grads (every *.grad)"];
        let ids: std::collections::HashMap<_, _> = model
            .adapter_ids()
            .into_iter()
            .flat_map(|(module, a, bb)| {
                let path = flowrl_models::lora::module_path(&module);
                [
                    (a, format!("base_model.model.{path}.lora_A.weight.grad")),
                    (bb, format!("base_model.model.{path}.lora_B.weight.grad")),
                ]
            })
            .collect();
        struct Grads<'a, AD: AutodiffBackend> {
            ids: &'a std::collections::HashMap<burn::module::ParamId, String>,
            grads: &'a AD::Gradients,
            out: Vec<(String, Vec<f32>)>,
        }
        impl<AD: AutodiffBackend> ModuleVisitor<AD> for Grads<'_, AD> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<AD, D>>) {
                let g = p.val().grad(self.grads);
                match (self.ids.get(&p.id), g) {
                    (Some(key), Some(g)) => self.out.push((
                        key.clone(),
                        g.into_data().convert::<f32>().into_vec().unwrap(),
                    )),
                    (Some(key), None) => panic!("{key}: no gradient"),
                    (None, Some(_)) => panic!("a base weight got a gradient"),
                    (None, None) => {}
                }
            }
        }
        let mut collected = Grads {
            ids: &ids,
            grads: &grads,
            out: Vec::new(),
        };
        model.visit(&mut collected);
        let expected_grads = outputs.keys().filter(|k| k.ends_with(".grad")).count();
        assert_eq!(
            collected.out.len(),
            expected_grads,
            "{name}: gradient count"
        );
        for (key, g) in &collected.out {
            let e = outputs
                .get(key)
                .unwrap_or_else(|| panic!("{name}: PEFT has no {key}"));
            assert_close(&name, key, grad_tol, g, e, |_| true);
        }
    }
}
