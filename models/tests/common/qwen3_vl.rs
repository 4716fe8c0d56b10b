//! The Qwen3-VL fixture cases shared by qwen3_vl_fixtures*.rs: finding every case folder of a
//! kind under `FLOWRL_MODEL_FIXTURES/qwen3_vl`, and reading a model case's inputs and expected
//! tensors ([`Case`]) with its parity checks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use flowrl_models::{PaddedBatch, ProcessedImage};
use serde_json::Value;

use super::{
    Array, fixtures_root, max_dev, model_cases, padded_batch, qwen_images_merged, read_safetensors,
};

const FAMILY: &str = "qwen3_vl";

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every case folder of the family with `kind`; the repository's own copy must hold both kinds
/// (a set given by `FLOWRL_MODEL_FIXTURES` may lack one, or the family).
pub fn cases(kind: &str) -> Vec<PathBuf> {
    let dir = fixtures_root().join(FAMILY);
    let from_env = std::env::var_os("FLOWRL_MODEL_FIXTURES").is_some();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        assert!(from_env, "{} is absent", dir.display());
        eprintln!("{} is absent: nothing to check", dir.display());
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.json").is_file())
        .filter(|p| read_json(&p.join("case.json"))["kind"] == kind)
        .collect();
    found.sort();
    if kind == "model" {
        assert_eq!(found, model_cases(&[FAMILY]), "model cases");
    }
    assert!(
        from_env || !found.is_empty(),
        "no {kind} case in {}",
        dir.display()
    );
    found
}

pub struct Case {
    pub name: String,
    pub config: Value,
    pub batch: PaddedBatch,
    pub images: Vec<ProcessedImage>,
    pub grids: Vec<[usize; 3]>,
    pub expected: HashMap<String, Array>,
    report: Vec<String>,
}

impl Case {
    pub fn read(dir: &Path) -> Self {
        let config = read_json(&dir.join("config.json"));
        let inputs = read_safetensors(&dir.join("inputs.safetensors"));
        let merge = config["vision_config"]["spatial_merge_size"]
            .as_u64()
            .unwrap() as usize;
        let (images, grids) = qwen_images_merged(&inputs, merge);
        Self {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),

            config,
            batch: padded_batch(&inputs),
            images,
            grids,
            expected: read_safetensors(&dir.join("expected.safetensors")),
            report: Vec::new(),
        }
    }

    pub fn expected(&self, name: &str) -> &Array {
        self.expected
            .get(name)
            .unwrap_or_else(|| panic!("{}: expected.safetensors has no {name}", self.name))
    }

    /// `actual` ≈ `expected[name]` within `tol · max(1, max |e|)` on the entries `keep` selects.
    pub fn check(&mut self, name: &str, actual: &[f32], keep: impl Fn(usize) -> bool, tol: f64) {
        let e = self.expected(name);
        assert_eq!(actual.len(), e.values.len(), "{}: {name} size", self.name);
        let (dev, scale) = max_dev(actual, &e.values, keep);
        let rel = dev / scale.max(1.0);
        self.report
            .push(format!("  {name:<36} max|diff| {dev:.2e}  rel {rel:.2e}"));
        assert!(
            rel <= tol,
            "{}: {name} deviates by {dev:e} (scale {scale:e}), tolerance {tol:e}",
            self.name
        );
    }

    pub fn exact(&mut self, name: &str, actual: &[i64]) {
        let e = self.expected(name).as_i64();
        assert_eq!(actual, e.as_slice(), "{}: {name} differs", self.name);
        self.report.push(format!("  {name:<36} exact"));
    }

    pub fn print(&self) {
        eprintln!("{}\n{}", self.name, self.report.join("\n"));
    }
}
