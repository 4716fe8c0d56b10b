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

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch, StructArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::DataError;
use crate::video::{EncodedVideo, VIDEO_PLACEHOLDER, VideoOptions};

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

/// What [`read_verl_file`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct VerlFile {
    pub path: PathBuf,
    pub rows: Vec<VerlRow>,
    /// Rows dropped because of `skip_mismatched_rows`.
    pub skipped: Vec<SkippedRow>,
    /// Rows in the file (kept + skipped).
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
    read_rows(path, options, None)
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
    let file = read_rows(path, options, Some(&mut bad))?;
    Ok((file, bad))
}

/// The reading of [`read_verl_file`]; with `bad`, a row's error is pushed there instead of
/// ending the read.
fn read_rows(
    path: &Path,
    options: &ReadOptions,
    mut bad: Option<&mut Vec<DataError>>,
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
        .with_batch_size(1024)
        .build()
        .map_err(|e| DataError::file(path, format!("cannot read: {e}")))?;

    let mut out = VerlFile {
        path: path.to_path_buf(),
        rows: Vec::new(),
        skipped: Vec::new(),
        num_rows,
        num_row_groups,
    };
    let mut base = 0usize;
    for batch in reader {
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

fn split_path(dotted: &str) -> (&str, Vec<String>) {
    let mut parts = dotted.split('.');
    let root = parts.next().unwrap_or("");
    (root, parts.map(str::to_string).collect())
}

fn root_field<'a>(
    path: &Path,
    schema: &'a Schema,
    name: &str,
    required: bool,
) -> Result<Option<&'a Field>, DataError> {
    match schema.field_with_name(name) {
        Ok(f) => Ok(Some(f)),
        Err(_) if !required => Ok(None),
        Err(_) => {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            Err(DataError::column(
                path,
                name,
                format!(
                    "missing column (the file has: {}); set the matching *_key option if it has another name",
                    names.join(", ")
                ),
            ))
        }
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_binary(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    )
}

fn list_item(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) => Some(f.data_type()),
        _ => None,
    }
}

fn struct_child<'a>(t: &'a DataType, name: &str) -> Option<&'a DataType> {
    match t {
        DataType::Struct(fields) => fields
            .iter()
            .find(|f| f.name() == name)
            .map(|f| f.data_type()),
        _ => None,
    }
}

fn check_string_type(path: &Path, col: &str, t: &DataType) -> Result<(), DataError> {
    if is_string(t) {
        Ok(())
    } else {
        Err(DataError::column(
            path,
            col,
            format!("expected a string column, found {}", type_name(t)),
        ))
    }
}

fn check_messages_type(path: &Path, col: &str, t: &DataType) -> Result<(), DataError> {
    let ok = list_item(t).is_some_and(|item| {
        struct_child(item, "role").is_some_and(is_string)
            && struct_child(item, "content").is_some_and(is_string)
    });
    if ok {
        Ok(())
    } else {
        Err(DataError::column(
            path,
            col,
            format!(
                "expected a list of chat messages list<struct<role: string, content: string>>, found {}",
                type_name(t)
            ),
        ))
    }
}

fn check_images_type(path: &Path, col: &str, t: &DataType) -> Result<(), DataError> {
    let ok = list_item(t).is_some_and(|item| struct_child(item, "bytes").is_some_and(is_binary));
    if ok {
        Ok(())
    } else {
        Err(DataError::column(
            path,
            col,
            format!(
                "expected a list of images list<struct<bytes: binary, path: string>>, found {}",
                type_name(t)
            ),
        ))
    }
}

/// A frame list: `list<binary | string | struct<bytes: binary, path: string>>`.
fn is_frame_list(t: &DataType) -> bool {
    list_item(t).is_some_and(|f| {
        is_binary(f) || is_string(f) || struct_child(f, "bytes").is_some_and(is_binary)
    })
}

/// verl's video entries: per row a list of videos, each a frame list, or a struct whose `video`
/// field is a frame list (or a path string, rejected per row) with optional numeric
/// `sample_fps`, `fps`, `nframes`, `min_frames`, `max_frames`.
fn check_videos_type(path: &Path, col: &str, t: &DataType) -> Result<(), DataError> {
    let ok = list_item(t).is_some_and(|item| {
        is_frame_list(item)
            || struct_child(item, "video").is_some_and(|v| is_frame_list(v) || is_string(v))
    });
    if ok {
        Ok(())
    } else {
        Err(DataError::column(
            path,
            col,
            format!(
                "expected a list of videos, each a list of frames (binary, path string or struct<bytes, path>) \
                 or a struct<video: list of frames, sample_fps?, fps?, nframes?, ...>, found {}",
                type_name(t)
            ),
        ))
    }
}

fn check_nested_scalar(
    path: &Path,
    dotted: &str,
    root: &DataType,
    rest: &[String],
) -> Result<(), DataError> {
    let mut t = root;
    for name in rest {
        t = struct_child(t, name).ok_or_else(|| {
            DataError::column(
                path,
                dotted,
                format!(
                    "missing field `{name}` (the column's type is {})",
                    type_name(root)
                ),
            )
        })?;
    }
    let scalar = is_string(t) || t.is_integer() || t.is_floating();
    if scalar {
        Ok(())
    } else {
        Err(DataError::column(
            path,
            dotted,
            format!("expected a string (or number), found {}", type_name(t)),
        ))
    }
}

/// A short human-readable type name (`list<struct<role: string, content: string>>`).
pub fn type_name(t: &DataType) -> String {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary".into(),
        DataType::List(f) | DataType::LargeList(f) => format!("list<{}>", type_name(f.data_type())),
        DataType::Struct(fields) => format!(
            "struct<{}>",
            fields
                .iter()
                .map(|f| format!("{}: {}", f.name(), type_name(f.data_type())))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string().to_lowercase(),
    }
}

// -------------------------------------------------------------------------------------------
// Value access over the few physical layouts a column may have
// -------------------------------------------------------------------------------------------

/// Value `i` of a string array (any offset width), `None` when null or not a string array.
fn str_at(a: &dyn Array, i: usize) -> Option<&str> {
    if a.is_null(i) {
        return None;
    }
    if let Some(s) = a.as_string_opt::<i32>() {
        Some(s.value(i))
    } else if let Some(s) = a.as_string_opt::<i64>() {
        Some(s.value(i))
    } else {
        a.as_string_view_opt().map(|s| s.value(i))
    }
}

fn bytes_at(a: &dyn Array, i: usize) -> Option<&[u8]> {
    if a.is_null(i) {
        return None;
    }
    if let Some(s) = a.as_binary_opt::<i32>() {
        Some(s.value(i))
    } else if let Some(s) = a.as_binary_opt::<i64>() {
        Some(s.value(i))
    } else {
        a.as_binary_view_opt().map(|s| s.value(i))
    }
}

/// Child range and values of list `i`; `None` when null.
fn list_at(a: &dyn Array, i: usize) -> Option<(Range<usize>, &ArrayRef)> {
    if a.is_null(i) {
        return None;
    }
    if let Some(l) = a.as_list_opt::<i32>() {
        let o = l.value_offsets();
        Some((o[i] as usize..o[i + 1] as usize, l.values()))
    } else {
        a.as_list_opt::<i64>().map(|l| {
            let o = l.value_offsets();
            (o[i] as usize..o[i + 1] as usize, l.values())
        })
    }
}

fn child<'a>(s: &'a StructArray, name: &str) -> Option<&'a ArrayRef> {
    s.column_by_name(name)
}

/// Converts value `i` of any common Arrow array to JSON (binary becomes `"<N bytes>"`).
pub fn to_json(a: &dyn Array, i: usize) -> Json {
    if a.is_null(i) {
        return Json::Null;
    }
    macro_rules! prim {
        ($t:ty) => {
            if let Some(p) = a.as_primitive_opt::<$t>() {
                return serde_json::json!(p.value(i));
            }
        };
    }
    prim!(Int64Type);
    prim!(Int32Type);
    prim!(Int16Type);
    prim!(Int8Type);
    prim!(UInt64Type);
    prim!(UInt32Type);
    prim!(UInt16Type);
    prim!(UInt8Type);
    prim!(Float64Type);
    prim!(Float32Type);
    if let Some(s) = str_at(a, i) {
        return Json::String(s.to_string());
    }
    if let Some(b) = a.as_boolean_opt() {
        return Json::Bool(b.value(i));
    }
    if let Some(b) = bytes_at(a, i) {
        return Json::String(format!("<{} bytes>", b.len()));
    }
    if let Some(s) = a.as_struct_opt() {
        let mut map = serde_json::Map::new();
        for (f, c) in s.fields().iter().zip(s.columns()) {
            map.insert(f.name().clone(), to_json(c.as_ref(), i));
        }
        return Json::Object(map);
    }
    if let Some((range, values)) = list_at(a, i) {
        return Json::Array(range.map(|j| to_json(values.as_ref(), j)).collect());
    }
    Json::String(format!("<{}>", type_name(a.data_type())))
}

// -------------------------------------------------------------------------------------------
// Rows
// -------------------------------------------------------------------------------------------

struct BatchColumns<'a> {
    path: &'a Path,
    options: &'a ReadOptions,
    prompt: ArrayRef,
    images: Option<ArrayRef>,
    videos: Option<ArrayRef>,
    ground_truth: ArrayRef,
    gt_path: &'a [String],
    data_source: ArrayRef,
    extra_info: Option<ArrayRef>,
    ability: Option<ArrayRef>,
}

enum RowOutcome {
    Row(VerlRow),
    Skipped(SkippedRow),
}

impl BatchColumns<'_> {
    /// Extracts and checks row `i` of the batch (`row` in the file).
    fn row(&self, i: usize, row: usize) -> Result<RowOutcome, DataError> {
        let cols = &self.options.columns;
        let path = self.path;
        let err = |col: &str, msg: String| DataError::cell(path, row, col, msg);
        // A row whose placeholders and pictures do not match: skipped, or an error that says how
        // to skip such rows.
        let mismatch = |reason: String| {
            if self.options.skip_mismatched_rows {
                Ok(RowOutcome::Skipped(SkippedRow {
                    source: RowRef {
                        file: path.to_path_buf(),
                        row,
                    },
                    reason,
                }))
            } else {
                Err(DataError::row(
                    path,
                    row,
                    format!("{reason} (set skip_mismatched_rows to drop such rows)"),
                ))
            }
        };

        // Messages.
        let pk = cols.prompt_key.as_str();
        let (range, values) = list_at(self.prompt.as_ref(), i)
            .ok_or_else(|| err(pk, "the message list is null".into()))?;
        let msgs = values.as_struct();
        let roles = child(msgs, "role").expect("type checked");
        let contents = child(msgs, "content").expect("type checked");
        let mut messages = Vec::with_capacity(range.len());
        for (k, j) in range.enumerate() {
            if msgs.is_null(j) {
                return Err(err(pk, format!("message {k} is null")));
            }
            let role = str_at(roles.as_ref(), j)
                .ok_or_else(|| err(pk, format!("message {k} has a null role")))?;
            let content = str_at(contents.as_ref(), j)
                .ok_or_else(|| err(pk, format!("message {k} has a null content")))?;
            messages.push(ChatMessage {
                role: role.to_string(),
                content: content.to_string(),
            });
        }
        if messages.is_empty() {
            return Err(err(pk, "the message list is empty".into()));
        }

        // Images.
        let mut images = Vec::new();
        if let (Some(arr), Some(ik)) = (&self.images, cols.image_key.as_deref())
            && let Some((range, values)) = list_at(arr.as_ref(), i)
        {
            let items = values.as_struct();
            let bytes = child(items, "bytes").expect("type checked");
            let paths = child(items, "path");
            for (k, j) in range.enumerate() {
                let p = paths
                    .and_then(|p| str_at(p.as_ref(), j))
                    .map(str::to_string);
                let b = if items.is_null(j) {
                    None
                } else {
                    bytes_at(bytes.as_ref(), j).map(<[u8]>::to_vec)
                };
                let b = match (b, &p) {
                    (Some(b), _) => b,
                    (None, Some(p)) => {
                        read_referenced(path, p).map_err(|m| err(ik, format!("image {k}: {m}")))?
                    }
                    (None, None) => {
                        return Err(err(ik, format!("image {k} has neither bytes nor a path")));
                    }
                };
                images.push(EncodedImage { bytes: b, path: p });
            }
        }
        let videos = match (&self.videos, cols.video_key.as_deref()) {
            (Some(arr), Some(vk)) => self.videos_at(arr.as_ref(), i, row, vk)?,
            _ => Vec::new(),
        };
        if let (Some(_), Some(vk)) = (&self.videos, cols.video_key.as_deref()) {
            let n = count_video_placeholders(&messages);
            if n != videos.len() {
                let reason = format!(
                    "{n} `<video>` placeholder(s) in `{pk}` but {} video(s) in `{vk}`",
                    videos.len()
                );
                return mismatch(reason);
            }
            if self.options.check_images {
                for (v, video) in videos.iter().enumerate() {
                    for (k, img) in video.frames.iter().enumerate() {
                        crate::images::decode_rgb(&img.bytes)
                            .map_err(|m| err(vk, format!("video {v} frame {k}: {m}")))?;
                    }
                }
            }
        }
        let placeholders = count_placeholders(&messages);
        if cols.image_key.is_some() && placeholders != images.len() {
            let reason = format!(
                "{placeholders} `<image>` placeholder(s) in `{pk}` but {} image(s) in `{}`",
                images.len(),
                cols.image_key.as_deref().unwrap_or_default()
            );
            return mismatch(reason);
        }
        if self.options.check_images {
            let ik = cols.image_key.as_deref().unwrap_or_default();
            for (k, img) in images.iter().enumerate() {
                crate::images::decode_rgb(&img.bytes)
                    .map_err(|m| err(ik, format!("image {k}: {m}")))?;
            }
        }

        // Ground truth: a string (numbers are written as their text).
        let gk = cols.ground_truth_key.as_str();
        let mut gt: Option<&dyn Array> = Some(self.ground_truth.as_ref());
        for name in self.gt_path {
            gt = match gt {
                Some(a) if !a.is_null(i) => a
                    .as_struct_opt()
                    .and_then(|s| child(s, name))
                    .map(|c| c.as_ref()),
                _ => None,
            };
        }
        let ground_truth = match gt.map(|a| to_json(a, i)) {
            Some(Json::String(s)) => s,
            Some(Json::Number(n)) => n.to_string(),
            _ => return Err(err(gk, "the ground truth is null".into())),
        };

        let dk = cols.data_source_key.as_str();
        let data_source = str_at(self.data_source.as_ref(), i)
            .ok_or_else(|| err(dk, "data_source is null".into()))?
            .to_string();
        let ability = self
            .ability
            .as_ref()
            .and_then(|a| str_at(a.as_ref(), i))
            .map(str::to_string);
        let extra_info = self
            .extra_info
            .as_ref()
            .map(|a| to_json(a.as_ref(), i))
            .unwrap_or(Json::Null);

        Ok(RowOutcome::Row(VerlRow {
            source: RowRef {
                file: path.to_path_buf(),
                row,
            },
            messages,
            images,
            videos,
            data_source,
            ground_truth,
            ability,
            extra_info,
        }))
    }
}

impl BatchColumns<'_> {
    /// The videos of row `i` (`row` in the file) of the video column `arr` named `col`.
    fn videos_at(
        &self,
        arr: &dyn Array,
        i: usize,
        row: usize,
        col: &str,
    ) -> Result<Vec<EncodedVideo>, DataError> {
        let path = self.path;
        let err = |msg: String| DataError::cell(path, row, col, msg);
        let Some((range, values)) = list_at(arr, i) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(range.len());
        for (v, j) in range.enumerate() {
            if values.is_null(j) {
                return Err(err(format!("video {v} is null")));
            }
            let mut entry = EncodedVideo::default();
            let frames: &dyn Array = match values.as_struct_opt() {
                Some(s) if child(s, "video").is_some() => {
                    let num = |name: &str| {
                        child(s, name).and_then(|c| match to_json(c.as_ref(), j) {
                            Json::Number(n) => n.as_f64(),
                            _ => None,
                        })
                    };
                    entry.sample_fps = num("sample_fps");
                    entry.fps = num("fps");
                    entry.nframes = num("nframes").map(|x| x as usize);
                    entry.min_frames = num("min_frames").map(|x| x as usize);
                    entry.max_frames = num("max_frames").map(|x| x as usize);
                    let video = child(s, "video").expect("checked above").as_ref();
                    if let Some(p) = str_at(video, j) {
                        return Err(err(format!(
                            "video {v} is the file `{p}`: video files are not decoded; store the video as a \
                             list of frames (encoded images or image paths) in `video`, with its frame rate in \
                             `sample_fps`"
                        )));
                    }
                    video
                }
                _ => values.as_ref(),
            };
            let Some((frange, fvalues)) = list_at(frames, j) else {
                return Err(err(format!("video {v} has a null frame list")));
            };
            for (k, f) in frange.enumerate() {
                let bytes = if let Some(s) = fvalues.as_struct_opt() {
                    let p = child(s, "path")
                        .and_then(|p| str_at(p.as_ref(), f))
                        .map(str::to_string);
                    let b = if s.is_null(f) {
                        None
                    } else {
                        child(s, "bytes").and_then(|b| bytes_at(b.as_ref(), f))
                    };
                    match (b, p) {
                        (Some(b), p) => EncodedImage {
                            bytes: b.to_vec(),
                            path: p,
                        },
                        (None, Some(p)) => EncodedImage {
                            bytes: read_referenced(path, &p)
                                .map_err(|m| err(format!("video {v} frame {k}: {m}")))?,
                            path: Some(p),
                        },
                        (None, None) => {
                            return Err(err(format!(
                                "video {v} frame {k} has neither bytes nor a path"
                            )));
                        }
                    }
                } else if let Some(b) = bytes_at(fvalues.as_ref(), f) {
                    EncodedImage {
                        bytes: b.to_vec(),
                        path: None,
                    }
                } else if let Some(p) = str_at(fvalues.as_ref(), f) {
                    let p = p.strip_prefix("file://").unwrap_or(p);
                    EncodedImage {
                        bytes: read_referenced(path, p)
                            .map_err(|m| err(format!("video {v} frame {k}: {m}")))?,
                        path: Some(p.to_string()),
                    }
                } else {
                    return Err(err(format!("video {v} frame {k} is null")));
                };
                entry.frames.push(bytes);
            }
            out.push(entry);
        }
        Ok(out)
    }
}

/// Reads an image referenced only by path (relative paths are relative to the parquet file).
fn read_referenced(parquet: &Path, p: &str) -> Result<Vec<u8>, String> {
    let candidate = Path::new(p);
    let full = if candidate.is_absolute() {
        candidate.to_path_buf()
    } else {
        parquet.parent().unwrap_or(Path::new(".")).join(candidate)
    };
    let cannot = |e: &dyn std::fmt::Display| {
        format!(
            "bytes are null and path {} cannot be read: {e}",
            full.display()
        )
    };
    // Only a regular file of bounded size: a path such as /dev/zero or a FIFO would otherwise be
    // read without end (or block).
    let meta = std::fs::metadata(&full).map_err(|e| cannot(&e))?;
    if !meta.is_file() {
        return Err(cannot(&"not a regular file"));
    }
    if meta.len() > MAX_IMAGE_FILE_BYTES {
        return Err(cannot(&format_args!(
            "{} bytes, more than the {MAX_IMAGE_FILE_BYTES} an image file may have",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(
            File::open(&full).map_err(|e| cannot(&e))?,
            MAX_IMAGE_FILE_BYTES,
        ),
        &mut bytes,
    )
    .map_err(|e| cannot(&e))?;
    Ok(bytes)
}

/// The largest image file a row may reference by path (256 MiB).
const MAX_IMAGE_FILE_BYTES: u64 = 256 << 20;
