//! The parameters of `dataset.parquet` ([`DatasetParams`]) and how they map to
//! `flowrl_datasets`' options.

use std::path::PathBuf;

use anyhow::Result;
use flowrl_datasets::verl::{ReadOptions, VerlColumns};
use flowrl_datasets::video::VideoOptions;
use flowrl_datasets::{DatasetOptions, Truncation};
use flowrl_engine::Params;
use serde::Deserialize;

/// Parameters of [`DatasetParquet`](super::parquet::DatasetParquet) (verl's `data.*` names where they exist).
#[derive(Debug, Deserialize, Params)]
pub(crate) struct DatasetParams {
    /// a training parquet file (or use `paths`)
    pub(crate) path: Option<PathBuf>,
    /// several training parquet files, read in order
    pub(crate) paths: Option<Vec<PathBuf>>,
    /// a validation parquet file, emitted whole on `val_prompts`
    pub(crate) val_path: Option<PathBuf>,
    /// the model whose chat template, tokenizer and image processor encode the prompts
    #[param(resource = "model")]
    pub(crate) model: Option<String>,
    /// a Hugging Face model directory (or hub id in the local cache) to encode with, instead of
    /// `model`
    pub(crate) model_dir: Option<PathBuf>,
    /// prompts per step (verl: train_batch_size)
    #[param(required, min = 1)]
    pub(crate) batch_size: usize,
    /// a new seeded order every epoch
    #[param(default = true)]
    pub(crate) shuffle: bool,
    /// shuffle seed (default: the run's seed)
    #[param(min = 0)]
    pub(crate) seed: Option<u64>,
    /// prompt tokens, image tokens included
    #[param(default = 1024, min = 1)]
    pub(crate) max_prompt_length: usize,
    /// what to do with a longer prompt that was not filtered out
    #[param(one_of = &["error", "left", "right"], default = "error")]
    pub(crate) truncation: Truncation,
    /// drop prompts longer than max_prompt_length at load
    #[param(default = true)]
    pub(crate) filter_overlong_prompts: bool,
    /// column of chat messages
    #[param(default = "prompt")]
    pub(crate) prompt_key: String,
    /// column of images ("" for text-only data)
    #[param(default = "images")]
    pub(crate) image_key: String,
    /// dotted path of the reference answer
    #[param(default = "reward_model.ground_truth")]
    pub(crate) ground_truth_key: String,
    /// column of the reward selector
    #[param(default = "data_source")]
    pub(crate) data_source_key: String,
    /// resize pictures like verl's process_image (qwen_vl_utils.fetch_image with this
    /// image_patch_size, e.g. 14) before the model's processor; unset = processor only
    #[param(min = 1)]
    pub(crate) verl_image_patch_size: Option<u32>,
    /// column of videos, each a list of frames (read when the file has it; "" to ignore it)
    #[param(default = "videos")]
    pub(crate) video_key: String,
    /// frame rate of stored frame lists whose entry has no sample_fps (qwen_vl_utils' default 2)
    #[param(default = 2.0, gt = 0.0)]
    pub(crate) video_sample_fps: f64,
    /// sample every video to this many frames per second unless its entry sets fps or nframes;
    /// unset = keep every stored frame
    #[param(gt = 0.0)]
    pub(crate) video_fps: Option<f64>,
    /// drop rows whose <image> count differs from their image count (counted in
    /// data/skipped_mismatched)
    #[param(default = false)]
    pub(crate) skip_mismatched_rows: bool,
    /// drop every row that would fail to load — a malformed value, an undecodable image, a
    /// mismatch — instead of failing (counted in data/skipped_bad, the first ones warned about)
    #[param(default = false)]
    pub(crate) skip_bad_rows: bool,
}

impl DatasetParams {
    pub(crate) fn train_paths(&self) -> Vec<PathBuf> {
        match (&self.path, &self.paths) {
            (Some(p), _) => vec![p.clone()],
            (None, Some(ps)) => ps.clone(),
            (None, None) => Vec::new(),
        }
    }

    pub(crate) fn options(&self, seed: u64) -> Result<DatasetOptions> {
        Ok(DatasetOptions {
            read: ReadOptions {
                columns: VerlColumns {
                    prompt_key: self.prompt_key.clone(),
                    image_key: (!self.image_key.is_empty()).then(|| self.image_key.clone()),
                    video_key: (!self.video_key.is_empty()).then(|| self.video_key.clone()),
                    ground_truth_key: self.ground_truth_key.clone(),
                    data_source_key: self.data_source_key.clone(),
                    ..VerlColumns::default()
                },
                skip_mismatched_rows: self.skip_mismatched_rows,
                skip_bad_rows: self.skip_bad_rows,
                check_images: true,
                verl_image_patch_size: self.verl_image_patch_size,
                video: VideoOptions {
                    sample_fps: self.video_sample_fps,
                    fps: self.video_fps,
                },
            },
            max_prompt_length: self.max_prompt_length,
            truncation: self.truncation,
            filter_overlong_prompts: self.filter_overlong_prompts,
            batch_size: self.batch_size,
            shuffle: self.shuffle,
            seed,
        })
    }
}
