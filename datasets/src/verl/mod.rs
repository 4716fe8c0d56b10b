//! Reading verl's RL prompt parquet files as they are written by verl's preprocessing scripts
//! (`examples/data_preprocess/geo3k.py` and friends, through `datasets.Dataset.to_parquet`).
//!
//! The schema (see `tests/fixtures/data/README.md`):
//! `prompt: list<struct<role, content>>`, `images: list<struct<bytes: binary, path: string>>`,
//! `data_source: string`, `reward_model: struct<style, ground_truth>`, `ability: string`,
//! `extra_info: struct<...>`, and optionally `videos` (a list of frame lists, see
//! [`crate::video`]). Column names are configurable ([`VerlColumns`]); columns are looked
//! up by name, every row group is read, unknown columns are ignored (not even decoded).
//!
//! This module only extracts and checks values; it decodes images to check them
//! ([`crate::images`]) but keeps the encoded bytes, and does no tokenization.
//! Every error is a [`DataError`] naming file, row and column.
//!
//! The parts (private modules): `schema` resolves the configured columns and checks their
//! Arrow types before a row is decoded; `values` reads one value out of the few physical
//! layouts a column may have (and any value as JSON, for `flowrl data inspect`); `row` turns
//! one row of a record batch into a checked [`VerlRow`]. This file holds the row and file types
//! and the reading loop.

mod row;
mod schema;
mod values;

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::{ArrayRef, RecordBatch};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::DataError;
use crate::video::{EncodedVideo, VIDEO_PLACEHOLDER, VideoOptions};
use row::{BatchColumns, RowOutcome};
pub use schema::type_name;
use schema::{
    check_images_type, check_messages_type, check_nested_scalar, check_string_type,
    check_videos_type, root_field, split_path,
};
pub use values::to_json;

/// The image placeholder verl writes into message text.
pub const IMAGE_PLACEHOLDER: &str = "<image>";

/// Which columns hold what. Defaults are verl's names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VerlColumns {
    /// Chat messages: `list<struct<role, content>>` (verl `data.prompt_key`).
    pub prompt_key: String,
    /// Images: `list<struct<bytes, path>>` (verl `data.image_key`); `None` for text-only data.
    pub image_key: Option<String>,
    /// Videos (verl `data.video_key`): read when the file has this column, which may be absent.
    pub video_key: Option<String>,
    /// Dotted path to the reference answer (verl reads `reward_model.ground_truth`).
    pub ground_truth_key: String,
    /// The reward selector (verl `data_source`).
    pub data_source_key: String,
    /// Optional free-form struct carried to logs (verl `extra_info`).
    pub extra_info_key: String,
    /// Optional task label (verl `ability`).
    pub ability_key: String,
}

impl Default for VerlColumns {
    fn default() -> Self {
        Self {
            prompt_key: "prompt".into(),
            image_key: Some("images".into()),
            video_key: Some("videos".into()),
            ground_truth_key: "reward_model.ground_truth".into(),
            data_source_key: "data_source".into(),
            extra_info_key: "extra_info".into(),
            ability_key: "ability".into(),
        }
    }
}

/// One chat message as stored in the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// One entry of the `images` list: the encoded file (bytes win over path, as in `datasets`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedImage {
    pub bytes: Vec<u8>,
    /// The stored path, if any (informational; a path-only entry has been read from disk).
    pub path: Option<String>,
}

/// Where a row came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RowRef {
    pub file: PathBuf,
    pub row: usize,
}

/// One prompt row of a verl file, checked: placeholder count equals image count, images decode,
/// ground truth and data source are present.
#[derive(Debug, Clone, PartialEq)]
pub struct VerlRow {
    pub source: RowRef,
    pub messages: Vec<ChatMessage>,
    pub images: Vec<EncodedImage>,
    /// The entries of the video column, in `<video>` order (empty without the column).
    pub videos: Vec<EncodedVideo>,
    pub data_source: String,
    pub ground_truth: String,
    pub ability: Option<String>,
    /// The extra-info column converted to JSON (`null` when absent).
    pub extra_info: Json,
}

impl VerlRow {
    /// Total number of `<image>` placeholders over all messages.
    pub fn num_placeholders(&self) -> usize {
        count_placeholders(&self.messages)
    }
}

/// Number of `<image>` occurrences over the contents of `messages`.
pub fn count_placeholders(messages: &[ChatMessage]) -> usize {
    messages
        .iter()
        .map(|m| m.content.matches(IMAGE_PLACEHOLDER).count())
        .sum()
}

/// Number of `<video>` occurrences over the contents of `messages`.
pub fn count_video_placeholders(messages: &[ChatMessage]) -> usize {
    messages
        .iter()
        .map(|m| m.content.matches(VIDEO_PLACEHOLDER).count())
        .sum()
}

/// Per `<image>`/`<video>` placeholder over all messages, in text order: `true` for a video.
pub fn placeholder_order(messages: &[ChatMessage]) -> Vec<bool> {
    let mut order = Vec::new();
    for m in messages {
        let mut rest = m.content.as_str();
        loop {
            let i = rest.find(IMAGE_PLACEHOLDER);
            let v = rest.find(VIDEO_PLACEHOLDER);
            let (at, video, len) = match (i, v) {
                (Some(i), Some(v)) if v < i => (v, true, VIDEO_PLACEHOLDER.len()),
                (Some(i), _) => (i, false, IMAGE_PLACEHOLDER.len()),
                (None, Some(v)) => (v, true, VIDEO_PLACEHOLDER.len()),
                (None, None) => break,
            };
            order.push(video);
            rest = &rest[at + len..];
        }
    }
    order
}

/// Options of [`read_verl_file`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReadOptions {
    pub columns: VerlColumns,
    /// Drop rows whose `<image>` count differs from their image count (and count them in
    /// [`VerlFile::skipped`]) instead of failing.
    pub skip_mismatched_rows: bool,
    /// Drop every row that would fail to load (a malformed value, an undecodable image, a
    /// mismatch) and list it in [`VerlFile::bad`], instead of failing.
    pub skip_bad_rows: bool,
    /// Decode every image while reading, so a corrupt image fails here, not mid-run.
    pub check_images: bool,
    /// When set, pictures get verl's pre-processor resize
    /// ([`crate::images::verl_fetch_resize`]) with this `image_patch_size` (verl's
    /// `data.image_patch_size`, 14 for Qwen2-VL) before the model's processor sees them. Off by
    /// default: with a processor whose pixel limits are qwen_vl_utils' defaults it changes nothing.
    pub verl_image_patch_size: Option<u32>,
    /// Frame rate and sampling of the video column's frame lists ([`crate::video`]).
    pub video: VideoOptions,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            columns: VerlColumns::default(),
            skip_mismatched_rows: false,
            skip_bad_rows: false,
            check_images: true,
            verl_image_patch_size: None,
            video: VideoOptions::default(),
        }
    }
}

/// A row that was skipped, with the reason.
#[derive(Debug, Clone, PartialEq)]
pub struct SkippedRow {
    pub source: RowRef,
    pub reason: String,
}

impl SkippedRow {
    /// `row N: reason`.
    pub fn describe(&self) -> String {
        format!("row {}: {}", self.source.row, self.reason)
    }

    /// The row of a row's error (column and message as the reason).
    pub fn of(e: DataError) -> Self {
        let reason = match &e.column {
            Some(c) => format!("column `{c}`: {}", e.message),
            None => e.message.clone(),
        };
        Self {
            source: RowRef {
                file: e.file,
                row: e.row.unwrap_or(0),
            },
            reason,
        }
    }
}

/// What [`read_verl_file`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct VerlFile {
    pub path: PathBuf,
    pub rows: Vec<VerlRow>,
    /// Rows dropped because of `skip_mismatched_rows`.
    pub skipped: Vec<SkippedRow>,
    /// Rows dropped because of `skip_bad_rows`.
    pub bad: Vec<SkippedRow>,
    /// Rows in the file (kept + skipped + bad).
    pub num_rows: usize,
    pub num_row_groups: usize,
}

/// A summary of a file's layout, for `flowrl data inspect`.
#[derive(Debug, Clone)]
pub struct FileSummary {
    pub num_rows: usize,
    pub num_row_groups: usize,
    /// The Arrow schema, one line per top-level column (`name: type`).
    pub columns: Vec<(String, String)>,
}

/// Reads a parquet file's metadata and Arrow schema without reading rows.
pub fn summarize_file(path: &Path) -> Result<FileSummary, DataError> {
    let builder = open(path)?;
    let meta = builder.metadata();
    Ok(FileSummary {
        num_rows: meta.file_metadata().num_rows() as usize,
        num_row_groups: meta.num_row_groups(),
        columns: builder
            .schema()
            .fields()
            .iter()
            .map(|f| (f.name().clone(), type_name(f.data_type())))
            .collect(),
    })
}

fn open(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>, DataError> {
    let file = File::open(path).map_err(|e| DataError::file(path, format!("cannot open: {e}")))?;
    ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| DataError::file(path, format!("not a readable parquet file: {e}")))
}

/// Reads all row groups of a verl prompt file. Fails on the first bad value (see the module doc
/// and [`ReadOptions::skip_mismatched_rows`] for the one documented skip).
pub fn read_verl_file(path: &Path, options: &ReadOptions) -> Result<VerlFile, DataError> {
    read_rows(path, options, None, None)
}

/// [`read_verl_file`] of the file's first `rows` rows only (fewer when it has fewer).
pub fn read_verl_head(
    path: &Path,
    options: &ReadOptions,
    rows: usize,
) -> Result<VerlFile, DataError> {
    read_rows(path, options, None, Some(rows))
}

/// [`read_verl_file`] that goes on past bad rows: every row that would fail to load is returned
/// as its [`DataError`] (row, column, message), in file order, and left out of the rows. Problems
/// of the whole file or of a column's type are still an `Err` (no row can be read).
/// `flowrl data inspect` uses it to list every bad row at once.
pub fn check_verl_file(
    path: &Path,
    options: &ReadOptions,
) -> Result<(VerlFile, Vec<DataError>), DataError> {
    let mut bad = Vec::new();
    let file = read_rows(path, options, Some(&mut bad), None)?;
    Ok((file, bad))
}

/// The reading of [`read_verl_file`]; with `bad`, a row's error is pushed there instead of
/// ending the read.
fn read_rows(
    path: &Path,
    options: &ReadOptions,
    mut bad: Option<&mut Vec<DataError>>,
    limit: Option<usize>,
) -> Result<VerlFile, DataError> {
    let builder = open(path)?;
    let num_row_groups = builder.metadata().num_row_groups();
    let num_rows = builder.metadata().file_metadata().num_rows() as usize;
    let schema = builder.schema().clone();
    let cols = &options.columns;

    // Resolve and type-check the columns up front, before any row is decoded.
    let prompt = root_field(path, &schema, &cols.prompt_key, true)?.unwrap();
    check_messages_type(path, &cols.prompt_key, prompt.data_type())?;
    let images = match &cols.image_key {
        Some(key) => {
            let f = root_field(path, &schema, key, true)?.unwrap();
            check_images_type(path, key, f.data_type())?;
            Some(key.clone())
        }
        None => None,
    };
    let videos = match &cols.video_key {
        Some(key) => match root_field(path, &schema, key, false)? {
            Some(f) => {
                check_videos_type(path, key, f.data_type())?;
                Some(key.clone())
            }
            None => None,
        },
        None => None,
    };
    let (gt_root, gt_path) = split_path(&cols.ground_truth_key);
    let gt_field = root_field(path, &schema, gt_root, true)?.unwrap();
    check_nested_scalar(path, &cols.ground_truth_key, gt_field.data_type(), &gt_path)?;
    let ds_field = root_field(path, &schema, &cols.data_source_key, true)?.unwrap();
    check_string_type(path, &cols.data_source_key, ds_field.data_type())?;
    let extra = root_field(path, &schema, &cols.extra_info_key, false)?.map(|f| f.name().clone());
    let ability = match root_field(path, &schema, &cols.ability_key, false)? {
        Some(f) => {
            check_string_type(path, &cols.ability_key, f.data_type())?;
            Some(f.name().clone())
        }
        None => None,
    };

    let mut wanted = vec![
        cols.prompt_key.clone(),
        gt_root.to_string(),
        cols.data_source_key.clone(),
    ];
    wanted.extend(images.iter().cloned());
    wanted.extend(videos.iter().cloned());
    wanted.extend(extra.iter().cloned());
    wanted.extend(ability.iter().cloned());
    let indices: Vec<usize> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| wanted.contains(f.name()))
        .map(|(i, _)| i)
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), indices);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(limit.unwrap_or(1024).clamp(1, 1024))
        .build()
        .map_err(|e| DataError::file(path, format!("cannot read: {e}")))?;

    let mut out = VerlFile {
        path: path.to_path_buf(),
        rows: Vec::new(),
        skipped: Vec::new(),
        bad: Vec::new(),
        num_rows,
        num_row_groups,
    };
    let mut base = 0usize;
    for batch in reader {
        if limit.is_some_and(|l| base >= l) {
            break;
        }
        let batch = batch.map_err(|e| {
            DataError::file(path, format!("cannot decode rows from {base} on: {e}"))
        })?;
        let ctx = BatchColumns {
            path,
            options,
            prompt: column(&batch, &cols.prompt_key),
            images: images.as_deref().map(|k| column(&batch, k)),
            videos: videos.as_deref().map(|k| column(&batch, k)),
            ground_truth: column(&batch, gt_root),
            gt_path: &gt_path,
            data_source: column(&batch, &cols.data_source_key),
            extra_info: extra.as_deref().map(|k| column(&batch, k)),
            ability: ability.as_deref().map(|k| column(&batch, k)),
        };
        for i in 0..batch.num_rows() {
            match (ctx.row(i, base + i), bad.as_deref_mut()) {
                (Ok(RowOutcome::Row(row)), _) => out.rows.push(row),
                (Ok(RowOutcome::Skipped(s)), _) => out.skipped.push(s),
                (Err(e), Some(bad)) => bad.push(e),
                (Err(e), None) if options.skip_bad_rows && e.row.is_some() => {
                    out.bad.push(SkippedRow::of(e))
                }
                (Err(e), None) => return Err(e),
            }
        }
        base += batch.num_rows();
    }
    Ok(out)
}

fn column(batch: &RecordBatch, name: &str) -> ArrayRef {
    batch
        .column_by_name(name)
        .expect("projected column is present")
        .clone()
}
