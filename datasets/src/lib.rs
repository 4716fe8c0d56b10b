//! flowrl-datasets: prompt data in, as verl gives it to a vision-language RL run.
//!
//! - [`verl`]: verl's RL parquet schema (prompt messages, images, reward model, data source,
//!   extra info), configurable column names, every row group, checked rows.
//! - [`images`]: encoded PNG/JPEG bytes → RGB, as verl's `process_image` does.
//! - [`video`]: verl's `videos` column (frame lists), frame sampling at a given fps.
//! - [`template`]: the model's Jinja chat template rendered like `apply_chat_template`.
//! - [`encoder`]: template → tokens → image placeholder expansion through the model's
//!   `ImageProcessor` capability.
//! - [`dataset`]: length filtering, truncation, seeded shuffling, epochs, the resumable
//!   [`DataPosition`], and the [`PromptBatch`] value of the `Prompts` port type.
//! - [`synth`]: the embedded "shapes" task and the tiny models' tokenizer.
//! - [`cli`]: `flowrl data inspect` and `flowrl data synth`.
//!
//! Every bad-input error is a [`DataError`] naming file, row and column.

pub mod cli;
pub mod dataset;
pub mod encoder;
pub mod error;
pub mod images;
mod rng;
pub mod synth;
pub mod template;
pub mod verl;
pub mod video;

pub use dataset::{
    DataPosition, DatasetOptions, LoadReport, Prompt, PromptBatch, PromptDataset, Truncation,
};
pub use encoder::{EncodedPrompt, PromptEncoder};
pub use error::DataError;
pub use template::ChatTemplate;
pub use verl::{ChatMessage, ReadOptions, RowRef, VerlColumns, VerlRow, read_verl_file};
