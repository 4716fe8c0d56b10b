//! The Qwen3-VL image processor: Qwen2-VL's, with Qwen3-VL's settings.
//!
//! Qwen3-VL has no image processor of its own: transformers' `AutoImageProcessor` maps
//! `model_type` `qwen3_vl` to `Qwen2VLImageProcessor` (PIL backend `Qwen2VLImageProcessorPil`),
//! and only `preprocessor_config.json` differs (`patch_size` 16, `merge_size` 2,
//! `temporal_patch_size` 2, `image_mean = image_std = [0.5, 0.5, 0.5]`, the pixel limits in
//! `size.shortest_edge` / `size.longest_edge`). So the family uses
//! [`crate::qwen2_vl::processor::Qwen2VlImageProcessor`], which reads every one of those values
//! from the file; a key the file lacks takes Qwen2-VL's default.

pub use crate::qwen2_vl::processor::{
    IMAGE_PAD_TOKEN, Qwen2VlImageProcessor as Qwen3VlImageProcessor,
    Qwen2VlProcessorConfig as Qwen3VlProcessorConfig,
};
