//! The tokenizer of the tiny default models: a byte-level BPE trained on the task's text with
//! Qwen2-VL's special tokens and chat template, and the training and config-writing pieces the
//! Gemma 4 flavour shares.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use serde_json::json;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use super::task::{COLOURS, COUNTS, INSTRUCTION, QUESTIONS, SHAPES};

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
pub(super) fn task_texts() -> Vec<String> {
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
pub(super) fn train_bpe(
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
pub(super) fn added_tokens_decoder(
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
