//! Pillow's convolution resampler (`libImaging/Resample.c`, `ImagingResample` for 8-bit images),
//! ported so that `Image.resize((w, h), BICUBIC)` is reproduced bit for bit.
//!
//! Algorithm (Pillow 13, unchanged since Pillow 4.x):
//! 1. Per axis, `scale = in_size / out_size`, `filterscale = max(scale, 1)` (the kernel is widened
//!    when down-sampling, i.e. antialiased), `support = 2 · filterscale` for bicubic.
//! 2. Output pixel `i` has centre `c = (i + 0.5) · scale`; it reads input pixels
//!    `xmin = trunc(c − support + 0.5)` (≥ 0) up to `trunc(c + support + 0.5)` (≤ in_size),
//!    with weights `w_j = K((j − c + 0.5) / filterscale)` normalised to sum 1 (f64), where `K` is the
//!    cubic convolution kernel with a = −0.5.
//! 3. Weights become fixed point with 22 fraction bits (`PRECISION_BITS = 32 − 8 − 2`),
//!    rounded half away from zero; a pixel is `clip8((2²¹ + Σ w_j · p_j) >> 22)`.
//! 4. Two passes, each rounding to uint8; a pass is skipped when its size does not change.
//!    Normally the horizontal pass runs first (only over the rows the vertical pass will read).
//!    Pillow 13 runs the vertical pass first when the height shrinks by more than twice as many
//!    pixels as the width: `Δh > 0 && Δh > 2·Δw` with `Δ = in − out` (the order changes the
//!    result by up to a few LSB, so it matters for bit parity).

use ::image::RgbImage;

/// Fraction bits of the fixed-point weights: 8 bits for the result, 2 for overflow.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// A separable resampling kernel and its support radius at scale 1.
#[derive(Debug, Clone, Copy)]
pub struct Filter {
    pub kernel: fn(f64) -> f64,
    pub support: f64,
}

/// Pillow's `BICUBIC` (`Image.Resampling.BICUBIC` = 3): Keys' cubic convolution with a = −0.5,
/// `K(x) = (a+2)|x|³ − (a+3)|x|² + 1` for |x| < 1, `a(|x|³ − 5|x|² + 8|x| − 4)` for 1 ≤ |x| < 2.
pub const BICUBIC: Filter = Filter {
    kernel: bicubic_kernel,
    support: 2.0,
};

fn bicubic_kernel(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// `PIL.Image.resize((width, height), Image.BICUBIC)` of an 8-bit RGB picture.
pub fn resize_bicubic(image: &RgbImage, width: u32, height: u32) -> RgbImage {
    pillow_resize(image, width, height, BICUBIC)
}

/// Pillow's `ImagingResample` with `filter` over the whole picture (box `(0, 0, w, h)`).
pub fn pillow_resize(image: &RgbImage, width: u32, height: u32, filter: Filter) -> RgbImage {
    assert!(width > 0 && height > 0, "resize to an empty picture");
    let (in_w, in_h) = image.dimensions();
    let need_horizontal = width != in_w;
    let need_vertical = height != in_h;
    let horizontal = Coefficients::new(in_w as usize, width as usize, filter);
    let mut vertical = Coefficients::new(in_h as usize, height as usize, filter);

    let shrink_h = i64::from(in_h) - i64::from(height);
    let shrink_w = i64::from(in_w) - i64::from(width);
    let horizontal_first = !(shrink_h > 0 && shrink_h > 2 * shrink_w);

    let mut current = Planar::from_image(image);
    if horizontal_first {
        if need_horizontal {
            // Only the input rows the vertical pass will read.
            let first = vertical.bounds[0].0;
            let last = vertical.bounds.last().map(|&(lo, n)| lo + n).unwrap_or(0);
            for bound in &mut vertical.bounds {
                bound.0 -= first;
            }
            current = resample_horizontal(&current, first, last, &horizontal);
        }
        if need_vertical {
            current = resample_vertical(&current, &vertical);
        }
    } else {
        if need_vertical {
            current = resample_vertical(&current, &vertical);
        }
        if need_horizontal {
            let rows = current.height;
            current = resample_horizontal(&current, 0, rows, &horizontal);
        }
    }
    current.into_image()
}

/// An interleaved RGB buffer with explicit dimensions.
struct Planar {
    width: usize,
    height: usize,
    data: Vec<u8>,
}

impl Planar {
    fn from_image(image: &RgbImage) -> Self {
        Self {
            width: image.width() as usize,
            height: image.height() as usize,
            data: image.as_raw().clone(),
        }
    }

    fn into_image(self) -> RgbImage {
        RgbImage::from_raw(self.width as u32, self.height as u32, self.data)
            .expect("buffer size matches its dimensions")
    }
}

/// Per output pixel: the first input index and how many inputs it reads, and `ksize` fixed-point
/// weights (`precompute_coeffs` + `normalize_coeffs_8bpc`).
struct Coefficients {
    bounds: Vec<(usize, usize)>,
    ksize: usize,
    weights: Vec<i32>,
}

impl Coefficients {
    fn new(in_size: usize, out_size: usize, filter: Filter) -> Self {
        // Pillow: `(double)(in1 - in0) / outSize` with `in0 = 0`, `in1 = in_size` (floats).
        let scale = in_size as f32 as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = filter.support * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let mut bounds = Vec::with_capacity(out_size);
        let mut weights = vec![0i32; out_size * ksize];
        let mut k = vec![0f64; ksize];
        for xx in 0..out_size {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // C `(int)` casts truncate toward zero, as `as i64` does.
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) - xmin;
            let (xmin, xmax) = (xmin as usize, xmax.max(0) as usize);
            let mut ww = 0.0;
            for (x, kx) in k.iter_mut().enumerate().take(xmax) {
                let w = (filter.kernel)(((x + xmin) as f64 - center + 0.5) * ss);
                *kx = w;
                ww += w;
            }
            let row = &mut weights[xx * ksize..(xx + 1) * ksize];
            for (x, kx) in k.iter().enumerate().take(xmax) {
                let w = if ww != 0.0 { kx / ww } else { *kx };
                let fixed = w * f64::from(1u32 << PRECISION_BITS);
                row[x] = if w < 0.0 {
                    (-0.5 + fixed) as i32
                } else {
                    (0.5 + fixed) as i32
                };
            }
            bounds.push((xmin, xmax));
        }
        Self {
            bounds,
            ksize,
            weights,
        }
    }

    fn row(&self, i: usize) -> &[i32] {
        &self.weights[i * self.ksize..(i + 1) * self.ksize]
    }
}

/// Pillow's `clip8`: drop the fraction bits and clamp to 0..=255.
#[inline]
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Rounding bias added before the shift (`1 << (PRECISION_BITS − 1)`).
const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// Horizontal pass over input rows `first..last` (`ImagingResampleHorizontal_8bpc`).
fn resample_horizontal(input: &Planar, first: usize, last: usize, c: &Coefficients) -> Planar {
    let out_w = c.bounds.len();
    let out_h = last - first;
    let mut data = vec![0u8; out_w * out_h * 3];
    for yy in 0..out_h {
        let line = &input.data[(yy + first) * input.width * 3..(yy + first + 1) * input.width * 3];
        let out_line = &mut data[yy * out_w * 3..(yy + 1) * out_w * 3];
        for (xx, &(xmin, xmax)) in c.bounds.iter().enumerate() {
            let k = c.row(xx);
            let mut ss = [HALF; 3];
            for (x, &kx) in k.iter().enumerate().take(xmax) {
                let p = &line[(x + xmin) * 3..(x + xmin) * 3 + 3];
                for ch in 0..3 {
                    ss[ch] += i32::from(p[ch]) * kx;
                }
            }
            for ch in 0..3 {
                out_line[xx * 3 + ch] = clip8(ss[ch]);
            }
        }
    }
    Planar {
        width: out_w,
        height: out_h,
        data,
    }
}

/// Vertical pass (`ImagingResampleVertical_8bpc`); `c.bounds` are relative to `input`'s rows.
fn resample_vertical(input: &Planar, c: &Coefficients) -> Planar {
    let out_h = c.bounds.len();
    let w = input.width;
    let mut data = vec![0u8; w * out_h * 3];
    let mut acc = vec![0i32; w * 3];
    for (yy, &(ymin, ymax)) in c.bounds.iter().enumerate() {
        let k = c.row(yy);
        acc.fill(HALF);
        for (y, &ky) in k.iter().enumerate().take(ymax) {
            let line = &input.data[(y + ymin) * w * 3..(y + ymin + 1) * w * 3];
            for (a, &p) in acc.iter_mut().zip(line) {
                *a += i32::from(p) * ky;
            }
        }
        for (o, &a) in data[yy * w * 3..(yy + 1) * w * 3].iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
    Planar {
        width: w,
        height: out_h,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_is_a_copy_and_constant_pictures_stay_constant() {
        let img = RgbImage::from_fn(5, 4, |x, y| ::image::Rgb([x as u8 * 40, y as u8 * 50, 7]));
        assert_eq!(resize_bicubic(&img, 5, 4), img);
        let flat = RgbImage::from_pixel(7, 9, ::image::Rgb([200, 3, 128]));
        for (w, h) in [(3, 4), (14, 20), (7, 2), (1, 1)] {
            let out = resize_bicubic(&flat, w, h);
            assert_eq!(out.dimensions(), (w, h));
            assert!(out.pixels().all(|p| p.0 == [200, 3, 128]), "{w}x{h}");
        }
    }

    #[test]
    fn pass_order_follows_pillow_13() {
        // Noise with hard edges, so that the two orders round differently.
        let img = RgbImage::from_fn(100, 70, |x, y| {
            let v = ((x * 7919 + y * 104_729) % 251) as u8;
            ::image::Rgb([v, if v > 128 { 255 } else { 0 }, v / 3])
        });
        let h_then_v = |w, h| resize_bicubic(&resize_bicubic(&img, w, 70), w, h);
        let v_then_h = |w, h| resize_bicubic(&resize_bicubic(&img, 100, h), w, h);
        // Δh = 14 > 2·Δw = −24: vertical first.
        let out = resize_bicubic(&img, 112, 56);
        assert_eq!(out, v_then_h(112, 56));
        assert_ne!(out, h_then_v(112, 56));
        // Δh = 14, Δw = 14: horizontal first.
        let out = resize_bicubic(&img, 86, 56);
        assert_eq!(out, h_then_v(86, 56));
        assert_ne!(out, v_then_h(86, 56));
    }

    #[test]
    fn bicubic_kernel_values() {
        assert_eq!(bicubic_kernel(0.0), 1.0);
        assert_eq!(bicubic_kernel(1.0), 0.0);
        assert_eq!(bicubic_kernel(2.0), 0.0);
        // a = -0.5: K(0.5) = 1.5/8 - 2.5/4 + 1 = 0.5625, K(1.5) = -0.5·(3.375 - 11.25 + 12 - 4).
        assert_eq!(bicubic_kernel(0.5), 0.5625);
        assert_eq!(bicubic_kernel(-1.5), -0.0625);
    }
}
