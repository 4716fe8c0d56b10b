//! The Qwen2-VL / Qwen2.5-VL image processor (both families share it): picture → normalised,
//! patch-flattened pixel rows, `grid_thw`, and the expansion of `<|image_pad|>` in the prompt.
//!
//! Reference: transformers 5.24 `Qwen2VLImageProcessorPil` (PIL backend), which the fixtures were
//! made with; see `smart_resize`, [`Qwen2VlImageProcessor::process`] for the exact steps. The
//! torchvision ("fast") backend resizes differently (±1 LSB) and is not reproduced.
//!
//! Not here: decoding files and colour conversion ([`crate::image`]). A picture's temporal
//! patches are filled by repeating the single frame; videos are [`super::video`]'s, which
//! [`ImageProcessor::video`] gives.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use image::RgbImage;
use serde::Deserialize;

use crate::capabilities::{ImageProcessor, ProcessedImage, VideoProcessor};
use crate::image::{PixelScale, expand_image_placeholders, resize_bicubic, round_half_even};
use crate::qwen2_vl::video::QwenVideoProcessor;

/// The placeholder string Qwen's chat template emits once per image.
pub const IMAGE_PAD_TOKEN: &str = "<|image_pad|>";

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

/// Qwen2-VL's image processor with the token id its placeholder expands into.
#[derive(Debug, Clone)]
pub struct Qwen2VlImageProcessor {
    pub config: Qwen2VlProcessorConfig,
    /// Id of `<|image_pad|>` (`config.json`'s `image_token_id`).
    pub image_token_id: u32,
    /// The video processor of the same directory ([`Self::from_dir`]); `None` from [`Self::new`].
    pub video: Option<QwenVideoProcessor>,
}

impl Qwen2VlImageProcessor {
    pub fn new(config: Qwen2VlProcessorConfig, image_token_id: u32) -> Self {
        Self {
            config,
            image_token_id,
            video: None,
        }
    }

    /// Reads `preprocessor_config.json` and `config.json`'s `image_token_id` from a Hugging Face
    /// model directory, and the video processor's settings ([`QwenVideoProcessor::from_dir`]).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("preprocessor_config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let config = Qwen2VlProcessorConfig::from_json(&text)
            .with_context(|| format!("parsing {}", path.display()))?;
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let Some(id) = json.get("image_token_id").and_then(|v| v.as_u64()) else {
            bail!("{} has no integer `image_token_id`", path.display());
        };
        let model_type = json
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let video = QwenVideoProcessor::from_dir(dir, model_type)?;
        Ok(Self {
            video: Some(video),
            ..Self::new(config, u32::try_from(id)?)
        })
    }

    /// Target `(height, width)` of a `width × height` picture ([`smart_resize`]), or its own
    /// size when `do_resize` is off.
    pub fn target_size(&self, width: usize, height: usize) -> Result<(usize, usize)> {
        let c = &self.config;
        if !c.do_resize {
            return Ok((height, width));
        }
        smart_resize(height, width, c.factor(), c.min_pixels, c.max_pixels)
    }

    /// Steps 2–3: the picture resized with Pillow's bicubic to [`Self::target_size`].
    pub fn resize(&self, image: &RgbImage) -> Result<RgbImage> {
        let (h, w) = self.target_size(image.width() as usize, image.height() as usize)?;
        // The patch rows hold 3·T values per pixel: bounded memory whatever min_pixels says.
        let values = h
            .saturating_mul(w)
            .saturating_mul(3 * self.config.temporal_patch_size);
        ensure!(
            values <= crate::image::MAX_PIXEL_VALUES && u32::try_from(h.max(w)).is_ok(),
            "a {}x{} picture would be resized to {w}x{h}, {values} values (more than {}): check min_pixels / max_pixels (size.shortest_edge / longest_edge) of preprocessor_config.json",
            image.width(),
            image.height(),
            crate::image::MAX_PIXEL_VALUES
        );
        Ok(resize_bicubic(image, w as u32, h as u32))
    }

    /// Steps 4–5 on an already resized picture: rescale `v = f32(f64(u8)·rescale_factor)`,
    /// normalise `(v − mean_c) / std_c` in f32, and flatten into patch rows.
    ///
    /// With `gh = H/14`, `gw = W/14`, `m = merge_size`, `T = temporal_patch_size`, row
    /// `r = ((bh·(gw/m) + bw)·m + mh)·m + mw` holds patch `(m·bh+mh, m·bw+mw)` and column
    /// `((c·T + t)·14 + y)·14 + x` the pixel `(c, 14·(m·bh+mh)+y, 14·(m·bw+mw)+x)`; the `T`
    /// temporal slices are copies of the one frame. `grid = [1, gh, gw]`, tokens `gh·gw/m²`.
    pub fn patchify(&self, resized: &RgbImage) -> Result<ProcessedImage> {
        let c = &self.config;
        let (width, height) = (resized.width() as usize, resized.height() as usize);
        let (p, m, tp) = (c.patch_size, c.merge_size, c.temporal_patch_size);
        ensure!(
            height % (p * m) == 0 && width % (p * m) == 0,
            "picture {width}x{height} is not a multiple of patch_size·merge_size = {}",
            p * m
        );
        let (gh, gw) = (height / p, width / p);
        let scale = PixelScale::new(
            c.do_rescale,
            c.rescale_factor,
            c.do_normalize,
            c.image_mean,
            c.image_std,
        );
        let raw = resized.as_raw();
        let row_len = 3 * tp * p * p;
        let pixel_values = patch_rows(
            [1, gh, gw],
            [p, m, tp],
            width,
            |_| &raw[..],
            |u, ch| scale.apply(u, ch),
        );
        Ok(ProcessedImage {
            pixel_values,
            shape: vec![gh * gw, row_len],
            grid: vec![1, gh, gw],
            num_tokens: gh * gw / (m * m),
            patch_positions: None,
            video: None,
        })
    }
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

/// [`Qwen2VlImageProcessor::from_dir`], boxed: the family's `FamilyConfig::IMAGE_PROCESSOR`.
pub fn load_boxed(dir: &Path) -> Result<Box<dyn ImageProcessor>> {
    Ok(Box::new(Qwen2VlImageProcessor::from_dir(dir)?))
}

impl ImageProcessor for Qwen2VlImageProcessor {
    /// Resize ([`Self::resize`]) then rescale, normalise and flatten ([`Self::patchify`]).
    fn process(&self, image: &RgbImage) -> Result<ProcessedImage> {
        self.patchify(&self.resize(image)?)
    }

    fn placeholder_token(&self) -> &str {
        IMAGE_PAD_TOKEN
    }

    /// Each `<|image_pad|>` id, in order, becomes `images[k].num_tokens` copies of itself
    /// (the surrounding `<|vision_start|>`/`<|vision_end|>` come from the chat template).
    fn expand_placeholders(&self, ids: &[u32], images: &[ProcessedImage]) -> Result<Vec<u32>> {
        expand_image_placeholders(ids, self.image_token_id, images, |n, out| {
            out.extend(std::iter::repeat_n(self.image_token_id, n))
        })
    }

    fn video(&self) -> Option<&dyn VideoProcessor> {
        self.video.as_ref().map(|v| v as &dyn VideoProcessor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_ties_round_to_even() {
        // 70/28 = 2.5 → 2, 126/28 = 4.5 → 4, 98/28 = 3.5 → 4 (not 3, 5, 4 with half-up).
        assert_eq!(smart_resize(70, 126, 28, 0, u64::MAX).unwrap(), (56, 112));
        assert_eq!(smart_resize(98, 98, 28, 0, u64::MAX).unwrap(), (112, 112));
    }

    #[test]
    fn smart_resize_branches() {
        // Thin 300x10 with min 4000: the min branch ends above max (13·28 = 364 wide).
        assert_eq!(smart_resize(10, 300, 28, 4000, 8000).unwrap(), (28, 364));
        // 260x190 with max 8000: β = √(49400/8000), ⌊190/β/28⌋ = 2, ⌊260/β/28⌋ = 3.
        assert_eq!(smart_resize(190, 260, 28, 4000, 8000).unwrap(), (56, 84));
    }

    #[test]
    fn aspect_ratio_above_200_is_an_error() {
        let err = smart_resize(1, 201, 28, 3136, 1_003_520).unwrap_err();
        assert!(
            err.to_string()
                .contains("absolute aspect ratio must be smaller than 200, got 201"),
            "{err}"
        );
        assert!(smart_resize(1, 200, 28, 3136, 1_003_520).is_ok());
    }

    #[test]
    fn config_accepts_both_key_styles() {
        let new = r#"{"size": {"shortest_edge": 4000, "longest_edge": 8000}}"#;
        let c = Qwen2VlProcessorConfig::from_json(new).unwrap();
        assert_eq!((c.min_pixels, c.max_pixels), (4000, 8000));
        let old = r#"{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14}"#;
        let c = Qwen2VlProcessorConfig::from_json(old).unwrap();
        assert_eq!((c.min_pixels, c.max_pixels), (3136, 12_845_056));
        let bad = r#"{"resample": 2}"#;
        assert!(Qwen2VlProcessorConfig::from_json(bad).is_err());
    }

    #[test]
    fn placeholder_count_must_match_images() {
        let c = Qwen2VlProcessorConfig::from_json("{}").unwrap();
        let p = Qwen2VlImageProcessor::new(c, 9);
        let image = ProcessedImage {
            pixel_values: vec![],
            shape: vec![0, 1176],
            grid: vec![1, 2, 4],
            num_tokens: 2,
            patch_positions: None,
            video: None,
        };
        let ids = [1, 8, 9, 7, 8, 9, 7];
        let out = p
            .expand_placeholders(&ids, &[image.clone(), image.clone()])
            .unwrap();
        assert_eq!(out, vec![1, 8, 9, 9, 7, 8, 9, 9, 7]);
        let err = p.expand_placeholders(&ids, &[image]).unwrap_err();
        assert!(err.to_string().contains("2 image placeholders"), "{err}");
    }
}
