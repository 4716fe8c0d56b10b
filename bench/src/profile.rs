//! `bench-profile MODE`: one phase of flowrl's GRPO step on the benchmark's model shape, small
//! enough to run under `valgrind --tool=callgrind` (instruction counts do not depend on the load
//! of a shared machine, wall time does).
//!
//! The model is the random Qwen2-VL architecture of `bench/model_config.json` (hidden 512, 8
//! layers, vocab 32000, vision tower of 4 blocks). A batch is `BENCH_BATCH` sequences (default
//! 8, the reduced comparison's micro-batch) laid out as the update node lays them out: a prompt
//! of 8 text tokens, `<vision_start>`, the 64 tokens of one 224×224 image, `<vision_end>` and
//! text up to 109 tokens, then `BENCH_NEW` response tokens (default 32). Rows come in groups of
//! `BENCH_N` (default 4, the reduced comparison's n) answering one prompt, so they share its
//! image, as in a GRPO batch; embeddings go through `Model::input_embeddings_shared`.
//!
//! `BENCH_MEM=1` prints the live heap and its peak at the phases' boundaries (the global
//! allocator counts its bytes).
//!
//! Modes (each runs a warm-up repetition, then `BENCH_REPS` measured ones, default 3; 0 = one
//! run without warm-up, for callgrind; each prints
//! wall seconds per phase; the measured work sits in `#[inline(never)]` functions named
//! `measured_*`, so `callgrind --toggle-collect='*measured_*'` counts only that):
//!
//! * `update`: one micro-batch of `update.ppo` on the nodes' `CpuBackend`: forward, response
//!   log-probs and entropies through the chunked LM head (`entropy_and_logprobs_from_hidden`,
//!   chunk 16), the PPO-clip token-mean loss against detached log-probs (on-policy), backward,
//!   and one step of flowrl's AdamW (the nodes' fused one, torch's defaults; global-norm clipping
//!   is left to the node). The backward is the nodes' two-stage one
//!   (`sequences::chunked_loss_backward`: one chunk of logits alive at a time);
//!   `BENCH_UPDATE=single` runs the single graph the nodes used before
//!   (every chunk's logits kept for the backward), for comparison; `BENCH_CHECKPOINTING=1`
//!   the nodes' `gradient_checkpointing` (the decoder recomputed layer by layer in the backward);
//! * `logprob`: the `logprob` node's pass on `Flex` (no autodiff): forward + log-probs;
//! * `head`: only the LM head + log-softmax/entropy over the response positions, forward and
//!   backward, from random hidden states (isolates the 32k-vocabulary part of `update`);
//! * `adamw`: one step of flowrl's AdamW with gradients of ones on every parameter (isolates
//!   the optimizer);
//! * `rollout`: the `rollout` node's generation on `Flex`: `BENCH_BATCH / BENCH_N` prompts (the
//!   prompt part of the rows above), each answered `BENCH_N` times, `BENCH_NEW` new tokens sampled
//!   at temperature 1 (rows stop early only on the model's EOS).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::backend::Flex;
use burn::backend::flex::FlexDevice;
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use flowrl_algorithms::entropy_and_logprobs_from_hidden;
use flowrl_models::Model;
use flowrl_models::generate::{GenerationConfig, ModelParts, PromptInput, generate};
use flowrl_models::sampling::SamplingConfig;
use flowrl_nodes::train::checkpoint::{TrunkBackward, checkpointed_trunk};
use flowrl_nodes::train::chunked_backward::chunked_loss_backward;
use flowrl_nodes::train::grad_sum::GradSum;
use flowrl_nodes::train::optim::{AdamW, AdamWConfig};

#[path = "workload.rs"]
mod workload;
use workload::{Batch, PROMPT, batch, ppo_loss, trunk_inputs};

/// The training backend of the nodes (`Autodiff<Flex, BalancedCheckpointing>`).
type Ad = flowrl_nodes::runtime::backend::CpuBackend;

/// The flowrl binary's allocator (`flowrl_nodes::runtime::allocator`), so phases cost what they
/// cost there. It counts the bytes it holds live and their high-water mark, for `BENCH_MEM=1`.
#[global_allocator]
static ALLOCATOR: Counting = Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(unsafe { mimalloc::MiMalloc.alloc(layout) }, layout.size())
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted(
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) },
            layout.size(),
        )
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
        }
        counted(p, new_size)
    }
}

/// Counts `size` more live bytes when the allocation `p` succeeded; returns `p`.
fn counted(p: *mut u8, size: usize) -> *mut u8 {
    if !p.is_null() {
        let live = LIVE.fetch_add(size, Relaxed) + size;
        PEAK.fetch_max(live, Relaxed);
    }
    p
}

/// With `BENCH_MEM=1`: live heap now and its peak since the last call, in MB, on stderr.
fn mem(what: &str) {
    if std::env::var_os("BENCH_MEM").is_some() {
        let live = LIVE.load(Relaxed);
        let peak = PEAK.swap(live, Relaxed);
        eprintln!(
            "mem {what}: live {:.0} MB, peak since last {:.0} MB",
            live as f64 / 1e6,
            peak as f64 / 1e6
        );
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Response positions per LM-head block (`update.ppo`'s and `logprob`'s default `chunk`).
fn chunk() -> usize {
    env("BENCH_CHUNK", 16)
}

/// The trunk forward: the final hidden states `[b, T, H]` that predict the response tokens and
/// the labels `[b, T]` (what `nodes::sequences::SequenceBatch::response_hidden` computes).
fn trunk<B: Backend>(
    model: &Model<B>,
    x: &Batch,
    device: &B::Device,
) -> Result<(Tensor<B, 3>, Tensor<B, 2, Int>)> {
    let (ids, embeds, positions, mask) = trunk_inputs(model, x, device)?;
    mem("  input embeddings (vision tower)");
    let hidden = model
        .causal_lm()
        .forward_hidden(ids, embeds, positions, mask, None);
    mem("  decoder layers");
    Ok((hidden.narrow(1, PROMPT - 1, x.new), x.labels(device)))
}

/// [`trunk`] with gradient checkpointing (`BENCH_CHECKPOINTING=1`, the update nodes'
/// `gradient_checkpointing`): the decoder without its graph, and the backward that recomputes it.
#[allow(clippy::type_complexity)]
fn checkpointed(
    model: &Model<Ad>,
    x: &Batch,
    device: &burn::tensor::Device<Ad>,
) -> Result<(Tensor<Ad, 3>, Tensor<Ad, 2, Int>, TrunkBackward<Ad>)> {
    let (ids, embeds, positions, mask) = trunk_inputs(model, x, device)?;
    mem("  input embeddings (vision tower)");
    let (hidden, backward) = checkpointed_trunk(model, model, ids, embeds, positions, mask);
    mem("  decoder layers (checkpointed)");
    Ok((
        hidden.narrow(1, PROMPT - 1, x.new),
        x.labels(device),
        backward,
    ))
}

/// Response log-probs and entropies `[b, T]` (what `nodes::sequences::SequenceBatch::log_probs`
/// computes).
fn log_probs<B: Backend>(
    model: &Model<B>,
    x: &Batch,
    device: &B::Device,
) -> Result<(Tensor<B, 2>, Tensor<B, 2>)> {
    let (response, labels) = trunk(model, x, device)?;
    let lm = model.causal_lm();
    let (entropy, lp) =
        entropy_and_logprobs_from_hidden(response, labels, |h| lm.lm_head(h), 1.0, chunk())?;
    Ok((lp, entropy))
}

/// `BENCH_UPDATE=single`: the update's backward through one graph (every LM-head chunk's logits
/// kept for it: what the update nodes did before the two-stage backward); otherwise (default,
/// `two-stage`) the nodes' `chunked_loss_backward`.
fn single_graph_update() -> bool {
    std::env::var("BENCH_UPDATE").is_ok_and(|v| v == "single")
}

/// Wall seconds of (forward, backward, optimizer step). Single graph: forward = trunk, LM head
/// and loss, backward = one backward. Two-stage: forward = the trunk, backward = the rest
/// (`chunked_loss_backward`: value pass, loss, per-chunk LM-head backwards, trunk backward).
#[inline(never)]
fn measured_update(model: &mut Model<Ad>, x: &Batch, device: &FlexDevice) -> Result<[f64; 3]> {
    mem("update start");
    let t0 = Instant::now();
    let (t1, grads) = if single_graph_update() {
        let (lp, entropy) = log_probs(model, x, device)?;
        let loss = ppo_loss(lp.clone().detach(), lp, device)?;
        let _ = entropy.detach().mean().into_scalar();
        let _ = loss.clone().detach().into_scalar();
        mem("forward (live: kept for the backward)");
        let t1 = Instant::now();
        let grads = GradientsParams::from_grads::<Ad, _>(loss.backward(), model);
        (t1, grads)
    } else {
        let (response, labels, backward) = if std::env::var("BENCH_CHECKPOINTING").is_ok() {
            checkpointed(model, x, device)?
        } else {
            let (response, labels) = trunk(model, x, device)?;
            (response, labels, TrunkBackward::Graph)
        };
        mem("trunk forward (live: kept for the backward)");
        let t1 = Instant::now();
        let response = (response, backward);
        let mut sum = GradSum::on_device();
        let out = chunked_loss_backward(
            model,
            model,
            response,
            labels,
            1.0,
            chunk(),
            |lp, _| ppo_loss(Tensor::from_inner(lp.clone().inner()), lp, device),
            &mut sum,
        )?;
        let _ = out.values.entropy.mean().into_scalar();
        let grads = out.loss.is_finite().then(|| sum.into_device());
        (t1, grads.context("non-finite loss")?)
    };
    let t2 = Instant::now();
    mem("backward (live: gradients)");
    let mut opt = AdamW::<Ad>::new(AdamWConfig::default());
    *model = opt.step(1e-6, model.clone(), grads);
    let t3 = Instant::now();
    drop(opt);
    mem("optimizer step");
    Ok([
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        (t3 - t2).as_secs_f64(),
    ])
}

#[inline(never)]
fn measured_logprob(model: &Model<Flex>, x: &Batch, device: &FlexDevice) -> Result<[f64; 3]> {
    mem("logprob start");
    let t0 = Instant::now();
    let (lp, entropy) = log_probs(model, x, device)?;
    let _ = lp.into_data();
    let _ = entropy.into_data();
    mem("logprob");
    Ok([t0.elapsed().as_secs_f64(), 0.0, 0.0])
}

#[inline(never)]
fn measured_head(
    model: &Model<Ad>,
    hidden: &Tensor<Ad, 3>,
    labels: &Tensor<Ad, 2, Int>,
) -> Result<[f64; 3]> {
    let lm = model.causal_lm();
    let t0 = Instant::now();
    let (entropy, lp) = entropy_and_logprobs_from_hidden(
        hidden.clone(),
        labels.clone(),
        |h| lm.lm_head(h),
        1.0,
        chunk(),
    )?;
    let loss = lp.mean().neg() + entropy.mean() * 0.001;
    let _ = loss.clone().detach().into_scalar();
    let t1 = Instant::now();
    let _grads = GradientsParams::from_grads::<Ad, _>(loss.backward(), model);
    Ok([
        t0.elapsed().as_secs_f64() - t1.elapsed().as_secs_f64(),
        t1.elapsed().as_secs_f64(),
        0.0,
    ])
}

#[inline(never)]
fn measured_adamw(model: &mut Model<Ad>, device: &FlexDevice) -> Result<[f64; 3]> {
    // Gradients of ones on every parameter: the sum of all weights' sums has unit gradients.
    let grads = GradientsParams::from_grads::<Ad, _>(param_sum(model, device).backward(), model);
    let t1 = Instant::now();
    let mut opt = AdamW::<Ad>::new(AdamWConfig::default());
    *model = opt.step(1e-6, model.clone(), grads);
    Ok([0.0, 0.0, t1.elapsed().as_secs_f64()])
}

#[inline(never)]
fn measured_rollout(
    model: &Model<Flex>,
    x: &Batch,
    new: usize,
    device: &FlexDevice,
) -> Result<[f64; 3]> {
    let prompts: Vec<Vec<u32>> = (0..x.batch)
        .map(|b| x.tokens.ids[b * x.tokens.len..(b + 1) * x.tokens.len][..PROMPT].to_vec())
        .collect();
    let inputs: Vec<PromptInput<'_>> = prompts
        .iter()
        .zip(&x.images)
        .map(|(ids, image)| PromptInput {
            ids,
            images: std::slice::from_ref(image),
        })
        .collect();
    let seeds: Vec<u64> = (0..x.batch as u64).collect();
    let config = GenerationConfig {
        suppress_token_ids: vec![x.image_token],
        ..GenerationConfig::new(new, SamplingConfig::default())
    };
    let t0 = Instant::now();
    let out = generate(&ModelParts::of(model), &inputs, &config, &seeds, device)?;
    let tokens: usize = out.tokens.iter().map(Vec::len).sum();
    eprintln!("rollout: {tokens} tokens generated");
    Ok([t0.elapsed().as_secs_f64(), 0.0, 0.0])
}

/// Σ over every float parameter of its elements' sum (a loss whose gradient is all ones).
fn param_sum(model: &Model<Ad>, device: &FlexDevice) -> Tensor<Ad, 1> {
    use burn::module::{Module, ModuleVisitor, Param};
    struct Sum(Tensor<Ad, 1>);
    impl ModuleVisitor<Ad> for Sum {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
            self.0 = self.0.clone() + param.val().sum();
        }
    }
    let mut s = Sum(Tensor::zeros([1], device));
    model.visit(&mut s);
    s.0
}

/// CPU seconds (user + system, all threads) this process has used, from `/proc/self/stat`
/// (clock ticks of 1/100 s): unlike wall time, barely affected by other jobs on a shared machine.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    if f.len() > 13 {
        (f[11] + f[12]) / 100.0
    } else {
        f64::NAN
    }
}

/// The benchmark model: `bench/work/model` when `bench/run.sh` has written it (loading is a copy,
/// cheap under valgrind), else the same random weights made here (`Model::random`, seed 0: the
/// 61 M normal draws dominate a callgrind run's setup).
fn load(config: &str, device: &FlexDevice) -> Result<Model<Ad>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("work/model");
    if dir.join("model.safetensors").exists() {
        Model::load(&dir, device)
    } else {
        Model::random(config, device, 0)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    flowrl_nodes::runtime::allocator::keep_freed_memory();
    let mode = std::env::args().nth(1).unwrap_or_default();
    let reps = env("BENCH_REPS", 3);
    let b = env("BENCH_BATCH", 8);
    let n = env("BENCH_N", 4).max(1);
    let new = env("BENCH_NEW", 32);
    let config_path = concat!(env!("CARGO_MANIFEST_DIR"), "/model_config.json");
    let config = std::fs::read_to_string(config_path).with_context(|| config_path.to_string())?;
    let json: serde_json::Value = serde_json::from_str(&config)?;
    let id = |key: &str| -> Result<u32> {
        Ok(json[key]
            .as_u64()
            .with_context(|| format!("{key} in {config_path}"))? as u32)
    };
    let special = [
        id("vision_start_token_id")?,
        id("image_token_id")?,
        id("vision_end_token_id")?,
    ];
    let device = Default::default();
    let x = batch(b, n, new, special);
    // BENCH_REPS=0: a single run and no warm-up (for callgrind, which is ~50× slower).
    let runs = reps.max(1) + usize::from(reps > 0);
    let mut times: Vec<([f64; 3], f64)> = Vec::new();
    match mode.as_str() {
        "update" => {
            let mut model = load(&config, &device)?;
            for _ in 0..runs {
                let c0 = cpu_seconds();
                let t = measured_update(&mut model, &x, &device)?;
                times.push((t, cpu_seconds() - c0));
            }
        }
        "logprob" => {
            let model = load(&config, &device)?.valid();
            for _ in 0..runs {
                let c0 = cpu_seconds();
                let t = measured_logprob(&model, &x, &device)?;
                times.push((t, cpu_seconds() - c0));
            }
        }
        "head" => {
            let model = load(&config, &device)?;
            let hidden = Tensor::<Ad, 3>::random(
                [b, new, model.causal_lm().hidden_size()],
                burn::tensor::Distribution::Normal(0.0, 1.0),
                &device,
            );
            let labels = x.labels::<Ad>(&device);
            for _ in 0..runs {
                let c0 = cpu_seconds();
                let t = measured_head(&model, &hidden, &labels)?;
                times.push((t, cpu_seconds() - c0));
            }
        }
        "adamw" => {
            let mut model = load(&config, &device)?;
            for _ in 0..runs {
                let c0 = cpu_seconds();
                let t = measured_adamw(&mut model, &device)?;
                times.push((t, cpu_seconds() - c0));
            }
        }
        "rollout" => {
            let model = load(&config, &device)?.valid();
            for _ in 0..runs {
                let c0 = cpu_seconds();
                let t = measured_rollout(&model, &x, new, &device)?;
                times.push((t, cpu_seconds() - c0));
            }
        }
        _ => bail!(
            "usage: bench-profile update|logprob|head|adamw|rollout (env BENCH_BATCH, BENCH_NEW, BENCH_REPS, BENCH_UPDATE, BENCH_CHECKPOINTING, FLOWRL_SMALL_M_KERNEL)"
        ),
    }
    let measured = &times[times.len() - reps.max(1)..];
    let col = |i: usize| median(measured.iter().map(|(t, _)| t[i]).collect());
    let variant = match (mode.as_str(), single_graph_update()) {
        ("update", true) => " (single-graph backward)",
        ("update", false) => " (two-stage backward)",
        _ => "",
    };
    println!(
        "mode {mode}{variant}: batch {b} x ({PROMPT} prompt + {new} response) tokens, n = {n} rows per prompt, {reps} reps after a warm-up; \
         median seconds: forward {:.3}, backward {:.3}, optimizer {:.3}, total {:.3}; \
         median CPU seconds (all threads) {:.2}",
        col(0),
        col(1),
        col(2),
        median(measured.iter().map(|(t, _)| t.iter().sum()).collect()),
        median(measured.iter().map(|(_, c)| *c).collect()),
    );
    Ok(())
}
