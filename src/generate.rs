//! `flowrl generate`: one response from a checkpoint, without writing a graph.
//!
//! The prompt goes the way a graph's prompts go, through the same code: the user turn is encoded
//! by `flowrl_datasets`' [`PromptEncoder`] (the checkpoint's chat template, tokenizer and image
//! processor; `<image>` placeholders split into image items by the dataset's message layout), the
//! checkpoint is loaded as a frozen `model` resource ([`ModelResource::load`]), and the
//! [`PromptBatch`] of that one prompt is sampled by the rollout node's own function
//! ([`sample_rollouts_seeded`]) on one replica. A greedy `flowrl generate` therefore answers what a
//! greedy `rollout` node answers for the same prompt.
//!
//! Everything that can be checked cheaply is checked before the weights are read: the device, the
//! model directory, the image files, the image processor, and prompt + `max_new_tokens` against
//! the context. Exit codes are `flowrl run`'s: 78 for the device, 2 for bad usage, 1 otherwise.
//! This module does not batch prompts or keep a model between calls: that is a graph's job.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, anyhow};
use clap::Args;
use flowrl_datasets::verl::IMAGE_PLACEHOLDER;
use flowrl_datasets::{ChatMessage, Prompt, PromptBatch, PromptEncoder, RowRef};
use flowrl_engine::cli::EXIT_CONFIG;
use flowrl_engine::device::Machine;
use flowrl_engine::diagnostic::{SourceMap, render};
use flowrl_engine::{Code, DeviceRequest, DeviceSpec, Diagnostic, Span};
use flowrl_models::weights::Precision;
use flowrl_nodes::kinds::rollout::{
    KV_CACHE_GIB, MAX_NUM_BATCHED_TOKENS, RolloutParams, sample_rollouts_seeded, stop_token_ids,
};
use flowrl_nodes::kinds::validate::context_length_of;
use flowrl_nodes::resources::model::ModelResource;
use flowrl_nodes::runtime::backend::BackendKind;
use flowrl_nodes::runtime::data_parallel::Replicas;
use serde_json::{Value as Json, json};

/// `max_new_tokens` when neither the flag nor generation_config.json gives one.
const DEFAULT_MAX_NEW_TOKENS: usize = 256;

const DEFAULTS_HELP: &str = "\
Decoding defaults: from the checkpoint's generation_config.json when it has one (do_sample, false
or absent = greedy; temperature; top_p; top_k; max_new_tokens; a field it lacks is off:
temperature 1, top_p 1, no top_k, 256 new tokens), else greedy with 256 new tokens. Each flag
overrides its field; --temperature 0 decodes greedily, --temperature T > 0 samples.

The user turn holds the images first, then the text, unless the text places them itself with
`<image>` (one per --image). The response stops at the model's EOS, a --stop token or
--max-new-tokens.

Examples:
  flowrl generate --model assets/tiny-qwen2-vl --image shape.png --prompt \"Count the shapes.\"
  flowrl generate --model ckpt/model --prompt \"2+2=\" --temperature 0.7 --seed 3 --json";

/// Arguments of `flowrl generate`.
#[derive(Debug, Clone, Args)]
#[command(after_help = DEFAULTS_HELP)]
pub struct GenerateArgs {
    /// A Hugging Face model directory (config.json, weights, tokenizer.json, a chat template;
    /// preprocessor_config.json for images), e.g. a run's
    /// `checkpoints/step_NNNNNN/resources/policy/model`, or a hub id (`org/name`,
    /// `org/name@revision`) in the local Hugging Face cache.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors, e.g. a
    /// `flowrl export`'s `DIR/adapter`) applied to the model.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
    /// The user's message (`-` reads it from standard input).
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// A PNG or JPEG picture for the user turn. Repeatable, in order.
    #[arg(long = "image", value_name = "FILE")]
    pub images: Vec<PathBuf>,
    /// Maximum response length in tokens, stop token included.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_new_tokens: Option<u64>,
    /// Sampling temperature; 0 = greedy (argmax) decoding.
    #[arg(long, value_name = "T", value_parser = non_negative)]
    pub temperature: Option<f64>,
    /// Nucleus mass in (0, 1]; 1 = off.
    #[arg(long, value_name = "P", value_parser = unit_interval)]
    pub top_p: Option<f64>,
    /// Keep the K most likely tokens; -1 or 0 = off.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(i64).range(-1..))]
    pub top_k: Option<i64>,
    /// An extra stop token besides the model's EOS (one token of the tokenizer). Repeatable.
    #[arg(long, value_name = "TOKEN")]
    pub stop: Vec<String>,
    /// Seed of the sampling RNG (the same seed gives the same response).
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Device, as for `flowrl run`: `auto` (CUDA when built with it and a GPU is present, else
    /// CPU), `cpu[:N]`, `cuda[:N]`, `vulkan[:N]`.
    #[arg(long, value_name = "DEVICE", default_value = "auto")]
    pub device: String,
    /// Precision of the forward passes, as a model resource's `precision` (default: f32 on CPU
    /// and Vulkan, bf16 on CUDA).
    #[arg(long, value_parser = [Precision::F32, Precision::BF16].map(Precision::name))]
    pub precision: Option<String>,
    /// Print one JSON object (prompt and response ids, log-probs, text, finish reason, timings)
    /// instead of the response text.
    #[arg(long)]
    pub json: bool,
}

fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number ≥ 0")),
    }
}

fn unit_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number in (0, 1]")),
    }
}

/// Why the command failed, which decides the exit code.
enum Failure {
    /// Bad command-line usage (exit 2).
    Usage(String),
    /// A device this binary or machine does not have, rendered like `flowrl run`'s (exit 78).
    Device(String),
    /// Anything else (exit 1).
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Other(e)
    }
}

/// Runs `flowrl generate`; returns the process exit code.
pub fn run(args: &GenerateArgs) -> ExitCode {
    match generate(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Device(rendered)) => {
            eprint!("{rendered}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(Failure::Other(e)) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--device` parsed and resolved by the engine, as `flowrl run --device` is: the same messages
/// and codes (E0106 not a device, E0701 not on this machine or build).
fn resolve_device(text: &str) -> Result<DeviceSpec, Failure> {
    let diagnostic = match text.parse::<DeviceRequest>() {
        Err(msg) => Diagnostic::error(Code::InvalidValue, msg),
        Ok(req) => match Machine::detect().resolve(req) {
            Ok(device) => return Ok(device),
            Err(why) => Diagnostic::error(
                Code::DeviceUnavailable,
                format!("the model is placed on {req}, but {why}"),
            )
            .with_help(why.help()),
        },
    };
    let mut sources = SourceMap::default();
    let arg = sources.add("--device", format!("--device {text}"));
    let at = Span::new(arg, "--device ".len(), "--device ".len() + text.len());
    Err(Failure::Device(render(&[diagnostic.at(at)], &sources)))
}

/// How to decode: the checkpoint's defaults (see [`DEFAULTS_HELP`]) overridden by the flags.
#[derive(Debug, Clone, PartialEq)]
struct Decoding {
    greedy: bool,
    temperature: f64,
    top_p: f64,
    top_k: i64,
    max_new_tokens: usize,
    /// Where the defaults came from.
    defaults: &'static str,
}

impl Decoding {
    /// The defaults of a model directory.
    fn defaults_of(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("generation_config.json");
        let mut d = Decoding {
            greedy: true,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            max_new_tokens: DEFAULT_MAX_NEW_TOKENS,
            defaults: "built-in",
        };
        if !path.is_file() {
            return Ok(d);
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let gc: Json = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        let number = |key: &str| gc.get(key).and_then(Json::as_f64);
        d.defaults = "generation_config.json";
        d.greedy = !gc.get("do_sample").and_then(Json::as_bool).unwrap_or(false);
        if let Some(t) = number("temperature") {
            if t <= 0.0 {
                d.greedy = true;
            } else {
                d.temperature = t;
            }
        }
        if let Some(p) = number("top_p").filter(|p| *p > 0.0 && *p <= 1.0) {
            d.top_p = p;
        }
        if let Some(k) = gc.get("top_k").and_then(Json::as_i64).filter(|k| *k > 0) {
            d.top_k = k;
        }
        if let Some(n) = gc
            .get("max_new_tokens")
            .and_then(Json::as_u64)
            .filter(|n| *n > 0)
        {
            d.max_new_tokens = n as usize;
        }
        Ok(d)
    }

    /// `self` with the command line's overrides.
    fn with_flags(mut self, args: &GenerateArgs) -> Self {
        if let Some(t) = args.temperature {
            self.greedy = t == 0.0;
            if t > 0.0 {
                self.temperature = t;
            }
        }
        if let Some(p) = args.top_p {
            self.top_p = p;
        }
        if let Some(k) = args.top_k {
            self.top_k = k;
        }
        if let Some(n) = args.max_new_tokens {
            self.max_new_tokens = n as usize;
        }
        self
    }
}

/// Writes one line to standard output; a closed pipe (`| head`) is not an error.
fn print_line(line: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    match writeln!(std::io::stdout().lock(), "{line}") {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing to standard output"))
        }
        _ => Ok(()),
    }
}

/// The `--prompt` text (`-`: standard input).
fn prompt_text(args: &GenerateArgs) -> anyhow::Result<String> {
    match args.prompt.as_deref() {
        None => return Ok(String::new()),
        Some("-") => {}
        Some(text) => return Ok(text.to_string()),
    }
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("reading the prompt from standard input")?;
    Ok(text)
}

/// The one user message: the images first, then the text, unless the text places them with
/// `<image>` (then the counts must agree).
fn user_message(text: &str, images: usize) -> Result<ChatMessage, Failure> {
    let placed = text.matches(IMAGE_PLACEHOLDER).count();
    let content = match placed {
        0 => IMAGE_PLACEHOLDER.repeat(images) + text,
        n if n == images => text.to_string(),
        n => {
            return Err(Failure::Usage(format!(
                "the prompt places {n} image(s) with `{IMAGE_PLACEHOLDER}` but {images} --image file(s) were given"
            )));
        }
    };
    Ok(ChatMessage {
        role: "user".into(),
        content,
    })
}

/// The model directory looks like a Hugging Face one (before anything is read from it).
fn check_model_dir(dir: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        dir.is_dir(),
        "--model `{}` does not exist (or is not a directory)",
        dir.display()
    );
    for file in ["config.json", "tokenizer.json"] {
        anyhow::ensure!(
            dir.join(file).is_file(),
            "--model `{}` has no {file}: not a Hugging Face model directory",
            dir.display()
        );
    }
    Ok(())
}

fn generate(args: &GenerateArgs) -> Result<(), Failure> {
    let device = resolve_device(&args.device)?;
    let text = prompt_text(args)?;
    if text.is_empty() && args.images.is_empty() {
        return Err(Failure::Usage(
            "nothing to generate from: give --prompt TEXT and/or --image FILE".into(),
        ));
    }
    let message = user_message(&text, args.images.len())?;
    let dir = &flowrl_models::hub::resolve_model_path(&args.model)
        .map_err(|e| anyhow!("--model {e:#}"))?;
    check_model_dir(dir)?;
    if !args.images.is_empty() && !dir.join("preprocessor_config.json").is_file() {
        return Err(anyhow!(
            "--image given, but `{}` has no image processor (no preprocessor_config.json): the model reads text only",
            dir.display()
        )
        .into());
    }
    // Decoded like a dataset's images (errors name the file).
    let images = args
        .images
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path)
                .with_context(|| format!("cannot read --image `{}`", path.display()))?;
            flowrl_datasets::images::decode_rgb(&bytes)
                .map_err(|msg| anyhow!("--image `{}`: {msg}", path.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let decoding = Decoding::defaults_of(dir)?.with_flags(args);
    if decoding.greedy && (args.top_p.is_some() || args.top_k.is_some()) {
        eprintln!(
            "warning: --top-p and --top-k have no effect on greedy decoding (sample with --temperature T > 0)"
        );
    }

    let encoder = PromptEncoder::from_model_dir(dir)
        .with_context(|| format!("loading the prompt encoder of {}", dir.display()))?;
    let multimodal = encoder.processor.is_some();
    let messages = vec![message];
    let encoded = encoder
        .encode(&messages, &images, multimodal)
        .context("encoding the prompt")?;
    let prompt_len = encoded.input_ids.len();
    if let Some(context) = context_length_of(dir) {
        let total = prompt_len + decoding.max_new_tokens;
        if total > context {
            let fix = if prompt_len < context {
                format!("give --max-new-tokens {} or less", context - prompt_len)
            } else {
                "shorten the prompt".to_string()
            };
            return Err(anyhow!(
                "the prompt is {prompt_len} tokens ({} of them image tokens); + max_new_tokens {} = {total} \
                 exceeds the context of `{}` ({context} tokens, config.json max_position_embeddings): {fix}",
                encoded.num_image_tokens,
                decoding.max_new_tokens,
                dir.display()
            )
            .into());
        }
    }

    let precision = match &args.precision {
        Some(p) => Precision::parse(p)?,
        None => BackendKind::of(device)?.default_precision(),
    };
    let name = dir.display().to_string();
    let started = Instant::now();
    let lora = match &args.adapter {
        Some(adapter) => {
            let (config, stored) = flowrl_models::lora::read_peft_adapter(adapter)?;
            Some((config, flowrl_models::lora::AdapterInit::Stored(stored)))
        }
        None => None,
    };
    let model =
        ModelResource::load_with_lora(&name, dir, false, None, device, Some(precision), lora)?;
    let load_seconds = started.elapsed().as_secs_f64();

    let prompt_text = encoded.text.clone();
    let num_image_tokens = encoded.num_image_tokens;
    let prompt = Prompt {
        uid: "generate".into(),
        input_ids: encoded.input_ids,
        images: encoded.images,
        pictures: images.into_iter().map(Arc::new).collect(),
        messages,
        text: encoded.text,
        ground_truth: String::new(),
        data_source: String::new(),
        ability: None,
        extra_info: Json::Null,
        source: RowRef {
            file: PathBuf::from("--prompt"),
            row: 0,
        },
    };
    let prompts = Arc::new(PromptBatch::encoded_by(&encoder, vec![prompt], 0));
    let params = RolloutParams {
        model: name,
        n: 1,
        max_new_tokens: decoding.max_new_tokens,
        temperature: decoding.temperature,
        top_p: decoding.top_p,
        top_k: decoding.top_k,
        greedy: decoding.greedy,
        stop: args.stop.clone(),
        kv_cache_gib: KV_CACHE_GIB,
        max_num_batched_tokens: MAX_NUM_BATCHED_TOKENS,
    };
    params.sampling().validate()?;
    let stop_ids = stop_token_ids(&model, &params.stop)?;
    let started = Instant::now();
    let rollouts = sample_rollouts_seeded(
        &model,
        &prompts,
        &params,
        &stop_ids,
        &Replicas::single(device),
        args.seed,
    )?;
    let seconds = started.elapsed().as_secs_f64();

    let response_ids = &rollouts.response_ids[0];
    let n = response_ids.len();
    let log_probs = &rollouts.sampling_log_probs.row(0)[..n];
    let text = &rollouts.response_text[0];
    let finish_reason = if rollouts.truncated[0] {
        "length"
    } else {
        "stop"
    };
    let tokens_per_second = n as f64 / seconds.max(1e-9);
    let precision_name = precision.name();
    if args.json {
        let out = json!({
            "model": dir,
            "device": device.to_string(),
            "precision": precision_name,
            "prompt_text": prompt_text,
            "prompt_ids": rollouts.prompt_ids[0],
            "prompt_length": rollouts.prompt_ids[0].len(),
            "num_image_tokens": num_image_tokens,
            "response_ids": response_ids,
            "response_log_probs": log_probs,
            "response_length": n,
            "text": text,
            "finish_reason": finish_reason,
            "stopped": !rollouts.truncated[0],
            "decoding": {
                "greedy": decoding.greedy,
                "temperature": decoding.temperature,
                "top_p": decoding.top_p,
                "top_k": decoding.top_k,
                "max_new_tokens": decoding.max_new_tokens,
                "stop": args.stop,
                "seed": args.seed,
                "defaults": decoding.defaults,
            },
            "seconds": seconds,
            "load_seconds": load_seconds,
            "tokens_per_second": tokens_per_second,
        });
        print_line(&out.to_string())?;
    } else {
        print_line(text)?;
        let why = if finish_reason == "stop" {
            "stopped at EOS or a stop token"
        } else {
            "cut at max_new_tokens"
        };
        eprintln!(
            "({n} tokens, {why}; {seconds:.2} s, {tokens_per_second:.1} tokens/s on {device}, {precision_name})"
        );
    }
    Ok(())
}
