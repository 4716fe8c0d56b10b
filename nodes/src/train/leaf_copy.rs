//! Leaf copies of a model's weights under autodiff, for backward passes that start from a view
//! (the chunked backward's LM head, a checkpointed segment).

use std::collections::HashSet;

use burn::module::{AutodiffModule, Module};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use flowrl_models::Model;

/// `inner` (the inner model of a view of `model`) as an autodiff model of leaves with `model`'s
/// parameter ids: the parameters that require gradients in `model` require them here too.
pub(crate) fn leaf_copy<B: AutodiffBackend>(
    model: &Model<B>,
    inner: Model<B::InnerBackend>,
) -> Model<B> {
    use burn::module::{ModuleMapper, ModuleVisitor, Param, ParamId};
    struct Trainable(HashSet<ParamId>);
    impl<B: Backend> ModuleVisitor<B> for Trainable {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if param.val().is_require_grad() {
                self.0.insert(param.id);
            }
        }
    }
    struct RequireGrad(HashSet<ParamId>);
    impl<B: Backend> ModuleMapper<B> for RequireGrad {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            if self.0.contains(&param.id) {
                param.map(|t| t.require_grad())
            } else {
                param.map(|t| t.set_require_grad(false))
            }
        }
    }
    let mut trainable = Trainable(HashSet::new());
    model.visit(&mut trainable);
    Model::<B>::from_inner(inner).map(&mut RequireGrad(trainable.0))
}
