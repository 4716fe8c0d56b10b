//! Videos through the datasets crate: the prompt expansion of every case in
//! `tests/fixtures/video/` equals transformers' `input_ids` exactly (Qwen2-VL, Qwen2.5-VL with a
//! picture before the video, Qwen3-VL's timestamped frames), and the verl-style parquet
//! `tests/fixtures/data/verl_video_sample/` loads into batches whose videos carry their grids,
//! and `flowrl data inspect` reports its frames and token counts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flowrl_datasets::cli::{InspectArgs, inspect};
use flowrl_datasets::video::{EncodedVideo, VideoOptions, video_frames};
use flowrl_datasets::{ChatMessage, DatasetOptions, PromptDataset, PromptEncoder};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rgb(path: &Path) -> image::RgbImage {
    flowrl_datasets::images::decode_rgb(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn video_prompts_expand_like_transformers() {
    let root = repo().join("tests/fixtures/video");
    let mut n = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("case.json").exists() {
            continue;
        }
        n += 1;
        let case: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let enc =
            PromptEncoder::from_model_dir(&repo().join(case["model"].as_str().unwrap())).unwrap();
        let videos: Vec<_> = case["videos"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                let frames = v["video"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| rgb(&dir.join(f.as_str().unwrap())))
                    .collect();
                let entry = EncodedVideo {
                    sample_fps: v["sample_fps"].as_f64(),
                    ..Default::default()
                };
                video_frames(&entry, frames, &VideoOptions::default()).unwrap()
            })
            .collect();
        let images: Vec<_> = case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| rgb(&dir.join(f.as_str().unwrap())))
            .collect();
        let messages = [ChatMessage {
            role: "user".into(),
            content: case["prompt"].as_str().unwrap().into(),
        }];
        let e = enc.encode_media(&messages, &images, &videos, true).unwrap();
        assert_eq!(
            e.text,
            case["text"].as_str().unwrap(),
            "{}: rendered",
            dir.display()
        );
        let want: Vec<u32> = case["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(e.input_ids, want, "{}: input_ids", dir.display());
        assert_eq!(e.images.len(), images.len() + videos.len());
    }
    assert!(n >= 3, "video cases missing under {}", root.display());
}

#[test]
fn the_verl_video_parquet_loads_into_batches_with_video_grids() {
    let data = repo().join("tests/fixtures/data/verl_video_sample");
    let enc =
        Arc::new(PromptEncoder::from_model_dir(&repo().join("assets/tiny-qwen2-vl")).unwrap());
    let video_token = enc.video_token_id().unwrap();
    let options = DatasetOptions {
        batch_size: 4,
        shuffle: false,
        max_prompt_length: 256,
        ..Default::default()
    };
    let mut ds = PromptDataset::load(&[data.join("train.parquet")], enc, options).unwrap();
    assert_eq!(ds.len(), 8);
    let batch = ds.next_batch().unwrap();
    for p in &batch.prompts {
        let videos: Vec<_> = p.images.iter().filter(|i| i.video.is_some()).collect();
        assert_eq!(videos.len(), 1, "one video per row");
        let v = videos[0];
        // 56x56 frames: 4x4 patches; 2 to 4 frames → 1 or 2 temporal patches of 4 tokens.
        assert_eq!(&v.grid[1..], &[4, 4]);
        let tokens = p.input_ids.iter().filter(|&&t| t == video_token).count();
        assert_eq!(tokens, v.num_tokens);
        assert_eq!(v.num_tokens, 4 * v.grid[0]);
    }
    // Row 0 has its picture before its video, in that order.
    let first = &batch.prompts[0];
    assert_eq!(first.images.len(), 2);
    assert!(first.images[0].video.is_none() && first.images[1].video.is_some());

    let mut out = Vec::new();
    inspect(
        &InspectArgs {
            file: data.join("train.parquet"),
            model: Some(repo().join("assets/tiny-qwen2-vl")),
            prompt_key: "prompt".into(),
            image_key: "images".into(),
            rows: 2,
            json: false,
            max_errors: 20,
        },
        &mut out,
    )
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("videos: 8 (23 frames)"), "{text}");
    assert!(text.contains("video 0: 2 frames 56x56"), "{text}");
    assert!(
        text.contains("vision tokens in 1 image(s) and 1 video(s)"),
        "{text}"
    );
    assert!(text.contains("video 0: grid [1, 4, 4]"), "{text}");
}
