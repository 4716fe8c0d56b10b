//! The sum of one replica's gradients over an optimizer step, taken as the backward passes hand
//! them over: per LM-head chunk, per recomputed segment of a checkpointed trunk, per
//! micro-batch.
//!
//! Every gradient is summed in f32, whatever its parameter's dtype: an f32 master's gradient
//! is f32 already; a parameter held in the compute precision (a replica's share of weights it
//! does not own, when the masters are sharded: [`crate::train::replicated`]) gets its bf16
//! gradient widened, which is the f32 gradient its master would have received through the
//! recorded cast of the forward view, so the sum is the unsharded one.
//!
//! Where the sum lives:
//! - [`GradSum::on_device`] (one replica in all): on the parameters' device, as burn's
//!   `GradientsAccumulator` keeps it; the optimizer steps it in place.
//! - [`GradSum::on_host`] (several replicas, which exchange host vectors anyway): one f32 host
//!   vector over the trained module's trainable parameters in module order, to which each
//!   handed-over gradient is added and then dropped, so the device never holds more than the
//!   gradients of the piece of backward in flight — no accumulated set beside them.
//!
//! Both add in the order the pieces arrive, element by element in f32: the same bits.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::backend::AutodiffBackend;

/// See the module doc.
pub struct GradSum {
    inner: Inner,
}

enum Inner {
    Device(GradientsParams),
    Host(HostGrads),
}

/// A gradient sum on the host: `values` over the trainable parameters in module order (zeros
/// where none arrived), `present[i]` whether parameter `i` received any.
#[derive(Debug, Clone, PartialEq)]
pub struct HostGrads {
    pub values: Vec<f32>,
    pub present: Vec<bool>,
}

/// What a replica hands over at the end of a step.
pub enum StepGrads {
    Device(GradientsParams),
    Host(HostGrads),
}

impl GradSum {
    /// A sum kept on the parameters' device.
    pub fn on_device() -> Self {
        GradSum {
            inner: Inner::Device(GradientsParams::new()),
        }
    }

    /// A sum kept on the host, over trainable parameters of `sizes` values each, in module
    /// order (the layout of the module the step trains: every later [`GradSum::add`] names it).
    pub fn on_host(sizes: &[usize]) -> Self {
        GradSum {
            inner: Inner::Host(HostGrads {
                values: vec![0.0; sizes.iter().sum()],
                present: vec![false; sizes.len()],
            }),
        }
    }

    /// Adds `grads` (gradients on the inner backend keyed by `module`'s parameters, as
    /// `GradientsParams::from_grads` gives them) to the sum, in f32; `module` is the trained
    /// module or one whose parameters it holds under the same ids.
    pub fn add<B: AutodiffBackend, M: Module<B>>(
        &mut self,
        module: &M,
        mut grads: GradientsParams,
    ) {
        match &mut self.inner {
            Inner::Device(sum) => {
                struct AddOnDevice<'a> {
                    grads: &'a mut GradientsParams,
                    sum: &'a mut GradientsParams,
                }
                impl<B: AutodiffBackend> ModuleVisitor<B> for AddOnDevice<'_> {
                    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                        let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
                            return;
                        };
                        let g = if g.dtype() == DType::F32 {
                            g
                        } else {
                            g.cast(DType::F32)
                        };
                        let g = match self.sum.remove::<B::InnerBackend, D>(param.id) {
                            Some(s) => s + g,
                            None => g,
                        };
                        self.sum.register::<B::InnerBackend, D>(param.id, g);
                    }
                }
                module.visit(&mut AddOnDevice {
                    grads: &mut grads,
                    sum,
                });
            }
            Inner::Host(sum) => {
                struct AddOnHost<'a> {
                    grads: &'a mut GradientsParams,
                    sum: &'a mut HostGrads,
                    index: usize,
                    at: usize,
                }
                impl<B: AutodiffBackend> ModuleVisitor<B> for AddOnHost<'_> {
                    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                        let value = param.val();
                        if !value.is_require_grad() {
                            return;
                        }
                        let (i, start) = (self.index, self.at);
                        let n = value.shape().num_elements();
                        self.index += 1;
                        self.at += n;
                        let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
                            return;
                        };
                        let g = g.into_data().convert::<f32>();
                        let g = g.as_slice::<f32>().expect("f32 gradient");
                        let into = &mut self.sum.values[start..start + n];
                        if self.sum.present[i] {
                            into.iter_mut().zip(g).for_each(|(s, v)| *s += *v);
                        } else {
                            into.copy_from_slice(g);
                            self.sum.present[i] = true;
                        }
                    }
                }
                module.visit(&mut AddOnHost {
                    grads: &mut grads,
                    sum,
                    index: 0,
                    at: 0,
                });
            }
        }
    }

    /// The sum.
    pub fn finish(self) -> StepGrads {
        match self.inner {
            Inner::Device(g) => StepGrads::Device(g),
            Inner::Host(h) => StepGrads::Host(h),
        }
    }

    /// The sum on the device (a sum made by [`GradSum::on_device`]).
    pub fn into_device(self) -> GradientsParams {
        match self.inner {
            Inner::Device(g) => g,
            Inner::Host(_) => panic!("a host gradient sum asked for device gradients"),
        }
    }
}
