//! The Qwen VL video processor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): frames → normalised temporal
//! patches, `video_grid_thw`, the video's timing, and the text its `<|video_pad|>` becomes.
//!
//! Reference: transformers 5.24 `Qwen2VLVideoProcessor` / `Qwen3VLVideoProcessor` with
//! `do_sample_frames = False` (verl samples frames before the processor; flowrl samples them in
//! the dataset), and the processors' `replace_video_token`:
//!
//! 1. every frame is resized to one `(H, W)`: Qwen2-VL's [`smart_resize`] with the video pixel
//!    limits, or Qwen3-VL's variant that budgets all frames together ([`smart_resize_video`]);
//! 2. rescale and normalise fused as transformers' torch backend does it, in f32:
//!    `v = (f32(u) − mean'_c) / std'_c` with `mean' = f32(mean)·f32(1/rescale_factor)` (same for
//!    `std'`);
//! 3. the frame count is padded to a multiple of `temporal_patch_size` `T` by repeating the last
//!    frame; `grid = [frames/T, H/p, W/p]`; row `((tt·(gh/m) + bh)·(gw/m) + bw)·m² + mh·m + mw`
//!    holds patch `(m·bh+mh, m·bw+mw)` of temporal patch `tt`, column `((c·T + f)·p + y)·p + x`
//!    the pixel `(c, y, x)` of frame `T·tt + f` (the picture layout with real frames);
//! 4. timing: `second_per_grid_t = T / fps` (Qwen2.5-VL's `second_per_grid_ts`), and per temporal
//!    patch the mean time of its first and last frame, `index / source_fps` (Qwen3-VL's
//!    `_calculate_timestamps`, indices padded like the frames);
//! 5. expansion of the template's `<|video_pad|>`: Qwen2-VL and Qwen2.5-VL write
//!    `grid_t·gh·gw/m²` copies; Qwen3-VL writes, per temporal patch,
//!    `<{seconds:.1f} seconds><|vision_start|>` + `gh·gw/m²` × `<|video_pad|>` + `<|vision_end|>`
//!    (inside the template's own `<|vision_start|>…<|vision_end|>`, as transformers 5.24's
//!    `Qwen3VLProcessor.replace_video_token` does).
//!
//! The settings come from `video_preprocessor_config.json` when the directory has one (its
//! `video_processor_type` picks the Qwen2-VL or Qwen3-VL resize), else from
//! `preprocessor_config.json` with `Qwen2VLVideoProcessor`'s defaults for the keys it lacks, as
//! `AutoVideoProcessor` does. Resizing uses Pillow's bicubic ([`resize_bicubic`]), like the image
//! processor; transformers resizes video frames with torchvision, which can differ by ±1 level
//! where a frame is actually resized (frames that already have the target size are exact).
//!
//! Not here: decoding video files (the dataset gives decoded frames) and frame sampling.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use image::RgbImage;
use serde_json::{Value, json};

use super::patches::{Qwen2VlProcessorConfig, patch_rows, smart_resize};
use crate::capabilities::{ProcessedImage, VideoFrames, VideoProcessor, VideoTiming};
use crate::image::{MAX_PIXEL_VALUES, resize_bicubic, round_half_even};

/// The token the chat templates write once per video.
pub const VIDEO_PAD_TOKEN: &str = "<|video_pad|>";
const VISION_START: &str = "<|vision_start|>";
const VISION_END: &str = "<|vision_end|>";

/// Which transformers video processor (and processor) the settings follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VideoFlavor {
    /// `Qwen2VLVideoProcessor` (Qwen2-VL, Qwen2.5-VL, and checkpoints without a Qwen3-VL video
    /// config): per-frame pixel limits, `<|video_pad|>` expanded in place.
    Qwen2Vl,
    /// `Qwen3VLVideoProcessor`: pixel limits over all frames, timestamped frames.
    Qwen3Vl,
}

/// The video processor of the Qwen VL families.
#[derive(Debug, Clone)]
pub struct QwenVideoProcessor {
    /// Pixel limits (`min_pixels`/`max_pixels` = `size.shortest_edge`/`longest_edge`), patch,
    /// merge and temporal patch sizes, rescale and normalisation of the video config.
    pub config: Qwen2VlProcessorConfig,
    pub flavor: VideoFlavor,
    /// Whether expansion writes timestamps (the processor class: `model_type` `qwen3_vl`).
    pub timestamps: bool,
}

impl QwenVideoProcessor {
    /// Reads the video settings of a Hugging Face model directory (see the module doc);
    /// `model_type` selects the timestamped expansion of Qwen3-VL's processor.
    pub fn from_dir(dir: &Path, model_type: &str) -> Result<Self> {
        let video = dir.join("video_preprocessor_config.json");
        let (path, flavor) = if video.exists() {
            let text = std::fs::read_to_string(&video)
                .with_context(|| format!("reading {}", video.display()))?;
            let json: Value = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", video.display()))?;
            let flavor = match json.get("video_processor_type").and_then(Value::as_str) {
                Some("Qwen3VLVideoProcessor") => VideoFlavor::Qwen3Vl,
                _ => VideoFlavor::Qwen2Vl,
            };
            (video, flavor)
        } else {
            (dir.join("preprocessor_config.json"), VideoFlavor::Qwen2Vl)
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let config = Self::config_from_json(&text, flavor)
            .with_context(|| format!("parsing the video settings of {}", path.display()))?;
        Ok(Self {
            config,
            flavor,
            timestamps: model_type == "qwen3_vl",
        })
    }

    /// The settings of a video (or image) processor config, with the video processor class's
    /// defaults for absent keys (Qwen2-VL: 128·28² to 768·28² pixels; Qwen3-VL: 128·32² to
    /// 768·32², patch 16, mean = std = 0.5).
    pub fn config_from_json(text: &str, flavor: VideoFlavor) -> Result<Qwen2VlProcessorConfig> {
        let mut json: Value = serde_json::from_str(text)?;
        let Some(obj) = json.as_object_mut() else {
            bail!("the processor config is not a JSON object");
        };
        let (min, max) = match flavor {
            VideoFlavor::Qwen2Vl => (128 * 28 * 28, 28 * 28 * 768),
            VideoFlavor::Qwen3Vl => (128 * 32 * 32, 32 * 32 * 768),
        };
        let size = obj.entry("size").or_insert_with(|| json!({}));
        if let Some(size) = size.as_object_mut() {
            size.entry("shortest_edge").or_insert(json!(min));
            size.entry("longest_edge").or_insert(json!(max));
        }
        if flavor == VideoFlavor::Qwen3Vl {
            obj.entry("patch_size").or_insert(json!(16));
            obj.entry("image_mean").or_insert(json!([0.5, 0.5, 0.5]));
            obj.entry("image_std").or_insert(json!([0.5, 0.5, 0.5]));
        }
        Qwen2VlProcessorConfig::from_json(&json.to_string())
    }

    /// Target `(height, width)` of `num_frames` frames of `width × height` (step 1).
    pub fn target_size(
        &self,
        num_frames: usize,
        width: usize,
        height: usize,
    ) -> Result<(usize, usize)> {
        let c = &self.config;
        if !c.do_resize {
            return Ok((height, width));
        }
        match self.flavor {
            VideoFlavor::Qwen2Vl => {
                smart_resize(height, width, c.factor(), c.min_pixels, c.max_pixels)
            }
            VideoFlavor::Qwen3Vl => smart_resize_video(
                num_frames,
                height,
                width,
                c.temporal_patch_size,
                c.factor(),
                c.min_pixels,
                c.max_pixels,
            ),
        }
    }

    /// Step 2's per-channel `(mean', std')`, or the plain rescale factor when only one of
    /// rescaling and normalising is on.
    fn scale(&self, u: u8, ch: usize) -> f32 {
        let c = &self.config;
        let u = f32::from(u);
        match (c.do_rescale, c.do_normalize) {
            (true, true) => {
                let inv = (1.0 / c.rescale_factor) as f32;
                (u - c.image_mean[ch] * inv) / (c.image_std[ch] * inv)
            }
            (false, true) => (u - c.image_mean[ch]) / c.image_std[ch],
            (true, false) => u * c.rescale_factor as f32,
            (false, false) => u,
        }
    }
}

/// transformers' Qwen3-VL video `smart_resize(num_frames, height, width, temporal_factor, factor,
/// min_pixels, max_pixels)`: frames smaller than `factor` are first scaled up to it (`int()`
/// truncation), then, with `t̄ = round(num_frames/temporal_factor)·temporal_factor`,
///
/// ```text
/// hb = round(h/f)·f ; wb = round(w/f)·f                       (ties to even)
/// if t̄·hb·wb > max:  β = √(n·h·w/max); hb = max(f, ⌊h/β/f⌋·f); wb = max(f, ⌊w/β/f⌋·f)
/// elif t̄·hb·wb < min: β = √(min/(n·h·w)); hb = ⌈h·β/f⌉·f;     wb = ⌈w·β/f⌉·f
/// ```
pub fn smart_resize_video(
    num_frames: usize,
    height: usize,
    width: usize,
    temporal_factor: usize,
    factor: usize,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(usize, usize)> {
    ensure!(
        num_frames >= temporal_factor,
        "t:{num_frames} must be larger than temporal_factor:{temporal_factor}"
    );
    ensure!(height > 0 && width > 0, "empty frame {width}x{height}");
    let (mut h, mut w, f) = (height as f64, width as f64, factor as f64);
    if h < f || w < f {
        let scale = (f / h).max(f / w);
        h = (h * scale).trunc();
        w = (w * scale).trunc();
    }
    let ratio = h.max(w) / h.min(w);
    if ratio > 200.0 {
        bail!("absolute aspect ratio must be smaller than 200, got {ratio} ({width}x{height})");
    }
    let n = num_frames as f64;
    let mut hb = round_half_even(h / f) * f;
    let mut wb = round_half_even(w / f) * f;
    let tb = round_half_even(n / temporal_factor as f64) * temporal_factor as f64;
    if tb * hb * wb > max_pixels as f64 {
        let beta = (n * h * w / max_pixels as f64).sqrt();
        hb = f.max((h / beta / f).floor() * f);
        wb = f.max((w / beta / f).floor() * f);
    } else if tb * hb * wb < min_pixels as f64 {
        let beta = (min_pixels as f64 / (n * h * w)).sqrt();
        hb = (h * beta / f).ceil() * f;
        wb = (w * beta / f).ceil() * f;
    }
    Ok((hb as usize, wb as usize))
}

impl VideoProcessor for QwenVideoProcessor {
    /// Steps 1–4 of the module doc.
    fn process_video(&self, video: &VideoFrames) -> Result<ProcessedImage> {
        let c = &self.config;
        let frames = &video.frames;
        ensure!(!frames.is_empty(), "the video has no frames");
        ensure!(
            video.frame_indices.len() == frames.len(),
            "{} frame indices for {} frames",
            video.frame_indices.len(),
            frames.len()
        );
        ensure!(
            video.fps > 0.0 && video.source_fps > 0.0,
            "the video's fps must be positive (fps {}, source fps {})",
            video.fps,
            video.source_fps
        );
        let (w0, h0) = frames[0].dimensions();
        for (k, f) in frames.iter().enumerate() {
            ensure!(
                f.dimensions() == (w0, h0),
                "frame {k} is {}x{}, frame 0 is {w0}x{h0}: a video's frames must share one size",
                f.width(),
                f.height()
            );
        }
        let (p, m, tp) = (c.patch_size, c.merge_size, c.temporal_patch_size);
        let padded = frames.len().div_ceil(tp) * tp;
        let (h, w) = self.target_size(frames.len(), w0 as usize, h0 as usize)?;
        let values = h.saturating_mul(w).saturating_mul(3 * padded);
        ensure!(
            values <= MAX_PIXEL_VALUES && u32::try_from(h.max(w)).is_ok(),
            "{} frames of {w0}x{h0} would be resized to {w}x{h}, {values} values (more than {MAX_PIXEL_VALUES}): check the video pixel limits of the processor config",
            frames.len()
        );
        ensure!(
            h % (p * m) == 0 && w % (p * m) == 0,
            "frames {w}x{h} are not a multiple of patch_size·merge_size = {}",
            p * m
        );
        let resized: Vec<RgbImage> = frames
            .iter()
            .map(|f| {
                if f.dimensions() == (w as u32, h as u32) {
                    f.clone()
                } else {
                    resize_bicubic(f, w as u32, h as u32)
                }
            })
            .collect();
        let frame = |k: usize| &resized[k.min(resized.len() - 1)];
        let (gt, gh, gw) = (padded / tp, h / p, w / p);
        let row_len = 3 * tp * p * p;
        let pixel_values = patch_rows(
            [gt, gh, gw],
            [p, m, tp],
            w,
            |k| &frame(k).as_raw()[..],
            |u, ch| self.scale(u, ch),
        );
        let last = *video.frame_indices.last().expect("non-empty");
        let index = |k: usize| video.frame_indices.get(k).copied().unwrap_or(last) as f64;
        let patch_seconds = (0..gt)
            .map(|tt| {
                let (a, b) = (index(tt * tp), index(tt * tp + tp - 1));
                (a / video.source_fps + b / video.source_fps) / 2.0
            })
            .collect();
        Ok(ProcessedImage {
            pixel_values,
            shape: vec![gt * gh * gw, row_len],
            grid: vec![gt, gh, gw],
            num_tokens: gt * gh * gw / (m * m),
            patch_positions: None,
            video: Some(VideoTiming {
                second_per_grid_t: (tp as f64 / video.fps) as f32,
                patch_seconds,
            }),
        })
    }

    fn placeholder_text(&self) -> &str {
        VIDEO_PAD_TOKEN
    }

    /// Step 5 of the module doc.
    fn expanded_text(&self, video: &ProcessedImage) -> Result<String> {
        let Some(timing) = &video.video else {
            bail!("expanded_text was given a picture, not a video");
        };
        ensure!(
            video.grid.len() == 3,
            "grid {:?} is not [t, h, w]",
            video.grid
        );
        let m2 = self.config.merge_size * self.config.merge_size;
        let (gt, per_frame) = (video.grid[0], video.grid[1] * video.grid[2] / m2);
        if !self.timestamps {
            return Ok(VIDEO_PAD_TOKEN.repeat(gt * per_frame));
        }
        ensure!(
            timing.patch_seconds.len() == gt,
            "{} timestamps for {gt} temporal patches",
            timing.patch_seconds.len()
        );
        let mut out = String::new();
        for s in &timing.patch_seconds {
            out.push_str(&format!("<{s:.1} seconds>{VISION_START}"));
            out.push_str(&VIDEO_PAD_TOKEN.repeat(per_frame));
            out.push_str(VISION_END);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn video(n: usize, w: u32, h: u32, fps: f64) -> VideoFrames {
        let frames = (0..n)
            .map(|k| RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, k as u8 * 40])))
            .collect();
        VideoFrames::from_list(frames, fps)
    }

    fn processor(timestamps: bool) -> QwenVideoProcessor {
        let text = r#"{"size": {"shortest_edge": 3136, "longest_edge": 12544}}"#;
        QwenVideoProcessor {
            config: QwenVideoProcessor::config_from_json(text, VideoFlavor::Qwen2Vl).unwrap(),
            flavor: VideoFlavor::Qwen2Vl,
            timestamps,
        }
    }

    #[test]
    fn odd_frame_counts_repeat_the_last_frame() {
        let p = processor(false);
        // 56x28 is below min_pixels 3136: resized to 84x56 (6x4 patches).
        let out = p.process_video(&video(3, 56, 28, 2.0)).unwrap();
        assert_eq!(out.grid, vec![2, 4, 6]);
        assert_eq!(out.num_tokens, 12);
        let timing = out.video.as_ref().unwrap();
        assert_eq!(timing.second_per_grid_t, 1.0);
        // Patch 1 holds frame 2 twice: both at 1 s.
        assert_eq!(timing.patch_seconds, vec![0.25, 1.0]);
        // Column of the second temporal slice of temporal patch 1 = frame 2 (the repeat).
        let row_len = out.shape[1];
        let first_row_of_patch_1 = &out.pixel_values[24 * row_len..25 * row_len];
        let slice = 14 * 14;
        assert_eq!(
            first_row_of_patch_1[2 * slice..3 * slice],
            first_row_of_patch_1[3 * slice..4 * slice]
        );
        assert_eq!(p.expanded_text(&out).unwrap(), VIDEO_PAD_TOKEN.repeat(12));
    }

    #[test]
    fn qwen3_expansion_writes_a_timestamp_per_temporal_patch() {
        let p = processor(true);
        let out = p.process_video(&video(4, 56, 56, 2.0)).unwrap();
        assert_eq!(out.grid, vec![2, 4, 4]);
        let text = p.expanded_text(&out).unwrap();
        let frame = format!("{VISION_START}{}{VISION_END}", VIDEO_PAD_TOKEN.repeat(4));
        assert_eq!(text, format!("<0.2 seconds>{frame}<1.2 seconds>{frame}"));
    }

    #[test]
    fn qwen3_smart_resize_budgets_all_frames() {
        // 4 frames of 64x64 with factor 32: t̄·hb·wb = 4·64·64 = 16384 > 8192 → β = √2.
        assert_eq!(
            smart_resize_video(4, 64, 64, 2, 32, 2048, 8192).unwrap(),
            (32, 32)
        );
        assert!(smart_resize_video(1, 64, 64, 2, 32, 2048, 8192).is_err());
    }

    #[test]
    fn frames_of_different_sizes_are_an_error() {
        let mut v = video(2, 56, 56, 2.0);
        v.frames[1] = RgbImage::new(28, 56);
        let err = processor(false).process_video(&v).unwrap_err();
        assert!(err.to_string().contains("share one size"), "{err}");
    }
}
