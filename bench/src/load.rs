//! `bench-load [DIR]`: how long loading a Qwen2.5-VL-3B-sized bf16 checkpoint takes and how much
//! memory it needs, against the target peak RSS of 1.2 × the checkpoint's bytes + 0.5 GiB.
//!
//! 1. Once (reused when `DIR` holds a checkpoint; default `/tmp/flowrl-3b`, outside the
//!    repository): a child process draws the random weights of `bench/gpu/qwen2_5_vl_3b/config.json`
//!    directly in bf16 (`Model::random_with_precision`) and saves them in bf16 with ~2 GB shards
//!    (`Model::save_as`), next to the tokenizer, tokenizer config (with its chat template, also
//!    written as `chat_template.jinja`) and image processor of `assets/tiny-qwen2-vl`, whose
//!    token ids the config uses. It writes into `DIR.tmp` and renames it when complete.
//! 2. For each precision (bf16, then f32), a fresh child process loads the directory with
//!    `Model::load_with_precision` on the CPU backend (`Flex`) and reports the load's wall
//!    seconds and the process's peak RSS (`VmHWM` of /proc/self/status); then a second fresh
//!    child loads it again, with the file now in the page cache (the first load reads whatever
//!    part of it the cache does not hold from disk). One child at a time, so at most one f32
//!    copy of the model (15 GB) exists.
//! 3. A shape-only build of the same config (`Model::shape_only`) gives the parameter count.
//!
//! The table goes to `bench/results/load_3b.md` with the machine (cores, CPU model) and the date.
//! The page cache is not dropped: a checkpoint written just before is read from memory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use burn::backend::Flex;
use burn::module::Module;
use flowrl_models::Model;
use flowrl_models::weights::Precision;

/// The flowrl binary's allocator, so that the peak is the one a run sees.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const GIB: f64 = (1u64 << 30) as f64;
/// `Model::save_as`'s shard limit: transformers' `max_shard_size` of 2 GB.
const SHARD_BYTES: usize = 2_000_000_000;
/// Files of `assets/tiny-qwen2-vl` copied next to the weights.
const ASSET_FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn config_path() -> PathBuf {
    repo().join("bench/gpu/qwen2_5_vl_3b/config.json")
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("write") if args.len() == 2 => write_checkpoint(Path::new(&args[1])),
        Some("measure") if args.len() == 3 => measure(Path::new(&args[1]), &args[2]),
        Some("write" | "measure") => bail!("usage: bench-load [DIR]"),
        dir => run(Path::new(dir.unwrap_or("/tmp/flowrl-3b"))),
    }
}

/// `VmHWM` or `VmRSS` of this process, in bytes.
fn status_bytes(key: &str) -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .with_context(|| format!("no {key} in /proc/self/status"))?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .context("malformed status line")?
        .parse()?;
    Ok(kb * 1024)
}

/// Child: writes the random bf16 checkpoint into `dir`.
fn write_checkpoint(dir: &Path) -> Result<()> {
    let config = std::fs::read_to_string(config_path())?;
    let device = Default::default();
    let start = Instant::now();
    let model = Model::<Flex>::random_with_precision(&config, &device, 0, Precision::BF16)?;
    let drawn = start.elapsed().as_secs_f64();
    model.save_as(dir, Some(SHARD_BYTES), None)?;
    let assets = repo().join("assets/tiny-qwen2-vl");
    for f in ASSET_FILES {
        std::fs::copy(assets.join(f), dir.join(f))
            .with_context(|| format!("copying {f} from {}", assets.display()))?;
    }
    let tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json"))?)?;
    if let Some(template) = tok["chat_template"].as_str() {
        std::fs::write(dir.join("chat_template.jinja"), template)?;
    }
    eprintln!(
        "wrote {}: weights drawn in {drawn:.0} s, saved in {:.0} s, peak RSS {:.2} GiB",
        dir.display(),
        start.elapsed().as_secs_f64() - drawn,
        status_bytes("VmHWM:")? as f64 / GIB
    );
    Ok(())
}

/// Child: loads `dir` in `precision` and prints one JSON line.
fn measure(dir: &Path, precision: &str) -> Result<()> {
    let precision = Precision::parse(precision)?;
    let device = Default::default();
    let before = status_bytes("VmHWM:")?;
    let start = Instant::now();
    let model = Model::<Flex>::load_with_precision(dir, &device, precision)?;
    let seconds = start.elapsed().as_secs_f64();
    let json = serde_json::json!({
        "seconds": seconds,
        "peak_rss": status_bytes("VmHWM:")?,
        "rss_after": status_bytes("VmRSS:")?,
        "rss_before": before,
        "params": model.num_params(),
    });
    println!("{json}");
    Ok(())
}

/// Bytes of the safetensors files of `dir`, or `None` when it holds no complete checkpoint.
fn checkpoint_bytes(dir: &Path) -> Result<Option<u64>> {
    if !dir.join("config.json").is_file() || !dir.join("model.safetensors.index.json").is_file() {
        return Ok(None);
    }
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            total += std::fs::metadata(&path)?.len();
        }
    }
    Ok(Some(total))
}

fn child(args: &[&str]) -> Result<String> {
    let exe = std::env::current_exe()?;
    let out = Command::new(&exe)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {} {args:?}", exe.display()))?;
    ensure!(out.status.success(), "{args:?} failed: {}", out.status);
    Ok(String::from_utf8(out.stdout)?)
}

struct Row {
    precision: &'static str,
    /// Wall seconds of the first load and of the repeat.
    seconds: [f64; 2],
    /// The larger peak RSS of the two loads.
    peak: u64,
    rss_after: u64,
    /// Bytes of the loaded weights in this precision.
    weights: u64,
}

fn run(dir: &Path) -> Result<()> {
    let bytes = match checkpoint_bytes(dir)? {
        Some(b) => {
            eprintln!("reusing {}", dir.display());
            b
        }
        None => {
            let tmp = dir.with_extension("tmp");
            let _ = std::fs::remove_dir_all(&tmp);
            std::fs::create_dir_all(&tmp)?;
            let start = Instant::now();
            child(&["write", tmp.to_str().context("non-UTF-8 path")?])?;
            eprintln!("written in {:.0} s", start.elapsed().as_secs_f64());
            let _ = std::fs::remove_dir_all(dir);
            std::fs::rename(&tmp, dir)?;
            checkpoint_bytes(dir)?.context("the written checkpoint is incomplete")?
        }
    };
    let config = std::fs::read_to_string(config_path())?;
    let start = Instant::now();
    let shape = Model::<Flex>::shape_only(&config, &Default::default(), Precision::BF16)?;
    let shape_seconds = start.elapsed().as_secs_f64();
    let params = shape.num_params() as u64;
    drop(shape);

    let dir_arg = dir.to_str().context("non-UTF-8 path")?;
    let mut rows = Vec::new();
    for (precision, width) in [("bf16", 2u64), ("f32", 4)] {
        let mut runs = Vec::new();
        for _ in 0..2 {
            let line = child(&["measure", dir_arg, precision])?;
            let v: serde_json::Value = serde_json::from_str(line.trim())
                .with_context(|| format!("parsing the child's report {line:?}"))?;
            let get = |k: &str| v[k].as_f64().with_context(|| format!("no {k} in {line}"));
            ensure!(
                get("params")? as u64 == params,
                "loaded parameter count differs"
            );
            runs.push((
                get("seconds")?,
                get("peak_rss")? as u64,
                get("rss_after")? as u64,
            ));
        }
        let row = Row {
            precision,
            seconds: [runs[0].0, runs[1].0],
            peak: runs[0].1.max(runs[1].1),
            rss_after: runs[1].2,
            weights: params * width,
        };
        eprintln!(
            "{precision}: {:.1} s, then {:.1} s; peak RSS {:.2} GiB",
            row.seconds[0],
            row.seconds[1],
            row.peak as f64 / GIB
        );
        rows.push(row);
    }
    let report = report(dir, bytes, params, shape_seconds, &rows);
    let out = repo().join("bench/results/load_3b.md");
    std::fs::write(&out, &report)?;
    print!("{report}");
    eprintln!("wrote {}", out.display());
    Ok(())
}

fn machine() -> (usize, String) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    (cores, cpu)
}

fn today() -> String {
    Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "unknown date".into(), |s| s.trim().to_string())
}

fn report(dir: &Path, bytes: u64, params: u64, shape_seconds: f64, rows: &[Row]) -> String {
    let (cores, cpu) = machine();
    let gib = |b: u64| b as f64 / GIB;
    let mut md = String::new();
    md.push_str("# Loading a Qwen2.5-VL-3B-sized bf16 checkpoint (`bench-load`)\n\n");
    md.push_str(&format!(
        "{} UTC, {cores} cores ({cpu}), CPU backend (Flex), mimalloc. Checkpoint: random weights of \
         `bench/gpu/qwen2_5_vl_3b/config.json` ({params} parameters) saved in bf16 by \
         `Model::save_as` with 2 GB shards, {:.2} GiB of safetensors in `{}`. Each load runs in a \
         fresh process; the page cache is not dropped, so the first load reads from disk what the \
         cache does not hold and the repeat (a second fresh process) reads from the cache.\n\n",
        today(),
        gib(bytes),
        dir.display()
    ));
    md.push_str(
        "Target peak RSS: 1.2 × checkpoint bytes + 0.5 GiB for a bf16 load; for an f32 load the \
         same rule on the f32 weights' bytes (the model itself is twice the checkpoint).\n\n",
    );
    md.push_str("| precision | first load (s) | repeat load (s) | peak RSS (GiB) | RSS after load (GiB) | weights (GiB) | target (GiB) | within |\n");
    md.push_str("|---|---:|---:|---:|---:|---:|---:|---|\n");
    for r in rows {
        let base = if r.precision == "bf16" {
            bytes
        } else {
            r.weights
        };
        let target = 1.2 * base as f64 + 0.5 * GIB;
        md.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {} |\n",
            r.precision,
            r.seconds[0],
            r.seconds[1],
            gib(r.peak),
            gib(r.rss_after),
            gib(r.weights),
            target / GIB,
            if (r.peak as f64) <= target {
                "yes"
            } else {
                "no"
            }
        ));
    }
    md.push_str(&format!(
        "\nShape-only build of the same config (`Model::shape_only`, placeholders expanded from \
         one zero): {:.1} ms, {params} parameters.\n\n\
         Run: `cargo build --release -p flowrl-bench --bin bench-load && target/release/bench-load [DIR]` \
         (see bench/README.md).\n",
        shape_seconds * 1e3
    ));
    md
}
