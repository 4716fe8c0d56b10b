//! The embedded "shapes" task and the tiny models' tokenizer: the committed files are exactly what
//! `flowrl data synth` makes with the default seed, the task is well formed, and its prompts
//! render and tokenize through the Qwen2-VL template and image processor.
//!
//! After an intended change of the generator, regenerate the committed files with
//! `flowrl data synth` (or `FLOWRL_BLESS=1 cargo test --release -p flowrl-datasets --test shapes`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flowrl_datasets::cli::{SynthArgs, synth};
use flowrl_datasets::dataset::{DatasetOptions, PromptDataset, Truncation};
use flowrl_datasets::encoder::PromptEncoder;
use flowrl_datasets::synth::{
    DEFAULT_SEED, DEFAULT_TEST, DEFAULT_TRAIN, IMAGE_SIZE, SPECIAL_TOKENS, sample,
};
use flowrl_datasets::verl::{ReadOptions, read_verl_file};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn committed_data() -> PathBuf {
    repo().join("datasets/shapes")
}

fn committed_tokenizer() -> PathBuf {
    repo().join("assets/tokenizer")
}

const TOKENIZER_FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

fn default_args(out: &Path, tok: &Path) -> SynthArgs {
    SynthArgs {
        out: out.to_path_buf(),
        tokenizer_out: tok.to_path_buf(),
        gemma4_tokenizer_out: None,
        task: "shapes".into(),
        seed: DEFAULT_SEED,
        train: DEFAULT_TRAIN,
        test: DEFAULT_TEST,
    }
}

#[test]
fn committed_files_are_reproduced_by_synth() {
    if std::env::var_os("FLOWRL_BLESS").is_some() {
        let mut log = Vec::new();
        synth(
            &default_args(&committed_data(), &committed_tokenizer()),
            &mut log,
        )
        .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, tok) = (dir.path().join("data"), dir.path().join("tok"));
    let mut log = Vec::new();
    synth(&default_args(&out, &tok), &mut log).unwrap();
    let log = String::from_utf8(log).unwrap();
    assert!(log.contains(&format!("({DEFAULT_TRAIN} rows)")), "{log}");
    for split in ["train.parquet", "test.parquet"] {
        let want = std::fs::read(committed_data().join(split))
            .unwrap_or_else(|e| panic!("datasets/shapes/{split}: {e} (run `flowrl data synth`)"));
        assert!(
            std::fs::read(out.join(split)).unwrap() == want,
            "datasets/shapes/{split} differs from what `flowrl data synth` makes"
        );
    }
    for f in TOKENIZER_FILES {
        let want = std::fs::read_to_string(committed_tokenizer().join(f))
            .unwrap_or_else(|e| panic!("assets/tokenizer/{f}: {e} (run `flowrl data synth`)"));
        assert_eq!(
            std::fs::read_to_string(tok.join(f)).unwrap(),
            want,
            "assets/tokenizer/{f}"
        );
    }
    // The committed task stays small.
    let size: u64 = ["train.parquet", "test.parquet"]
        .iter()
        .map(|f| std::fs::metadata(committed_data().join(f)).unwrap().len())
        .sum();
    assert!(size < 1_500_000, "{size} bytes");
}

/// The tool task: `datasets/shapes_zoom` is what `flowrl data synth --task zoom` makes; each
/// question's colour is the colour of the named quarter's shape, which the zoom's box frames,
/// and half the reference conversations call the tool.
#[test]
fn the_zoom_task_is_reproduced_and_its_zoom_frames_the_answer() {
    let committed = repo().join("datasets/shapes_zoom");
    let args = |out: &Path| SynthArgs {
        task: "zoom".into(),
        ..default_args(out, Path::new("unused"))
    };
    if std::env::var_os("FLOWRL_BLESS").is_some() {
        synth(&args(&committed), &mut Vec::new()).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    synth(&args(dir.path()), &mut Vec::new()).unwrap();
    for split in ["train.parquet", "test.parquet"] {
        assert!(
            std::fs::read(dir.path().join(split)).unwrap()
                == std::fs::read(committed.join(split)).unwrap(),
            "datasets/shapes_zoom/{split} differs from what `flowrl data synth --task zoom` makes"
        );
    }
    assert!(
        !dir.path().join("unused").exists(),
        "the zoom task writes no tokenizer"
    );
    let mut calls = 0;
    for i in 0..400 {
        let s = flowrl_datasets::synth::zoom_sample(DEFAULT_SEED, "train", i);
        let q = flowrl_datasets::synth::REGIONS
            .iter()
            .position(|r| s.question.contains(r))
            .expect("the question names a quarter");
        let [x1, y1, x2, y2] = flowrl_datasets::synth::region_box(q);
        let colour = flowrl_datasets::synth::COLOURS
            .iter()
            .find(|(name, _)| *name == s.answer)
            .unwrap()
            .1;
        let seen = (y1..y2)
            .flat_map(|y| (x1..x2).map(move |x| (x, y)))
            .filter(|&(x, y)| s.image.get_pixel(x, y).0 == colour)
            .count();
        assert!(
            seen >= 20,
            "sample {i}: {seen} pixels of the answer's colour in the box"
        );
        assert!(
            s.turns
                .last()
                .unwrap()
                .ends_with(&format!("\\boxed{{{}}}", s.answer))
        );
        if s.turns.len() == 2 {
            calls += 1;
            assert!(s.turns[0].contains(&format!("[{x1},{y1},{x2},{y2}]")));
        }
    }
    assert!(
        (150..250).contains(&calls),
        "{calls} of 400 reference conversations call the tool"
    );
}

#[test]
fn samples_are_reproducible_and_balanced() {
    assert_eq!(sample(9, "train", 5), sample(9, "train", 5));
    assert_ne!(sample(9, "train", 5).image, sample(10, "train", 5).image);
    assert_ne!(sample(9, "train", 5).image, sample(9, "test", 5).image);
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..3000 {
        let s = sample(1, "train", i);
        assert_eq!(s.image.dimensions(), (IMAGE_SIZE, IMAGE_SIZE));
        assert!(s.prompt.starts_with("<image>"));
        assert_eq!(s.prompt.matches("<image>").count(), 1);
        assert!(s.prompt.contains("\\boxed{}") && s.prompt.contains("<think>"));
        *answers.entry(s.answer).or_default() += 1;
    }
    // 11 answers: 4 colours, 4 counts, 3 shape kinds; each question kind ~1/3 of the rows.
    assert_eq!(answers.len(), 11, "{answers:?}");
    for (a, n) in &answers {
        let expect = if ["circle", "square", "triangle"].contains(&a.as_str()) {
            3000 / 9
        } else {
            3000 / 12
        };
        assert!(
            (*n as f64 - expect as f64).abs() < 0.3 * expect as f64,
            "{a}: {n}"
        );
    }
}

#[test]
fn the_answer_needs_the_image() {
    // The same question wording occurs with different answers, and the picture decides.
    let mut by_question: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for i in 0..400 {
        let s = sample(4, "train", i);
        by_question.entry(s.prompt).or_default().insert(s.answer);
    }
    for (q, answers) in by_question {
        assert!(answers.len() >= 3, "{q}: {answers:?}");
    }
    // Pixels: the colour answer is the colour of the non-background pixels.
    for i in 0..50 {
        let s = sample(4, "test", i);
        if !s.prompt.contains("color") {
            continue;
        }
        let want = flowrl_datasets::synth::COLOURS
            .iter()
            .find(|c| c.0 == s.answer)
            .unwrap()
            .1;
        assert!(s.image.pixels().any(|p| p.0 == want));
    }
}

/// A model directory: the tiny tokenizer + Qwen2-VL's processor settings of the fixtures.
fn qwen_model_dir(dir: &Path) -> PathBuf {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    flowrl_datasets::synth::write_tokenizer_dir(&model).unwrap();
    let fixture = repo().join("tests/fixtures/data/qwen2_vl_processor");
    std::fs::copy(
        fixture.join("preprocessor_config.json"),
        model.join("preprocessor_config.json"),
    )
    .unwrap();
    // The fixture's config.json with the special-token ids of the tiny tokenizer.
    let tok = flowrl_datasets::encoder::load_tokenizer(&model).unwrap();
    let id = |t: &str| serde_json::json!(tok.token_to_id(t).unwrap());
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap())
            .unwrap();
    config["image_token_id"] = id("<|image_pad|>");
    config["video_token_id"] = id("<|video_pad|>");
    config["vision_start_token_id"] = id("<|vision_start|>");
    config["vision_end_token_id"] = id("<|vision_end|>");
    config["text_config"]["bos_token_id"] = id("<|endoftext|>");
    config["text_config"]["eos_token_id"] = id("<|im_end|>");
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    model
}

#[test]
fn tokenizer_has_qwen_special_tokens_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let model = qwen_model_dir(dir.path());
    let enc = PromptEncoder::from_model_dir(&model).unwrap();
    let tok = &enc.tokenizer;
    // Byte-level BPE ids first (256 bytes + merges), then Qwen2-VL's special tokens in Qwen's order.
    let base = tok.get_vocab_size(false) as u32;
    assert!(base > 256 + 100 && base <= 496, "{base}");
    for (k, t) in SPECIAL_TOKENS.iter().enumerate() {
        assert_eq!(tok.token_to_id(t), Some(base + k as u32), "{t}");
    }
    assert_eq!(
        tok.get_vocab_size(true),
        base as usize + SPECIAL_TOKENS.len()
    );
    let text = "<think> I see 3 red circles. </think> \\boxed{red}";
    let ids = enc.tokenize(text).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert!(ids.len() < 20, "{}", ids.len());
}

#[test]
fn shapes_prompts_render_through_qwen2_vl_template_and_processor() {
    let dir = tempfile::tempdir().unwrap();
    let model = qwen_model_dir(dir.path());
    let enc = Arc::new(PromptEncoder::from_model_dir(&model).unwrap());
    let file = read_verl_file(
        &committed_data().join("test.parquet"),
        &ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(file.num_rows, DEFAULT_TEST);
    let row = &file.rows[0];
    assert_eq!(row.data_source, "flowrl/shapes");
    let images = flowrl_datasets::dataset::decode_row_images(row, &ReadOptions::default()).unwrap();
    let e = enc.encode(&row.messages, &images, true).unwrap();
    let question = row.messages[0].content.strip_prefix("<image>").unwrap();
    assert_eq!(
        e.text,
        format!(
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\
             <|vision_start|><|image_pad|><|vision_end|>{question}<|im_end|>\n<|im_start|>assistant\n"
        )
    );
    // 56×56 → 4×4 patches of 14 px → 2×2 merged tokens.
    assert_eq!(e.images.len(), 1);
    assert_eq!(e.images[0].grid, vec![1, 4, 4]);
    assert_eq!(e.num_image_tokens, 4);
    let pad = enc.image_token_id().unwrap();
    assert_eq!(e.input_ids.iter().filter(|&&t| t == pad).count(), 4);
    assert!(e.input_ids.len() < 64, "{} tokens", e.input_ids.len());

    let options = DatasetOptions {
        max_prompt_length: 64,
        truncation: Truncation::Error,
        filter_overlong_prompts: false,
        batch_size: 8,
        ..DatasetOptions::default()
    };
    let mut ds = PromptDataset::load(
        &[committed_data().join("test.parquet")],
        enc.clone(),
        options,
    )
    .unwrap();
    assert_eq!(ds.len(), DEFAULT_TEST);
    let b = ds.next_batch().unwrap();
    assert_eq!(b.images().len(), 8);
    assert_eq!(b.image_token_id, Some(pad));
    assert_eq!(
        Some(b.pad_token_id),
        enc.tokenizer.token_to_id("<|endoftext|>")
    );
    let padded = b.padded();
    assert_eq!(padded.batch, 8);
}
