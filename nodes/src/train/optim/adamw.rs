//! AdamW with PyTorch's semantics and defaults (`torch.optim.AdamW`, Loshchilov & Hutter 2019).
//!
//! For each parameter `p` with gradient `g`, at its `t`-th update (t starts at 1):
//!
//! ```text
//! p   ← p · (1 − lr · weight_decay)                 decoupled weight decay, applied first
//! m   ← β1 · m + (1 − β1) · g
//! v   ← β2 · v + (1 − β2) · g²
//! p   ← p − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)
//! ```
//!
//! This is exactly torch's non-amsgrad, non-foreach update (`_single_tensor_adamw`). burn's
//! `AdamWConfig` computes the same formula but defaults to ε = 1e-5 and weight decay 1e-4, where
//! torch uses ε = 1e-8 and weight decay 1e-2; [`AdamWConfig::default`] takes torch's values
//! (β = (0.9, 0.999), ε = 1e-8, weight decay 0.01). verl's actor uses lr 1e-6, weight decay 0.01.
//!
//! The moments are kept on the inner (non-autodiff) backend, flattened, and keyed by the
//! parameter's module path (`text.layers.0.mlp.gate.weight`), so a checkpoint written by
//! [`AdamW::save`] restores into a model loaded again from disk (burn's `ParamId`s are random per
//! load). Parameters without a gradient are left untouched, and their step count does not advance
//! (as in torch, where `state["step"]` is per parameter).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use flowrl_models::flex::{HostMatrix, host_values, is_host_f32};

/// Hyper-parameters of [`AdamW`]; defaults are torch's (the learning rate comes from the schedule).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    /// torch.optim.AdamW: betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2.
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// The moments of one parameter.
#[derive(Clone)]
struct Moments<B: Backend> {
    step: u64,
    exp_avg: Tensor<B, 1>,
    exp_avg_sq: Tensor<B, 1>,
}

/// AdamW state for one model (see the module doc).
pub struct AdamW<B: AutodiffBackend> {
    pub config: AdamWConfig,
    state: HashMap<String, Moments<B::InnerBackend>>,
    /// One fused pass per parameter over its values where they are host memory (`is_host_f32`:
    /// the CPU backend) ([`fused_step`]); false: burn's tensor ops everywhere (the reference path).
    fused: bool,
}

impl<B: AutodiffBackend> AdamW<B> {
    pub fn new(config: AdamWConfig) -> Self {
        Self {
            config,
            state: HashMap::new(),
            fused: true,
        }
    }

    /// `false`: every step through burn's per-tensor ops (several passes over each parameter,
    /// a fresh buffer each), the path of the GPU backends, also on the CPU; the fused host
    /// pass gives the same values bit for bit (tests/adamw_fused.rs).
    pub fn with_fused(mut self, fused: bool) -> Self {
        self.fused = fused;
        self
    }

    /// Number of parameters with state.
    pub fn num_states(&self) -> usize {
        self.state.len()
    }

    /// f32 values held by the moments (two per value of each parameter with state).
    pub fn state_values(&self) -> usize {
        self.state
            .values()
            .map(|m| m.exp_avg.dims()[0] + m.exp_avg_sq.dims()[0])
            .sum()
    }

    /// Moves the moments of the parameters `keep` rejects into a new optimizer (same config)
    /// and returns it: how a sharded optimizer hands each replica its parameters' state.
    pub fn split_off(&mut self, keep: impl Fn(&str) -> bool) -> AdamW<B> {
        let (kept, moved) = std::mem::take(&mut self.state)
            .into_iter()
            .partition(|(k, _)| keep(k));
        self.state = kept;
        AdamW {
            config: self.config,
            state: moved,
            fused: self.fused,
        }
    }

    /// Takes over `other`'s moments (the parameters this one has no state for): the state of a
    /// sharded optimizer put back together.
    pub fn absorb(&mut self, other: AdamW<B>) {
        for (k, m) in other.state {
            self.state.entry(k).or_insert(m);
        }
    }

    /// The moments of the parameter at module path `key`, on the host: step count, `exp_avg`,
    /// `exp_avg_sq` (`None` when it has no state yet).
    pub fn moments_of(&self, key: &str) -> Option<(u64, Vec<f32>, Vec<f32>)> {
        let m = self.state.get(key)?;
        let host = |t: &Tensor<B::InnerBackend, 1>| {
            t.clone()
                .into_data()
                .convert::<f32>()
                .into_vec::<f32>()
                .expect("f32 moments")
        };
        Some((m.step, host(&m.exp_avg), host(&m.exp_avg_sq)))
    }

    /// Sets the moments of the parameter at module path `key` (what [`AdamW::moments_of`]
    /// gives), on `device`.
    pub fn set_moments(
        &mut self,
        key: String,
        (step, exp_avg, exp_avg_sq): (u64, Vec<f32>, Vec<f32>),
        device: &burn::tensor::Device<B::InnerBackend>,
    ) {
        let tensor = |v: Vec<f32>| {
            let n = v.len();
            Tensor::from_data(TensorData::new(v, [n]), device)
        };
        let m = Moments {
            step,
            exp_avg: tensor(exp_avg),
            exp_avg_sq: tensor(exp_avg_sq),
        };
        self.state.insert(key, m);
    }

    /// A copy of the state (the moments' tensors are shared until one is updated).
    pub fn duplicate(&self) -> AdamW<B> {
        AdamW {
            config: self.config,
            state: self.state.clone(),
            fused: self.fused,
        }
    }

    /// Applies one update with learning rate `lr` to every parameter of `model` that has a
    /// gradient in `grads` (gradients on the inner backend, as `GradientsParams::from_grads` gives).
    pub fn step<M: AutodiffModule<B>>(
        &mut self,
        lr: f64,
        model: M,
        mut grads: GradientsParams,
    ) -> M {
        let mut mapper = StepMapper::<B> {
            config: self.config,
            fused: self.fused,
            lr,
            state: &mut self.state,
            grads: &mut grads,
            path: Vec::new(),
        };
        model.map(&mut mapper)
    }

    /// Writes the state to `path` as safetensors (`<param path>.exp_avg`, `<param path>.exp_avg_sq`)
    /// with the per-parameter step counts and the config in the header metadata.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut keys: Vec<&String> = self.state.keys().collect();
        keys.sort();
        let mut tensors: Vec<(String, Vec<u8>, usize)> = Vec::new();
        let mut steps = BTreeMap::new();
        for key in keys {
            let m = &self.state[key];
            steps.insert(key.clone(), m.step);
            for (suffix, t) in [("exp_avg", &m.exp_avg), ("exp_avg_sq", &m.exp_avg_sq)] {
                let values = t
                    .clone()
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .map_err(|e| anyhow::anyhow!("reading optimizer state {key}: {e:?}"))?;
                let n = values.len();
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                tensors.push((format!("{key}.{suffix}"), bytes, n));
            }
        }
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .map(|(name, bytes, n)| {
                let view =
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![*n], bytes)
                        .expect("shape matches the byte count");
                (name.clone(), view)
            })
            .collect();
        let mut meta = HashMap::new();
        meta.insert("steps".to_string(), serde_json::to_string(&steps)?);
        meta.insert("config".to_string(), serde_json::to_string(&self.config)?);
        safetensors::serialize_to_file(views, Some(meta), path)
            .with_context(|| format!("writing optimizer state {}", path.display()))?;
        Ok(())
    }

    /// Replaces the state by the one [`AdamW::save`] wrote to `path`, after checking it against
    /// `module`, the module it will update: every state names one of its parameters, with one
    /// moment vector of that parameter's size each (`exp_avg`, `exp_avg_sq` ≥ 0, all finite) and
    /// a step count ≥ 1; the file holds no other tensor. A file of another model, or a damaged
    /// one, is refused naming the file and what differs.
    pub fn load<M: Module<B>>(
        &mut self,
        path: &Path,
        module: &M,
        device: &burn::tensor::Device<B::InnerBackend>,
    ) -> Result<()> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading optimizer state {}", path.display()))?;
        let (config, moments) = parse_state(&bytes, &param_shapes(module))
            .with_context(|| format!("optimizer state {}", path.display()))?;
        if let Some(config) = config {
            self.config = config;
        }
        self.state.clear();
        for (key, stored) in moments {
            self.set_moments(key, stored, device);
        }
        Ok(())
    }
}

/// The moments of one parameter as read from a file: step count, `exp_avg`, `exp_avg_sq`.
type StoredMoments = (u64, Vec<f32>, Vec<f32>);

/// The float parameters of `module`: module path (the key of [`AdamW`]'s state) → shape.
pub fn param_shapes<B: Backend, M: Module<B>>(module: &M) -> BTreeMap<String, Vec<usize>> {
    struct Shapes {
        path: Vec<String>,
        out: BTreeMap<String, Vec<usize>>,
    }
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.out
                .insert(self.path.join("."), param.val().dims().to_vec());
        }
    }
    let mut v = Shapes {
        path: Vec::new(),
        out: BTreeMap::new(),
    };
    module.visit(&mut v);
    v.out
}

/// Parses the bytes of an optimizer state file ([`AdamW::save`]) and checks it against the
/// parameter shapes of the module it belongs to (see [`AdamW::load`]).
pub fn parse_state(
    bytes: &[u8],
    shapes: &BTreeMap<String, Vec<usize>>,
) -> Result<(Option<AdamWConfig>, BTreeMap<String, StoredMoments>)> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| anyhow::anyhow!("not a safetensors file: {e}"))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| anyhow::anyhow!("not a safetensors file: {e}"))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let steps: BTreeMap<String, u64> = serde_json::from_str(
        meta.get("steps")
            .context("the header has no `steps` metadata")?,
    )
    .context("the header's `steps` metadata is not a map of step counts")?;
    let config: Option<AdamWConfig> = meta
        .get("config")
        .map(|c| serde_json::from_str(c))
        .transpose()
        .context("the header's `config` metadata is not an AdamW configuration")?;
    let mut expected_tensors = std::collections::BTreeSet::new();
    let mut out = BTreeMap::new();
    for (key, step) in steps {
        let Some(shape) = shapes.get(&key) else {
            bail!(
                "it holds moments of parameter `{key}`, which the model does not have \
                 (the state of another model?)"
            );
        };
        let numel: usize = shape.iter().product();
        ensure!(
            (1..=i32::MAX as u64).contains(&step),
            "parameter `{key}` has step count {step}"
        );
        let read = |suffix: &str| -> Result<Vec<f32>> {
            let name = format!("{key}.{suffix}");
            let view = st
                .tensor(&name)
                .with_context(|| format!("tensor `{name}` is missing"))?;
            ensure!(
                view.dtype() == safetensors::Dtype::F32,
                "tensor `{name}` is {:?}, not F32",
                view.dtype()
            );
            ensure!(
                view.shape() == [numel],
                "tensor `{name}` has shape {:?}, the model's parameter {shape:?} needs [{numel}]",
                view.shape()
            );
            let values: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                bail!("tensor `{name}` holds {} at index {i}", values[i]);
            }
            Ok(values)
        };
        let exp_avg = read("exp_avg")?;
        let exp_avg_sq = read("exp_avg_sq")?;
        if let Some(i) = exp_avg_sq.iter().position(|v| *v < 0.0) {
            bail!(
                "tensor `{key}.exp_avg_sq` holds {} at index {i} (a second moment is never negative)",
                exp_avg_sq[i]
            );
        }
        expected_tensors.insert(format!("{key}.exp_avg"));
        expected_tensors.insert(format!("{key}.exp_avg_sq"));
        out.insert(key, (step, exp_avg, exp_avg_sq));
    }
    if let Some(extra) = st
        .names()
        .into_iter()
        .find(|n| !expected_tensors.contains(*n))
    {
        bail!("tensor `{extra}` belongs to no parameter of the `steps` metadata");
    }
    Ok((config, out))
}

struct StepMapper<'a, B: AutodiffBackend> {
    config: AdamWConfig,
    fused: bool,
    lr: f64,
    state: &'a mut HashMap<String, Moments<B::InnerBackend>>,
    grads: &'a mut GradientsParams,
    path: Vec<String>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for StepMapper<'_, B> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let key = self.path.join(".");
        let c = self.config;
        let shape = tensor.shape();
        let n = shape.num_elements();
        let require_grad = tensor.is_require_grad();
        let p = tensor.inner().reshape([n]);

        let prev = self.state.remove(&key);
        let step = prev.as_ref().map_or(1, |m| m.step + 1);
        let bias1 = 1.0 - c.beta1.powi(step as i32);
        let bias2 = 1.0 - c.beta2.powi(step as i32);
        let step_size = self.lr / bias1;
        let (updated, exp_avg, exp_avg_sq) = if self.fused && is_host_f32(&p) && is_host_f32(&grad)
        {
            let k = Coefficients {
                beta1: c.beta1 as f32,
                one_minus_beta1: (1.0 - c.beta1) as f32,
                beta2: c.beta2 as f32,
                one_minus_beta2: (1.0 - c.beta2) as f32,
                sqrt_bias2: bias2.sqrt() as f32,
                eps: c.eps as f32,
                decay: (c.weight_decay != 0.0).then_some((1.0 - self.lr * c.weight_decay) as f32),
                step_size: step_size as f32,
            };
            fused_step(p, grad, prev.map(|m| (m.exp_avg, m.exp_avg_sq)), &k)
        } else {
            let g = grad.reshape([n]);
            let (exp_avg, exp_avg_sq) = match prev {
                Some(m) => (
                    m.exp_avg.mul_scalar(c.beta1) + g.clone().mul_scalar(1.0 - c.beta1),
                    m.exp_avg_sq.mul_scalar(c.beta2) + g.square().mul_scalar(1.0 - c.beta2),
                ),
                None => (
                    g.clone().mul_scalar(1.0 - c.beta1),
                    g.square().mul_scalar(1.0 - c.beta2),
                ),
            };
            let denom = exp_avg_sq
                .clone()
                .sqrt()
                .div_scalar(bias2.sqrt())
                .add_scalar(c.eps);
            let decayed = if c.weight_decay != 0.0 {
                p.mul_scalar(1.0 - self.lr * c.weight_decay)
            } else {
                p
            };
            let updated = decayed - exp_avg.clone().div(denom).mul_scalar(step_size);
            (updated, exp_avg, exp_avg_sq)
        };
        self.state.insert(
            key,
            Moments {
                step,
                exp_avg,
                exp_avg_sq,
            },
        );
        let mut out = Tensor::<B, D>::from_inner(updated.reshape(shape));
        if require_grad {
            out = out.require_grad();
        }
        Param::from_mapped_value(id, out, mapper)
    }
}

/// The scalars of one AdamW update, rounded to f32 as burn's `*_scalar` ops on an f32 tensor
/// round them; `decay` is `None` without weight decay.
struct Coefficients {
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    sqrt_bias2: f32,
    eps: f32,
    decay: Option<f32>,
    step_size: f32,
}

/// One AdamW update of a parameter in a single pass over its buffers: reads p, g, m, v once
/// and writes p, m, v once, in place where the parameter and moments own their buffers (the
/// moments always do after their first step). The arithmetic is the per-tensor path's, op for
/// op in f32 (`m·β1 + g·(1−β1)`, `v·β2 + g²·(1−β2)`, `√v / √bias2 + ε`, `p·decay −
/// (m / denom)·step_size`), so the results are the same bits. A 2-D gradient stored transposed
/// (a `Linear` weight's, from the matmul backward) is read in tiles where it lies, not copied
/// to the parameter's layout first. Large parameters are split over threads
/// (`RAYON_NUM_THREADS`, else the available cores), as the CPU backend splits its loops.
fn fused_step<B: Backend, const D: usize>(
    p: Tensor<B, 1>,
    grad: Tensor<B, D>,
    moments: Option<(Tensor<B, 1>, Tensor<B, 1>)>,
    k: &Coefficients,
) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>) {
    let n = p.dims()[0];
    let device = p.device();
    let g = HostMatrix::new(grad);
    let (rows, cols, rs, cs, offset) = g.layout(n);
    let g_storage = g.values();
    let mut p = host_values(p);
    let first = moments.is_none();
    let (mut m, mut v) = match moments {
        Some((m, v)) => (host_values(m), host_values(v)),
        None => (vec![0.0; n], vec![0.0; n]),
    };
    let update = |p: &mut f32, m: &mut f32, v: &mut f32, g: f32| {
        let (mi, vi) = if first {
            (g * k.one_minus_beta1, (g * g) * k.one_minus_beta2)
        } else {
            (
                *m * k.beta1 + g * k.one_minus_beta1,
                *v * k.beta2 + (g * g) * k.one_minus_beta2,
            )
        };
        let denom = vi.sqrt() / k.sqrt_bias2 + k.eps;
        let decayed = match k.decay {
            Some(d) => *p * d,
            None => *p,
        };
        *p = decayed - (mi / denom) * k.step_size;
        *m = mi;
        *v = vi;
    };
    // Rows `row0..` of the parameter (`p`, `m`, `v` hold whole rows).
    let rows_kernel = |row0: usize, p: &mut [f32], m: &mut [f32], v: &mut [f32]| {
        if p.is_empty() {
            return;
        }
        if cs == 1 && rs == cols as isize {
            let g = &g_storage[offset + row0 * cols..offset + row0 * cols + p.len()];
            for i in 0..p.len() {
                update(&mut p[i], &mut m[i], &mut v[i], g[i]);
            }
            return;
        }
        // Tiles of TR rows × TC columns, read from the gradient in its own order.
        const TR: usize = 16;
        const TC: usize = 256;
        let mut tile = [0.0f32; TR * TC];
        let local_rows = p.len() / cols;
        for r0 in (0..local_rows).step_by(TR) {
            let tr = TR.min(local_rows - r0);
            for c0 in (0..cols).step_by(TC) {
                let tc = TC.min(cols - c0);
                for j in 0..tc {
                    for i in 0..tr {
                        let at = offset as isize
                            + (row0 + r0 + i) as isize * rs
                            + (c0 + j) as isize * cs;
                        tile[i * TC + j] = g_storage[at as usize];
                    }
                }
                for i in 0..tr {
                    let base = (r0 + i) * cols + c0;
                    for j in 0..tc {
                        let x = base + j;
                        update(&mut p[x], &mut m[x], &mut v[x], tile[i * TC + j]);
                    }
                }
            }
        }
    };
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|t| t.parse::<usize>().ok())
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |t| t.get()));
    if threads <= 1 || n < 1 << 18 || rows == 1 && n < threads {
        rows_kernel(0, &mut p, &mut m, &mut v);
    } else if rows == 1 {
        // One contiguous row: split it (the kernel's row is then a part of it).
        let per = n.div_ceil(threads);
        std::thread::scope(|s| {
            let parts = p
                .chunks_mut(per)
                .zip(m.chunks_mut(per))
                .zip(v.chunks_mut(per));
            for (t, ((p, m), v)) in parts.enumerate() {
                let g = &g_storage[offset + t * per..offset + t * per + p.len()];
                s.spawn(move || {
                    for i in 0..p.len() {
                        update(&mut p[i], &mut m[i], &mut v[i], g[i]);
                    }
                });
            }
        });
    } else {
        let per = rows.div_ceil(threads) * cols;
        std::thread::scope(|s| {
            let parts = p
                .chunks_mut(per)
                .zip(m.chunks_mut(per))
                .zip(v.chunks_mut(per));
            for (t, ((p, m), v)) in parts.enumerate() {
                let kernel = &rows_kernel;
                s.spawn(move || kernel(t * per / cols, p, m, v));
            }
        });
    }
    drop(g);
    let f32_on = (&device, burn::tensor::DType::F32);
    let tensor = |x: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(x, [n]), f32_on);
    (tensor(p), tensor(m), tensor(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::backend::AutodiffBackend;

    type AB = crate::runtime::backend::CpuBackend;
    type Inner = <AB as AutodiffBackend>::InnerBackend;

    #[derive(Module, Debug)]
    struct Net<B: Backend> {
        a: Linear<B>,
        b: Linear<B>,
    }

    /// The scalar torch AdamW recurrence, written out independently.
    fn torch_adamw(p0: f64, grads: &[f64], lr: f64, c: AdamWConfig) -> f64 {
        let (mut p, mut m, mut v) = (p0, 0.0, 0.0);
        for (i, &g) in grads.iter().enumerate() {
            let t = (i + 1) as i32;
            p *= 1.0 - lr * c.weight_decay;
            m = c.beta1 * m + (1.0 - c.beta1) * g;
            v = c.beta2 * v + (1.0 - c.beta2) * g * g;
            let denom = v.sqrt() / (1.0 - c.beta2.powi(t)).sqrt() + c.eps;
            p -= lr / (1.0 - c.beta1.powi(t)) * m / denom;
        }
        p
    }

    fn values<const D: usize>(t: Tensor<AB, D>) -> Vec<f32> {
        t.into_data().convert::<f32>().into_vec().unwrap()
    }

    fn net() -> Net<AB> {
        let device = Default::default();
        Net {
            a: LinearConfig::new(3, 2).init(&device),
            b: LinearConfig::new(2, 1).init(&device),
        }
    }

    /// Gradients of `sum(b(a(x)))` for a fixed x, with their values read back.
    fn grads_of(model: &Net<AB>, scale: f32) -> GradientsParams {
        let device = Default::default();
        let x = Tensor::<AB, 2>::from_data([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0]], &device);
        let loss = model.b.forward(model.a.forward(x)).sum().mul_scalar(scale);
        GradientsParams::from_grads::<AB, _>(loss.backward(), model)
    }

    #[test]
    fn matches_the_torch_recurrence_over_several_steps() {
        let c = AdamWConfig::default();
        let lr = 0.05;
        let mut model = net();
        let mut opt = AdamW::<AB>::new(c);
        let w0 = values(model.a.weight.val());
        let mut history: Vec<Vec<f32>> = Vec::new();
        let mut ws = vec![w0.clone()];
        for step in 0..4 {
            let grads = grads_of(&model, 1.0 + step as f32);
            let g: Vec<f32> = values(
                grads
                    .get::<Inner, 2>(model.a.weight.id)
                    .map(Tensor::<AB, 2>::from_inner)
                    .unwrap(),
            );
            history.push(g);
            model = opt.step(lr, model, grads);
            ws.push(values(model.a.weight.val()));
        }
        for i in 0..w0.len() {
            let gs: Vec<f64> = history.iter().map(|g| g[i] as f64).collect();
            let expected = torch_adamw(w0[i] as f64, &gs, lr, c);
            let got = ws[4][i] as f64;
            assert!(
                (got - expected).abs() < 1e-5,
                "param {i}: {got} vs {expected}"
            );
        }
        assert_eq!(opt.num_states(), 4, "two weights and two biases");
    }

    #[test]
    fn defaults_are_torch_not_burn() {
        let c = AdamWConfig::default();
        assert_eq!(
            (c.beta1, c.beta2, c.eps, c.weight_decay),
            (0.9, 0.999, 1e-8, 0.01)
        );
    }

    #[test]
    fn state_round_trips_through_a_file_into_a_new_model() {
        let c = AdamWConfig::default();
        let mut model = net();
        let mut opt = AdamW::<AB>::new(c);
        for _ in 0..2 {
            let grads = grads_of(&model, 1.0);
            model = opt.step(0.01, model, grads);
        }
        let dir = std::env::temp_dir().join(format!("flowrl-adamw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("optim.safetensors");
        opt.save(&file).unwrap();

        // A "reloaded" model: same weights, fresh ParamIds.
        let record = <Net<AB> as Module<AB>>::into_record(model.clone());
        let mut reloaded = <Net<AB> as Module<AB>>::load_record(net(), record);
        let mut restored = AdamW::<AB>::new(AdamWConfig { eps: 1.0, ..c });
        restored
            .load(&file, &reloaded, &Default::default())
            .unwrap();
        assert_eq!(restored.config, c);

        let g1 = grads_of(&model, 1.0);
        let g2 = grads_of(&reloaded, 1.0);
        model = opt.step(0.01, model, g1);
        reloaded = restored.step(0.01, reloaded, g2);
        assert_eq!(
            values(model.a.weight.val()),
            values(reloaded.a.weight.val())
        );
        assert_eq!(
            values(model.b.bias.unwrap().val()),
            values(reloaded.b.bias.unwrap().val())
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[derive(Module, Debug)]
    struct Wider<B: Backend> {
        a: Linear<B>,
        b: Linear<B>,
    }

    #[test]
    fn state_of_another_model_is_refused_naming_the_parameter() {
        let mut model = net();
        let mut opt = AdamW::<AB>::new(AdamWConfig::default());
        let grads = grads_of(&model, 1.0);
        model = opt.step(0.01, model, grads);
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("optimizer.safetensors");
        opt.save(&file).unwrap();
        let device = Default::default();
        let err = |m: &dyn Fn(&mut AdamW<AB>) -> Result<()>| {
            let mut o = AdamW::<AB>::new(AdamWConfig::default());
            format!("{:#}", m(&mut o).unwrap_err())
        };
        // Other shapes: a is 4 → 2 instead of 3 → 2.
        let wider = Wider::<AB> {
            a: LinearConfig::new(4, 2).init(&device),
            b: LinearConfig::new(2, 1).init(&device),
        };
        let e = err(&|o| o.load(&file, &wider, &device));
        assert!(
            e.ends_with(
                "optimizer.safetensors: tensor `a.weight.exp_avg` has shape [6], the model's \
                 parameter [4, 2] needs [8]"
            ),
            "{e}"
        );
        // Fewer parameters: only `a`.
        let e = err(&|o| o.load(&file, &model.a, &device));
        assert!(
            e.ends_with(
                "it holds moments of parameter `a.bias`, which the model does not have (the \
                 state of another model?)"
            ),
            "{e}"
        );
        assert_eq!(
            param_shapes(&model).keys().collect::<Vec<_>>(),
            ["a.bias", "a.weight", "b.bias", "b.weight"]
        );
    }
}
