//! The embedded task "shapes": small pictures of coloured shapes with questions that need the
//! picture, short verifiable answers, written in verl's geo3k parquet schema; and the tokenizer of
//! the tiny default models, trained on the task's text with the `tokenizers` crate.
//!
//! A sample is a 56×56 RGB picture (4 image tokens for Qwen2-VL: 4×4 patches of 14 px, merged 2×2)
//! on a light tinted background with 1–4 copies of one shape kind (circle, square, triangle) in
//! one colour (red, green, blue, yellow), one per quadrant. The question asks for the colour,
//! the count or the shape kind, so the answer set has 11 one-word answers and chance is 1/4 or 1/3
//! given the question. The prompt is `<image>{question} {instruction}` with a geo3k-style
//! instruction asking for `<think> </think>` and `\boxed{}`; `data_source` is `flowrl/shapes`.
//!
//! A second flavour of the same tokenizer carries Gemma 4's special tokens and turn template
//! ([`write_gemma4_tokenizer_dir`], `assets/tokenizer-gemma4`) for the tiny Gemma 4 policy.
//!
//! Everything is a function of the seed alone (`rng::SplitMix64`); the tokenizer does not
//! even depend on the seed (it is trained on the task's whole text vocabulary), so the committed
//! `assets/tokenizer` matches any generated split.

mod gemma4;
mod paint;
mod tokenizer;
mod verl_parquet;
mod zoom;

pub use gemma4::{
    GEMMA4_CHAT_TEMPLATE, GEMMA4_SPECIAL_TOKENS, gemma4_tokenizer_corpus, train_gemma4_tokenizer,
    write_gemma4_tokenizer_dir,
};
pub use tokenizer::{
    BPE_VOCAB_SIZE, QWEN2_VL_CHAT_TEMPLATE, SPECIAL_TOKENS, tokenizer_corpus, train_tokenizer,
    write_tokenizer_dir,
};
pub use verl_parquet::{verl_schema, write_split};
pub use zoom::{
    REGIONS, ZOOM_DATA_SOURCE, ZOOM_IMAGE_SIZE, ZOOM_INSTRUCTION, ZOOM_REGION, region_box,
    zoom_call, zoom_sample,
};

use std::path::Path;

use anyhow::{Context, Result};
use image::{Rgb, RgbImage};

use crate::rng::SplitMix64;
use paint::{draw_shape, light_tint, shuffled4};

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
const QUESTIONS: [(QuestionKind, &[&str]); 3] = [
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
enum QuestionKind {
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

/// What `flowrl data synth` writes.
#[derive(Debug, Clone)]
pub struct SynthReport {
    pub train_rows: usize,
    pub test_rows: usize,
    pub vocab_size: usize,
}

/// Writes `train.parquet` and `test.parquet` of `train` and `test` samples drawn by `draw`.
pub fn write_splits(
    out: &Path,
    seed: u64,
    train: usize,
    test: usize,
    draw: fn(u64, &str, u64) -> ShapeSample,
) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for (split, n) in [("train", train), ("test", test)] {
        let samples: Vec<ShapeSample> = (0..n as u64).map(|i| draw(seed, split, i)).collect();
        write_split(&out.join(format!("{split}.parquet")), split, &samples)?;
    }
    Ok(())
}

/// Generates `train.parquet` and `test.parquet` into `out` and the tokenizer files into
/// `tokenizer_out`.
pub fn synthesize(
    out: &Path,
    tokenizer_out: &Path,
    seed: u64,
    train: usize,
    test: usize,
) -> Result<SynthReport> {
    write_splits(out, seed, train, test, sample)?;
    let tokenizer = write_tokenizer_dir(tokenizer_out)?;
    Ok(SynthReport {
        train_rows: train,
        test_rows: test,
        vocab_size: tokenizer.get_vocab_size(true),
    })
}
