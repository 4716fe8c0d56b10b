//! Videos of verl's `videos` column: frame lists → decoded, sampled frames
//! ([`flowrl_models::VideoFrames`]) for the model's video processor.
//!
//! verl (`RLHFDataset._build_messages` → `vision_utils.process_video` → `qwen_vl_utils.fetch_video`)
//! takes per video a dict `{"video": …, "fps"?, "nframes"?, "min_frames"?, "max_frames"?,
//! "sample_fps"?}` where `video` is a list of frames or a video file path. flowrl reads:
//!
//! - **frame lists** (each frame as encoded bytes, a path, or `struct<bytes, path>`), either as the
//!   dict's `video` field or as a bare list: all frames are kept, padded to an even count by
//!   repeating the last (as `fetch_video` does), at `sample_fps` frames per second (default 2.0,
//!   `fetch_video`'s default), frame indices `0..n`;
//! - **sampling**: when the entry (or the dataset option) asks for `fps` or `nframes`, the frames
//!   are taken as a video at `sample_fps` and sampled like qwen_vl_utils' `smart_nframes`
//!   ([`sample_indices`]);
//! - **video files** (`"video": "clip.mp4"`): not decoded (no video decoder is built in); the row
//!   fails with a message saying to store the frames instead.

use flowrl_models::VideoFrames;
use image::RgbImage;
use serde::{Deserialize, Serialize};

use crate::images::EncodedImage;

/// The placeholder verl writes into message text for a video.
pub const VIDEO_PLACEHOLDER: &str = "<video>";

/// qwen_vl_utils' `FRAME_FACTOR`: sampled frame counts are multiples of 2.
const FRAME_FACTOR: usize = 2;

/// One entry of the `videos` list: its encoded frames and sampling keys.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EncodedVideo {
    pub frames: Vec<EncodedImage>,
    /// Frame rate of the stored frames (qwen_vl_utils `sample_fps`).
    pub sample_fps: Option<f64>,
    /// Target rate to sample at (`fps`).
    pub fps: Option<f64>,
    /// Number of frames to sample (`nframes`; exclusive with `fps`).
    pub nframes: Option<usize>,
    pub min_frames: Option<usize>,
    pub max_frames: Option<usize>,
}

/// Dataset-wide video defaults (verl passes `fps`/`nframes` to `process_video` the same way).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VideoOptions {
    /// Frame rate of stored frame lists whose entry has no `sample_fps`.
    pub sample_fps: f64,
    /// Sample every video to this rate when its entry sets neither `fps` nor `nframes`.
    pub fps: Option<f64>,
}

impl Default for VideoOptions {
    fn default() -> Self {
        Self {
            sample_fps: 2.0,
            fps: None,
        }
    }
}

/// qwen_vl_utils `smart_nframes` and the frame indices of its readers
/// (`linspace(0, total − 1, n).round()`):
///
/// ```text
/// nframes given: n = round(nframes / 2)·2
/// else:          n = ⌊min(max(total / video_fps · fps, ⌈min_frames⌉₂), ⌊max_frames⌋₂, total)⌋₂
///                (min_frames 4, max_frames min(768, total) by default)
/// ```
/// with `⌈·⌉₂`/`⌊·⌋₂` rounding to multiples of 2; `n` must lie in `[2, total]`.
pub fn sample_indices(
    total: usize,
    video_fps: f64,
    fps: Option<f64>,
    nframes: Option<usize>,
    min_frames: Option<usize>,
    max_frames: Option<usize>,
) -> Result<Vec<usize>, String> {
    let f = FRAME_FACTOR as f64;
    let n = match (nframes, fps) {
        (Some(_), Some(_)) => return Err("a video cannot set both `fps` and `nframes`".into()),
        (Some(n), None) => ((n as f64 / f).round_ties_even() * f) as usize,
        (None, fps) => {
            let fps = fps.unwrap_or(2.0);
            let min = (min_frames.unwrap_or(4) as f64 / f).ceil() * f;
            let max = (max_frames.unwrap_or(768.min(total)) as f64 / f).floor() * f;
            let n = (total as f64 / video_fps * fps)
                .max(min)
                .min(max)
                .min(total as f64);
            ((n / f).floor() * f) as usize
        }
    };
    if !(FRAME_FACTOR <= n && n <= total) {
        return Err(format!(
            "nframes should be in [{FRAME_FACTOR}, {total}] (the video has {total} frames), but sampling gives {n}"
        ));
    }
    Ok((0..n)
        .map(|k| {
            let x = if n == 1 {
                0.0
            } else {
                k as f64 * (total - 1) as f64 / (n - 1) as f64
            };
            x.round_ties_even() as usize
        })
        .collect())
}

/// Decoded `frames` of `entry` as the model's video processor takes them (see the module doc).
pub fn video_frames(
    entry: &EncodedVideo,
    frames: Vec<RgbImage>,
    options: &VideoOptions,
) -> Result<VideoFrames, String> {
    if frames.is_empty() {
        return Err("the video has no frames".into());
    }
    let sample_fps = entry.sample_fps.unwrap_or(options.sample_fps);
    if !(sample_fps > 0.0 && sample_fps.is_finite()) {
        return Err(format!("sample_fps must be positive, got {sample_fps}"));
    }
    let fps = entry.fps.or(if entry.nframes.is_none() {
        options.fps
    } else {
        None
    });
    if fps.is_none() && entry.nframes.is_none() {
        // A frame list: every frame, padded to an even count.
        let mut frames = frames;
        while !frames.len().is_multiple_of(FRAME_FACTOR) {
            let last = frames.last().expect("non-empty").clone();
            frames.push(last);
        }
        return Ok(VideoFrames::from_list(frames, sample_fps));
    }
    if let Some(f) = fps
        && !(f > 0.0 && f.is_finite())
    {
        return Err(format!("fps must be positive, got {f}"));
    }
    let total = frames.len();
    let indices = sample_indices(
        total,
        sample_fps,
        fps,
        entry.nframes,
        entry.min_frames,
        entry.max_frames,
    )?;
    let picked: Vec<RgbImage> = indices.iter().map(|&i| frames[i].clone()).collect();
    Ok(VideoFrames {
        fps: indices.len() as f64 / total as f64 * sample_fps,
        frames: picked,
        frame_indices: indices,
        source_fps: sample_fps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_nframes_like_qwen_vl_utils() {
        // 20 frames at 10 fps sampled at 2 fps: 4 frames, linspace(0, 19, 4).round().
        assert_eq!(
            sample_indices(20, 10.0, Some(2.0), None, None, None).unwrap(),
            vec![0, 6, 13, 19]
        );
        // nframes 5 rounds to 4 (ties to even), 7 to 8.
        assert_eq!(
            sample_indices(8, 2.0, None, Some(5), None, None)
                .unwrap()
                .len(),
            4
        );
        assert!(sample_indices(6, 2.0, None, Some(7), None, None).is_err());
        assert!(sample_indices(6, 2.0, Some(1.0), Some(4), None, None).is_err());
    }

    #[test]
    fn frame_lists_keep_every_frame_and_pad_to_even() {
        let f = |v: u8| RgbImage::from_pixel(2, 2, image::Rgb([v, v, v]));
        let v = video_frames(
            &EncodedVideo::default(),
            vec![f(1), f(2), f(3)],
            &VideoOptions::default(),
        )
        .unwrap();
        assert_eq!(v.frames.len(), 4);
        assert_eq!(v.frames[3], f(3));
        assert_eq!((v.fps, v.source_fps), (2.0, 2.0));
        assert_eq!(v.frame_indices, vec![0, 1, 2, 3]);
        // With a target fps the frames are a video at sample_fps: 8 frames at 4 fps → 2 fps.
        let entry = EncodedVideo {
            sample_fps: Some(4.0),
            fps: Some(2.0),
            min_frames: Some(2),
            ..Default::default()
        };
        let frames: Vec<RgbImage> = (0..8).map(|k| f(k as u8)).collect();
        let v = video_frames(&entry, frames, &VideoOptions::default()).unwrap();
        assert_eq!(v.frame_indices, vec![0, 2, 5, 7]);
        assert_eq!((v.fps, v.source_fps), (2.0, 4.0));
    }
}
