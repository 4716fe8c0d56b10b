//! Gradient checkpointing (`gradient_checkpointing = true`, verl
//! `model.enable_gradient_checkpointing`) against the backward through the kept graph, for every
//! model family in `assets/` (one checkpoint per `model_type`: Qwen2-VL, Qwen3-VL with its
//! DeepStack features, Gemma 4 with its per-layer inputs and KV-sharing layers), on the family's
//! rollouts (3 prompts with an image each × 4 responses):
//!
//! - the segments of [`flowrl_models::CausalLm::decoder_segments`] run one after the other give
//!   `forward_hidden`'s hidden states, bit for bit;
//! - `update.ppo` takes the same step checkpointed, padded (token-mean) and padding-free
//!   (seq-mean-token-mean): weights after one AdamW step within 1e-5 of their largest change,
//!   losses and gradient norm within 1e-5 relative (AdamW's first step with ε = 1, lr 1:
//!   Δw = g / (|g| + 1), a smooth function of the gradient, as in `token_budget.rs`);
//! - `update.critic` (Qwen2-VL with a value head) likewise;
//! - LoRA with dropout (all-linear adapters, p = 0.3): the same gradients within 1e-5 relative,
//!   so the recomputed layers drew the forward's dropout masks; and in bf16 (a recorded cast of
//!   the f32 masters) every parameter gets its gradient, within bf16 rounding of the graph's.

mod common;

use common::grads::max_relative;
use common::graph::{
    advantages, assert_same_metrics, assert_same_update, build, critic_inputs, critic_pair,
    families, graph_of, log_probs_of, ppo_inputs, ppo_pair, rollouts_of, values_of,
};
use flowrl_engine::DeviceSpec;
use flowrl_models::layer_input_slice;
use flowrl_models::lora::{AdapterInit, DropoutScope, LoraConfig};
use flowrl_models::weights::Precision;
use flowrl_nodes::resources::model::ModelResource;
use flowrl_nodes::runtime::backend::CpuBackend;
use flowrl_nodes::train::checkpoint::TrunkBackward;
use flowrl_nodes::train::sequences::SequenceBatch;

type Ad = CpuBackend;

/// Serialises this file's tests (burn 0.21's autodiff, tracel-ai/burn#5573: see
/// `chunked_backward.rs`).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn segments_in_order_are_the_decoder_for_every_family() {
    let _s = serial();
    for (model_type, model) in families() {
        let rollouts = rollouts_of(&model);
        let resource = ModelResource::load(
            "m",
            &common::root().join(&model),
            false,
            None,
            DeviceSpec::Cpu(0),
            Some(Precision::F32),
        )
        .unwrap();
        let state = resource.lock::<Ad>().unwrap();
        let m = burn::module::AutodiffModule::valid(&state.model);
        let lm = m.causal_lm();
        let rows: Vec<usize> = (0..rollouts.len()).collect();
        let seq = SequenceBatch::new(&rollouts, &rows).unwrap();
        let device = Default::default();
        let embeds = m
            .input_embeddings(&seq.tokens, &seq.images, &device)
            .unwrap();
        let positions = m
            .position_ids(&seq.tokens, &seq.images)
            .unwrap()
            .tensor(&device);
        let (ids, mask) = (
            seq.tokens.ids_tensor(&device),
            seq.tokens.mask_tensor(&device),
        );
        let whole = lm.forward_hidden(
            ids.clone(),
            embeds.clone(),
            positions.clone(),
            mask.clone(),
            None,
        );
        let inputs = lm.decoder_inputs(ids, embeds);
        let segments = lm.decoder_segments();
        eprintln!("{model_type}: segments {segments:?}");
        assert_eq!(segments.first().map(|r| r.start), Some(0), "{model_type}");
        assert!(
            segments.windows(2).all(|w| w[0].end == w[1].start),
            "{model_type}: {segments:?}"
        );
        let mut h = inputs.stream;
        for layers in segments {
            let wanted = lm.layer_input_channels(layers.clone());
            let (_, u) = layer_input_slice(inputs.layer_inputs.as_ref(), wanted);
            h = lm.decoder_segment(layers, h, u, positions.clone(), mask.clone());
        }
        let h = lm.final_norm(h);
        let d = common::max_abs_diff(
            &whole.into_data().to_vec::<f32>().unwrap(),
            &h.into_data().to_vec::<f32>().unwrap(),
        );
        assert_eq!(
            d, 0.0,
            "{model_type}: segments differ from the decoder by {d}"
        );
    }
}

#[test]
fn update_ppo_takes_the_same_step_checkpointed_for_every_family() {
    let _s = serial();
    for (model_type, model) in families() {
        let rollouts = rollouts_of(&model);
        let adv = advantages(&rollouts);
        for (mode, padding_free) in [("token-mean", false), ("seq-mean-token-mean", true)] {
            let layout = format!("micro_batch_size = 6\npadding_free = {padding_free}");
            let nodes = ppo_pair(
                mode,
                ("graph", &layout),
                (
                    "recomputed",
                    &format!("{layout}\ngradient_checkpointing = true"),
                ),
            );
            let mut b = build(&graph_of(&model, &nodes, false), false);
            let before = b.weights("a");
            assert_eq!(before, b.weights("b"));
            let (old, _) = log_probs_of(&mut b, "old", &rollouts);
            let graph = b.run("graph", ppo_inputs("graph", &rollouts, &adv, &old));
            let recomputed = b.run(
                "recomputed",
                ppo_inputs("recomputed", &rollouts, &adv, &old),
            );
            let what = format!("{model_type} {mode} padding_free={padding_free}");
            assert_same_metrics(&graph.metrics, &recomputed.metrics, &what);
            assert_same_update(&before, &b.weights("a"), &b.weights("b"), &what);
        }
    }
}

#[test]
fn update_critic_takes_the_same_step_checkpointed() {
    let _s = serial();
    let model = common::graph::TINY_POLICY;
    let rollouts = rollouts_of(model);
    let adv = advantages(&rollouts);
    let nodes = critic_pair(
        "",
        ("graph", "micro_batch_size = 6"),
        (
            "recomputed",
            "micro_batch_size = 6\ngradient_checkpointing = true",
        ),
    );
    let mut b = build(&graph_of(model, &nodes, true), true);
    let before = b.weights("a");
    let values = values_of(&mut b, "values", &rollouts);
    let graph = b.run("graph", critic_inputs("graph", &rollouts, &values, &adv));
    let recomputed = b.run(
        "recomputed",
        critic_inputs("recomputed", &rollouts, &values, &adv),
    );
    assert_same_metrics(&graph.metrics, &recomputed.metrics, "critic");
    assert_same_update(&before, &b.weights("a"), &b.weights("b"), "critic");
}

#[test]
fn lora_dropout_masks_are_replayed_and_mixed_precision_gets_every_gradient() {
    let _s = serial();
    let model = common::graph::TINY_POLICY;
    let rollouts = rollouts_of(model);
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.3,
        target_modules: vec!["all-linear".into()],
    };
    let resource = ModelResource::load_with_lora(
        "policy",
        &common::root().join(model),
        true,
        None,
        DeviceSpec::Cpu(0),
        Some(Precision::F32),
        Some((lora, AdapterInit::Fresh(3))),
    )
    .unwrap();
    let state = resource.lock::<Ad>().unwrap();
    let model = &state.model;
    let rows: Vec<usize> = (0..rollouts.len()).collect();
    let seq = SequenceBatch::new(&rollouts, &rows).unwrap();
    let device = Default::default();
    let mask = seq.mask_tensor::<Ad>(&device);
    for (precision, tolerance) in [(Precision::F32, 1e-5), (Precision::BF16, 2e-2)] {
        let grads = |checkpointing: bool| {
            let _scope = DropoutScope::enter(17);
            let mask = mask.clone();
            let out = seq
                .loss_gradients(
                    model,
                    precision,
                    checkpointing,
                    1.0,
                    4,
                    &device,
                    |lp, ent| Ok(((lp - ent * 0.01) * mask.clone()).sum()),
                )
                .unwrap();
            out.grads.expect("a finite loss")
        };
        let (graph, recomputed) = (grads(false), grads(true));
        let what = format!("LoRA with dropout, {precision:?}");
        let d = max_relative(model, &recomputed, &graph, &what);
        eprintln!("{what}: max relative difference {d:.2e}");
        assert!(d <= tolerance, "{what}: gradients differ by {d:.2e}");
    }
    // The checkpointed forward keeps what the recompute needs, not the graph.
    let view = model.compute_view(Precision::F32);
    let (_, _, trunk) = seq
        .response_hidden_for_backward(model, &view, true, &device)
        .unwrap();
    assert!(matches!(trunk, TrunkBackward::Recompute(_)));
}
