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

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use arrow_array::builder::{
    BinaryBuilder, Int64Builder, ListBuilder, StringBuilder, StructBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Fields, Schema};
use image::{Rgb, RgbImage};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde_json::json;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use crate::rng::SplitMix64;

/// Seed of the committed `datasets/shapes` files.
pub const DEFAULT_SEED: u64 = 7;
/// Rows of the committed train split.
pub const DEFAULT_TRAIN: usize = 2000;
/// Rows of the committed test split.
pub const DEFAULT_TEST: usize = 200;

/// `data_source` of the task (selects the boxed-answer reward).
pub const DATA_SOURCE: &str = "flowrl/shapes";
/// Picture side in pixels.
pub const IMAGE_SIZE: u32 = 56;
/// The instruction appended to every question (geo3k's, shortened).
pub const INSTRUCTION: &str =
    "Think inside <think> </think> tags, then put the final answer in \\boxed{}.";

/// Colour names and their RGB values.
pub const COLOURS: [(&str, [u8; 3]); 4] = [
    ("red", [220, 40, 40]),
    ("green", [40, 170, 60]),
    ("blue", [40, 80, 220]),
    ("yellow", [230, 200, 30]),
];
/// Shape kinds.
pub const SHAPES: [&str; 3] = ["circle", "square", "triangle"];
/// Count answers.
pub const COUNTS: [&str; 4] = ["1", "2", "3", "4"];

/// The three question kinds and their wordings (one is drawn per sample).
const QUESTIONS: [(QuestionKind, &[&str]); 3] = [
    (
        QuestionKind::Colour,
        &[
            "What color are the shapes?",
            "Which color do the shapes have?",
        ],
    ),
    (
        QuestionKind::Count,
        &["How many shapes are there?", "Count the shapes."],
    ),
    (
        QuestionKind::Shape,
        &["What shape is shown?", "Which shape do you see?"],
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuestionKind {
    Colour,
    Count,
    Shape,
}

/// One generated sample.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeSample {
    pub image: RgbImage,
    /// The question with its `<image>` placeholder (extra_info.question).
    pub question: String,
    /// The whole user message (question + instruction).
    pub prompt: String,
    pub answer: String,
    /// The task's `data_source`.
    pub data_source: &'static str,
    /// Reference assistant turns (`extra_info.turns`, written when some sample has them): what
    /// a warm start on tool use imitates. Empty for the shapes task.
    pub turns: Vec<String>,
}

/// Draws sample `index` of a split (`split` enters the seed, so train and test differ).
pub fn sample(seed: u64, split: &str, index: u64) -> ShapeSample {
    let split_salt = split.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    });
    let mut rng = SplitMix64(seed ^ split_salt ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let (colour_name, colour) = COLOURS[rng.below(4) as usize];
    let shape = SHAPES[rng.below(3) as usize];
    let count = rng.range(1, 4) as usize;
    let (kind, wordings) = QUESTIONS[rng.below(3) as usize];
    let wording = wordings[rng.below(wordings.len() as u64) as usize];

    let mut image = RgbImage::from_pixel(IMAGE_SIZE, IMAGE_SIZE, Rgb(light_tint(&mut rng)));
    // `count` distinct quadrants, each shape centred in its quadrant with a small jitter.
    let quadrants = shuffled4(&mut rng);
    let half = IMAGE_SIZE / 2;
    for &q in &quadrants[..count] {
        let r = rng.range(8, 11) as i32; // half-size of the shape
        let cx = (q as u32 % 2 * half + half / 2) as i32 + rng.range(0, 4) as i32 - 2;
        let cy = (q as u32 / 2 * half + half / 2) as i32 + rng.range(0, 4) as i32 - 2;
        draw_shape(&mut image, shape, cx, cy, r, colour);
    }
    let answer = match kind {
        QuestionKind::Colour => colour_name.to_string(),
        QuestionKind::Count => count.to_string(),
        QuestionKind::Shape => shape.to_string(),
    };
    let question = format!("<image>{wording}");
    ShapeSample {
        prompt: format!("{question} {INSTRUCTION}"),
        question,
        image,
        answer,
        data_source: DATA_SOURCE,
        turns: Vec::new(),
    }
}

/// A light background tint: R, G, B each in 225..=255, drawn in that order.
fn light_tint(rng: &mut SplitMix64) -> [u8; 3] {
    [
        rng.range(225, 255) as u8,
        rng.range(225, 255) as u8,
        rng.range(225, 255) as u8,
    ]
}

/// 0, 1, 2, 3 in a random order (Fisher–Yates from the end).
fn shuffled4(rng: &mut SplitMix64) -> [usize; 4] {
    let mut v = [0usize, 1, 2, 3];
    for i in (1..4).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

/// Fills a circle (radius r), square (side 2r) or upward triangle (height 2r) centred at (cx, cy).
fn draw_shape(img: &mut RgbImage, shape: &str, cx: i32, cy: i32, r: i32, colour: [u8; 3]) {
    for y in cy - r..=cy + r {
        for x in cx - r..=cx + r {
            if x < 0 || y < 0 || x >= img.width() as i32 || y >= img.height() as i32 {
                continue;
            }
            let (dx, dy) = (x - cx, y - cy);
            let inside = match shape {
                "circle" => dx * dx + dy * dy <= r * r,
                "square" => true,
                // Apex at (cx, cy − r), base from (cx − r, cy + r) to (cx + r, cy + r).
                _ => 2 * dx.abs() <= dy + r,
            };
            if inside {
                img.put_pixel(x as u32, y as u32, Rgb(colour));
            }
        }
    }
}

fn png_bytes(img: &RgbImage) -> Result<Vec<u8>> {
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)?;
    Ok(out.into_inner())
}

/// The Arrow schema verl's geo3k preprocessing writes (column order included).
pub fn verl_schema() -> Schema {
    schema_with_turns(false)
}

/// [`verl_schema`], with `extra_info.turns` (a list of strings) when `turns`.
fn schema_with_turns(turns: bool) -> Schema {
    let string = |n: &str| Field::new(n, DataType::Utf8, true);
    let image_item = Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        string("path"),
    ]);
    let message = Fields::from(vec![string("role"), string("content")]);
    Schema::new(vec![
        Field::new(
            "images",
            DataType::List(Arc::new(Field::new(
                "element",
                DataType::Struct(image_item),
                true,
            ))),
            true,
        ),
        string("data_source"),
        Field::new(
            "prompt",
            DataType::List(Arc::new(Field::new(
                "element",
                DataType::Struct(message),
                true,
            ))),
            true,
        ),
        string("ability"),
        Field::new(
            "reward_model",
            DataType::Struct(Fields::from(vec![string("style"), string("ground_truth")])),
            true,
        ),
        Field::new(
            "extra_info",
            DataType::Struct(Fields::from(
                [
                    string("split"),
                    Field::new("index", DataType::Int64, true),
                    string("answer"),
                    string("question"),
                ]
                .into_iter()
                .chain(turns.then(|| {
                    Field::new(
                        "turns",
                        DataType::List(Arc::new(Field::new("element", DataType::Utf8, true))),
                        true,
                    )
                }))
                .collect::<Vec<_>>(),
            )),
            true,
        ),
    ])
}

/// Writes samples as a verl parquet file (Snappy, one row group); `extra_info.turns` when some
/// sample has reference turns.
pub fn write_split(path: &Path, split: &str, samples: &[ShapeSample]) -> Result<()> {
    let with_turns = samples.iter().any(|s| !s.turns.is_empty());
    let schema = Arc::new(schema_with_turns(with_turns));
    let field_of = |name: &str| -> Fields {
        match schema.field_with_name(name).unwrap().data_type() {
            DataType::List(f) => match f.data_type() {
                DataType::Struct(fs) => fs.clone(),
                _ => unreachable!(),
            },
            DataType::Struct(fs) => fs.clone(),
            _ => unreachable!(),
        }
    };
    let item_field = |name: &str| -> Arc<Field> {
        match schema.field_with_name(name).unwrap().data_type() {
            DataType::List(f) => f.clone(),
            _ => unreachable!(),
        }
    };
    let mut images = ListBuilder::new(StructBuilder::from_fields(field_of("images"), 0))
        .with_field(item_field("images"));
    let mut prompt = ListBuilder::new(StructBuilder::from_fields(field_of("prompt"), 0))
        .with_field(item_field("prompt"));
    let mut data_source = StringBuilder::new();
    let mut ability = StringBuilder::new();
    let mut reward = StructBuilder::from_fields(field_of("reward_model"), 0);
    let mut extra = StructBuilder::from_fields(field_of("extra_info"), 0);
    for (i, s) in samples.iter().enumerate() {
        let item = images.values();
        item.field_builder::<BinaryBuilder>(0)
            .unwrap()
            .append_value(png_bytes(&s.image)?);
        item.field_builder::<StringBuilder>(1)
            .unwrap()
            .append_null();
        item.append(true);
        images.append(true);

        let msg = prompt.values();
        msg.field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value("user");
        msg.field_builder::<StringBuilder>(1)
            .unwrap()
            .append_value(&s.prompt);
        msg.append(true);
        prompt.append(true);

        data_source.append_value(s.data_source);
        ability.append_value("vision");
        reward
            .field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value("rule");
        reward
            .field_builder::<StringBuilder>(1)
            .unwrap()
            .append_value(&s.answer);
        reward.append(true);
        extra
            .field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value(split);
        extra
            .field_builder::<Int64Builder>(1)
            .unwrap()
            .append_value(i as i64);
        extra
            .field_builder::<StringBuilder>(2)
            .unwrap()
            .append_value(&s.answer);
        extra
            .field_builder::<StringBuilder>(3)
            .unwrap()
            .append_value(&s.question);
        if with_turns {
            let turns = extra
                .field_builder::<ListBuilder<Box<dyn arrow_array::builder::ArrayBuilder>>>(4)
                .unwrap();
            for t in &s.turns {
                turns
                    .values()
                    .as_any_mut()
                    .downcast_mut::<StringBuilder>()
                    .unwrap()
                    .append_value(t);
            }
            turns.append(true);
        }
        extra.append(true);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(images.finish()),
        Arc::new(data_source.finish()),
        Arc::new(prompt.finish()),
        Arc::new(ability.finish()),
        Arc::new(reward.finish()),
        Arc::new(extra.finish()),
    ];
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_created_by("flowrl data synth".into())
        .build();
    let mut writer = ArrowWriter::try_new(file, schema, Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}

// -------------------------------------------------------------------------------------------
// Tokenizer of the tiny default models
// -------------------------------------------------------------------------------------------

/// Qwen2-VL's special tokens, in Qwen's order; they get the ids right after the BPE vocabulary.
pub const SPECIAL_TOKENS: [&str; 14] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
];

/// Upper bound of the byte-level BPE vocabulary (256 bytes + merges). The task's text runs out of
/// merges earlier (408 ids); the 14 special tokens follow the BPE ids (408..=421), so a tiny
/// model's `vocab_size` of 512 covers the tokenizer with room to spare.
pub const BPE_VOCAB_SIZE: usize = 496;

/// Qwen2-VL's chat template (from `Qwen/Qwen2-VL-2B-Instruct`'s `chat_template.json`).
pub const QWEN2_VL_CHAT_TEMPLATE: &str = "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The text the tokenizer is trained on: every question wording, the instruction, the system
/// prompt, the role names, and responses of the expected form for every answer.
pub fn tokenizer_corpus() -> Vec<String> {
    let mut texts = vec![
        "system\nYou are a helpful assistant.".to_string(),
        "user\n".to_string(),
        "assistant\n".to_string(),
    ];
    texts.extend(task_texts());
    texts
}

/// The task's own text (chat-format independent): the instruction, every question wording, and
/// responses of the expected form for every answer.
fn task_texts() -> Vec<String> {
    let mut texts = vec![INSTRUCTION.to_string()];
    let mut answers: Vec<String> = Vec::new();
    answers.extend(COLOURS.iter().map(|c| c.0.to_string()));
    answers.extend(COUNTS.iter().map(|c| c.to_string()));
    answers.extend(SHAPES.iter().map(|c| c.to_string()));
    for (_, wordings) in QUESTIONS {
        for w in wordings {
            texts.push(format!("{w} {INSTRUCTION}"));
        }
    }
    for (colour, _) in COLOURS {
        for shape in SHAPES {
            for count in COUNTS {
                let plural = if count == "1" { "" } else { "s" };
                texts.push(format!(
                    "<think> I see {count} {colour} {shape}{plural}. </think> \\boxed{{{colour}}}"
                ));
                texts.push(format!(
                    "<think> There are {count} shapes, each a {colour} {shape}. </think> \\boxed{{{count}}}"
                ));
                texts.push(format!(
                    "<think> The shape is a {shape}. </think> \\boxed{{{shape}}}"
                ));
            }
        }
    }
    for a in answers {
        texts.push(format!("The answer is {a}. \\boxed{{{a}}}"));
    }
    texts
}

/// Trains the byte-level BPE tokenizer of the tiny default models on [`tokenizer_corpus`] and
/// appends Qwen2-VL's special tokens.
pub fn train_tokenizer() -> Result<Tokenizer> {
    train_bpe(&tokenizer_corpus(), &[], &SPECIAL_TOKENS, None)
}

/// Byte-level BPE (no prefix space, no normaliser) trained on `corpus`. `leading` specials take
/// the first ids (before the 256 byte tokens, as in Gemma's vocabulary); `trailing` specials get
/// the ids after the merges (as in Qwen's). Both are registered as special added tokens.
fn train_bpe(
    corpus: &[String],
    leading: &[&str],
    trailing: &[&str],
    post_processor: Option<PostProcessorWrapper>,
) -> Result<Tokenizer> {
    let specials = |tokens: &[&str]| -> Vec<AddedToken> {
        tokens.iter().map(|t| AddedToken::from(*t, true)).collect()
    };
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(BPE_VOCAB_SIZE)
        .min_frequency(0)
        .special_tokens(specials(leading))
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut builder = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        ByteLevel,
        PostProcessorWrapper,
        ByteLevel,
    >::new()
    .with_model(BPE::default())
    .with_normalizer(None)
    .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
    .with_post_processor(None)
    .with_decoder(Some(ByteLevel::default()))
    .build()
    .map_err(|e| anyhow!("building the tokenizer: {e}"))?;
    builder
        .train(&mut trainer, corpus.iter())
        .map_err(|e| anyhow!("training the tokenizer: {e}"))?;
    let mut tokenizer: Tokenizer = builder.into();
    tokenizer.add_special_tokens(&specials(leading));
    tokenizer.add_special_tokens(&specials(trailing));
    if let Some(p) = post_processor {
        tokenizer.with_post_processor(Some(p));
    }
    Ok(tokenizer)
}

/// The `added_tokens_decoder` table of a `tokenizer_config.json` for `tokens`.
fn added_tokens_decoder(
    tokenizer: &Tokenizer,
    tokens: &[&str],
) -> serde_json::Map<String, serde_json::Value> {
    let mut added = serde_json::Map::new();
    for t in tokens {
        let id = tokenizer
            .token_to_id(t)
            .expect("a special token of this tokenizer");
        added.insert(
            id.to_string(),
            json!({"content": t, "lstrip": false, "normalized": false, "rstrip": false,
                   "single_word": false, "special": true}),
        );
    }
    added
}

/// Writes `tokenizer.json`, `tokenizer_config.json` (Qwen2-VL chat template, eos `<|im_end|>`,
/// pad `<|endoftext|>`, no BOS) and `special_tokens_map.json` into `dir`.
pub fn write_tokenizer_dir(dir: &Path) -> Result<Tokenizer> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tokenizer = train_tokenizer()?;
    tokenizer
        .save(dir.join("tokenizer.json"), true)
        .map_err(|e| anyhow!("writing tokenizer.json: {e}"))?;
    let added = added_tokens_decoder(&tokenizer, &SPECIAL_TOKENS);
    let config = json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": added,
        "bos_token": null,
        "chat_template": QWEN2_VL_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": false,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": null
    });
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&config)? + "\n",
    )?;
    let map = json!({
        "additional_special_tokens": SPECIAL_TOKENS[1..].to_vec(),
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>"
    });
    std::fs::write(
        dir.join("special_tokens_map.json"),
        serde_json::to_string_pretty(&map)? + "\n",
    )?;
    Ok(tokenizer)
}

// -------------------------------------------------------------------------------------------
// Gemma 4 flavour of the tokenizer (the tiny Gemma 4 policy, assets/tokenizer-gemma4)
// -------------------------------------------------------------------------------------------

/// Gemma 4's special tokens, at the ids they have in Gemma's own vocabulary order: `<pad>` = 0,
/// `<eos>` = 1, `<bos>` = 2, `<unk>` = 3, then the turn delimiters and the image strings
/// (begin-image, soft token, end-image). The byte-level BPE ids follow them.
pub const GEMMA4_SPECIAL_TOKENS: [&str; 9] = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<|turn>",
    "<turn|>",
    "<|image>",
    "<|image|>",
    "<image|>",
];

/// Gemma 4's chat turn format with Gemma 3's published template structure (the template writes
/// `<bos>`, system text is prefixed to the first user turn, `assistant` is renamed `model`, every
/// text is trimmed, each image item becomes `<|image|>`):
/// `<bos><|turn>user\n<|image|>{text}<turn|>\n<|turn>model\n`. The same template as the
/// `tests/fixtures/data/gemma4_chat` model directory, which renders the fixtures' one-image prompt.
pub const GEMMA4_CHAT_TEMPLATE: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<|turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<|image|>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<turn|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<|turn>model\n' }}
{%- endif -%}
"#;

/// The Gemma 4 flavour's training text: the two role names of the turn format and the task text.
pub fn gemma4_tokenizer_corpus() -> Vec<String> {
    let mut texts = vec!["user\n".to_string(), "model\n".to_string()];
    texts.extend(task_texts());
    texts
}

/// Trains the Gemma 4 flavour: the same byte-level BPE as [`train_tokenizer`] on
/// [`gemma4_tokenizer_corpus`], with [`GEMMA4_SPECIAL_TOKENS`] at ids 0..9 and Gemma's
/// post-processor (`<bos> $A`, `<bos> $A <bos> $B`) for callers that add special tokens (the
/// prompt encoder does not: the template writes `<bos>`).
pub fn train_gemma4_tokenizer() -> Result<Tokenizer> {
    let bos = GEMMA4_SPECIAL_TOKENS[2];
    let post = TemplateProcessing::builder()
        .try_single(format!("{bos} $A"))
        .and_then(|b| b.try_pair(format!("{bos} $A {bos} $B")))
        .map_err(|e| anyhow!("post-processor template: {e}"))?
        // `<bos>` is the third leading special token, so its id is 2.
        .special_tokens(vec![(bos, 2)])
        .build()
        .map_err(|e| anyhow!("building the post-processor: {e}"))?;
    train_bpe(
        &gemma4_tokenizer_corpus(),
        &GEMMA4_SPECIAL_TOKENS,
        &[],
        Some(PostProcessorWrapper::Template(post)),
    )
}

/// Writes the Gemma 4 flavour into `dir`: `tokenizer.json`, `tokenizer_config.json`
/// ([`GEMMA4_CHAT_TEMPLATE`], bos `<bos>`, eos `<eos>`, pad `<pad>`, unk `<unk>`,
/// `add_bos_token: true` as Gemma's configs have it) and `special_tokens_map.json`.
pub fn write_gemma4_tokenizer_dir(dir: &Path) -> Result<Tokenizer> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tokenizer = train_gemma4_tokenizer()?;
    tokenizer
        .save(dir.join("tokenizer.json"), true)
        .map_err(|e| anyhow!("writing tokenizer.json: {e}"))?;
    let config = json!({
        "add_bos_token": true,
        "add_eos_token": false,
        "added_tokens_decoder": added_tokens_decoder(&tokenizer, &GEMMA4_SPECIAL_TOKENS),
        "bos_token": "<bos>",
        "chat_template": GEMMA4_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<eos>",
        "model_max_length": 4096,
        "pad_token": "<pad>",
        "padding_side": "left",
        "tokenizer_class": "GemmaTokenizer",
        "unk_token": "<unk>"
    });
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&config)? + "\n",
    )?;
    let map = json!({
        "additional_special_tokens": GEMMA4_SPECIAL_TOKENS[4..].to_vec(),
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>"
    });
    std::fs::write(
        dir.join("special_tokens_map.json"),
        serde_json::to_string_pretty(&map)? + "\n",
    )?;
    Ok(tokenizer)
}

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

// -------------------------------------------------------------------------------------------
// The tool task "zoom"
// -------------------------------------------------------------------------------------------

/// Picture side of the tool task: the tiny models' processors shrink it 3.5–4× (to 128 or 112
/// pixels a side), so its small shapes become specks of one or two pixels.
pub const ZOOM_IMAGE_SIZE: u32 = 448;
/// `data_source` of the tool task.
pub const ZOOM_DATA_SOURCE: &str = "flowrl/shapes_zoom";
/// Side of the tile at each quarter's centre that holds the quarter's shape: the shapes task's
/// picture ([`IMAGE_SIZE`]) at half scale, so `zoom_in` (which doubles it) shows a picture laid
/// out as the shapes task's are.
pub const ZOOM_REGION: u32 = IMAGE_SIZE / 2;
/// The quadrants as the questions name them, in reading order.
pub const REGIONS: [&str; 4] = ["top left", "top right", "bottom left", "bottom right"];
/// The tool task's hint, before the shapes task's instruction (the tiny tokenizer spells
/// unfamiliar words byte by byte: the shorter the better).
pub const ZOOM_INSTRUCTION: &str = "Zoom in if needed.";

/// The pixel box of quadrant `q`'s tile (reading order), which a zoom looks at.
pub fn region_box(q: usize) -> [u32; 4] {
    let quarter = ZOOM_IMAGE_SIZE / 4;
    let cx = quarter * (1 + 2 * (q as u32 % 2));
    let cy = quarter * (1 + 2 * (q as u32 / 2));
    let h = ZOOM_REGION / 2;
    [cx - h, cy - h, cx + h, cy + h]
}

/// The assistant turn that calls `zoom_in` on quadrant `q`, in Qwen's tool-call syntax, the
/// JSON written compactly (the tiny tokenizer spells it byte by byte).
pub fn zoom_call(q: usize) -> String {
    let [x1, y1, x2, y2] = region_box(q);
    format!(
        "<think> </think> <tool_call>{{\"name\":\"zoom_in\",\"arguments\":{{\"bbox_2d\":[{x1},{y1},{x2},{y2}]}}}}</tool_call>"
    )
}

/// Draws sample `index` of the tool task: a 448×448 picture with a [`ZOOM_REGION`]-pixel tile
/// at each quarter's centre, each tile holding one small shape (radius 4–5 pixels) in one of its
/// own four quarters, as the shapes task draws a one-shape picture at half scale; the four
/// shapes have the four colours. The question asks for the colour of the shape in one named
/// quarter. Its reference turns (`extra_info.turns`, for a warm start) answer directly for half
/// the samples and call `zoom_in` on the named quarter's tile first for the other half.
pub fn zoom_sample(seed: u64, split: &str, index: u64) -> ShapeSample {
    let split_salt = split.bytes().fold(0x84AA_61C3_9E37_79B9u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    });
    let mut rng = SplitMix64(seed ^ split_salt ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut image =
        RgbImage::from_pixel(ZOOM_IMAGE_SIZE, ZOOM_IMAGE_SIZE, Rgb(light_tint(&mut rng)));
    let colours = shuffled4(&mut rng);
    for (q, &c) in colours.iter().enumerate() {
        let [x1, y1, ..] = region_box(q);
        let shape = SHAPES[rng.below(3) as usize];
        let r = rng.range(4, 5) as i32;
        let (sub, half) = (rng.below(4) as u32, ZOOM_REGION / 2);
        let cx = (x1 + sub % 2 * half + half / 2) as i32 + rng.range(0, 2) as i32 - 1;
        let cy = (y1 + sub / 2 * half + half / 2) as i32 + rng.range(0, 2) as i32 - 1;
        draw_shape(&mut image, shape, cx, cy, r, COLOURS[c].1);
    }
    let asked = rng.below(4) as usize;
    let answer = COLOURS[colours[asked]].0.to_string();
    let question = format!(
        "<image>What color is the shape in the {} quarter?",
        REGIONS[asked]
    );
    let answer_turn = format!("<think> </think> \\boxed{{{answer}}}");
    let turns = if rng.below(2) == 0 {
        vec![answer_turn]
    } else {
        vec![zoom_call(asked), answer_turn]
    };
    ShapeSample {
        prompt: format!("{question} {ZOOM_INSTRUCTION} {INSTRUCTION}"),
        question,
        image,
        answer,
        data_source: ZOOM_DATA_SOURCE,
        turns,
    }
}
