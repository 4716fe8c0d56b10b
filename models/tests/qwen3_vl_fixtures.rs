//! Parity of Qwen3-VL with Hugging Face transformers 5.24 on the golden fixtures
//! (tests/fixtures/models/qwen3_vl/<case>/, format in that folder's README): position ids, the
//! vision tower's intermediates (patch and learned position embeddings with their bilinear taps,
//! blocks), DeepStack features, image embeddings, the interleaved M-RoPE table, decoder layers
//! before and after the DeepStack additions, logits, token log-probs and loss, KV-cached greedy
//! decoding (by hand and through `generate`), and gradients.
//!
//! Every case under `FLOWRL_MODEL_FIXTURES/qwen3_vl` (a folder with `case.json`, `"kind"`
//! `"model"` or `"processor_only"`) is run; every size, id and option comes from the case's
//! config.json / case.json / preprocessor_config.json and every shape from its tensors.
//!
//! The image processor's cases are in qwen3_vl_fixtures_processor.rs; saving in the hub layout
//! and loading back, LoRA adapters, random and shape-only builds in
//! qwen3_vl_fixtures_checkpoints.rs; the case reading they share in common/qwen3_vl.rs.

mod common;

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::AutodiffBackend;
use common::qwen_checks::host;
use common::qwen3_vl::{Case, cases, read_json};
use common::{Array, greedy_config, max_dev, prompt_hidden};
use flowrl_models::capabilities::mask_tensor;
use flowrl_models::generate::{ModelParts, PromptInput, generate};
use flowrl_models::qwen3_vl::Qwen3Vl;
use flowrl_models::qwen3_vl::positions::interleaved_rope_tables;
use flowrl_models::weights::GradCollector;
use flowrl_models::{Model, PaddedBatch, ProcessedImage};

/// README §7 recommends `1e-4 · max(1, max |e|)` and 2e-5 to catch the GELU mix-ups; a faithful
/// f32 port lands near 2e-6.
const TOL: f64 = 2e-5;
/// README §7: gradients within `1e-3 · max |e|` per tensor; tightened (f32 vs f32 lands ~1e-5).
const GRAD_TOL: f64 = 1e-4;
/// `vision.pos_interp_weights`: README §7.
const WEIGHT_TOL: f64 = 1e-6;

fn qwen3(model: &Model<Flex>) -> &Qwen3Vl<Flex> {
    match model {
        Model::Qwen3Vl(m) => m,
        _ => panic!("not a Qwen3-VL model"),
    }
}

/// `log_softmax(logits[:, :-1])` gathered at `ids[:, 1:]` `[B, L−1]`, and the fixture loss
/// `−Σ lp·response_mask / Σ response_mask`.
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

#[test]
fn qwen3_vl_forward_matches_transformers() {
    let device = Default::default();
    for dir in cases("model") {
        let mut case = Case::read(&dir);
        let model = Model::<Flex>::load(&dir, &device).expect("fixture model loads");
        assert_eq!(model.model_type(), "qwen3_vl");
        let q = qwen3(&model);
        let hidden = q.config.text.hidden_size;
        let vocab = q.config.text.vocab_size;
        let batch = case.batch.clone();
        // Keep-predicate for `[B, L, X]` tensors: entries at real (non-padding) positions.
        let real = |width: usize| {
            let mask = batch.attention_mask.clone();
            move |i: usize| mask[i / width] != 0
        };

        // Position ids and rope deltas (exact).
        let pos = model.position_ids(&batch, &case.images).unwrap();
        case.exact("position_ids", &pos.ids);
        case.exact("rope_deltas", &pos.rope_deltas);

        // Vision tower: layout, intermediates, DeepStack features, image embeddings.
        if !case.images.is_empty() {
            let layout = q.visual.layout(&case.grids);
            let flat = |v: &[[i64; 2]]| v.iter().flatten().copied().collect::<Vec<_>>();
            case.exact("vision.rope_pos_hw", &flat(&layout.rope_pos_hw));
            let cu: Vec<i64> = layout.cu_seqlens.iter().map(|&x| x as i64).collect();
            case.exact("vision.cu_seqlens", &cu);
            let idx: Vec<i64> = layout
                .pos_interp_indices
                .iter()
                .flatten()
                .copied()
                .collect();
            case.exact("vision.pos_interp_indices", &idx);
            let w: Vec<f32> = layout
                .pos_interp_weights
                .iter()
                .flatten()
                .copied()
                .collect();
            case.check("vision.pos_interp_weights", &w, |_| true, WEIGHT_TOL);

            let (embeds, deepstack, trace) = q.embed_images_traced(&case.images, &device).unwrap();
            case.check(
                "vision.patch_embeds",
                &host(trace.patch_embeds.unwrap()),
                |_| true,
                TOL,
            );
            case.check(
                "vision.pos_embeds",
                &host(trace.pos_embeds.unwrap()),
                |_| true,
                TOL,
            );
            let depth = q.config.vision.depth;
            assert_eq!(trace.block_out.len(), depth);
            for (i, out) in trace.block_out.into_iter().enumerate() {
                case.check(&format!("vision.block_out.{i}"), &host(out), |_| true, TOL);
            }
            let n_deepstack = q.config.vision.deepstack_visual_indexes.len();
            assert_eq!(deepstack.len(), n_deepstack);
            for (k, f) in deepstack.into_iter().enumerate() {
                case.check(
                    &format!("vision.deepstack_features.{k}"),
                    &host(f),
                    |_| true,
                    TOL,
                );
            }
            case.check("image_embeds", &host(embeds), |_| true, TOL);
        }

        // Input embeddings (the first `hidden` channels; the rest carry DeepStack).
        let embeds = model
            .input_embeddings(&batch, &case.images, &device)
            .unwrap();
        let first = embeds.clone().narrow(2, 0, hidden);
        case.check("text.inputs_embeds", &host(first), real(hidden), TOL);

        // Interleaved M-RoPE table.
        let head_dim = q.config.text.head_dim;
        let (cos, sin) = interleaved_rope_tables(
            pos.tensor::<Flex>(&device),
            &q.text.inv_freq,
            q.text.mrope_section,
        );
        case.check("text.rope_cos", &host(cos), real(head_dim), TOL);
        case.check("text.rope_sin", &host(sin), real(head_dim), TOL);

        // Decoder layers, DeepStack additions, final norm.
        let (final_hidden, trace) =
            q.forward_traced(embeds, pos.tensor(&device), batch.mask_tensor(&device));
        let layers = q.config.text.num_layers;
        assert_eq!(trace.layer_out.len(), layers);
        for (k, out) in trace.before_deepstack.into_iter().enumerate() {
            let name = format!("text.layer_out_before_deepstack.{k}");
            case.check(&name, &host(out), real(hidden), TOL);
        }
        let expected_before = (0..)
            .take_while(|k| {
                case.expected
                    .contains_key(&format!("text.layer_out_before_deepstack.{k}"))
            })
            .count();
        if !case.images.is_empty() {
            let n = q.config.vision.deepstack_visual_indexes.len().min(layers);
            assert_eq!(expected_before, n, "{}: DeepStack layers", case.name);
        }
        for (i, out) in trace.layer_out.into_iter().enumerate() {
            case.check(
                &format!("text.layer_out.{i}"),
                &host(out),
                real(hidden),
                TOL,
            );
        }
        case.check(
            "text.final_norm",
            &host(final_hidden.clone()),
            real(hidden),
            TOL,
        );

        // Logits (also through `Model::logits`), token log-probs and loss.
        let lm = model.causal_lm();
        let logits = lm.lm_head(final_hidden);
        case.check("logits", &host(logits.clone()), real(vocab), TOL);
        let via_model = model.logits(&batch, &case.images, &device).unwrap();
        assert_eq!(host(via_model), host(logits.clone()), "Model::logits");
        let (lp, loss) = logprob_loss(logits, &batch, case.expected("response_mask"));
        let valid = case.expected("token_logprobs_valid").as_i64();
        case.check("token_logprobs", &host(lp), |i| valid[i] != 0, TOL);
        case.check("loss", &host(loss), |_| true, TOL);
        case.print();
    }
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

/// Prefill, then one fed token per step with the KV cache (the prompt is never recomputed):
/// every step's logits within `TOL`, the tokens and their positions exact; then the same tokens
/// from `generate` (greedy) on the unpadded prompts with their images.
#[test]
fn qwen3_vl_kv_cached_decoding_matches_transformers() {
    let device = Default::default();
    for dir in cases("model") {
        let mut case = Case::read(&dir);
        let model = Model::<Flex>::load(&dir, &device).expect("fixture model loads");
        let batch = case.batch.clone();
        let (b, l) = (batch.batch, batch.len);
        let pos = model.position_ids(&batch, &case.images).unwrap();
        let lm = model.causal_lm();
        let vocab = lm.vocab_size();
        let streams = pos.streams;

        let steps = case.expected("generated_ids").shape[1];
        let mut cache = lm.new_cache();
        let hidden = prompt_hidden(
            &model,
            &batch,
            &case.images,
            &pos,
            &device,
            Some(&mut cache),
        );
        let mut step_logits = host(lm.lm_head(hidden.narrow(1, l - 1, 1)));
        let real = batch.real_lengths();
        let mut mask = batch.attention_mask.clone();
        let mut generated = vec![Vec::new(); b];
        let mut all_logits = Vec::new();
        let mut gen_pos = vec![0i64; streams * b * steps];
        for s in 0..steps {
            all_logits.extend_from_slice(&step_logits);
            let next: Vec<u32> = (0..b)
                .map(|r| argmax(&step_logits[r * vocab..(r + 1) * vocab]))
                .collect();
            let lengths: Vec<usize> = real.iter().map(|&n| n + s).collect();
            let p = pos.decode_step(&lengths);
            for st in 0..streams {
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
            let mut m = Vec::with_capacity(b * (l + s + 1));
            for r in 0..b {
                m.extend_from_slice(&mask[r * (l + s)..(r + 1) * (l + s)]);
                m.push(1);
            }
            mask = m;
            assert_eq!(cache.len(), l + s, "cache holds the prompt and fed tokens");
            let step = PaddedBatch::left_pad(&next.iter().map(|&t| vec![t]).collect::<Vec<_>>(), 0);
            let ids = step.ids_tensor(&device);
            let h = lm.forward_hidden(
                ids.clone(),
                lm.embed_tokens(ids),
                p.tensor(&device),
                mask_tensor(&mask, b, l + s + 1, &device),
                Some(&mut cache),
            );
            step_logits = host(lm.lm_head(h));
        }
        case.check("generated_step_logits", &all_logits, |_| true, TOL);
        case.exact("generated_ids", &generated.concat());
        case.exact("generated_position_ids", &gen_pos);

        // The same greedy tokens through generate.rs (its own padding, prefill and decoding).
        let image_token = model.vision().unwrap().image_token_id();
        let mut next_image = 0;
        let rows: Vec<(Vec<u32>, Vec<ProcessedImage>)> = (0..b)
            .map(|r| {
                let ids: Vec<u32> = batch
                    .row(r)
                    .iter()
                    .zip(batch.mask_row(r))
                    .filter(|(_, m)| **m != 0)
                    .map(|(&t, _)| t)
                    .collect();
                let tokens = ids.iter().filter(|&&t| t == image_token).count();
                let mut images = Vec::new();
                let mut covered = 0;
                while covered < tokens {
                    covered += case.images[next_image].num_tokens;
                    images.push(case.images[next_image].clone());
                    next_image += 1;
                }
                (ids, images)
            })
            .collect();
        let prompts: Vec<PromptInput<'_>> = rows
            .iter()
            .map(|(ids, images)| PromptInput { ids, images })
            .collect();
        let config = greedy_config(steps);
        let seeds: Vec<u64> = (0..b as u64).collect();
        let out = generate(&ModelParts::of(&model), &prompts, &config, &seeds, &device).unwrap();
        let tokens: Vec<i64> = out.tokens.concat().iter().map(|&t| t as i64).collect();
        case.exact("generated_ids", &tokens);
        case.print();
    }
}

fn gradients_match<AD: AutodiffBackend>(device: &AD::Device) {
    for dir in cases("model") {
        let case = Case::read(&dir);
        let model = Model::<AD>::load(&dir, device).expect("fixture model loads");
        let batch = &case.batch;
        let logits = model.logits(batch, &case.images, device).unwrap();
        let (_, loss) = logprob_loss(logits, batch, case.expected("response_mask"));
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
                dev <= GRAD_TOL * scale,
                "{}: gradient of {param} deviates by {dev:e} (max |e| {scale:e})",
                case.name
            );
            checked += 1;
        }
        let listed = read_json(&dir.join("case.json"))["loss"]["grad_tensors"]
            .as_array()
            .map_or(0, Vec::len);
        assert!(checked > 0, "{}: no grad.* tensors", case.name);
        assert_eq!(checked, listed, "{}: grad tensors vs case.json", case.name);
    }
}

#[test]
fn qwen3_vl_gradients_match_transformers() {
    gradients_match::<Autodiff<Flex>>(&Default::default());
}
