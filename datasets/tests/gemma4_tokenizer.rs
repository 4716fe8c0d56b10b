//! The Gemma 4 flavour of the tiny tokenizer (`assets/tokenizer-gemma4`): the committed files are
//! what `flowrl data synth --gemma4-tokenizer-out` writes, the special tokens sit at Gemma's ids,
//! and the shapes prompts render in Gemma's turn format and expand through the tiny Gemma 4
//! model's image processor (`assets/tiny-gemma4-init`).
//!
//! After an intended change, regenerate with
//! `flowrl data synth --gemma4-tokenizer-out assets/tokenizer-gemma4` (or
//! `FLOWRL_BLESS=1 cargo test --release -p flowrl-datasets --test gemma4_tokenizer`).

use std::path::PathBuf;

use flowrl_datasets::cli::{SynthArgs, synth};
use flowrl_datasets::encoder::PromptEncoder;
use flowrl_datasets::synth::{
    GEMMA4_CHAT_TEMPLATE, GEMMA4_SPECIAL_TOKENS, INSTRUCTION, sample, write_gemma4_tokenizer_dir,
};
use flowrl_datasets::verl::ChatMessage;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn committed() -> PathBuf {
    repo().join("assets/tokenizer-gemma4")
}

const FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

#[test]
fn committed_gemma4_tokenizer_is_reproduced_by_synth() {
    if std::env::var_os("FLOWRL_BLESS").is_some() {
        write_gemma4_tokenizer_dir(&committed()).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let args = SynthArgs {
        out: dir.path().join("data"),
        tokenizer_out: dir.path().join("tok"),
        gemma4_tokenizer_out: Some(dir.path().join("tok-gemma4")),
        task: "shapes".into(),
        seed: 3,
        train: 4,
        test: 2,
    };
    let mut log = Vec::new();
    synth(&args, &mut log).unwrap();
    let log = String::from_utf8(log).unwrap();
    assert!(log.contains("Gemma 4 tokenizer (401 ids)"), "{log}");
    for f in FILES {
        let want = std::fs::read_to_string(committed().join(f)).unwrap_or_else(|e| {
            panic!(
                "assets/tokenizer-gemma4/{f}: {e} (run `flowrl data synth --gemma4-tokenizer-out`)"
            )
        });
        assert_eq!(
            std::fs::read_to_string(dir.path().join("tok-gemma4").join(f)).unwrap(),
            want,
            "assets/tokenizer-gemma4/{f}"
        );
    }
    // The model directories carry the same tokenizer files.
    for model in ["assets/tiny-gemma4-init", "assets/tiny-gemma4"] {
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            assert_eq!(
                std::fs::read_to_string(repo().join(model).join(f)).unwrap(),
                std::fs::read_to_string(committed().join(f)).unwrap(),
                "{model}/{f}"
            );
        }
    }
}

#[test]
fn gemma4_special_tokens_have_gemma_ids_and_text_round_trips() {
    let enc = PromptEncoder::from_model_dir(&committed()).unwrap();
    let tok = &enc.tokenizer;
    // pad 0, eos 1, bos 2, unk 3, <|turn> 4, <turn|> 5, <|image> 6, <|image|> 7, <image|> 8.
    for (id, t) in GEMMA4_SPECIAL_TOKENS.iter().enumerate() {
        assert_eq!(tok.token_to_id(t), Some(id as u32), "{t}");
    }
    assert_eq!(tok.get_vocab_size(true), 401);
    assert_eq!(enc.bos_token_id, Some(2));
    assert_eq!(enc.pad_token_id, Some(0));
    let text = "<think> I see 3 red circles. </think> \\boxed{red}";
    let ids = enc.tokenize(text).unwrap();
    assert!(ids.len() < 20 && ids.iter().all(|&i| i >= 9), "{ids:?}");
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    // Gemma's post-processor: adding special tokens prepends exactly one <bos>.
    let with_bos = tok.encode(text, true).unwrap().get_ids().to_vec();
    assert_eq!(with_bos[0], 2);
    assert_eq!(&with_bos[1..], &ids[..]);
}

#[test]
fn gemma4_template_is_the_fixture_model_directory_template() {
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            repo().join("tests/fixtures/data/gemma4_chat/tokenizer_config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        fixture["chat_template"].as_str().unwrap(),
        GEMMA4_CHAT_TEMPLATE
    );
}

#[test]
fn shapes_prompt_renders_in_gemma_turn_format_and_expands_64_soft_tokens() {
    let enc = PromptEncoder::from_model_dir(&repo().join("assets/tiny-gemma4-init")).unwrap();
    let s = sample(7, "test", 0);
    let messages = vec![ChatMessage {
        role: "user".into(),
        content: s.prompt.clone(),
    }];
    let question = s.question.strip_prefix("<image>").unwrap();
    let out = enc
        .encode(&messages, std::slice::from_ref(&s.image), true)
        .unwrap();
    assert_eq!(
        out.text,
        format!("<bos><|turn>user\n<|image|>{question} {INSTRUCTION}<turn|>\n<|turn>model\n")
    );
    // A 56×56 picture: resized to 128×128 (the soft-token budget 70 with 8-px patches pooled
    // 2×2), 16×16 patches → 64 soft tokens between <|image> and <image|>.
    assert_eq!(out.num_image_tokens, 64);
    assert_eq!(out.images.len(), 1);
    let ids = &out.input_ids;
    assert_eq!(&ids[..2], &[2, 4], "<bos><|turn>");
    assert_eq!(ids.iter().filter(|&&t| t == 2).count(), 1, "one <bos>");
    let boi = ids.iter().position(|&t| t == 6).unwrap();
    assert!(ids[boi + 1..boi + 65].iter().all(|&t| t == 7));
    assert_eq!(ids[boi + 65], 8);
    assert_eq!(ids.iter().filter(|&&t| t == 7).count(), 64);
    // The generation prompt ends the sequence: <turn|> "\n" <|turn> "model\n".
    let tail = enc.tokenize("<turn|>\n<|turn>model\n").unwrap();
    assert!(ids.ends_with(&tail), "{ids:?} vs {tail:?}");
    assert_eq!(enc.image_token_id(), Some(7));
}
