//! Image-processor parity with the Hugging Face reference (transformers 5.24, PIL backend).
//!
//! Discovers every case under `$FLOWRL_MODEL_FIXTURES` (default: the repository's
//! `tests/fixtures/models`), one folder per `model_type`; a family folder that is absent is skipped.
//! - `processor_only` cases (`case.json` `"kind": "processor_only"`): per image, the decoded RGB
//!   (`rgb_u8`, when given) and the resized picture (`resized_u8`) exactly, `pixel_values` within
//!   1e-6, grids, patch positions, token counts and the expanded prompt ids exactly.
//! - model cases (folders with `config.json` and `inputs.safetensors` holding `pixel_values`):
//!   every PNG of the case, processed by the processor that `load_image_processor` builds from the
//!   case folder, reproduces its rows of `pixel_values` (and Gemma's `image_position_ids` /
//!   `num_soft_tokens_per_image`), and expanding the collapsed prompts gives `input_ids` again.
//!   PNG `image<k>…` / `image_<k>…` is image k of the batch.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::max_abs_diff;
use flowrl_models::gemma4::processor::{Gemma4ImageProcessor, Gemma4ProcessorConfig};
use flowrl_models::image::load_rgb;
use flowrl_models::qwen2_vl::processor::{Qwen2VlImageProcessor, Qwen2VlProcessorConfig};
use flowrl_models::{ImageProcessor, ProcessedImage, load_image_processor};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

/// `pixel_values` tolerance when `resized_u8` is reproduced exactly (README section 7).
const PIXEL_TOL: f32 = 1e-6;

fn fixtures_root() -> (PathBuf, bool) {
    match std::env::var_os("FLOWRL_MODEL_FIXTURES") {
        Some(dir) => (PathBuf::from(dir), true),
        None => (
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models"),
            false,
        ),
    }
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Case folders (sorted) of a family folder.
fn case_dirs(family_dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(family_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn is_processor_case(dir: &Path) -> bool {
    let case = dir.join("case.json");
    case.exists() && read_json(&case)["kind"] == "processor_only"
}

/// A safetensors file kept in memory.
struct Tensors(Vec<u8>);

impl Tensors {
    fn open(path: &Path) -> Self {
        Self(std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }

    fn get(&self, name: &str) -> Option<(Dtype, Vec<usize>, Vec<u8>)> {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let view = st.tensor(name).ok()?;
        Some((view.dtype(), view.shape().to_vec(), view.data().to_vec()))
    }

    fn f32(&self, name: &str) -> Option<(Vec<usize>, Vec<f32>)> {
        let (dtype, shape, data) = self.get(name)?;
        assert_eq!(dtype, Dtype::F32, "{name}");
        let v = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        Some((shape, v))
    }

    fn i64(&self, name: &str) -> Option<(Vec<usize>, Vec<i64>)> {
        let (dtype, shape, data) = self.get(name)?;
        assert_eq!(dtype, Dtype::I64, "{name}");
        let v = data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        Some((shape, v))
    }

    fn u8(&self, name: &str) -> Option<(Vec<usize>, Vec<u8>)> {
        let (dtype, shape, data) = self.get(name)?;
        assert_eq!(dtype, Dtype::U8, "{name}");
        Some((shape, data))
    }
}

/// Number of u8 values that differ, and the largest difference.
fn u8_diff(a: &[u8], b: &[u8]) -> (usize, u8) {
    assert_eq!(a.len(), b.len());
    let diffs = a.iter().zip(b).filter(|(x, y)| x != y).count();
    let max = a
        .iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0);
    (diffs, max)
}

/// PNGs of a model case, ordered by the image index in their name (`image3_…`, `image_3`).
fn case_pngs(dir: &Path) -> Vec<PathBuf> {
    let mut pngs: Vec<(usize, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let digits: String = name
                .trim_start_matches("image")
                .trim_start_matches('_')
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let k = digits
                .parse()
                .unwrap_or_else(|_| panic!("PNG {name} has no image index"));
            (k, p)
        })
        .collect();
    pngs.sort();
    pngs.into_iter().map(|(_, p)| p).collect()
}

// ---------------------------------------------------------------------------------------------
// Qwen2-VL / Qwen2.5-VL
// ---------------------------------------------------------------------------------------------

/// Token ids of the fixture prompt: special strings by `special`, `w<i>` is ordinary token i.
fn qwen_prompt_ids(prompt: &str, special: &HashMap<String, u32>) -> Vec<u32> {
    let mut ids = Vec::new();
    let mut rest = prompt;
    while !rest.is_empty() {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        if let Some((s, &id)) = special.iter().find(|(s, _)| rest.starts_with(s.as_str())) {
            ids.push(id);
            rest = &rest[s.len()..];
            continue;
        }
        let word_end = rest
            .find(|c: char| c.is_whitespace() || c == '<')
            .unwrap_or(rest.len());
        let word = &rest[..word_end];
        let id = word
            .strip_prefix('w')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected prompt word {word:?}"));
        ids.push(id);
        rest = &rest[word_end..];
    }
    ids
}

fn check_qwen_processor_case(dir: &Path) -> usize {
    let case = read_json(&dir.join("case.json"));
    let special: HashMap<String, u32> = case["special_tokens"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap() as u32))
        .collect();
    let config = Qwen2VlProcessorConfig::from_json(
        &std::fs::read_to_string(dir.join("preprocessor_config.json")).unwrap(),
    )
    .unwrap();
    let processor = Qwen2VlImageProcessor::new(config, special["<|image_pad|>"]);
    assert_eq!(processor.placeholder_token(), "<|image_pad|>");
    let prompt = qwen_prompt_ids(case["example_prompt"].as_str().unwrap(), &special);
    let expected = Tensors::open(&dir.join("expected.safetensors"));

    let images = case["images"].as_array().unwrap();
    for entry in images {
        let name = entry["image"].as_str().unwrap();
        let what = format!("{} / {name}", dir.display());
        let rgb = load_rgb(&dir.join(entry["file"].as_str().unwrap())).unwrap();
        let size_wh = [rgb.width() as u64, rgb.height() as u64];
        assert_eq!(
            entry["size_wh"],
            serde_json::json!(size_wh),
            "{what}: source size"
        );
        if let Some((shape, want)) = expected.u8(&format!("{name}.rgb_u8")) {
            assert_eq!(shape, [rgb.height() as usize, rgb.width() as usize, 3]);
            assert_eq!(u8_diff(rgb.as_raw(), &want), (0, 0), "{what}: rgb_u8");
        }

        let resized = processor.resize(&rgb).unwrap();
        let (shape, want) = expected.u8(&format!("{name}.resized_u8")).unwrap();
        assert_eq!(
            shape,
            [resized.height() as usize, resized.width() as usize, 3],
            "{what}: resized size"
        );
        assert_eq!(
            u8_diff(resized.as_raw(), &want),
            (0, 0),
            "{what}: resized_u8 (differing values, max difference)"
        );

        let out = processor.process(&rgb).unwrap();
        let (shape, want) = expected.f32(&format!("{name}.pixel_values")).unwrap();
        assert_eq!(out.shape, shape, "{what}: pixel_values shape");
        let diff = max_abs_diff(&out.pixel_values, &want);
        assert!(diff <= PIXEL_TOL, "{what}: pixel_values differ by {diff}");

        let (_, grid) = expected.i64(&format!("{name}.image_grid_thw")).unwrap();
        let grid: Vec<usize> = grid.iter().map(|&g| g as usize).collect();
        assert_eq!(out.grid, grid, "{what}: image_grid_thw");
        assert_eq!(
            out.num_tokens as u64,
            entry["num_image_tokens"].as_u64().unwrap(),
            "{what}: image tokens"
        );

        assert_eq!(
            prompt.len() as u64,
            entry["prompt_tokens_before_expansion"].as_u64().unwrap()
        );
        let ids = processor
            .expand_placeholders(&prompt, std::slice::from_ref(&out))
            .unwrap();
        let (_, want) = expected.i64(&format!("{name}.prompt_input_ids")).unwrap();
        let want: Vec<u32> = want.iter().map(|&t| t as u32).collect();
        assert_eq!(ids, want, "{what}: prompt_input_ids");
        assert_eq!(
            ids.len() as u64,
            entry["prompt_tokens_after_expansion"].as_u64().unwrap()
        );
        println!("{what}: grid {grid:?}, pixel_values max |Δ| = {diff:e}");
    }
    images.len()
}

/// A Qwen model case: every PNG, processed by the processor the family registry builds from the
/// case folder (`config.json` + `preprocessor_config.json`), reproduces its rows of
/// `pixel_values` and its grid; re-expanding the prompts reproduces `input_ids`.
fn check_qwen_model_case(dir: &Path) -> usize {
    let inputs = Tensors::open(&dir.join("inputs.safetensors"));
    let Some((shape, pixels)) = inputs.f32("pixel_values") else {
        return 0;
    };
    let (_, grids) = inputs.i64("image_grid_thw").unwrap();
    let processor = load_image_processor(dir).unwrap();
    assert_eq!(processor.placeholder_token(), "<|image_pad|>");
    let pngs = case_pngs(dir);
    assert_eq!(
        pngs.len() * 3,
        grids.len(),
        "{}: PNGs vs grids",
        dir.display()
    );
    let row_len = shape[1];
    let mut row = 0;
    let mut images = Vec::new();
    for (k, png) in pngs.iter().enumerate() {
        let out = processor.process(&load_rgb(png).unwrap()).unwrap();
        let grid: Vec<usize> = grids[k * 3..k * 3 + 3]
            .iter()
            .map(|&g| g as usize)
            .collect();
        assert_eq!(out.grid, grid, "{}: grid", png.display());
        let n = out.shape[0];
        let want = &pixels[row * row_len..(row + n) * row_len];
        let diff = max_abs_diff(&out.pixel_values, want);
        assert!(
            diff <= PIXEL_TOL,
            "{}: pixel_values differ by {diff}",
            png.display()
        );
        println!(
            "{}: grid {grid:?}, pixel_values max |Δ| = {diff:e}",
            png.display()
        );
        row += n;
        images.push(out);
    }
    assert_eq!(
        row,
        shape[0],
        "{}: every pixel row accounted for",
        dir.display()
    );
    let image_token = config_id(dir, "image_token_id");
    check_reexpansion(dir, &inputs, processor.as_ref(), &images, image_token, None);
    pngs.len()
}

/// An integer id from the case's `config.json`.
fn config_id(dir: &Path, key: &str) -> u32 {
    read_json(&dir.join("config.json"))[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{}: config.json has no {key}", dir.display())) as u32
}

/// Collapses every expanded image of each real prompt row of `input_ids` back into one
/// placeholder (a run of `image_token`, plus the `wrap` = (begin, end) ids around it), expands
/// it again with `processor` and the row's images (in order), and compares with the row.
fn check_reexpansion(
    dir: &Path,
    inputs: &Tensors,
    processor: &dyn ImageProcessor,
    images: &[ProcessedImage],
    image_token: u32,
    wrap: Option<(u32, u32)>,
) {
    let (shape, ids) = inputs.i64("input_ids").unwrap();
    let (_, mask) = inputs.i64("attention_mask").unwrap();
    let mut next_image = 0;
    for b in 0..shape[0] {
        let row: Vec<u32> = (0..shape[1])
            .filter(|&l| mask[b * shape[1] + l] != 0)
            .map(|l| ids[b * shape[1] + l] as u32)
            .collect();
        let mut collapsed: Vec<u32> = Vec::new();
        for &t in &row {
            if t == image_token && collapsed.last() == Some(&image_token) {
                continue;
            }
            collapsed.push(t);
        }
        if let Some((begin, end)) = wrap {
            let mut out: Vec<u32> = Vec::new();
            for (i, &t) in collapsed.iter().enumerate() {
                let next = collapsed.get(i + 1);
                let prev = i.checked_sub(1).map(|j| collapsed[j]);
                if (t == begin && next == Some(&image_token))
                    || (t == end && prev == Some(image_token))
                {
                    continue;
                }
                out.push(t);
            }
            collapsed = out;
        }
        let count = collapsed.iter().filter(|&&t| t == image_token).count();
        let row_images = &images[next_image..next_image + count];
        next_image += count;
        let expanded = processor
            .expand_placeholders(&collapsed, row_images)
            .unwrap();
        assert_eq!(expanded, row, "{}: row {b} re-expanded", dir.display());
    }
    assert_eq!(
        next_image,
        images.len(),
        "{}: every image placed",
        dir.display()
    );
}

// ---------------------------------------------------------------------------------------------
// Gemma 4
// ---------------------------------------------------------------------------------------------

/// The fixtures' tiny `WordLevel` tokenizer: added tokens matched first, then HF's `Whitespace`
/// pre-tokenizer (`\w+|[^\w\s]+`), unknown words → `<unk>`.
struct TinyTokenizer {
    added: Vec<(String, u32)>,
    vocab: HashMap<String, u32>,
    unk: u32,
}

impl TinyTokenizer {
    fn open(path: &Path) -> Self {
        let json = read_json(path);
        let vocab: HashMap<String, u32> = json["model"]["vocab"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap() as u32))
            .collect();
        let mut added: Vec<(String, u32)> = json["added_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let content = t["content"].as_str().unwrap().to_string();
                (content, t["id"].as_u64().unwrap() as u32)
            })
            .collect();
        added.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        let unk = vocab[json["model"]["unk_token"].as_str().unwrap()];
        Self { added, vocab, unk }
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut plain = String::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            if let Some((s, id)) = self
                .added
                .iter()
                .find(|(s, _)| rest.starts_with(s.as_str()))
            {
                self.encode_plain(&plain, &mut ids);
                plain.clear();
                ids.push(*id);
                rest = &rest[s.len()..];
            } else {
                plain.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        self.encode_plain(&plain, &mut ids);
        ids
    }

    fn encode_plain(&self, text: &str, ids: &mut Vec<u32>) {
        let word = |c: char| c.is_alphanumeric() || c == '_';
        let mut piece = String::new();
        let mut piece_is_word = false;
        let mut flush = |piece: &mut String| {
            if !piece.is_empty() {
                ids.push(*self.vocab.get(piece.as_str()).unwrap_or(&self.unk));
                piece.clear();
            }
        };
        for c in text.chars() {
            if c.is_whitespace() {
                flush(&mut piece);
            } else {
                if !piece.is_empty() && word(c) != piece_is_word {
                    flush(&mut piece);
                }
                piece_is_word = word(c);
                piece.push(c);
            }
        }
        flush(&mut piece);
    }
}

fn check_gemma_processor_case(dir: &Path) -> usize {
    let case = read_json(&dir.join("case.json"));
    let special = &case["special_token_ids_tiny_tokenizer"];
    let id = |k: &str| special[k].as_u64().unwrap() as u32;
    let config = Gemma4ProcessorConfig::from_json(
        &std::fs::read_to_string(dir.join("preprocessor_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        config.max_patches() as u64,
        case["max_patches"].as_u64().unwrap()
    );
    let processor = Gemma4ImageProcessor::new(config, id("boi"), id("image"), id("eoi"));
    assert_eq!(processor.placeholder_token(), "<|image|>");
    let tokenizer = TinyTokenizer::open(&dir.join("tokenizer.json"));
    let outputs = Tensors::open(&dir.join("processor_outputs.safetensors"));

    let images = case["images"].as_array().unwrap();
    for entry in images {
        let name = entry["name"].as_str().unwrap();
        let what = format!("{} / {name}", dir.display());
        let rgb = load_rgb(&dir.join(entry["png"].as_str().unwrap())).unwrap();
        assert_eq!(
            (rgb.width() as u64, rgb.height() as u64),
            (
                entry["source_width"].as_u64().unwrap(),
                entry["source_height"].as_u64().unwrap()
            ),
            "{what}: source size"
        );
        let resized = processor.resize(&rgb).unwrap();
        assert_eq!(
            (resized.width() as u64, resized.height() as u64),
            (
                entry["resized_width"].as_u64().unwrap(),
                entry["resized_height"].as_u64().unwrap()
            ),
            "{what}: resized size"
        );
        let out = processor.process(&rgb).unwrap();
        assert_eq!(
            out.grid,
            serde_json::from_value::<Vec<usize>>(entry["patch_grid_hw"].clone()).unwrap(),
            "{what}: patch grid"
        );
        assert_eq!(
            out.grid[0] * out.grid[1],
            entry["num_real_patches"].as_u64().unwrap() as usize
        );
        let (_, soft) = outputs.i64(&format!("{name}.num_soft_tokens")).unwrap();
        assert_eq!(out.num_tokens as i64, soft[0], "{what}: num_soft_tokens");
        assert_eq!(
            out.num_tokens as u64,
            entry["num_soft_tokens"].as_u64().unwrap()
        );

        let (shape, positions) = outputs.i64(&format!("{name}.image_position_ids")).unwrap();
        assert_eq!(
            shape,
            [1, out.shape[0], 2],
            "{what}: image_position_ids shape"
        );
        let got: Vec<i64> = out
            .patch_positions
            .as_ref()
            .expect("Gemma 4 gives patch positions")
            .iter()
            .flatten()
            .copied()
            .collect();
        assert_eq!(got, positions, "{what}: image_position_ids");

        let location = &entry["pixel_values_location"];
        let file = dir.join(location["file"].as_str().unwrap());
        let (shape, pixels) = Tensors::open(&file)
            .f32(location["tensor"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            &shape[1..],
            out.shape.as_slice(),
            "{what}: pixel_values shape"
        );
        let index = location["index"].as_u64().unwrap() as usize;
        let per_image = shape[1] * shape[2];
        let want = &pixels[index * per_image..(index + 1) * per_image];
        let diff = max_abs_diff(&out.pixel_values, want);
        assert!(diff <= PIXEL_TOL, "{what}: pixel_values differ by {diff}");

        let prompt = tokenizer.encode(entry["prompt"].as_str().unwrap());
        assert_eq!(prompt.iter().filter(|&&t| t == id("image")).count(), 1);
        let ids = processor
            .expand_placeholders(&prompt, std::slice::from_ref(&out))
            .unwrap();
        let want: Vec<u32> =
            serde_json::from_value(entry["expanded_prompt_ids_tiny_tokenizer"].clone()).unwrap();
        assert_eq!(ids, want, "{what}: expanded prompt ids");
        let mm: Vec<u32> = ids.iter().map(|&t| u32::from(t == id("image"))).collect();
        let want_mm: Vec<u32> = serde_json::from_value(entry["mm_token_type_ids"].clone()).unwrap();
        assert_eq!(mm, want_mm, "{what}: mm_token_type_ids");
        println!(
            "{what}: grid {:?}, {} soft tokens, pixel_values max |Δ| = {diff:e}",
            out.grid, out.num_tokens
        );
    }
    images.len()
}

/// A Gemma 4 model case: every PNG, processed by the processor the family registry builds from
/// the case folder, reproduces its `pixel_values`, `image_position_ids` and
/// `num_soft_tokens_per_image` entries; re-expanding the prompts reproduces `input_ids`.
fn check_gemma_model_case(dir: &Path) -> usize {
    let inputs = Tensors::open(&dir.join("inputs.safetensors"));
    let Some((shape, pixels)) = inputs.f32("pixel_values") else {
        return 0;
    };
    let (_, positions) = inputs.i64("image_position_ids").unwrap();
    let (_, soft) = inputs.i64("num_soft_tokens_per_image").unwrap();
    let processor = load_image_processor(dir).unwrap();
    assert_eq!(processor.placeholder_token(), "<|image|>");
    let pngs = case_pngs(dir);
    assert_eq!(pngs.len(), shape[0], "{}: PNGs vs images", dir.display());
    let per_image = shape[1] * shape[2];
    let mut images = Vec::new();
    for (k, png) in pngs.iter().enumerate() {
        let out = processor.process(&load_rgb(png).unwrap()).unwrap();
        assert_eq!(out.shape, shape[1..], "{}: shape", png.display());
        let diff = max_abs_diff(
            &out.pixel_values,
            &pixels[k * per_image..(k + 1) * per_image],
        );
        assert!(
            diff <= PIXEL_TOL,
            "{}: pixel_values differ by {diff}",
            png.display()
        );
        let got: Vec<i64> = out
            .patch_positions
            .iter()
            .flatten()
            .flatten()
            .copied()
            .collect();
        let n = shape[1] * 2;
        assert_eq!(
            got,
            positions[k * n..(k + 1) * n],
            "{}: positions",
            png.display()
        );
        assert_eq!(
            out.num_tokens as i64,
            soft[k],
            "{}: soft tokens",
            png.display()
        );
        println!("{}: pixel_values max |Δ| = {diff:e}", png.display());
        images.push(out);
    }
    let wrap = (
        config_id(dir, "boi_token_id"),
        config_id(dir, "eoi_token_id"),
    );
    let image_token = config_id(dir, "image_token_id");
    check_reexpansion(
        dir,
        &inputs,
        processor.as_ref(),
        &images,
        image_token,
        Some(wrap),
    );
    pngs.len()
}

// ---------------------------------------------------------------------------------------------

/// Runs `check` on every case of `family` that `select` accepts; returns images checked.
fn run_family(family: &str, select: fn(&Path) -> bool, check: fn(&Path) -> usize) -> usize {
    let (root, _) = fixtures_root();
    let family_dir = root.join(family);
    if !family_dir.is_dir() {
        println!("{}: absent, skipped", family_dir.display());
        return 0;
    }
    case_dirs(&family_dir)
        .iter()
        .filter(|d| select(d))
        .map(|d| check(d))
        .sum()
}

fn is_model_case_with_pixels(dir: &Path) -> bool {
    !is_processor_case(dir)
        && dir.join("inputs.safetensors").exists()
        && dir.join("config.json").exists()
        && dir.join("preprocessor_config.json").exists()
}

/// With the repository's own fixtures, a family that checks nothing means the copy is broken.
fn assert_checked(n: usize, what: &str) {
    let (_, from_env) = fixtures_root();
    assert!(
        from_env || n > 0,
        "no {what} found in the repository fixtures"
    );
    println!("{what}: {n} images checked");
}

#[test]
fn qwen2_vl_processor_cases() {
    let n = run_family("qwen2_vl", is_processor_case, check_qwen_processor_case);
    assert_checked(n, "qwen2_vl processor images");
}

#[test]
fn qwen2_5_vl_processor_cases() {
    let n = run_family("qwen2_5_vl", is_processor_case, check_qwen_processor_case);
    assert_checked(n, "qwen2_5_vl processor images");
}

#[test]
fn qwen_model_case_pixel_values() {
    let n = run_family("qwen2_vl", is_model_case_with_pixels, check_qwen_model_case)
        + run_family(
            "qwen2_5_vl",
            is_model_case_with_pixels,
            check_qwen_model_case,
        );
    assert_checked(n, "Qwen model-case images");
}

#[test]
fn gemma4_processor_cases() {
    let n = run_family("gemma4", is_processor_case, check_gemma_processor_case);
    assert_checked(n, "gemma4 processor images");
}

#[test]
fn gemma4_model_case_pixel_values() {
    let n = run_family("gemma4", is_model_case_with_pixels, check_gemma_model_case);
    assert_checked(n, "gemma4 model-case images");
}

#[test]
fn processed_image_is_what_the_trait_returns() {
    // The trait object path used by nodes gives the same result as the concrete processor.
    let config = Qwen2VlProcessorConfig::from_json("{}").unwrap();
    let concrete = Qwen2VlImageProcessor::new(config, 7);
    let boxed: Box<dyn ImageProcessor> = Box::new(concrete.clone());
    let picture = image::RgbImage::from_fn(60, 45, |x, y| image::Rgb([x as u8, y as u8, 9]));
    let a: ProcessedImage = boxed.process(&picture).unwrap();
    assert_eq!(a, concrete.process(&picture).unwrap());
    assert_eq!(a.grid, vec![1, 4, 4]);
}
