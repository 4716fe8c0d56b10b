//! Loading and saving Hugging Face directories of the Qwen VL families: sharded checkpoints with
//! an index and transformers-5 weight names, the flat config layout with `rope_scaling`, one
//! error naming every bad tensor, save → load round trips, random initialisation.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::backend::Flex;
use common::{model_cases, prompt_hidden, temp_dir};
use flowrl_models::qwen2_vl::QwenVlConfig;
use flowrl_models::weights::WeightSink;
use flowrl_models::{Model, PaddedBatch};
use safetensors::{SafeTensors, tensor::TensorView};
use serde_json::Value;

const FAMILIES: &[&str] = &["qwen2_vl", "qwen2_5_vl"];

/// Every weight of a model by checkpoint name.
fn weights(model: &Model<Flex>) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let mut sink = WeightSink::default();
    model.export(&mut sink);
    sink.shapes()
        .map(|(name, _)| {
            let (s, v) = sink.get(name).unwrap();
            (name.to_string(), (s.to_vec(), v.to_vec()))
        })
        .collect()
}

/// Raw tensors of a safetensors file: name → (shape, little-endian bytes).
fn raw_tensors(path: &Path) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.shape().to_vec(), v.data().to_vec()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn write_f32(path: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// transformers-5 module names: `visual.X → model.visual.X`, `model.X → model.language_model.X`.
fn v5_name(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("visual.") {
        format!("model.visual.{rest}")
    } else if let Some(rest) = name.strip_prefix("model.") {
        format!("model.language_model.{rest}")
    } else {
        name.to_string()
    }
}

/// The `config.json` text of the first Qwen VL fixture case.
fn first_config() -> String {
    std::fs::read_to_string(first_case().join("config.json")).unwrap()
}

/// The first Qwen VL fixture case.
fn first_case() -> PathBuf {
    model_cases(FAMILIES)
        .into_iter()
        .next()
        .expect("a Qwen VL case")
}

#[test]
fn sharded_checkpoint_with_v5_names_loads_identically() {
    let device = Default::default();
    for dir in model_cases(FAMILIES) {
        let reference = Model::<Flex>::load(&dir, &device).unwrap();
        let tensors = raw_tensors(&dir.join("model.safetensors"));
        let out = temp_dir(&format!(
            "sharded-{}",
            dir.file_name().unwrap().to_string_lossy()
        ));
        std::fs::copy(dir.join("config.json"), out.join("config.json")).unwrap();
        let shards = 3;
        let per = tensors.len().div_ceil(shards);
        let mut weight_map = serde_json::Map::new();
        for (k, chunk) in tensors.chunks(per).enumerate() {
            let file = format!("model-{:05}-of-{:05}.safetensors", k + 1, shards);
            let renamed: Vec<_> = chunk
                .iter()
                .map(|(n, s, b)| (v5_name(n), s.clone(), b.clone()))
                .collect();
            for (n, _, _) in &renamed {
                weight_map.insert(n.clone(), Value::String(file.clone()));
            }
            write_f32(&out.join(&file), &renamed);
        }
        let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        std::fs::write(out.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let sharded = Model::<Flex>::load(&out, &device).unwrap();
        assert_eq!(weights(&sharded), weights(&reference), "{}", dir.display());
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
fn save_then_load_round_trips_single_and_sharded() {
    let device = Default::default();
    for dir in model_cases(FAMILIES) {
        let model = Model::<Flex>::load(&dir, &device).unwrap();
        let expected = weights(&model);
        for shard in [None, Some(300_000)] {
            let out = temp_dir("roundtrip");
            model.save(&out, shard).unwrap();
            assert_eq!(
                out.join("model.safetensors.index.json").exists(),
                shard.is_some(),
                "index only when sharded"
            );
            // Legacy hub names on disk, as save_pretrained writes them.
            let on_disk: Vec<String> = std::fs::read_dir(&out)
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .flat_map(|p| raw_tensors(&p).into_iter().map(|t| t.0))
                .collect();
            let mut on_disk = on_disk;
            on_disk.sort();
            let mut original: Vec<String> = raw_tensors(&dir.join("model.safetensors"))
                .into_iter()
                .map(|t| t.0)
                .collect();
            original.sort();
            assert_eq!(on_disk, original, "saved names equal the checkpoint's");
            let again = Model::<Flex>::load(&out, &device).unwrap();
            assert_eq!(weights(&again), expected);
            assert_eq!(again.config_json(), model.config_json());
            std::fs::remove_dir_all(&out).unwrap();
        }
    }
}

#[test]
fn bad_checkpoint_reports_every_tensor_in_one_error() {
    let device = Default::default();
    let dir = first_case();
    let mut tensors = raw_tensors(&dir.join("model.safetensors"));
    tensors.retain(|t| t.0 != "model.norm.weight");
    tensors.push(("extra.unused.weight".into(), vec![2], vec![0; 8]));
    for t in tensors.iter_mut() {
        if t.0 == "model.layers.0.mlp.up_proj.weight" {
            let n = t.2.len() / 4;
            t.1 = vec![n];
        }
    }
    let out = temp_dir("bad");
    std::fs::copy(dir.join("config.json"), out.join("config.json")).unwrap();
    write_f32(&out.join("model.safetensors"), &tensors);
    let err = format!("{:#}", Model::<Flex>::load(&out, &device).unwrap_err());
    for needle in [
        "missing tensor model.norm.weight",
        "mis-shaped tensor model.layers.0.mlp.up_proj.weight",
        "unexpected tensor extra.unused.weight",
    ] {
        assert!(err.contains(needle), "error lacks `{needle}`:\n{err}");
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// The older flat config layout: text keys at the top level, `rope_theta` top-level and
/// `rope_scaling: {"type": "mrope", "mrope_section": …}`.
fn flatten(nested: &Value) -> Value {
    let mut flat = nested.as_object().unwrap().clone();
    let text = flat.remove("text_config").unwrap();
    for (k, v) in text.as_object().unwrap() {
        if k == "rope_parameters" {
            flat.insert("rope_theta".into(), v["rope_theta"].clone());
            flat.insert(
                "rope_scaling".into(),
                serde_json::json!({"type": "mrope", "mrope_section": v["mrope_section"]}),
            );
        } else if k != "model_type" {
            flat.insert(k.clone(), v.clone());
        }
    }
    Value::Object(flat)
}

#[test]
fn flat_config_with_rope_scaling_parses_like_nested() {
    for dir in model_cases(FAMILIES) {
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let nested: Value = serde_json::from_str(&text).unwrap();
        let a = QwenVlConfig::from_value(&nested).unwrap();
        let b = QwenVlConfig::from_value(&flatten(&nested)).unwrap();
        assert_eq!(a.text, b.text, "{}", dir.display());
        assert_eq!(a.vision, b.vision);
        assert_eq!(a.image_token_id, b.image_token_id);
        assert!(a.text.rope_theta == 100.0 && a.text.mrope_section.iter().sum::<usize>() == 8);
    }
}

#[test]
fn random_model_is_deterministic_and_round_trips() {
    let device = Default::default();
    let config = first_config();
    let a = Model::<Flex>::random(&config, &device, 7).unwrap();
    let b = Model::<Flex>::random(&config, &device, 7).unwrap();
    let c = Model::<Flex>::random(&config, &device, 8).unwrap();
    assert_eq!(weights(&a), weights(&b));
    assert_ne!(weights(&a), weights(&c));
    let out = temp_dir("random");
    a.save(&out, None).unwrap();
    let loaded = Model::<Flex>::load(&out, &device).unwrap();
    assert_eq!(weights(&loaded), weights(&a));
    // A forward pass gives finite logits of the right shape.
    let batch = PaddedBatch::left_pad(&[vec![1, 2, 3], vec![4, 5]], 0);
    let lm = loaded.causal_lm();
    let pos = loaded.position_ids(&batch, &[]).unwrap();
    let h = prompt_hidden(&loaded, &batch, &[], &pos, &device, None);
    let logits = lm.lm_head(h);
    assert_eq!(logits.dims(), [2, 3, lm.vocab_size()]);
    let v = logits.into_data().into_vec::<f32>().unwrap();
    assert!(v.iter().all(|x| x.is_finite()));
    std::fs::remove_dir_all(&out).unwrap();
}

/// Dropping finished rows from the KV cache leaves the remaining rows' next step unchanged.
#[test]
fn kv_cache_select_rows_keeps_the_remaining_rows() {
    use flowrl_models::capabilities::mask_tensor;
    let device = Default::default();
    let config = first_config();
    let model = Model::<Flex>::random(&config, &device, 3).unwrap();
    let lm = model.causal_lm();
    let batch = PaddedBatch::left_pad(&[vec![1, 2, 3, 4], vec![5, 6], vec![7, 8, 9]], 0);
    let pos = model.position_ids(&batch, &[]).unwrap();
    let mut cache = lm.new_cache();
    prompt_hidden(&model, &batch, &[], &pos, &device, Some(&mut cache));
    let step = |cache: &mut flowrl_models::KvCache<Flex>, rows: &[usize]| {
        let next = PaddedBatch::left_pad(
            &rows
                .iter()
                .map(|&r| vec![10 + r as u32])
                .collect::<Vec<_>>(),
            0,
        );
        let real = batch.real_lengths();
        let lengths: Vec<usize> = rows.iter().map(|&r| real[r]).collect();
        // Text-only rows: every stream continues at the row's real length (delta 0).
        let p = flowrl_models::PositionIds {
            streams: 3,
            batch: rows.len(),
            len: 1,
            ids: (0..3)
                .flat_map(|_| lengths.iter().map(|&n| n as i64))
                .collect(),
            rope_deltas: vec![0; rows.len()],
        };
        let mut mask = Vec::new();
        for &r in rows {
            mask.extend_from_slice(batch.mask_row(r));
            mask.push(1);
        }
        let ids = next.ids_tensor(&device);
        let h = lm.forward_hidden(
            ids.clone(),
            lm.embed_tokens(ids),
            p.tensor(&device),
            mask_tensor(&mask, rows.len(), batch.len + 1, &device),
            Some(cache),
        );
        lm.lm_head(h).into_data().into_vec::<f32>().unwrap()
    };
    let mut full = cache.clone();
    let all = step(&mut full, &[0, 1, 2]);
    cache.select_rows(&[0, 2]);
    let kept = step(&mut cache, &[0, 2]);
    let v = lm.vocab_size();
    let expect: Vec<f32> = [&all[..v], &all[2 * v..]].concat();
    let dev = kept
        .iter()
        .zip(&expect)
        .map(|(a, e)| (a - e).abs())
        .fold(0.0f32, f32::max);
    assert!(dev < 1e-5, "kept rows changed by {dev}");
}

/// `Model` is a burn `Module`: a burn optimizer steps it and the loss goes down.
#[test]
fn burn_optimizer_steps_the_model() {
    use burn::backend::Autodiff;
    use burn::optim::{AdamConfig, GradientsParams, Optimizer};
    use burn::tensor::activation::log_softmax;
    type AD = Autodiff<Flex>;
    let device = Default::default();
    let dir = first_case();
    let mut model = Model::<AD>::load(&dir, &device).unwrap();
    let batch = PaddedBatch::left_pad(&[vec![1, 2, 3, 4, 5, 6], vec![7, 8, 9]], 0);
    let loss = |model: &Model<AD>| {
        let lm = model.causal_lm();
        let pos = model.position_ids(&batch, &[]).unwrap();
        let h = lm.forward_hidden(
            batch.ids_tensor(&device),
            model.input_embeddings(&batch, &[], &device).unwrap(),
            pos.tensor(&device),
            batch.mask_tensor(&device),
            None,
        );
        let l = batch.len;
        let targets = batch.ids_tensor::<AD>(&device).narrow(1, 1, l - 1);
        log_softmax(lm.lm_head(h).narrow(1, 0, l - 1), 2)
            .gather(2, targets.unsqueeze_dim(2))
            .mean()
            .neg()
    };
    let before = loss(&model);
    let value = |t: &burn::tensor::Tensor<AD, 1>| t.clone().into_scalar();
    let l0: f32 = value(&before);
    let grads = GradientsParams::from_grads(before.backward(), &model);
    let mut optim = AdamConfig::new().init();
    model = optim.step(1e-2, model, grads);
    let l1: f32 = value(&loss(&model));
    assert!(l1 < l0, "loss did not decrease: {l0} -> {l1}");
}

/// Impossible config values are refused, naming the key, instead of panicking later (a zero head
/// count divided by zero in the parser).
#[test]
fn impossible_config_values_are_refused_with_the_key() {
    let base: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/tiny-qwen2-vl/config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let cases: &[(&str, &str, Value, &str)] = &[
        (
            "text_config",
            "num_attention_heads",
            0.into(),
            "num_attention_heads must be at least 1",
        ),
        (
            "text_config",
            "num_key_value_heads",
            3.into(),
            "not a multiple of num_key_value_heads 3",
        ),
        (
            "text_config",
            "num_hidden_layers",
            0.into(),
            "num_hidden_layers must be at least 1",
        ),
        ("text_config", "vocab_size", (-5).into(), "`vocab_size`"),
        (
            "text_config",
            "rms_norm_eps",
            0.0.into(),
            "rms_norm_eps must be a positive number",
        ),
        (
            "vision_config",
            "num_heads",
            0.into(),
            "vision_config num_heads must be at least 1",
        ),
        (
            "vision_config",
            "num_heads",
            3.into(),
            "is not a multiple of num_heads 3",
        ),
        (
            "vision_config",
            "depth",
            0.into(),
            "vision_config depth must be at least 1",
        ),
        (
            "vision_config",
            "patch_size",
            0.into(),
            "patch_size must be at least 1",
        ),
    ];
    for (section, key, value, needle) in cases {
        let mut config = base.clone();
        config[*section][*key] = value.clone();
        let err = QwenVlConfig::from_value(&config)
            .map(|_| ())
            .expect_err(&format!("{section}.{key} = {value} must be refused"));
        assert!(
            format!("{err:#}").contains(needle),
            "{section}.{key} = {value}: {err:#}"
        );
    }
    // Without head_dim, a hidden size that the heads do not divide.
    let mut config = base.clone();
    config["text_config"]["hidden_size"] = 66.into();
    let err = QwenVlConfig::from_value(&config).map(|_| ()).unwrap_err();
    assert!(
        format!("{err}").contains("not a multiple of num_attention_heads"),
        "{err}"
    );
}
