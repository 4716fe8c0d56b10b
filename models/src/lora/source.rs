//! Attaching adapters while a model is built ([`LoraSource`], a weight source over the base
//! weights) and folding them in on export ([`Merged`]).

use std::collections::{BTreeMap, HashMap};

use anyhow::{Result, bail};
use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;
use rand::{Rng, SeedableRng, rngs::StdRng};

use super::adapter::Lora;
use super::config::{LoraConfig, entry_matches, in_vision_tower};
use crate::weights::{Init, WeightSource, WeightVisitor, normalize_name};

/// A host tensor: shape and f32 values.
pub(crate) type HostTensor = (Vec<usize>, Vec<f32>);

/// Adapter weights read from a PEFT directory, by normalised module name.
#[derive(Clone)]
pub struct StoredAdapter {
    /// The directory, for messages.
    pub dir: String,
    /// `(A [r, in], B [out, r])` by normalised module name.
    pub(crate) tensors: HashMap<String, (HostTensor, HostTensor)>,
}

/// How the adapters of a build are filled.
#[derive(Clone)]
pub enum AdapterInit {
    /// PEFT's initialisation (module doc), drawn from this seed.
    Fresh(u64),
    /// The weights of a stored adapter: exactly its modules are adapted, and each must exist in
    /// the model with its shapes.
    Stored(StoredAdapter),
}

/// A weight source that attaches adapters to the linears `config` matches while delegating the
/// base weights to `inner`. [`LoraSource::finish`] reports targets that matched nothing (naming
/// the modules that exist) and stored adapter weights that do not fit.
pub struct LoraSource<'a, B: Backend> {
    inner: &'a mut dyn WeightSource<B>,
    config: LoraConfig,
    init: AdapterInit,
    rng: StdRng,
    /// Every linear seen, in build order.
    linears: Vec<String>,
    adapted: Vec<String>,
    problems: Vec<String>,
}

impl<'a, B: Backend> LoraSource<'a, B> {
    pub fn new(inner: &'a mut dyn WeightSource<B>, config: LoraConfig, init: AdapterInit) -> Self {
        let seed = match &init {
            AdapterInit::Fresh(seed) => *seed,
            AdapterInit::Stored(_) => 0,
        };
        Self {
            inner,
            config,
            init,
            rng: StdRng::seed_from_u64(seed),
            linears: Vec::new(),
            adapted: Vec::new(),
            problems: Vec::new(),
        }
    }

    /// The names of the adapted modules, in build order; an error when a target matched no
    /// module, or a stored adapter does not fit the model.
    pub fn finish(self) -> Result<Vec<String>> {
        let mut problems = self.problems;
        let fresh = matches!(self.init, AdapterInit::Fresh(_));
        for entry in self.config.target_modules.iter().filter(|_| fresh) {
            let hit = self
                .linears
                .iter()
                .any(|m| entry_matches(entry, m, in_vision_tower(m)));
            if !hit {
                problems.push(format!(
                    "LoRA target `{entry}` matches no linear module of this model; its linear modules are: {}",
                    module_summary(&self.linears)
                ));
            }
        }
        if let AdapterInit::Stored(stored) = &self.init {
            // Taken entries left the map: what remains names modules this model lacks.
            let unused: Vec<&String> = stored.tensors.keys().collect();
            if !unused.is_empty() {
                problems.push(format!(
                    "the adapter in {} has weights for {} module(s) this model does not have (e.g. {}): \
                     it was made for another base model",
                    stored.dir,
                    unused.len(),
                    unused.iter().take(3).map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                ));
            }
        }
        if !problems.is_empty() {
            const SHOWN: usize = 5;
            let more = problems.len().saturating_sub(SHOWN);
            problems.truncate(SHOWN);
            if more > 0 {
                problems.push(format!("... and {more} more"));
            }
            bail!(problems.join("\n"));
        }
        Ok(self.adapted)
    }

    fn fresh(&mut self, in_dim: usize, out_dim: usize) -> (Vec<f32>, Vec<f32>) {
        let r = self.config.rank;
        let bound = 1.0 / (in_dim as f64).sqrt();
        let a = (0..r * in_dim)
            .map(|_| self.rng.random_range(-bound..bound) as f32)
            .collect();
        (a, vec![0.0; out_dim * r])
    }
}

/// Leaf names of the linear modules (`q_proj`, `gate_proj`, …), vision-tower ones marked.
fn module_summary(linears: &[String]) -> String {
    let mut leaves: BTreeMap<String, bool> = BTreeMap::new();
    for m in linears {
        let leaf = m.rsplit('.').next().unwrap_or(m).to_string();
        let vision = in_vision_tower(m);
        leaves
            .entry(leaf)
            .and_modify(|v| *v &= vision)
            .or_insert(vision);
    }
    leaves
        .iter()
        .map(|(leaf, vision)| {
            if *vision {
                format!("{leaf} (vision tower)")
            } else {
                leaf.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl<B: Backend> WeightSource<B> for LoraSource<'_, B> {
    fn device(&self) -> B::Device {
        self.inner.device()
    }

    fn dtype(&self) -> DType {
        self.inner.dtype()
    }

    fn take_data(&mut self, name: &str, shape: &[usize], init: Init) -> TensorData {
        self.inner.take_data(name, shape, init)
    }

    fn placeholders(&self) -> bool {
        self.inner.placeholders()
    }

    fn placeholder(&mut self, name: &str, shape: &[usize]) -> bool {
        self.inner.placeholder(name, shape)
    }

    fn ignore(&mut self, name: &str) {
        self.inner.ignore(name)
    }

    fn lora_adapter(&mut self, module: &str, in_dim: usize, out_dim: usize) -> Option<Lora<B>> {
        self.linears.push(module.to_string());
        // A stored adapter adapts exactly the modules it has weights for.
        let adapt = match &self.init {
            AdapterInit::Fresh(_) => self.config.matches(module, in_vision_tower(module)),
            AdapterInit::Stored(stored) => stored.tensors.contains_key(&normalize_name(module)),
        };
        if !adapt {
            return None;
        }
        self.adapted.push(module.to_string());
        let r = self.config.rank;
        let (a, b) = match &mut self.init {
            AdapterInit::Fresh(_) => self.fresh(in_dim, out_dim),
            AdapterInit::Stored(stored) => match stored.tensors.remove(&normalize_name(module)) {
                None => unreachable!("adapted because the adapter holds {module}"),
                Some(((sa, a), (sb, b))) => {
                    if sa != [r, in_dim] || sb != [out_dim, r] {
                        self.problems.push(format!(
                            "the adapter in {} does not fit module {module}: lora_A {sa:?} and lora_B {sb:?}, \
                             the model needs [{r}, {in_dim}] and [{out_dim}, {r}] (an adapter made for another base model?)",
                            stored.dir
                        ));
                        (vec![0.0; r * in_dim], vec![0.0; out_dim * r])
                    } else {
                        (a, b)
                    }
                }
            },
        };
        let device = self.device();
        // Adapters are trained: f32 masters whatever the base's dtype.
        let a = Tensor::<B, 2>::from_data(TensorData::new(a, [r, in_dim]), (&device, DType::F32));
        let b = Tensor::<B, 2>::from_data(TensorData::new(b, [out_dim, r]), (&device, DType::F32));
        Some(Lora {
            a: Param::from_tensor(a),
            b: Param::from_tensor(b),
            scaling: self.config.scaling(),
            dropout: self.config.dropout,
        })
    }
}

/// Passes every weight to the wrapped visitor with adapters folded in (the merged model).
pub struct Merged<'a, V>(pub &'a mut V);

impl<B: Backend, V: WeightVisitor<B>> WeightVisitor<B> for Merged<'_, V> {
    fn put<const D: usize>(&mut self, name: &str, t: Tensor<B, D>) {
        self.0.put(name, t)
    }

    fn put_buffer(&mut self, name: &str, shape: &[usize], values: &[f32]) {
        self.0.put_buffer(name, shape, values)
    }

    fn merges_adapters(&self) -> bool {
        true
    }

    fn wants(&self, name: &str) -> bool {
        self.0.wants(name)
    }
}
