//! The command line of `bench-gpu-micro`: its options and their defaults per device.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use burn::tensor::DType;

pub struct Args {
    pub device: String,
    pub budget_s: f64,
    pub jsonl: Option<PathBuf>,
    pub small: bool,
    pub dtype: DType,
    pub model_config: PathBuf,
    pub layers: usize,
    pub rows: usize,
    pub vocab: Option<usize>,
    pub skip: Vec<String>,
}

pub fn parse(args: &[String]) -> Result<Args> {
    let mut device = "cuda".to_string();
    let mut budget_s = 50.0;
    let mut jsonl = None;
    let mut small = None;
    let mut dtype = None;
    let mut model_config = None;
    let mut layers = 2;
    let mut rows = None;
    let mut vocab = None;
    let mut skip = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .with_context(|| format!("{a} needs a value"))
        };
        match a.as_str() {
            "--device" => device = value()?,
            "--budget-s" => budget_s = value()?.parse().context("--budget-s")?,
            "--jsonl" => jsonl = Some(PathBuf::from(value()?)),
            "--small" => small = Some(true),
            "--full" => small = Some(false),
            "--dtype" => {
                dtype = Some(match value()?.as_str() {
                    "bf16" => DType::BF16,
                    "f32" => DType::F32,
                    "f16" => DType::F16,
                    other => bail!("--dtype {other}: f32, bf16 or f16"),
                })
            }
            "--model-config" => model_config = Some(PathBuf::from(value()?)),
            "--layers" => layers = value()?.parse().context("--layers")?,
            "--rows" => rows = Some(value()?.parse().context("--rows")?),
            "--vocab" => vocab = Some(value()?.parse().context("--vocab")?),
            "--skip" => skip.extend(value()?.split(',').map(str::to_string)),
            "-h" | "--help" => {
                println!(
                    "usage: bench-gpu-micro [--device cuda|vulkan] [--budget-s S] [--jsonl FILE] \
                     [--small|--full] [--dtype f32|bf16|f16] [--model-config PATH] [--layers N] \
                     [--rows N] [--vocab N] [--skip nccl,launch,read,elementwise,gemm,first_pass]\n\
                     built with: {}",
                    crate::built_with()
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (--help)"),
        }
    }
    let cuda = device.starts_with("cuda");
    Ok(Args {
        small: small.unwrap_or(!cuda),
        dtype: dtype.unwrap_or(if cuda { DType::BF16 } else { DType::F32 }),
        model_config: model_config.unwrap_or_else(|| {
            PathBuf::from(if cuda {
                "bench/gpu/qwen2_5_vl_3b/config.json"
            } else {
                "assets/tiny-qwen2-vl/config.json"
            })
        }),
        rows: rows.unwrap_or(if cuda { 16 } else { 2 }),
        device,
        budget_s,
        jsonl,
        layers,
        vocab,
        skip,
    })
}
