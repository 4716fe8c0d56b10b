//! Property tests of the optimizer state file (`optimizer.safetensors`, [`AdamW::save`]) as a
//! resume reads it ([`parse_state`], behind [`AdamW::load`]).
//!
//! The property, for every input: an error with a message, or state that fits the model (each
//! parameter's moments of its size, finite) — never a panic, and memory bounded by the file's
//! size (a header that claims 2^62 bytes is not allocated). Inputs: a valid file with bytes
//! flipped, inserted, cut; its JSON header edited (sizes, offsets, dtypes, step counts, names);
//! random bytes; checked against the right model and against one of other shapes.
//!
//! Cases (fixed seed, no persistence file): 512 + 512; about a second.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use flowrl_nodes::runtime::backend::CpuBackend as AB;
use flowrl_nodes::train::optim::AdamW;
use flowrl_nodes::train::optim::adamw::{param_shapes, parse_state};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x5eed_0a0a),
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    }
}

#[derive(Module, Debug)]
struct Net<B: Backend> {
    a: Linear<B>,
    b: Linear<B>,
}

fn net(input: usize) -> Net<AB> {
    let device = Default::default();
    Net {
        a: LinearConfig::new(input, 2).init(&device),
        b: LinearConfig::new(2, 1).init(&device),
    }
}

/// Parameter path → shape.
type Shapes = BTreeMap<String, Vec<usize>>;

/// A valid optimizer file of `net(3)` after two steps, the shapes of `net(3)` and of `net(4)`.
fn fixture() -> &'static (Vec<u8>, Shapes, Shapes) {
    static F: OnceLock<(Vec<u8>, Shapes, Shapes)> = OnceLock::new();
    F.get_or_init(|| {
        let device = Default::default();
        let mut model = net(3);
        let mut opt = AdamW::<AB>::new(Default::default());
        for _ in 0..2 {
            let x = Tensor::<AB, 2>::from_data([[1.0, -2.0, 0.5]], &device);
            let loss = model.b.forward(model.a.forward(x)).sum();
            let grads = GradientsParams::from_grads::<AB, _>(loss.backward(), &model);
            model = opt.step(0.01, model, grads);
        }
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("optimizer.safetensors");
        opt.save(&file).unwrap();
        (
            std::fs::read(&file).unwrap(),
            param_shapes(&model),
            param_shapes(&net(4)),
        )
    })
}

/// The property: Ok with moments that fit `shapes`, or an error with a message.
fn check(bytes: &[u8], shapes: &Shapes) -> Result<(), TestCaseError> {
    match parse_state(bytes, shapes) {
        Ok((_, moments)) => {
            for (key, (step, m, v)) in moments {
                let n: usize = shapes[&key].iter().product();
                prop_assert!(step >= 1 && m.len() == n && v.len() == n, "{key}");
                prop_assert!(m.iter().chain(&v).all(|x| x.is_finite()));
            }
        }
        Err(e) => {
            let message = format!("{e:#}");
            prop_assert!(!message.trim().is_empty());
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Cut(usize, usize),
    /// Replaces a JSON value of the header (the n-th number or string) by `text`.
    Header(usize, String),
}

fn edit() -> impl Strategy<Value = Edit> {
    let text = prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("4611686018427387904".to_string()),
        Just("18446744073709551615".to_string()),
        Just("\"F64\"".to_string()),
        Just("\"BF16\"".to_string()),
        Just("[]".to_string()),
        Just("[0,0]".to_string()),
        Just("[3,4611686018427387904]".to_string()),
        Just("\"{\\\"a.bias\\\":0}\"".to_string()),
        Just("\"{\\\"zzz\\\":1}\"".to_string()),
        Just("\"a.weight.exp_avg\"".to_string()),
        Just("null".to_string()),
        any::<u32>().prop_map(|n| n.to_string()),
    ];
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(i, x)| Edit::Flip(i, x)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..9))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<usize>(), 1..64usize).prop_map(|(i, n)| Edit::Cut(i, n)),
        (any::<usize>(), text).prop_map(|(i, t)| Edit::Header(i, t)),
    ]
}

/// Applies `e` to a safetensors file; a header edit keeps the 8-byte length prefix right.
fn apply(bytes: &[u8], e: &Edit) -> Vec<u8> {
    let mut b = bytes.to_vec();
    match e {
        Edit::Flip(i, x) => {
            let i = i % b.len();
            b[i] ^= x;
        }
        Edit::Insert(i, extra) => {
            let i = i % (b.len() + 1);
            b.splice(i..i, extra.iter().copied());
        }
        Edit::Cut(i, n) => {
            let i = i % b.len();
            let end = (i + n).min(b.len());
            b.drain(i..end);
        }
        Edit::Header(k, text) => {
            let len = u64::from_le_bytes(b[..8].try_into().unwrap());
            // An earlier edit broke the length prefix: nothing to edit as JSON.
            let Some(len) = usize::try_from(len).ok().filter(|l| l + 8 <= b.len()) else {
                return b;
            };
            let header = String::from_utf8_lossy(&b[8..8 + len]).to_string();
            // The value spans: runs of digits, or "..." strings.
            let mut spans = Vec::new();
            let chars: Vec<(usize, char)> = header.char_indices().collect();
            let mut i = 0;
            while i < chars.len() {
                let (start, c) = chars[i];
                if c.is_ascii_digit() || c == '"' {
                    let mut j = i + 1;
                    if c == '"' {
                        while j < chars.len() && (chars[j].1 != '"' || chars[j - 1].1 == '\\') {
                            j += 1;
                        }
                        j += 1;
                    } else {
                        while j < chars.len() && chars[j].1.is_ascii_digit() {
                            j += 1;
                        }
                    }
                    let end = chars.get(j).map_or(header.len(), |c| c.0);
                    spans.push((start, end));
                    i = j;
                } else {
                    i += 1;
                }
            }
            if spans.is_empty() {
                return b;
            }
            let (s, t) = spans[k % spans.len()];
            let new = format!("{}{text}{}", &header[..s], &header[t..]);
            let mut out = (new.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(new.as_bytes());
            out.extend_from_slice(&b[8 + len..]);
            return out;
        }
    }
    b
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn damaged_optimizer_files_load_or_report(
        edits in prop::collection::vec(edit(), 1..4),
        other_model in any::<bool>(),
    ) {
        let (good, shapes, other) = fixture();
        let mut bytes = good.clone();
        for e in &edits {
            bytes = apply(&bytes, e);
            if bytes.len() < 8 {
                break;
            }
        }
        check(&bytes, if other_model { other } else { shapes })?;
    }

    #[test]
    fn random_bytes_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let (_, shapes, _) = fixture();
        prop_assert!(parse_state(&bytes, shapes).is_err());
    }
}

#[test]
fn the_good_file_loads_and_a_huge_claimed_header_is_not_allocated() {
    let (good, shapes, other) = fixture();
    let (config, moments) = parse_state(good, shapes).unwrap();
    assert!(config.is_some());
    assert_eq!(moments.len(), 4);
    assert!(parse_state(good, other).is_err());
    let mut huge = (1u64 << 62).to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    let e = format!("{:#}", parse_state(&huge, shapes).unwrap_err());
    assert!(e.starts_with("not a safetensors file: "), "{e}");
}
