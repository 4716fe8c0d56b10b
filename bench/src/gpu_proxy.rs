//! `bench-gpu-proxy [OUT_DIR]`: the GPU path's efficiency counted without a GPU, on a Vulkan
//! device (Mesa's software driver lavapipe runs the kernels CUDA compiles, minus tensor cores
//! and bf16, with buffers capped at 128 MiB). Writes `OUT_DIR/gpu_proxy.md` and
//! `OUT_DIR/gpu_proxy.json` (default `bench/results`); `bench/gpu/proxy.sh` builds and runs it.
//!
//! Everything is counted twice in one process: with flowrl's kernels (`now`) and with
//! [`flowrl_models::kernels::set_enabled`]`(false)` (`before`: every layer's composite chain, the
//! host sampler reading the whole logits, materialised attention scores: the GPU path as it was
//! before the kernels). Counts, not times (lavapipe's timings say nothing about a GPU):
//!
//! - **kernel launches**: the lines of cubecl's profiling log at level `minimal` (one per
//!   launch, written to a file set here);
//! - **host reads**: device-to-host reads and their bytes (the vendored burn-cubecl counts them:
//!   `burn_cubecl::host_reads`);
//! - **device memory**: cubecl's memory usage (bytes in use and reserved by its pools, after a
//!   cleanup before each measured pass).
//!
//! Workloads, on the benchmark's random Qwen2-VL-architecture model (`bench/model_config.json`:
//! hidden 512, 8 layers, 8 heads over 4 kv heads, vocabulary 32k):
//! - **decode steps**: `generate` over 8 rows (2 prompts × 4), EOS suppressed so no row ends;
//!   launches and reads per step = the difference between 10 and 2 new tokens over 8 steps;
//!   per layer = the difference between the 8-layer model and the same model cut to 4 layers,
//!   over 4 layers (so the per-step work outside the layers, the embedding, the final norm, the
//!   LM head and the sampler, is not spread over the layers);
//! - **log-prob micro-batch**: the trunk and the chunked LM head (`logprob`'s pass) over 8
//!   rows of 109 prompt tokens (one image each) + 32 response tokens;
//! - **update micro-batch**: the same rows through `update.ppo`'s two-stage backward
//!   (`chunked_loss_backward`) under autodiff, and one AdamW step;
//! - **score tensors**: the log-prob pass and one update step on one 4,096-token sequence of a
//!   16-head model (the long-context tests' shape): a materialised `[16, 4096, 4096]` f32 score
//!   tensor is 1 GiB, eight times what a lavapipe buffer can hold, so the pass either completes
//!   without one or fails.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_cubecl::cubecl::Runtime;
use burn_cubecl::cubecl::config::profiling::{ProfilingConfig, ProfilingLogLevel};
use burn_cubecl::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
use flowrl_models::generate::{GenerationConfig, ModelParts, PromptInput, generate};
use flowrl_models::sampling::SamplingConfig;
use flowrl_models::{Model, PaddedBatch};
use flowrl_nodes::runtime::backend::FlowBackend;
use flowrl_nodes::train::checkpoint::TrunkBackward;
use flowrl_nodes::train::chunked_backward::chunked_loss_backward;
use flowrl_nodes::train::grad_sum::GradSum;
use flowrl_nodes::train::optim::{AdamW, AdamWConfig};
use serde_json::json;

#[path = "workload.rs"]
mod workload;
use workload::{Batch, PROMPT, batch, ppo_loss, trunk_inputs};

/// burn's wgpu kernels without fusion, as the nodes' Vulkan backend runs them.
type Gpu = CubeBackend<WgpuRuntime, f32, i32, u8>;
/// The nodes' training backend on Vulkan.
type GpuAd = Autodiff<Gpu, BalancedCheckpointing>;

/// Response positions per LM-head block on a GPU, as the nodes use them.
const CHUNK: usize = <flowrl_nodes::runtime::backend::VulkanBackend as FlowBackend>::LM_HEAD_CHUNK;

fn main() -> Result<()> {
    let out_dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("results"));
    let log = std::env::temp_dir().join(format!("flowrl-gpu-proxy-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let mut config = CubeClRuntimeConfig {
        profiling: ProfilingConfig::default(),
        ..Default::default()
    };
    config.profiling.logger.file = Some(log.clone());
    config.profiling.logger.append = true;
    config.profiling.logger.level = ProfilingLogLevel::Minimal;
    config.autotune.level = burn_cubecl::cubecl::config::autotune::AutotuneLevel::Minimal;
    CubeClRuntimeConfig::set(config);
    let counter = Counter::new(log);

    let device = WgpuDevice::DefaultDevice;
    let model_config =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/model_config.json"))?;
    let json: serde_json::Value = serde_json::from_str(&model_config)?;
    let layers = json["text_config"]["num_hidden_layers"]
        .as_u64()
        .context("num_hidden_layers")? as usize;
    let special = [
        json["vision_start_token_id"]
            .as_u64()
            .context("vision_start_token_id")? as u32,
        json["image_token_id"].as_u64().context("image_token_id")? as u32,
        json["vision_end_token_id"]
            .as_u64()
            .context("vision_end_token_id")? as u32,
    ];
    let half_config = with_text(&json, |t| {
        t["num_hidden_layers"] = json!(layers / 2);
    });
    let mut long_config = with_text(&json, |t| {
        // 16 heads of width 8 over 4 kv heads, one layer, a 4,096-token context.
        t["hidden_size"] = json!(128);
        t["num_attention_heads"] = json!(16);
        t["num_key_value_heads"] = json!(4);
        t["intermediate_size"] = json!(256);
        t["num_hidden_layers"] = json!(1);
        t["vocab_size"] = json!(512);
        t["max_position_embeddings"] = json!(8192);
        t["rope_parameters"]["mrope_section"] = json!([2, 1, 1]);
    });
    long_config["vision_config"]["hidden_size"] = json!(128);

    let full = Model::<Gpu>::random(&model_config, &device, 0)?;
    let half = Model::<Gpu>::random(&half_config.to_string(), &device, 0)?;
    let long = Model::<GpuAd>::random(&long_config.to_string(), &device, 0)?;
    let x = batch(8, 4, 32, special);
    // `now` first, `before` second, its long passes last of all: a buffer over lavapipe's limit
    // panics the device's server thread, after which the device takes no more work.
    let mut report = Vec::new();
    for kernels in [true, false] {
        flowrl_models::kernels::set_enabled(kernels);
        let label = if kernels { "now" } else { "before" };
        eprintln!(
            "== {label}: flowrl kernels {}",
            if kernels { "on" } else { "off" }
        );
        let decode_full = decode_step(&full, x.image_token, &counter, &device)?;
        let decode_half = decode_step(&half, x.image_token, &counter, &device)?;
        let logprob = pass(&counter, &device, || logprob_pass(&full, &x, &device))?;
        let mut training = Model::<GpuAd>::random(&model_config, &device, 0)?;
        let update = pass(&counter, &device, || {
            update_pass(&mut training, &x, &device)
        })?;
        report.push(Measured {
            label,
            layers,
            decode_full,
            decode_half,
            logprob,
            update,
            long_logprob: Err(String::new()),
            long_update: Err(String::new()),
        });
    }
    for (kernels, measured) in [true, false].into_iter().zip(report.iter_mut()) {
        flowrl_models::kernels::set_enabled(kernels);
        eprintln!("== {}: 4,096-token passes", measured.label);
        measured.long_logprob =
            guarded(|| pass(&counter, &device, || long_logprob_pass(&long, &device)));
        let mut long_training = long.clone();
        measured.long_update = guarded(|| {
            pass(&counter, &device, || {
                long_update_pass(&mut long_training, &device)
            })
        });
    }
    std::fs::create_dir_all(&out_dir)?;
    let (now, before) = (&report[0], &report[1]);
    std::fs::write(out_dir.join("gpu_proxy.md"), markdown(before, now))?;
    let json = json!({
        "device": "vulkan (Mesa lavapipe when no GPU)",
        "model": "bench/model_config.json (Qwen2-VL architecture, hidden 512, 8 layers)",
        "launches_per_layer_per_decode_step": now.per_layer(),
        "launches_per_decode_step": now.decode_full.launches,
        "host_bytes_per_row_per_decode_step": now.decode_full.bytes_per_row(),
        "host_reads_per_decode_step": now.decode_full.reads,
        "score_tensor_materialised": now.materialised(),
        "logprob_micro_batch": now.logprob.json(),
        "update_micro_batch": now.update.json(),
        "before": {
            "launches_per_layer_per_decode_step": before.per_layer(),
            "launches_per_decode_step": before.decode_full.launches,
            "host_bytes_per_row_per_decode_step": before.decode_full.bytes_per_row(),
            "host_reads_per_decode_step": before.decode_full.reads,
            "score_tensor_materialised": before.materialised(),
            "logprob_micro_batch": before.logprob.json(),
            "update_micro_batch": before.update.json(),
        },
    });
    std::fs::write(
        out_dir.join("gpu_proxy.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    println!("{}", markdown(before, now));
    Ok(())
}

/// `work`'s result, its error or its panic as text.
fn guarded(work: impl FnOnce() -> Result<Counts>) -> std::result::Result<Counts, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into())),
    }
}

/// The model config with its `text_config` changed by `edit`.
fn with_text(
    json: &serde_json::Value,
    edit: impl FnOnce(&mut serde_json::Value),
) -> serde_json::Value {
    let mut out = json.clone();
    edit(&mut out["text_config"]);
    out
}

/// Launches counted from cubecl's profiling log file.
struct Counter {
    log: PathBuf,
}

impl Counter {
    fn new(log: PathBuf) -> Self {
        Self { log }
    }

    /// Launches logged so far, once the logger thread has written them (the count stops
    /// changing).
    fn launches(&self) -> u64 {
        let count = || {
            std::fs::read_to_string(&self.log)
                .map(|s| s.lines().filter(|l| l.starts_with("Executing")).count() as u64)
                .unwrap_or(0)
        };
        let mut last = count();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let now = count();
            if now == last {
                return now;
            }
            last = now;
        }
    }
}

/// Launches, host reads and bytes, device memory of one piece of work.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    launches: f64,
    reads: f64,
    bytes: f64,
    /// Rows, for bytes per row.
    rows: f64,
    bytes_in_use: u64,
    bytes_reserved: u64,
    allocations: u64,
}

impl Counts {
    fn bytes_per_row(&self) -> f64 {
        self.bytes / self.rows.max(1.0)
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "launches": self.launches,
            "host_reads": self.reads,
            "host_bytes": self.bytes,
            "device_bytes_in_use_after": self.bytes_in_use,
            "device_bytes_reserved": self.bytes_reserved,
            "live_allocations_after": self.allocations,
        })
    }
}

fn sync(device: &WgpuDevice) -> Result<()> {
    Gpu::sync(device).map_err(|e| anyhow::anyhow!("syncing the device: {e:?}"))
}

fn memory(device: &WgpuDevice) -> burn_cubecl::cubecl::MemoryUsage {
    WgpuRuntime::client(device)
        .memory_usage()
        .expect("cubecl memory usage")
}

/// The counts of `work`: everything synced before and after, the pools cleaned before.
fn pass<T>(
    counter: &Counter,
    device: &WgpuDevice,
    work: impl FnOnce() -> Result<T>,
) -> Result<Counts> {
    sync(device)?;
    WgpuRuntime::client(device).memory_cleanup();
    let (l0, (r0, b0)) = (counter.launches(), burn_cubecl::host_reads::count());
    work()?;
    sync(device)?;
    let (l1, (r1, b1)) = (counter.launches(), burn_cubecl::host_reads::count());
    let m = memory(device);
    Ok(Counts {
        launches: (l1 - l0) as f64,
        reads: (r1 - r0) as f64,
        bytes: (b1 - b0) as f64,
        rows: 1.0,
        bytes_in_use: m.bytes_in_use,
        bytes_reserved: m.bytes_reserved,
        allocations: m.number_allocs,
    })
}

/// Per decoding step of 8 rows: the counts of 10 new tokens minus those of 2, over 8. EOS and,
/// as the rollout node does, the image token are suppressed.
fn decode_step(
    model: &Model<Gpu>,
    image_token: u32,
    counter: &Counter,
    device: &WgpuDevice,
) -> Result<Counts> {
    let prompts: [&[u32]; 2] = [&[11, 12, 13, 14, 15, 16, 17, 18], &[21, 22, 23, 24, 25]];
    let inputs: Vec<PromptInput<'_>> = (0..8)
        .map(|r| PromptInput {
            ids: prompts[r / 4],
            images: &[],
        })
        .collect();
    let seeds: Vec<u64> = (0..8).collect();
    let parts = ModelParts::of(model);
    let run = |new: usize| -> Result<()> {
        let mut suppress = parts.lm.eos_token_ids();
        suppress.push(image_token);
        let config = GenerationConfig {
            suppress_token_ids: suppress,
            ..GenerationConfig::new(new, SamplingConfig::default())
        };
        generate(&parts, &inputs, &config, &seeds, device)?;
        Ok(())
    };
    run(10)?; // warm-up: kernels compiled, autotune settled
    let short = pass(counter, device, || run(2))?;
    let long = pass(counter, device, || run(10))?;
    let steps = 8.0;
    Ok(Counts {
        launches: (long.launches - short.launches) / steps,
        reads: (long.reads - short.reads) / steps,
        bytes: (long.bytes - short.bytes) / steps,
        rows: inputs.len() as f64,
        bytes_in_use: long.bytes_in_use,
        bytes_reserved: long.bytes_reserved,
        allocations: long.allocations,
    })
}

/// `logprob`'s pass over the batch: the trunk, the chunked LM head, the results read.
fn logprob_pass(model: &Model<Gpu>, x: &Batch, device: &WgpuDevice) -> Result<()> {
    let (lp, entropy) = log_probs(model, x, device)?;
    let _ = lp.into_data();
    let _ = entropy.into_data();
    Ok(())
}

fn log_probs<B: Backend>(
    model: &Model<B>,
    x: &Batch,
    device: &B::Device,
) -> Result<(Tensor<B, 2>, Tensor<B, 2>)> {
    let (ids, embeds, positions, mask) = trunk_inputs(model, x, device)?;
    let lm = model.causal_lm();
    let hidden = lm.forward_hidden(ids, embeds, positions, mask, None);
    let response = hidden.narrow(1, PROMPT - 1, x.new);
    let (entropy, lp) = flowrl_algorithms::entropy_and_logprobs_from_hidden(
        response,
        x.labels(device),
        |h| lm.lm_head(h),
        1.0,
        CHUNK,
    )?;
    Ok((lp, entropy))
}

/// One micro-batch of `update.ppo`: trunk, two-stage backward, one AdamW step.
fn update_pass(model: &mut Model<GpuAd>, x: &Batch, device: &WgpuDevice) -> Result<()> {
    let (ids, embeds, positions, mask) = trunk_inputs(model, x, device)?;
    let hidden = model
        .causal_lm()
        .forward_hidden(ids, embeds, positions, mask, None);
    let response = hidden.narrow(1, PROMPT - 1, x.new);
    let mut sum = GradSum::on_device();
    let out = chunked_loss_backward(
        model,
        model,
        (response, TrunkBackward::Graph),
        x.labels(device),
        1.0,
        CHUNK,
        |lp, _| ppo_loss(Tensor::from_inner(lp.clone().inner()), lp, device),
        &mut sum,
    )?;
    anyhow::ensure!(out.loss.is_finite(), "non-finite loss");
    let grads: GradientsParams = sum.into_device();
    let mut opt = AdamW::<GpuAd>::new(AdamWConfig::default());
    *model = opt.step(1e-6, model.clone(), grads);
    Ok(())
}

/// One 4,096-token row: 2,048 prompt tokens and 2,048 response tokens of a text-only model.
fn long_row() -> (PaddedBatch, Vec<i64>) {
    let len = 4096;
    // Text ids only: the config's special ids (vision, image, video tokens) start at 400.
    let ids: Vec<u32> = (0..len).map(|i| (7 + (i * 13) % 390) as u32).collect();
    let labels = ids[len / 2..].iter().map(|&t| t as i64).collect();
    (PaddedBatch::left_pad(&[ids], 0), labels)
}

fn long_log_probs<B: Backend>(model: &Model<B>, device: &B::Device) -> Result<Tensor<B, 2>> {
    let (tokens, labels) = long_row();
    let lm = model.causal_lm();
    let ids = tokens.ids_tensor::<B>(device);
    let positions = model.position_ids(&tokens, &[])?.tensor::<B>(device);
    let hidden = lm.forward_hidden(
        ids.clone(),
        lm.embed_tokens(ids),
        positions,
        tokens.mask_tensor::<B>(device),
        None,
    );
    let half = tokens.len / 2;
    let response = hidden.narrow(1, half - 1, half);
    let labels =
        Tensor::<B, 1, Int>::from_data(TensorData::new(labels, [half]), device).reshape([1, half]);
    let (_, lp) = flowrl_algorithms::entropy_and_logprobs_from_hidden(
        response,
        labels,
        |h| lm.lm_head(h),
        1.0,
        CHUNK,
    )?;
    Ok(lp)
}

fn long_logprob_pass(model: &Model<GpuAd>, device: &WgpuDevice) -> Result<()> {
    let lp = long_log_probs(&model.valid(), device)?;
    let _ = lp.into_data();
    Ok(())
}

fn long_update_pass(model: &mut Model<GpuAd>, device: &WgpuDevice) -> Result<()> {
    let lp = long_log_probs(model, device)?;
    let loss = lp.mean().neg();
    let grads = GradientsParams::from_grads::<GpuAd, _>(loss.backward(), model);
    let mut opt = AdamW::<GpuAd>::new(AdamWConfig::default());
    *model = opt.step(1e-6, model.clone(), grads);
    Ok(())
}

/// One column of the report.
struct Measured {
    label: &'static str,
    layers: usize,
    decode_full: Counts,
    decode_half: Counts,
    logprob: Counts,
    update: Counts,
    long_logprob: std::result::Result<Counts, String>,
    long_update: std::result::Result<Counts, String>,
}

impl Measured {
    /// Launches per decoder layer per step: the 8-layer model's minus the 4-layer one's.
    fn per_layer(&self) -> f64 {
        let cut = (self.layers - self.layers / 2) as f64;
        (self.decode_full.launches - self.decode_half.launches) / cut
    }

    /// Per pass, whether a score tensor was materialised (the long pass failed).
    fn materialised(&self) -> serde_json::Value {
        json!({
            "logprob": self.long_logprob.is_err(),
            "update": self.long_update.is_err(),
        })
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 20) as f64)
}

fn markdown(before: &Measured, now: &Measured) -> String {
    let mut s = String::new();
    s.push_str("# GPU proxy: the GPU path counted on Vulkan\n\n");
    s.push_str(
        "Written by `bash bench/gpu/proxy.sh` (`bench-gpu-proxy`, bench/src/gpu_proxy.rs): \
         counts on the software Vulkan device (Mesa's lavapipe), the same cubecl kernels CUDA \
         compiles. `before` = the same binary with flowrl's kernels off \
         (`FLOWRL_KERNELS=off`: composite layers, host sampling, materialised scores); `now` = \
         with them. Model: `bench/model_config.json` (Qwen2-VL architecture, hidden 512, 8 \
         layers, 8 heads over 4 kv heads, vocabulary 32,000), f32. Not behind the switch, so \
         alike in both columns: the LM-head loop reads nothing per chunk (before this work it \
         read the row maxima and checked the labels on the host once per chunk of 16 \
         positions: 4 more reads per micro-batch here, by the code) and its chunk is 128 \
         positions on a GPU.\n\n",
    );
    s.push_str("| | before | now |\n|---|---:|---:|\n");
    let row = |s: &mut String, name: &str, a: String, b: String| {
        s.push_str(&format!("| {name} | {a} | {b} |\n"));
    };
    row(
        &mut s,
        "**launches per decoder layer per decode step**",
        format!("{:.1}", before.per_layer()),
        format!("{:.1}", now.per_layer()),
    );
    row(
        &mut s,
        "launches per decode step (8 layers, 8 rows)",
        format!("{:.1}", before.decode_full.launches),
        format!("{:.1}", now.decode_full.launches),
    );
    row(
        &mut s,
        "**host bytes read per row per decode step**",
        format!("{:.0}", before.decode_full.bytes_per_row()),
        format!("{:.0}", now.decode_full.bytes_per_row()),
    );
    row(
        &mut s,
        "host reads per decode step",
        format!("{:.1}", before.decode_full.reads),
        format!("{:.1}", now.decode_full.reads),
    );
    row(
        &mut s,
        "device MiB in use after 10 decode steps",
        mib(before.decode_full.bytes_in_use),
        mib(now.decode_full.bytes_in_use),
    );
    row(
        &mut s,
        "live device allocations after 10 decode steps",
        before.decode_full.allocations.to_string(),
        now.decode_full.allocations.to_string(),
    );
    for (name, a, b) in [
        (
            "log-prob micro-batch (8 × 141 tokens)",
            before.logprob,
            now.logprob,
        ),
        (
            "update micro-batch (8 × 141 tokens)",
            before.update,
            now.update,
        ),
    ] {
        row(
            &mut s,
            &format!("{name}: launches"),
            format!("{:.0}", a.launches),
            format!("{:.0}", b.launches),
        );
        row(
            &mut s,
            &format!("{name}: host reads (syncs)"),
            format!("{:.0}", a.reads),
            format!("{:.0}", b.reads),
        );
        row(
            &mut s,
            &format!("{name}: device MiB reserved"),
            mib(a.bytes_reserved),
            mib(b.bytes_reserved),
        );
    }
    let outcome = |r: &std::result::Result<Counts, String>| match r {
        Ok(c) => format!("no (ran; {} MiB reserved)", mib(c.bytes_reserved)),
        Err(e) => {
            let first = e.lines().next().unwrap_or("");
            let cut: String = first.chars().take(80).collect();
            let more = if cut.len() < first.len() { "…" } else { "" };
            format!("yes (the pass failed: {cut}{more})")
        }
    };
    row(
        &mut s,
        "**`[L, T]` score tensor materialised: log-prob pass, 1 × 4,096 tokens, 16 heads**",
        outcome(&before.long_logprob),
        outcome(&now.long_logprob),
    );
    row(
        &mut s,
        "**`[L, T]` score tensor materialised: update step, 1 × 4,096 tokens, 16 heads**",
        outcome(&before.long_update),
        outcome(&now.long_update),
    );
    s.push_str(&format!(
        "\nPer decode step: the counts of `generate` with 10 new tokens minus those with 2, over \
         8 steps (8 rows, EOS suppressed); per layer: the {}-layer model's minus the {}-layer \
         model's, over {} layers. Reads: device-to-host reads counted by the vendored \
         burn-cubecl. Memory: cubecl's pools after a cleanup before each pass. A materialised \
         `[16, 4096, 4096]` f32 score tensor is 1 GiB; lavapipe's buffers hold 128 MiB.\n",
        now.layers,
        now.layers / 2,
        now.layers - now.layers / 2
    ));
    s
}
