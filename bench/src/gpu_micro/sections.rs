//! Sections 1, 2, 3 and 5: kernel launch cost, device → host reads, elementwise bandwidth and
//! GEMM throughput at the 3B's shapes, each emitting its records as it measures them.

use std::time::Instant;

use anyhow::Result;
use burn::prelude::*;
use burn::tensor::Distribution;
use serde_json::json;

use super::{Args, GEMM_NK, Report, VOCAB, dtype_name, median, round, sync, timed};

/// µs per launch: `n` `add_scalar`s on a 1-element tensor (each one kernel: the backend is
/// unfused), after a warm-up that compiles the kernel.
pub(super) fn launch<B: Backend>(device: &B::Device, rep: &mut Report) -> Result<()> {
    let n = 10_000;
    let mut x = Tensor::<B, 1>::zeros([1], device);
    for _ in 0..100 {
        x = x.add_scalar(1.0);
    }
    sync::<B>(device)?;
    let t = Instant::now();
    for _ in 0..n {
        x = x.add_scalar(1.0);
    }
    let issue = t.elapsed().as_secs_f64();
    sync::<B>(device)?;
    let total = t.elapsed().as_secs_f64();
    let v = x
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap_or_default();
    rep.emit(json!({
        "bench": "launch", "n": n,
        "us_per_launch": round(total / n as f64 * 1e6, 2),
        "issue_us_per_launch": round(issue / n as f64 * 1e6, 2),
        "check": v.first().copied().unwrap_or(f32::NAN),
    }));
    Ok(())
}

/// Device → host: `into_data` of f32 tensors (a clone of the handle each time: the same
/// buffer read again), median of 3 after a warm-up read.
pub(super) fn read<B: Backend>(device: &B::Device, args: &Args, rep: &mut Report) -> Result<()> {
    let div = if args.small { 10 } else { 1 };
    let shapes: [(&str, Vec<usize>); 2] = [
        ("flat", vec![25_000_000 / div]),
        ("the rollout's logits", vec![512, VOCAB / div]),
    ];
    for (what, shape) in shapes {
        let label = match shape.as_slice() {
            [n] => format!("{n} f32 ({what})"),
            dims => format!(
                "{} f32 ({what})",
                dims.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(" x ")
            ),
        };
        let t = Tensor::<B, 2>::random(
            if shape.len() == 1 {
                [1, shape[0]]
            } else {
                [shape[0], shape[1]]
            },
            Distribution::Uniform(-1.0, 1.0),
            device,
        );
        let bytes = t.shape().num_elements() * 4;
        sync::<B>(device)?;
        let _ = t.clone().into_data();
        let mut times = Vec::new();
        for _ in 0..3 {
            sync::<B>(device)?;
            let s = Instant::now();
            let data = t.clone().into_data();
            times.push(s.elapsed().as_secs_f64());
            assert_eq!(data.bytes.len(), bytes);
        }
        let med = median(times.clone());
        rep.emit(json!({
            "bench": "read", "label": label, "mb": round(bytes as f64 / 1e6, 1),
            "ms": times.iter().map(|s| round(s * 1e3, 2)).collect::<Vec<_>>(),
            "gb_s": round(bytes as f64 / med / 1e9, 2),
        }));
    }
    Ok(())
}

/// `a + b` over `[rows, cols]` f32 tensors: contiguous (`b` the same shape) and with a row
/// broadcast (`b` `[1, cols]`); bytes = what the kernel must move (2 reads + 1 write, or
/// 1 read + 1 write for the broadcast).
pub(super) fn elementwise<B: Backend>(
    device: &B::Device,
    args: &Args,
    rep: &mut Report,
) -> Result<()> {
    let (rows, cols) = if args.small {
        (1024, 4096)
    } else {
        (16384, 4096)
    };
    let a = Tensor::<B, 2>::random([rows, cols], Distribution::Uniform(-1.0, 1.0), device);
    let b = Tensor::<B, 2>::random([rows, cols], Distribution::Uniform(-1.0, 1.0), device);
    let row = Tensor::<B, 2>::random([1, cols], Distribution::Uniform(-1.0, 1.0), device);
    let tensor_bytes = (rows * cols * 4) as f64;
    for (kind, moved) in [
        ("contiguous", 3.0 * tensor_bytes),
        ("row broadcast", 2.0 * tensor_bytes),
    ] {
        let add = || {
            if kind == "contiguous" {
                a.clone() + b.clone()
            } else {
                a.clone() + row.clone()
            }
        };
        let _ = timed::<B, _>(device, add)?; // compile
        let reps = 20;
        let (s, _) = timed::<B, _>(device, || {
            for _ in 0..reps {
                let _ = add();
            }
        })?;
        rep.emit(json!({
            "bench": "elementwise", "kind": kind, "mb": round(tensor_bytes / 1e6, 1),
            "us": round(s / reps as f64 * 1e6, 1),
            "gb_s": round(moved * reps as f64 / s / 1e9, 1),
        }));
    }
    Ok(())
}

pub(super) fn gemms<B: Backend>(
    device: &B::Device,
    args: &Args,
    ms: &[usize],
    rep: &mut Report,
) -> Result<()> {
    let div = if args.small { 8 } else { 1 };
    for &m in ms {
        for &(n, k, what) in &GEMM_NK {
            let (n, k) = (n / div, k / div);
            let label = format!("gemm M={m} N={n} K={k} ({what})");
            if rep.over_budget(&label) {
                continue;
            }
            gemm::<B>(device, args, m, n, k, what, rep)?;
        }
    }
    Ok(())
}

/// `x · Wᵀ` with `x` `[m, k]` and `W` `[n, k]`, both in the compute dtype.
fn gemm<B: Backend>(
    device: &B::Device,
    args: &Args,
    m: usize,
    n: usize,
    k: usize,
    what: &str,
    rep: &mut Report,
) -> Result<()> {
    let dist = Distribution::Normal(0.0, 1.0);
    let x = Tensor::<B, 2>::random([m, k], dist, device).cast(args.dtype);
    let w = Tensor::<B, 2>::random([n, k], dist, device).cast(args.dtype);
    let run = || x.clone().matmul(w.clone().transpose());
    let (first, out) = timed::<B, _>(device, run)?;
    let out_dtype = out.dtype();
    drop(out);
    let (one, _) = timed::<B, _>(device, || drop(run()))?;
    let reps = ((0.25 / one.max(1e-6)) as usize).clamp(3, 200);
    let (total, _) = timed::<B, _>(device, || {
        for _ in 0..reps {
            drop(run());
        }
    })?;
    let s = total / reps as f64;
    let flop = 2.0 * m as f64 * n as f64 * k as f64;
    rep.emit(json!({
        "bench": "gemm", "m": m, "n": n, "k": k, "what": what,
        "dtype": dtype_name(args.dtype), "out_dtype": dtype_name(out_dtype),
        "first_s": round(first, 3), "ms": round(s * 1e3, 3), "reps": reps,
        "tflops": round(flop / s / 1e12, if args.small { 4 } else { 2 }),
    }));
    Ok(())
}
