//! `bench-make-model CONFIG OUT_DIR [SEED]`: writes the benchmark's random Qwen2-VL-architecture
//! model once as a Hugging Face directory, so that flowrl and transformers/TRL load the same numbers.
//!
//! The weights come from `flowrl_models::Model::random` (normal(0, initializer_range), zero biases,
//! unit norms; deterministic in the seed) and are written by `Model::save` (F32 safetensors, the
//! HF layout that `Qwen2VLForConditionalGeneration.from_pretrained` reads). The tokenizer and chat
//! template are copied from `assets/tiny-qwen2-vl` (their special-token ids match the config's),
//! the image processor from `bench/preprocessor_config.json`. This binary does nothing else: timing lives in `bench/run.sh`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::backend::Flex;
use flowrl_models::Model;

/// Tokenizer files (with the chat template) that both sides read, from `assets/tiny-qwen2-vl`.
const TOKENIZER_FILES: [&str; 2] = ["tokenizer.json", "tokenizer_config.json"];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        bail!("usage: bench-make-model CONFIG_JSON OUT_DIR [SEED]");
    }
    let config =
        std::fs::read_to_string(&args[0]).with_context(|| format!("reading {}", args[0]))?;
    let out = PathBuf::from(&args[1]);
    let seed: u64 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(0);
    let device = Default::default();
    let model = Model::<Flex>::random(&config, &device, seed)?;
    std::fs::create_dir_all(&out)?;
    model.save(&out, None)?;
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/tiny-qwen2-vl");
    for f in TOKENIZER_FILES {
        std::fs::copy(assets.join(f), out.join(f))
            .with_context(|| format!("copying {f} from {}", assets.display()))?;
    }
    // transformers' processors read the chat template from `chat_template.jinja` only.
    let tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json"))?)?;
    let template = tok["chat_template"]
        .as_str()
        .context("tokenizer_config.json has no chat_template")?;
    std::fs::write(out.join("chat_template.jinja"), template)?;
    // The image processor of the tiny asset with `longest_edge` raised to 224² pixels, so a
    // 224×224 image keeps its size: 16×16 patches, 64 image tokens.
    let processor = Path::new(env!("CARGO_MANIFEST_DIR")).join("preprocessor_config.json");
    std::fs::copy(&processor, out.join("preprocessor_config.json"))
        .with_context(|| format!("copying {}", processor.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}
