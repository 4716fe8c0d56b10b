//! LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") with
//! PEFT's semantics, so adapters move between flowrl and `peft` unchanged.
//!
//! A linear map `y = x·Wᵀ + b` of `[out, in]` weight gets two trainable matrices `A` `[r, in]` and
//! `B` `[out, r]`:
//!
//! ```text
//! y = x·Wᵀ + b + s · dropout(x)·Aᵀ·Bᵀ        s = alpha / r
//! ```
//!
//! as PEFT's `lora.Linear.forward` (`use_rslora = false`). A fresh adapter has
//! `A ~ U(−1/√in, 1/√in)` (PEFT's `kaiming_uniform_(a=√5)` on a `[r, in]` weight) and `B = 0`, so
//! an adapted model starts exactly at its base. Merging folds the adapter into the base weight:
//! `W' = W + s·B·A` (PEFT's `merge_and_unload`).
//!
//! Which linears get adapters ([`LoraConfig::matches`]): PEFT's rule for a list of
//! `target_modules` — a module whose name equals an entry or ends with `"." + entry` — where
//! `"all-linear"` means every linear but the output layer (`lm_head`). Vision-tower modules are
//! excluded unless an entry names the tower (an entry that starts with a tower prefix such as
//! `visual.` or `model.vision_tower.`), as EasyR1 does with `exclude_modules = ".*visual.*"`.
//!
//! Adapters are attached while a model is built: loading a [`Linear`](crate::layers::Linear)
//! ([`crate::weights::Load`]) asks its weight source
//! ([`crate::weights::WeightSource::lora_adapter`]) and [`LoraSource`] answers
//! for the modules that match, with fresh weights or with those of a stored PEFT adapter. Files
//! are in PEFT's layout ([`write_peft_adapter`], [`read_peft_adapter`]): `adapter_config.json` and
//! `adapter_model.safetensors` with keys `base_model.model.<module>.lora_A.weight` /
//! `.lora_B.weight`, where `<module>` is the transformers module path.
//!
//! The model-level operations (loading with adapters, reading, freezing and saving them) are
//! [`Model`](crate::model::Model)'s, in `adapted.rs`.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use anyhow::{Result, bail, ensure};
use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;
use rand::{Rng, SeedableRng, rngs::StdRng};

mod peft;
pub use peft::{
    AdapterTensors, module_path, read_peft_adapter, read_peft_config, write_peft_adapter,
};

use crate::weights::{Init, WeightSource, WeightVisitor, normalize_name};

/// The `target_modules` entry that selects every linear but the output layer.
pub const ALL_LINEAR: &str = "all-linear";

/// The output layer, never adapted by [`ALL_LINEAR`] (PEFT leaves the output embedding alone).
const OUTPUT_LAYER: &str = "lm_head";

/// What to adapt and how (PEFT's `LoraConfig` fields of the same names).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// `r`: the adapters' rank.
    pub rank: usize,
    /// `lora_alpha`: the scaling is `alpha / rank`.
    pub alpha: f64,
    /// `lora_dropout`: dropout on the adapter's input while training.
    pub dropout: f64,
    /// Module-name suffixes, or [`ALL_LINEAR`].
    pub target_modules: Vec<String>,
}

impl LoraConfig {
    /// `s = alpha / r`.
    pub fn scaling(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Rank ≥ 1, alpha finite and > 0, dropout in [0, 1), at least one target.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.rank >= 1,
            "LoRA rank must be at least 1 (got {})",
            self.rank
        );
        ensure!(
            self.alpha.is_finite() && self.alpha > 0.0,
            "LoRA alpha must be a positive number (got {})",
            self.alpha
        );
        ensure!(
            (0.0..1.0).contains(&self.dropout),
            "LoRA dropout must be in [0, 1) (got {})",
            self.dropout
        );
        ensure!(
            !self.target_modules.is_empty(),
            "LoRA target_modules is empty: name module suffixes such as \"q_proj\", or \"{ALL_LINEAR}\""
        );
        Ok(())
    }

    /// Whether linear `module` (its checkpoint prefix, e.g. `model.layers.0.self_attn.q_proj`)
    /// gets an adapter (see the module doc); `vision` tells whether it belongs to the vision
    /// tower.
    pub fn matches(&self, module: &str, vision: bool) -> bool {
        self.target_modules
            .iter()
            .any(|t| entry_matches(t, module, vision))
    }
}

/// One `target_modules` entry against one module name.
fn entry_matches(entry: &str, module: &str, vision: bool) -> bool {
    // A vision-tower module only for an entry that names the tower.
    if vision && !in_vision_tower(entry) {
        return false;
    }
    if entry == ALL_LINEAR {
        return module != OUTPUT_LAYER && !module.ends_with(".lm_head");
    }
    let (module, entry) = (normalize_name(module), normalize_name(entry));
    module == entry || module.ends_with(&format!(".{entry}"))
}

/// Module-name prefixes of the families' vision towers (legacy and transformers-5 names).
pub const VISION_TOWER_PREFIXES: &[&str] = &[
    "visual.",
    "model.visual.",
    "model.vision_tower.",
    "model.embed_vision.",
];

/// Whether a module name (or a `target_modules` entry) lies in a vision tower.
pub fn in_vision_tower(module: &str) -> bool {
    VISION_TOWER_PREFIXES.iter().any(|p| module.starts_with(p))
}

/// The adapter of one linear map (see the module doc).
#[derive(Module, Debug)]
pub struct Lora<B: Backend> {
    /// `lora_A` `[r, in]`.
    pub a: Param<Tensor<B, 2>>,
    /// `lora_B` `[out, r]`.
    pub b: Param<Tensor<B, 2>>,
    /// `alpha / r`.
    pub scaling: f64,
    /// Dropout probability on the adapter's input, applied only under autodiff (training).
    pub dropout: f64,
}

thread_local! {
    /// The dropout seed of this thread's current scope and the number of masks drawn in it.
    static DROPOUT_STREAM: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    /// Whether adapters apply dropout outside autodiff too ([`TrainingSweep`]).
    static TRAINING_SWEEP: Cell<bool> = const { Cell::new(false) };
}

/// Where this thread's dropout stream stands: its seed and the number of masks drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropoutPosition(u64, u64);

impl DropoutPosition {
    /// The stream's position now.
    pub fn now() -> Self {
        let (seed, k) = DROPOUT_STREAM.with(Cell::get);
        Self(seed, k)
    }
}

/// While alive, adapters apply dropout on a backend without autodiff too: the graph-free
/// forward sweep of gradient checkpointing, whose segments are recomputed under autodiff
/// ([`DropoutScope::replay`]) and must see the same masks.
pub struct TrainingSweep {
    outer: bool,
}

impl TrainingSweep {
    pub fn enter() -> Self {
        Self {
            outer: TRAINING_SWEEP.with(|c| c.replace(true)),
        }
    }
}

impl Drop for TrainingSweep {
    fn drop(&mut self) {
        TRAINING_SWEEP.with(|c| c.set(self.outer));
    }
}

/// While alive, the adapters' dropout masks this thread draws come from `seed` (the k-th mask
/// depends only on `seed` and k), so a training step's masks are reproducible, on resume too.
/// Update nodes hold one per replica and mini-batch; dropping it restores the outer stream.
pub struct DropoutScope {
    outer: (u64, u64),
}

impl DropoutScope {
    pub fn enter(seed: u64) -> Self {
        Self::replay(DropoutPosition(seed, 0))
    }

    /// A scope that draws the masks drawn from `position` on again (a recomputed segment).
    pub fn replay(position: DropoutPosition) -> Self {
        Self {
            outer: DROPOUT_STREAM.with(|c| c.replace((position.0, position.1))),
        }
    }
}

impl Drop for DropoutScope {
    fn drop(&mut self) {
        DROPOUT_STREAM.with(|c| c.set(self.outer));
    }
}

/// An inverted-dropout mask of `n` values: `1/keep` with probability `keep`, else 0.
fn dropout_mask(n: usize, keep: f64) -> Vec<f32> {
    let (seed, k) = DROPOUT_STREAM.with(|c| {
        let (seed, k) = c.get();
        c.set((seed, k + 1));
        (seed, k)
    });
    let mut rng = StdRng::seed_from_u64(seed ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let scale = (1.0 / keep) as f32;
    (0..n)
        .map(|_| {
            if rng.random::<f64>() < keep {
                scale
            } else {
                0.0
            }
        })
        .collect()
}

impl<B: Backend> Lora<B> {
    /// `s · dropout(x)·Aᵀ·Bᵀ` for rows `x` `[n, in]` (in the dtype of `x`). Dropout acts only
    /// in training (under autodiff, or inside a [`TrainingSweep`]), with masks from the
    /// thread's [`DropoutScope`].
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let training = B::ad_enabled(&x.device()) || TRAINING_SWEEP.with(Cell::get);
        let x = if self.dropout > 0.0 && training {
            let mask = dropout_mask(x.shape().num_elements(), 1.0 - self.dropout);
            let mask = Tensor::<B, 2>::from_data(
                TensorData::new(mask, x.shape()),
                (&x.device(), x.dtype()),
            );
            x * mask
        } else {
            x
        };
        x.matmul(self.a.val().transpose())
            .matmul(self.b.val().transpose())
            * self.scaling
    }

    /// `W + s·B·A`, computed in f32 and returned in the dtype of `weight`.
    pub fn merge_into(&self, weight: Tensor<B, 2>) -> Tensor<B, 2> {
        let dtype = weight.dtype();
        let delta = self
            .b
            .val()
            .cast(DType::F32)
            .matmul(self.a.val().cast(DType::F32))
            * self.scaling;
        (weight.cast(DType::F32) + delta).cast(dtype)
    }
}

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
