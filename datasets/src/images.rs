//! Encoded image bytes (as stored in verl's `images[].bytes`) to 8-bit RGB pictures.
//!
//! The format is detected from the magic bytes, never from a path or file name: PNG
//! (`89 50 4E 47 0D 0A 1A 0A`) and JPEG (`FF D8 FF`) are accepted. Every picture becomes RGB the
//! way verl's `process_image` → `qwen_vl_utils.to_rgb` does it with Pillow:
//! - grey (`L`) is replicated to R = G = B;
//! - RGBA is composited onto a white background with the alpha channel as mask, with Pillow's
//!   integer blend `out = DIV255(255·(255 − a) + c·a)` where `DIV255(x) = ((t >> 8) + t) >> 8`,
//!   `t = x + 128` (Pillow `Paste.c`);
//! - grey + alpha (`LA`) keeps the grey value and drops alpha (Pillow `convert("RGB")`).
//!
//! Resizing and normalisation belong to the model's image processor
//! (`flowrl_models::capabilities::ImageProcessor`). The one exception is [`verl_fetch_resize`],
//! the resize verl's `process_image` applies *before* the processor (`qwen_vl_utils.fetch_image`),
//! available as an opt-in for exact verl parity.

use image::{DynamicImage, ImageFormat, RgbImage};

/// One entry of the `images` list: the encoded file (bytes win over path, as in `datasets`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedImage {
    pub bytes: Vec<u8>,
    /// The stored path, if any (informational; a path-only entry has been read from disk).
    pub path: Option<String>,
}

/// The encoded formats a prompt image may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodedFormat {
    Png,
    Jpeg,
}

impl EncodedFormat {
    /// Detects the format from the first bytes; `None` when neither PNG nor JPEG.
    pub fn sniff(bytes: &[u8]) -> Option<Self> {
        const PNG: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
        if bytes.starts_with(&PNG) {
            Some(Self::Png)
        } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(Self::Jpeg)
        } else {
            None
        }
    }

    /// Name as Pillow reports it (`"PNG"`, `"JPEG"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Png => "PNG",
            Self::Jpeg => "JPEG",
        }
    }
}

/// Decodes a whole PNG or JPEG file to RGB (see the module doc for the colour conversion).
/// The error message says what is wrong (unknown magic bytes or the decoder's complaint); the
/// caller adds file, row and column.
pub fn decode_rgb(bytes: &[u8]) -> Result<RgbImage, String> {
    let format = EncodedFormat::sniff(bytes).ok_or_else(|| {
        let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02X}")).collect();
        if bytes.is_empty() {
            "image bytes are empty".to_string()
        } else {
            format!(
                "image bytes are neither PNG nor JPEG (they start with {})",
                head.join(" ")
            )
        }
    })?;
    let image_format = match format {
        EncodedFormat::Png => ImageFormat::Png,
        EncodedFormat::Jpeg => ImageFormat::Jpeg,
    };
    let decoded = image::load_from_memory_with_format(bytes, image_format)
        .map_err(|e| format!("cannot decode {} image: {e}", format.name()))?;
    Ok(to_rgb(decoded))
}

/// Converts a decoded picture to 8-bit RGB like `qwen_vl_utils.to_rgb` (see the module doc).
pub fn to_rgb(image: DynamicImage) -> RgbImage {
    match image {
        DynamicImage::ImageRgb8(rgb) => rgb,
        DynamicImage::ImageRgba8(rgba) => composite_on_white(&rgba),
        DynamicImage::ImageRgba16(_) | DynamicImage::ImageRgba32F(_) => {
            composite_on_white(&image.to_rgba8())
        }
        // L, LA, 16-bit grey and RGB: replicate grey, drop alpha of LA.
        other => other.to_rgb8(),
    }
}

/// `qwen_vl_utils.smart_resize(h, w, factor, min_pixels, max_pixels)` → `(h', w')`:
///
/// ```text
/// h' = max(f, round(h/f)·f) ; w' = max(f, round(w/f)·f)          (Python round: ties to even)
/// if h'·w' > max:  β = √(h·w/max); h' = ⌊h/β/f⌋·f; w' = ⌊w/β/f⌋·f
/// elif h'·w' < min: β = √(min/(h·w)); h' = ⌈h·β/f⌉·f; w' = ⌈w·β/f⌉·f
/// ```
/// (It differs from transformers' `smart_resize` only in the `max(f, ·)` of the first line.)
pub fn qwen_vl_utils_smart_resize(
    height: u32,
    width: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> (u32, u32) {
    let (h, w, f) = (f64::from(height), f64::from(width), f64::from(factor));
    let mut hb = f.max((h / f).round_ties_even() * f);
    let mut wb = f.max((w / f).round_ties_even() * f);
    if hb * wb > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        hb = (h / beta / f).floor() * f;
        wb = (w / beta / f).floor() * f;
    } else if hb * wb < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        hb = (h * beta / f).ceil() * f;
        wb = (w * beta / f).ceil() * f;
    }
    (hb as u32, wb as u32)
}

/// verl's pre-processor resize (`verl.utils.dataset.vision_utils.process_image` →
/// `qwen_vl_utils.fetch_image(image, image_patch_size)`): factor `f = 2·image_patch_size`,
/// `min_pixels = 4·f²`, `max_pixels = 16384·f²`, then Pillow's default (bicubic)
/// `Image.resize` to [`qwen_vl_utils_smart_resize`]'s size. With Qwen2-VL's own pixel limits
/// (3136 and 12845056 for patch size 14) the processor's resize then changes nothing.
pub fn verl_fetch_resize(image: &RgbImage, image_patch_size: u32) -> RgbImage {
    let f = 2 * image_patch_size;
    let f2 = u64::from(f) * u64::from(f);
    let (h, w) = qwen_vl_utils_smart_resize(image.height(), image.width(), f, 4 * f2, 16384 * f2);
    if (w, h) == image.dimensions() {
        return image.clone();
    }
    flowrl_models::image::resize_bicubic(image, w, h)
}

/// Pillow's `Image.paste(rgba, mask=alpha)` onto a white RGB canvas.
fn composite_on_white(rgba: &image::RgbaImage) -> RgbImage {
    let (w, h) = rgba.dimensions();
    let mut out = RgbImage::new(w, h);
    for (dst, src) in out.pixels_mut().zip(rgba.pixels()) {
        let a = u32::from(src.0[3]);
        for c in 0..3 {
            let t = 255 * (255 - a) + u32::from(src.0[c]) * a + 128;
            dst.0[c] = (((t >> 8) + t) >> 8) as u8;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayAlphaImage, GrayImage, LumaA, Rgba, RgbaImage};

    fn png(img: DynamicImage) -> Vec<u8> {
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Png).unwrap();
        out.into_inner()
    }

    #[test]
    fn grey_is_replicated() {
        let g = GrayImage::from_fn(3, 2, |x, y| image::Luma([(x * 40 + y * 7) as u8]));
        let rgb = decode_rgb(&png(DynamicImage::ImageLuma8(g.clone()))).unwrap();
        for (p, q) in rgb.pixels().zip(g.pixels()) {
            assert_eq!(p.0, [q.0[0]; 3]);
        }
    }

    #[test]
    fn rgba_is_composited_on_white_like_pillow() {
        // Values from Pillow 13: white canvas .paste(rgba, mask=alpha) for (10, 200, 100, a).
        let img = RgbaImage::from_fn(3, 1, |x, _| {
            Rgba([10, 200, 100, [0u8, 128, 255][x as usize]])
        });
        let rgb = decode_rgb(&png(DynamicImage::ImageRgba8(img))).unwrap();
        assert_eq!(rgb.get_pixel(0, 0).0, [255, 255, 255]);
        // a = 128: (255·127 + c·128 + 128) / 255 with Pillow's rounding.
        assert_eq!(rgb.get_pixel(1, 0).0, [132, 227, 177]);
        assert_eq!(rgb.get_pixel(2, 0).0, [10, 200, 100]);
    }

    #[test]
    fn grey_alpha_drops_alpha() {
        let img = GrayAlphaImage::from_fn(1, 1, |_, _| LumaA([77, 0]));
        let rgb = decode_rgb(&png(DynamicImage::ImageLumaA8(img))).unwrap();
        assert_eq!(rgb.get_pixel(0, 0).0, [77, 77, 77]);
    }

    #[test]
    fn verl_fetch_resize_rounds_to_the_factor() {
        // 100x70: h 70/28 = 2.5 → 2 (ties to even) → 56; w 100/28 ≈ 3.57 → 112.
        assert_eq!(
            qwen_vl_utils_smart_resize(70, 100, 28, 3136, 12845056),
            (56, 112)
        );
        // Too small: scaled up to at least 4·28² pixels.
        assert_eq!(
            qwen_vl_utils_smart_resize(20, 30, 28, 3136, 12845056),
            (56, 84)
        );
        let img = RgbImage::from_fn(100, 70, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let out = verl_fetch_resize(&img, 14);
        assert_eq!(out.dimensions(), (112, 56));
        assert_eq!(out, flowrl_models::image::resize_bicubic(&img, 112, 56));
        let exact = RgbImage::new(56, 56);
        assert_eq!(verl_fetch_resize(&exact, 14), exact);
    }

    #[test]
    fn jpeg_is_detected_by_magic_bytes_and_decoded() {
        let img = RgbImage::from_pixel(16, 12, image::Rgb([200, 100, 50]));
        let mut out = std::io::Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(img)
            .write_to(&mut out, ImageFormat::Jpeg)
            .unwrap();
        let bytes = out.into_inner();
        assert_eq!(EncodedFormat::sniff(&bytes), Some(EncodedFormat::Jpeg));
        let rgb = decode_rgb(&bytes).unwrap();
        assert_eq!(rgb.dimensions(), (16, 12));
        // A flat colour survives JPEG within a few levels.
        for p in rgb.pixels() {
            for (c, want) in [200i32, 100, 50].iter().enumerate() {
                assert!((i32::from(p.0[c]) - want).abs() <= 3, "{:?}", p.0);
            }
        }
    }

    #[test]
    fn unknown_and_truncated_bytes_are_errors() {
        let e = decode_rgb(b"GIF89a....").unwrap_err();
        assert!(e.contains("neither PNG nor JPEG"), "{e}");
        assert!(e.contains("47 49 46 38"), "{e}");
        let mut bytes = png(DynamicImage::ImageRgb8(RgbImage::new(8, 8)));
        bytes.truncate(30);
        let e = decode_rgb(&bytes).unwrap_err();
        assert!(e.starts_with("cannot decode PNG image"), "{e}");
        assert_eq!(decode_rgb(&[]).unwrap_err(), "image bytes are empty");
    }
}
