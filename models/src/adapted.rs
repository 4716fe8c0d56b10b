//! [`Model`] with LoRA adapters: a checkpoint loaded (or drawn) with adapters attached, fresh
//! or from a PEFT directory; the adapters read, frozen around and replaced; and saved, in PEFT's
//! layout or folded into the base weights. The adapter itself, its configuration and PEFT's
//! files are [`crate::lora`]'s.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{Context, Result, ensure};
use burn::module::{ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;

use crate::checkpoint::Checkpoint;
use crate::lora::{
    AdapterInit, AdapterTensors, Lora, LoraConfig, LoraSource, StoredAdapter, write_peft_adapter,
};
use crate::model::Model;
use crate::weights::{Precision, RandomInit, ShapeOnly, WeightVisitor, normalize_name};

/// Collects the adapters of a model (ignoring the base weights).
#[derive(Default)]
struct AdapterCollector {
    host: Vec<AdapterTensors>,
    ids: Vec<(String, ParamId, ParamId)>,
    copy_values: bool,
}

impl<B: Backend> WeightVisitor<B> for AdapterCollector {
    fn put<const D: usize>(&mut self, _name: &str, _t: Tensor<B, D>) {}

    fn put_lora(&mut self, module: &str, lora: &Lora<B>) {
        self.ids.push((module.to_string(), lora.a.id, lora.b.id));
        if self.copy_values {
            let host = |t: Tensor<B, 2>| {
                let shape = t.dims().to_vec();
                let values = t
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .expect("f32 tensor data");
                (shape, values)
            };
            self.host.push(AdapterTensors {
                module: module.to_string(),
                a: host(lora.a.val()),
                b: host(lora.b.val()),
            });
        }
    }
}

impl<B: Backend> Model<B> {
    /// Loads the Hugging Face directory `dir` with adapters attached to the linears `config`
    /// matches (module doc), filled by `init`; the base weights in `precision` and frozen
    /// (`require_grad` off: only the adapters, f32, get gradients and optimizer state). Returns
    /// the model and the adapted module names. Targets that match nothing and stored adapters
    /// that do not fit are errors.
    pub fn load_adapted(
        dir: &Path,
        device: &B::Device,
        precision: Precision,
        config: &LoraConfig,
        init: AdapterInit,
    ) -> Result<(Self, Vec<String>)> {
        config.validate()?;
        let path = dir.join("config.json");
        let config_json = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        // Targets and stored adapters are checked against a shape-only build before any weight
        // is read.
        {
            let mut shapes = ShapeOnly::<B>::new(device, precision);
            let mut dry = LoraSource::new(&mut shapes, config.clone(), init.clone());
            Self::build_from(&config_json, &mut dry)
                .with_context(|| format!("in {}", path.display()))?;
            dry.finish()?;
        }
        let mut ckpt = Checkpoint::<B>::open(dir, device, precision)?;
        let mut src = LoraSource::new(&mut ckpt, config.clone(), init);
        let model = Self::build_from(&config_json, &mut src)
            .with_context(|| format!("in {}", path.display()))?;
        let adapted = src.finish()?;
        ckpt.finish()?;
        Ok((model.freeze_base(), adapted))
    }

    /// [`Model::load_adapted`] on random base weights drawn from `config_json` (tests,
    /// benchmarks).
    pub fn random_adapted(
        config_json: &str,
        device: &B::Device,
        seed: u64,
        precision: Precision,
        config: &LoraConfig,
        init: AdapterInit,
    ) -> Result<(Self, Vec<String>)> {
        config.validate()?;
        let json: serde_json::Value = serde_json::from_str(config_json)?;
        let std = json
            .get("text_config")
            .and_then(|t| t.get("initializer_range"))
            .or_else(|| json.get("initializer_range"))
            .and_then(|v| v.as_f64())
            .unwrap_or(0.02) as f32;
        let mut random = RandomInit::<B>::new(device, seed, std).with_precision(precision);
        let mut src = LoraSource::new(&mut random, config.clone(), init);
        let model = Self::build_from(config_json, &mut src)?;
        let adapted = src.finish()?;
        Ok((model.freeze_base(), adapted))
    }

    /// Whether any linear carries an adapter.
    pub fn has_adapters(&self) -> bool {
        !self.adapter_ids().is_empty()
    }

    /// `(module, A's id, B's id)` of every adapter, in build order.
    pub fn adapter_ids(&self) -> Vec<(String, ParamId, ParamId)> {
        let mut c = AdapterCollector::default();
        self.export(&mut c);
        c.ids
    }

    /// Host copies of every adapter (for writing them in PEFT's layout).
    pub fn adapters(&self) -> Vec<AdapterTensors> {
        let mut c = AdapterCollector {
            copy_values: true,
            ..Default::default()
        };
        self.export(&mut c);
        c.host
    }

    /// Every parameter but the adapters' with `require_grad` off.
    pub fn freeze_base(self) -> Self {
        let keep: HashSet<ParamId> = self
            .adapter_ids()
            .into_iter()
            .flat_map(|(_, a, b)| [a, b])
            .collect();
        struct Freeze(HashSet<ParamId>);
        impl<B: Backend> ModuleMapper<B> for Freeze {
            fn map_float<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D>>,
            ) -> Param<Tensor<B, D>> {
                if self.0.contains(&param.id) {
                    param
                } else {
                    param.set_require_grad(false)
                }
            }
        }
        self.map(&mut Freeze(keep))
    }

    /// The base model's function: every adapter's `B` replaced by zeros, so each adapted linear
    /// computes `x·Wᵀ + b + 0` — exactly the base's output, with no copy of the base weights (a
    /// reference model `from` a LoRA policy).
    pub fn adapters_off(self) -> Self {
        let bs: HashSet<ParamId> = self.adapter_ids().into_iter().map(|(_, _, b)| b).collect();
        struct Zero(HashSet<ParamId>);
        impl<B: Backend> ModuleMapper<B> for Zero {
            fn map_float<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D>>,
            ) -> Param<Tensor<B, D>> {
                if self.0.contains(&param.id) {
                    param.map(|t| t.zeros_like())
                } else {
                    param
                }
            }
        }
        self.map(&mut Zero(bs))
    }

    /// Replaces the adapters' values by those of `stored` (restoring a checkpoint or loading a
    /// PEFT adapter into an adapted model), parameter ids kept; an error when a module is
    /// missing from `stored` or its shapes differ.
    pub fn set_adapters(self, mut stored: StoredAdapter) -> Result<Self> {
        let device = self.devices().into_iter().next();
        let mut values: HashMap<ParamId, TensorData> = HashMap::new();
        let mut problems = Vec::new();
        let ids = self.adapter_ids();
        let shapes: HashMap<ParamId, Vec<usize>> = {
            struct Shapes(HashMap<ParamId, Vec<usize>>);
            impl<B: Backend> ModuleVisitor<B> for Shapes {
                fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                    self.0
                        .insert(param.id, param.lazy_shape().dims::<D>().to_vec());
                }
            }
            let mut s = Shapes(HashMap::new());
            self.visit(&mut s);
            s.0
        };
        for (module, a, b) in &ids {
            match stored.tensors.remove(&normalize_name(module)) {
                None => problems.push(format!("no weights for module {module}")),
                Some(((sa, va), (sb, vb))) => {
                    if shapes.get(a) != Some(&sa) || shapes.get(b) != Some(&sb) {
                        problems.push(format!(
                            "module {module}: lora_A {sa:?} and lora_B {sb:?}, the model has {:?} and {:?}",
                            shapes.get(a),
                            shapes.get(b)
                        ));
                        continue;
                    }
                    values.insert(*a, TensorData::new(va, sa));
                    values.insert(*b, TensorData::new(vb, sb));
                }
            }
        }
        if !stored.tensors.is_empty() {
            problems.push(format!(
                "{} module(s) of the adapter are not adapted in this model (e.g. {})",
                stored.tensors.len(),
                stored.tensors.keys().next().expect("non-empty")
            ));
        }
        ensure!(
            problems.is_empty(),
            "the adapter in {} does not fit this model:\n  {}",
            stored.dir,
            problems.join("\n  ")
        );
        let Some(device) = device else {
            return Ok(self);
        };
        struct Set<B: Backend>(HashMap<ParamId, TensorData>, B::Device);
        impl<B: Backend> ModuleMapper<B> for Set<B> {
            fn map_float<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D>>,
            ) -> Param<Tensor<B, D>> {
                match self.0.remove(&param.id) {
                    Some(data) => {
                        let device = self.1.clone();
                        param.map(|t| {
                            let require_grad = t.is_require_grad();
                            let dtype = t.dtype();
                            Tensor::from_data(data, (&device, dtype)).set_require_grad(require_grad)
                        })
                    }
                    None => param,
                }
            }
        }
        Ok(self.map(&mut Set::<B>(values, device)))
    }

    /// Writes the adapters in PEFT's layout into `dir` ([`write_peft_adapter`]).
    pub fn save_adapter(&self, dir: &Path, config: &LoraConfig, base_model: &str) -> Result<()> {
        let adapters = self.adapters();
        ensure!(!adapters.is_empty(), "the model has no LoRA adapters");
        write_peft_adapter(dir, config, &adapters, base_model)
    }

    /// Writes the model with every adapter folded into its base weight (`W + s·B·A`) as a
    /// Hugging Face directory loadable without PEFT, each weight converted to `precision` (its
    /// own dtype when `None`), streamed shard by shard like [`Model::save_as`].
    pub fn save_merged_as(
        &self,
        dir: &Path,
        max_shard_bytes: Option<usize>,
        precision: Option<Precision>,
    ) -> Result<()> {
        self.save_streamed(dir, max_shard_bytes, precision, true)
    }
}
