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

use super::patches::patch_rows;
pub use super::patches::{Qwen2VlProcessorConfig, smart_resize};
use super::video::QwenVideoProcessor;
use crate::capabilities::{ImageProcessor, ProcessedImage, VideoProcessor};
use crate::image::{PixelScale, expand_image_placeholders, resize_bicubic};

/// The placeholder string Qwen's chat template emits once per image.
pub const IMAGE_PAD_TOKEN: &str = "<|image_pad|>";

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
