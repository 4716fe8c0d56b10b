//! `flowrl export RUN_DIR [--step N] [--model NAME] --out DIR [--dtype auto|f32|bf16]`: a trained
//! policy of a run's checkpoint as a Hugging Face directory that transformers loads.
//!
//! - A fully trained model (`resources/NAME/model/` in the checkpoint): `DIR` gets its weights in
//!   the chosen dtype, its config.json and the tokenizer, chat template, preprocessor and
//!   generation configs of the model's source directory.
//! - A LoRA model (`resources/NAME/adapter/`): `DIR/adapter/` is the adapter in PEFT's layout
//!   (`PeftModel.from_pretrained(base, DIR/adapter)`), with `base_model_name_or_path` the base
//!   directory; `DIR/merged/` is the base with every adapter folded in (`W + s·B·A`, PEFT's
//!   `merge_and_unload`) plus the same side files.
//!
//! `--dtype auto` writes the dtype the base checkpoint declares in config.json (`dtype` /
//! `torch_dtype`), f32 when it declares none. The model resource is found in the run's resolved
//! `graph.toml`; a relative `path` there is taken from the current directory, as `flowrl run` did.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail, ensure};
use clap::{Args, ValueEnum};
use flowrl_engine::rundir::{Integrity, check_checkpoint};
use flowrl_models::Model;
use flowrl_models::lora::{AdapterInit, read_peft_adapter};
use flowrl_models::model::copy_side_files;
use flowrl_models::weights::Precision;
use flowrl_nodes::runtime::backend::HostBackend;

/// Arguments of `flowrl export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A run directory (`flowrl run --out DIR`), holding graph.toml and checkpoints/.
    pub run_dir: PathBuf,
    /// The checkpoint's step (default: the newest complete checkpoint).
    #[arg(long)]
    pub step: Option<u64>,
    /// The model resource to export (default: the only trained model of the checkpoint).
    #[arg(long)]
    pub model: Option<String>,
    /// The directory to write (created; must be empty or absent).
    #[arg(long)]
    pub out: PathBuf,
    /// The weights' dtype: `auto` = the base checkpoint's declared dtype.
    #[arg(long, value_enum, default_value_t = ExportDtype::Auto)]
    pub dtype: ExportDtype,
}

/// `--dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportDtype {
    Auto,
    F32,
    Bf16,
}

pub fn run(args: &ExportArgs) -> ExitCode {
    match export(args) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The checkpoint directory of `step`, or the newest complete one. Checkpoints are checked
/// against their manifest as `--resume` does: incomplete newer checkpoints are passed over with a
/// warning saying why, an incomplete requested one is an error.
fn checkpoint_dir(run_dir: &Path, step: Option<u64>) -> Result<PathBuf> {
    let root = run_dir.join("checkpoints");
    let mut steps: Vec<u64> = std::fs::read_dir(&root)
        .with_context(|| {
            format!(
                "{} has no checkpoints/ (was the run started with checkpoint_every > 0?)",
                run_dir.display()
            )
        })?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("step_")?
                .parse::<u64>()
                .ok()
        })
        .collect();
    steps.sort_unstable();
    if steps.is_empty() {
        bail!("{} holds no checkpoint", root.display());
    }
    let Some(step) = step else {
        let mut passed = Vec::new();
        for &n in steps.iter().rev() {
            let dir = root.join(format!("step_{n:06}"));
            match check_checkpoint(&dir, true) {
                Integrity::Incomplete(why) => {
                    passed.push(format!("step_{n:06} is incomplete ({why})"))
                }
                integrity => {
                    if !passed.is_empty() {
                        eprintln!(
                            "warning: checkpoint {}: exporting step_{n:06}",
                            passed.join("; ")
                        );
                    }
                    if matches!(integrity, Integrity::Unverified) {
                        eprintln!(
                            "warning: step_{n:06} has no manifest.json (written by a flowrl before checkpoint manifests): its files cannot be verified"
                        );
                    }
                    return Ok(dir);
                }
            }
        }
        bail!(
            "{} holds no complete checkpoint: {}",
            root.display(),
            passed.join("; ")
        );
    };
    ensure!(
        steps.contains(&step),
        "{} has no checkpoint of step {step}; it has steps {}",
        root.display(),
        steps
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let dir = root.join(format!("step_{step:06}"));
    match check_checkpoint(&dir, true) {
        Integrity::Complete => {}
        Integrity::Unverified => eprintln!(
            "warning: {} has no manifest.json (written by a flowrl before checkpoint manifests): \
             its files cannot be verified",
            dir.display()
        ),
        Integrity::Incomplete(why) => bail!("checkpoint {} is incomplete ({why})", dir.display()),
    }
    Ok(dir)
}

/// The trained model resources of a checkpoint: names with `model/` or `adapter/`.
fn trained_models(ckpt: &Path) -> Result<Vec<String>> {
    let dir = ckpt.join("resources");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("model").is_dir() || e.path().join("adapter").is_dir())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    names.sort();
    Ok(names)
}

/// The `path` of `[models.NAME]` in the run's graph.toml.
fn base_dir(run_dir: &Path, name: &str) -> Result<PathBuf> {
    let file = run_dir.join("graph.toml");
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let graph: toml::Value =
        toml::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
    let path = graph
        .get("models")
        .and_then(|m| m.get(name))
        .and_then(|m| m.get("path"))
        .and_then(|p| p.as_str())
        .with_context(|| format!("{} has no `[models.{name}] path`", file.display()))?;
    let dir = flowrl_models::hub::resolve_model_path(Path::new(path))?;
    ensure!(
        dir.join("config.json").is_file(),
        "the base model of `{name}`, `{path}` (from {}), is not a Hugging Face directory here; \
         run `flowrl export` from the directory the run was started in",
        file.display()
    );
    Ok(dir)
}

/// The dtype `config.json` of `dir` declares (`dtype`, `torch_dtype`, also under `text_config`).
fn declared_precision(dir: &Path) -> Result<Precision> {
    let path = dir.join("config.json");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))?;
    let declared = ["dtype", "torch_dtype"].iter().find_map(|k| {
        json.get(*k)
            .or_else(|| json.get("text_config").and_then(|t| t.get(*k)))
            .and_then(|v| v.as_str())
    });
    Ok(match declared {
        Some(name) => Precision::parse(name).unwrap_or(Precision::F32),
        None => Precision::F32,
    })
}

/// Sets the `dtype` (and, where present, `torch_dtype`) of `dir/config.json`, top level and
/// `text_config`, to the weights' dtype, as `save_pretrained` writes it.
fn declare_dtype(dir: &Path, precision: Precision) -> Result<()> {
    let path = dir.join("config.json");
    let mut json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )?;
    let name = match precision {
        Precision::F32 => "float32",
        Precision::BF16 => "bfloat16",
        Precision::F16 => "float16",
    };
    let set = |obj: &mut serde_json::Value| {
        if let Some(map) = obj.as_object_mut() {
            map.insert("dtype".into(), name.into());
            if map.contains_key("torch_dtype") {
                map.insert("torch_dtype".into(), name.into());
            }
        }
    };
    set(&mut json);
    if let Some(text) = json.get_mut("text_config") {
        set(text);
    }
    std::fs::write(&path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn export(args: &ExportArgs) -> Result<String> {
    let ckpt = checkpoint_dir(&args.run_dir, args.step)?;
    let names = trained_models(&ckpt)?;
    let name = match (&args.model, names.as_slice()) {
        (Some(n), _) if names.contains(n) => n.clone(),
        (Some(n), _) => bail!(
            "the checkpoint {} holds no trained model `{n}`; it holds: {}",
            ckpt.display(),
            names.join(", ")
        ),
        (None, [one]) => one.clone(),
        (None, []) => bail!("the checkpoint {} holds no trained model", ckpt.display()),
        (None, many) => bail!(
            "the checkpoint {} holds several trained models ({}); choose one with --model",
            ckpt.display(),
            many.join(", ")
        ),
    };
    if args.out.exists() {
        let empty = std::fs::read_dir(&args.out)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        ensure!(
            empty,
            "{} already exists and is not empty; choose another --out",
            args.out.display()
        );
    }
    let resource = ckpt.join("resources").join(&name);
    let base = base_dir(&args.run_dir, &name)?;
    let precision = match args.dtype {
        ExportDtype::Auto => declared_precision(&base)?,
        ExportDtype::F32 => Precision::F32,
        ExportDtype::Bf16 => Precision::BF16,
    };
    let device = Default::default();
    let adapter_dir = resource.join("adapter");
    if adapter_dir.is_dir() {
        let (config, stored) = read_peft_adapter(&adapter_dir)?;
        // The base in the export dtype; each merged weight is computed in f32 and rounded once.
        let (model, adapted) = Model::<HostBackend>::load_adapted(
            &base,
            &device,
            precision,
            &config,
            AdapterInit::Stored(stored),
        )
        .with_context(|| format!("applying {} to {}", adapter_dir.display(), base.display()))?;
        let base_name = std::fs::canonicalize(&base).unwrap_or(base.clone());
        let out_adapter = args.out.join("adapter");
        model.save_adapter(&out_adapter, &config, &base_name.display().to_string())?;
        let merged = args.out.join("merged");
        model.save_merged_as(&merged, Some(SHARD_BYTES), Some(precision))?;
        declare_dtype(&merged, precision)?;
        copy_side_files(&base, &merged)?;
        Ok(format!(
            "exported `{name}` of {} (LoRA r={}, alpha={}, {} modules): {} (PEFT adapter for {}) and {} (merged, {})",
            ckpt.display(),
            config.rank,
            config.alpha,
            adapted.len(),
            out_adapter.display(),
            base_name.display(),
            merged.display(),
            precision.name()
        ))
    } else {
        let model =
            Model::<HostBackend>::load_with_precision(&resource.join("model"), &device, precision)?;
        model.save_as(&args.out, Some(SHARD_BYTES), Some(precision))?;
        declare_dtype(&args.out, precision)?;
        copy_side_files(&base, &args.out)?;
        Ok(format!(
            "exported `{name}` of {} to {} ({})",
            ckpt.display(),
            args.out.display(),
            precision.name()
        ))
    }
}

/// Shards of at most 5 GB, as `save_pretrained`'s default `max_shard_size="5GB"`.
const SHARD_BYTES: usize = 5_000_000_000;
