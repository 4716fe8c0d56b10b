//! Qwen3-VL's image processor against Hugging Face transformers 5.24 on the golden fixtures:
//! the `processor_only` cases (decoded RGB, resized picture, pixel values, grids, token counts,
//! expanded prompt ids) and the PNGs of the model cases.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use common::qwen3_vl::{Case, cases, read_json};
use common::{Array, read_safetensors};
use flowrl_models::image::load_rgb;
use flowrl_models::{ImageProcessor, load_image_processor};

/// `pixel_values` when `resized_u8` is reproduced exactly (README §7).
const PIXEL_TOL: f64 = 1e-6;

/// Token ids of a fixture prompt: special strings by `special`, `w<i>` is ordinary token i.
fn prompt_ids(prompt: &str, special: &HashMap<String, u32>) -> Vec<u32> {
    let mut ids = Vec::new();
    let mut rest = prompt.trim_start();
    while !rest.is_empty() {
        if let Some((s, &id)) = special.iter().find(|(s, _)| rest.starts_with(s.as_str())) {
            ids.push(id);
            rest = rest[s.len()..].trim_start();
            continue;
        }
        let end = rest
            .find(|c: char| c.is_whitespace() || c == '<')
            .unwrap_or(rest.len());
        let word = &rest[..end];
        let id = word
            .strip_prefix('w')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected prompt word {word:?}"));
        ids.push(id);
        rest = rest[end..].trim_start();
    }
    ids
}

fn max_abs(a: &[f32], e: &Array) -> f64 {
    assert_eq!(a.len(), e.values.len());
    a.iter()
        .zip(&e.values)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

/// `processor_only` cases: per image the decoded RGB, the resized picture (exact), pixel values
/// (1e-6), grid, token count and expanded prompt ids (exact), with the family's processor built
/// from the case's `preprocessor_config.json` and the image token of `special_tokens`.
#[test]
fn qwen3_vl_processor_matches_transformers() {
    use flowrl_models::qwen3_vl::processor::{Qwen3VlImageProcessor, Qwen3VlProcessorConfig};
    for dir in cases("processor_only") {
        let case = read_json(&dir.join("case.json"));
        let special: HashMap<String, u32> = case["special_tokens"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap() as u32))
            .collect();
        let text = std::fs::read_to_string(dir.join("preprocessor_config.json")).unwrap();
        let config = Qwen3VlProcessorConfig::from_json(&text).unwrap();
        let processor = Qwen3VlImageProcessor::new(config, special["<|image_pad|>"]);
        assert_eq!(processor.placeholder_token(), "<|image_pad|>");
        let prompt = prompt_ids(case["example_prompt"].as_str().unwrap(), &special);
        let expected = read_safetensors(&dir.join("expected.safetensors"));
        let images = case["images"].as_array().unwrap();
        for entry in images {
            let name = entry["image"].as_str().unwrap();
            let what = format!("{} / {name}", dir.display());
            let rgb = load_rgb(&dir.join(entry["file"].as_str().unwrap())).unwrap();
            if let Some(want) = expected.get(&format!("{name}.rgb_u8")) {
                let got: Vec<f64> = rgb.as_raw().iter().map(|&v| v as f64).collect();
                assert_eq!(got, want.values, "{what}: rgb_u8");
            }
            let resized = processor.resize(&rgb).unwrap();
            let want = &expected[&format!("{name}.resized_u8")];
            assert_eq!(
                want.shape,
                [resized.height() as usize, resized.width() as usize, 3],
                "{what}: resized size"
            );
            let got: Vec<f64> = resized.as_raw().iter().map(|&v| v as f64).collect();
            assert_eq!(got, want.values, "{what}: resized_u8");
            let out = processor.process(&rgb).unwrap();
            let want = &expected[&format!("{name}.pixel_values")];
            assert_eq!(out.shape, want.shape, "{what}: pixel_values shape");
            let diff = max_abs(&out.pixel_values, want);
            assert!(diff <= PIXEL_TOL, "{what}: pixel_values differ by {diff}");
            let grid = expected[&format!("{name}.image_grid_thw")].as_i64();
            let grid: Vec<usize> = grid.iter().map(|&g| g as usize).collect();
            assert_eq!(out.grid, grid, "{what}: image_grid_thw");
            assert_eq!(
                out.num_tokens as u64,
                entry["num_image_tokens"].as_u64().unwrap()
            );
            let ids = processor
                .expand_placeholders(&prompt, std::slice::from_ref(&out))
                .unwrap();
            let want: Vec<u32> = expected[&format!("{name}.prompt_input_ids")]
                .as_i64()
                .iter()
                .map(|&t| t as u32)
                .collect();
            assert_eq!(ids, want, "{what}: prompt_input_ids");
            eprintln!("{what}: grid {grid:?}, pixel_values max |Δ| = {diff:e}");
        }
    }
}

/// Model cases: the PNGs, processed by the processor the registry builds from the case folder,
/// reproduce `pixel_values` and the grids; the image-token runs of `input_ids` have the
/// processor's token counts.
#[test]
fn qwen3_vl_model_case_pixels_match_transformers() {
    for dir in cases("model") {
        let case = Case::read(&dir);
        let processor = load_image_processor(&dir).unwrap();
        let mut pngs: Vec<(usize, PathBuf)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "png"))
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                let k: String = name
                    .trim_start_matches("image")
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                (k.parse().unwrap(), p)
            })
            .collect();
        pngs.sort();
        assert_eq!(
            pngs.len(),
            case.images.len(),
            "{}: PNGs vs images",
            case.name
        );
        for ((_, png), want) in pngs.iter().zip(&case.images) {
            let out = processor.process(&load_rgb(png).unwrap()).unwrap();
            assert_eq!(out.grid, want.grid, "{}: grid", png.display());
            assert_eq!(out.num_tokens, want.num_tokens, "{}: tokens", png.display());
            let diff = out
                .pixel_values
                .iter()
                .zip(&want.pixel_values)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                diff as f64 <= PIXEL_TOL,
                "{}: pixel_values differ by {diff}",
                png.display()
            );
        }
        let image_token = case.config["image_token_id"].as_u64().unwrap() as u32;
        let runs: Vec<usize> = case
            .batch
            .ids
            .chunk_by(|a, b| a == b)
            .filter(|run| run[0] == image_token)
            .map(<[u32]>::len)
            .collect();
        let tokens: Vec<usize> = case.images.iter().map(|i| i.num_tokens).collect();
        assert_eq!(runs, tokens, "{}: image-token runs", case.name);
    }
}
