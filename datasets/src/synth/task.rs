//! The task itself: its constants, the questions, and one sample as a function of the seed,
//! the split and the index (see [`super`]).

use image::{Rgb, RgbImage};

use super::paint::{draw_shape, light_tint, shuffled4};
use crate::rng::SplitMix64;

/// Seed of the committed `datasets/shapes` files.
pub const DEFAULT_SEED: u64 = 7;
/// Rows of the committed train split.
pub const DEFAULT_TRAIN: usize = 2000;
/// Rows of the committed test split.
pub const DEFAULT_TEST: usize = 200;

/// `data_source` of the task (selects the boxed-answer reward).
pub const DATA_SOURCE: &str = "flowrl/shapes";
/// Picture side in pixels.
pub const IMAGE_SIZE: u32 = 56;
/// The instruction appended to every question (geo3k's, shortened).
pub const INSTRUCTION: &str =
    "Think inside <think> </think> tags, then put the final answer in \\boxed{}.";

/// Colour names and their RGB values.
pub const COLOURS: [(&str, [u8; 3]); 4] = [
    ("red", [220, 40, 40]),
    ("green", [40, 170, 60]),
    ("blue", [40, 80, 220]),
    ("yellow", [230, 200, 30]),
];
/// Shape kinds.
pub const SHAPES: [&str; 3] = ["circle", "square", "triangle"];
/// Count answers.
pub const COUNTS: [&str; 4] = ["1", "2", "3", "4"];

/// The three question kinds and their wordings (one is drawn per sample).
pub(super) const QUESTIONS: [(QuestionKind, &[&str]); 3] = [
    (
        QuestionKind::Colour,
        &[
            "What color are the shapes?",
            "Which color do the shapes have?",
        ],
    ),
    (
        QuestionKind::Count,
        &["How many shapes are there?", "Count the shapes."],
    ),
    (
        QuestionKind::Shape,
        &["What shape is shown?", "Which shape do you see?"],
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QuestionKind {
    Colour,
    Count,
    Shape,
}

/// One generated sample.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeSample {
    pub image: RgbImage,
    /// The question with its `<image>` placeholder (extra_info.question).
    pub question: String,
    /// The whole user message (question + instruction).
    pub prompt: String,
    pub answer: String,
    /// The task's `data_source`.
    pub data_source: &'static str,
    /// Reference assistant turns (`extra_info.turns`, written when some sample has them): what
    /// a warm start on tool use imitates. Empty for the shapes task.
    pub turns: Vec<String>,
}

/// Draws sample `index` of a split (`split` enters the seed, so train and test differ).
pub fn sample(seed: u64, split: &str, index: u64) -> ShapeSample {
    let split_salt = split.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    });
    let mut rng = SplitMix64(seed ^ split_salt ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let (colour_name, colour) = COLOURS[rng.below(4) as usize];
    let shape = SHAPES[rng.below(3) as usize];
    let count = rng.range(1, 4) as usize;
    let (kind, wordings) = QUESTIONS[rng.below(3) as usize];
    let wording = wordings[rng.below(wordings.len() as u64) as usize];

    let mut image = RgbImage::from_pixel(IMAGE_SIZE, IMAGE_SIZE, Rgb(light_tint(&mut rng)));
    // `count` distinct quadrants, each shape centred in its quadrant with a small jitter.
    let quadrants = shuffled4(&mut rng);
    let half = IMAGE_SIZE / 2;
    for &q in &quadrants[..count] {
        let r = rng.range(8, 11) as i32; // half-size of the shape
        let cx = (q as u32 % 2 * half + half / 2) as i32 + rng.range(0, 4) as i32 - 2;
        let cy = (q as u32 / 2 * half + half / 2) as i32 + rng.range(0, 4) as i32 - 2;
        draw_shape(&mut image, shape, cx, cy, r, colour);
    }
    let answer = match kind {
        QuestionKind::Colour => colour_name.to_string(),
        QuestionKind::Count => count.to_string(),
        QuestionKind::Shape => shape.to_string(),
    };
    let question = format!("<image>{wording}");
    ShapeSample {
        prompt: format!("{question} {INSTRUCTION}"),
        question,
        image,
        answer,
        data_source: DATA_SOURCE,
        turns: Vec::new(),
    }
}
