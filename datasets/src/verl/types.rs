//! What a verl file's rows become: the configured columns, the checked row and its parts, the
//! reading options and the record of a skipped row.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::DataError;
use crate::images::EncodedImage;
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
