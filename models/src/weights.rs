//! Hugging Face weights: reading safetensors checkpoints (one file, or shards listed by
//! `model.safetensors.index.json`), random initialisation from a config, and writing a model
//! back in the Hugging Face layout.
//!
//! Layers ask a [`WeightSource`] for each tensor by checkpoint name and shape; the checkpoint
//! source records every missing, mis-shaped and (at the end) unexpected tensor and reports them
//! all in one error. Names are normalised to the legacy hub layout (`visual.*`, `model.*`,
//! `lm_head.*`): transformers-5 module names `model.visual.X` and `model.language_model.X` are
//! accepted as `visual.X` and `model.X`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::backend::AutodiffBackend;
use rand::{Rng, SeedableRng, rngs::StdRng};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

/// How a randomly initialised tensor is filled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Linear weights: N(0, std²) with the config's `initializer_range`.
    Matrix,
    /// Embedding tables: N(0, std²).
    Embedding,
    Zeros,
    Ones,
    /// Every value equal to this constant (e.g. ±∞ clip bounds of Gemma 4's vision linears).
    Const(f32),
}

/// Floating-point precision of a model's weights (and so of its activations; norms, softmax and
/// logits are computed in f32 whatever the precision, as transformers does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    #[default]
    F32,
    BF16,
    F16,
}

impl Precision {
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::BF16 => DType::BF16,
            Precision::F16 => DType::F16,
        }
    }

    /// `"f32"`, `"bf16"` or `"f16"` (also `"float32"`, `"bfloat16"`, `"float16"`).
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "f32" | "float32" => Ok(Precision::F32),
            "bf16" | "bfloat16" => Ok(Precision::BF16),
            "f16" | "float16" => Ok(Precision::F16),
            other => bail!("unknown precision `{other}`; expected f32, bf16 or f16"),
        }
    }
}

/// Where layers get their weights from.
pub trait WeightSource<B: Backend> {
    fn device(&self) -> B::Device;
    /// Float dtype of the created weights.
    fn dtype(&self) -> DType {
        DType::F32
    }
    /// Host values of tensor `name` with `shape` (row-major f32).
    fn take_data(&mut self, name: &str, shape: &[usize], init: Init) -> Vec<f32>;
    /// Marks `name` as consumed if present (e.g. a stored `lm_head.weight` of a tied model).
    fn ignore(&mut self, name: &str);
}

impl<B: Backend> dyn WeightSource<B> + '_ {
    /// Tensor `name` of rank D.
    pub fn take<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        init: Init,
    ) -> Tensor<B, D> {
        let data = self.take_data(name, &shape, init);
        Tensor::from_data(TensorData::new(data, shape), (&self.device(), self.dtype()))
    }

    pub fn take1(&mut self, name: &str, shape: [usize; 1], init: Init) -> Tensor<B, 1> {
        self.take(name, shape, init)
    }

    pub fn take2(&mut self, name: &str, shape: [usize; 2], init: Init) -> Tensor<B, 2> {
        self.take(name, shape, init)
    }
}

/// Maps transformers-5 module names onto the legacy hub names.
pub fn normalize_name(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("model.visual.") {
        format!("visual.{rest}")
    } else if let Some(rest) = name.strip_prefix("model.language_model.") {
        format!("model.{rest}")
    } else {
        name.to_string()
    }
}

/// One stored tensor: shape and f32 values.
struct Stored {
    shape: Vec<usize>,
    values: Vec<f32>,
}

/// Weights read from a Hugging Face directory.
pub struct Checkpoint<B: Backend> {
    device: B::Device,
    /// Tensors not taken yet.
    tensors: HashMap<String, Stored>,
    missing: Vec<String>,
    misshaped: Vec<String>,
    dir: String,
    precision: Precision,
}

impl<B: Backend> Checkpoint<B> {
    /// Reads `model.safetensors`, or every shard named by `model.safetensors.index.json`.
    /// F32, BF16 and F16 tensors are converted to f32.
    pub fn open(dir: &Path, device: &B::Device) -> Result<Self> {
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
            let mut names = BTreeSet::new();
            for (tensor, file) in map {
                let file = file.as_str().with_context(|| {
                    format!("{}: weight_map[{tensor}] is not a string", index.display())
                })?;
                names.insert(file.to_string());
            }
            names.into_iter().map(|f| dir.join(f)).collect()
        } else {
            let single = dir.join("model.safetensors");
            ensure!(
                single.exists(),
                "{} has neither model.safetensors nor model.safetensors.index.json",
                dir.display()
            );
            vec![single]
        };
        let mut tensors = HashMap::new();
        for file in &files {
            let bytes =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let st = SafeTensors::deserialize(&bytes)
                .with_context(|| format!("parsing safetensors {}", file.display()))?;
            for (name, view) in st.tensors() {
                let values =
                    to_f32(&view).with_context(|| format!("{}: tensor {name}", file.display()))?;
                tensors.insert(
                    normalize_name(&name),
                    Stored {
                        shape: view.shape().to_vec(),
                        values,
                    },
                );
            }
        }
        Ok(Self {
            device: device.clone(),
            tensors,
            missing: Vec::new(),
            misshaped: Vec::new(),
            dir: dir.display().to_string(),
            precision: Precision::F32,
        })
    }

    /// Creates the weights in `precision` (default f32).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// Every missing, mis-shaped or unexpected tensor, in one error.
    pub fn finish(self) -> Result<()> {
        let unexpected: BTreeSet<&String> = self.tensors.keys().collect();
        if self.missing.is_empty() && self.misshaped.is_empty() && unexpected.is_empty() {
            return Ok(());
        }
        let mut msg = format!("checkpoint {} does not match the model config:", self.dir);
        for m in &self.missing {
            msg.push_str(&format!("\n  missing tensor {m}"));
        }
        for m in &self.misshaped {
            msg.push_str(&format!("\n  {m}"));
        }
        for u in unexpected {
            msg.push_str(&format!(
                "\n  unexpected tensor {u} {:?}",
                self.tensors[u].shape
            ));
        }
        bail!(msg)
    }
}

fn to_f32(view: &TensorView<'_>) -> Result<Vec<f32>> {
    let data = view.data();
    Ok(match view.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => bail!("unsupported dtype {other:?} (expected F32, BF16 or F16)"),
    })
}

impl<B: Backend> WeightSource<B> for Checkpoint<B> {
    fn device(&self) -> B::Device {
        self.device.clone()
    }

    fn dtype(&self) -> DType {
        self.precision.dtype()
    }

    fn take_data(&mut self, name: &str, shape: &[usize], _init: Init) -> Vec<f32> {
        let n = shape.iter().product();
        // Taken tensors leave the map (no second copy in memory); what remains is unexpected.
        match self.tensors.remove(name) {
            None => {
                self.missing.push(format!("{name} {shape:?}"));
                vec![0.0; n]
            }
            Some(stored) if stored.shape != shape => {
                self.misshaped.push(format!(
                    "mis-shaped tensor {name}: checkpoint {:?}, config expects {shape:?}",
                    stored.shape
                ));
                vec![0.0; n]
            }
            Some(stored) => stored.values,
        }
    }

    fn ignore(&mut self, name: &str) {
        self.tensors.remove(name);
    }
}

/// Random weights: normal matrices and embeddings with standard deviation `std`
/// (the config's `initializer_range`), zero biases, unit norm weights (HF `_init_weights`).
pub struct RandomInit<B: Backend> {
    device: B::Device,
    rng: StdRng,
    std: f32,
    precision: Precision,
}

impl<B: Backend> RandomInit<B> {
    pub fn new(device: &B::Device, seed: u64, std: f32) -> Self {
        Self {
            device: device.clone(),
            rng: StdRng::seed_from_u64(seed),
            std,
            precision: Precision::F32,
        }
    }

    /// Creates the weights in `precision` (default f32).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// One standard normal draw (Box–Muller).
    fn normal(&mut self) -> f32 {
        let u1: f64 = self.rng.random::<f64>().max(f64::MIN_POSITIVE);
        let u2: f64 = self.rng.random::<f64>();
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
}

impl<B: Backend> WeightSource<B> for RandomInit<B> {
    fn device(&self) -> B::Device {
        self.device.clone()
    }

    fn dtype(&self) -> DType {
        self.precision.dtype()
    }

    fn take_data(&mut self, _name: &str, shape: &[usize], init: Init) -> Vec<f32> {
        let n: usize = shape.iter().product();
        match init {
            Init::Zeros => vec![0.0; n],
            Init::Ones => vec![1.0; n],
            Init::Const(c) => vec![c; n],
            Init::Matrix | Init::Embedding => (0..n).map(|_| self.normal() * self.std).collect(),
        }
    }

    fn ignore(&mut self, _name: &str) {}
}

/// Receives every weight of a model under its checkpoint name (models' `export` methods call
/// it once per tensor, so names are written in one place per layer).
pub trait WeightVisitor<B: Backend> {
    fn put<const D: usize>(&mut self, name: &str, t: Tensor<B, D>);

    /// A host-side buffer that is not a parameter, stored with `shape` (`[]` for a scalar), e.g.
    /// Gemma 4's clip bounds and layer scalars. Ignored by default (no gradients).
    fn put_buffer(&mut self, name: &str, shape: &[usize], values: &[f32]) {
        let _ = (name, shape, values);
    }
}

fn host_values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 tensor data")
}

/// Named host tensors collected from a model for saving.
#[derive(Default)]
pub struct WeightSink {
    tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

impl<B: Backend> WeightVisitor<B> for WeightSink {
    fn put<const D: usize>(&mut self, name: &str, t: Tensor<B, D>) {
        let shape = t.dims().to_vec();
        self.tensors
            .insert(name.to_string(), (shape, host_values(t)));
    }

    fn put_buffer(&mut self, name: &str, shape: &[usize], values: &[f32]) {
        self.tensors
            .insert(name.to_string(), (shape.to_vec(), values.to_vec()));
    }
}

/// Gradients of a model's weights by checkpoint name (host f32, row-major), after `backward()`.
/// A weight without a gradient is absent.
pub struct GradCollector<'a, B: AutodiffBackend> {
    grads: &'a B::Gradients,
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

impl<'a, B: AutodiffBackend> GradCollector<'a, B> {
    pub fn new(grads: &'a B::Gradients) -> Self {
        Self {
            grads,
            tensors: BTreeMap::new(),
        }
    }
}

impl<B: AutodiffBackend> WeightVisitor<B> for GradCollector<'_, B> {
    fn put<const D: usize>(&mut self, name: &str, t: Tensor<B, D>) {
        if let Some(g) = t.grad(self.grads) {
            self.tensors
                .insert(name.to_string(), (g.dims().to_vec(), host_values(g)));
        }
    }
}

impl WeightSink {
    /// Shape and values of tensor `name`.
    pub fn get(&self, name: &str) -> Option<(&[usize], &[f32])> {
        self.tensors
            .get(name)
            .map(|(s, v)| (s.as_slice(), v.as_slice()))
    }

    /// Names and shapes collected so far.
    pub fn shapes(&self) -> impl Iterator<Item = (&str, &[usize])> {
        self.tensors
            .iter()
            .map(|(k, (s, _))| (k.as_str(), s.as_slice()))
    }

    /// Writes F32 safetensors into `dir`: `model.safetensors`, or, when the tensors exceed
    /// `max_shard_bytes`, shards `model-0000k-of-0000n.safetensors` plus
    /// `model.safetensors.index.json` (the `save_pretrained` layout).
    pub fn write(&self, dir: &Path, max_shard_bytes: Option<usize>) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let limit = max_shard_bytes.unwrap_or(usize::MAX);
        let mut shards: Vec<Vec<&String>> = vec![Vec::new()];
        let mut size = 0usize;
        for (name, (_, values)) in &self.tensors {
            let bytes = values.len() * 4;
            if size > 0 && size + bytes > limit {
                shards.push(Vec::new());
                size = 0;
            }
            shards.last_mut().expect("one shard").push(name);
            size += bytes;
        }
        let n = shards.len();
        let mut weight_map = serde_json::Map::new();
        let mut total = 0usize;
        for (k, names) in shards.iter().enumerate() {
            let file = if n == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", k + 1, n)
            };
            let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = names
                .iter()
                .map(|name| {
                    let (shape, values) = &self.tensors[*name];
                    let b: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                    ((*name).clone(), b, shape.clone())
                })
                .collect();
            let views: Vec<(String, TensorView<'_>)> = bytes
                .iter()
                .map(|(name, b, shape)| {
                    total += b.len();
                    weight_map.insert(name.clone(), serde_json::Value::String(file.clone()));
                    Ok((
                        name.clone(),
                        TensorView::new(Dtype::F32, shape.clone(), b)
                            .with_context(|| format!("tensor {name}"))?,
                    ))
                })
                .collect::<Result<_>>()?;
            let mut meta = HashMap::new();
            meta.insert("format".to_string(), "pt".to_string());
            let path = dir.join(&file);
            safetensors::serialize_to_file(views, Some(meta), &path)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        let index = dir.join("model.safetensors.index.json");
        if n > 1 {
            let json = serde_json::json!({
                "metadata": { "total_size": total },
                "weight_map": weight_map,
            });
            std::fs::write(&index, serde_json::to_string_pretty(&json)?)
                .with_context(|| format!("writing {}", index.display()))?;
        } else if index.exists() {
            std::fs::remove_file(&index)
                .with_context(|| format!("removing stale {}", index.display()))?;
        }
        Ok(())
    }
}
