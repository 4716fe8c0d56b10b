//! The video reference cases of `tests/fixtures/video/` (made by `gen_video_cases.py` with
//! transformers 5.24): every case directory is discovered and checked for
//!
//! - the video processor: `pixel_values_videos` (max abs ≤ 1e-5), `video_grid_thw` and
//!   Qwen2.5-VL's `second_per_grid_ts` exactly; pictures of the same prompt through the image
//!   processor likewise;
//! - the position ids and rope deltas of `get_rope_index`, exactly, on transformers' `input_ids`;
//! - the logits of the whole prompt: max abs(a − e) ≤ 1e-4 · max(1, max abs(e)), the tolerance
//!   of the model fixtures' READMEs.
//!
//! The prompt's expansion (`input_ids` from the rendered text) is checked by the datasets crate
//! (`datasets/tests/video_encode.rs`), which owns the encoder.

mod common;

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use common::read_safetensors;
use flowrl_models::image::load_rgb;
use flowrl_models::{Model, PaddedBatch, ProcessedImage, VideoFrames, load_image_processor};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cases() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(repo().join("tests/fixtures/video"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.json").exists())
        .collect();
    out.sort();
    out
}

/// `(is_video)` per placeholder of a verl prompt, in text order.
fn placeholder_order(prompt: &str) -> Vec<bool> {
    let mut out = Vec::new();
    let mut rest = prompt;
    while let Some(at) = rest.find('<') {
        rest = &rest[at..];
        if let Some(r) = rest.strip_prefix("<image>") {
            out.push(false);
            rest = r;
        } else if let Some(r) = rest.strip_prefix("<video>") {
            out.push(true);
            rest = r;
        } else {
            rest = &rest[1..];
        }
    }
    out
}

fn max_abs(a: &[f32], e: &[f64]) -> f64 {
    assert_eq!(a.len(), e.len(), "length mismatch");
    a.iter()
        .zip(e)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn video_cases_match_transformers() {
    let cases = cases();
    assert!(cases.len() >= 3, "video cases missing: {cases:?}");
    let device = Default::default();
    for dir in cases {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let case: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let expected = read_safetensors(&dir.join("expected.safetensors"));
        let model_dir = repo().join(case["model"].as_str().unwrap());
        let processor = load_image_processor(&model_dir).unwrap();
        let video_processor = processor.video().expect("a video processor");

        // Videos: frames padded to an even count (qwen_vl_utils), at their sample_fps.
        let mut videos = Vec::new();
        for entry in case["videos"].as_array().unwrap() {
            let mut frames: Vec<_> = entry["video"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| load_rgb(&dir.join(f.as_str().unwrap())).unwrap())
                .collect();
            if frames.len() % 2 == 1 {
                frames.push(frames.last().unwrap().clone());
            }
            let fps = entry["sample_fps"].as_f64().unwrap();
            videos.push(
                video_processor
                    .process_video(&VideoFrames::from_list(frames, fps))
                    .unwrap(),
            );
        }
        let pv = &expected["pixel_values_videos"];
        let ours: Vec<f32> = videos
            .iter()
            .flat_map(|v| v.pixel_values.iter().copied())
            .collect();
        let dev = max_abs(&ours, &pv.values);
        assert!(dev <= 1e-5, "{name}: pixel_values_videos deviate by {dev}");
        let grids: Vec<i64> = videos
            .iter()
            .flat_map(|v| v.grid.iter().map(|&g| g as i64))
            .collect();
        assert_eq!(
            grids,
            expected["video_grid_thw"].as_i64(),
            "{name}: video_grid_thw"
        );
        if let Some(s) = expected.get("second_per_grid_ts") {
            for (v, &e) in videos.iter().zip(&s.values) {
                assert_eq!(
                    v.video.as_ref().unwrap().second_per_grid_t as f64,
                    e,
                    "{name}: second_per_grid_ts"
                );
            }
        }
        let images: Vec<ProcessedImage> = case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                processor
                    .process(&load_rgb(&dir.join(f.as_str().unwrap())).unwrap())
                    .unwrap()
            })
            .collect();
        if let Some(px) = expected.get("pixel_values") {
            let ours: Vec<f32> = images
                .iter()
                .flat_map(|i| i.pixel_values.iter().copied())
                .collect();
            let dev = max_abs(&ours, &px.values);
            assert!(dev <= 1e-5, "{name}: pixel_values deviate by {dev}");
        }

        // Vision inputs in prompt order.
        let (mut vi, mut ii) = (videos.into_iter(), images.into_iter());
        let media: Vec<ProcessedImage> = placeholder_order(case["prompt"].as_str().unwrap())
            .into_iter()
            .map(|v| if v { vi.next() } else { ii.next() }.unwrap())
            .collect();

        let ids: Vec<u32> = expected["input_ids"]
            .as_i64()
            .iter()
            .map(|&x| x as u32)
            .collect();
        let batch = PaddedBatch::left_pad(&[ids], 0);
        let model = Model::<Flex>::load(&model_dir, &device).unwrap();
        let pos = model.position_ids(&batch, &media).unwrap();
        assert_eq!(
            pos.ids,
            expected["position_ids"].as_i64(),
            "{name}: position ids"
        );
        assert_eq!(
            pos.rope_deltas,
            expected["rope_deltas"].as_i64(),
            "{name}: rope deltas"
        );
        let logits = model.logits(&batch, &media, &device).unwrap();
        let logits: Vec<f32> = logits.into_data().into_vec::<f32>().unwrap();
        let e = &expected["logits"];
        let dev = max_abs(&logits, &e.values);
        let scale = e.values.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        eprintln!("{name}: logits max abs dev {dev:.2e} (scale {scale:.2})");
        assert!(
            dev <= 1e-4 * scale,
            "{name}: logits deviate by {dev} (tolerance {})",
            1e-4 * scale
        );
    }
}
