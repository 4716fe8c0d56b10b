//! The pictures' painting, shared by the shapes and the zoom task: the light background tint,
//! a random order of the four quadrants, and filled shapes.

use image::{Rgb, RgbImage};

use crate::rng::SplitMix64;

/// A light background tint: R, G, B each in 225..=255, drawn in that order.
pub(super) fn light_tint(rng: &mut SplitMix64) -> [u8; 3] {
    [
        rng.range(225, 255) as u8,
        rng.range(225, 255) as u8,
        rng.range(225, 255) as u8,
    ]
}

/// 0, 1, 2, 3 in a random order (Fisher–Yates from the end).
pub(super) fn shuffled4(rng: &mut SplitMix64) -> [usize; 4] {
    let mut v = [0usize, 1, 2, 3];
    for i in (1..4).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

/// Fills a circle (radius r), square (side 2r) or upward triangle (height 2r) centred at (cx, cy).
pub(super) fn draw_shape(
    img: &mut RgbImage,
    shape: &str,
    cx: i32,
    cy: i32,
    r: i32,
    colour: [u8; 3],
) {
    for y in cy - r..=cy + r {
        for x in cx - r..=cx + r {
            if x < 0 || y < 0 || x >= img.width() as i32 || y >= img.height() as i32 {
                continue;
            }
            let (dx, dy) = (x - cx, y - cy);
            let inside = match shape {
                "circle" => dx * dx + dy * dy <= r * r,
                "square" => true,
                // Apex at (cx, cy − r), base from (cx − r, cy + r) to (cx + r, cy + r).
                _ => 2 * dx.abs() <= dy + r,
            };
            if inside {
                img.put_pixel(x as u32, y as u32, Rgb(colour));
            }
        }
    }
}
