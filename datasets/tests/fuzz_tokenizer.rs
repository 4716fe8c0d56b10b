//! Property tests of a model directory's text-side files: `tokenizer.json`,
//! `tokenizer_config.json` (special tokens, `chat_template`) and `chat_template.jinja`.
//!
//! The property, for every input: [`PromptEncoder::from_model_dir`] and encoding a prompt with
//! it return `Ok` or an error with a non-empty message — never a panic, never an abort, and
//! memory bounded (this binary's allocator refuses any single allocation over 2 GiB, which
//! aborts), including templates that multiply strings, loop over huge ranges or recurse.
//!
//! Inputs are structured mutations of the tiny Qwen2-VL model's files (`assets/tiny-qwen2-vl`):
//! any JSON value of tokenizer.json / tokenizer_config.json replaced (edge numbers, null, wrong
//! types, strings), keys deleted; the chat template with Jinja snippets inserted at any point.
//!
//! Cases (fixed seed, no persistence file): 128 tokenizer.json mutations, 128
//! tokenizer_config.json mutations, 256 template mutations; about ten seconds on one core.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};

use flowrl_datasets::encoder::PromptEncoder;
use flowrl_datasets::verl::ChatMessage;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Value, json};

/// The system allocator, refusing (null → abort) any single allocation over 2 GiB.
struct Capped;
const CAP: usize = 2 << 30;
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(p, l, new) }
    }
}
#[global_allocator]
static ALLOC: Capped = Capped;

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x5eed_0020),
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    }
}

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/tiny-qwen2-vl")
}

fn read_json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(tiny().join(name)).unwrap()).unwrap()
}

/// A copy of the tiny model directory (files linked) with `files` written over.
fn dir_with(files: &[(&str, String)]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(tiny()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        let to = tmp.path().join(&name);
        match files.iter().find(|(n, _)| *n == name) {
            Some((_, text)) => std::fs::write(&to, text).unwrap(),
            None => std::os::unix::fs::symlink(&p, &to).unwrap(),
        }
    }
    for (n, text) in files {
        let to = tmp.path().join(n);
        if !to.exists() {
            std::fs::write(to, text).unwrap();
        }
    }
    tmp
}

/// Load and encode a text prompt and an image prompt: Ok or an error with a message.
fn check(dir: &Path) -> Result<(), TestCaseError> {
    let enc = match PromptEncoder::from_model_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            prop_assert!(
                !format!("{e:#}").trim().is_empty(),
                "an error without a message"
            );
            return Ok(());
        }
    };
    let picture = image::RgbImage::from_pixel(56, 56, image::Rgb([10, 200, 30]));
    let text = [ChatMessage {
        role: "user".into(),
        content: "What shape? é🦀".into(),
    }];
    let with_image = [ChatMessage {
        role: "user".into(),
        content: "<image>What shape?".into(),
    }];
    for (messages, images) in [(&text[..], &[][..]), (&with_image[..], &[picture][..])] {
        if let Err(e) = enc.encode(messages, images, !images.is_empty()) {
            prop_assert!(
                !format!("{e:#}").trim().is_empty(),
                "an error without a message"
            );
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, Value),
    Delete(usize),
}

fn edge_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(u64::MAX)),
        Just(json!(1u64 << 32)),
        Just(json!(1e300)),
        Just(Value::Null),
        Just(json!(true)),
        Just(json!("")),
        Just(json!("<|image_pad|>")),
        Just(json!("[UNK]")),
        Just(json!([])),
        Just(json!({})),
        Just(json!([["a", "b"]])),
        Just(json!(["a b", "c"])),
        (0u64..1000).prop_map(|n| json!(n)),
        "\\PC{0,8}".prop_map(|s| json!(s)),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), edge_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        1 => any::<usize>().prop_map(Mutation::Delete),
    ]
}

fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                pointers(
                    x,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                pointers(x, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

fn mutate(v: &mut Value, m: &Mutation) {
    let mut ps = Vec::new();
    pointers(v, String::new(), &mut ps);
    match m {
        Mutation::Replace(i, x) => {
            let p = ps[i % ps.len()].clone();
            *v.pointer_mut(&p).unwrap() = x.clone();
        }
        Mutation::Delete(i) => {
            let p = ps[i % ps.len()].clone();
            let Some(cut) = p.rfind('/') else { return };
            let last = p[cut + 1..].replace("~1", "/").replace("~0", "~");
            match v.pointer_mut(&p[..cut]).unwrap() {
                Value::Object(o) => {
                    o.remove(&last);
                }
                Value::Array(a) => {
                    a.remove(last.parse::<usize>().unwrap());
                }
                _ => {}
            }
        }
    }
}

/// Jinja snippets: valid, invalid, and ones that would run or allocate without bound.
fn snippet() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "{{",
        "{%",
        "}}",
        "{% endfor %}",
        "{% if %}",
        "{{ messages[99].content }}",
        "{{ messages[0].content[5:2] }}",
        "{{ 1 / 0 }}",
        "{{ 1 // 0 }}",
        "{{ 'a' * 100000000000 }}",
        "{{ 'ab' * -3 }}",
        "{{ [1] * 100000000000 }}",
        "{% for i in range(100000000000) %}x{% endfor %}",
        "{% for i in range(2000) %}{% for j in range(2000) %}{% for k in range(2000) %}x{% endfor %}{% endfor %}{% endfor %}",
        "{% macro m(n) %}{{ m(n) }}{% endmacro %}{{ m(1) }}",
        "{{ raise_exception('bad') }}",
        "{{ messages | tojson }}",
        "{{ messages[0].content | tojson(indent=100000000000) }}",
        "{{ 'x'.center(100000000000) }}",
        "{{ 'x' | indent(100000000000) }}",
        "{{ 'x'.ljust(100000000000) }}",
        "{{ '%s' % messages }}",
        "{{ 9223372036854775807 + 1 }}",
        "{{ 2 ** 100000 }}",
        "{{ range(5) | join(', ') }}",
        "{{ messages | length }}",
        "{{ strftime_now('%Y') }}",
        "<|image_pad|>",
        "<|vision_start|><|image_pad|><|vision_end|>",
        "\u{0}",
    ])
    .prop_map(str::to_string)
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn mutated_tokenizer_json_loads_or_errs(muts in prop::collection::vec(mutation(), 1..4)) {
        let mut v = read_json("tokenizer.json");
        for m in &muts {
            mutate(&mut v, m);
        }
        let tmp = dir_with(&[("tokenizer.json", v.to_string())]);
        check(tmp.path())?;
    }

    #[test]
    fn mutated_tokenizer_config_loads_or_errs(muts in prop::collection::vec(mutation(), 1..4)) {
        let mut v = read_json("tokenizer_config.json");
        for m in &muts {
            mutate(&mut v, m);
        }
        let tmp = dir_with(&[("tokenizer_config.json", v.to_string())]);
        check(tmp.path())?;
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn mutated_chat_templates_render_or_err(
        inserts in prop::collection::vec((any::<usize>(), snippet()), 1..3),
        cut in prop::option::weighted(0.2, any::<usize>()),
    ) {
        let v = read_json("tokenizer_config.json");
        let mut t = v["chat_template"].as_str().unwrap().to_string();
        for (at, s) in &inserts {
            let mut at = at % (t.len() + 1);
            while !t.is_char_boundary(at) {
                at -= 1;
            }
            t.insert_str(at, s);
        }
        if let Some(c) = cut {
            let mut c = c % (t.len() + 1);
            while !t.is_char_boundary(c) {
                c -= 1;
            }
            t.truncate(c);
        }
        let tmp = dir_with(&[("chat_template.jinja", t)]);
        check(tmp.path())?;
    }
}

/// Each runaway snippet on its own, appended to the real template: an error (or a bounded
/// render), never an abort or an endless render.
#[test]
fn runaway_templates_are_bounded() {
    let v = read_json("tokenizer_config.json");
    let base = v["chat_template"].as_str().unwrap().to_string();
    for s in [
        "{{ 'a' * 100000000000 }}",
        "{{ [1] * 100000000000 }}",
        "{% for i in range(100000000000) %}x{% endfor %}",
        "{% macro m(n) %}{{ m(n) }}{% endmacro %}{{ m(1) }}",
        "{{ 'x'.center(100000000000) }}",
        "{{ 'x'.ljust(100000000000) }}",
        "{{ 2 ** 100000 }}",
        "{{ 'x' | indent(100000000000) }}",
    ] {
        let started = std::time::Instant::now();
        let tmp = dir_with(&[("chat_template.jinja", format!("{base}{s}"))]);
        check(tmp.path()).unwrap();
        assert!(
            started.elapsed().as_secs() < 20,
            "{s} took {:?}",
            started.elapsed()
        );
    }
}

/// Regression: `tojson(indent=100000000000)` in a chat template (the fuzzer's find) allocated
/// the indentation (abort); now a render error naming the filter.
#[test]
fn regression_tojson_with_a_huge_indent_is_an_error() {
    let v = read_json("tokenizer_config.json");
    let base = v["chat_template"].as_str().unwrap().to_string();
    let t = format!("{base}{{{{ messages | tojson(indent=100000000000) }}}}");
    let tmp = dir_with(&[("chat_template.jinja", t)]);
    let enc = PromptEncoder::from_model_dir(tmp.path()).unwrap();
    let m = [ChatMessage {
        role: "user".into(),
        content: "hi".into(),
    }];
    let e = enc.encode::<image::RgbImage>(&m, &[], false).unwrap_err();
    assert!(
        format!("{e:#}").contains("tojson: indent 100000000000 is too large"),
        "{e:#}"
    );
}

/// Regression: minijinja's `indent(100000000000)` (the fuzzer's second find) allocated the
/// indentation, and `range(10^11)` ran for hours; both now run out of the render's fuel
/// (template.rs) and fail with a message.
#[test]
fn regression_indent_and_huge_loops_run_out_of_fuel() {
    let v = read_json("tokenizer_config.json");
    let base = v["chat_template"].as_str().unwrap().to_string();
    for s in [
        "{{ 'x' | indent(100000000000) }}",
        "{% for i in range(100000000000) %}x{% endfor %}",
    ] {
        let tmp = dir_with(&[("chat_template.jinja", format!("{base}{s}"))]);
        let enc = PromptEncoder::from_model_dir(tmp.path()).unwrap();
        let m = [ChatMessage {
            role: "user".into(),
            content: "hi".into(),
        }];
        let e = enc.encode::<image::RgbImage>(&m, &[], false).unwrap_err();
        assert!(
            format!("{e:#}").contains("rendering the chat template failed"),
            "{s}: {e:#}"
        );
    }
}
