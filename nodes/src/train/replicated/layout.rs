//! The trainable parameters of a module as one flat buffer in module order ([`Layout`]), their
//! owners among the replicas ([`owners`]), and the moves between a module and such buffers:
//! gradients flattened and unflattened, owned values read and the others' written back, and the
//! weights a replica holds when the masters are sharded.

use std::collections::BTreeSet;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::DType;

use crate::runtime::backend::FlowBackend;
use crate::train::PartialStep;
use crate::train::grad_sum::StepGrads;

use super::copies::Trained;

/// The owner (global replica index) of each trainable parameter of sizes `numels` (module
/// order) on `world` replicas: contiguous runs of about `total / world` values, a parameter
/// going to the replica its middle falls in.
pub fn owners(numels: &[usize], world: usize) -> Vec<usize> {
    let total: usize = numels.iter().sum::<usize>().max(1);
    let mut before = 0usize;
    numels
        .iter()
        .map(|&n| {
            let middle = before as u128 * 2 + n as u128;
            before += n;
            ((middle * world as u128 / (2 * total as u128)) as usize).min(world - 1)
        })
        .collect()
}

/// The number of values each of `world` replicas owns.
pub(super) fn segments(numels: &[usize], owner: &[usize], world: usize) -> Vec<usize> {
    let mut out = vec![0; world];
    for (&n, &o) in numels.iter().zip(owner) {
        out[o] += n;
    }
    out
}

/// The trainable float parameters of a module in visit order: their module paths (the keys of
/// AdamW's state) and sizes.
pub(super) struct Layout {
    pub(super) paths: Vec<String>,
    pub(super) numels: Vec<usize>,
    pub(super) total: usize,
}

impl Layout {
    pub(super) fn of<B: FlowBackend, M: Module<B>>(module: &M) -> Self {
        struct Visit {
            path: Vec<String>,
            out: Layout,
        }
        impl<B: FlowBackend> ModuleVisitor<B> for Visit {
            fn enter_module(&mut self, name: &str, _container_type: &str) {
                self.path.push(name.to_string());
            }
            fn exit_module(&mut self, _name: &str, _container_type: &str) {
                self.path.pop();
            }
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let value = param.val();
                if value.is_require_grad() {
                    let n = value.shape().num_elements();
                    self.out.paths.push(self.path.join("."));
                    self.out.numels.push(n);
                    self.out.total += n;
                }
            }
        }
        let mut v = Visit {
            path: Vec::new(),
            out: Layout {
                paths: Vec::new(),
                numels: Vec::new(),
                total: 0,
            },
        };
        module.visit(&mut v);
        v.out
    }

    /// The paths of the parameters `replica` owns among `world` replicas.
    pub(super) fn owned_paths(&self, world: usize, replica: usize) -> BTreeSet<String> {
        owners(&self.numels, world)
            .into_iter()
            .zip(&self.paths)
            .filter(|(o, _)| *o == replica)
            .map(|(_, p)| p.clone())
            .collect()
    }
}

/// Visits the trainable float parameters of a module with their index in its [`Layout`].
fn for_trainable<B: FlowBackend, M: Module<B>>(
    module: &M,
    mut f: impl FnMut(usize, &dyn ErasedTensor<B>),
) {
    struct Visit<'a, B: FlowBackend> {
        index: usize,
        f: &'a mut dyn FnMut(usize, &dyn ErasedTensor<B>),
    }
    impl<B: FlowBackend> ModuleVisitor<B> for Visit<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            if value.is_require_grad() {
                (self.f)(self.index, &value);
                self.index += 1;
            }
        }
    }
    module.visit(&mut Visit {
        index: 0,
        f: &mut f,
    });
}

/// What [`for_trainable`] needs of a parameter whatever its rank.
trait ErasedTensor<B: FlowBackend> {
    /// Its values, f32, row-major.
    fn values(&self) -> Vec<f32>;
}

impl<B: FlowBackend, const D: usize> ErasedTensor<B> for Tensor<B, D> {
    fn values(&self) -> Vec<f32> {
        self.clone()
            .inner()
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32 values")
    }
}

/// `[gradients of the trainable parameters in layout order (zeros where absent) | one presence
/// flag per parameter | non-finite flag | stats]`.
pub(super) fn flatten<B: FlowBackend, M: Module<B>>(
    module: &M,
    layout: &Layout,
    step: PartialStep,
) -> Vec<f32> {
    let device_grads = match step.grads {
        Some(StepGrads::Host(h)) => {
            let mut flat = h.values;
            flat.reserve(h.present.len() + 1 + step.stats.len());
            flat.extend(h.present.iter().map(|&p| if p { 1.0 } else { 0.0 }));
            flat.push(0.0);
            flat.extend(step.stats.iter().map(|&s| s as f32));
            return flat;
        }
        Some(StepGrads::Device(g)) => Some(g),
        None => None,
    };
    struct Flatten<'a> {
        grads: Option<GradientsParams>,
        values: Vec<f32>,
        flags: Vec<f32>,
        layout: &'a Layout,
    }
    impl<B: FlowBackend> ModuleVisitor<B> for Flatten<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if !param.val().is_require_grad() {
                return;
            }
            let numel = self.layout.numels[self.flags.len()];
            let grad = self
                .grads
                .as_mut()
                .and_then(|g| g.remove::<B::InnerBackend, D>(param.id));
            match grad {
                Some(g) => {
                    let v = g.into_data().convert::<f32>();
                    self.values
                        .extend_from_slice(v.as_slice::<f32>().expect("f32 gradient"));
                    self.flags.push(1.0);
                }
                None => {
                    self.values.resize(self.values.len() + numel, 0.0);
                    self.flags.push(0.0);
                }
            }
        }
    }
    let nonfinite = if device_grads.is_none() { 1.0 } else { 0.0 };
    let mut v = Flatten {
        grads: device_grads,
        values: Vec::with_capacity(layout.total + layout.numels.len() + 1 + step.stats.len()),
        flags: Vec::new(),
        layout,
    };
    module.visit(&mut v);
    let mut flat = v.values;
    flat.extend(v.flags);
    flat.push(nonfinite);
    flat.extend(step.stats.iter().map(|&s| s as f32));
    flat
}

/// The summed gradients as `GradientsParams`, divided by `world`, of the parameters `held`
/// marks (whose values lie consecutively in `values` from `offset` of the layout) and whose
/// `flags` say some replica had a gradient for them.
pub(super) fn unflatten<B: FlowBackend, M: Module<B>>(
    module: &M,
    layout: &Layout,
    values: &[f32],
    offset: usize,
    held: &[bool],
    flags: &[f32],
    world: usize,
) -> GradientsParams {
    struct Unflatten<'a> {
        values: &'a [f32],
        /// Start of the next parameter in the layout's flat order.
        at: usize,
        offset: usize,
        index: usize,
        held: &'a [bool],
        flags: &'a [f32],
        numels: &'a [usize],
        scale: f32,
        grads: GradientsParams,
    }
    impl<B: FlowBackend> ModuleVisitor<B> for Unflatten<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            if !value.is_require_grad() {
                return;
            }
            let (i, n) = (self.index, self.numels[self.index]);
            if self.held[i] && self.flags[i] > 0.5 {
                let start = self.at - self.offset;
                let v: Vec<f32> = self.values[start..start + n]
                    .iter()
                    .map(|x| x * self.scale)
                    .collect();
                let t = Tensor::<B::InnerBackend, D>::from_data(
                    TensorData::new(v, value.shape()),
                    &value.device(),
                );
                self.grads.register::<B::InnerBackend, D>(param.id, t);
            }
            self.at += n;
            self.index += 1;
        }
    }
    let mut u = Unflatten {
        values,
        at: 0,
        offset,
        index: 0,
        held,
        flags,
        numels: &layout.numels,
        scale: 1.0 / world as f32,
        grads: GradientsParams::new(),
    };
    module.visit(&mut u);
    u.grads
}

/// Drops from `grads` the gradients of the trainable parameters `own` does not mark.
pub(super) fn retain<B: FlowBackend, M: Module<B>>(
    module: &M,
    grads: &mut GradientsParams,
    own: &[bool],
) {
    struct Retain<'a> {
        grads: &'a mut GradientsParams,
        own: &'a [bool],
        index: usize,
    }
    impl<B: FlowBackend> ModuleVisitor<B> for Retain<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if !param.val().is_require_grad() {
                return;
            }
            if !self.own[self.index] {
                let _ = self.grads.remove::<B::InnerBackend, D>(param.id);
            }
            self.index += 1;
        }
    }
    module.visit(&mut Retain {
        grads,
        own,
        index: 0,
    });
}

/// The values of the trainable parameters `replica` owns, in layout order.
pub(super) fn owned_values<B: FlowBackend, M: Module<B>>(
    module: &M,
    layout: &Layout,
    owner: &[usize],
    replica: usize,
) -> Vec<f32> {
    let mine: usize = layout
        .numels
        .iter()
        .zip(owner)
        .filter(|(_, o)| **o == replica)
        .map(|(n, _)| n)
        .sum();
    let mut out = Vec::with_capacity(mine);
    for_trainable(module, |i, t| {
        if owner[i] == replica {
            out.extend(t.values());
        }
    });
    out
}

/// `module` with every trainable parameter `replica` does not own replaced by its values in
/// `all` (the layout's flat order), keeping ids, `require_grad` and each parameter's dtype
/// (`whole`: in f32, the master weights whole).
pub(super) fn write_values<B: FlowBackend, M: Module<B>>(
    module: M,
    layout: &Layout,
    owner: &[usize],
    replica: usize,
    all: &[f32],
    whole: bool,
) -> M {
    struct Write<'a> {
        all: &'a [f32],
        at: usize,
        index: usize,
        owner: &'a [usize],
        numels: &'a [usize],
        replica: usize,
        whole: bool,
    }
    impl<B: FlowBackend> ModuleMapper<B> for Write<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            if !tensor.is_require_grad() {
                return Param::from_mapped_value(id, tensor, mapper);
            }
            let (i, n) = (self.index, self.numels[self.index]);
            let start = self.at;
            self.at += n;
            self.index += 1;
            if self.owner[i] == self.replica {
                return Param::from_mapped_value(id, tensor, mapper);
            }
            let inner = Tensor::<B::InnerBackend, D>::from_data(
                TensorData::new(self.all[start..start + n].to_vec(), tensor.shape()),
                &tensor.device(),
            );
            // A weight held in the compute precision (sharded masters) stays in it: the cast
            // its master's forward view would make.
            let dtype = if self.whole {
                DType::F32
            } else {
                tensor.dtype()
            };
            let inner = if inner.dtype() == dtype {
                inner
            } else {
                inner.cast(dtype)
            };
            Param::from_mapped_value(id, Tensor::from_inner(inner).require_grad(), mapper)
        }
    }
    module.map(&mut Write {
        all,
        at: 0,
        index: 0,
        owner,
        numels: &layout.numels,
        replica,
        whole,
    })
}

/// `module` as replica `replica` holds it when the masters are sharded (`owner`: each trainable
/// parameter's replica, [`owners`]): the trainable parameters of its backbone that it owns stay
/// f32 masters; the others become new leaves in `dtype`, the compute precision (a no-op for those already in it). The
/// forward view ([`Model::compute_view`](flowrl_models::Model::compute_view)) casts every backbone weight to
/// `dtype`, so the forward computes with the same values; the gradient a weight held in `dtype`
/// receives, widened to f32 ([`GradSum`]), is the one its master would have received through the
/// cast. A value model's head stays f32 on every replica (its forward is f32).
///
/// [`GradSum`]: crate::train::grad_sum::GradSum
pub(super) fn hold_own_masters<B: FlowBackend, M: Trained<B>>(
    module: M,
    owner: &[usize],
    replica: usize,
    dtype: DType,
) -> M {
    struct Hold<'a> {
        owner: &'a [usize],
        /// Trainable parameters of the backbone: the first ones in module order.
        backbone: usize,
        index: usize,
        replica: usize,
        dtype: DType,
    }
    impl<B: FlowBackend> ModuleMapper<B> for Hold<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            if !tensor.is_require_grad() {
                return Param::from_mapped_value(id, tensor, mapper);
            }
            let i = self.index;
            self.index += 1;
            if i >= self.backbone || self.owner[i] == self.replica || tensor.dtype() == self.dtype {
                return Param::from_mapped_value(id, tensor, mapper);
            }
            let held = Tensor::from_inner(tensor.inner().cast(self.dtype)).require_grad();
            Param::from_mapped_value(id, held, mapper)
        }
    }
    let backbone = Layout::of(module.backbone()).numels.len();
    module.map(&mut Hold {
        owner,
        backbone,
        index: 0,
        replica,
        dtype,
    })
}
