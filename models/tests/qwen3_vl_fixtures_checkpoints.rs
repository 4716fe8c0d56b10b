//! Qwen3-VL on the fixture checkpoints: saving in the hub layout and loading back (f32, bf16,
//! sharded), random and shape-only builds (the real Qwen3-VL-4B shapes), and LoRA adapters.

mod common;

use std::collections::{BTreeSet, HashSet};

use burn::backend::Flex;
use burn::module::Module;
use burn::prelude::*;
use common::qwen_checks::host;
use common::qwen3_vl::{Case, cases, read_json};
use common::{max_dev, temp_dir};
use flowrl_models::Model;
use flowrl_models::lora::{AdapterInit, LoraConfig, in_vision_tower};
use flowrl_models::weights::{Precision, WeightSink};

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
