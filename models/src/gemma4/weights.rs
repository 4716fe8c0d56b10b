//! Reading and writing the safetensors weights of a Gemma 4 Hugging Face directory.
//!
//! [`WeightReader`] loads every tensor of `model.safetensors` (or of the shards listed in
//! `model.safetensors.index.json`) as f32 (F32, F16 and BF16 files) and hands them out by name;
//! missing, mis-shaped and unexpected tensors are collected and reported together, by name, in
//! one error by [`WeightReader::finish`]. [`write_safetensors`] writes named f32 tensors back
//! in the same format.
//!
//! It does not know weight names: the layers name what they load (see `text.rs`, `vision.rs`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::module::Param;
use burn::prelude::*;
use safetensors::{Dtype, SafeTensors};

/// A host tensor: shape and row-major f32 values.
#[derive(Debug, Clone)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// Named tensors of a checkpoint, taken out one by one while the model is built.
pub struct WeightReader {
    tensors: HashMap<String, HostTensor>,
    missing: Vec<String>,
    misshaped: Vec<String>,
    source: String,
}

impl WeightReader {
    /// Reads every safetensors file of the directory: the shards named by
    /// `model.safetensors.index.json` when it exists, else `model.safetensors`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<std::path::PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index)
                .with_context(|| format!("reading {}", index.display()))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", index.display()))?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .with_context(|| format!("{} has no `weight_map` object", index.display()))?;
            let mut shards: Vec<String> = map
                .values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            shards.sort();
            shards.dedup();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else {
            vec![dir.join("model.safetensors")]
        };
        let mut tensors = HashMap::new();
        for file in &files {
            let bytes =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let st = SafeTensors::deserialize(&bytes)
                .map_err(|e| anyhow::anyhow!("parsing {}: {e}", file.display()))?;
            for (name, view) in st.tensors() {
                let values = to_f32(view.dtype(), view.data())
                    .with_context(|| format!("tensor `{name}` in {}", file.display()))?;
                tensors.insert(
                    name,
                    HostTensor {
                        shape: view.shape().to_vec(),
                        values,
                    },
                );
            }
        }
        Ok(Self {
            tensors,
            missing: Vec::new(),
            misshaped: Vec::new(),
            source: dir.display().to_string(),
        })
    }

    /// Whether the checkpoint holds `name` (and it was not taken yet).
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Takes `name` as host values of the given shape; on a missing or mis-shaped tensor it
    /// records the problem and returns zeros, so that every problem is reported at once.
    pub fn host(&mut self, name: &str, shape: &[usize]) -> Vec<f32> {
        let n: usize = shape.iter().product();
        match self.tensors.remove(name) {
            None => {
                self.missing.push(format!("{name} {shape:?}"));
                vec![0.0; n]
            }
            Some(t) => {
                // `[]` and `[1]` scalars are interchangeable.
                let numel: usize = t.shape.iter().product();
                if t.shape != shape && !(numel == 1 && n == 1) {
                    self.misshaped
                        .push(format!("{name}: expected {shape:?}, found {:?}", t.shape));
                    vec![0.0; n]
                } else {
                    t.values
                }
            }
        }
    }

    /// A scalar (`[]` or `[1]`).
    pub fn scalar(&mut self, name: &str) -> f32 {
        self.host(name, &[1])[0]
    }

    /// Takes `name` as a tensor of shape `shape` on `device`.
    pub fn tensor<B: Backend, const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        device: &B::Device,
    ) -> Tensor<B, D> {
        let values = self.host(name, &shape);
        Tensor::from_data(TensorData::new(values, shape), device)
    }

    /// Takes `name` as a trainable parameter.
    pub fn param<B: Backend, const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        device: &B::Device,
    ) -> Param<Tensor<B, D>> {
        Param::from_tensor(self.tensor(name, shape, device))
    }

    /// Drops tensors that are legitimately present but unused (e.g. a stored `lm_head.weight`
    /// equal to the tied embeddings).
    pub fn ignore(&mut self, name: &str) {
        self.tensors.remove(name);
    }

    /// Fails with one message naming every missing, mis-shaped and unexpected tensor.
    pub fn finish(self) -> Result<()> {
        let mut unexpected: Vec<&String> = self.tensors.keys().collect();
        unexpected.sort();
        if self.missing.is_empty() && self.misshaped.is_empty() && unexpected.is_empty() {
            return Ok(());
        }
        let mut msg = format!("weights of {} do not match the model:", self.source);
        if !self.missing.is_empty() {
            msg += &format!("\n  missing: {}", self.missing.join(", "));
        }
        if !self.misshaped.is_empty() {
            msg += &format!("\n  wrong shape: {}", self.misshaped.join("; "));
        }
        if !unexpected.is_empty() {
            let names: Vec<&str> = unexpected.iter().map(|s| s.as_str()).collect();
            msg += &format!("\n  unexpected: {}", names.join(", "));
        }
        bail!(msg)
    }
}

fn to_f32(dtype: Dtype, data: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => bail!("unsupported dtype {other:?} (expected F32, F16 or BF16)"),
    })
}

/// Host values of a tensor (any backend, any rank).
pub fn host_values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<HostTensor> {
    let shape = t.dims().to_vec();
    let values = t
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("reading tensor: {e:?}"))?;
    Ok(HostTensor { shape, values })
}

/// A model tensor listed under its Hugging Face name: a parameter of rank 1–3 (gradients can be
/// read from it) or a scalar buffer (stored with shape `[]`, or `[1]` for `layer_scalar`).
#[derive(Debug, Clone)]
pub enum NamedTensor<B: Backend> {
    R1(Tensor<B, 1>),
    R2(Tensor<B, 2>),
    R3(Tensor<B, 3>),
    /// A scalar stored with shape `[]`.
    Scalar(f32),
    /// A scalar stored with shape `[1]`.
    Scalar1(f32),
}

impl<B: Backend> NamedTensor<B> {
    /// Host copy with the shape the checkpoint stores.
    pub fn host(&self) -> Result<HostTensor> {
        match self {
            Self::R1(t) => host_values(t.clone()),
            Self::R2(t) => host_values(t.clone()),
            Self::R3(t) => host_values(t.clone()),
            Self::Scalar(v) => Ok(HostTensor {
                shape: vec![],
                values: vec![*v],
            }),
            Self::Scalar1(v) => Ok(HostTensor {
                shape: vec![1],
                values: vec![*v],
            }),
        }
    }
}

/// Every tensor of a model under its Hugging Face name, in model order.
#[derive(Debug, Clone)]
pub struct NamedTensors<B: Backend> {
    pub items: Vec<(String, NamedTensor<B>)>,
}

impl<B: Backend> Default for NamedTensors<B> {
    fn default() -> Self {
        Self { items: Vec::new() }
    }
}

impl<B: Backend> NamedTensors<B> {
    pub fn push(&mut self, name: String, t: NamedTensor<B>) {
        self.items.push((name, t));
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&NamedTensor<B>> {
        self.items.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// Host copies keyed by name.
    pub fn to_host(&self) -> Result<BTreeMap<String, HostTensor>> {
        self.items
            .iter()
            .map(|(n, t)| Ok((n.clone(), t.host()?)))
            .collect()
    }
}

/// Writes named f32 tensors to one safetensors file (names sorted, as `save_pretrained`).
pub fn write_safetensors(tensors: &BTreeMap<String, HostTensor>, path: &Path) -> Result<()> {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(name, t)| {
            let raw: Vec<u8> = t.values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (name.clone(), raw, t.shape.clone())
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(name, raw, shape)| {
            safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), raw)
                .map(|v| (name.clone(), v))
                .map_err(|e| anyhow::anyhow!("tensor `{name}`: {e}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    safetensors::serialize_to_file(views, Some(meta), path)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}
