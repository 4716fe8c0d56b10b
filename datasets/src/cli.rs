//! The `flowrl data` subcommands: `inspect` (look at a prompt file before a long job) and `synth`
//! (regenerate the embedded task and the tiny models' tokenizer). The binary parses arguments
//! with [`DataCommand`] and calls [`run`]; the functions write to any `Write` so they are testable.
//! `inspect --json` prints one JSON document for scripts (its fields are listed in the README).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};

use serde_json::{Value as Json, json};

use crate::dataset::{decode_row_images, decode_row_videos};
use crate::encoder::PromptEncoder;
use crate::error::DataError;
use crate::images::EncodedFormat;
use crate::verl::{
    FileSummary, ReadOptions, VerlColumns, VerlFile, check_verl_file, summarize_file,
};

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
    /// Print one JSON document (counts, columns, image and token stats, the failing rows) for
    /// scripts instead of the text report; the exit status is the same.
    #[arg(long)]
    pub json: bool,
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
    /// `shapes` (the default task; writes the tokenizer too) or `zoom` (the tool task: small
    /// shapes in a large picture, reference turns that call zoom_in; `--out datasets/shapes_zoom`)
    #[arg(long, default_value = "shapes", value_parser = ["shapes", "zoom"])]
    pub task: String,
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

/// One row that would fail to load: its row number in the file, the column when one is to blame,
/// and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct BadRow {
    pub row: usize,
    pub column: Option<String>,
    pub message: String,
}

impl BadRow {
    fn from_error(e: DataError) -> Self {
        Self {
            row: e.row.unwrap_or(0),
            column: e.column,
            message: e.message,
        }
    }

    fn json(&self) -> Json {
        json!({ "row": self.row, "column": self.column, "message": self.message })
    }
}

impl std::fmt::Display for BadRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.column {
            Some(c) => write!(f, "row {}, column `{c}`: {}", self.row, self.message),
            None => write!(f, "row {}: {}", self.row, self.message),
        }
    }
}

/// `flowrl data inspect`: see [`DataCommand::Inspect`]. Every row that would fail to load
/// (placeholder/image count mismatches, null or malformed values, undecodable images, and with
/// `--model` prompts the model cannot encode) is listed, at most `max_errors` of them with a
/// count of the rest, and makes the command fail. With `json`, `out` receives one JSON document
/// (see the README), also when the file cannot be read at all.
pub fn inspect(args: &InspectArgs, out: &mut dyn Write) -> Result<()> {
    if !args.json {
        return inspect_text(args, out);
    }
    match collect(args) {
        Ok(report) => {
            writeln!(out, "{}", serde_json::to_string_pretty(&report.json(args))?)?;
            report.result(args)
        }
        Err(e) => {
            let error = match e.downcast_ref::<DataError>() {
                Some(d) => json!({ "row": d.row, "column": d.column, "message": d.message }),
                None => json!({ "row": null, "column": null, "message": format!("{e:#}") }),
            };
            let doc =
                json!({ "file": args.file.display().to_string(), "ok": false, "error": error });
            writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
            Err(e)
        }
    }
}

/// What `flowrl data inspect` finds in a file.
struct Report {
    summary: FileSummary,
    options: ReadOptions,
    file: VerlFile,
    /// Mismatches, bad values and (with a model) encoding failures, by row.
    bad: Vec<BadRow>,
    encoder: Option<Arc<PromptEncoder>>,
    /// Prompt tokens of each loaded row (with a model).
    lengths: Vec<usize>,
    /// Image count per format name (`PNG`, `JPEG`, `?`).
    formats: BTreeMap<String, usize>,
    sources: BTreeMap<String, usize>,
}

fn collect(args: &InspectArgs) -> Result<Report> {
    let summary = summarize_file(&args.file)?;
    let columns = VerlColumns {
        prompt_key: args.prompt_key.clone(),
        image_key: (!args.image_key.is_empty()).then(|| args.image_key.clone()),
        ..VerlColumns::default()
    };
    let options = ReadOptions {
        columns,
        skip_mismatched_rows: true,
        skip_bad_rows: false,
        check_images: true,
        verl_image_patch_size: None,
        video: Default::default(),
    };
    let (mut file, errors) = check_verl_file(&args.file, &options)?;
    let mut bad: Vec<BadRow> = errors.into_iter().map(BadRow::from_error).collect();
    bad.extend(file.skipped.iter().map(|s| BadRow {
        row: s.source.row,
        column: None,
        message: s.reason.clone(),
    }));
    let encoder = match &args.model {
        Some(dir) => Some(Arc::new(PromptEncoder::from_model_dir(dir)?)),
        None => None,
    };
    let mut lengths = Vec::new();
    if let Some(enc) = &encoder {
        let mut kept = Vec::with_capacity(file.rows.len());
        for r in std::mem::take(&mut file.rows) {
            let encoded = encode_row(enc, &r, &options);
            match encoded {
                Ok(e) => {
                    lengths.push(e.input_ids.len());
                    kept.push(r);
                }
                Err(message) => bad.push(BadRow {
                    row: r.source.row,
                    column: Some(args.prompt_key.clone()),
                    message,
                }),
            }
        }
        file.rows = kept;
    }
    bad.sort_by_key(|b| b.row);
    let mut formats: BTreeMap<String, usize> = BTreeMap::new();
    let mut sources: BTreeMap<String, usize> = BTreeMap::new();
    for r in &file.rows {
        *sources.entry(r.data_source.clone()).or_default() += 1;
        for img in &r.images {
            let f = EncodedFormat::sniff(&img.bytes).map_or("?", EncodedFormat::name);
            *formats.entry(f.to_string()).or_default() += 1;
        }
    }
    Ok(Report {
        summary,
        options,
        file,
        bad,
        encoder,
        lengths,
        formats,
        sources,
    })
}

/// A row's pictures and videos decoded and encoded as the dataset node does.
fn encode_row(
    enc: &PromptEncoder,
    r: &crate::verl::VerlRow,
    options: &ReadOptions,
) -> Result<crate::EncodedPrompt, String> {
    let images = decode_row_images(r, options).map_err(|e| e.message)?;
    let videos = decode_row_videos(r, options).map_err(|e| e.message)?;
    let multimodal = options.columns.image_key.is_some() || !videos.is_empty();
    enc.encode_media(&r.messages, &images, &videos, multimodal)
        .map_err(|e| format!("the model cannot encode this prompt: {e:#}"))
}

/// `(frames, width, height)` of each stored video of a row (as stored, before sampling).
fn video_shapes(r: &crate::verl::VerlRow) -> Vec<(usize, u32, u32)> {
    r.videos
        .iter()
        .map(|v| {
            let (w, h) = v
                .frames
                .first()
                .and_then(|f| crate::images::decode_rgb(&f.bytes).ok())
                .map_or((0, 0), |rgb| rgb.dimensions());
            (v.frames.len(), w, h)
        })
        .collect()
}

impl Report {
    fn num_images(&self) -> usize {
        self.file.rows.iter().map(|r| r.images.len()).sum()
    }

    /// `(videos, frames)` over the loaded rows.
    fn num_videos(&self) -> (usize, usize) {
        let videos = self.file.rows.iter().map(|r| r.videos.len()).sum();
        let frames = self
            .file
            .rows
            .iter()
            .flat_map(|r| &r.videos)
            .map(|v| v.frames.len())
            .sum();
        (videos, frames)
    }

    /// `(mean, max)` prompt tokens.
    fn token_stats(&self) -> Option<(f64, usize)> {
        let max = *self.lengths.iter().max()?;
        let mean = self.lengths.iter().sum::<usize>() as f64 / self.lengths.len() as f64;
        Some((mean, max))
    }

    /// The command's outcome: rows that `flowrl run` would refuse make it fail.
    fn result(&self, args: &InspectArgs) -> Result<()> {
        if !self.bad.is_empty() {
            bail!(
                "{}: {} row(s) fail to load (listed above)",
                args.file.display(),
                self.bad.len()
            );
        }
        Ok(())
    }

    fn json(&self, args: &InspectArgs) -> Json {
        let mismatches = self.file.skipped.len();
        let sample: Vec<Json> = self
            .file
            .rows
            .iter()
            .take(args.rows)
            .map(|r| {
                let images: Vec<Json> = r
                    .images
                    .iter()
                    .map(|img| {
                        let f = EncodedFormat::sniff(&img.bytes).map_or("?", EncodedFormat::name);
                        let (w, h) = crate::images::decode_rgb(&img.bytes)
                            .map_or((0, 0), |rgb| rgb.dimensions());
                        json!({ "format": f, "width": w, "height": h, "bytes": img.bytes.len() })
                    })
                    .collect();
                let videos: Vec<Json> = video_shapes(r)
                    .into_iter()
                    .map(|(n, w, h)| json!({ "frames": n, "width": w, "height": h }))
                    .collect();
                let mut row = json!({
                    "row": r.source.row,
                    "messages": r.messages.iter().map(|m| json!({ "role": m.role, "content": m.content })).collect::<Vec<_>>(),
                    "images": images,
                    "videos": videos,
                    "ground_truth": r.ground_truth,
                    "data_source": r.data_source,
                });
                if let Some(enc) = &self.encoder
                    && let Ok(e) = encode_row(enc, r, &self.options)
                {
                    row["rendered"] = json!(e.text);
                    row["tokens"] = json!(e.input_ids.len());
                    row["image_tokens"] = json!(e.num_image_tokens);
                    row["vision_inputs"] = json!(e.images.iter().map(|i| json!({
                        "kind": if i.video.is_some() { "video" } else { "image" },
                        "grid": i.grid,
                        "tokens": i.num_tokens,
                    })).collect::<Vec<_>>());
                }
                row
            })
            .collect();
        json!({
            "file": args.file.display().to_string(),
            "ok": self.bad.is_empty(),
            "rows": self.summary.num_rows,
            "row_groups": self.summary.num_row_groups,
            "columns": self.summary.columns.iter().map(|(n, t)| json!({ "name": n, "type": t })).collect::<Vec<_>>(),
            "loaded_rows": self.file.rows.len(),
            "images": { "count": self.num_images(), "formats": self.formats },
            "videos": { "count": self.num_videos().0, "frames": self.num_videos().1 },
            "data_source": self.sources,
            "prompt_tokens": self.token_stats().map(|(mean, max)| json!({ "mean": mean, "max": max })),
            "bad_rows": {
                "count": self.bad.len(),
                "placeholder_mismatches": mismatches,
                "listed": self.bad.iter().take(args.max_errors).map(BadRow::json).collect::<Vec<_>>(),
                "more": self.bad.len().saturating_sub(args.max_errors),
            },
            "sample": sample,
        })
    }
}

fn inspect_text(args: &InspectArgs, out: &mut dyn Write) -> Result<()> {
    let report = collect(args)?;
    let summary = &report.summary;
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
    writeln!(
        out,
        "images: {} ({})",
        report.num_images(),
        report
            .formats
            .iter()
            .map(|(f, n)| format!("{f}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    let (videos, frames) = report.num_videos();
    if videos > 0 {
        writeln!(out, "videos: {videos} ({frames} frames)")?;
    }
    writeln!(
        out,
        "data_source: {}",
        report
            .sources
            .iter()
            .map(|(s, n)| format!("{s} ({n})"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    let mismatches = report.file.skipped.len();
    if mismatches == 0 {
        writeln!(out, "placeholder/image count mismatches: 0")?;
    } else {
        writeln!(
            out,
            "placeholder/image count mismatches: {mismatches} (these rows fail to load unless skip_mismatched_rows is set)"
        )?;
    }
    let others = report.bad.len() - mismatches;
    if others > 0 {
        writeln!(out, "other rows that fail to load: {others}")?;
    }
    for b in report.bad.iter().take(args.max_errors) {
        writeln!(out, "  {b}")?;
    }
    if report.bad.len() > args.max_errors {
        writeln!(out, "  ... and {} more", report.bad.len() - args.max_errors)?;
    }
    if let Some((mean, max)) = report.token_stats() {
        writeln!(
            out,
            "prompt tokens (with image tokens): mean {mean:.1}, max {max}"
        )?;
    }
    for r in report.file.rows.iter().take(args.rows) {
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
        for (k, (n, w, h)) in video_shapes(r).into_iter().enumerate() {
            writeln!(out, "  video {k}: {n} frames {w}x{h}")?;
        }
        writeln!(out, "  ground_truth: {}", r.ground_truth)?;
        if let Some(enc) = &report.encoder {
            let e = encode_row(enc, r, &report.options).map_err(anyhow::Error::msg)?;
            writeln!(out, "  rendered: {}", shorten(&e.text, 400))?;
            let videos: Vec<_> = e.images.iter().filter(|i| i.video.is_some()).collect();
            if videos.is_empty() {
                writeln!(
                    out,
                    "  tokens: {} ({} image tokens in {} image(s))",
                    e.input_ids.len(),
                    e.num_image_tokens,
                    e.images.len()
                )?;
            } else {
                writeln!(
                    out,
                    "  tokens: {} ({} vision tokens in {} image(s) and {} video(s))",
                    e.input_ids.len(),
                    e.num_image_tokens,
                    e.images.len() - videos.len(),
                    videos.len()
                )?;
                for (k, v) in videos.iter().enumerate() {
                    writeln!(
                        out,
                        "  video {k}: grid {:?} (temporal patches × patch rows × patch columns), {} tokens",
                        v.grid, v.num_tokens
                    )?;
                }
            }
        }
    }
    report.result(args)
}

/// `flowrl data synth`: see [`DataCommand::Synth`].
pub fn synth(args: &SynthArgs, out: &mut dyn Write) -> Result<()> {
    if args.task == "zoom" {
        crate::synth::write_splits(
            &args.out,
            args.seed,
            args.train,
            args.test,
            crate::synth::zoom_sample,
        )?;
        writeln!(
            out,
            "wrote {} ({} rows) and {} ({} rows) of the zoom task",
            args.out.join("train.parquet").display(),
            args.train,
            args.out.join("test.parquet").display(),
            args.test,
        )?;
        return Ok(());
    }
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
