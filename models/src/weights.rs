//! Where a model's weights come from and go to: the [`WeightSource`] layers take their tensors
//! from (a [`Checkpoint`](crate::checkpoint::Checkpoint) read from disk; [`RandomInit`] from a config;
//! [`ShapeOnly`] placeholders), and the [`WeightVisitor`] models export them to ([`WeightSink`],
//! which writes the Hugging Face layout; [`GradCollector`]).
//!
//! Each layer describes its weights once ([`Weights`]: every tensor under its checkpoint name,
//! walked by a [`WeightNames`]). [`Load`] walks it to ask a [`WeightSource`] for each tensor by
//! that name and the layer's shape, as host data already in the source's dtype; [`Export`]
//! walks it to hand the tensors to a [`WeightVisitor`]. The checkpoint source records every
//! missing, mis-shaped and (at the end) unexpected tensor and reports them all in one error. Names are normalised to the
//! legacy hub layout (`visual.*`, `model.*`, `lm_head.*`): transformers-5 module names
//! `model.visual.X` and `model.language_model.X` are accepted as `visual.X` and `model.X`.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::backend::AutodiffBackend;
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rayon::prelude::*;

use burn::module::Param;

use crate::lora::adapter::Lora;

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

    /// Every precision with its name in graphs, on the command line and in reports.
    pub const ALL: [(Precision, &'static str); 3] = [
        (Precision::F32, "f32"),
        (Precision::BF16, "bf16"),
        (Precision::F16, "f16"),
    ];

    /// Its name in graphs, on the command line and in reports ([`Self::ALL`]).
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(p, _)| *p == self)
            .map(|(_, n)| *n)
            .expect("every precision is in Precision::ALL")
    }

    /// A name of [`Self::ALL`], or torch's (`"float32"`, `"bfloat16"`, `"float16"`).
    pub fn parse(name: &str) -> Result<Self> {
        let torch = [
            ("float32", Precision::F32),
            ("bfloat16", Precision::BF16),
            ("float16", Precision::F16),
        ];
        Self::ALL
            .iter()
            .map(|&(p, n)| (n, p))
            .chain(torch)
            .find(|(n, _)| *n == name)
            .map(|(_, p)| p)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|(_, n)| *n).collect();
                let (last, rest) = names.split_last().expect("Precision::ALL is not empty");
                anyhow::anyhow!(
                    "unknown precision `{name}`; expected {} or {last}",
                    rest.join(", ")
                )
            })
    }
}

/// Where layers get their weights from.
pub trait WeightSource<B: Backend> {
    fn device(&self) -> B::Device;
    /// Float dtype of the created weights.
    fn dtype(&self) -> DType {
        DType::F32
    }
    /// Host values of tensor `name` with `shape` (row-major), in [`WeightSource::dtype`].
    fn take_data(&mut self, name: &str, shape: &[usize], init: Init) -> TensorData;
    /// Marks `name` as consumed if present (e.g. a stored `lm_head.weight` of a tied model).
    fn ignore(&mut self, name: &str);
    /// True when every weight is a placeholder: `take` then builds each tensor as one zero
    /// expanded to its shape (stride 0, nothing of its size allocated) without calling
    /// `take_data` ([`ShapeOnly`]). Sources that wrap another must delegate it.
    fn placeholders(&self) -> bool {
        false
    }
    /// Whether tensor `name` of `shape` is built as a placeholder (one zero expanded to the
    /// shape, nothing of its size allocated) instead of from [`WeightSource::take_data`]: every
    /// tensor of a placeholder source, and for a checkpoint a tensor it lacks or holds in another
    /// shape (recorded here, so the load fails at `finish`; a config that claims a huge tensor
    /// then allocates nothing for it). Sources that wrap another must delegate it, with the name
    /// the inner source knows.
    fn placeholder(&mut self, name: &str, shape: &[usize]) -> bool {
        let _ = (name, shape);
        self.placeholders()
    }
    /// The LoRA adapter of linear `module` (`[out_dim, in_dim]` weight), if this build attaches
    /// one (see [`crate::lora::LoraSource`]). Sources that wrap another must delegate it.
    fn lora_adapter(&mut self, module: &str, in_dim: usize, out_dim: usize) -> Option<Lora<B>> {
        let _ = (module, in_dim, out_dim);
        None
    }
}

impl<B: Backend> dyn WeightSource<B> + '_ {
    /// Tensor `name` of rank D.
    pub fn take<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        init: Init,
    ) -> Tensor<B, D> {
        let device = self.device();
        if self.placeholder(name, &shape) {
            return Tensor::<B, D>::zeros([1; D], (&device, self.dtype())).expand(shape);
        }
        let data = self.take_data(name, &shape, init);
        // In the data's own dtype: no conversion, and on Flex no copy (the tensor takes the
        // buffer).
        let dtype = data.dtype;
        Tensor::from_data(data, (&device, dtype))
    }

    /// The single value of host buffer `name` (`shape` with one element, e.g. `[]` or `[1]`), as
    /// f32 after the source's rounding to its dtype.
    pub fn take_scalar(&mut self, name: &str, shape: &[usize], init: Init) -> f32 {
        let data = self.take_data(name, shape, init);
        data.iter::<f32>()
            .next()
            .expect("a source returns one value for a one-element shape")
    }
}

/// Asks the wrapped source for transformers-5 names (`model.language_model.*`,
/// `model.visual.*`) under the shared loader's normalised names ([`normalize_name`]), so that a
/// family whose layers use the transformers-5 names (Gemma 4, Qwen3-VL) names every tensor once,
/// as its checkpoints and `save_pretrained` do.
pub(crate) struct NormalizedNames<'a, B: Backend>(pub(crate) &'a mut dyn WeightSource<B>);

impl<B: Backend> WeightSource<B> for NormalizedNames<'_, B> {
    fn device(&self) -> B::Device {
        self.0.device()
    }

    fn dtype(&self) -> DType {
        self.0.dtype()
    }

    fn take_data(&mut self, name: &str, shape: &[usize], init: Init) -> TensorData {
        self.0.take_data(&normalize_name(name), shape, init)
    }

    fn placeholders(&self) -> bool {
        self.0.placeholders()
    }

    fn placeholder(&mut self, name: &str, shape: &[usize]) -> bool {
        self.0.placeholder(&normalize_name(name), shape)
    }

    fn ignore(&mut self, name: &str) {
        self.0.ignore(&normalize_name(name));
    }

    fn lora_adapter(&mut self, module: &str, in_dim: usize, out_dim: usize) -> Option<Lora<B>> {
        self.0.lora_adapter(module, in_dim, out_dim)
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

/// Zeros of `shape` as host data of `dtype` (the placeholder of a missing or mis-shaped tensor).
pub(crate) fn zeros_data(shape: &[usize], dtype: DType) -> TensorData {
    host_data(
        std::iter::repeat_n(0.0, shape.iter().product()),
        shape,
        dtype,
    )
}

/// `values` (row-major, `shape`) as host data of `dtype`, converted one value at a time (no f32
/// buffer unless `dtype` is f32).
pub(crate) fn host_data(
    values: impl Iterator<Item = f32>,
    shape: &[usize],
    dtype: DType,
) -> TensorData {
    match dtype {
        DType::BF16 => TensorData::new(values.map(bf16::from_f32).collect::<Vec<_>>(), shape),
        DType::F16 => TensorData::new(values.map(f16::from_f32).collect::<Vec<_>>(), shape),
        DType::F32 => TensorData::new(values.collect::<Vec<f32>>(), shape),
        other => TensorData::new(values.collect::<Vec<f32>>(), shape).convert_dtype(other),
    }
}

/// Random weights: normal matrices and embeddings with standard deviation `std`
/// (the config's `initializer_range`), zero biases, unit norm weights (HF `_init_weights`).
///
/// The draws are one ChaCha12 stream (`StdRng`'s generator, seeded the same way), each normal
/// taking 4 of its 32-bit words (Box–Muller from two f64 uniforms), so a large tensor is drawn
/// in parallel chunks that seek to their first word: the values are those of the sequential
/// draw, on any number of threads.
pub struct RandomInit<B: Backend> {
    device: B::Device,
    rng: ChaCha12Rng,
    std: f32,
    precision: Precision,
}

impl<B: Backend> RandomInit<B> {
    pub fn new(device: &B::Device, seed: u64, std: f32) -> Self {
        Self {
            device: device.clone(),
            rng: ChaCha12Rng::seed_from_u64(seed),
            std,
            precision: Precision::F32,
        }
    }

    /// Creates the weights in `precision` (default f32).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// `n` standard normal draws times `std`, continuing the stream (see the type's doc).
    fn normals(&mut self, n: usize, std: f32) -> Vec<f32> {
        const CHUNK: usize = 1 << 16;
        let start = self.rng.get_word_pos();
        let mut out = vec![0.0f32; n];
        out.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(k, chunk)| {
                let mut rng = self.rng.clone();
                rng.set_word_pos(start + (WORDS_PER_NORMAL * k * CHUNK) as u128);
                for v in chunk {
                    *v = normal(&mut rng) * std;
                }
            });
        self.rng
            .set_word_pos(start + (WORDS_PER_NORMAL * n) as u128);
        out
    }
}

/// 32-bit words of the stream one [`normal`] consumes (two f64 uniforms of one u64 each).
const WORDS_PER_NORMAL: usize = 4;

/// One standard normal draw (Box–Muller).
fn normal(rng: &mut ChaCha12Rng) -> f32 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

impl<B: Backend> WeightSource<B> for RandomInit<B> {
    fn device(&self) -> B::Device {
        self.device.clone()
    }

    fn dtype(&self) -> DType {
        self.precision.dtype()
    }

    /// The f32 draws (or constants), each rounded into the precision as it is drawn.
    fn take_data(&mut self, _name: &str, shape: &[usize], init: Init) -> TensorData {
        let n: usize = shape.iter().product();
        let dtype = self.precision.dtype();
        let constant = |c: f32| host_data(std::iter::repeat_n(c, n), shape, dtype);
        match init {
            Init::Zeros => constant(0.0),
            Init::Ones => constant(1.0),
            Init::Const(c) => constant(c),
            Init::Matrix | Init::Embedding => {
                let values = self.normals(n, self.std);
                host_data(values.into_iter(), shape, dtype)
            }
        }
    }

    fn ignore(&mut self, _name: &str) {}
}

/// Placeholder weights for building a model of any size without its memory: every tensor is
/// one zero expanded to its shape (stride 0; see [`WeightSource::placeholders`]), so building
/// checks that a config parses and fits together and gives the parameter count
/// (`Module::num_params`), in the given precision. Not for computing: every output is zero.
pub struct ShapeOnly<B: Backend> {
    device: B::Device,
    precision: Precision,
}

impl<B: Backend> ShapeOnly<B> {
    pub fn new(device: &B::Device, precision: Precision) -> Self {
        Self {
            device: device.clone(),
            precision,
        }
    }
}

impl<B: Backend> WeightSource<B> for ShapeOnly<B> {
    fn device(&self) -> B::Device {
        self.device.clone()
    }

    fn dtype(&self) -> DType {
        self.precision.dtype()
    }

    /// Host buffers only (`take` never asks for a tensor here): the init's constant, zeros for
    /// matrices and embeddings.
    fn take_data(&mut self, _name: &str, shape: &[usize], init: Init) -> TensorData {
        let value = match init {
            Init::Ones => 1.0,
            Init::Const(c) => c,
            Init::Zeros | Init::Matrix | Init::Embedding => 0.0,
        };
        let n = shape.iter().product();
        host_data(std::iter::repeat_n(value, n), shape, self.precision.dtype())
    }

    fn ignore(&mut self, _name: &str) {}

    fn placeholders(&self) -> bool {
        true
    }
}

/// Receives every weight of a model under its checkpoint name (through [`Export`], once per
/// tensor of the layers' [`Weights`] descriptions).
pub trait WeightVisitor<B: Backend> {
    fn put<const D: usize>(&mut self, name: &str, t: Tensor<B, D>);

    /// A host-side buffer that is not a parameter, stored with `shape` (`[]` for a scalar), e.g.
    /// Gemma 4's clip bounds and layer scalars. Ignored by default (no gradients).
    fn put_buffer(&mut self, name: &str, shape: &[usize], values: &[f32]) {
        let _ = (name, shape, values);
    }

    /// The LoRA adapter of linear `module`, whose base weight was just put as
    /// `{module}.weight`. Ignored by default (a checkpoint of the base model).
    fn put_lora(&mut self, module: &str, lora: &Lora<B>) {
        let _ = (module, lora);
    }

    /// When true, linears put their weight with the adapter folded in (`W + s·B·A`) and no
    /// [`WeightVisitor::put_lora`] follows: the merged model.
    fn merges_adapters(&self) -> bool {
        false
    }

    /// Whether the visitor keeps tensor `name` (a streamed save collects one shard per pass),
    /// so that work only its value needs, such as merging an adapter, can be skipped.
    fn wants(&self, name: &str) -> bool {
        let _ = name;
        true
    }
}

/// One description of a layer's weights, walked in both directions: each layer has a
/// `weights(&mut self, w, prefix)` that hands every tensor to `w` under its checkpoint name, once
/// (candle's `vb.pp(..)`: the name is written where the layer is built). [`Load`] fills the
/// tensors from a [`WeightSource`] (the layer was built by its `new` with placeholders of the
/// right shapes, so the shapes come from the layer, not from the names); [`Export`] hands them to
/// a [`WeightVisitor`]. Both walk the same order, the order `load` and `export` had (the random
/// draws of [`RandomInit`] follow it; saved files are keyed by name).
pub trait WeightNames<B: Backend> {
    /// Tensor `name`, random-initialised (when the source draws) as `init`.
    fn tensor<const D: usize>(&mut self, name: &str, param: &mut Param<Tensor<B, D>>, init: Init);

    /// The `[out, in]` weight `name` of a linear map with adapter `lora` (exported merged when
    /// the visitor merges adapters).
    fn adapted(&mut self, name: &str, weight: &mut Param<Tensor<B, 2>>, lora: Option<&Lora<B>>);

    /// The LoRA adapter of linear `module`, whose weight `weight` was just walked: attached at
    /// load when the source gives one, exported in PEFT layout unless the visitor merges.
    fn adapter(&mut self, module: &str, lora: &mut Option<Lora<B>>, weight: &Param<Tensor<B, 2>>);

    /// A host scalar buffer that is not a parameter (Gemma 4's clip bounds, layer scalars),
    /// stored with `shape` (one element: `[]` or `[1]`).
    fn scalar(&mut self, name: &str, shape: &[usize], value: &mut f32, init: Init);

    /// A stored tensor the model does not keep (a tied model's `lm_head.weight`).
    fn ignore(&mut self, name: &str);
}

/// A layer whose weights are described once ([`WeightNames`]).
pub trait Weights<B: Backend>: Clone {
    /// Walks every weight under `{prefix}.…` (or the names the layer gives its root).
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str);

    /// `self` (built with placeholder shapes) filled from `src`.
    fn loaded(mut self, src: &mut dyn WeightSource<B>, prefix: &str) -> Self {
        self.weights(&mut Load(src), prefix);
        self
    }

    /// Hands every weight to `sink`. The walk takes `&mut self`, so it goes over a shallow clone
    /// (tensor handles; no data is copied).
    fn export_to<V: WeightVisitor<B>>(&self, sink: &mut V, prefix: &str) {
        self.clone().weights(&mut Export(sink), prefix);
    }
}

/// `{prefix}.{name}`, or `name` at the root (empty prefix).
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// A parameter of `shape` that holds no data yet: one zero expanded to the shape (stride 0),
/// replaced by [`Load`]. Layers' `new` build these.
pub fn shaped<B: Backend, const D: usize>(
    device: &B::Device,
    shape: [usize; D],
) -> Param<Tensor<B, D>> {
    Param::from_tensor(Tensor::<B, D>::zeros([1; D], device).expand(shape))
}

/// Fills a layer's weights from a source, by the layer's names and shapes.
pub struct Load<'a, B: Backend>(pub &'a mut dyn WeightSource<B>);

impl<B: Backend> WeightNames<B> for Load<'_, B> {
    fn tensor<const D: usize>(&mut self, name: &str, param: &mut Param<Tensor<B, D>>, init: Init) {
        *param = Param::from_tensor(self.0.take(name, param.dims(), init));
    }

    fn adapted(&mut self, name: &str, weight: &mut Param<Tensor<B, 2>>, _: Option<&Lora<B>>) {
        self.tensor(name, weight, Init::Matrix);
    }

    fn adapter(&mut self, module: &str, lora: &mut Option<Lora<B>>, weight: &Param<Tensor<B, 2>>) {
        let [out_dim, in_dim] = weight.dims();
        *lora = self.0.lora_adapter(module, in_dim, out_dim);
    }

    fn scalar(&mut self, name: &str, shape: &[usize], value: &mut f32, init: Init) {
        *value = self.0.take_scalar(name, shape, init);
    }

    fn ignore(&mut self, name: &str) {
        self.0.ignore(name);
    }
}

/// Hands a layer's weights to a visitor under the layer's names.
pub struct Export<'a, V>(pub &'a mut V);

impl<B: Backend, V: WeightVisitor<B>> WeightNames<B> for Export<'_, V> {
    fn tensor<const D: usize>(&mut self, name: &str, param: &mut Param<Tensor<B, D>>, _: Init) {
        self.0.put(name, param.val());
    }

    fn adapted(&mut self, name: &str, weight: &mut Param<Tensor<B, 2>>, lora: Option<&Lora<B>>) {
        // A streamed merged save visits the model once per shard: merge only for the shard that
        // keeps this weight.
        let value = match lora {
            Some(lora) if self.0.merges_adapters() && self.0.wants(name) => {
                lora.merge_into(weight.val())
            }
            _ => weight.val(),
        };
        self.0.put(name, value);
    }

    fn adapter(&mut self, module: &str, lora: &mut Option<Lora<B>>, _: &Param<Tensor<B, 2>>) {
        if let Some(lora) = lora
            && !self.0.merges_adapters()
        {
            self.0.put_lora(module, lora);
        }
    }

    fn scalar(&mut self, name: &str, shape: &[usize], value: &mut f32, _: Init) {
        self.0.put_buffer(name, shape, &[*value]);
    }

    fn ignore(&mut self, _: &str) {}
}

fn host_values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 tensor data")
}

/// Named host tensors collected from a model, for saving or inspection: each in its own dtype,
/// or converted to a chosen precision ([`WeightSink::converting`]); host buffers are f32 unless
/// converted.
#[derive(Default)]
pub struct WeightSink {
    tensors: BTreeMap<String, TensorData>,
    /// Dtype every collected tensor is converted to; its own when `None`.
    precision: Option<Precision>,
    /// Only these names are collected (one shard of a streamed save); all when `None`.
    only: Option<BTreeSet<String>>,
}

impl<B: Backend> WeightVisitor<B> for WeightSink {
    fn put<const D: usize>(&mut self, name: &str, t: Tensor<B, D>) {
        if !self.collects(name) {
            return;
        }
        // Converted on the host: burn's `convert_dtype` rounds f32 → bf16/f16 to nearest even
        // (`half`'s `from_f32`, as torch's `.to()`), like the checkpoint reader; Flex's `cast`
        // goes through f64 and `half`'s `from_f64`, which drops the low mantissa bits of an f32
        // before rounding and so can round a value just above a tie down.
        let data = t.into_data();
        let data = match self.precision {
            Some(p) => data.convert_dtype(p.dtype()),
            None => data,
        };
        self.tensors.insert(name.to_string(), data);
    }

    fn put_buffer(&mut self, name: &str, shape: &[usize], values: &[f32]) {
        if !self.collects(name) {
            return;
        }
        let dtype = self.precision.map_or(DType::F32, Precision::dtype);
        let data = host_data(values.iter().copied(), shape, dtype);
        self.tensors.insert(name.to_string(), data);
    }

    fn wants(&self, name: &str) -> bool {
        self.collects(name)
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
    /// A sink that converts every tensor (and host buffer) to `precision`.
    pub fn converting(precision: Precision) -> Self {
        Self {
            precision: Some(precision),
            ..Self::default()
        }
    }

    /// A sink that collects only the tensors `names`, converted to `precision` (their own dtype
    /// when `None`): one shard of a streamed save.
    pub(crate) fn shard(names: &BTreeSet<String>, precision: Option<Precision>) -> Self {
        Self {
            precision,
            only: Some(names.clone()),
            ..Self::default()
        }
    }

    fn collects(&self, name: &str) -> bool {
        self.only.as_ref().is_none_or(|only| only.contains(name))
    }

    /// Shape and values (widened to f32) of tensor `name`.
    pub fn get(&self, name: &str) -> Option<(&[usize], Vec<f32>)> {
        self.tensors
            .get(name)
            .map(|d| (d.shape.as_slice(), d.iter::<f32>().collect()))
    }

    /// Host data of tensor `name`, in the dtype it was collected in.
    pub fn data(&self, name: &str) -> Option<&TensorData> {
        self.tensors.get(name)
    }

    /// Names and shapes collected so far.
    pub fn shapes(&self) -> impl Iterator<Item = (&str, &[usize])> {
        self.tensors
            .iter()
            .map(|(k, d)| (k.as_str(), d.shape.as_slice()))
    }

    /// The collected tensors, by name.
    pub(crate) fn tensors(&self) -> &BTreeMap<String, TensorData> {
        &self.tensors
    }

    /// The collected tensors, by name.
    pub(crate) fn into_tensors(self) -> Vec<(String, TensorData)> {
        self.tensors.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use rand::rngs::StdRng;

    /// The parallel, seeking draw gives exactly the sequential `StdRng` stream's values, across
    /// tensors (the second continues where the first ended) and chunk boundaries.
    #[test]
    fn parallel_random_init_equals_the_sequential_stream() {
        let mut rng = StdRng::seed_from_u64(42);
        let mut sequential = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
                    let u2: f64 = rng.random::<f64>();
                    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
                        * 0.02
                })
                .collect()
        };
        let mut src = RandomInit::<Flex>::new(&Default::default(), 42, 0.02);
        for n in [3, 200_001, 70_000] {
            let data = WeightSource::<Flex>::take_data(&mut src, "w", &[n], Init::Matrix);
            assert_eq!(data.to_vec::<f32>().unwrap(), sequential(n), "{n} values");
        }
    }
}
