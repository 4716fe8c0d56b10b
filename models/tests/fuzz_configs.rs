//! Property tests of the model families' `config.json` and `preprocessor_config.json` parsers.
//!
//! The property, for every input: parsing a config and building the model from it (with
//! placeholder weights, [`Model::shape_only`], or with the real weights of the tiny model,
//! [`Model::load`]), and building the image processor and processing a picture with it, return
//! `Ok` or an `Err` whose message is non-empty — never a panic, never an abort. Memory stays
//! bounded: this test binary's allocator refuses any single allocation over 2 GiB, which aborts
//! the run, so a config that claims a huge size must be rejected or built without allocating it.
//!
//! Inputs are structured mutations of the shipped configs (Qwen2-VL: `assets/tiny-qwen2-vl`,
//! Qwen2.5-VL: the first fixture case with its config, Gemma 4: `assets/tiny-gemma4`):
//! any value in the JSON tree replaced by an edge value (0, -1, 2^31, 2^62, u64::MAX, 1e300,
//! NaN-like strings, null, wrong types, empty or long arrays), keys deleted or renamed, plus
//! byte-level truncations and insertions of the text.
//!
//! Cases (fixed seed, no persistence file): 512 shape-only builds and 512 processor runs
//! (families drawn at random), 96 loads with the real weights, 128 text mutations; a few seconds
//! on one core. Failures found by these tests are kept as named `#[test]`s at the end.

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use flowrl_models::Model;
use flowrl_models::weights::Precision;
use image::{Rgb, RgbImage};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Value, json};

#[path = "common/capped_alloc.rs"]
mod capped_alloc;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Model directories whose config.json is mutated: (family, dir).
fn model_dirs() -> Vec<(&'static str, PathBuf)> {
    let r = root();
    vec![
        ("qwen2_vl", r.join("assets/tiny-qwen2-vl")),
        ("qwen2_5_vl", fixture_config_dir(&r, "qwen2_5_vl")),
        ("gemma4", r.join("assets/tiny-gemma4")),
    ]
}

/// The first model fixture case (in name order) whose config.json has `model_type`, found by
/// content.
fn fixture_config_dir(root: &Path, model_type: &str) -> PathBuf {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(root.join("tests/fixtures/models"))
        .unwrap()
        .flat_map(|family| std::fs::read_dir(family.unwrap().path()).unwrap())
        .map(|case| case.unwrap().path())
        .filter(|dir| {
            std::fs::read_to_string(dir.join("config.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .is_some_and(|c| c["model_type"] == model_type)
        })
        .collect();
    cases.sort();
    cases
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no {model_type} config among tests/fixtures/models"))
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x5eed_0020),
        failure_persistence: None,
        max_shrink_iters: 512,
        ..Config::default()
    }
}

/// A mutation of a JSON tree: the node is chosen by index in pre-order (modulo the count).
#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, Value),
    Delete(usize),
    Rename(usize, String),
}

fn edge_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(-1)),
        Just(json!(3)),
        Just(json!(7)),
        Just(json!(1u64 << 31)),
        Just(json!(1u64 << 40)),
        Just(json!(1u64 << 62)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(1e300)),
        Just(json!(-0.0)),
        Just(json!(0.5)),
        Just(json!(1e-300)),
        Just(json!("nan")),
        Just(json!("")),
        Just(json!("full_attention")),
        Just(json!("sliding_attention")),
        Just(json!("proportional")),
        Just(Value::Null),
        Just(json!(true)),
        Just(json!([])),
        Just(json!([0, 0, 0])),
        Just(json!([1u64 << 62, 1, 1])),
        Just(json!({})),
        (0u64..4096).prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        prop::collection::vec(0u64..64, 0..6).prop_map(|v| json!(v)),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => (any::<usize>(), edge_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        2 => any::<usize>().prop_map(Mutation::Delete),
        1 => (any::<usize>(), "[a-z_]{0,12}").prop_map(|(i, k)| Mutation::Rename(i, k)),
    ]
}

/// JSON pointers of every node of `v`, in pre-order (the root is "").
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

fn split_pointer(p: &str) -> (&str, String) {
    let cut = p.rfind('/').unwrap();
    let last = p[cut + 1..].replace("~1", "/").replace("~0", "~");
    (&p[..cut], last)
}

fn mutate(v: &mut Value, m: &Mutation) {
    let mut ps = Vec::new();
    pointers(v, String::new(), &mut ps);
    let pick = |i: usize| ps[i % ps.len()].clone();
    match m {
        Mutation::Replace(i, x) => {
            let p = pick(*i);
            *v.pointer_mut(&p).unwrap() = x.clone();
        }
        Mutation::Delete(i) | Mutation::Rename(i, _) => {
            let p = pick(*i);
            if p.is_empty() {
                return;
            }
            let (parent, last) = split_pointer(&p);
            let removed = match v.pointer_mut(parent).unwrap() {
                Value::Object(o) => o.remove(&last),
                Value::Array(a) => {
                    let k: usize = last.parse().unwrap();
                    Some(a.remove(k))
                }
                _ => None,
            };
            if let (Mutation::Rename(_, k), Some(x), Some(Value::Object(o))) =
                (m, removed, v.pointer_mut(parent))
            {
                o.insert(k.clone(), x);
            }
        }
    }
}

/// Ok, or an error with a message.
fn ok_or_message<T>(r: anyhow::Result<T>) -> Result<Option<T>, TestCaseError> {
    match r {
        Ok(x) => Ok(Some(x)),
        Err(e) => {
            prop_assert!(
                !format!("{e:#}").trim().is_empty(),
                "an error without a message"
            );
            Ok(None)
        }
    }
}

fn shape_only(text: &str) -> anyhow::Result<Model<Flex>> {
    Model::<Flex>::shape_only(text, &Default::default(), Precision::F32)
}

/// A copy of `dir` (files linked, config.json and preprocessor_config.json written) in a temp dir.
fn copy_with(dir: &Path, config: Option<&str>, preprocessor: Option<&str>) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap();
        let to = tmp.path().join(name);
        let text = match name.to_str().unwrap() {
            "config.json" => config,
            "preprocessor_config.json" => preprocessor,
            _ => None,
        };
        match text {
            Some(t) => std::fs::write(&to, t).unwrap(),
            None => std::os::unix::fs::symlink(&p, &to).unwrap(),
        }
    }
    tmp
}

fn picture(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        Rgb([(x * 7) as u8, (y * 5) as u8, ((x + y) * 3) as u8])
    })
}

/// The family's image processor of `dir` on a few pictures: Ok or an error with a message.
fn process_pictures(dir: &Path) -> Result<(), TestCaseError> {
    let Some(model_type) = ok_or_message(flowrl_models::registry::read_model_type(dir))? else {
        return Ok(());
    };
    let family = flowrl_models::registry::family(&model_type).unwrap();
    let load = family.image_processor.unwrap();
    if let Some(p) = ok_or_message(load(dir))? {
        for (w, h) in [(1, 1), (64, 48), (3, 300), (300, 2)] {
            ok_or_message(p.process(&picture(w, h)))?;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    /// Every family: a mutated config parses and builds with placeholder weights, or errs.
    #[test]
    fn mutated_configs_build_or_err(
        family in 0usize..3,
        muts in prop::collection::vec(mutation(), 1..4),
    ) {
        let (_, dir) = &model_dirs()[family];
        let mut v = read_json(&dir.join("config.json"));
        for m in &muts {
            mutate(&mut v, m);
        }
        ok_or_message(shape_only(&v.to_string()))?;
    }

    /// Both processors: a mutated preprocessor_config.json (and config.json token ids) loads
    /// and processes pictures, or errs.
    #[test]
    fn mutated_preprocessor_configs_process_or_err(
        family in prop::sample::select(vec![0usize, 2]),
        muts in prop::collection::vec(mutation(), 1..4),
        in_config in any::<bool>(),
    ) {
        let (_, dir) = &model_dirs()[family];
        let file = if in_config { "config.json" } else { "preprocessor_config.json" };
        let mut v = read_json(&dir.join(file));
        for m in &muts {
            mutate(&mut v, m);
        }
        // The family is read from config.json's model_type: keep it.
        if in_config && v.is_object() {
            v["model_type"] = read_json(&dir.join("config.json"))["model_type"].clone();
        }
        let text = v.to_string();
        let tmp = if in_config {
            copy_with(dir, Some(&text), None)
        } else {
            copy_with(dir, None, Some(&text))
        };
        process_pictures(tmp.path())?;
    }
}

proptest! {
    #![proptest_config(config(128))]

    /// Byte-level damage of a config text: cut, or a byte inserted.
    #[test]
    fn damaged_config_text_errs(family in 0usize..3, at in any::<usize>(), byte in any::<u8>(), cut in any::<bool>()) {
        let (_, dir) = &model_dirs()[family];
        let mut bytes = std::fs::read(dir.join("config.json")).unwrap();
        let at = at % (bytes.len() + 1);
        if cut { bytes.truncate(at) } else { bytes.insert(at, byte) }
        let text = String::from_utf8_lossy(&bytes);
        ok_or_message(shape_only(&text))?;
    }
}

proptest! {
    #![proptest_config(config(96))]

    /// Every family: a mutated config with the model's real weights loads, or errs.
    #[test]
    fn mutated_configs_load_or_err(
        family in 0usize..3,
        muts in prop::collection::vec(mutation(), 1..3),
    ) {
        let (_, dir) = &model_dirs()[family];
        let mut v = read_json(&dir.join("config.json"));
        for m in &muts {
            mutate(&mut v, m);
        }
        let tmp = copy_with(dir, Some(&v.to_string()), None);
        ok_or_message(Model::<Flex>::load(tmp.path(), &Default::default()))?;
    }
}

/// The unmutated configs build, load and process (the mutations start from working files).
#[test]
fn the_unmutated_files_work() {
    for (family, dir) in model_dirs() {
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        shape_only(&text).unwrap_or_else(|e| panic!("{family}: {e:#}"));
        Model::<Flex>::load(&dir, &Default::default())
            .unwrap_or_else(|e| panic!("{family}: {e:#}"));
    }
    for (_, dir) in [&model_dirs()[0], &model_dirs()[2]] {
        process_pictures(dir).unwrap();
    }
}

/// Hand-made configs that claim huge sizes: an error (or a shape-only build), not an abort.
#[test]
fn huge_sizes_are_rejected_or_not_allocated() {
    for (family, dir) in model_dirs() {
        let base = read_json(&dir.join("config.json"));
        let keys: &[&str] = if family == "gemma4" {
            &[
                "/text_config/vocab_size",
                "/text_config/hidden_size",
                "/text_config/intermediate_size",
                "/vision_config/hidden_size",
                "/text_config/vocab_size_per_layer_input",
                "/text_config/max_position_embeddings",
            ]
        } else {
            &[
                "/text_config/vocab_size",
                "/text_config/hidden_size",
                "/text_config/intermediate_size",
                "/vision_config/depth",
                "/vision_config/patch_size",
                "/text_config/max_position_embeddings",
            ]
        };
        for key in keys {
            for big in [1u64 << 31, 1u64 << 40, 1u64 << 62, u64::MAX] {
                let mut v = base.clone();
                let Some(slot) = v.pointer_mut(key) else {
                    continue;
                };
                *slot = json!(big);
                let text = v.to_string();
                let _ = shape_only(&text);
                let tmp = copy_with(&dir, Some(&text), None);
                if let Err(e) = Model::<Flex>::load(tmp.path(), &Default::default()) {
                    assert!(!e.to_string().is_empty());
                }
            }
        }
    }
}

// Regression tests: inputs these properties found, each of which aborted the process before
// its fix.

fn with(dir: &Path, file: &str, pointer: &str, value: Value) -> String {
    let mut v = read_json(&dir.join(file));
    *v.pointer_mut(pointer).unwrap() = value;
    v.to_string()
}

/// `text_config.vocab_size = 2^26` (within the bounds) with the tiny checkpoint: the embedding
/// the config claims (2^26 × 64 f32, 16 GiB) is mis-shaped in the checkpoint; its zeros were
/// allocated before the load failed (abort). Now a placeholder, and the error names the tensor.
#[test]
fn regression_mis_shaped_huge_tensor_is_not_allocated() {
    for (family, dir) in model_dirs() {
        let text = with(
            &dir,
            "config.json",
            "/text_config/vocab_size",
            json!(1u64 << 26),
        );
        let tmp = copy_with(&dir, Some(&text), None);
        let e = Model::<Flex>::load(tmp.path(), &Default::default())
            .err()
            .unwrap();
        let e = format!("{e:#}");
        assert!(
            e.contains("embed_tokens.weight") && e.contains("67108864"),
            "{family}: {e}"
        );
    }
}

/// `vision_config.depth = 2^50` (Qwen2-VL): the block list was allocated for the claimed depth
/// (abort). Now a bound names the key.
#[test]
fn regression_huge_vision_depth_is_an_error() {
    let dir = &model_dirs()[0].1;
    let text = with(
        dir,
        "config.json",
        "/vision_config/depth",
        json!(1u64 << 50),
    );
    let e = shape_only(&text).err().unwrap();
    assert!(
        format!("{e:#}").contains("vision_config depth = 1125899906842624 is implausibly large"),
        "{e:#}"
    );
    let dir = &model_dirs()[2].1;
    let text = with(
        dir,
        "config.json",
        "/vision_config/num_hidden_layers",
        json!(1u64 << 50),
    );
    let e = shape_only(&text).err().unwrap();
    assert!(
        format!("{e:#}")
            .contains("vision_config.num_hidden_layers = 1125899906842624 is implausibly large"),
        "{e:#}"
    );
}

/// Preprocessor configs whose sizes make one picture need gigabytes (Qwen2-VL's `min_pixels`
/// of 2^40 or a temporal patch of 2^20; Gemma 4's patch of 2^20): errors naming the keys, not
/// an allocation.
#[test]
fn regression_huge_processor_sizes_are_errors() {
    let qwen = &model_dirs()[0].1;
    let gemma = &model_dirs()[2].1;
    let cases = [
        (
            qwen,
            "/size/shortest_edge",
            json!(1u64 << 40),
            "check min_pixels / max_pixels",
        ),
        (
            qwen,
            "/temporal_patch_size",
            json!(1u64 << 20),
            "temporal_patch_size = 1048576",
        ),
        (
            qwen,
            "/patch_size",
            json!(1u64 << 20),
            "patch_size = 1048576",
        ),
        (
            gemma,
            "/patch_size",
            json!(1u64 << 20),
            "patch_size = 1048576",
        ),
        (
            gemma,
            "/pooling_kernel_size",
            json!(1u64 << 20),
            "pooling_kernel_size = 1048576",
        ),
    ];
    for (dir, pointer, value, expected) in cases {
        let text = with(dir, "preprocessor_config.json", pointer, value);
        let tmp = copy_with(dir, None, Some(&text));
        let model_type = flowrl_models::registry::read_model_type(tmp.path()).unwrap();
        let load = flowrl_models::registry::family(&model_type)
            .unwrap()
            .image_processor
            .unwrap();
        let e = match load(tmp.path()) {
            Err(e) => e,
            Ok(p) => p.process(&picture(64, 48)).err().unwrap(),
        };
        assert!(format!("{e:#}").contains(expected), "{pointer}: {e:#}");
    }
}
