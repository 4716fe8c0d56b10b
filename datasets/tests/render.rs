//! Prompts render through a model's own chat template and tokenizer: the Gemma-layout fixture
//! (template writes BOS; the tokenizer must not add a second one) and the verl geo3k sample
//! through Qwen2-VL's template, tokenizer and image processor.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flowrl_datasets::ChatMessage;
use flowrl_datasets::cli::{InspectArgs, inspect};
use flowrl_datasets::dataset::{DatasetOptions, PromptDataset, Truncation, decode_row_images};
use flowrl_datasets::encoder::PromptEncoder;
use flowrl_datasets::verl::{ReadOptions, read_verl_file};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/data")
}

#[test]
fn gemma_layout_template_writes_one_bos_and_matches_the_fixture_ids() {
    let dir = fixtures().join("gemma4_chat");
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let enc = PromptEncoder::from_model_dir(&dir).unwrap();
    assert!(enc.processor.is_none());
    let messages = vec![ChatMessage {
        role: "user".into(),
        content: "<image>Describe this image.".into(),
    }];
    let text = enc.render(&messages, true).unwrap();
    assert_eq!(text, expected["prompt"].as_str().unwrap());
    let ids = enc.tokenize(&text).unwrap();

    // The fixture's ids after expansion, with the image run `<|image> <|image|>×n <image|>`
    // collapsed back to the single placeholder the template writes.
    let special = &expected["special_token_ids"];
    let (boi, image, eoi) = (
        special["boi"].as_u64().unwrap() as u32,
        special["image"].as_u64().unwrap() as u32,
        special["eoi"].as_u64().unwrap() as u32,
    );
    let mut want = Vec::new();
    for id in expected["expanded_prompt_ids"].as_array().unwrap() {
        let id = id.as_u64().unwrap() as u32;
        match id {
            x if x == boi => want.push(image),
            x if x == image || x == eoi => {}
            x => want.push(x),
        }
    }
    assert_eq!(ids, want);
    let bos = special["bos"].as_u64().unwrap() as u32;
    assert_eq!(enc.bos_token_id, Some(bos));
    assert_eq!(ids.iter().filter(|&&t| t == bos).count(), 1);
    // A BOS the text already doubles is reduced to one.
    let doubled = enc.tokenize(&format!("<bos>{text}")).unwrap();
    assert_eq!(doubled, ids);

    // The template's own checks surface as errors.
    let bad = vec![
        ChatMessage {
            role: "assistant".into(),
            content: "hi".into(),
        },
        ChatMessage {
            role: "assistant".into(),
            content: "hi".into(),
        },
    ];
    let e = format!("{:#}", enc.render(&bad, true).unwrap_err());
    assert!(e.contains("Conversation roles must alternate"), "{e}");
}

/// The tiny tokenizer + the Qwen2-VL processor settings of the model fixtures, with the
/// special-token ids of that tokenizer in config.json.
fn qwen_model_dir(dir: &Path) -> PathBuf {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    let assets = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets/tokenizer");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(assets.join(f), model.join(f)).unwrap();
    }
    let fixture = fixtures().join("qwen2_vl_processor");
    std::fs::copy(
        fixture.join("preprocessor_config.json"),
        model.join("preprocessor_config.json"),
    )
    .unwrap();
    let tok = flowrl_datasets::encoder::load_tokenizer(&model).unwrap();
    let id = |t: &str| serde_json::json!(tok.token_to_id(t).unwrap());
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap())
            .unwrap();
    config["image_token_id"] = id("<|image_pad|>");
    config["video_token_id"] = id("<|video_pad|>");
    config["vision_start_token_id"] = id("<|vision_start|>");
    config["vision_end_token_id"] = id("<|vision_end|>");
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    model
}

#[test]
fn geo3k_sample_renders_through_qwen2_vl() {
    let tmp = tempfile::tempdir().unwrap();
    let model = qwen_model_dir(tmp.path());
    let enc = Arc::new(PromptEncoder::from_model_dir(&model).unwrap());
    let pad = enc.image_token_id().unwrap();
    let path = fixtures().join("verl_geo3k_sample/train.parquet");
    let file = read_verl_file(&path, &ReadOptions::default()).unwrap();
    for row in &file.rows {
        let images = decode_row_images(row, &ReadOptions::default()).unwrap();
        let e = enc.encode(&row.messages, &images, true).unwrap();
        // verl's layout: every `<image>` became one vision block, in place, and nothing else changed.
        let block = "<|vision_start|><|image_pad|><|vision_end|>";
        let content = row.messages[0].content.replace("<image>", block);
        assert_eq!(
            e.text,
            format!(
                "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
            ),
            "row {}",
            row.source.row
        );
        assert_eq!(e.images.len(), row.images.len());
        let expanded = e.input_ids.iter().filter(|&&t| t == pad).count();
        assert_eq!(expanded, e.num_image_tokens);
        for p in &e.images {
            // Qwen2-VL: one token per 2×2 merged patches of the [t, h, w] grid.
            assert_eq!(p.num_tokens, p.grid[1] * p.grid[2] / 4);
        }
        // Text outside the image tokens tokenizes back to the rendered text.
        let text_ids: Vec<u32> = {
            let mut out = Vec::new();
            let mut prev_pad = false;
            for &t in &e.input_ids {
                if t == pad {
                    if !prev_pad {
                        out.push(t);
                    }
                    prev_pad = true;
                } else {
                    out.push(t);
                    prev_pad = false;
                }
            }
            out
        };
        assert_eq!(enc.tokenizer.decode(&text_ids, false).unwrap(), e.text);
    }

    // A dataset over both splits' files: filtering by length counts image tokens.
    let paths = vec![
        path.clone(),
        fixtures().join("verl_geo3k_sample/test.parquet"),
    ];
    let options = DatasetOptions {
        max_prompt_length: 4096,
        truncation: Truncation::Error,
        batch_size: 4,
        ..DatasetOptions::default()
    };
    let mut ds = PromptDataset::load(&paths, enc.clone(), options.clone()).unwrap();
    let b = ds.next_batch().unwrap();
    assert_eq!(b.len(), 4);
    let n_images: usize = b.prompts.iter().map(|p| p.images.len()).sum();
    assert_eq!(b.images().len(), n_images);
    assert!(
        b.prompts
            .iter()
            .all(|p| p.data_source == "hiyouga/geometry3k")
    );
    let max = ds.report().max_length;
    // With the limit just below the longest prompt, that prompt (or those) is filtered out.
    let mut tight = options;
    tight.max_prompt_length = max - 1;
    tight.filter_overlong_prompts = true;
    let filtered = PromptDataset::load(&paths, enc, tight).unwrap();
    assert!(filtered.report().filtered_overlong >= 1);
    assert_eq!(
        filtered.len() + filtered.report().filtered_overlong,
        ds.len()
    );
}

#[test]
fn inspect_reports_schema_counts_and_rendered_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let model = qwen_model_dir(tmp.path());
    let mut out = Vec::new();
    inspect(
        &InspectArgs {
            file: fixtures().join("verl_geo3k_sample/test.parquet"),
            model: Some(model),
            rows: 2,
            prompt_key: "prompt".into(),
            image_key: "images".into(),
            max_errors: 20,
            json: false,
        },
        &mut out,
    )
    .unwrap();
    let out = String::from_utf8(out).unwrap();
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("verl_geo3k_sample/expected.json")).unwrap(),
    )
    .unwrap();
    let split = &expected["splits"]["test"];
    let n_images: usize = split["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["images"].as_array().unwrap().len())
        .sum();
    assert!(
        out.contains(&format!("rows: {}   row groups: 1", split["num_rows"])),
        "{out}"
    );
    assert!(
        out.contains("  prompt: list<struct<role: string, content: string>>"),
        "{out}"
    );
    assert!(
        out.contains(&format!("images: {n_images} (PNG: {n_images})")),
        "{out}"
    );
    assert!(out.contains("--- row 1"), "{out}");
    assert!(!out.contains("--- row 2"), "{out}");
    assert!(out.contains("rendered: <|im_start|>system"), "{out}");
    assert!(out.contains(" image tokens in "), "{out}");
    assert!(
        out.contains("placeholder/image count mismatches: 0"),
        "{out}"
    );
}

/// The picture `expected` (gemma4_chat's expected.json) was made from: the image of a processor
/// case among the model fixtures (`kind = "processor_only"`) with the same prompt, expanded ids
/// and soft-token count, found by content, never by case name.
fn gemma4_chat_picture(expected: &Value) -> PathBuf {
    let models = fixtures().join("../models");
    let mut found = Vec::new();
    for family in std::fs::read_dir(&models).unwrap() {
        for case in std::fs::read_dir(family.unwrap().path()).unwrap() {
            let dir = case.unwrap().path();
            let Ok(text) = std::fs::read_to_string(dir.join("case.json")) else {
                continue;
            };
            let case: Value = serde_json::from_str(&text).unwrap();
            if case["kind"] != "processor_only" {
                continue;
            }
            for image in case["images"].as_array().into_iter().flatten() {
                if image["prompt"] == expected["prompt"]
                    && image["num_soft_tokens"] == expected["num_soft_tokens"]
                    && image["expanded_prompt_ids_tiny_tokenizer"]
                        == expected["expanded_prompt_ids"]
                {
                    found.push(dir.join(image["png"].as_str().unwrap()));
                }
            }
        }
    }
    assert!(
        !found.is_empty(),
        "no processor fixture case has the picture of gemma4_chat/expected.json"
    );
    found.swap_remove(0)
}

/// The whole verl flow on a Gemma 4 model directory: a verl row with `<image>` and the fixture's
/// picture becomes exactly the fixture's expanded ids (template, tokenizer, Gemma 4 processor).
#[test]
fn verl_row_through_gemma4_processor_gives_the_fixture_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("gemma4");
    std::fs::create_dir_all(&model).unwrap();
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("gemma4_chat/expected.json")).unwrap(),
    )
    .unwrap();
    // The model case the picture belongs to gives the config, processor and tokenizer.
    let picture = gemma4_chat_picture(&expected);
    let case = picture.parent().unwrap();
    for f in ["config.json", "preprocessor_config.json", "tokenizer.json"] {
        std::fs::copy(case.join(f), model.join(f)).unwrap();
    }
    std::fs::copy(
        fixtures().join("gemma4_chat/tokenizer_config.json"),
        model.join("tokenizer_config.json"),
    )
    .unwrap();

    // One verl row: the fixture's picture and question.
    let png = std::fs::read(&picture).unwrap();
    let sample = flowrl_datasets::synth::ShapeSample {
        image: image::load_from_memory(&png).unwrap().to_rgb8(),
        question: "<image>Describe this image.".into(),
        prompt: "<image>Describe this image.".into(),
        answer: "x".into(),
        data_source: flowrl_datasets::synth::DATA_SOURCE,
        turns: Vec::new(),
    };
    let path = tmp.path().join("one.parquet");
    flowrl_datasets::synth::write_split(&path, "test", &[sample]).unwrap();

    let enc = Arc::new(PromptEncoder::from_model_dir(&model).unwrap());
    let options = DatasetOptions {
        batch_size: 1,
        max_prompt_length: 512,
        ..DatasetOptions::default()
    };
    let mut ds = PromptDataset::load(&[path], enc, options).unwrap();
    let b = ds.next_batch().unwrap();
    let want: Vec<u32> = expected["expanded_prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(b.prompts[0].input_ids, want);
    assert_eq!(
        b.prompts[0].images[0].num_tokens as u64,
        expected["num_soft_tokens"].as_u64().unwrap()
    );
    assert_eq!(b.prompts[0].text, expected["prompt"].as_str().unwrap());
}

/// verl's pre-processor resize (qwen_vl_utils.fetch_image, patch size 14) followed by Qwen2-VL's
/// processor gives the processor's own result when the processor's pixel limits hold the
/// picture: the same target size, one Pillow-exact bicubic resize.
#[test]
fn verl_fetch_resize_then_qwen_processor_equals_the_processor_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let model = qwen_model_dir(tmp.path());
    let enc = PromptEncoder::from_model_dir(&model).unwrap();
    let plain = ReadOptions::default();
    let verl = ReadOptions {
        verl_image_patch_size: Some(14),
        ..ReadOptions::default()
    };
    let path = fixtures().join("verl_geo3k_sample/train.parquet");
    let file = read_verl_file(&path, &plain).unwrap();
    let mut resized = 0;
    for row in &file.rows {
        let a = decode_row_images(row, &plain).unwrap();
        let b = decode_row_images(row, &verl).unwrap();
        resized += a
            .iter()
            .zip(&b)
            .filter(|(x, y)| x.dimensions() != y.dimensions())
            .count();
        let ea = enc.encode(&row.messages, &a, true).unwrap();
        let eb = enc.encode(&row.messages, &b, true).unwrap();
        assert_eq!(ea.input_ids, eb.input_ids, "row {}", row.source.row);
        assert_eq!(ea.images, eb.images, "row {}", row.source.row);
    }
    assert!(
        resized > 0,
        "the sample has sizes that are not multiples of 28"
    );
}

#[test]
fn truncation_never_cuts_image_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let model = qwen_model_dir(tmp.path());
    let enc = Arc::new(PromptEncoder::from_model_dir(&model).unwrap());
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../datasets/shapes/test.parquet");
    let options = |truncation, max| DatasetOptions {
        max_prompt_length: max,
        truncation,
        filter_overlong_prompts: false,
        batch_size: 2,
        ..DatasetOptions::default()
    };
    // Left truncation to 30 tokens drops the start of the prompt, where the image sits.
    let e = PromptDataset::load(
        std::slice::from_ref(&path),
        enc.clone(),
        options(Truncation::Left, 30),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("row 0, column `prompt`: truncating the"), "{e}");
    assert!(
        e.contains("of its 4 image tokens; raise max_prompt_length"),
        "{e}"
    );
    // Right truncation to 30 keeps the image (it is near the start) and cuts the end.
    let ds = PromptDataset::load(&[path], enc, options(Truncation::Right, 30)).unwrap();
    assert_eq!(ds.report().truncated, ds.len());
    assert_eq!(ds.report().max_length, 30);
}
