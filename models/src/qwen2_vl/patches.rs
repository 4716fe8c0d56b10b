//! What Qwen's image and video processors share: the settings of `preprocessor_config.json`,
//! transformers' `smart_resize`, and the flattening of frames into merged patch rows.

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;

use crate::image::round_half_even;

/// Pillow's resample code for bicubic, the only one supported.
const PIL_BICUBIC: u32 = 3;

/// Settings of `preprocessor_config.json` that the processor uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlProcessorConfig {
    pub min_pixels: u64,
    pub max_pixels: u64,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    pub do_resize: bool,
    pub do_rescale: bool,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
}

/// The JSON form; transformers 5 stores `min_pixels`/`max_pixels` as `size.shortest_edge` /
/// `size.longest_edge`, older files as top-level `min_pixels`/`max_pixels` (which win when both
/// are present, as in transformers' constructor).
#[derive(Deserialize)]
struct RawConfig {
    size: Option<RawSize>,
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
    patch_size: Option<usize>,
    temporal_patch_size: Option<usize>,
    merge_size: Option<usize>,
    do_resize: Option<bool>,
    do_rescale: Option<bool>,
    rescale_factor: Option<f64>,
    do_normalize: Option<bool>,
    image_mean: Option<[f64; 3]>,
    image_std: Option<[f64; 3]>,
    resample: Option<u32>,
}

#[derive(Deserialize)]
struct RawSize {
    shortest_edge: Option<u64>,
    longest_edge: Option<u64>,
}

impl Qwen2VlProcessorConfig {
    /// Parses the text of a `preprocessor_config.json`; absent keys take transformers' defaults
    /// (min 56·56, max 28·28·1280 pixels, patch 14, temporal patch 2, merge 2, CLIP mean/std).
    pub fn from_json(text: &str) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text).context("preprocessor_config.json")?;
        let resample = raw.resample.unwrap_or(PIL_BICUBIC);
        ensure!(
            resample == PIL_BICUBIC,
            "resample = {resample} is not supported (only 3 = bicubic)"
        );
        let size = raw.size.as_ref();
        let min_pixels = raw
            .min_pixels
            .or(size.and_then(|s| s.shortest_edge))
            .unwrap_or(56 * 56);
        let max_pixels = raw
            .max_pixels
            .or(size.and_then(|s| s.longest_edge))
            .unwrap_or(28 * 28 * 1280);
        let to_f32 = |v: [f64; 3]| v.map(|x| x as f32);
        let config = Self {
            min_pixels,
            max_pixels,
            patch_size: raw.patch_size.unwrap_or(14),
            temporal_patch_size: raw.temporal_patch_size.unwrap_or(2),
            merge_size: raw.merge_size.unwrap_or(2),
            do_resize: raw.do_resize.unwrap_or(true),
            do_rescale: raw.do_rescale.unwrap_or(true),
            rescale_factor: raw.rescale_factor.unwrap_or(1.0 / 255.0),
            do_normalize: raw.do_normalize.unwrap_or(true),
            image_mean: to_f32(
                raw.image_mean
                    .unwrap_or([0.48145466, 0.4578275, 0.40821073]),
            ),
            image_std: to_f32(
                raw.image_std
                    .unwrap_or([0.26862954, 0.26130258, 0.27577711]),
            ),
        };
        ensure!(
            config.patch_size > 0 && config.merge_size > 0 && config.temporal_patch_size > 0,
            "patch_size, merge_size and temporal_patch_size must be positive"
        );
        ensure!(
            config.patch_size <= 1024
                && config.merge_size <= 64
                && config.temporal_patch_size <= 64,
            "patch_size = {}, merge_size = {} and temporal_patch_size = {} are implausibly large (at most 1024, 64 and 64)",
            config.patch_size,
            config.merge_size,
            config.temporal_patch_size
        );
        Ok(config)
    }

    /// Side multiple of the resized picture: `patch_size · merge_size` (28).
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }
}

/// Hugging Face's `smart_resize(height, width, factor, min_pixels, max_pixels)` in f64:
///
/// ```text
/// hb = round(h/f)·f ; wb = round(w/f)·f                     (Python round: ties to even)
/// if hb·wb > max:  β = √(h·w/max); hb = max(f, ⌊h/β/f⌋·f); wb = max(f, ⌊w/β/f⌋·f)
/// elif hb·wb < min: β = √(min/(h·w)); hb = ⌈h·β/f⌉·f;       wb = ⌈w·β/f⌉·f
/// ```
/// Returns `(hb, wb)`. An aspect ratio above 200 is an error; there is no second range check
/// (the max branch may end below `min_pixels` and the min branch above `max_pixels`).
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(usize, usize)> {
    ensure!(height > 0 && width > 0, "empty picture {width}x{height}");
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let ratio = h.max(w) / h.min(w);
    if ratio > 200.0 {
        bail!("absolute aspect ratio must be smaller than 200, got {ratio} ({width}x{height})");
    }
    let mut hb = round_half_even(h / f) * f;
    let mut wb = round_half_even(w / f) * f;
    if hb * wb > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        hb = f.max((h / beta / f).floor() * f);
        wb = f.max((w / beta / f).floor() * f);
    } else if hb * wb < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        hb = (h * beta / f).ceil() * f;
        wb = (w * beta / f).ceil() * f;
    }
    Ok((hb as usize, wb as usize))
}

/// Patch rows of `gt` temporal patches of `tp` frames each, `grid = [gt, gh, gw]` patches of
/// `p`×`p` pixels merged `m`×`m`, from RGB frames `width` pixels wide: row
/// `((tt·(gh/m) + bh)·(gw/m) + bw)·m² + mh·m + mw`, column `((c·T + f)·p + y)·p + x` holds
/// `scale` of the value of frame `tt·T + f` (`frame` maps a frame index to its RGB bytes).
/// Shared by the image and video processors.
pub(crate) fn patch_rows<'a>(
    [gt, gh, gw]: [usize; 3],
    [p, m, tp]: [usize; 3],
    width: usize,
    frame: impl Fn(usize) -> &'a [u8],
    scale: impl Fn(u8, usize) -> f32,
) -> Vec<f32> {
    let mut pixel_values = Vec::with_capacity(gt * gh * gw * 3 * tp * p * p);
    for tt in 0..gt {
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for mh in 0..m {
                    for mw in 0..m {
                        let (py, px) = (bh * m + mh, bw * m + mw);
                        for ch in 0..3 {
                            for f in 0..tp {
                                let raw = frame(tt * tp + f);
                                for y in 0..p {
                                    let row = (py * p + y) * width;
                                    for x in 0..p {
                                        let u = raw[(row + px * p + x) * 3 + ch];
                                        pixel_values.push(scale(u, ch));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    pixel_values
}
