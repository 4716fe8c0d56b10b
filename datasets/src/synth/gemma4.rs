//! The Gemma 4 flavour of the tokenizer (the tiny Gemma 4 policy, `assets/tokenizer-gemma4`):
//! the same byte-level BPE with Gemma 4's special tokens, post-processor and turn template.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use serde_json::json;
use tokenizers::Tokenizer;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::processors::template::TemplateProcessing;

use super::tokenizer::{added_tokens_decoder, task_texts, train_bpe};

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

/// Trains the Gemma 4 flavour: the same byte-level BPE as [`train_tokenizer`](super::train_tokenizer) on
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
