//! Gemma 4 with transformers on every model case of the fixture directory: the parity checks of
//! common/gemma4_checks.rs (forward, greedy decoding through the KV cache, gradients; shared
//! with the GPU backends' vulkan.rs) on the CPU backend `Flex` / `Autodiff<Flex>`, and the
//! CPU-only checks of loading and saving (round trips, bad tensors, layer table, random model).

mod common;

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use common::gemma4_checks::{Case, cases, host, load, read_st};
use flowrl_models::Model;
use flowrl_models::capabilities::PaddedBatch;
use flowrl_models::weights::{WeightSink, WeightVisitor};

type Cpu = Flex;

#[test]
fn gemma4_forward_matches_transformers() {
    common::gemma4_checks::forward_matches_transformers::<Cpu>(&Default::default());
}

#[test]
fn gemma4_greedy_decoding_through_kv_cache_matches_transformers() {
    common::gemma4_checks::greedy_decoding_through_kv_cache_matches_transformers::<Cpu>(
        &Default::default(),
    );
}

#[test]
fn gemma4_gradients_match_transformers() {
    common::gemma4_checks::gradients_match_transformers::<Autodiff<Flex>>(&Default::default());
}

/// All tensors of a model by name: (shape, values).
fn weights_of<B: Backend>(model: &Model<B>) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut sink = WeightSink::default();
    model.export(&mut sink);
    sink.shapes()
        .map(|(name, shape)| {
            let (_, v) = sink.get(name).unwrap();
            (name.to_string(), shape.to_vec(), v.to_vec())
        })
        .collect()
}

#[test]
fn gemma4_save_then_load_round_trips() {
    let Some(dir) = cases().into_iter().next() else {
        return;
    };
    let dev = Default::default();
    let model = load::<Cpu>(&dir, &dev);
    let original = read_st(&dir.join("model.safetensors"));
    let mut o: Vec<_> = original
        .iter()
        .map(|(k, v)| (k.clone(), v.shape.clone()))
        .collect();
    o.sort();
    // One file, then shards with an index (the largest tensor is 128 KiB).
    for (k, shard) in [None, Some(200_000)].into_iter().enumerate() {
        let out =
            std::env::temp_dir().join(format!("flowrl-gemma4-save-{}-{k}", std::process::id()));
        model.save(&out, shard).unwrap();
        let again = load::<Cpu>(&out, &dev);
        assert_eq!(weights_of(&model), weights_of(&again));
        // The saved tensors are exactly the checkpoint's, names (transformers-5 layout) and
        // shapes (`[]` clip bounds, `[1]` layer scalars) included.
        let mut saved: Vec<(String, Vec<usize>)> = vec![];
        for entry in std::fs::read_dir(&out).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "safetensors") {
                saved.extend(read_st(&path).into_iter().map(|(k, v)| (k, v.shape)));
            }
        }
        saved.sort();
        assert_eq!(saved, o);
        assert_eq!(
            shard.is_some(),
            out.join("model.safetensors.index.json").exists()
        );
        std::fs::remove_dir_all(&out).ok();
    }
}

fn put(sink: &mut WeightSink, name: &str, shape: &[usize], values: &[f32]) {
    WeightVisitor::<Cpu>::put_buffer(sink, name, shape, values);
}

#[test]
fn gemma4_load_names_every_bad_tensor() {
    let Some(dir) = cases().into_iter().next() else {
        return;
    };
    let dev = Default::default();
    let out = std::env::temp_dir().join(format!("flowrl-gemma4-bad-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(dir.join("config.json"), out.join("config.json")).unwrap();
    let q = "model.language_model.layers.0.self_attn.q_norm.weight";
    let mut sink = WeightSink::default();
    for (name, t) in read_st(&dir.join("model.safetensors")) {
        match name.as_str() {
            "model.language_model.norm.weight" => {}
            n if n == q => put(&mut sink, &name, &[1, t.f.len()], &t.f),
            _ => put(&mut sink, &name, &t.shape, &t.f),
        }
    }
    put(
        &mut sink,
        "model.language_model.surprise.weight",
        &[2],
        &[0.0, 1.0],
    );
    put(&mut sink, "unused", &[], &[0.0]);
    sink.write(&out, None).unwrap();
    let err = format!("{:#}", Model::<Cpu>::load(&out, &dev).unwrap_err());
    assert!(err.contains("missing tensor model.norm.weight"), "{err}");
    assert!(
        err.contains("model.layers.0.self_attn.q_norm.weight"),
        "{err}"
    );
    assert!(
        err.contains("unexpected tensor model.surprise.weight"),
        "{err}"
    );
    assert!(err.contains("unexpected tensor unused"), "{err}");
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn gemma4_layer_table_matches_case() {
    for dir in cases() {
        let case = Case::load(&dir);
        let config = flowrl_models::gemma4::Gemma4Config::from_dir(&dir).unwrap();
        let table = case.json["text_config"]["layers"].as_array().unwrap();
        assert_eq!(config.layers.len(), table.len(), "{}", case.name);
        let sources = &case.json["text_config"]["kv_shared_layer_sources"];
        for (i, (spec, row)) in config.layers.iter().zip(table).enumerate() {
            let ctx = format!("{} layer {i}", case.name);
            assert_eq!(
                spec.head_dim as u64,
                row["head_dim"].as_u64().unwrap(),
                "{ctx}"
            );
            assert_eq!(
                spec.num_kv_heads as u64,
                row["num_key_value_heads"].as_u64().unwrap(),
                "{ctx}"
            );
            assert_eq!(
                spec.intermediate_size as u64,
                row["mlp_intermediate_size"].as_u64().unwrap(),
                "{ctx}"
            );
            let window = match spec.kind {
                flowrl_models::gemma4::config::LayerKind::Sliding { window } => Some(window as u64),
                flowrl_models::gemma4::config::LayerKind::Full => None,
            };
            assert_eq!(window, row["sliding_window"].as_u64(), "{ctx}");
            let expected_source = sources[i.to_string()].as_u64().map(|s| s as usize);
            let source = match spec.kv {
                flowrl_models::gemma4::config::KvSource::Own => None,
                flowrl_models::gemma4::config::KvSource::Shared(s) => Some(s),
            };
            assert_eq!(source, expected_source, "{ctx}");
            assert_eq!(
                source.is_none(),
                row["has_k_v_proj"].as_bool().unwrap(),
                "{ctx}"
            );
        }
    }
}

#[test]
fn gemma4_random_model_is_usable() {
    let Some(dir) = cases().into_iter().next() else {
        return;
    };
    let dev = Default::default();
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let model = Model::<Cpu>::random(&text, &dev, 3).unwrap();
    assert!(model.multimodal_positions().is_none());
    let batch = PaddedBatch::left_pad(&[vec![2, 7, 9, 11], vec![2, 5]], 0);
    let lm = model.causal_lm();
    let logits = lm.lm_head(lm.forward_hidden(
        batch.ids_tensor(&dev),
        model.input_embeddings(&batch, &[], &dev).unwrap(),
        model.position_ids(&batch, &[]).unwrap().tensor(&dev),
        batch.mask_tensor(&dev),
        None,
    ));
    let values = host(logits);
    assert_eq!(values.len(), 2 * 4 * lm.vocab_size());
    assert!(values.iter().all(|v| v.is_finite()));
    assert!(values.iter().any(|v| *v != 0.0));
    // Random clip bounds do not clip (±∞) and survive a save/load round trip.
    let mut sink = WeightSink::default();
    model.export(&mut sink);
    let (shape, v) = sink
        .get("model.vision_tower.encoder.layers.0.self_attn.q_proj.input_max")
        .unwrap();
    assert_eq!((shape, &v[..]), (&[][..], &[f32::INFINITY][..]));
    let (shape, v) = sink
        .get("model.language_model.layers.0.layer_scalar")
        .unwrap();
    assert_eq!((shape, &v[..]), (&[1usize][..], &[1.0f32][..]));
}
