//! The micro-benchmarks' driver: the records, printed and appended as they come, the timing
//! helpers every section shares, and [`run`], which measures the sections in the module doc's
//! order and prints the markdown table at the end.

mod args;
mod markdown;
mod model;
#[cfg(feature = "cuda")]
mod nccl;
mod sections;

pub use args::{Args, parse};

use std::fs::File;
use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result};
use burn::prelude::*;
use burn::tensor::DType;
use burn_cubecl::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
use burn_cubecl::{CubeBackend, CubeRuntime};
use serde_json::{Value, json};

use markdown::markdown;
use model::first_pass;
#[cfg(feature = "cuda")]
use nccl::nccl;
use sections::{elementwise, gemms, launch, read};

/// burn's cubecl kernels without fusion, as the nodes run them.
type Gpu<R> = CubeBackend<R, f32, i32, u8>;

/// The LM head's width: Qwen2.5-VL's vocabulary.
const VOCAB: usize = 151_936;
/// N×K of the 3B's linear maps (`W` is `[N, K]`).
const GEMM_NK: [(usize, usize, &str); 5] = [
    (2048, 2048, "q_proj / o_proj"),
    (2560, 2048, "q/k/v fused"),
    (11008, 2048, "gate / up"),
    (2048, 11008, "down"),
    (VOCAB, 2048, "LM head"),
];

/// The records, printed and appended to the JSON lines file as they come.
struct Report {
    start: Instant,
    budget_s: f64,
    file: Option<File>,
    records: Vec<Value>,
}

impl Report {
    fn emit(&mut self, mut record: Value) {
        record["t_s"] = json!(round(self.start.elapsed().as_secs_f64(), 2));
        let line = record.to_string();
        println!("{line}");
        if let Some(f) = &mut self.file {
            let _ = writeln!(f, "{line}");
            let _ = f.flush();
        }
        self.records.push(record);
    }

    /// Whether the budget is spent; if so, a `skipped` record for `what`.
    fn over_budget(&mut self, what: &str) -> bool {
        let spent = self.start.elapsed().as_secs_f64();
        if spent > self.budget_s {
            self.emit(json!({"bench": "skipped", "what": what,
                "reason": format!("budget: {spent:.0} s of {:.0} s spent", self.budget_s)}));
            return true;
        }
        false
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::F32 => "f32",
        _ => "other",
    }
}

fn sync<B: Backend>(device: &B::Device) -> Result<()> {
    B::sync(device).map_err(|e| anyhow::anyhow!("syncing the device: {e:?}"))
}

/// Seconds of `f`, from a synced device to a synced device.
fn timed<B: Backend, T>(device: &B::Device, f: impl FnOnce() -> T) -> Result<(f64, T)> {
    sync::<B>(device)?;
    let t = Instant::now();
    let out = f();
    sync::<B>(device)?;
    Ok((t.elapsed().as_secs_f64(), out))
}

pub fn run<R: CubeRuntime>(device: R::Device, args: &Args) -> Result<()> {
    let start = Instant::now();
    let file = match &args.jsonl {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening {}", p.display()))?,
        ),
        None => None,
    };
    let mut rep = Report {
        start,
        budget_s: args.budget_s,
        file,
        records: Vec::new(),
    };
    let config = CubeClRuntimeConfig::get();
    let compilation_cache = config.compilation.cache.as_ref().map(|c| c.root());
    // The first operation initialises the device (driver, context, memory pools).
    let (init_s, _) = timed::<Gpu<R>, _>(&device, || {
        Tensor::<Gpu<R>, 1>::zeros([1], &device).into_data()
    })?;
    rep.emit(json!({
        "bench": "info",
        "device": args.device,
        "runtime": std::any::type_name::<R>(),
        "dtype": dtype_name(args.dtype),
        "small": args.small,
        "budget_s": args.budget_s,
        "device_init_s": round(init_s, 3),
        "autotune_level": format!("{:?}", config.autotune.level),
        "autotune_cache": format!("{:?} -> {}", config.autotune.cache, config.autotune.cache.root().display()),
        "compilation_cache": match (&config.compilation.cache, &compilation_cache) {
            (Some(c), Some(root)) => format!("{c:?} -> {}", root.display()),
            _ => "none (no [compilation] cache in a cubecl.toml)".to_string(),
        },
        "cwd": std::env::current_dir().map(|p| p.display().to_string()).unwrap_or_default(),
    }));
    let wants = |s: &str| !args.skip.iter().any(|k| k == s);
    #[cfg(feature = "cuda")]
    if wants("nccl") && args.device.starts_with("cuda") {
        let ordinal = args
            .device
            .split(':')
            .nth(1)
            .and_then(|i| i.parse().ok())
            .unwrap_or(0);
        if let Err(e) = nccl(ordinal, &mut rep) {
            rep.emit(json!({"bench": "nccl", "error": format!("{e:#}")}));
        }
    }
    if wants("launch") {
        launch::<Gpu<R>>(&device, &mut rep)?;
    }
    if wants("read") {
        read::<Gpu<R>>(&device, args, &mut rep)?;
    }
    if wants("elementwise") {
        elementwise::<Gpu<R>>(&device, args, &mut rep)?;
    }
    // The first pass before the GEMMs: its compile + autotune time is only measurable while
    // the caches are cold (a first run), while GEMM throughput is the same on a second run.
    if wants("first_pass")
        && !rep.over_budget("first pass")
        && let Err(e) = first_pass::<R>(&device, args, &mut rep)
    {
        rep.emit(json!({"bench": "first_pass", "phase": "error", "error": format!("{e:#}")}));
    }
    if wants("gemm") {
        // (lavapipe caps a buffer at 128 MiB: the LM head's output at 1024 rows is 78 MB)
        let ms: &[usize] = if args.small {
            &[512, 64, 1024]
        } else {
            &[4096, 512, 26624]
        };
        gemms::<Gpu<R>>(&device, args, ms, &mut rep)?;
    }
    println!();
    print!("{}", markdown(&rep.records));
    Ok(())
}
