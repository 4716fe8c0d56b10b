//! A value head on any family's model: the critic of PPO.
//!
//! verl's critic is `AutoModelForTokenClassification` with `num_labels = 1` loaded from a causal
//! LM checkpoint: the decoder's final (normed) hidden states go through a linear `score` head
//! `[1, hidden]` (+ bias `[1]`) instead of the LM head, one scalar value per position. Here the
//! head is a [`ValueHead`] beside a [`Model`] of any family ([`ValueModel`], one burn `Module`
//! so one optimizer steps both); its input width is the capability's `hidden_size()`, so no
//! family is named. The LM head of the backbone stays in the model (it gets no gradient).
//!
//! A fresh head is drawn as transformers' `_init_weights` draws `score`: weight N(0,
//! initializer_range²), bias 0 (seeded). The head is stored as its own safetensors file
//! ([`VALUE_HEAD_FILE`], tensors `score.weight` and `score.bias` in f32, transformers' names)
//! next to the backbone's Hugging Face files.
//!
//! The head computes in f32 whatever the backbone's precision (the hidden states are cast), as
//! the models compute their logits.
//!
//! A stored head is also read in Hugging Face's layout: `score.weight` `[1, hidden]` (and
//! `score.bias` `[1]`, 0 when absent) among the directory's weights (`model.safetensors` or the
//! shards of `model.safetensors.index.json`), as transformers' `*ForSequenceClassification` and
//! `*ForTokenClassification` checkpoints with `num_labels = 1` store it ([`stored_head`],
//! [`ValueHead::load_stored`]); the backbone is then read without those tensors
//! ([`load_backbone`]). Such a checkpoint has no `lm_head.weight`: the backbone loads when its
//! config ties the LM head to the embeddings (`tie_word_embeddings = true`), and is refused with
//! that explanation otherwise.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use burn::prelude::*;
use burn::tensor::DType;

use crate::checkpoint::{Checkpoint, INDEX_FILE, SINGLE_FILE, host_f32};
use crate::layers::Linear;
use crate::model::Model;
use crate::weights::{Init, Precision, RandomInit, WeightSink, WeightSource, Weights, zeros_data};

/// The file name of a stored value head.
pub const VALUE_HEAD_FILE: &str = "value_head.safetensors";

/// The head's tensors, in [`VALUE_HEAD_FILE`] and in Hugging Face's classification layout.
pub const HEAD_TENSORS: [&str; 2] = ["score.weight", "score.bias"];

/// Where a model directory stores a value head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredHead {
    /// [`VALUE_HEAD_FILE`] (flowrl's layout).
    File(PathBuf),
    /// `score.weight` among the Hugging Face weights (the file holding it), and `score.bias`
    /// when present (its file).
    HuggingFace {
        weight: PathBuf,
        bias: Option<PathBuf>,
    },
}

/// The value head `dir` stores, if any: [`VALUE_HEAD_FILE`], else `score.weight` in
/// `model.safetensors` or in a shard of `model.safetensors.index.json`. Reads file headers
/// only.
pub fn stored_head(dir: &Path) -> Result<Option<StoredHead>> {
    let file = dir.join(VALUE_HEAD_FILE);
    if file.is_file() {
        return Ok(Some(StoredHead::File(file)));
    }
    let index = dir.join(INDEX_FILE);
    let located: Vec<Option<PathBuf>> = if index.is_file() {
        let text = std::fs::read_to_string(&index)
            .with_context(|| format!("reading {}", index.display()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", index.display()))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .with_context(|| format!("{} has no `weight_map` object", index.display()))?;
        HEAD_TENSORS
            .iter()
            .map(|name| map.get(*name).and_then(|f| f.as_str()).map(|f| dir.join(f)))
            .collect()
    } else {
        let single = dir.join(SINGLE_FILE);
        if !single.is_file() {
            return Ok(None);
        }
        let names = tensor_names(&single)?;
        HEAD_TENSORS
            .iter()
            .map(|name| names.iter().any(|n| n == name).then(|| single.clone()))
            .collect()
    };
    Ok(match (&located[0], &located[1]) {
        (Some(weight), bias) => Some(StoredHead::HuggingFace {
            weight: weight.clone(),
            bias: bias.clone(),
        }),
        (None, _) => None,
    })
}

/// The tensor names in a safetensors file's header.
fn tensor_names(path: &Path) -> Result<Vec<String>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: the file is only read; a concurrent writer is outside this program's contract.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("mapping {}", path.display()))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&map)
        .with_context(|| format!("reading the header of {}", path.display()))?;
    Ok(meta.tensors().into_keys().collect())
}

/// Tensor `name` of the safetensors file `path` as f32 values, if it has shape `shape`
/// (stored F32, BF16 or F16).
fn read_f32(path: &Path, name: &str, shape: &[usize], hidden: usize) -> Result<Vec<f32>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: as in `tensor_names`.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("mapping {}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&map)
        .with_context(|| format!("parsing {}", path.display()))?;
    let t = st
        .tensor(name)
        .with_context(|| format!("{}: no tensor {name}", path.display()))?;
    ensure!(
        t.shape() == shape,
        "{}: {name} is {:?}, a value head needs {shape:?} (one label; hidden size {hidden})",
        path.display(),
        t.shape()
    );
    host_f32(&t).with_context(|| format!("{}: {name}", path.display()))
}

/// The backbone of a value model stored in `dir`, its weights in `precision`: as
/// [`Model::load_with_precision`], the head's tensors ([`HEAD_TENSORS`]) left to
/// [`ValueHead::load_stored`]. A checkpoint without `lm_head.weight` whose config does not tie
/// the LM head is refused naming both.
pub fn load_backbone<B: Backend>(
    dir: &Path,
    device: &B::Device,
    precision: Precision,
) -> Result<Model<B>> {
    let path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut ckpt = Checkpoint::<B>::open(dir, device, precision)?;
    for name in HEAD_TENSORS {
        WeightSource::<B>::ignore(&mut ckpt, name);
    }
    let model =
        Model::build_from(&text, &mut ckpt).with_context(|| format!("in {}", path.display()))?;
    ckpt.finish().map_err(|e| {
        if e.to_string().contains("missing tensor lm_head.weight") {
            e.context(format!(
                "{} has no lm_head.weight, as a `*ForSequenceClassification` checkpoint: its \
                 backbone loads when config.json ties the LM head to the embeddings \
                 (`tie_word_embeddings = true`), or with lm_head.weight added",
                dir.display()
            ))
        } else {
            e
        }
    })?;
    Ok(model)
}

/// `score`: hidden `[.., H]` → value `[..]` (`y = x·Wᵀ + b`, W `[1, H]`).
#[derive(Module, Debug)]
pub struct ValueHead<B: Backend> {
    pub score: Linear<B>,
}

impl<B: Backend> ValueHead<B> {
    /// A fresh head for hidden width `hidden`: weight N(0, std²), bias 0, deterministic in
    /// `seed` (transformers' init of `score` with `std` = the config's `initializer_range`).
    pub fn random(hidden: usize, std: f32, seed: u64, device: &B::Device) -> Self {
        let mut src = RandomInit::<B>::new(device, seed, std);
        Self::new(hidden, device).loaded(&mut src, "")
    }

    /// Input width `H`.
    pub fn hidden_size(&self) -> usize {
        self.score.weight.val().dims()[1]
    }

    /// Values `[b, T]` of hidden states `[b, T, H]` (cast to f32 first).
    pub fn forward(&self, hidden: Tensor<B, 3>) -> Tensor<B, 2> {
        let hidden = if hidden.dtype() == DType::F32 {
            hidden
        } else {
            hidden.cast(DType::F32)
        };
        let [b, t, _] = hidden.dims();
        self.score.forward(hidden).reshape([b, t])
    }

    /// A head of width `hidden` with placeholder weights (see [`crate::weights::Weights`]).
    fn new(hidden: usize, device: &B::Device) -> Self {
        Self {
            score: Linear::new(device, hidden, 1, true),
        }
    }

    /// Writes `score.weight` and `score.bias` (f32) to `path` as safetensors.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut sink = WeightSink::default();
        self.export_to(&mut sink, "");
        let stored = sink
            .into_tensors()
            .into_iter()
            .map(|(name, t)| {
                let shape = t.shape.to_vec();
                let values = t
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .map_err(|e| anyhow::anyhow!("reading the value head: {e:?}"))?;
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                Ok((name, shape, bytes))
            })
            .collect::<Result<Vec<_>>>()?;
        let views = stored
            .iter()
            .map(|(name, shape, bytes)| {
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .map(|v| (name.clone(), v))
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        safetensors::tensor::serialize_to_file(views, None, path)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Reads a head [`ValueHead::save`] wrote; its width must be `hidden`.
    pub fn load(path: &Path, hidden: usize, device: &B::Device) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .with_context(|| format!("parsing {}", path.display()))?;
        let mut file = HeadFile {
            st,
            path,
            hidden,
            device: device.clone(),
            error: None,
        };
        let head = Self::new(hidden, device).loaded(&mut file, "");
        match file.error {
            Some(e) => Err(e),
            None => Ok(head),
        }
    }
}

impl<B: Backend> ValueHead<B> {
    /// The head `dir` stores ([`stored_head`]), of width `hidden`; `None` when it stores none.
    pub fn load_stored(dir: &Path, hidden: usize, device: &B::Device) -> Result<Option<Self>> {
        Ok(match stored_head(dir)? {
            None => None,
            Some(StoredHead::File(path)) => Some(Self::load(&path, hidden, device)?),
            Some(StoredHead::HuggingFace { weight, bias }) => {
                let w = read_f32(&weight, HEAD_TENSORS[0], &[1, hidden], hidden)?;
                let b = match bias {
                    Some(path) => read_f32(&path, HEAD_TENSORS[1], &[1], hidden)?,
                    None => vec![0.0],
                };
                let weight = Tensor::<B, 2>::from_data(TensorData::new(w, [1, hidden]), device);
                let bias = Tensor::<B, 1>::from_data(TensorData::new(b, [1]), device);
                Some(Self {
                    score: Linear {
                        weight: burn::module::Param::from_tensor(weight),
                        bias: Some(burn::module::Param::from_tensor(bias)),
                        lora: None,
                    },
                })
            }
        })
    }
}

/// `score.weight` `[1, hidden]`, `score.bias` `[1]`.
impl<B: Backend> Weights<B> for ValueHead<B> {
    fn weights<W: crate::weights::WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        self.score
            .weights(w, &crate::weights::join(prefix, "score"));
    }
}

/// A stored value head as a [`WeightSource`]: F32 tensors of the layer's shapes, the first
/// problem kept (a head of the wrong width names the hidden size).
struct HeadFile<'a, B: Backend> {
    st: safetensors::SafeTensors<'a>,
    path: &'a Path,
    hidden: usize,
    device: B::Device,
    error: Option<anyhow::Error>,
}

impl<B: Backend> HeadFile<'_, B> {
    fn read(&self, name: &str, shape: &[usize]) -> Result<TensorData> {
        let (path, hidden) = (self.path.display(), self.hidden);
        let t = self
            .st
            .tensor(name)
            .with_context(|| format!("{path}: no tensor {name}"))?;
        ensure!(
            t.shape() == shape && t.dtype() == safetensors::Dtype::F32,
            "{path}: {name} is {:?} {:?}, the model needs F32 {shape:?} (hidden size {hidden})",
            t.dtype(),
            t.shape()
        );
        let values: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(TensorData::new(values, shape.to_vec()))
    }
}

impl<B: Backend> WeightSource<B> for HeadFile<'_, B> {
    fn device(&self) -> B::Device {
        self.device.clone()
    }

    fn take_data(&mut self, name: &str, shape: &[usize], _: Init) -> TensorData {
        self.read(name, shape).unwrap_or_else(|e| {
            self.error.get_or_insert(e);
            zeros_data(shape, DType::F32)
        })
    }

    fn ignore(&mut self, _: &str) {}
}

/// A model with a value head: the critic as one module (see the module doc).
#[derive(Module, Debug)]
pub struct ValueModel<B: Backend> {
    pub model: Model<B>,
    pub head: ValueHead<B>,
}

/// The `initializer_range` of a config.json text (under `text_config` or flat; 0.02 when absent,
/// transformers' default).
pub fn initializer_range(config_json: &str) -> f32 {
    let json: serde_json::Value = serde_json::from_str(config_json).unwrap_or_default();
    json.get("text_config")
        .and_then(|t| t.get("initializer_range"))
        .or_else(|| json.get("initializer_range"))
        .and_then(|v| v.as_f64())
        .unwrap_or(0.02) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn a_head_round_trips_and_maps_hidden_states_to_one_value_each() {
        let device = Default::default();
        let head = ValueHead::<Flex>::random(8, 0.02, 3, &device);
        assert_eq!(head.hidden_size(), 8);
        let w: Vec<f32> = head.score.weight.val().into_data().to_vec().unwrap();
        assert!(w.iter().any(|&x| x != 0.0) && w.iter().all(|x| x.abs() < 0.2));
        let again = ValueHead::<Flex>::random(8, 0.02, 3, &device);
        assert_eq!(
            again.score.weight.val().into_data(),
            head.score.weight.val().into_data()
        );

        let dir = std::env::temp_dir().join(format!("flowrl-value-head-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(VALUE_HEAD_FILE);
        head.save(&path).unwrap();
        let loaded = ValueHead::<Flex>::load(&path, 8, &device).unwrap();
        let e = ValueHead::<Flex>::load(&path, 9, &device).unwrap_err();
        assert!(e.to_string().contains("hidden size 9"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();

        let hidden = Tensor::<Flex, 1>::from_data(
            TensorData::new((0..2 * 3 * 8).map(|i| i as f32 / 10.0).collect(), [48]),
            &device,
        )
        .reshape([2, 3, 8]);
        let v = loaded.forward(hidden.clone());
        assert_eq!(v.dims(), [2, 3]);
        let got: Vec<f32> = v.into_data().to_vec().unwrap();
        let h: Vec<f32> = hidden.into_data().to_vec().unwrap();
        for (k, g) in got.iter().enumerate() {
            let want: f32 = (0..8).map(|j| h[k * 8 + j] * w[j]).sum();
            assert!((g - want).abs() < 1e-5, "{g} vs {want}");
        }
        assert_eq!(
            initializer_range(r#"{"text_config": {"initializer_range": 0.5}}"#),
            0.5
        );
        assert_eq!(initializer_range("{}"), 0.02);
    }

    /// Writes `tensors` (name, dtype, shape, little-endian bytes) to `path` as safetensors.
    fn write(path: &Path, tensors: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<_> = tensors
            .iter()
            .map(|(n, d, s, b)| {
                (
                    n.to_string(),
                    safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::tensor::serialize_to_file(views, None, path).unwrap();
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn a_head_is_read_from_hugging_face_classification_weights() {
        use safetensors::Dtype::{BF16, F32};
        let device = Default::default();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(stored_head(d).unwrap(), None);
        // One file, no bias: bias 0.
        let w = [0.5f32, -1.0, 2.0, 0.25];
        write(
            &d.join(SINGLE_FILE),
            &[
                ("score.weight", F32, vec![1, 4], f32_bytes(&w)),
                ("model.norm.weight", F32, vec![4], f32_bytes(&[1.0; 4])),
            ],
        );
        assert_eq!(
            stored_head(d).unwrap(),
            Some(StoredHead::HuggingFace {
                weight: d.join(SINGLE_FILE),
                bias: None
            })
        );
        let head = ValueHead::<Flex>::load_stored(d, 4, &device)
            .unwrap()
            .unwrap();
        let got: Vec<f32> = head.score.weight.val().into_data().to_vec().unwrap();
        assert_eq!(got, w);
        let bias: Vec<f32> = head.score.bias.unwrap().val().into_data().to_vec().unwrap();
        assert_eq!(bias, [0.0]);
        let e = ValueHead::<Flex>::load_stored(d, 8, &device).unwrap_err();
        assert!(e.to_string().contains("[1, 8]"), "{e}");
        // Shards of an index, the bias in BF16 in another shard than the weight.
        std::fs::remove_file(d.join(SINGLE_FILE)).unwrap();
        write(
            &d.join("model-00001-of-00002.safetensors"),
            &[("score.weight", F32, vec![1, 4], f32_bytes(&w))],
        );
        let b = half::bf16::from_f32(1.5).to_le_bytes().to_vec();
        write(
            &d.join("model-00002-of-00002.safetensors"),
            &[("score.bias", BF16, vec![1], b)],
        );
        std::fs::write(
            d.join(INDEX_FILE),
            r#"{"weight_map": {"score.weight": "model-00001-of-00002.safetensors",
                "score.bias": "model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let head = ValueHead::<Flex>::load_stored(d, 4, &device)
            .unwrap()
            .unwrap();
        let bias: Vec<f32> = head.score.bias.unwrap().val().into_data().to_vec().unwrap();
        assert_eq!(bias, [1.5]);
        // Two labels are not a value head.
        write(
            &d.join("model-00001-of-00002.safetensors"),
            &[("score.weight", F32, vec![2, 4], f32_bytes(&[0.0; 8]))],
        );
        let e = ValueHead::<Flex>::load_stored(d, 4, &device).unwrap_err();
        assert!(e.to_string().contains("[1, 4]"), "{e}");
        // value_head.safetensors comes first.
        ValueHead::<Flex>::random(4, 0.02, 1, &device)
            .save(&d.join(VALUE_HEAD_FILE))
            .unwrap();
        assert_eq!(
            stored_head(d).unwrap(),
            Some(StoredHead::File(d.join(VALUE_HEAD_FILE)))
        );
    }

    #[test]
    fn the_backbone_of_a_classification_checkpoint_is_read_without_its_head() {
        let device = Default::default();
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/reward_model/model");
        let e = Model::<Flex>::load(&fixture, &device).unwrap_err();
        assert!(
            e.to_string().contains("unexpected tensor score.weight"),
            "{e}"
        );
        load_backbone::<Flex>(&fixture, &device, Precision::F32).unwrap();
        // Without lm_head.weight, an untied config is refused with the reason.
        let dir = tempfile::tempdir().unwrap();
        for f in std::fs::read_dir(&fixture).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
        }
        let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        let untied = config.replace(
            "\"tie_word_embeddings\": true",
            "\"tie_word_embeddings\": false",
        );
        assert_ne!(config, untied);
        std::fs::write(dir.path().join("config.json"), untied).unwrap();
        let e = load_backbone::<Flex>(dir.path(), &device, Precision::F32).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("has no lm_head.weight") && e.contains("tie_word_embeddings = true"),
            "{e}"
        );
    }
}
