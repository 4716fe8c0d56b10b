//! Prompt datasets and batches: verl files → encoded prompts → [`PromptBatch`] values (the
//! `Prompts` port type), with verl's data options.
//!
//! - `filter_overlong_prompts`: rows whose encoded length (image tokens included, as verl's
//!   `RLHFDataset.maybe_filter_out_long_prompts` measures it with the processor) exceeds
//!   `max_prompt_length` are dropped at load, and counted.
//! - `truncation` for rows still too long: `error` (the default: fail at load, naming file and
//!   row), `left` (keep the last `max_prompt_length` tokens) or `right` (keep the first), as verl's
//!   `truncation` option. Truncation never cuts image tokens: that is an error, because the
//!   image features would no longer match the prompt.
//! - Batches are `batch_size` prompts of one epoch; the last incomplete batch of an epoch is
//!   dropped (verl's train dataloader uses `drop_last=True`). The order of epoch `e` is the
//!   identity, or with `shuffle` a Fisher–Yates permutation driven by SplitMix64 seeded with
//!   `seed ⊕ (e · 0x9E3779B97F4A7C15)`: stable across platforms and library versions.
//! - [`DataPosition`] (epoch, cursor, seed) is all the state: restoring it reproduces the next batch.
//!
//! Encoded pictures are not kept in memory between batches: each batch decodes and processes its
//! images again (deterministically), so large datasets cost only their encoded bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use flowrl_models::capabilities::{PaddedBatch, ProcessedImage, VideoFrames};
use image::RgbImage;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::encoder::{EncodedPrompt, PromptEncoder};
use crate::error::DataError;
use crate::rng::SplitMix64;
use crate::verl::{ChatMessage, ReadOptions, RowRef, SkippedRow, VerlRow, read_verl_file};

/// What to do with a prompt longer than `max_prompt_length` that was not filtered out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Truncation {
    /// Fail, naming file and row.
    #[default]
    Error,
    /// Keep the last `max_prompt_length` tokens.
    Left,
    /// Keep the first `max_prompt_length` tokens.
    Right,
}

impl std::str::FromStr for Truncation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "error" => Ok(Self::Error),
            "left" => Ok(Self::Left),
            "right" => Ok(Self::Right),
            other => Err(format!(
                "unknown truncation `{other}` (expected error, left or right)"
            )),
        }
    }
}

/// Options of a [`PromptDataset`] (verl's `data.*` names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DatasetOptions {
    pub read: ReadOptions,
    pub max_prompt_length: usize,
    pub truncation: Truncation,
    pub filter_overlong_prompts: bool,
    pub batch_size: usize,
    pub shuffle: bool,
    pub seed: u64,
}

impl Default for DatasetOptions {
    fn default() -> Self {
        Self {
            read: ReadOptions::default(),
            max_prompt_length: 1024,
            truncation: Truncation::Error,
            filter_overlong_prompts: true,
            batch_size: 8,
            shuffle: true,
            seed: 1,
        }
    }
}

/// Where the dataset stands: the next batch starts at `cursor` of epoch `epoch`'s order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    pub epoch: u64,
    pub cursor: usize,
    pub seed: u64,
}

/// One prompt on a `Prompts` edge.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// Unique within a run: `e{epoch}-{index in the epoch's order}` (GRPO groups responses by it).
    pub uid: String,
    /// Token ids, image placeholders expanded.
    pub input_ids: Vec<u32>,
    /// Processed pictures and videos, in `<image>`/`<video>` placeholder order (a video has
    /// [`ProcessedImage::video`] set).
    pub images: Vec<ProcessedImage>,
    /// The prompt's pictures as decoded (after verl's pre-processor resize when the dataset
    /// applies it), in `<image>` order, before the image processor: what tools that look at
    /// the picture (crop, zoom, rotate) work on.
    pub pictures: Vec<Arc<RgbImage>>,
    /// The file's messages (multi-turn rollouts continue the conversation from them).
    pub messages: Vec<ChatMessage>,
    /// The rendered chat template before expansion.
    pub text: String,
    pub ground_truth: String,
    pub data_source: String,
    pub ability: Option<String>,
    pub extra_info: Json,
    pub source: RowRef,
}

/// A batch of prompts: the value of the `Prompts` port type.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptBatch {
    pub prompts: Vec<Prompt>,
    /// Id used to left-pad rows.
    pub pad_token_id: u32,
    /// Id of the expanded image token, when the model has an image processor.
    pub image_token_id: Option<u32>,
    /// The epoch the batch was drawn from.
    pub epoch: u64,
}

/// Serialized as a summary for sinks and logs: per prompt the uid, rendered text, token ids,
/// ground truth, data source, extra info, source row and each image's grid and token count
/// (pixel values are left out).
impl Serialize for PromptBatch {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let prompts: Vec<Json> = self
            .prompts
            .iter()
            .map(|p| {
                serde_json::json!({
                    "uid": p.uid,
                    "text": p.text,
                    "input_ids": p.input_ids,
                    "ground_truth": p.ground_truth,
                    "data_source": p.data_source,
                    "extra_info": p.extra_info,
                    "source": p.source,
                    "images": p.images.iter().map(|i| serde_json::json!({
                        "grid": i.grid, "num_tokens": i.num_tokens,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        serde_json::json!({
            "epoch": self.epoch,
            "pad_token_id": self.pad_token_id,
            "image_token_id": self.image_token_id,
            "prompts": prompts,
        })
        .serialize(serializer)
    }
}

impl PromptBatch {
    /// A batch of `prompts` that `encoder` encoded (drawn from `epoch`): rows are padded with the
    /// encoder's pad token (id 0 when it has none), images stand for its image token.
    pub fn encoded_by(encoder: &PromptEncoder, prompts: Vec<Prompt>, epoch: u64) -> Self {
        Self {
            prompts,
            pad_token_id: encoder.pad_token_id.unwrap_or(0),
            image_token_id: encoder.image_token_id(),
            epoch,
        }
    }

    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty()
    }

    /// The prompts left-padded with `pad_token_id` (generation appends on the right).
    pub fn padded(&self) -> PaddedBatch {
        let rows: Vec<Vec<u32>> = self.prompts.iter().map(|p| p.input_ids.clone()).collect();
        PaddedBatch::left_pad(&rows, self.pad_token_id)
    }

    /// All processed images, row-major over the batch (the order vision towers expect).
    pub fn images(&self) -> Vec<ProcessedImage> {
        self.prompts
            .iter()
            .flat_map(|p| p.images.iter().cloned())
            .collect()
    }
}

/// A row kept after loading, with its encoded ids.
#[derive(Debug, Clone)]
struct Record {
    row: VerlRow,
    input_ids: Vec<u32>,
    text: String,
}

/// What loading did, for logs and `flowrl data inspect`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadReport {
    /// (file, rows in the file).
    pub files: Vec<(PathBuf, usize)>,
    /// Rows dropped by `skip_mismatched_rows`.
    pub skipped_mismatched: Vec<SkippedRow>,
    /// Rows dropped by `skip_bad_rows` (malformed values, undecodable images, ...).
    pub skipped_bad: Vec<SkippedRow>,
    /// Rows dropped by `filter_overlong_prompts`.
    pub filtered_overlong: usize,
    /// Rows shortened by `truncation`.
    pub truncated: usize,
    /// Longest kept prompt (tokens).
    pub max_length: usize,
}

/// An encoded, filtered prompt dataset that yields batches.
pub struct PromptDataset {
    encoder: Arc<PromptEncoder>,
    records: Vec<Record>,
    options: DatasetOptions,
    position: DataPosition,
    order: Vec<usize>,
    report: LoadReport,
}

/// Encodes a row as [`PromptDataset::load`] does: its pictures and videos decoded, its chat
/// rendered, tokenized and its placeholders expanded (errors name the file, row and column).
pub fn encode_row(
    encoder: &PromptEncoder,
    row: &VerlRow,
    options: &ReadOptions,
) -> Result<EncodedPrompt> {
    let images = decode_row_images(row, options)?;
    let videos = decode_row_videos(row, options)?;
    let multimodal = options.columns.image_key.is_some() || !videos.is_empty();
    encoder
        .encode_media(&row.messages, &images, &videos, multimodal)
        .map_err(|e| {
            DataError::cell(
                &row.source.file,
                row.source.row,
                &options.columns.prompt_key,
                format!("{e:#}"),
            )
            .into()
        })
}

/// Rows of a file's bad rows named in a load error.
const BAD_ROWS_SHOWN: usize = 3;

/// A bad row's error `e` with the file's other bad rows (its first [`BAD_ROWS_SHOWN`] and their
/// count, from reading it again with every check on) and the ways on: `flowrl data inspect`
/// lists them all, `skip_bad_rows` leaves them out.
fn with_the_bad_rows(e: anyhow::Error, path: &Path, read: &ReadOptions) -> anyhow::Error {
    let Some(first) = e.downcast_ref::<DataError>().filter(|d| d.row.is_some()) else {
        return e;
    };
    let all = ReadOptions {
        check_images: true,
        skip_bad_rows: false,
        ..read.clone()
    };
    let bad = match crate::verl::check_verl_file(path, &all) {
        Ok((_, bad)) if !bad.is_empty() => bad,
        _ => vec![first.clone()],
    };
    let shown: Vec<String> = bad
        .iter()
        .take(BAD_ROWS_SHOWN)
        .map(|b| format!("  {}", SkippedRow::of(b.clone()).describe()))
        .collect();
    let more = match bad.len().saturating_sub(BAD_ROWS_SHOWN) {
        0 => String::new(),
        n => format!("\n  ... and {n} more"),
    };
    anyhow::anyhow!(
        "{first}\n{} row(s) of {} cannot be loaded:\n{}{more}\n`flowrl data inspect {}` lists \
         them all; `skip_bad_rows = true` on the dataset node leaves them out (counted in \
         data/skipped_bad)",
        bad.len(),
        path.display(),
        shown.join("\n"),
        path.display()
    )
}

/// The sizes of a dataset's prompts, from the first rows of its first file ([`sample_sizes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptSizes {
    /// Rows encoded.
    pub rows: usize,
    /// The longest prompt, image tokens included, at most `max_prompt_length`.
    pub longest: usize,
    /// The most image (and video) tokens of a prompt.
    pub image_tokens: usize,
    /// The most pixel values (floats) of a prompt's processed pictures.
    pub pixel_values: usize,
}

/// Encodes the first `rows` rows of `path` (a prompt file of `options`) with `encoder`: the
/// longest prompt (capped at `max_prompt_length`, as the load caps or drops longer ones) and
/// the most image tokens and pixel values a prompt has.
pub fn sample_sizes(
    path: &Path,
    encoder: &PromptEncoder,
    options: &DatasetOptions,
    rows: usize,
) -> Result<PromptSizes> {
    let read = ReadOptions {
        check_images: false,
        ..options.read.clone()
    };
    let file = crate::verl::read_verl_head(path, &read, rows)?;
    let mut sizes = PromptSizes {
        rows: 0,
        longest: 0,
        image_tokens: 0,
        pixel_values: 0,
    };
    for row in file.rows.iter().take(rows) {
        let enc = encode_row(encoder, row, &options.read)?;
        sizes.rows += 1;
        sizes.longest = sizes
            .longest
            .max(enc.input_ids.len().min(options.max_prompt_length));
        sizes.image_tokens = sizes.image_tokens.max(enc.num_image_tokens);
        sizes.pixel_values = sizes
            .pixel_values
            .max(enc.images.iter().map(|i| i.pixel_values.len()).sum());
    }
    Ok(sizes)
}

/// Decodes the encoded pictures of a row (errors name file, row and image column), with verl's
/// pre-processor resize when [`ReadOptions::verl_image_patch_size`] is set.
pub fn decode_row_images(row: &VerlRow, options: &ReadOptions) -> Result<Vec<RgbImage>, DataError> {
    let col = options.columns.image_key.as_deref().unwrap_or("images");
    row.images
        .iter()
        .enumerate()
        .map(|(k, img)| {
            let rgb = crate::images::decode_rgb(&img.bytes).map_err(|m| {
                DataError::cell(
                    &row.source.file,
                    row.source.row,
                    col,
                    format!("image {k}: {m}"),
                )
            })?;
            Ok(match options.verl_image_patch_size {
                Some(p) => crate::images::verl_fetch_resize(&rgb, p),
                None => rgb,
            })
        })
        .collect()
}

/// Decodes and samples the videos of a row ([`crate::video::video_frames`]); errors name file,
/// row and video column.
pub fn decode_row_videos(
    row: &VerlRow,
    options: &ReadOptions,
) -> Result<Vec<VideoFrames>, DataError> {
    let col = options.columns.video_key.as_deref().unwrap_or("videos");
    let err = |msg: String| DataError::cell(&row.source.file, row.source.row, col, msg);
    row.videos
        .iter()
        .enumerate()
        .map(|(v, video)| {
            let frames = video
                .frames
                .iter()
                .enumerate()
                .map(|(k, f)| {
                    crate::images::decode_rgb(&f.bytes)
                        .map_err(|m| err(format!("video {v} frame {k}: {m}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            crate::video::video_frames(video, frames, &options.video)
                .map_err(|m| err(format!("video {v}: {m}")))
        })
        .collect()
}

impl PromptDataset {
    /// Reads, checks, encodes and filters every row of `paths` (in order).
    pub fn load(
        paths: &[PathBuf],
        encoder: Arc<PromptEncoder>,
        options: DatasetOptions,
    ) -> Result<Self> {
        anyhow::ensure!(options.batch_size > 0, "batch_size must be at least 1");
        anyhow::ensure!(
            options.max_prompt_length > 0,
            "max_prompt_length must be at least 1"
        );
        anyhow::ensure!(!paths.is_empty(), "no data files given");
        let mut report = LoadReport::default();
        let mut records = Vec::new();
        let vision_tokens: Vec<u32> = encoder
            .image_token_id()
            .into_iter()
            .chain(encoder.video_token_id())
            .collect();
        let prompt_col = options.read.columns.prompt_key.clone();
        // Images are decoded (and so checked) once below, with the same error messages.
        let read = ReadOptions {
            check_images: false,
            ..options.read.clone()
        };
        for path in paths {
            let file = read_verl_file(path, &read)
                .map_err(|e| with_the_bad_rows(e.into(), path, &read))?;
            report.files.push((path.clone(), file.num_rows));
            report.skipped_mismatched.extend(file.skipped);
            report.skipped_bad.extend(file.bad);
            for row in file.rows {
                let (file_path, r) = (row.source.file.clone(), row.source.row);
                let enc = match encode_row(&encoder, &row, &options.read) {
                    Ok(enc) => enc,
                    Err(e) => match e.downcast::<DataError>() {
                        Ok(e) if options.read.skip_bad_rows => {
                            report.skipped_bad.push(SkippedRow::of(e));
                            continue;
                        }
                        Ok(e) => return Err(with_the_bad_rows(e.into(), path, &read)),
                        Err(e) => return Err(e),
                    },
                };
                let mut ids = enc.input_ids;
                let max = options.max_prompt_length;
                if ids.len() > max {
                    if options.filter_overlong_prompts {
                        report.filtered_overlong += 1;
                        continue;
                    }
                    let kept = match options.truncation {
                        Truncation::Error => {
                            return Err(DataError::cell(
                                &file_path,
                                r,
                                &prompt_col,
                                format!(
                                    "the prompt is {} tokens, longer than max_prompt_length {max} \
                                     (truncation = \"error\"; set filter_overlong_prompts = true to drop such rows, \
                                     or truncation = \"left\" | \"right\")",
                                    ids.len()
                                ),
                            )
                            .into());
                        }
                        Truncation::Left => ids[ids.len() - max..].to_vec(),
                        Truncation::Right => ids[..max].to_vec(),
                    };
                    if !vision_tokens.is_empty() {
                        let count =
                            |ids: &[u32]| ids.iter().filter(|x| vision_tokens.contains(x)).count();
                        let (before, after) = (count(&ids), count(&kept));
                        if before != after {
                            return Err(DataError::cell(
                                &file_path,
                                r,
                                &prompt_col,
                                format!(
                                    "truncating the {}-token prompt to {max} tokens would cut {} of its {before} image tokens; \
                                     raise max_prompt_length or set filter_overlong_prompts = true",
                                    ids.len(),
                                    before - after
                                ),
                            )
                            .into());
                        }
                    }
                    report.truncated += 1;
                    ids = kept;
                }
                report.max_length = report.max_length.max(ids.len());
                records.push(Record {
                    row,
                    input_ids: ids,
                    text: enc.text,
                });
            }
        }
        let position = DataPosition {
            epoch: 0,
            cursor: 0,
            seed: options.seed,
        };
        let mut ds = Self {
            encoder,
            records,
            options,
            position,
            order: Vec::new(),
            report,
        };
        ds.order = ds.epoch_order(0);
        Ok(ds)
    }

    /// Number of prompts kept.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    pub fn options(&self) -> &DatasetOptions {
        &self.options
    }

    pub fn encoder(&self) -> &Arc<PromptEncoder> {
        &self.encoder
    }

    /// Full batches per epoch (the remainder is dropped).
    pub fn batches_per_epoch(&self) -> usize {
        self.records.len() / self.options.batch_size
    }

    /// The position of the next batch.
    pub fn position(&self) -> DataPosition {
        self.position
    }

    /// Restores a saved position: the next [`Self::next_batch`] is the one that would have come.
    pub fn set_position(&mut self, position: DataPosition) -> Result<()> {
        anyhow::ensure!(
            position.cursor <= self.records.len(),
            "data position cursor {} is past the dataset's {} prompts (was the data changed?)",
            position.cursor,
            self.records.len()
        );
        self.position = position;
        self.order = self.epoch_order(position.epoch);
        Ok(())
    }

    /// Index order of `epoch` (see the module doc).
    fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.records.len()).collect();
        if self.options.shuffle {
            let mut rng =
                SplitMix64(self.position.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        order
    }

    /// The next `batch_size` prompts; moves to the next epoch when fewer than `batch_size` remain.
    pub fn next_batch(&mut self) -> Result<PromptBatch> {
        let bs = self.options.batch_size;
        anyhow::ensure!(
            self.records.len() >= bs,
            "the dataset has {} prompts (after filtering), fewer than batch_size {bs}",
            self.records.len()
        );
        if self.position.cursor + bs > self.records.len() {
            self.position.epoch += 1;
            self.position.cursor = 0;
            self.order = self.epoch_order(self.position.epoch);
        }
        let start = self.position.cursor;
        let items: Vec<(usize, String)> = (start..start + bs)
            .map(|k| (self.order[k], format!("e{}-{k}", self.position.epoch)))
            .collect();
        let batch = self.build_batch(&items, self.position.epoch)?;
        self.position.cursor += bs;
        Ok(batch)
    }

    /// All prompts in file order, in batches of `batch_size` (the last may be smaller): for
    /// validation. Uids are `val-{index}`.
    pub fn eval_batches(&self) -> impl Iterator<Item = Result<PromptBatch>> + '_ {
        let n = self.records.len();
        let bs = self.options.batch_size;
        (0..n.div_ceil(bs)).map(move |b| {
            let items: Vec<(usize, String)> = (b * bs..((b + 1) * bs).min(n))
                .map(|k| (k, format!("val-{k}")))
                .collect();
            self.build_batch(&items, 0)
        })
    }

    fn build_batch(&self, items: &[(usize, String)], epoch: u64) -> Result<PromptBatch> {
        let mut prompts = Vec::with_capacity(items.len());
        for (index, uid) in items {
            let rec = &self.records[*index];
            let row = &rec.row;
            let mut images = Vec::with_capacity(row.images.len());
            // A processor's error, at the row's picture column (`key`, else verl's `default`).
            let cell = |key: &Option<String>, default: &str, message: String| {
                let col = key.as_deref().unwrap_or(default);
                DataError::cell(&row.source.file, row.source.row, col, message)
            };
            let cols = &self.options.read.columns;
            let videos = self
                .encoder
                .process_videos(&decode_row_videos(row, &self.options.read)?)
                .map_err(|e| cell(&cols.video_key, "videos", format!("{e:#}")))?;
            let mut pictures = Vec::with_capacity(row.images.len());
            if !row.images.is_empty() {
                let processor = self
                    .encoder
                    .processor
                    .as_ref()
                    .expect("rows with images were encoded with a processor");
                for (k, img) in decode_row_images(row, &self.options.read)?
                    .into_iter()
                    .enumerate()
                {
                    images.push(processor.process(&img).map_err(|e| {
                        cell(&cols.image_key, "images", format!("image {k}: {e:#}"))
                    })?);
                    pictures.push(Arc::new(img));
                }
            }
            let images = crate::encoder::interleave(&row.messages, images, videos)?;
            prompts.push(Prompt {
                uid: uid.clone(),
                input_ids: rec.input_ids.clone(),
                images,
                pictures,
                messages: row.messages.clone(),
                text: rec.text.clone(),
                ground_truth: row.ground_truth.clone(),
                data_source: row.data_source.clone(),
                ability: row.ability.clone(),
                extra_info: row.extra_info.clone(),
                source: row.source.clone(),
            });
        }
        Ok(PromptBatch::encoded_by(&self.encoder, prompts, epoch))
    }
}
