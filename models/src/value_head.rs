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

use std::path::Path;

use anyhow::{Context, Result, ensure};
use burn::prelude::*;
use burn::tensor::DType;

use crate::layers::Linear;
use crate::model::Model;
use crate::weights::{Init, RandomInit, WeightSink, WeightSource, Weights, zeros_data};

/// The file name of a stored value head.
pub const VALUE_HEAD_FILE: &str = "value_head.safetensors";

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
}
