//! Qwen2-VL / Qwen2.5-VL parity checks against Hugging Face transformers on the golden fixtures
//! (tests/fixtures/models/<model_type>/<case>/, format in the fixtures README), generic over the
//! backend: qwen_vl_fixtures.rs runs them on the CPU (`Flex`), vulkan.rs on burn's wgpu kernels.
//! Every case found under `FLOWRL_MODEL_FIXTURES` is run.

use std::path::Path;

use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::AutodiffBackend;
use flowrl_models::capabilities::mask_tensor;
use flowrl_models::weights::GradCollector;
use flowrl_models::{Model, PaddedBatch, ProcessedImage};

use super::{
    Array, fixtures_root, max_dev, model_cases, padded_batch, prompt_hidden, qwen_images,
    read_safetensors,
};

pub const FAMILIES: &[&str] = &["qwen2_vl", "qwen2_5_vl"];
/// README §7 recommends 1e-4 · max(1, max |e|) and says 2e-5 is safe; a faithful f32 port lands
/// near 1e-6–1e-5 (observed ≤ 3e-6), so use the tighter bound.
pub const TOL: f64 = 2e-5;
/// README §7: gradients within 1e-3 · max |e| per tensor, "can be tightened" (observed ≤ 5e-6).
pub const GRAD_TOL: f64 = 1e-4;

pub struct Case {
    pub name: String,
    pub batch: PaddedBatch,
    pub images: Vec<ProcessedImage>,
    pub grids: Vec<[usize; 3]>,
    pub expected: std::collections::HashMap<String, Array>,
}

pub fn read_case(dir: &Path) -> Case {
    let inputs = read_safetensors(&dir.join("inputs.safetensors"));
    let expected = read_safetensors(&dir.join("expected.safetensors"));
    let batch = padded_batch(&inputs);
    let (images, grids) = qwen_images(&inputs);
    Case {
        name: dir.display().to_string(),
        batch,
        images,
        grids,
        expected,
    }
}

pub fn host<const D: usize, BK: Backend>(t: Tensor<BK, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

/// Asserts `actual` ≈ `expected[name]` within `tol` (relative to `max(1, max |e|)`) on the
/// entries `keep` selects; returns the relative error.
fn check(
    case: &Case,
    name: &str,
    actual: &[f32],
    keep: impl Fn(usize) -> bool,
    tol: f64,
    report: &mut Vec<String>,
) -> f64 {
    let e = case
        .expected
        .get(name)
        .unwrap_or_else(|| panic!("{}: expected.safetensors has no {name}", case.name));
    let (dev, scale) = max_dev(actual, &e.values, keep);
    let rel = dev / scale.max(1.0);
    report.push(format!("  {name:<28} max|diff| {dev:.2e}  rel {rel:.2e}"));
    assert!(
        rel <= tol,
        "{}: {name} deviates by {dev:e} (scale {scale:e}), tolerance {tol:e}",
        case.name
    );
    rel
}

fn exact(case: &Case, name: &str, actual: &[i64]) {
    let e = case.expected[name].as_i64();
    assert_eq!(actual, e.as_slice(), "{}: {name} differs", case.name);
}

/// Keep-predicate for `[B, L, X]` tensors: entries at real (non-padding) positions.
pub fn real_rows(batch: &PaddedBatch, width: usize) -> impl Fn(usize) -> bool + '_ {
    move |i| batch.attention_mask[i / width] != 0
}

/// Some case was found unless the fixture folder is absent.
fn assert_found(cases: &[std::path::PathBuf]) {
    assert!(
        !cases.is_empty() || !fixtures_root().join("qwen2_vl").exists(),
        "no cases found"
    );
}

/// The case in `dir` (its name added to `report`) and its model loaded on `B`.
fn load_case<B: Backend>(
    dir: &Path,
    device: &B::Device,
    report: &mut Vec<String>,
) -> (Case, Model<B>) {
    let case = read_case(dir);
    report.push(case.name.clone());
    let model = Model::<B>::load(dir, device).expect("fixture model loads");
    (case, model)
}

/// Position ids, vision intermediates, image embeddings, decoder layers, logits, token
/// log-probs and loss of a full forward on `B`, each within `tol`.
#[allow(irrefutable_let_patterns)]
pub fn forward_matches_transformers<B: Backend>(device: &B::Device, tol: f64) {
    let cases = model_cases(FAMILIES);
    let mut report = Vec::new();
    for dir in &cases {
        let (case, model) = load_case::<B>(dir, device, &mut report);
        let Model::QwenVl(qwen) = &model else {
            panic!("{}: not a Qwen VL model", case.name)
        };
        let batch = &case.batch;

        // Position ids and rope deltas (exact).
        let pos = model.position_ids(batch, &case.images).unwrap();
        exact(&case, "position_ids", &pos.ids);
        exact(&case, "rope_deltas", &pos.rope_deltas);

        // Vision tower.
        if !case.images.is_empty() {
            let layout = qwen.visual.layout(&case.grids);
            let hw: Vec<i64> = layout.rope_pos_hw.iter().flatten().copied().collect();
            exact(&case, "vision.rope_pos_hw", &hw);
            let to_i64 = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
            exact(&case, "vision.cu_seqlens", &to_i64(&layout.cu_seqlens));
            if case.expected.contains_key("vision.window_index") {
                exact(
                    &case,
                    "vision.window_index",
                    &to_i64(layout.window_index.as_ref().expect("window index")),
                );
                exact(
                    &case,
                    "vision.cu_window_seqlens",
                    &to_i64(layout.cu_window_seqlens.as_ref().expect("window seqlens")),
                );
            }
            let (emb, trace) = qwen.embed_images_traced(&case.images, device).unwrap();
            check(
                &case,
                "vision.patch_embeds",
                &host(trace.patch_embeds.unwrap()),
                |_| true,
                tol,
                &mut report,
            );
            for (i, out) in trace.block_out.into_iter().enumerate() {
                check(
                    &case,
                    &format!("vision.block_out.{i}"),
                    &host(out),
                    |_| true,
                    tol,
                    &mut report,
                );
            }
            check(
                &case,
                "image_embeds",
                &host(emb),
                |_| true,
                tol,
                &mut report,
            );
        }

        // Text decoder, full forward.
        let hidden_size = qwen.config.text.hidden_size;
        let vocab = qwen.config.text.vocab_size;
        let embeds = model.input_embeddings(batch, &case.images, device).unwrap();
        check(
            &case,
            "text.inputs_embeds",
            &host(embeds.clone()),
            real_rows(batch, hidden_size),
            tol,
            &mut report,
        );
        let mut layers = Vec::new();
        let hidden = qwen.text.forward(
            embeds,
            pos.tensor(device),
            batch.mask_tensor(device),
            None,
            Some(&mut layers),
        );
        for (i, out) in layers.into_iter().enumerate() {
            check(
                &case,
                &format!("text.layer_out.{i}"),
                &host(out),
                real_rows(batch, hidden_size),
                tol,
                &mut report,
            );
        }
        check(
            &case,
            "text.final_norm",
            &host(hidden.clone()),
            real_rows(batch, hidden_size),
            tol,
            &mut report,
        );
        let lm = model.causal_lm();
        let logits = lm.lm_head(hidden);
        check(
            &case,
            "logits",
            &host(logits.clone()),
            real_rows(batch, vocab),
            tol,
            &mut report,
        );

        // Token log-probs and loss.
        let (lp, loss) = token_logprobs_and_loss(logits, batch, &case);
        let valid = case.expected["token_logprobs_valid"].as_i64();
        check(
            &case,
            "token_logprobs",
            &lp,
            |i| valid[i] != 0,
            tol,
            &mut report,
        );
        check(&case, "loss", &[loss], |_| true, tol, &mut report);
    }
    eprintln!("{}", report.join("\n"));
    assert_found(&cases);
}

/// KV-cached greedy decoding on `B`: prefill, then one fed token per step (the prompt is never
/// recomputed); every step's logits within `tol` of transformers', the generated tokens and
/// their position ids exact.
pub fn kv_cached_decoding_matches_transformers<B: Backend>(device: &B::Device, tol: f64) {
    let cases = model_cases(FAMILIES);
    let mut report = Vec::new();
    for dir in &cases {
        let (case, model) = load_case::<B>(dir, device, &mut report);
        let batch = &case.batch;
        let (b, l) = (batch.batch, batch.len);
        let pos = model.position_ids(batch, &case.images).unwrap();
        let lm = model.causal_lm();
        let vocab = lm.vocab_size();

        let gen_ids = &case.expected["generated_ids"];
        let steps = gen_ids.shape[1];
        let mut cache = lm.new_cache();
        let hidden = prompt_hidden(&model, batch, &case.images, &pos, device, Some(&mut cache));
        let mut step_logits = host(lm.lm_head(hidden.narrow(1, l - 1, 1)));
        let real = batch.real_lengths();
        let mut mask = batch.attention_mask.clone();
        let mut generated = vec![Vec::new(); b];
        let mut all_logits = Vec::new();
        let mut gen_pos = vec![0i64; 3 * b * steps];
        for s in 0..steps {
            all_logits.extend_from_slice(&step_logits);
            let next: Vec<u32> = (0..b)
                .map(|r| argmax(&step_logits[r * vocab..(r + 1) * vocab]))
                .collect();
            let lengths: Vec<usize> = real.iter().map(|&n| n + s).collect();
            let p = pos.decode_step(&lengths);
            for st in 0..3 {
                for r in 0..b {
                    gen_pos[(st * b + r) * steps + s] = p.ids[st * b + r];
                }
            }
            for r in 0..b {
                generated[r].push(next[r] as i64);
            }
            if s + 1 == steps {
                break;
            }
            let step = PaddedBatch::left_pad(&next.iter().map(|&t| vec![t]).collect::<Vec<_>>(), 0);
            // Extend the mask: [prompt mask, ones for the fed tokens].
            let mut m = Vec::with_capacity(b * (l + s + 1));
            for r in 0..b {
                m.extend_from_slice(&mask[r * (l + s)..(r + 1) * (l + s)]);
                m.push(1);
            }
            mask = m;
            assert_eq!(cache.len(), l + s, "cache holds the prompt and fed tokens");
            let ids = step.ids_tensor(device);
            let h = lm.forward_hidden(
                ids.clone(),
                lm.embed_tokens(ids),
                p.tensor(device),
                mask_tensor(&mask, b, l + s + 1, device),
                Some(&mut cache),
            );
            step_logits = host(lm.lm_head(h));
        }
        check(
            &case,
            "generated_step_logits",
            &all_logits,
            |_| true,
            tol,
            &mut report,
        );
        let flat: Vec<i64> = generated.concat();
        exact(&case, "generated_ids", &flat);
        exact(&case, "generated_position_ids", &gen_pos);
    }
    eprintln!("{}", report.join("\n"));
    assert_found(&cases);
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// `log_softmax(logits[:, :-1])` gathered at `ids[:, 1:]` (flattened `[B, L−1]`) and the
/// fixture loss `−Σ lp·response_mask / Σ response_mask`.
fn token_logprobs_and_loss<BK: Backend>(
    logits: Tensor<BK, 3>,
    batch: &PaddedBatch,
    case: &Case,
) -> (Vec<f32>, f32) {
    let (lp, loss) = logprob_loss(logits, batch, &case.expected["response_mask"]);
    (host(lp), host(loss)[0])
}

fn logprob_loss<BK: Backend>(
    logits: Tensor<BK, 3>,
    batch: &PaddedBatch,
    response_mask: &Array,
) -> (Tensor<BK, 2>, Tensor<BK, 1>) {
    let [b, l, _] = logits.dims();
    let device = logits.device();
    let targets = batch.ids_tensor::<BK>(&device).narrow(1, 1, l - 1);
    let lp = log_softmax(logits.narrow(1, 0, l - 1), 2)
        .gather(2, targets.unsqueeze_dim(2))
        .reshape([b, l - 1]);
    let rm: Vec<f32> = response_mask.values.iter().map(|&v| v as f32).collect();
    let count: f32 = rm.iter().sum();
    let rm =
        Tensor::<BK, 1>::from_data(TensorData::new(rm, [b * (l - 1)]), &device).reshape([b, l - 1]);
    let loss = (lp.clone() * rm).sum().neg() / count;
    (lp, loss)
}

/// Gradients of the fixture loss on `AD`: every `grad.*` tensor of the fixture within
/// `grad_tol · max |e|`.
pub fn gradients_match_transformers<AD: AutodiffBackend>(device: &AD::Device, grad_tol: f64) {
    for dir in model_cases(FAMILIES) {
        let case = read_case(&dir);
        let model = Model::<AD>::load(&dir, device).expect("fixture model loads");
        let batch = &case.batch;
        let pos = model.position_ids(batch, &case.images).unwrap();
        let lm = model.causal_lm();
        let hidden = prompt_hidden(&model, batch, &case.images, &pos, device, None);
        let (_, loss) = logprob_loss(lm.lm_head(hidden), batch, &case.expected["response_mask"]);
        let grads = loss.backward();
        let mut collector = GradCollector::<AD>::new(&grads);
        model.export(&mut collector);
        let mut checked = 0;
        for (key, e) in &case.expected {
            let Some(param) = key.strip_prefix("grad.") else {
                continue;
            };
            let (shape, actual) = collector
                .tensors
                .get(param)
                .unwrap_or_else(|| panic!("{}: no gradient for {param}", case.name));
            assert_eq!(shape, &e.shape, "{}: gradient shape of {param}", case.name);
            let (dev, scale) = max_dev(actual, &e.values, |_| true);
            eprintln!(
                "{} grad.{param}: max|diff| {dev:.2e} rel {:.2e}",
                case.name,
                dev / scale
            );
            assert!(
                dev <= grad_tol * scale,
                "{}: gradient of {param} deviates by {dev:e} (max |e| {scale:e})",
                case.name
            );
            checked += 1;
        }
        assert!(
            checked > 0,
            "{}: no grad.* tensors in the fixture",
            case.name
        );
    }
}
