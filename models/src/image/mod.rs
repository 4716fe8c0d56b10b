//! Picture handling shared by the image processors: decoding to 8-bit RGB the way Hugging Face's
//! PIL-backed processors do (`convert_to_rgb`), and a Pillow-exact bicubic resize.
//!
//! What this module is for: every family's processor starts from an `RgbImage` produced here and
//! resizes it with [`resize_bicubic`]; a processor then only adds its own size rule, scaling and
//! patch layout, and says what each prompt placeholder becomes
//! ([`expand_image_placeholders`] walks the prompt). It deliberately knows nothing about patch
//! layouts or any model family.
//!
//! Reference: `transformers.image_transforms.convert_to_rgb` (transformers 5.24) and Pillow 13's
//! `libImaging/AlphaComposite.c` and `libImaging/Resample.c`.

mod resample;

use std::path::Path;

use ::image::{DynamicImage, RgbImage, RgbaImage};
use anyhow::{Context, Result, ensure};

use crate::capabilities::ProcessedImage;

pub use resample::{pillow_resize, resize_bicubic};

/// The most f32 values a processor makes of one picture (2^28, 1 GiB): a preprocessor config
/// whose sizes would need more is an error, not an allocation.
pub const MAX_PIXEL_VALUES: usize = 1 << 28;

/// Reads and decodes a picture file (the formats the `image` dependency is built with: PNG) and
/// converts it to RGB with [`to_rgb`].
pub fn load_rgb(path: &Path) -> Result<RgbImage> {
    let bytes = std::fs::read(path).with_context(|| format!("reading image {}", path.display()))?;
    decode_rgb(&bytes).with_context(|| format!("decoding image {}", path.display()))
}

/// Decodes an encoded picture (format guessed from its bytes) and converts it to RGB with
/// [`to_rgb`].
pub fn decode_rgb(bytes: &[u8]) -> Result<RgbImage> {
    let image = ::image::load_from_memory(bytes).context("unsupported or corrupt image data")?;
    Ok(to_rgb(image))
}

/// Hugging Face's `convert_to_rgb`: RGB pictures are kept as they are; every other mode is
/// converted to RGBA, composited onto an opaque **white** background with
/// `PIL.Image.alpha_composite` ([`composite_on_white`]) and its alpha dropped. Grayscale therefore
/// becomes RGB by replication (its alpha is 255).
///
/// Decoded modes are those of the `image` crate: palette PNGs arrive already expanded to RGB(A)
/// (a `tRNS` chunk becomes alpha), 16-bit channels are reduced to 8 bits by that crate's rounding.
/// The fixtures cover RGB, RGBA and L (8-bit).
pub fn to_rgb(image: DynamicImage) -> RgbImage {
    match image {
        DynamicImage::ImageRgb8(rgb) => rgb,
        other => composite_on_white(&other.to_rgba8()),
    }
}

/// `PIL.Image.alpha_composite(white, src).convert("RGB")` for an opaque white destination, in
/// Pillow's integer arithmetic (`AlphaComposite.c`, 7 extra precision bits):
///
/// ```text
/// blend   = 255 · (255 − a)            outa255 = 255·a + blend
/// coef1   = a·255·255·2⁷ / outa255     coef2   = 255·2⁷ − coef1
/// out_c   = div255(src_c·coef1 + 255·coef2 + 0x80·2⁷) >> 7,  div255(x) = ((x >> 8) + x) >> 8
/// ```
/// and pure white where `a == 0`.
pub fn composite_on_white(rgba: &RgbaImage) -> RgbImage {
    const PRECISION_BITS: u32 = 7;
    let shift_div255 = |x: u32| ((x >> 8) + x) >> 8;
    let mut out = RgbImage::new(rgba.width(), rgba.height());
    for (dst, src) in out.pixels_mut().zip(rgba.pixels()) {
        let [r, g, b, a] = src.0.map(u32::from);
        if a == 0 {
            dst.0 = [255, 255, 255];
            continue;
        }
        let blend = 255 * (255 - a);
        let outa255 = a * 255 + blend;
        let coef1 = a * 255 * 255 * (1 << PRECISION_BITS) / outa255;
        let coef2 = 255 * (1 << PRECISION_BITS) - coef1;
        let channel = |c: u32| {
            let tmp = c * coef1 + 255 * coef2;
            (shift_div255(tmp + (0x80 << PRECISION_BITS)) >> PRECISION_BITS) as u8
        };
        dst.0 = [channel(r), channel(g), channel(b)];
    }
    out
}

/// The per-value rescale/normalise step every Hugging Face image processor here shares
/// (transformers `BaseImageProcessor.rescale` then `.normalize`): `v = f32(f64(u)·factor)` when
/// rescaling (else `f32(u)`), then `(v − mean_c) / std_c` in f32 when normalising.
#[derive(Debug, Clone, Copy)]
pub struct PixelScale {
    rescale: Option<f64>,
    normalize: Option<([f32; 3], [f32; 3])>,
}

impl PixelScale {
    /// From a preprocessor config's `do_rescale`, `rescale_factor`, `do_normalize`,
    /// `image_mean` and `image_std`.
    pub fn new(
        do_rescale: bool,
        rescale_factor: f64,
        do_normalize: bool,
        mean: [f32; 3],
        std: [f32; 3],
    ) -> Self {
        Self {
            rescale: do_rescale.then_some(rescale_factor),
            normalize: do_normalize.then_some((mean, std)),
        }
    }

    /// Channel `ch` value `u` rescaled, then normalised.
    #[inline]
    pub fn apply(&self, u: u8, ch: usize) -> f32 {
        let v = match self.rescale {
            Some(f) => (f64::from(u) * f) as f32,
            None => f32::from(u),
        };
        match &self.normalize {
            Some((mean, std)) => (v - mean[ch]) / std[ch],
            None => v,
        }
    }
}

/// Python's `round()` on a float: to the nearest integer, ties to the even one
/// (`round(2.5) == 2`, `round(3.5) == 4`), as Hugging Face's `smart_resize` relies on.
pub fn round_half_even(x: f64) -> f64 {
    x.round_ties_even()
}

/// Replaces the k-th `placeholder` in `ids` by what `emit(images[k].num_tokens, out)` writes;
/// the number of placeholders must equal the number of images.
pub fn expand_image_placeholders(
    ids: &[u32],
    placeholder: u32,
    images: &[ProcessedImage],
    emit: impl Fn(usize, &mut Vec<u32>),
) -> Result<Vec<u32>> {
    let found = ids.iter().filter(|&&t| t == placeholder).count();
    ensure!(
        found == images.len(),
        "the prompt holds {found} image placeholders (id {placeholder}) but {} images were given",
        images.len()
    );
    let extra: usize = images.iter().map(|im| im.num_tokens).sum();
    let mut out = Vec::with_capacity(ids.len() + extra + 2 * images.len());
    let mut next = images.iter();
    for &t in ids {
        if t == placeholder {
            let image = next.next().expect("counted above");
            emit(image.num_tokens, &mut out);
        } else {
            out.push(t);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::image::{GrayImage, Luma, Rgba};

    #[test]
    fn round_half_even_matches_python_round() {
        // Python: [round(x) for x in (0.5, 1.5, 2.5, 3.5, 4.5, -0.5, -1.5, 2.4999, 2.5001)]
        let cases = [
            (0.5, 0.0),
            (1.5, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (4.5, 4.0),
            (-0.5, -0.0),
            (-1.5, -2.0),
            (2.4999, 2.0),
            (2.5001, 3.0),
        ];
        for (x, want) in cases {
            assert_eq!(round_half_even(x), want, "round({x})");
        }
        // The ties the processor fixtures hit: 70/28, 126/28, 98/28.
        assert_eq!(round_half_even(70.0 / 28.0), 2.0);
        assert_eq!(round_half_even(126.0 / 28.0), 4.0);
        assert_eq!(round_half_even(98.0 / 28.0), 4.0);
    }

    #[test]
    fn grayscale_is_replicated_and_transparent_pixels_become_white() {
        let gray = GrayImage::from_pixel(2, 1, Luma([77]));
        let rgb = to_rgb(DynamicImage::ImageLuma8(gray));
        assert!(rgb.pixels().all(|p| p.0 == [77, 77, 77]));

        let mut rgba = RgbaImage::new(3, 1);
        rgba.put_pixel(0, 0, Rgba([10, 20, 30, 0]));
        rgba.put_pixel(1, 0, Rgba([10, 20, 30, 255]));
        rgba.put_pixel(2, 0, Rgba([0, 0, 0, 128]));
        let rgb = composite_on_white(&rgba);
        assert_eq!(rgb.get_pixel(0, 0).0, [255, 255, 255]);
        assert_eq!(rgb.get_pixel(1, 0).0, [10, 20, 30]);
        // Black at alpha 128 over white: 255·127/255 = 127 (PIL gives 127).
        assert_eq!(rgb.get_pixel(2, 0).0, [127, 127, 127]);
    }
}
