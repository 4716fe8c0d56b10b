//! Throughput benchmark of a randomly initialised Qwen2-VL-shaped model on the CPU (Flex):
//! prefill tokens/s, KV-cached decode tokens/s, forward+backward tokens/s and peak RSS.
//!
//! Default shape (issue 4): text hidden 512, 8 layers, vocab 32k, batch 8, 256-token prompts
//! each holding one 224×224 image (64 image tokens). Override with environment variables
//! `BENCH_BATCH`, `BENCH_PROMPT`, `BENCH_DECODE`, `BENCH_LAYERS`, `BENCH_HIDDEN`, `BENCH_VOCAB`.
//! Run: `cargo bench -p flowrl-models --bench qwen_vl`.
//!
//! Decode steps feed one token each against the KV cache; the prompt is never recomputed.

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use flowrl_models::capabilities::mask_tensor;
use flowrl_models::{KvCache, Model, PaddedBatch, PositionIds, ProcessedImage};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Peak resident set size of this process (`VmHWM`), in MiB.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn config_json(hidden: usize, layers: usize, vocab: usize) -> String {
    let heads = hidden / 64;
    serde_json::json!({
        "model_type": "qwen2_vl",
        "image_token_id": vocab - 4,
        "video_token_id": vocab - 3,
        "vision_start_token_id": vocab - 6,
        "vision_end_token_id": vocab - 5,
        "tie_word_embeddings": false,
        "text_config": {
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": hidden * 11 / 4,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": (heads / 2).max(1),
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096,
            "eos_token_id": vocab - 8,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                "mrope_section": [8, 12, 12]},
        },
        "vision_config": {
            "depth": 4, "embed_dim": 256, "hidden_size": hidden, "mlp_ratio": 4,
            "num_heads": 4, "in_channels": 3, "patch_size": 14, "temporal_patch_size": 2,
            "spatial_merge_size": 2, "hidden_act": "quick_gelu",
        },
    })
    .to_string()
}

/// A 224×224 image as the processor would give it: 16×16 patches, 64 image tokens.
fn image(seed: usize) -> ProcessedImage {
    let (gh, gw) = (16, 16);
    let dim = 3 * 2 * 14 * 14;
    let n = gh * gw;
    let pixel_values = (0..n * dim)
        .map(|i| (((i * 7919 + seed * 104729) % 1000) as f32 / 500.0) - 1.0)
        .collect();
    ProcessedImage {
        pixel_values,
        shape: vec![n, dim],
        grid: vec![1, gh, gw],
        num_tokens: n / 4,
        patch_positions: None,
        video: None,
    }
}

/// Prompts of exactly `len` tokens: text, `<vision_start>`, the image tokens, `<vision_end>`, text.
fn prompts(batch: usize, len: usize, vocab: usize, image_tokens: usize) -> PaddedBatch {
    let rows: Vec<Vec<u32>> = (0..batch)
        .map(|b| {
            let mut row: Vec<u32> = (0..8).map(|i| ((b * 31 + i * 17) % 1000) as u32).collect();
            row.push((vocab - 6) as u32);
            row.extend(std::iter::repeat_n((vocab - 4) as u32, image_tokens));
            row.push((vocab - 5) as u32);
            let mut i = 0;
            while row.len() < len {
                row.push(((b * 131 + i * 71) % 20000) as u32);
                i += 1;
            }
            row
        })
        .collect();
    PaddedBatch::left_pad(&rows, 0)
}

/// Final-normed hidden states of the prompt batch with its images (embeddings, then the
/// decoder at `positions`), filling `cache` when given.
fn prompt_hidden<B: Backend>(
    model: &Model<B>,
    batch_ids: &PaddedBatch,
    images: &[ProcessedImage],
    positions: &PositionIds,
    device: &B::Device,
    cache: Option<&mut KvCache<B>>,
) -> Tensor<B, 3> {
    let embeds = model
        .input_embeddings(batch_ids, images, device)
        .expect("embeddings");
    model.causal_lm().forward_hidden(
        batch_ids.ids_tensor(device),
        embeds,
        positions.tensor(device),
        batch_ids.mask_tensor(device),
        cache,
    )
}

/// A result row: the stage, tokens/s over `secs`, `secs` and the peak RSS so far.
fn row(stage: String, tokens: usize, secs: f64) -> (String, f64, f64, f64) {
    (stage, tokens as f64 / secs, secs, peak_rss_mib())
}

fn main() {
    let batch = env("BENCH_BATCH", 8);
    let prompt = env("BENCH_PROMPT", 256);
    let decode = env("BENCH_DECODE", 32);
    let layers = env("BENCH_LAYERS", 8);
    let hidden = env("BENCH_HIDDEN", 512);
    let vocab = env("BENCH_VOCAB", 32000);
    let config = config_json(hidden, layers, vocab);
    let device = Default::default();
    let images: Vec<ProcessedImage> = (0..batch).map(image).collect();
    let batch_ids = prompts(batch, prompt, vocab, images[0].num_tokens);

    println!(
        "Qwen2-VL-shaped random model on Flex (CPU): hidden {hidden}, {layers} layers, vocab {vocab}, \
         batch {batch}, {prompt}-token prompts with one 224x224 image, {decode} decode steps"
    );
    let mut rows: Vec<(String, f64, f64, f64)> = Vec::new();

    // Prefill + decode (no autodiff backend: nothing tracks gradients).
    {
        let model = Model::<Flex>::random(&config, &device, 0).expect("random model");
        let lm = model.causal_lm();
        let pos = model.position_ids(&batch_ids, &images).expect("positions");
        let t0 = Instant::now();
        let mut cache = lm.new_cache();
        let h = prompt_hidden(&model, &batch_ids, &images, &pos, &device, Some(&mut cache));
        let logits = lm.lm_head(h.narrow(1, prompt - 1, 1));
        let mut next: Vec<i64> = logits
            .argmax(2)
            .into_data()
            .convert::<i64>()
            .into_vec()
            .expect("ids");
        let prefill = t0.elapsed().as_secs_f64();
        rows.push(row(
            "prefill (vision + text, KV cache filled)".into(),
            batch * prompt,
            prefill,
        ));

        let real = batch_ids.real_lengths();
        let mut mask = batch_ids.attention_mask.clone();
        let t1 = Instant::now();
        for s in 0..decode {
            let total = prompt + s;
            let mut m = Vec::with_capacity(batch * (total + 1));
            for r in 0..batch {
                m.extend_from_slice(&mask[r * total..(r + 1) * total]);
                m.push(1);
            }
            mask = m;
            let lengths: Vec<usize> = real.iter().map(|&n| n + s).collect();
            let p = pos.decode_step(&lengths);
            let ids =
                Tensor::<Flex, 1, Int>::from_data(TensorData::new(next.clone(), [batch]), &device)
                    .reshape([batch, 1]);
            let h = lm.forward_hidden(
                ids.clone(),
                lm.embed_tokens(ids),
                p.tensor(&device),
                mask_tensor(&mask, batch, total + 1, &device),
                Some(&mut cache),
            );
            next = lm
                .lm_head(h)
                .argmax(2)
                .into_data()
                .convert::<i64>()
                .into_vec()
                .expect("ids");
        }
        let dec = t1.elapsed().as_secs_f64();
        rows.push(row(
            format!("decode ({decode} one-token steps, KV cache)"),
            batch * decode,
            dec,
        ));
    }

    // Forward + backward of the mean token log-prob (Autodiff<Flex>).
    {
        type AD = Autodiff<Flex>;
        let model = Model::<AD>::random(&config, &device, 0).expect("random model");
        let lm = model.causal_lm();
        let pos = model.position_ids(&batch_ids, &images).expect("positions");
        let t0 = Instant::now();
        let h = prompt_hidden(&model, &batch_ids, &images, &pos, &device, None);
        let ids = batch_ids.ids_tensor::<AD>(&device);
        let logits = lm.lm_head(h.narrow(1, 0, prompt - 1));
        let lp = log_softmax(logits, 2).gather(2, ids.narrow(1, 1, prompt - 1).unsqueeze_dim(2));
        let loss = lp.mean().neg();
        let _grads = loss.backward();
        let fb = t0.elapsed().as_secs_f64();
        rows.push(row(
            "forward + backward (all positions)".into(),
            batch * prompt,
            fb,
        ));
    }

    println!(
        "\n| {:<42} | {:>12} | {:>9} | {:>14} |",
        "stage", "tokens/s", "seconds", "peak RSS (MiB)"
    );
    println!("|{:-<44}|{:->14}|{:->11}|{:->16}|", "", "", "", "");
    for (name, tps, secs, rss) in rows {
        println!("| {name:<42} | {tps:>12.1} | {secs:>9.3} | {rss:>14.0} |");
    }
}
