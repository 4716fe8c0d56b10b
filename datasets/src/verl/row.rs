//! One row of a record batch → a checked [`VerlRow`]: messages present and non-null, every
//! image and video frame read (from its bytes, else from its path next to the parquet file) and,
//! when asked, decoded, as many `<image>`/`<video>` placeholders as pictures (or the row
//! skipped), a ground truth and a data source. Errors name the file, row and column.

use std::fs::File;
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, StructArray};
use serde_json::Value as Json;

use super::types::{
    ChatMessage, ReadOptions, RowRef, SkippedRow, VerlRow, count_placeholders,
    count_video_placeholders,
};
use super::values::{bytes_at, child, list_at, str_at, to_json};
use crate::error::DataError;
use crate::images::EncodedImage;
use crate::video::EncodedVideo;

/// The projected columns of one record batch, with what is needed to check a row of it.
pub(super) struct BatchColumns<'a> {
    pub(super) path: &'a Path,
    pub(super) options: &'a ReadOptions,
    pub(super) prompt: ArrayRef,
    pub(super) images: Option<ArrayRef>,
    pub(super) videos: Option<ArrayRef>,
    pub(super) ground_truth: ArrayRef,
    pub(super) gt_path: &'a [String],
    pub(super) data_source: ArrayRef,
    pub(super) extra_info: Option<ArrayRef>,
    pub(super) ability: Option<ArrayRef>,
}

pub(super) enum RowOutcome {
    Row(VerlRow),
    Skipped(SkippedRow),
}

impl BatchColumns<'_> {
    /// Extracts and checks row `i` of the batch (`row` in the file).
    pub(super) fn row(&self, i: usize, row: usize) -> Result<RowOutcome, DataError> {
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

        let pk = cols.prompt_key.as_str();
        let messages = self.messages(i, row)?;
        let images = match (&self.images, cols.image_key.as_deref()) {
            (Some(arr), Some(ik)) => self.images_at(arr.as_ref(), i, row, ik)?,
            _ => Vec::new(),
        };
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

        let ground_truth = self.ground_truth(i, row)?;
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

    /// The chat messages of row `i` (`row` in the file): a non-empty list, no null role or
    /// content.
    fn messages(&self, i: usize, row: usize) -> Result<Vec<ChatMessage>, DataError> {
        let pk = self.options.columns.prompt_key.as_str();
        let err = |msg: String| DataError::cell(self.path, row, pk, msg);
        let (range, values) = list_at(self.prompt.as_ref(), i)
            .ok_or_else(|| err("the message list is null".into()))?;
        let msgs = values.as_struct();
        let roles = child(msgs, "role").expect("type checked");
        let contents = child(msgs, "content").expect("type checked");
        let mut messages = Vec::with_capacity(range.len());
        for (k, j) in range.enumerate() {
            if msgs.is_null(j) {
                return Err(err(format!("message {k} is null")));
            }
            let role = str_at(roles.as_ref(), j)
                .ok_or_else(|| err(format!("message {k} has a null role")))?;
            let content = str_at(contents.as_ref(), j)
                .ok_or_else(|| err(format!("message {k} has a null content")))?;
            messages.push(ChatMessage {
                role: role.to_string(),
                content: content.to_string(),
            });
        }
        if messages.is_empty() {
            return Err(err("the message list is empty".into()));
        }
        Ok(messages)
    }

    /// The images of row `i` (`row` in the file) of the image column `arr` named `col`; a
    /// null list is no images.
    fn images_at(
        &self,
        arr: &dyn Array,
        i: usize,
        row: usize,
        col: &str,
    ) -> Result<Vec<EncodedImage>, DataError> {
        let Some((range, values)) = list_at(arr, i) else {
            return Ok(Vec::new());
        };
        let items = values.as_struct();
        range
            .enumerate()
            .map(|(k, j)| {
                image_entry(items, j, self.path, || format!("image {k}"))
                    .map_err(|m| DataError::cell(self.path, row, col, m))
            })
            .collect()
    }

    /// The ground truth of row `i` (`row` in the file): a string (numbers are written as their
    /// text), at the dotted path inside the ground-truth column.
    fn ground_truth(&self, i: usize, row: usize) -> Result<String, DataError> {
        let gk = self.options.columns.ground_truth_key.as_str();
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
        match gt.map(|a| to_json(a, i)) {
            Some(Json::String(s)) => Ok(s),
            Some(Json::Number(n)) => Ok(n.to_string()),
            _ => Err(DataError::cell(
                self.path,
                row,
                gk,
                "the ground truth is null",
            )),
        }
    }

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
                let what = || format!("video {v} frame {k}");
                let frame = if let Some(s) = fvalues.as_struct_opt() {
                    image_entry(s, f, path, what).map_err(err)?
                } else if let Some(b) = bytes_at(fvalues.as_ref(), f) {
                    EncodedImage {
                        bytes: b.to_vec(),
                        path: None,
                    }
                } else if let Some(p) = str_at(fvalues.as_ref(), f) {
                    let p = p.strip_prefix("file://").unwrap_or(p);
                    EncodedImage {
                        bytes: read_referenced(path, p)
                            .map_err(|m| err(format!("{}: {m}", what())))?,
                        path: Some(p.to_string()),
                    }
                } else {
                    return Err(err(format!("video {v} frame {k} is null")));
                };
                entry.frames.push(frame);
            }
            out.push(entry);
        }
        Ok(out)
    }
}

/// Entry `j` of a `struct<bytes, path>` array (an image, or a video frame): its bytes, else the
/// file at its path. `what` names the entry in the message (`image 2`, `video 0 frame 3`).
fn image_entry(
    items: &StructArray,
    j: usize,
    parquet: &Path,
    what: impl Fn() -> String,
) -> Result<EncodedImage, String> {
    let path = child(items, "path")
        .and_then(|p| str_at(p.as_ref(), j))
        .map(str::to_string);
    let bytes = if items.is_null(j) {
        None
    } else {
        child(items, "bytes").and_then(|b| bytes_at(b.as_ref(), j))
    };
    match (bytes, path) {
        (Some(b), path) => Ok(EncodedImage {
            bytes: b.to_vec(),
            path,
        }),
        (None, Some(p)) => Ok(EncodedImage {
            bytes: read_referenced(parquet, &p).map_err(|m| format!("{}: {m}", what()))?,
            path: Some(p),
        }),
        (None, None) => Err(format!("{} has neither bytes nor a path", what())),
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
