//! The `flowrl data` subcommands: `inspect` (look at a prompt file before a long job) and `synth`
//! (regenerate the embedded task and the tiny models' tokenizer). The binary parses arguments
//! with [`DataCommand`] and calls [`run`]; the functions write to any `Write` so they are testable.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};

use crate::dataset::decode_row_images;
use crate::encoder::PromptEncoder;
use crate::images::EncodedFormat;
use crate::verl::{ReadOptions, VerlColumns, read_verl_file, summarize_file};

/// `flowrl data …`
#[derive(Debug, Clone, Subcommand)]
pub enum DataCommand {
    /// Schema, row and image counts, and the first rows rendered through a model's chat template.
    Inspect(InspectArgs),
    /// Generate the embedded "shapes" task (train/test parquet) and the tiny models' tokenizer.
    Synth(SynthArgs),
}

/// `flowrl data inspect FILE [--model DIR]`
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// A verl-format parquet file.
    pub file: PathBuf,
    /// A Hugging Face model directory whose chat template, tokenizer and image processor render
    /// the rows.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// How many rows to show.
    #[arg(long, default_value_t = 3)]
    pub rows: usize,
    /// Column with the chat messages.
    #[arg(long, default_value = "prompt")]
    pub prompt_key: String,
    /// Column with the images ("" for text-only data).
    #[arg(long, default_value = "images")]
    pub image_key: String,
    /// How many failing rows to list (the rest are counted).
    #[arg(long, default_value_t = 20)]
    pub max_errors: usize,
}

/// `flowrl data synth --out DIR --seed S --train N --test M`
#[derive(Debug, Clone, Args)]
pub struct SynthArgs {
    /// Directory for train.parquet and test.parquet.
    #[arg(long, default_value = "datasets/shapes")]
    pub out: PathBuf,
    /// Directory for the tokenizer files (tokenizer.json, tokenizer_config.json, ...).
    #[arg(long, default_value = "assets/tokenizer")]
    pub tokenizer_out: PathBuf,
    /// Also write the Gemma 4 flavour of the tokenizer (Gemma's special tokens and turn template)
    /// into this directory (the committed one is `assets/tokenizer-gemma4`).
    #[arg(long)]
    pub gemma4_tokenizer_out: Option<PathBuf>,
    #[arg(long, default_value_t = crate::synth::DEFAULT_SEED)]
    pub seed: u64,
    #[arg(long, default_value_t = crate::synth::DEFAULT_TRAIN)]
    pub train: usize,
    #[arg(long, default_value_t = crate::synth::DEFAULT_TEST)]
    pub test: usize,
}

/// Runs a `flowrl data` subcommand, printing to stdout.
pub fn run(cmd: &DataCommand) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match cmd {
        DataCommand::Inspect(a) => inspect(a, &mut out),
        DataCommand::Synth(a) => synth(a, &mut out),
    }
}

fn shorten(s: &str, max: usize) -> String {
    let s = s.replace('\n', "\\n");
    if s.chars().count() <= max {
        s
    } else {
        let head: String = s.chars().take(max).collect();
        format!("{head}…")
    }
}

/// `flowrl data inspect`: see [`DataCommand::Inspect`].
pub fn inspect(args: &InspectArgs, out: &mut dyn Write) -> Result<()> {
    let summary = summarize_file(&args.file)?;
    writeln!(out, "file: {}", args.file.display())?;
    writeln!(
        out,
        "rows: {}   row groups: {}",
        summary.num_rows, summary.num_row_groups
    )?;
    writeln!(out, "columns:")?;
    for (name, ty) in &summary.columns {
        writeln!(out, "  {name}: {ty}")?;
    }
    let columns = VerlColumns {
        prompt_key: args.prompt_key.clone(),
        image_key: (!args.image_key.is_empty()).then(|| args.image_key.clone()),
        ..VerlColumns::default()
    };
    let options = ReadOptions {
        columns,
        skip_mismatched_rows: true,
        check_images: true,
        verl_image_patch_size: None,
    };
    let file = read_verl_file(&args.file, &options)?;
    let num_images: usize = file.rows.iter().map(|r| r.images.len()).sum();
    let mut formats: BTreeMap<String, usize> = BTreeMap::new();
    let mut sources: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &file.rows {
        *sources.entry(&r.data_source).or_default() += 1;
        for img in &r.images {
            let f = EncodedFormat::sniff(&img.bytes).map_or("?", EncodedFormat::name);
            *formats.entry(f.to_string()).or_default() += 1;
        }
    }
    writeln!(
        out,
        "images: {num_images} ({})",
        formats
            .iter()
            .map(|(f, n)| format!("{f}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    writeln!(
        out,
        "data_source: {}",
        sources
            .iter()
            .map(|(s, n)| format!("{s} ({n})"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    if file.skipped.is_empty() {
        writeln!(out, "placeholder/image count mismatches: 0")?;
    } else {
        writeln!(
            out,
            "placeholder/image count mismatches: {} (these rows fail to load unless skip_mismatched_rows is set)",
            file.skipped.len()
        )?;
        for s in file.skipped.iter().take(args.max_errors) {
            writeln!(out, "  row {}: {}", s.source.row, s.reason)?;
        }
        if file.skipped.len() > args.max_errors {
            writeln!(
                out,
                "  ... and {} more",
                file.skipped.len() - args.max_errors
            )?;
        }
    }

    let encoder = match &args.model {
        Some(dir) => Some(Arc::new(PromptEncoder::from_model_dir(dir)?)),
        None => None,
    };
    let mut lengths = Vec::new();
    if let Some(enc) = &encoder {
        for r in &file.rows {
            let images = decode_row_images(r, &options)?;
            let e = enc.encode(&r.messages, &images, options.columns.image_key.is_some())?;
            lengths.push(e.input_ids.len());
        }
        if !lengths.is_empty() {
            let max = lengths.iter().max().unwrap();
            let mean = lengths.iter().sum::<usize>() as f64 / lengths.len() as f64;
            writeln!(
                out,
                "prompt tokens (with image tokens): mean {mean:.1}, max {max}"
            )?;
        }
    }
    for r in file.rows.iter().take(args.rows) {
        writeln!(out, "--- row {}", r.source.row)?;
        for m in &r.messages {
            writeln!(out, "  {}: {}", m.role, shorten(&m.content, 160))?;
        }
        for (k, img) in r.images.iter().enumerate() {
            let f = EncodedFormat::sniff(&img.bytes).map_or("?", EncodedFormat::name);
            let rgb = crate::images::decode_rgb(&img.bytes).map_err(anyhow::Error::msg)?;
            writeln!(
                out,
                "  image {k}: {f} {}x{} ({} bytes)",
                rgb.width(),
                rgb.height(),
                img.bytes.len()
            )?;
        }
        writeln!(out, "  ground_truth: {}", r.ground_truth)?;
        if let Some(enc) = &encoder {
            let images = decode_row_images(r, &options)?;
            let e = enc.encode(&r.messages, &images, options.columns.image_key.is_some())?;
            writeln!(out, "  rendered: {}", shorten(&e.text, 400))?;
            writeln!(
                out,
                "  tokens: {} ({} image tokens in {} image(s))",
                e.input_ids.len(),
                e.num_image_tokens,
                e.images.len()
            )?;
        }
    }
    // A check, not only a report: rows that `flowrl run` would refuse make the command fail.
    if !file.skipped.is_empty() {
        bail!(
            "{}: {} row(s) fail to load (placeholder/image count mismatches, listed above)",
            args.file.display(),
            file.skipped.len()
        );
    }
    Ok(())
}

/// `flowrl data synth`: see [`DataCommand::Synth`].
pub fn synth(args: &SynthArgs, out: &mut dyn Write) -> Result<()> {
    let report = crate::synth::synthesize(
        &args.out,
        &args.tokenizer_out,
        args.seed,
        args.train,
        args.test,
    )?;
    writeln!(
        out,
        "wrote {} ({} rows) and {} ({} rows); tokenizer ({} ids) in {}",
        args.out.join("train.parquet").display(),
        report.train_rows,
        args.out.join("test.parquet").display(),
        report.test_rows,
        report.vocab_size,
        args.tokenizer_out.display()
    )?;
    if let Some(dir) = &args.gemma4_tokenizer_out {
        let tokenizer = crate::synth::write_gemma4_tokenizer_dir(dir)?;
        writeln!(
            out,
            "Gemma 4 tokenizer ({} ids) in {}",
            tokenizer.get_vocab_size(true),
            dir.display()
        )?;
    }
    Ok(())
}
