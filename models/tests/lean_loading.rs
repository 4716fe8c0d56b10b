//! Lean loading and saving of Hugging Face checkpoints (models/src/checkpoint.rs): bf16 shards
//! written by `Model::save_as` load straight into bf16 (or widen exactly into f32), the cheap
//! checks of the index and shard headers name what is wrong, and shape-only builds of the real
//! Qwen2.5-VL 3B / 7B shapes count the parameters Hugging Face reports without allocating them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::DType;
use flowrl_models::weights::{Precision, WeightSink};
use flowrl_models::{Model, PaddedBatch};
use safetensors::{Dtype, SafeTensors};

/// The tiny default models: Qwen2-VL and Gemma 4 (with its host buffers).
fn tiny_dirs() -> Vec<PathBuf> {
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets");
    vec![assets.join("tiny-qwen2-vl"), assets.join("tiny-gemma4")]
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowrl-lean-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Small enough that every tiny model is split into at least three shards.
const SHARD_BYTES: usize = 100_000;

/// Every float parameter by name-less visiting order: (dtype, values widened to f32).
fn params(model: &Model<Flex>) -> Vec<(DType, Vec<f32>)> {
    struct Collect(Vec<(DType, Vec<f32>)>);
    impl ModuleVisitor<Flex> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Flex, D>>) {
            let t = param.val();
            let dtype = t.dtype();
            let values = t.into_data().convert::<f32>().into_vec::<f32>().unwrap();
            self.0.push((dtype, values));
        }
    }
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    c.0
}

/// Every exported tensor and host buffer by checkpoint name, widened to f32.
fn exported(model: &Model<Flex>) -> BTreeMap<String, Vec<f32>> {
    let mut sink = WeightSink::default();
    model.export(&mut sink);
    let names: Vec<String> = sink.shapes().map(|(n, _)| n.to_string()).collect();
    names
        .into_iter()
        .map(|n| {
            let v = sink.get(&n).unwrap().1;
            (n, v)
        })
        .collect()
}

/// Logits of two unpadded rows (every position real), as f32.
fn logits(model: &Model<Flex>) -> Vec<f32> {
    let device = Default::default();
    let batch = PaddedBatch::left_pad(&[vec![12, 40, 99, 150, 201], vec![13, 57, 88, 230, 310]], 0);
    model
        .logits(&batch, &[], &device)
        .unwrap()
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap()
}

/// Safetensors files of `dir` → (tensor name → stored dtype).
fn stored_dtypes(dir: &Path) -> (usize, BTreeMap<String, Dtype>) {
    let mut files = 0;
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            files += 1;
            let bytes = std::fs::read(&path).unwrap();
            for (name, view) in SafeTensors::deserialize(&bytes).unwrap().tensors() {
                out.insert(name, view.dtype());
            }
        }
    }
    (files, out)
}

/// A bf16 checkpoint in ≥ 3 shards loads into bf16 weights equal (bit for bit) to the f32 model
/// rounded to bf16, with logits close to the f32 twin's; loaded as f32 it is the same bf16
/// values widened exactly; saving the bf16 model writes BF16 again.
///
/// Tolerance of the logits against the f32 twin: `max |Δ| ≤ 0.05 · max(1, max |logit|)`. bf16
/// keeps 8 significant bits, so each rounding of a weight or an activation moves it by at most
/// 2⁻⁹ ≈ 2e-3 relative; the tiny models' two layers chain some tens of such roundings (weights,
/// matmul outputs, residual adds) whose errors add up roughly like a random walk, a few 1e-3 to
/// 1e-2 of the logit scale. 0.05 leaves room for that, while a wrong conversion (bytes read as
/// the wrong dtype, a lost shard) changes the logits by the order of their scale.
#[test]
fn bf16_shards_load_in_bf16_and_widen_exactly() {
    let device = Default::default();
    for dir in tiny_dirs() {
        let tag = dir.file_name().unwrap().to_string_lossy().to_string();
        let twin = Model::<Flex>::load(&dir, &device).unwrap();
        let out = temp_dir(&format!("bf16-{tag}"));
        twin.save_as(&out, Some(SHARD_BYTES), Some(Precision::BF16))
            .unwrap();
        let (files, dtypes) = stored_dtypes(&out);
        assert!(files >= 3, "{tag}: {files} shards");
        assert!(out.join("model.safetensors.index.json").is_file());
        assert!(
            dtypes.values().all(|d| *d == Dtype::BF16),
            "{tag}: every tensor, host buffers included, is stored as BF16: {dtypes:?}"
        );

        let bf16 = Model::<Flex>::load_with_precision(&out, &device, Precision::BF16).unwrap();
        let loaded = params(&bf16);
        assert!(loaded.iter().all(|(d, _)| *d == DType::BF16), "{tag}");
        // Every weight and host buffer (Gemma 4's clip bounds, layer scalars) is the f32 value
        // rounded to nearest even bf16, as torch's `.to(torch.bfloat16)` rounds.
        let rounded = |v: &[f32]| -> Vec<f32> {
            v.iter()
                .map(|x| half::bf16::from_f32(*x).to_f32())
                .collect()
        };
        let (e16, e32) = (exported(&bf16), exported(&twin));
        assert_eq!(
            e16.keys().collect::<Vec<_>>(),
            e32.keys().collect::<Vec<_>>()
        );
        for (name, v) in &e16 {
            let expected = rounded(&e32[name]);
            let wrong = v.iter().zip(&expected).filter(|(a, b)| a != b).count();
            assert_eq!(wrong, 0, "{tag}: {name}: {wrong} of {} values", v.len());
        }

        let (a, b) = (logits(&bf16), logits(&twin));
        let scale = b.iter().fold(1.0f32, |m, x| m.max(x.abs()));
        let dev = a
            .iter()
            .zip(&b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        eprintln!("{tag}: bf16 vs f32 logits max |Δ| {dev:.3e}, scale {scale:.3}");
        assert!(dev <= 0.05 * scale, "{tag}: bf16 logits deviate by {dev}");

        // Precision f32 from the bf16 shards: the bf16 values, widened exactly.
        let wide = Model::<Flex>::load_with_precision(&out, &device, Precision::F32).unwrap();
        let widened = params(&wide);
        assert!(widened.iter().all(|(d, _)| *d == DType::F32), "{tag}");
        let values = |p: Vec<(DType, Vec<f32>)>| p.into_iter().map(|(_, v)| v).collect::<Vec<_>>();
        assert_eq!(values(widened), values(loaded), "{tag}");
        assert_eq!(exported(&wide), e16, "{tag}");

        // Saving the bf16 model in its own dtype writes BF16 weights (buffers stay F32: they are
        // host f32 values), in one file; `save_as(F32)` widens everything.
        let again = temp_dir(&format!("again-{tag}"));
        bf16.save(&again, None).unwrap();
        let (files, dtypes) = stored_dtypes(&again);
        assert_eq!(files, 1);
        assert!(!again.join("model.safetensors.index.json").exists());
        let mut own = WeightSink::default();
        bf16.export(&mut own);
        for (name, d) in &dtypes {
            let expected = match own.data(name).unwrap().dtype {
                DType::BF16 => Dtype::BF16,
                _ => Dtype::F32,
            };
            assert_eq!(*d, expected, "{tag}: {name}");
        }
        let buffers = dtypes.values().filter(|d| **d == Dtype::F32).count();
        assert_eq!(
            buffers > 0,
            tag.contains("gemma"),
            "{tag}: {buffers} F32 buffers"
        );
        let reloaded =
            Model::<Flex>::load_with_precision(&again, &device, Precision::BF16).unwrap();
        assert_eq!(params(&reloaded), params(&bf16), "{tag}");
        bf16.save_as(&again, None, Some(Precision::F32)).unwrap();
        assert!(stored_dtypes(&again).1.values().all(|d| *d == Dtype::F32));
        assert_eq!(
            exported(&Model::<Flex>::load(&again, &device).unwrap()),
            e16
        );

        // An f32 model still saves F32, as before.
        twin.save(&again, None).unwrap();
        assert!(stored_dtypes(&again).1.values().all(|d| *d == Dtype::F32));
        std::fs::remove_dir_all(&out).ok();
        std::fs::remove_dir_all(&again).ok();
    }
}

/// `VmRSS` of this process in bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Parameters of a Qwen2.5-VL config computed from its shapes, as transformers'
/// `Qwen2_5_VLForConditionalGeneration` holds them:
///
/// - text: embeddings `V·H` (+ `V·H` for an untied `lm_head`), final norm `H`, and per layer
///   q `H·H + H`, k and v `H·kv + kv` each (`kv = n_kv · head_dim`, biased), o `H·H`, the SwiGLU
///   MLP `3·H·I` (no bias) and two RMSNorms `2·H`;
/// - vision: the patch embedding `w · 3 · t · p²` (Conv3d, no bias), per block two RMSNorms
///   `2w`, qkv `3w·w + 3w`, proj `w·w + w`, the SwiGLU MLP `2(w·i + i) + (i·w + w)` (biased);
///   the merger: RMSNorm `w`, `m·m + m` and `m·out + out` with `m = 4w` (2×2 merge).
fn qwen25_vl_params(config: &serde_json::Value) -> usize {
    let t = &config["text_config"];
    let u = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap() as usize;
    let (h, i, l, v) = (
        u(t, "hidden_size"),
        u(t, "intermediate_size"),
        u(t, "num_hidden_layers"),
        u(t, "vocab_size"),
    );
    let kv = u(t, "num_key_value_heads") * h / u(t, "num_attention_heads");
    let tied = config["tie_word_embeddings"].as_bool().unwrap();
    let layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h;
    let text = v * h * if tied { 1 } else { 2 } + h + l * layer;
    let c = &config["vision_config"];
    let (w, vi, depth, p, tp, out) = (
        u(c, "hidden_size"),
        u(c, "intermediate_size"),
        u(c, "depth"),
        u(c, "patch_size"),
        u(c, "temporal_patch_size"),
        u(c, "out_hidden_size"),
    );
    let block = 2 * w + (3 * w * w + 3 * w) + (w * w + w) + 2 * (w * vi + vi) + (vi * w + w);
    let m = w * u(c, "spatial_merge_size").pow(2);
    let vision = w * 3 * tp * p * p + depth * block + w + (m * m + m) + (m * out + out);
    text + vision
}

/// Qwen2.5-VL-3B-Instruct and -7B-Instruct shapes build shape-only in a moment, without memory,
/// and hold the parameter counts Hugging Face reports (3,754,622,976 and 8,292,166,656), which
/// the shape formula above gives too.
#[test]
fn shape_only_builds_of_3b_and_7b_count_hugging_face_parameters() {
    let device = Default::default();
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/gpu");
    for (folder, expected) in [
        ("qwen2_5_vl_3b", 3_754_622_976usize),
        ("qwen2_5_vl_7b", 8_292_166_656),
    ] {
        let text = std::fs::read_to_string(bench.join(folder).join("config.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(qwen25_vl_params(&json), expected, "{folder}: shape formula");
        let before = rss_bytes();
        let start = std::time::Instant::now();
        let model = Model::<Flex>::shape_only(&text, &device, Precision::BF16).unwrap();
        let elapsed = start.elapsed();
        let grown = rss_bytes().saturating_sub(before);
        assert_eq!(model.num_params(), expected, "{folder}");
        eprintln!(
            "{folder}: {} parameters, built in {elapsed:?}, RSS +{} KiB",
            model.num_params(),
            grown / 1024
        );
        // The weights alone would be 7.5 / 16.6 GB in bf16.
        assert!(grown < 256 << 20, "{folder}: RSS grew by {grown} bytes");
        assert_eq!(model.config_json(), {
            let again =
                Model::<Flex>::shape_only(&model.config_json(), &device, Precision::BF16).unwrap();
            again.config_json()
        });
    }
}

/// A tiny model saved as bf16 shards with an index, for the bad-input tests.
fn sharded(tag: &str) -> (PathBuf, serde_json::Value) {
    let device = Default::default();
    let dir = &tiny_dirs()[0];
    let model = Model::<Flex>::load(dir, &device).unwrap();
    let out = temp_dir(tag);
    model
        .save_as(&out, Some(SHARD_BYTES), Some(Precision::BF16))
        .unwrap();
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    (out, index)
}

fn load_err(dir: &Path) -> String {
    let device = Default::default();
    let err = Model::<Flex>::load_with_precision(dir, &device, Precision::BF16)
        .expect_err("the checkpoint is refused");
    format!("{err:#}")
}

/// The shard files an index names, in order.
fn shard_files(index: &serde_json::Value) -> Vec<String> {
    let files: std::collections::BTreeSet<String> = index["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    assert!(files.len() >= 3, "{files:?}");
    files.into_iter().collect()
}

fn tensors_in(index: &serde_json::Value, file: &str) -> Vec<String> {
    index["weight_map"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, f)| f.as_str() == Some(file))
        .map(|(n, _)| n.clone())
        .collect()
}

#[test]
fn a_missing_shard_is_named_with_its_tensor_count() {
    let (dir, index) = sharded("missing");
    let file = &shard_files(&index)[1];
    std::fs::remove_file(dir.join(file)).unwrap();
    let n = tensors_in(&index, file).len();
    let err = load_err(&dir);
    let needle = format!("shard {file} is missing");
    assert!(err.contains(&needle), "{err}");
    assert!(
        err.contains(&format!("the index puts {n} tensors in it")),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_shard_without_the_tensors_of_its_index_is_refused() {
    let (dir, mut index) = sharded("mismatch");
    let files = shard_files(&index);
    let (first, second) = (files[0].as_str(), files[1].as_str());
    // Swap the shard of one tensor of each: both shards disagree with the index both ways.
    let a = tensors_in(&index, first)[0].clone();
    let b = tensors_in(&index, second)[0].clone();
    index["weight_map"][&a] = second.into();
    index["weight_map"][&b] = first.into();
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let err = load_err(&dir);
    for needle in [
        format!("shard {first} does not hold the tensors the index assigns to it"),
        format!("1 in the index but not in the shard ({b})"),
        format!("1 in the shard but not in the index ({a})"),
        format!("shard {second} does not hold"),
    ] {
        assert!(err.contains(&needle), "error lacks `{needle}`:\n{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_index_whose_weight_map_is_not_an_object_is_refused() {
    let (dir, index) = sharded("weight-map");
    let files = shard_files(&index);
    let bad = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": files});
    std::fs::write(dir.join("model.safetensors.index.json"), bad.to_string()).unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains("`weight_map` is not an object (tensor name → shard file) but an array"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_truncated_shard_or_an_absurd_header_is_refused() {
    let (dir, index) = sharded("truncated");
    let name = shard_files(&index)[2].clone();
    let file = dir.join(&name);
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    let err = load_err(&dir);
    assert!(err.contains(&format!("{name} is truncated")), "{err}");
    assert!(err.contains("but the file holds"), "{err}");
    // A header length of 2⁴⁰ bytes is refused from the file size, before any allocation.
    let mut absurd = bytes.clone();
    absurd[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&file, &absurd).unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains(&format!(
            "the header length says {} bytes but the file holds only {}",
            1u64 << 40,
            bytes.len()
        )),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A NaN weight is reported at load, with the file and the tensor, not at the first rollout.
#[test]
fn a_non_finite_weight_is_refused_at_load() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/tiny-qwen2-vl");
    let dir = temp_dir("nan-weight");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let target = "model.layers.1.mlp.up_proj.weight";
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    let (_, dtype, _, data) = tensors
        .iter_mut()
        .find(|(n, ..)| n == target)
        .expect("the tiny model has the tensor");
    assert_eq!(*dtype, Dtype::F32);
    data[12..16].copy_from_slice(&f32::NAN.to_le_bytes());
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let err = Model::<Flex>::load(&dir, &Default::default())
        .map(|_| ())
        .expect_err("a NaN weight is refused");
    let msg = format!("{err:#}");
    assert!(
        msg.contains(&format!("tensor {target} holds NaN")) && msg.contains("flat index 3"),
        "{msg}"
    );
}

/// The plan's model shape (`ModelShape`, from config.json alone) against every model directory
/// of the assets, loaded: parameters, vision-tower parameters, KV-cache bytes per token in f32 and
/// bf16 (the number the rollout's KV budget divides by), and a LoRA configuration's adapters.
#[test]
fn model_shapes_from_config_match_the_loaded_models() {
    use flowrl_models::lora::{AdapterInit, LoraConfig};
    use flowrl_models::shape::ModelShape;
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets");
    let device = Default::default();
    let mut checked = 0;
    for entry in std::fs::read_dir(&assets).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("model.safetensors").is_file() {
            continue;
        }
        let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let model = Model::<Flex>::load(&dir, &device).unwrap();
        let shape = ModelShape::of_config(&config, Precision::F32, None).unwrap();
        assert_eq!(shape.params, model.num_params() as u64, "{}", dir.display());
        let vision: usize = {
            struct Count(usize);
            impl ModuleVisitor<Flex> for Count {
                fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<Flex, D>>) {
                    self.0 += p.shape().num_elements();
                }
            }
            let mut c = Count(0);
            model.visit_vision_tower(&mut c);
            c.0
        };
        assert_eq!(shape.vision_params, vision as u64, "{}", dir.display());
        assert_eq!(
            shape.kv_cache_bytes_per_token,
            model.causal_lm().kv_cache_bytes_per_token() as u64,
            "{}",
            dir.display()
        );
        let bf16 = ModelShape::of_config(&config, Precision::BF16, None).unwrap();
        let cast = model.clone().cast(Precision::BF16);
        assert_eq!(
            bf16.kv_cache_bytes_per_token,
            cast.causal_lm().kv_cache_bytes_per_token() as u64,
            "{}",
            dir.display()
        );
        assert_eq!(
            bf16.kv_cache_bytes_per_token * 2,
            shape.kv_cache_bytes_per_token
        );
        let lora = LoraConfig {
            rank: 4,
            alpha: 8.0,
            dropout: 0.0,
            target_modules: vec!["q_proj".into(), "down_proj".into()],
        };
        let (adapted, _) = Model::<Flex>::random_adapted(
            &config,
            &device,
            1,
            Precision::F32,
            &lora,
            AdapterInit::Fresh(1),
        )
        .unwrap();
        let with = ModelShape::of_config(&config, Precision::F32, Some(&lora)).unwrap();
        assert_eq!(
            with.adapter_params,
            (adapted.num_params() - model.num_params()) as u64,
            "{}",
            dir.display()
        );
        assert!(with.adapter_params > 0);
        assert_eq!(
            with.params, shape.params,
            "adapters are not counted as parameters"
        );
        checked += 1;
    }
    assert!(checked >= 3, "the assets hold three tiny models");
}
