//! Parity of Qwen3-VL with Hugging Face transformers 5.24 on the golden fixtures
//! (tests/fixtures/models/qwen3_vl/<case>/, format in that folder's README): position ids, the
//! vision tower's intermediates (patch and learned position embeddings with their bilinear taps,
//! blocks), DeepStack features, image embeddings, the interleaved M-RoPE table, decoder layers
//! before and after the DeepStack additions, logits, token log-probs and loss, KV-cached greedy
//! decoding (by hand and through `generate`), gradients, and the image processor.
//!
//! Every case under `FLOWRL_MODEL_FIXTURES/qwen3_vl` (a folder with `case.json`, `"kind"`
//! `"model"` or `"processor_only"`) is run; every size, id and option comes from the case's
//! config.json / case.json / preprocessor_config.json and every shape from its tensors.
//!
//! Also here, on the fixture checkpoints: saving in the hub layout and loading back (f32, bf16,
//! sharded), LoRA adapters, random and shape-only builds (the real Qwen3-VL-4B shapes).

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::AutodiffBackend;
use common::{
    Array, fixtures_root, greedy_config, max_dev, model_cases, padded_batch, prompt_hidden,
    qwen_images_merged, read_safetensors, temp_dir,
};
use flowrl_models::capabilities::mask_tensor;
use flowrl_models::generate::{ModelParts, PromptInput, generate};
use flowrl_models::image::load_rgb;
use flowrl_models::lora::{AdapterInit, LoraConfig, in_vision_tower};
use flowrl_models::qwen3_vl::Qwen3Vl;
use flowrl_models::qwen3_vl::positions::interleaved_rope_tables;
use flowrl_models::weights::{GradCollector, Precision, WeightSink};
use flowrl_models::{ImageProcessor, Model, PaddedBatch, ProcessedImage, load_image_processor};
use serde_json::Value;

const FAMILY: &str = "qwen3_vl";
/// README §7 recommends `1e-4 · max(1, max |e|)` and 2e-5 to catch the GELU mix-ups; a faithful
/// f32 port lands near 2e-6.
const TOL: f64 = 2e-5;
/// README §7: gradients within `1e-3 · max |e|` per tensor; tightened (f32 vs f32 lands ~1e-5).
const GRAD_TOL: f64 = 1e-4;
/// `vision.pos_interp_weights`: README §7.
const WEIGHT_TOL: f64 = 1e-6;
/// `pixel_values` when `resized_u8` is reproduced exactly (README §7).
const PIXEL_TOL: f64 = 1e-6;

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every case folder of the family with `kind`; the repository's own copy must hold both kinds
/// (a set given by `FLOWRL_MODEL_FIXTURES` may lack one, or the family).
fn cases(kind: &str) -> Vec<PathBuf> {
    let dir = fixtures_root().join(FAMILY);
    let from_env = std::env::var_os("FLOWRL_MODEL_FIXTURES").is_some();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        assert!(from_env, "{} is absent", dir.display());
        eprintln!("{} is absent: nothing to check", dir.display());
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.json").is_file())
        .filter(|p| read_json(&p.join("case.json"))["kind"] == kind)
        .collect();
    found.sort();
    if kind == "model" {
        assert_eq!(found, model_cases(&[FAMILY]), "model cases");
    }
    assert!(
        from_env || !found.is_empty(),
        "no {kind} case in {}",
        dir.display()
    );
    found
}

struct Case {
    name: String,
    config: Value,
    batch: PaddedBatch,
    images: Vec<ProcessedImage>,
    grids: Vec<[usize; 3]>,
    expected: HashMap<String, Array>,
    report: Vec<String>,
}

impl Case {
    fn read(dir: &Path) -> Self {
        let config = read_json(&dir.join("config.json"));
        let inputs = read_safetensors(&dir.join("inputs.safetensors"));
        let merge = config["vision_config"]["spatial_merge_size"]
            .as_u64()
            .unwrap() as usize;
        let (images, grids) = qwen_images_merged(&inputs, merge);
        Self {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),

            config,
            batch: padded_batch(&inputs),
            images,
            grids,
            expected: read_safetensors(&dir.join("expected.safetensors")),
            report: Vec::new(),
        }
    }

    fn expected(&self, name: &str) -> &Array {
        self.expected
            .get(name)
            .unwrap_or_else(|| panic!("{}: expected.safetensors has no {name}", self.name))
    }

    /// `actual` ≈ `expected[name]` within `tol · max(1, max |e|)` on the entries `keep` selects.
    fn check(&mut self, name: &str, actual: &[f32], keep: impl Fn(usize) -> bool, tol: f64) {
        let e = self.expected(name);
        assert_eq!(actual.len(), e.values.len(), "{}: {name} size", self.name);
        let (dev, scale) = max_dev(actual, &e.values, keep);
        let rel = dev / scale.max(1.0);
        self.report
            .push(format!("  {name:<36} max|diff| {dev:.2e}  rel {rel:.2e}"));
        assert!(
            rel <= tol,
            "{}: {name} deviates by {dev:e} (scale {scale:e}), tolerance {tol:e}",
            self.name
        );
    }

    fn exact(&mut self, name: &str, actual: &[i64]) {
        let e = self.expected(name).as_i64();
        assert_eq!(actual, e.as_slice(), "{}: {name} differs", self.name);
        self.report.push(format!("  {name:<36} exact"));
    }

    fn print(&self) {
        eprintln!("{}\n{}", self.name, self.report.join("\n"));
    }
}

fn host<const D: usize, BK: Backend>(t: Tensor<BK, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

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

/// Token ids of a fixture prompt: special strings by `special`, `w<i>` is ordinary token i.
fn prompt_ids(prompt: &str, special: &HashMap<String, u32>) -> Vec<u32> {
    let mut ids = Vec::new();
    let mut rest = prompt.trim_start();
    while !rest.is_empty() {
        if let Some((s, &id)) = special.iter().find(|(s, _)| rest.starts_with(s.as_str())) {
            ids.push(id);
            rest = rest[s.len()..].trim_start();
            continue;
        }
        let end = rest
            .find(|c: char| c.is_whitespace() || c == '<')
            .unwrap_or(rest.len());
        let word = &rest[..end];
        let id = word
            .strip_prefix('w')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected prompt word {word:?}"));
        ids.push(id);
        rest = rest[end..].trim_start();
    }
    ids
}

fn max_abs(a: &[f32], e: &Array) -> f64 {
    assert_eq!(a.len(), e.values.len());
    a.iter()
        .zip(&e.values)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

/// `processor_only` cases: per image the decoded RGB, the resized picture (exact), pixel values
/// (1e-6), grid, token count and expanded prompt ids (exact), with the family's processor built
/// from the case's `preprocessor_config.json` and the image token of `special_tokens`.
#[test]
fn qwen3_vl_processor_matches_transformers() {
    use flowrl_models::qwen3_vl::processor::{Qwen3VlImageProcessor, Qwen3VlProcessorConfig};
    for dir in cases("processor_only") {
        let case = read_json(&dir.join("case.json"));
        let special: HashMap<String, u32> = case["special_tokens"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap() as u32))
            .collect();
        let text = std::fs::read_to_string(dir.join("preprocessor_config.json")).unwrap();
        let config = Qwen3VlProcessorConfig::from_json(&text).unwrap();
        let processor = Qwen3VlImageProcessor::new(config, special["<|image_pad|>"]);
        assert_eq!(processor.placeholder_token(), "<|image_pad|>");
        let prompt = prompt_ids(case["example_prompt"].as_str().unwrap(), &special);
        let expected = read_safetensors(&dir.join("expected.safetensors"));
        let images = case["images"].as_array().unwrap();
        for entry in images {
            let name = entry["image"].as_str().unwrap();
            let what = format!("{} / {name}", dir.display());
            let rgb = load_rgb(&dir.join(entry["file"].as_str().unwrap())).unwrap();
            if let Some(want) = expected.get(&format!("{name}.rgb_u8")) {
                let got: Vec<f64> = rgb.as_raw().iter().map(|&v| v as f64).collect();
                assert_eq!(got, want.values, "{what}: rgb_u8");
            }
            let resized = processor.resize(&rgb).unwrap();
            let want = &expected[&format!("{name}.resized_u8")];
            assert_eq!(
                want.shape,
                [resized.height() as usize, resized.width() as usize, 3],
                "{what}: resized size"
            );
            let got: Vec<f64> = resized.as_raw().iter().map(|&v| v as f64).collect();
            assert_eq!(got, want.values, "{what}: resized_u8");
            let out = processor.process(&rgb).unwrap();
            let want = &expected[&format!("{name}.pixel_values")];
            assert_eq!(out.shape, want.shape, "{what}: pixel_values shape");
            let diff = max_abs(&out.pixel_values, want);
            assert!(diff <= PIXEL_TOL, "{what}: pixel_values differ by {diff}");
            let grid = expected[&format!("{name}.image_grid_thw")].as_i64();
            let grid: Vec<usize> = grid.iter().map(|&g| g as usize).collect();
            assert_eq!(out.grid, grid, "{what}: image_grid_thw");
            assert_eq!(
                out.num_tokens as u64,
                entry["num_image_tokens"].as_u64().unwrap()
            );
            let ids = processor
                .expand_placeholders(&prompt, std::slice::from_ref(&out))
                .unwrap();
            let want: Vec<u32> = expected[&format!("{name}.prompt_input_ids")]
                .as_i64()
                .iter()
                .map(|&t| t as u32)
                .collect();
            assert_eq!(ids, want, "{what}: prompt_input_ids");
            eprintln!("{what}: grid {grid:?}, pixel_values max |Δ| = {diff:e}");
        }
    }
}

/// Model cases: the PNGs, processed by the processor the registry builds from the case folder,
/// reproduce `pixel_values` and the grids; the image-token runs of `input_ids` have the
/// processor's token counts.
#[test]
fn qwen3_vl_model_case_pixels_match_transformers() {
    for dir in cases("model") {
        let case = Case::read(&dir);
        let processor = load_image_processor(&dir).unwrap();
        let mut pngs: Vec<(usize, PathBuf)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "png"))
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                let k: String = name
                    .trim_start_matches("image")
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                (k.parse().unwrap(), p)
            })
            .collect();
        pngs.sort();
        assert_eq!(
            pngs.len(),
            case.images.len(),
            "{}: PNGs vs images",
            case.name
        );
        for ((_, png), want) in pngs.iter().zip(&case.images) {
            let out = processor.process(&load_rgb(png).unwrap()).unwrap();
            assert_eq!(out.grid, want.grid, "{}: grid", png.display());
            assert_eq!(out.num_tokens, want.num_tokens, "{}: tokens", png.display());
            let diff = out
                .pixel_values
                .iter()
                .zip(&want.pixel_values)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                diff as f64 <= PIXEL_TOL,
                "{}: pixel_values differ by {diff}",
                png.display()
            );
        }
        let image_token = case.config["image_token_id"].as_u64().unwrap() as u32;
        let runs: Vec<usize> = case
            .batch
            .ids
            .chunk_by(|a, b| a == b)
            .filter(|run| run[0] == image_token)
            .map(<[u32]>::len)
            .collect();
        let tokens: Vec<usize> = case.images.iter().map(|i| i.num_tokens).collect();
        assert_eq!(runs, tokens, "{}: image-token runs", case.name);
    }
}

/// Save in the hub layout and load back: the fixture's key set exactly, identical logits in
/// f32 (sharded and not); bf16 stays close; random and shape-only builds of the same config
/// have the checkpoint's parameter count.
#[test]
fn qwen3_vl_saves_and_loads_in_the_hub_layout() {
    let device = Default::default();
    let Some(dir) = cases("model").into_iter().next() else {
        return;
    };
    let dir = &dir;
    let case = Case::read(dir);
    let model = Model::<Flex>::load(dir, &device).unwrap();
    let logits = host(model.logits(&case.batch, &case.images, &device).unwrap());
    let keys: BTreeSet<String> = read_json(&dir.join("case.json"))["checkpoint"]["keys"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let mut sink = WeightSink::default();
    model.export(&mut sink);
    let exported: BTreeSet<String> = sink.shapes().map(|(n, _)| n.to_string()).collect();
    assert_eq!(exported, keys, "exported names are the checkpoint's");

    for shard in [None, Some(20_000)] {
        let out = temp_dir(&format!("qwen3-vl-save-{}", shard.is_some()));
        model.save(&out, shard).unwrap();
        assert_eq!(
            out.join("model.safetensors.index.json").exists(),
            shard.is_some()
        );
        let back = Model::<Flex>::load(&out, &device).unwrap();
        let again = host(back.logits(&case.batch, &case.images, &device).unwrap());
        assert_eq!(again, logits, "reloaded logits (shards {shard:?})");
    }
    let out = temp_dir("qwen3-vl-bf16");
    model.save_as(&out, None, Some(Precision::BF16)).unwrap();
    let bf16 = Model::<Flex>::load_with_precision(&out, &device, Precision::BF16).unwrap();
    let low = host(bf16.logits(&case.batch, &case.images, &device).unwrap());
    let vocab = model.causal_lm().vocab_size();
    let (dev, scale) = max_dev(
        &low,
        &logits.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        |i| case.batch.attention_mask[i / vocab] != 0,
    );
    assert!(dev / scale.max(1.0) < 0.1, "bf16 logits deviate by {dev}");

    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let random = Model::<Flex>::random(&config, &device, 5).unwrap();
    let shapes = Model::<Flex>::shape_only(&config, &device, Precision::F32).unwrap();
    assert_eq!(random.num_params(), model.num_params());
    assert_eq!(shapes.num_params(), model.num_params());
    let r = host(random.logits(&case.batch, &case.images, &device).unwrap());
    assert!(
        r.iter().all(|v| v.is_finite()),
        "random model logits are finite"
    );
}

/// The real Qwen3-VL-4B-Instruct shapes (hub config.json values), built shape-only: the
/// parameter count transformers 5.24 reports for `Qwen3VLForConditionalGeneration` on that
/// config (4 437 815 808, vision tower with its DeepStack mergers 415 347 712).
#[test]
fn qwen3_vl_4b_shapes_count_transformers_parameters() {
    let config = serde_json::json!({
        "model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"],
        "image_token_id": 151655, "video_token_id": 151656,
        "vision_start_token_id": 151652, "vision_end_token_id": 151653,
        "tie_word_embeddings": true,
        "text_config": {
            "model_type": "qwen3_vl_text", "vocab_size": 151936, "hidden_size": 2560,
            "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "attention_bias": false,
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "max_position_embeddings": 262144,
            "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"},
            "rope_theta": 5000000, "bos_token_id": 151643, "eos_token_id": 151645
        },
        "vision_config": {
            "model_type": "qwen3_vl", "depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
            "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "out_hidden_size": 2560, "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [5, 11, 17], "hidden_act": "gelu_pytorch_tanh"
        }
    });
    let model =
        Model::<Flex>::shape_only(&config.to_string(), &Default::default(), Precision::BF16)
            .unwrap();
    assert_eq!(model.num_params(), 4_437_815_808);
    let Model::Qwen3Vl(q) = &model else { panic!() };
    assert_eq!(q.visual.num_params(), 415_347_712);
}

/// LoRA on the fixture checkpoint: fresh adapters (B = 0) leave the logits unchanged, the
/// vision tower is not adapted unless named, and the merged export equals the adapted model.
#[test]
fn qwen3_vl_lora_adapters() {
    let device = Default::default();
    let Some(dir) = cases("model").into_iter().next() else {
        return;
    };
    let dir = &dir;
    let case = Case::read(dir);
    let base = Model::<Flex>::load(dir, &device).unwrap();
    let config = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: vec!["all-linear".into()],
    };
    let (adapted, modules) =
        Model::<Flex>::load_adapted(dir, &device, Precision::F32, &config, AdapterInit::Fresh(3))
            .unwrap();
    let Model::Qwen3Vl(q) = &base else { panic!() };
    let layers = q.config.text.num_layers;
    assert_eq!(modules.len(), 7 * layers, "{modules:?}");
    assert!(modules.iter().all(|m| !in_vision_tower(m)), "{modules:?}");
    assert!(
        modules
            .iter()
            .all(|m| m.starts_with("model.language_model.")),
        "{modules:?}"
    );
    let logits = |m: &Model<Flex>| host(m.logits(&case.batch, &case.images, &device).unwrap());
    assert_eq!(
        logits(&adapted),
        logits(&base),
        "B = 0 keeps the base logits"
    );

    // With non-zero B the merged save reproduces the adapted model.
    let mut vision_too = config.clone();
    vision_too.target_modules = vec!["q_proj".into(), "model.visual.blocks.0.attn.qkv".into()];
    let (adapted, modules) = Model::<Flex>::random_adapted(
        &std::fs::read_to_string(dir.join("config.json")).unwrap(),
        &device,
        9,
        Precision::F32,
        &vision_too,
        AdapterInit::Fresh(4),
    )
    .unwrap();
    assert!(
        modules.contains(&"model.visual.blocks.0.attn.qkv".to_string()),
        "{modules:?}"
    );
    let adapted = perturb_adapters(adapted);
    let out = temp_dir("qwen3-vl-merged");
    adapted.save_merged_as(&out, None, None).unwrap();
    let merged = Model::<Flex>::load(&out, &device).unwrap();
    let (a, m) = (logits(&adapted), logits(&merged));
    let diff = a
        .iter()
        .zip(&m)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(diff < 1e-4, "merged vs adapted logits differ by {diff}");
}

/// Sets every adapter's B to small non-zero values (fresh adapters have B = 0).
fn perturb_adapters(model: Model<Flex>) -> Model<Flex> {
    use burn::module::{ModuleMapper, Param, ParamId};
    let ids: HashSet<ParamId> = model.adapter_ids().into_iter().map(|(_, _, b)| b).collect();
    struct Perturb(HashSet<ParamId>);
    impl ModuleMapper<Flex> for Perturb {
        fn map_float<const D: usize>(
            &mut self,
            p: Param<Tensor<Flex, D>>,
        ) -> Param<Tensor<Flex, D>> {
            if !self.0.contains(&p.id) {
                return p;
            }
            p.map(|t| {
                let n = t.shape().num_elements();
                let v: Vec<f32> = (0..n).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
                Tensor::from_data(TensorData::new(v, t.shape()), &t.device())
            })
        }
    }
    model.map(&mut Perturb(ids))
}
