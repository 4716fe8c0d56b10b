//! The Gemma 4 image processor: picture → aspect-preserving resize to the soft-token budget,
//! rescale to [0, 1] (no mean/std), 16×16 patches in row-major order padded to `max_patches`,
//! per-patch `(x, y)` positions (`(−1, −1)` on padding), soft-token count, and the expansion of
//! `<|image|>` into `<|image>` + soft tokens + `<image|>`.
//!
//! Backend matched: **PIL** (transformers 5.24 `Gemma4ImageProcessorPil`, `Image.resize(BICUBIC)`
//! on uint8 via [`crate::image::resize_bicubic`]), which the fixtures were made with. The
//! torchvision backend (`Gemma4ImageProcessor`, what `image_processor_type` names) differs by
//! 1–2/255 on about 40 % of the values and is not reproduced.
//!
//! Not here: decoding and colour conversion ([`crate::image`]); the vision tower's own
//! `2·(x − 0.5)` input scaling, which happens inside the model.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use image::RgbImage;
use serde::Deserialize;

use crate::capabilities::{ImageProcessor, ProcessedImage};
use crate::image::{PixelScale, expand_image_placeholders, resize_bicubic};

/// The placeholder string Gemma 4's chat template emits once per image.
pub const IMAGE_TOKEN: &str = "<|image|>";

/// Soft-token budgets the reference accepts.
const SUPPORTED_MAX_SOFT_TOKENS: [usize; 5] = [70, 140, 280, 560, 1120];

/// Pillow's resample code for bicubic, the only one supported.
const PIL_BICUBIC: u32 = 3;

/// Settings of `preprocessor_config.json` that the processor uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4ProcessorConfig {
    /// Soft tokens per image at most (70 → `max_patches = 70·k²`).
    pub max_soft_tokens: usize,
    pub patch_size: usize,
    /// Side `k` of the pooler's k×k window: one soft token per k×k patches.
    pub pooling_kernel_size: usize,
    pub do_resize: bool,
    pub do_rescale: bool,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
}

#[derive(Deserialize)]
struct RawConfig {
    max_soft_tokens: Option<usize>,
    patch_size: Option<usize>,
    pooling_kernel_size: Option<usize>,
    do_resize: Option<bool>,
    do_rescale: Option<bool>,
    rescale_factor: Option<f64>,
    do_normalize: Option<bool>,
    image_mean: Option<[f64; 3]>,
    image_std: Option<[f64; 3]>,
    resample: Option<u32>,
}

impl Gemma4ProcessorConfig {
    /// Parses the text of a `preprocessor_config.json` (defaults: 280 soft tokens, patch 16,
    /// pooling 3, rescale 1/255, no normalisation).
    pub fn from_json(text: &str) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text).context("preprocessor_config.json")?;
        let resample = raw.resample.unwrap_or(PIL_BICUBIC);
        ensure!(
            resample == PIL_BICUBIC,
            "resample = {resample} is not supported (only 3 = bicubic)"
        );
        let to_f32 = |v: [f64; 3]| v.map(|x| x as f32);
        let config = Self {
            max_soft_tokens: raw.max_soft_tokens.unwrap_or(280),
            patch_size: raw.patch_size.unwrap_or(16),
            pooling_kernel_size: raw.pooling_kernel_size.unwrap_or(3),
            do_resize: raw.do_resize.unwrap_or(true),
            do_rescale: raw.do_rescale.unwrap_or(true),
            rescale_factor: raw.rescale_factor.unwrap_or(1.0 / 255.0),
            do_normalize: raw.do_normalize.unwrap_or(false),
            image_mean: to_f32(raw.image_mean.unwrap_or([0.0; 3])),
            image_std: to_f32(raw.image_std.unwrap_or([1.0; 3])),
        };
        ensure!(
            SUPPORTED_MAX_SOFT_TOKENS.contains(&config.max_soft_tokens),
            "max_soft_tokens = {} is not one of {SUPPORTED_MAX_SOFT_TOKENS:?}",
            config.max_soft_tokens
        );
        ensure!(
            config.patch_size > 0 && config.pooling_kernel_size > 0,
            "patch_size and pooling_kernel_size must be positive"
        );
        ensure!(
            config.patch_size <= 1024 && config.pooling_kernel_size <= 64,
            "patch_size = {} and pooling_kernel_size = {} are implausibly large (at most 1024 and 64)",
            config.patch_size,
            config.pooling_kernel_size
        );
        // Every image is padded to `max_patches` patches of 3·p² values: bounded memory.
        let values = config.max_patches() * 3 * config.patch_size * config.patch_size;
        ensure!(
            values <= crate::image::MAX_PIXEL_VALUES,
            "max_soft_tokens = {}, pooling_kernel_size = {} and patch_size = {} pad every image to {values} values, more than {}",
            config.max_soft_tokens,
            config.pooling_kernel_size,
            config.patch_size,
            crate::image::MAX_PIXEL_VALUES
        );
        Ok(config)
    }

    /// Patches per image after padding: `max_soft_tokens · k²` (630).
    pub fn max_patches(&self) -> usize {
        self.max_soft_tokens * self.pooling_kernel_size * self.pooling_kernel_size
    }

    /// Side multiple of the resized picture: `patch_size · k` (48).
    pub fn side_multiple(&self) -> usize {
        self.patch_size * self.pooling_kernel_size
    }
}

/// Gemma 4's aspect-preserving target size `(th, tw)` of an `h × w` picture, in f64:
///
/// ```text
/// f  = √(max_patches·p² / (h·w))        s = p·k
/// th = ⌊f·h / s⌋·s ;  tw = ⌊f·w / s⌋·s
/// if th = 0: th = s, tw = min(⌊w/h⌋·s, max_soft_tokens·s)   (and symmetrically for tw = 0)
/// ```
/// then `th·tw ≤ max_patches·p²` is checked. Small pictures are upscaled. Reference:
/// transformers 5.24 `gemma4/image_processing_pil_gemma4.py::get_aspect_ratio_preserving_size`.
pub fn target_size(
    height: usize,
    width: usize,
    config: &Gemma4ProcessorConfig,
) -> Result<(usize, usize)> {
    ensure!(height > 0 && width > 0, "empty picture {width}x{height}");
    let (h, w) = (height as f64, width as f64);
    let p = config.patch_size as f64;
    let s = config.side_multiple();
    let f = (config.max_patches() as f64 * p * p / (h * w)).sqrt();
    let mut th = ((f * h) / s as f64).floor() as usize * s;
    let mut tw = ((f * w) / s as f64).floor() as usize * s;
    let max_side = config.max_soft_tokens * s;
    match (th, tw) {
        (0, 0) => bail!(
            "picture {width}x{height} would be resized to 0x0 (sides must be multiples of {s})"
        ),
        (0, _) => {
            th = s;
            tw = ((w / h).floor() as usize * s).min(max_side);
        }
        (_, 0) => {
            tw = s;
            th = ((h / w).floor() as usize * s).min(max_side);
        }
        _ => {}
    }
    let budget = config.max_patches() * config.patch_size * config.patch_size;
    ensure!(
        th * tw <= budget,
        "resizing {width}x{height} to {tw}x{th} exceeds {} patches of size {}",
        config.max_patches(),
        config.patch_size
    );
    Ok((th, tw))
}

/// Gemma 4's image processor with the token ids of its placeholder expansion.
#[derive(Debug, Clone)]
pub struct Gemma4ImageProcessor {
    pub config: Gemma4ProcessorConfig,
    /// `<|image>` (`config.json`'s `boi_token_id`).
    pub boi_token_id: u32,
    /// `<|image|>`, both the prompt placeholder and each soft token (`image_token_id`).
    pub image_token_id: u32,
    /// `<image|>` (`eoi_token_id`).
    pub eoi_token_id: u32,
}

impl Gemma4ImageProcessor {
    pub fn new(config: Gemma4ProcessorConfig, boi: u32, image: u32, eoi: u32) -> Self {
        Self {
            config,
            boi_token_id: boi,
            image_token_id: image,
            eoi_token_id: eoi,
        }
    }

    /// Reads `preprocessor_config.json` and the image token ids of `config.json`
    /// (`boi_token_id`, `image_token_id`, `eoi_token_id`; `*_index` spellings are accepted).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("preprocessor_config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let config = Gemma4ProcessorConfig::from_json(&text)
            .with_context(|| format!("parsing {}", path.display()))?;
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let id = |name: &str| -> Result<u32> {
            let index = name.replace("_id", "_index");
            match json.get(name).or(json.get(&index)).and_then(|v| v.as_u64()) {
                Some(v) => Ok(u32::try_from(v)?),
                None => bail!("{} has no integer `{name}`", path.display()),
            }
        };
        Ok(Self::new(
            config,
            id("boi_token_id")?,
            id("image_token_id")?,
            id("eoi_token_id")?,
        ))
    }

    /// Target `(height, width)` ([`target_size`]), or the picture's own size without `do_resize`.
    pub fn target_size(&self, width: usize, height: usize) -> Result<(usize, usize)> {
        if !self.config.do_resize {
            return Ok((height, width));
        }
        target_size(height, width, &self.config)
    }

    /// Steps 2–3: the picture resized with Pillow's bicubic (unchanged when already that size).
    pub fn resize(&self, image: &RgbImage) -> Result<RgbImage> {
        let (h, w) = self.target_size(image.width() as usize, image.height() as usize)?;
        Ok(resize_bicubic(image, w as u32, h as u32))
    }

    /// Steps 4–7 on a resized picture: `v = f32(f64(u8)·rescale_factor)` (then `(v − mean)/std`
    /// only if `do_normalize`); patches `(py, px)` in row-major order, element
    /// `(dy·p + dx)·3 + c` = pixel `(p·py + dy, p·px + dx, c)`; positions `(x = px, y = py)`;
    /// zero rows with position `(−1, −1)` up to `max_patches`; `num_tokens = ⌊patches / k²⌋`
    /// (exact after [`Self::resize`], whose sides are multiples of `p·k`).
    /// `shape = [max_patches, 3·p²]`, `grid = [gh, gw]` (real patch grid).
    pub fn patchify(&self, resized: &RgbImage) -> Result<ProcessedImage> {
        let c = &self.config;
        let (width, height) = (resized.width() as usize, resized.height() as usize);
        let (p, k) = (c.patch_size, c.pooling_kernel_size);
        ensure!(
            height % p == 0 && width % p == 0,
            "picture {width}x{height} is not a multiple of patch_size = {p}"
        );
        let (gh, gw) = (height / p, width / p);
        let max_patches = c.max_patches();
        ensure!(
            gh * gw <= max_patches,
            "picture {width}x{height} has {} patches, more than max_patches = {max_patches}",
            gh * gw
        );
        let row_len = 3 * p * p;
        let raw = resized.as_raw();
        let scale = PixelScale::new(
            c.do_rescale,
            c.rescale_factor,
            c.do_normalize,
            c.image_mean,
            c.image_std,
        );
        let mut pixel_values = vec![0f32; max_patches * row_len];
        let mut patch_positions = vec![[-1i64, -1]; max_patches];
        for py in 0..gh {
            for px in 0..gw {
                let patch = py * gw + px;
                patch_positions[patch] = [px as i64, py as i64];
                let out = &mut pixel_values[patch * row_len..(patch + 1) * row_len];
                for dy in 0..p {
                    let src = ((py * p + dy) * width + px * p) * 3;
                    for (o, (i, &u)) in out[dy * p * 3..(dy + 1) * p * 3]
                        .iter_mut()
                        .zip(raw[src..src + p * 3].iter().enumerate())
                    {
                        *o = scale.apply(u, i % 3);
                    }
                }
            }
        }
        Ok(ProcessedImage {
            pixel_values,
            shape: vec![max_patches, row_len],
            grid: vec![gh, gw],
            num_tokens: gh * gw / (k * k),
            patch_positions: Some(patch_positions),
            video: None,
        })
    }
}

/// [`Gemma4ImageProcessor::from_dir`], boxed: the family's `FamilyConfig::IMAGE_PROCESSOR`.
pub fn load_boxed(dir: &Path) -> Result<Box<dyn ImageProcessor>> {
    Ok(Box::new(Gemma4ImageProcessor::from_dir(dir)?))
}

impl ImageProcessor for Gemma4ImageProcessor {
    /// Resize ([`Self::resize`]) then rescale, flatten and pad ([`Self::patchify`]).
    fn process(&self, image: &RgbImage) -> Result<ProcessedImage> {
        self.patchify(&self.resize(image)?)
    }

    fn placeholder_token(&self) -> &str {
        IMAGE_TOKEN
    }

    /// Each `<|image|>` id, in order, becomes `<|image>` + `num_tokens` × `<|image|>` +
    /// `<image|>` (no newlines are added).
    fn expand_placeholders(&self, ids: &[u32], images: &[ProcessedImage]) -> Result<Vec<u32>> {
        expand_image_placeholders(ids, self.image_token_id, images, |n, out| {
            out.push(self.boi_token_id);
            out.extend(std::iter::repeat_n(self.image_token_id, n));
            out.push(self.eoi_token_id);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Gemma4ProcessorConfig {
        Gemma4ProcessorConfig::from_json(r#"{"max_soft_tokens": 70}"#).unwrap()
    }

    #[test]
    fn target_sizes_of_the_public_cases() {
        let c = config();
        assert_eq!(target_size(210, 330, &c).unwrap(), (288, 480));
        assert_eq!(target_size(480, 420, &c).unwrap(), (384, 336));
        assert_eq!(target_size(180, 420, &c).unwrap(), (240, 576));
    }

    #[test]
    fn very_thin_pictures_get_one_patch_row() {
        let c = config();
        // f·h < 48: th = 48, tw = min(⌊w/h⌋·48, 70·48).
        // That needs w/h > 70, so the 70·48 cap always applies (3 × 210 = 630 patches).
        assert_eq!(target_size(10, 2000, &c).unwrap(), (48, 70 * 48));
        assert_eq!(target_size(2000, 10, &c).unwrap(), (70 * 48, 48));
        assert_eq!(target_size(1, 71, &c).unwrap(), (48, 70 * 48));
        // Just below: f·h = √(161280/70) = 48.0 → one 48-row, tw = ⌊48·70/48⌋·48.
        assert_eq!(target_size(1, 70, &c).unwrap(), (48, 70 * 48));
    }

    #[test]
    fn unsupported_budget_is_rejected() {
        let err = Gemma4ProcessorConfig::from_json(r#"{"max_soft_tokens": 100}"#).unwrap_err();
        assert!(err.to_string().contains("max_soft_tokens = 100"), "{err}");
    }

    #[test]
    fn padding_patches_and_expansion() {
        let p = Gemma4ImageProcessor::new(config(), 500, 501, 502);
        let image = RgbImage::from_pixel(96, 48, image::Rgb([255, 0, 51]));
        let out = p.patchify(&image).unwrap();
        assert_eq!(out.shape, vec![630, 768]);
        assert_eq!(out.grid, vec![3, 6]);
        assert_eq!(out.num_tokens, 2);
        let pos = out.patch_positions.as_ref().unwrap();
        assert_eq!(pos[0], [0, 0]);
        assert_eq!(pos[7], [1, 1]);
        assert_eq!(pos[17], [5, 2]);
        assert!(pos[18..].iter().all(|&q| q == [-1, -1]));
        assert_eq!(&out.pixel_values[..3], &[1.0, 0.0, 0.2]);
        assert!(out.pixel_values[18 * 768..].iter().all(|&v| v == 0.0));
        let ids = p.expand_placeholders(&[2, 501, 7], &[out]).unwrap();
        assert_eq!(ids, vec![2, 500, 501, 501, 502, 7]);
    }
}
