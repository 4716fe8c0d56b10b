//! Property tests of checkpoint reading (models/src/checkpoint.rs): safetensors headers, tensor
//! data and `model.safetensors.index.json`.
//!
//! The property, for every input: [`Model::load`] of the directory returns `Ok` or an `Err`
//! whose message is non-empty — never a panic, never an abort — and memory stays bounded: this
//! test binary's allocator refuses any single allocation over 2 GiB (the process aborts), so a
//! header length or a shape that claims 2^62 bytes must be rejected before anything of that
//! size is allocated.
//!
//! Inputs are structured mutations of the tiny Qwen2-VL checkpoint (`assets/tiny-qwen2-vl`):
//! its header JSON (dtypes, shapes, data offsets, names — renamed, deleted, duplicated under a
//! normalised alias — and `__metadata__`), its 8-byte header length (random, 2^62, u64::MAX,
//! off by a few), bytes of the header or the tensor data overwritten, the file cut anywhere;
//! and of a sharded save of the same model (index `weight_map` entries retargeted, removed,
//! made non-strings or paths outside the directory; shards deleted or cut).
//!
//! Cases (fixed seed, no persistence file): 192 header mutations, 128 byte-level damages,
//! 128 index/shard mutations; about half a minute on one core.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use burn::backend::Flex;
use flowrl_models::Model;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Value, json};

#[path = "common/capped_alloc.rs"]
mod capped_alloc;

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

/// The tiny checkpoint split: (header JSON, tensor data).
fn parts() -> &'static (Value, Vec<u8>) {
    static P: OnceLock<(Value, Vec<u8>)> = OnceLock::new();
    P.get_or_init(|| {
        let bytes = std::fs::read(tiny().join("model.safetensors")).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        (header, bytes[8 + n..].to_vec())
    })
}

fn file_of(header: &Value, data: &[u8]) -> Vec<u8> {
    let h = header.to_string().into_bytes();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

/// A directory with the tiny model's side files and `files` written.
fn dir_with(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "preprocessor_config.json", "tokenizer.json"] {
        std::os::unix::fs::symlink(tiny().join(f), tmp.path().join(f)).unwrap();
    }
    for (name, bytes) in files {
        std::fs::write(tmp.path().join(name), bytes).unwrap();
    }
    tmp
}

fn load_ok_or_message(dir: &Path) -> Result<(), TestCaseError> {
    if let Err(e) = Model::<Flex>::load(dir, &Default::default()) {
        prop_assert!(
            !format!("{e:#}").trim().is_empty(),
            "an error without a message"
        );
    }
    Ok(())
}

/// Tensor names of the header, sorted (`__metadata__` left out).
fn names(header: &Value) -> Vec<String> {
    let mut n: Vec<String> = header
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    n.sort();
    n
}

fn edge_int() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(-1)),
        Just(json!(1u64 << 31)),
        Just(json!(1u64 << 62)),
        Just(json!(u64::MAX)),
        Just(json!(1.5)),
        Just(json!("8")),
        Just(Value::Null),
        (0u64..1_000_000).prop_map(|n| json!(n)),
    ]
}

#[derive(Debug, Clone)]
enum HeaderEdit {
    Dtype(usize, &'static str),
    ShapeDim(usize, usize, Value),
    Shape(usize, Value),
    Offset(usize, usize, Value),
    Delete(usize),
    Rename(usize, String),
    /// Store tensor `i` a second time under its other (normalised-equal) spelling.
    Alias(usize),
    Metadata(Value),
    /// Replace the whole entry by a non-object.
    Entry(usize, Value),
}

fn header_edit() -> impl Strategy<Value = HeaderEdit> {
    prop_oneof![
        2 => (any::<usize>(), prop::sample::select(vec![
            "F32", "F16", "BF16", "F64", "I64", "I8", "U8", "BOOL", "F8_E4M3", "F4", "F6_E2M3", "E8M0", "XX",
        ])).prop_map(|(i, d)| HeaderEdit::Dtype(i, d)),
        3 => (any::<usize>(), any::<usize>(), edge_int()).prop_map(|(i, k, v)| HeaderEdit::ShapeDim(i, k, v)),
        1 => (any::<usize>(), prop_oneof![
            Just(json!([])), Just(json!([0])), Just(json!([1u64 << 62, 1u64 << 62])),
            Just(json!([1u64 << 32, 1u64 << 32, 4])), Just(json!("x")), Just(Value::Null),
            prop::collection::vec(0u64..100, 0..5).prop_map(|v| json!(v)),
        ]).prop_map(|(i, v)| HeaderEdit::Shape(i, v)),
        3 => (any::<usize>(), 0usize..2, edge_int()).prop_map(|(i, k, v)| HeaderEdit::Offset(i, k, v)),
        1 => any::<usize>().prop_map(HeaderEdit::Delete),
        1 => (any::<usize>(), prop_oneof![
            Just("".to_string()), Just("__metadata__".to_string()), "[a-z._]{1,20}",
        ]).prop_map(|(i, n)| HeaderEdit::Rename(i, n)),
        1 => any::<usize>().prop_map(HeaderEdit::Alias),
        1 => prop_oneof![
            Just(json!({"format": "pt"})), Just(json!({"format": 3})), Just(json!([])), Just(json!("x")),
        ].prop_map(HeaderEdit::Metadata),
        1 => (any::<usize>(), prop_oneof![Just(json!(1)), Just(json!([])), Just(Value::Null), Just(json!({}))])
            .prop_map(|(i, v)| HeaderEdit::Entry(i, v)),
    ]
}

fn edit_header(h: &mut Value, e: &HeaderEdit) {
    let ns = names(h);
    let name = |i: usize| ns[i % ns.len()].clone();
    let o = h.as_object_mut().unwrap();
    match e {
        HeaderEdit::Dtype(i, d) => o[&name(*i)]["dtype"] = json!(d),
        HeaderEdit::ShapeDim(i, k, v) => {
            if let Some(Value::Array(s)) = o[&name(*i)].get_mut("shape")
                && !s.is_empty()
            {
                let n = s.len();
                s[k % n] = v.clone();
            }
        }
        HeaderEdit::Shape(i, v) => o[&name(*i)]["shape"] = v.clone(),
        HeaderEdit::Offset(i, k, v) => {
            if let Some(Value::Array(s)) = o[&name(*i)].get_mut("data_offsets") {
                s[*k] = v.clone();
            }
        }
        HeaderEdit::Delete(i) => {
            o.remove(&name(*i));
        }
        HeaderEdit::Rename(i, n) => {
            let v = o.remove(&name(*i)).unwrap();
            o.insert(n.clone(), v);
        }
        HeaderEdit::Alias(i) => {
            let n = name(*i);
            let alias = match n.strip_prefix("visual.") {
                Some(rest) => format!("model.visual.{rest}"),
                None => match n.strip_prefix("model.") {
                    Some(rest) => format!("model.language_model.{rest}"),
                    None => format!("model.{n}"),
                },
            };
            let v = o[&n].clone();
            o.insert(alias, v);
        }
        HeaderEdit::Metadata(v) => {
            o.insert("__metadata__".into(), v.clone());
        }
        HeaderEdit::Entry(i, v) => o[&name(*i)] = v.clone(),
    }
}

#[derive(Debug, Clone)]
enum ByteEdit {
    /// The 8-byte header length replaced.
    Length(u64),
    /// The header length moved by a small amount.
    LengthBy(i64),
    /// A byte overwritten at an offset (in the header, or in the data: NaN bits included).
    Byte(usize, u8),
    /// A NaN (f32 bits) written into the tensor data at an offset.
    Nan(usize),
    Cut(usize),
    Append(Vec<u8>),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        2 => prop_oneof![
            Just(1u64 << 62), Just(u64::MAX), Just(0u64), Just(7u64), any::<u64>(), 0u64..2_000_000,
        ].prop_map(ByteEdit::Length),
        1 => (-16i64..16).prop_map(ByteEdit::LengthBy),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(o, b)| ByteEdit::Byte(o, b)),
        1 => any::<usize>().prop_map(ByteEdit::Nan),
        2 => any::<usize>().prop_map(ByteEdit::Cut),
        1 => prop::collection::vec(any::<u8>(), 1..16).prop_map(ByteEdit::Append),
    ]
}

fn edit_bytes(f: &mut Vec<u8>, e: &ByteEdit) {
    let n = u64::from_le_bytes(f[..8].try_into().unwrap());
    match e {
        ByteEdit::Length(v) => f[..8].copy_from_slice(&v.to_le_bytes()),
        ByteEdit::LengthBy(d) => f[..8].copy_from_slice(&n.wrapping_add_signed(*d).to_le_bytes()),
        ByteEdit::Byte(o, b) => {
            let o = o % f.len();
            f[o] = *b;
        }
        ByteEdit::Nan(o) => {
            let start = (8 + n as usize).min(f.len());
            let room = f.len() - start;
            if room >= 4 {
                let at = start + (o % (room / 4)) * 4;
                f[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
            }
        }
        ByteEdit::Cut(o) => f.truncate(o % (f.len() + 1)),
        ByteEdit::Append(b) => f.extend_from_slice(b),
    }
}

/// The tiny model saved in three or more shards (once per test binary).
fn sharded() -> &'static (Value, Vec<(String, Vec<u8>)>) {
    type HeaderAndTensors = (Value, Vec<(String, Vec<u8>)>);
    static S: OnceLock<HeaderAndTensors> = OnceLock::new();
    S.get_or_init(|| {
        let model = Model::<Flex>::load(&tiny(), &Default::default()).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        model.save(tmp.path(), Some(200_000)).unwrap();
        let index: Value = serde_json::from_str(
            &std::fs::read_to_string(tmp.path().join("model.safetensors.index.json")).unwrap(),
        )
        .unwrap();
        let mut shards = Vec::new();
        for e in std::fs::read_dir(tmp.path()).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            if name.ends_with(".safetensors") {
                shards.push((name, std::fs::read(&p).unwrap()));
            }
        }
        shards.sort();
        assert!(shards.len() >= 3, "{} shards", shards.len());
        (index, shards)
    })
}

#[derive(Debug, Clone)]
enum IndexEdit {
    /// weight_map[tensor i] set to a value.
    Target(usize, Value),
    Remove(usize),
    /// A tensor added to the map, in shard k.
    Extra(String, usize),
    WeightMap(Value),
    DeleteShard(usize),
    CutShard(usize, usize),
    /// The index text cut.
    CutIndex(usize),
}

fn index_edit() -> impl Strategy<Value = IndexEdit> {
    prop_oneof![
        3 => (any::<usize>(), prop_oneof![
            Just(json!("model-00001-of-00003.safetensors")),
            Just(json!("model-00002-of-00003.safetensors")),
            Just(json!("nope.safetensors")),
            Just(json!("../model.safetensors")),
            Just(json!("/etc/passwd")),
            Just(json!("")),
            Just(json!(".")),
            Just(json!(3)),
            Just(Value::Null),
            Just(json!(["a"])),
        ]).prop_map(|(i, v)| IndexEdit::Target(i, v)),
        1 => any::<usize>().prop_map(IndexEdit::Remove),
        1 => ("[a-z.]{1,12}", any::<usize>()).prop_map(|(n, k)| IndexEdit::Extra(n, k)),
        1 => prop_oneof![Just(json!([])), Just(json!({})), Just(Value::Null), Just(json!("x"))]
            .prop_map(IndexEdit::WeightMap),
        1 => any::<usize>().prop_map(IndexEdit::DeleteShard),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(k, o)| IndexEdit::CutShard(k, o)),
        1 => any::<usize>().prop_map(IndexEdit::CutIndex),
    ]
}

proptest! {
    #![proptest_config(config(192))]

    #[test]
    fn mutated_headers_load_or_err(edits in prop::collection::vec(header_edit(), 1..4)) {
        let (header, data) = parts();
        let mut h = header.clone();
        for e in &edits {
            edit_header(&mut h, e);
        }
        let tmp = dir_with(&[("model.safetensors", &file_of(&h, data))]);
        load_ok_or_message(tmp.path())?;
    }
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn damaged_bytes_load_or_err(edits in prop::collection::vec(byte_edit(), 1..3)) {
        let (header, data) = parts();
        let mut f = file_of(header, data);
        for e in &edits {
            if f.len() < 8 {
                break;
            }
            edit_bytes(&mut f, e);
        }
        let tmp = dir_with(&[("model.safetensors", &f)]);
        load_ok_or_message(tmp.path())?;
    }

    #[test]
    fn mutated_indexes_and_shards_load_or_err(edits in prop::collection::vec(index_edit(), 1..4)) {
        let (index, shards) = sharded();
        let mut index = index.clone();
        let mut shards = shards.clone();
        let mut index_cut = None;
        for e in &edits {
            let tensors: Vec<String> = index
                .get("weight_map")
                .and_then(Value::as_object)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            let map = index.get_mut("weight_map").and_then(Value::as_object_mut);
            match (e, map) {
                (IndexEdit::Target(i, v), Some(m)) if !tensors.is_empty() => {
                    m.insert(tensors[i % tensors.len()].clone(), v.clone());
                }
                (IndexEdit::Remove(i), Some(m)) if !tensors.is_empty() => {
                    m.remove(&tensors[i % tensors.len()]);
                }
                (IndexEdit::Extra(n, k), Some(m)) if !shards.is_empty() => {
                    m.insert(n.clone(), json!(shards[k % shards.len()].0));
                }
                (IndexEdit::WeightMap(v), _) => index["weight_map"] = v.clone(),
                (IndexEdit::DeleteShard(k), _) if !shards.is_empty() => {
                    let n = shards.len();
                    shards.remove(k % n);
                }
                (IndexEdit::CutShard(k, o), _) if !shards.is_empty() => {
                    let n = shards.len();
                    let s = &mut shards[k % n].1;
                    let o = o % (s.len() + 1);
                    s.truncate(o);
                }
                (IndexEdit::CutIndex(o), _) => index_cut = Some(*o),
                _ => {}
            }
        }
        let mut text = serde_json::to_vec_pretty(&index).unwrap();
        if let Some(o) = index_cut {
            let n = text.len();
            text.truncate(o % (n + 1));
        }
        let mut files: Vec<(&str, &[u8])> = vec![("model.safetensors.index.json", &text)];
        files.extend(shards.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
        let tmp = dir_with(&files);
        load_ok_or_message(tmp.path())?;
    }
}

/// The unmutated single file and shards load (the mutations start from working files).
#[test]
fn the_unmutated_checkpoints_load() {
    let (header, data) = parts();
    let tmp = dir_with(&[("model.safetensors", &file_of(header, data))]);
    Model::<Flex>::load(tmp.path(), &Default::default()).unwrap();
    let (index, shards) = sharded();
    let text = serde_json::to_vec(index).unwrap();
    let mut files: Vec<(&str, &[u8])> = vec![("model.safetensors.index.json", &text)];
    files.extend(shards.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
    let tmp = dir_with(&files);
    Model::<Flex>::load(tmp.path(), &Default::default()).unwrap();
}

/// A header length of 2^62 (and u64::MAX) in a small file: an error naming the claimed length,
/// nothing of that size allocated.
#[test]
fn a_header_length_of_2_pow_62_is_an_error() {
    let (header, data) = parts();
    for claimed in [1u64 << 62, u64::MAX, u64::MAX - 7] {
        let mut f = file_of(header, data);
        f[..8].copy_from_slice(&claimed.to_le_bytes());
        let tmp = dir_with(&[("model.safetensors", &f)]);
        let e = Model::<Flex>::load(tmp.path(), &Default::default())
            .err()
            .unwrap();
        assert!(
            format!("{e:#}").contains(&format!("the header length says {claimed} bytes")),
            "{e:#}"
        );
    }
}

/// A tensor whose shape claims 2^62 elements (offsets unchanged): an error, nothing allocated.
#[test]
fn a_shape_of_2_pow_62_elements_is_an_error() {
    let (header, data) = parts();
    let name = names(header)[0].clone();
    for shape in [
        json!([1u64 << 62]),
        json!([1u64 << 31, 1u64 << 31]),
        json!([u64::MAX, 2]),
    ] {
        let mut h = header.clone();
        h[&name]["shape"] = shape;
        let tmp = dir_with(&[("model.safetensors", &file_of(&h, data))]);
        let e = Model::<Flex>::load(tmp.path(), &Default::default())
            .err()
            .unwrap();
        assert!(!format!("{e:#}").is_empty());
    }
}
