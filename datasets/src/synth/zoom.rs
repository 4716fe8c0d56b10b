//! The tool task "zoom": a large picture whose four small shapes need a closer look, the
//! pixel boxes of its quarters, and the `zoom_in` call of a reference turn.

use image::{Rgb, RgbImage};

use crate::rng::SplitMix64;

use super::paint::{draw_shape, light_tint, shuffled4};
use super::task::{COLOURS, IMAGE_SIZE, INSTRUCTION, SHAPES, ShapeSample};

/// Picture side of the tool task: the tiny models' processors shrink it 3.5–4× (to 128 or 112
/// pixels a side), so its small shapes become specks of one or two pixels.
pub const ZOOM_IMAGE_SIZE: u32 = 448;
/// `data_source` of the tool task.
pub const ZOOM_DATA_SOURCE: &str = "flowrl/shapes_zoom";
/// Side of the tile at each quarter's centre that holds the quarter's shape: the shapes task's
/// picture ([`IMAGE_SIZE`]) at half scale, so `zoom_in` (which doubles it) shows a picture laid
/// out as the shapes task's are.
pub const ZOOM_REGION: u32 = IMAGE_SIZE / 2;
/// The quadrants as the questions name them, in reading order.
pub const REGIONS: [&str; 4] = ["top left", "top right", "bottom left", "bottom right"];
/// The tool task's hint, before the shapes task's instruction (the tiny tokenizer spells
/// unfamiliar words byte by byte: the shorter the better).
pub const ZOOM_INSTRUCTION: &str = "Zoom in if needed.";

/// The pixel box of quadrant `q`'s tile (reading order), which a zoom looks at.
pub fn region_box(q: usize) -> [u32; 4] {
    let quarter = ZOOM_IMAGE_SIZE / 4;
    let cx = quarter * (1 + 2 * (q as u32 % 2));
    let cy = quarter * (1 + 2 * (q as u32 / 2));
    let h = ZOOM_REGION / 2;
    [cx - h, cy - h, cx + h, cy + h]
}

/// The assistant turn that calls `zoom_in` on quadrant `q`, in Qwen's tool-call syntax, the
/// JSON written compactly (the tiny tokenizer spells it byte by byte).
pub fn zoom_call(q: usize) -> String {
    let [x1, y1, x2, y2] = region_box(q);
    format!(
        "<think> </think> <tool_call>{{\"name\":\"zoom_in\",\"arguments\":{{\"bbox_2d\":[{x1},{y1},{x2},{y2}]}}}}</tool_call>"
    )
}

/// Draws sample `index` of the tool task: a 448×448 picture with a [`ZOOM_REGION`]-pixel tile
/// at each quarter's centre, each tile holding one small shape (radius 4–5 pixels) in one of its
/// own four quarters, as the shapes task draws a one-shape picture at half scale; the four
/// shapes have the four colours. The question asks for the colour of the shape in one named
/// quarter. Its reference turns (`extra_info.turns`, for a warm start) answer directly for half
/// the samples and call `zoom_in` on the named quarter's tile first for the other half.
pub fn zoom_sample(seed: u64, split: &str, index: u64) -> ShapeSample {
    let split_salt = split.bytes().fold(0x84AA_61C3_9E37_79B9u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    });
    let mut rng = SplitMix64(seed ^ split_salt ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut image =
        RgbImage::from_pixel(ZOOM_IMAGE_SIZE, ZOOM_IMAGE_SIZE, Rgb(light_tint(&mut rng)));
    let colours = shuffled4(&mut rng);
    for (q, &c) in colours.iter().enumerate() {
        let [x1, y1, ..] = region_box(q);
        let shape = SHAPES[rng.below(3) as usize];
        let r = rng.range(4, 5) as i32;
        let (sub, half) = (rng.below(4) as u32, ZOOM_REGION / 2);
        let cx = (x1 + sub % 2 * half + half / 2) as i32 + rng.range(0, 2) as i32 - 1;
        let cy = (y1 + sub / 2 * half + half / 2) as i32 + rng.range(0, 2) as i32 - 1;
        draw_shape(&mut image, shape, cx, cy, r, COLOURS[c].1);
    }
    let asked = rng.below(4) as usize;
    let answer = COLOURS[colours[asked]].0.to_string();
    let question = format!(
        "<image>What color is the shape in the {} quarter?",
        REGIONS[asked]
    );
    let answer_turn = format!("<think> </think> \\boxed{{{answer}}}");
    let turns = if rng.below(2) == 0 {
        vec![answer_turn]
    } else {
        vec![zoom_call(asked), answer_turn]
    };
    ShapeSample {
        prompt: format!("{question} {ZOOM_INSTRUCTION} {INSTRUCTION}"),
        question,
        image,
        answer,
        data_source: ZOOM_DATA_SOURCE,
        turns,
    }
}
