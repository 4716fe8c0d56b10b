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
//! one row of a record batch into a checked [`VerlRow`]. `types` holds the row types; this file
//! holds the file types and the reading loop.

mod row;
mod schema;
mod types;
mod values;

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::{ArrayRef, RecordBatch};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::error::DataError;
use row::{BatchColumns, RowOutcome};
pub use schema::type_name;
use schema::{
    check_images_type, check_messages_type, check_nested_scalar, check_string_type,
    check_videos_type, root_field, split_path,
};
pub use values::to_json;

pub use crate::images::EncodedImage;
pub use types::{
    ChatMessage, IMAGE_PLACEHOLDER, ReadOptions, RowRef, SkippedRow, VerlColumns, VerlRow,
    count_placeholders, count_video_placeholders, placeholder_order,
};

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
