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
mod task;
mod tokenizer;
mod verl_parquet;
mod zoom;

pub use gemma4::{
    GEMMA4_CHAT_TEMPLATE, GEMMA4_SPECIAL_TOKENS, gemma4_tokenizer_corpus, train_gemma4_tokenizer,
    write_gemma4_tokenizer_dir,
};
pub use task::{
    COLOURS, COUNTS, DATA_SOURCE, DEFAULT_SEED, DEFAULT_TEST, DEFAULT_TRAIN, IMAGE_SIZE,
    INSTRUCTION, SHAPES, ShapeSample, sample,
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
