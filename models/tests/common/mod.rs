//! Shared helpers of the model tests: fixture discovery, safetensors reading and the
//! backend-generic parity checks of each model family.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

/// The parity checks of each model family, generic over the backend (run on the CPU by the
/// family's fixture tests, on the GPU kernels by vulkan.rs).
pub mod gemma4_checks;
pub mod kernel_checks;
pub mod lora_checks;
pub mod qwen3_vl;
pub mod qwen_checks;

/// `FLOWRL_MODEL_FIXTURES`, or the repository's copy `tests/fixtures/models`.
pub fn fixtures_root() -> PathBuf {
    match std::env::var_os("FLOWRL_MODEL_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models"),
    }
}

/// Model cases (folders with `case.json` and `config.json`, not `processor_only`) of the family
/// folders `families` under the fixtures root; an absent family folder is skipped.
pub fn model_cases(families: &[&str]) -> Vec<PathBuf> {
    let root = fixtures_root();
    let mut cases = Vec::new();
    for fam in families {
        let dir = root.join(fam);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            eprintln!("skipping family {fam}: {} is absent", dir.display());
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("case.json").is_file() && p.join("config.json").is_file())
            .filter(|p| {
                let text = std::fs::read_to_string(p.join("case.json")).unwrap_or_default();
                let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                json.get("kind").and_then(|k| k.as_str()) != Some("processor_only")
            })
            .collect();
        found.sort();
        cases.extend(found);
    }
    cases
}

/// One tensor of a safetensors file, values widened to f64 (integers exactly).
#[derive(Debug, Clone)]
pub struct Array {
    pub shape: Vec<usize>,
    pub values: Vec<f64>,
}

impl Array {
    pub fn as_i64(&self) -> Vec<i64> {
        self.values.iter().map(|&v| v as i64).collect()
    }
}

/// Every tensor of a safetensors file.
pub fn read_safetensors(path: &Path) -> HashMap<String, Array> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let d = view.data();
        let values: Vec<f64> = match view.dtype() {
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            Dtype::I64 => d
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            Dtype::I32 => d
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            Dtype::U8 => d.iter().map(|&b| b as f64).collect(),
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        out.insert(
            name,
            Array {
                shape: view.shape().to_vec(),
                values,
            },
        );
    }
    out
}

/// `max |a − e|` over the entries where `keep` is true, and `max |e|` over the same entries.
pub fn max_dev(actual: &[f32], expected: &[f64], keep: impl Fn(usize) -> bool) -> (f64, f64) {
    assert_eq!(actual.len(), expected.len(), "length mismatch");
    let mut dev = 0.0f64;
    let mut scale = 0.0f64;
    for i in 0..actual.len() {
        if keep(i) {
            let a = actual[i] as f64;
            assert!(a.is_finite(), "non-finite value at {i}");
            dev = dev.max((a - expected[i]).abs());
            scale = scale.max(expected[i].abs());
        }
    }
    (dev, scale)
}

/// The left-padded batch of a case's `input_ids` and `attention_mask`.
pub fn padded_batch(inputs: &HashMap<String, Array>) -> flowrl_models::PaddedBatch {
    let ids = &inputs["input_ids"];
    let as_u32 = |a: &Array| a.values.iter().map(|&v| v as u32).collect();
    flowrl_models::PaddedBatch {
        ids: as_u32(ids),
        attention_mask: as_u32(&inputs["attention_mask"]),
        batch: ids.shape[0],
        len: ids.shape[1],
    }
}

/// Qwen-VL images of a case (`pixel_values` rows split by `image_grid_thw`), with their grids;
/// none when the case has no images.
pub fn qwen_images(
    inputs: &HashMap<String, Array>,
) -> (Vec<flowrl_models::ProcessedImage>, Vec<[usize; 3]>) {
    qwen_images_merged(inputs, 2)
}

/// [`qwen_images`] of a tower that merges `merge`×`merge` patches into one token.
pub fn qwen_images_merged(
    inputs: &HashMap<String, Array>,
    merge: usize,
) -> (Vec<flowrl_models::ProcessedImage>, Vec<[usize; 3]>) {
    let mut images = Vec::new();
    let mut grids = Vec::new();
    if let (Some(px), Some(g)) = (inputs.get("pixel_values"), inputs.get("image_grid_thw")) {
        let dim = px.shape[1];
        let mut row = 0;
        for k in 0..g.shape[0] {
            let grid = [
                g.values[3 * k] as usize,
                g.values[3 * k + 1] as usize,
                g.values[3 * k + 2] as usize,
            ];
            let n = grid[0] * grid[1] * grid[2];
            images.push(flowrl_models::ProcessedImage {
                pixel_values: px.values[row * dim..(row + n) * dim]
                    .iter()
                    .map(|&v| v as f32)
                    .collect(),
                shape: vec![n, dim],
                grid: grid.to_vec(),
                num_tokens: n / (merge * merge),
                patch_positions: None,
                video: None,
            });
            grids.push(grid);
            row += n;
        }
        assert_eq!(row, px.shape[0], "grids cover every pixel_values row");
    }
    (images, grids)
}

/// A fresh empty temporary directory.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowrl-models-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The largest absolute difference of two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Greedy decoding of `steps` tokens without stop tokens, padding with 0, nothing suppressed.
pub fn greedy_config(steps: usize) -> flowrl_models::generate::GenerationConfig {
    flowrl_models::generate::GenerationConfig::new(
        steps,
        flowrl_models::sampling::SamplingConfig::greedy(),
    )
}

/// Final-normed hidden states of a prompt batch with its images: the model's input embeddings,
/// then its decoder at `positions`, filling `cache` when given.
pub fn prompt_hidden<B: burn::prelude::Backend>(
    model: &flowrl_models::Model<B>,
    batch: &flowrl_models::PaddedBatch,
    images: &[flowrl_models::ProcessedImage],
    positions: &flowrl_models::PositionIds,
    device: &B::Device,
    cache: Option<&mut flowrl_models::KvCache<B>>,
) -> burn::prelude::Tensor<B, 3> {
    let embeds = model.input_embeddings(batch, images, device).unwrap();
    model.causal_lm().forward_hidden(
        batch.ids_tensor(device),
        embeds,
        positions.tensor(device),
        batch.mask_tensor(device),
        cache,
    )
}
