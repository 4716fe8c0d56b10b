//! Gemma 4 parity checks against transformers on every model case of the fixture directory,
//! generic over the backend: gemma4_fixtures.rs runs them on the CPU (`Flex`), vulkan.rs on
//! burn's wgpu kernels.
//!
//! Cases: every folder with a `case.json` whose `kind` is not `processor_only` under
//! `$FLOWRL_MODEL_FIXTURES/gemma4` (default: the repository's `tests/fixtures/models`). A missing
//! `gemma4` folder skips the checks. Checked per case, within `case.json → tolerances` over the
//! real entries (README of the fixtures): position ids (exact), vision patch embeddings, encoder
//! output, pooled tokens, image embeddings, merged decoder input, per-layer-embedding parts,
//! every decoder layer's output, final hidden states, logits, token log-probs, every greedy step
//! through the KV cache (logits and tokens, exact) — by hand and through `generate` — and the
//! gradients of the fixture loss.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::AutodiffBackend;
use flowrl_models::Model;
use flowrl_models::capabilities::{CausalLm, PaddedBatch, ProcessedImage, plain_positions};
use flowrl_models::gemma4::Gemma4;
use flowrl_models::generate::{GenerationConfig, ModelParts, PromptInput, generate};
use flowrl_models::weights::GradCollector;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::{fixtures_root, greedy_config};

/// A tensor read from a fixture file.
#[derive(Clone)]
pub struct Arr {
    pub shape: Vec<usize>,
    pub f: Vec<f32>,
    pub i: Vec<i64>,
}

pub fn read_st(path: &Path) -> HashMap<String, Arr> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut out = HashMap::new();
    for (name, v) in st.tensors() {
        let d = v.data();
        let (f, i) = match v.dtype() {
            Dtype::F32 => (
                d.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                vec![],
            ),
            Dtype::I64 => {
                let i: Vec<i64> = d
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                (i.iter().map(|&x| x as f32).collect(), i)
            }
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        out.insert(
            name,
            Arr {
                shape: v.shape().to_vec(),
                f,
                i,
            },
        );
    }
    out
}

pub fn cases() -> Vec<PathBuf> {
    let family = fixtures_root().join("gemma4");
    if !family.is_dir() {
        eprintln!("no gemma4 fixtures in {}: skipped", family.display());
        return vec![];
    }
    let mut out = vec![];
    for entry in std::fs::read_dir(&family).unwrap() {
        let dir = entry.unwrap().path();
        let case = dir.join("case.json");
        if !case.is_file() {
            continue;
        }
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&case).unwrap()).unwrap();
        if json["kind"].as_str() == Some("processor_only") {
            continue;
        }
        out.push(dir);
    }
    out.sort();
    out
}

pub fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

/// Collects tolerance failures of one case.
struct Checker {
    case: String,
    tol: Value,
    failures: Vec<String>,
    checked: Vec<String>,
}

impl Checker {
    /// `|a − e| ≤ atol + rtol·|e|` over the entries where `real` (all when `None`).
    fn close(&mut self, name: &str, actual: &[f32], expected: &Arr, real: Option<&[bool]>) {
        let tol = &self.tol[name];
        assert!(
            tol.is_object(),
            "{}: no tolerance for `{name}` in case.json",
            self.case
        );
        let atol = tol["atol"].as_f64().unwrap() as f32;
        let rtol = tol["rtol"].as_f64().unwrap() as f32;
        assert_eq!(
            actual.len(),
            expected.f.len(),
            "{}: `{name}` has {} values, expected {} ({:?})",
            self.case,
            actual.len(),
            expected.f.len(),
            expected.shape
        );
        let (mut worst, mut bad, mut n) = (0f32, 0usize, 0usize);
        for (k, (&a, &e)) in actual.iter().zip(&expected.f).enumerate() {
            if real.is_some_and(|r| !r[k]) {
                continue;
            }
            n += 1;
            let d = (a - e).abs();
            if d.is_nan() || d > atol + rtol * e.abs() {
                bad += 1;
            }
            if d.is_nan() || d > worst {
                worst = if d.is_nan() { f32::INFINITY } else { d };
            }
        }
        assert!(n > 0, "{}: `{name}` has no real entries", self.case);
        self.checked
            .push(format!("{name} (max |diff| {worst:.2e}, atol {atol:.1e})"));
        if bad > 0 {
            self.failures.push(format!(
                "{name}: {bad}/{n} entries out of tolerance (max |diff| {worst:.3e}, atol {atol:.1e})"
            ));
        }
    }

    fn finish(self) {
        eprintln!("[{}] checked: {}", self.case, self.checked.join("; "));
        assert!(
            self.failures.is_empty(),
            "{}:\n  {}",
            self.case,
            self.failures.join("\n  ")
        );
    }
}

/// Per element of a `[rows, cols, inner...]` tensor: whether `row_real[r, c]`.
fn expand_mask(row_real: &[bool], inner: usize) -> Vec<bool> {
    row_real
        .iter()
        .flat_map(|&r| std::iter::repeat_n(r, inner))
        .collect()
}

pub struct Case {
    pub dir: PathBuf,
    pub name: String,
    pub json: Value,
    pub inputs: HashMap<String, Arr>,
    pub expected: HashMap<String, Arr>,
    pub batch: PaddedBatch,
    pub images: Vec<ProcessedImage>,
}

impl Case {
    pub fn load(dir: &Path) -> Self {
        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let inputs = read_st(&dir.join("inputs.safetensors"));
        let expected = read_st(&dir.join("expected.safetensors"));
        let ids = &inputs["input_ids"];
        let (b, l) = (ids.shape[0], ids.shape[1]);
        let batch = PaddedBatch {
            ids: ids.i.iter().map(|&x| x as u32).collect(),
            attention_mask: inputs["attention_mask"]
                .i
                .iter()
                .map(|&x| x as u32)
                .collect(),
            batch: b,
            len: l,
        };
        let mut images = vec![];
        if let Some(pv) = inputs.get("pixel_values") {
            let (n, p, dim) = (pv.shape[0], pv.shape[1], pv.shape[2]);
            let pos = &inputs["image_position_ids"];
            let soft = &inputs["num_soft_tokens_per_image"];
            for k in 0..n {
                images.push(ProcessedImage {
                    pixel_values: pv.f[k * p * dim..(k + 1) * p * dim].to_vec(),
                    shape: vec![p, dim],
                    grid: vec![],
                    num_tokens: soft.i[k] as usize,
                    patch_positions: Some(
                        (0..p)
                            .map(|j| [pos.i[(k * p + j) * 2], pos.i[(k * p + j) * 2 + 1]])
                            .collect(),
                    ),
                    video: None,
                });
            }
        }
        Self {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),
            dir: dir.to_path_buf(),
            json,
            inputs,
            expected,
            batch,
            images,
        }
    }

    fn checker(&self) -> Checker {
        Checker {
            case: self.name.clone(),
            tol: self.json["tolerances"].clone(),
            failures: vec![],
            checked: vec![],
        }
    }

    fn real_tokens(&self) -> Vec<bool> {
        self.batch.attention_mask.iter().map(|&m| m != 0).collect()
    }

    /// Merged decoder input through the capabilities: scaled text embeddings with the image
    /// rows replaced.
    fn embeds<B: Backend>(&self, model: &Model<B>, dev: &B::Device) -> Tensor<B, 3> {
        model
            .input_embeddings(&self.batch, &self.images, dev)
            .unwrap()
    }

    /// Positions through the capabilities (Gemma 4 has no multimodal-position capability, so
    /// these are the plain 1-D ones).
    fn positions<B: Backend>(&self, model: &Model<B>, dev: &B::Device) -> Tensor<B, 3, Int> {
        model
            .position_ids(&self.batch, &self.images)
            .unwrap()
            .tensor::<B>(dev)
    }
}

/// Loads a case's checkpoint through the family registry.
pub fn load<B: Backend>(dir: &Path, dev: &B::Device) -> Model<B> {
    let model = Model::<B>::load(dir, dev).unwrap();
    assert_eq!(model.model_type(), "gemma4");
    assert!(
        model.multimodal_positions().is_none(),
        "Gemma 4 has no multimodal-position capability"
    );
    model
}

fn gemma<B: Backend>(model: &Model<B>) -> &Gemma4<B> {
    match model {
        Model::Gemma4(g) => g,
        _ => panic!("not a Gemma 4 model"),
    }
}

/// Position ids (exact), vision stages, merged decoder input, per-layer-embedding parts, every
/// decoder layer, final hidden states, logits and token log-probs of a full forward on `B`.
pub fn forward_matches_transformers<B: Backend>(dev: &B::Device) {
    for dir in cases() {
        let case = Case::load(&dir);
        let model = load::<B>(&case.dir, dev);
        let g = gemma(&model);
        let mut c = case.checker();
        let (b, l) = (case.batch.batch, case.batch.len);
        let real = case.real_tokens();

        // Positions: 1-D from the mask (no multimodal-position capability), exact.
        let pos = model.position_ids(&case.batch, &case.images).unwrap();
        assert_eq!(pos.streams, 1);
        assert_eq!(
            pos.ids, case.expected["position_ids"].i,
            "{}: position ids",
            case.name
        );

        // Vision stages.
        if !case.images.is_empty() {
            let (img, trace) = g.embed_images_traced(&case.images, dev).unwrap();
            let patch_real: Vec<bool> = case.inputs["image_position_ids"]
                .i
                .chunks(2)
                .map(|xy| xy[0] >= 0)
                .collect();
            let hv = trace.patch_embeds.dims()[2];
            let m = expand_mask(&patch_real, hv);
            c.close(
                "vision_patch_embeds",
                &host(trace.patch_embeds),
                &case.expected["vision_patch_embeds"],
                Some(&m),
            );
            c.close(
                "vision_encoder_out",
                &host(trace.encoder_out),
                &case.expected["vision_encoder_out"],
                Some(&m),
            );
            c.close(
                "vision_pooled",
                &host(trace.pooled),
                &case.expected["vision_pooled"],
                None,
            );
            c.close(
                "image_embeds",
                &host(img),
                &case.expected["image_embeds"],
                None,
            );
        }

        let embeds = case.embeds(&model, dev);
        let h = embeds.dims()[2];
        c.close(
            "inputs_embeds",
            &host(embeds.clone()),
            &case.expected["inputs_embeds"],
            Some(&expand_mask(&real, h)),
        );
        let (hidden, trace) = g.forward_traced(
            case.batch.ids_tensor(dev),
            embeds,
            case.positions::<B>(&model, dev),
            case.batch.mask_tensor(dev),
        );
        let [_, _, n, p] = trace.per_layer_inputs.dims();
        let ple_mask = expand_mask(&real, n * p);
        c.close(
            "ple_token_identity",
            &host(trace.ple_token_identity),
            &case.expected["ple_token_identity"],
            Some(&ple_mask),
        );
        c.close(
            "per_layer_inputs",
            &host(trace.per_layer_inputs),
            &case.expected["per_layer_inputs"],
            Some(&ple_mask),
        );
        let layers = Tensor::stack::<4>(trace.layer_outputs, 0);
        let layer_mask: Vec<bool> = (0..n).flat_map(|_| expand_mask(&real, h)).collect();
        c.close(
            "decoder_layer_outputs",
            &host(layers),
            &case.expected["decoder_layer_outputs"],
            Some(&layer_mask),
        );
        c.close(
            "final_hidden",
            &host(hidden.clone()),
            &case.expected["final_hidden"],
            Some(&expand_mask(&real, h)),
        );
        let logits = g.lm_head(hidden);
        let v = logits.dims()[2];
        c.close(
            "logits",
            &host(logits.clone()),
            &case.expected["logits"],
            Some(&expand_mask(&real, v)),
        );
        let lp = token_logprobs(logits, &case.batch);
        let lp_real: Vec<bool> = (0..b)
            .flat_map(|r| (0..l - 1).map(move |j| (r, j)))
            .map(|(r, j)| real[r * l + j])
            .collect();
        c.close(
            "token_logprobs",
            &host(lp),
            &case.expected["token_logprobs"],
            Some(&lp_real),
        );
        c.finish();
    }
}

/// `log_softmax(logits)[:, j, ids[:, j+1]]`, `[B, L−1]`.
fn token_logprobs<B: Backend>(logits: Tensor<B, 3>, batch: &PaddedBatch) -> Tensor<B, 2> {
    let [b, l, _] = logits.dims();
    let dev = &logits.device();
    let lsm = log_softmax(logits.narrow(1, 0, l - 1), 2);
    let next: Vec<i64> = (0..b)
        .flat_map(|r| (1..l).map(move |j| batch.ids[r * l + j] as i64))
        .collect();
    let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(next, [b * (l - 1)]), dev).reshape([
        b,
        l - 1,
        1,
    ]);
    lsm.gather(2, idx).reshape([b, l - 1])
}

/// Greedy decoding on `B` through the KV cache, by hand (every step's logits within the case's
/// tolerance, tokens and positions exact) and through `generate` (tokens exact, also with a row
/// stopping early).
pub fn greedy_decoding_through_kv_cache_matches_transformers<B: Backend>(dev: &B::Device) {
    for dir in cases() {
        let case = Case::load(&dir);
        let model = load::<B>(&case.dir, dev);
        let lm = model.causal_lm();
        let mut c = case.checker();
        let (b, l) = (case.batch.batch, case.batch.len);
        let exp_tokens = &case.expected["generated_tokens"];
        let exp_logits = &case.expected["generated_step_logits"];
        let steps = exp_tokens.shape[1];
        let v = lm.vocab_size();

        // By hand: prefill, then one token per step; the prompt is never recomputed.
        let mut cache = lm.new_cache();
        let hidden = lm.forward_hidden(
            case.batch.ids_tensor(dev),
            case.embeds(&model, dev),
            case.positions::<B>(&model, dev),
            case.batch.mask_tensor(dev),
            Some(&mut cache),
        );
        let mut step_logits = lm.lm_head(hidden.narrow(1, l - 1, 1));
        let mut all_logits = vec![vec![]; b];
        let mut tokens = vec![vec![]; b];
        let mut mask = case.batch.attention_mask.clone();
        let mut keys = l;
        let mut last_pos: Vec<i64> = (0..b)
            .map(|r| plain_positions(&case.batch).ids[r * l + l - 1])
            .collect();
        let exp_pos = &case.expected["generated_step_position_ids"];
        for step in 0..steps {
            let host_logits = host(step_logits.clone());
            let mut next = vec![];
            for r in 0..b {
                let row = &host_logits[r * v..(r + 1) * v];
                let arg = row
                    .iter()
                    .enumerate()
                    .fold(
                        (0, f32::MIN),
                        |acc, (k, &x)| if x > acc.1 { (k, x) } else { acc },
                    )
                    .0;
                all_logits[r].extend_from_slice(row);
                tokens[r].push(arg as i64);
                next.push(arg as i64);
                assert_eq!(
                    last_pos[r],
                    exp_pos.i[r * steps + step],
                    "{}: position of step {step}",
                    case.name
                );
            }
            if step + 1 == steps {
                break;
            }
            // Grow the mask by one real key per row.
            let mut grown = Vec::with_capacity(b * (keys + 1));
            for r in 0..b {
                grown.extend_from_slice(&mask[r * keys..(r + 1) * keys]);
                grown.push(1);
            }
            mask = grown;
            keys += 1;
            for p in last_pos.iter_mut() {
                *p += 1;
            }
            let ids =
                Tensor::<B, 1, Int>::from_data(TensorData::new(next, [b]), dev).reshape([b, 1]);
            let pos = Tensor::<B, 1, Int>::from_data(TensorData::new(last_pos.clone(), [b]), dev)
                .reshape([1, b, 1]);
            let m = flowrl_models::capabilities::mask_tensor::<B>(&mask, b, keys, dev);
            let hidden =
                lm.forward_hidden(ids.clone(), lm.embed_tokens(ids), pos, m, Some(&mut cache));
            assert_eq!(cache.len(), keys, "{}: cache length", case.name);
            step_logits = lm.lm_head(hidden);
        }
        let flat_tokens: Vec<i64> = tokens.concat();
        assert_eq!(
            flat_tokens, exp_tokens.i,
            "{}: greedy tokens through the KV cache",
            case.name
        );
        c.close("logits", &all_logits.concat(), exp_logits, None);

        // The shared generation loop over the capabilities gives the same tokens.
        let prompts: Vec<Vec<u32>> = (0..b)
            .map(|r| {
                case.batch
                    .row(r)
                    .iter()
                    .zip(case.batch.mask_row(r))
                    .filter(|(_, m)| **m != 0)
                    .map(|(t, _)| *t)
                    .collect()
            })
            .collect();
        let mut per_row_images: Vec<Vec<ProcessedImage>> = vec![vec![]; b];
        if let Some(rows) = case.inputs.get("image_row_index") {
            for (k, &r) in rows.i.iter().enumerate() {
                per_row_images[r as usize].push(case.images[k].clone());
            }
        }
        let inputs: Vec<PromptInput> = (0..b)
            .map(|r| PromptInput {
                ids: &prompts[r],
                images: &per_row_images[r],
            })
            .collect();
        let no_eos = NoEos(lm);
        let parts = ModelParts {
            lm: &no_eos,
            vision: model.vision(),
            positions: model.multimodal_positions(),
        };
        let config = greedy_config(steps);
        let seeds: Vec<u64> = (0..inputs.len() as u64).collect();
        let generation = generate(&parts, &inputs, &config, &seeds, dev).unwrap();
        let gen_tokens: Vec<i64> = generation
            .tokens
            .concat()
            .iter()
            .map(|&t| t as i64)
            .collect();
        assert_eq!(
            gen_tokens, exp_tokens.i,
            "{}: greedy tokens through `generate`",
            case.name
        );

        // A row that stops early leaves the batch (shared-KV layers included) once at most
        // half the rows are alive; the other rows continue unchanged.
        let rows: Vec<&[i64]> = exp_tokens.i.chunks(steps).collect();
        let stop = rows[0].get(1).copied();
        if let Some(stop) = stop.filter(|&t| {
            b > 1 && steps > 2 && rows[0][0] != t && rows[1..].iter().all(|r| !r.contains(&t))
        }) {
            let config = GenerationConfig {
                stop_token_ids: vec![stop as u32],
                ..config
            };
            let generation = generate(&parts, &inputs, &config, &seeds, dev).unwrap();
            assert_eq!(generation.tokens[0], vec![rows[0][0] as u32, stop as u32]);
            assert!(generation.stopped[0]);
            for (r, row) in rows.iter().enumerate().skip(1) {
                let got: Vec<i64> = generation.tokens[r].iter().map(|&t| t as i64).collect();
                assert_eq!(&got, row, "{}: row {r} after row 0 stopped", case.name);
            }
        }
        c.finish();
    }
}

/// The model with EOS stopping disabled (the reference generated with `eos_token_id=None`).
struct NoEos<'a, B: Backend>(&'a dyn CausalLm<B>);

impl<B: Backend> CausalLm<B> for NoEos<'_, B> {
    fn embed_tokens(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.0.embed_tokens(ids)
    }
    fn forward_hidden(
        &self,
        ids: Tensor<B, 2, Int>,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
        cache: Option<&mut flowrl_models::KvCache<B>>,
    ) -> Tensor<B, 3> {
        self.0
            .forward_hidden(ids, embeds, positions, attention_mask, cache)
    }
    fn lm_head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.0.lm_head(hidden)
    }
    fn decoder_segments(&self) -> Vec<std::ops::Range<usize>> {
        self.0.decoder_segments()
    }
    fn decoder_inputs(
        &self,
        ids: Tensor<B, 2, Int>,
        embeds: Tensor<B, 3>,
    ) -> flowrl_models::DecoderInputs<B> {
        self.0.decoder_inputs(ids, embeds)
    }
    fn layer_input_channels(&self, layers: std::ops::Range<usize>) -> std::ops::Range<usize> {
        self.0.layer_input_channels(layers)
    }
    fn decoder_segment(
        &self,
        layers: std::ops::Range<usize>,
        h: Tensor<B, 3>,
        layer_inputs: Option<Tensor<B, 3>>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
    ) -> Tensor<B, 3> {
        self.0
            .decoder_segment(layers, h, layer_inputs, positions, attention_mask)
    }
    fn final_norm(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
        self.0.final_norm(h)
    }
    fn new_cache(&self) -> flowrl_models::KvCache<B> {
        self.0.new_cache()
    }
    fn kv_cache_bytes_per_token(&self) -> usize {
        self.0.kv_cache_bytes_per_token()
    }
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn eos_token_ids(&self) -> Vec<u32> {
        vec![]
    }
    fn context_length(&self) -> usize {
        self.0.context_length()
    }
    fn hidden_size(&self) -> usize {
        self.0.hidden_size()
    }
}

/// Loss and the gradients of every `grad_params` tensor of the case on `AD`.
pub fn gradients_match_transformers<AD: AutodiffBackend>(dev: &AD::Device) {
    for dir in cases() {
        let case = Case::load(&dir);
        let model = load::<AD>(&case.dir, dev);
        let lm = model.causal_lm();
        let mut c = case.checker();
        let (b, l) = (case.batch.batch, case.batch.len);
        let embeds = case.embeds(&model, dev);
        let hidden = lm.forward_hidden(
            case.batch.ids_tensor(dev),
            embeds,
            case.positions::<AD>(&model, dev),
            case.batch.mask_tensor(dev),
            None,
        );
        let lp = token_logprobs(lm.lm_head(hidden), &case.batch);
        let rm = &case.inputs["response_mask"];
        let rmask = Tensor::<AD, 1>::from_data(TensorData::new(rm.f.clone(), [b * (l - 1)]), dev)
            .reshape([b, l - 1]);
        let loss = (lp * rmask.clone()).sum().neg() / rmask.sum();
        c.close("loss", &host(loss.clone()), &case.expected["loss"], None);
        let grads = loss.backward();
        let mut collected = GradCollector::<AD>::new(&grads);
        model.export(&mut collected);
        let params = case.json["grad_params"].as_object().unwrap();
        assert!(!params.is_empty());
        for name in params.keys() {
            let Some((_, g)) = collected.tensors.get(name) else {
                panic!("{}: no gradient for `{name}`", case.name)
            };
            c.close(
                &format!("grad.{name}"),
                g,
                &case.expected[&format!("grad.{name}")],
                None,
            );
        }
        c.finish();
    }
}
