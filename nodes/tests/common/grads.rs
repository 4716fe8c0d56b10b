//! Gradient comparisons on the CPU training backend: every parameter's gradient and the largest
//! relative difference between two sets of them.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use flowrl_models::Model;
use flowrl_nodes::runtime::backend::CpuBackend;

type Ad = CpuBackend;
type Inner = <Ad as burn::tensor::backend::AutodiffBackend>::InnerBackend;

/// Every float parameter's gradient (`None` when absent), in module order.
pub fn grad_values(model: &Model<Ad>, grads: &GradientsParams) -> Vec<Option<Vec<f32>>> {
    struct Collect<'a>(&'a GradientsParams, Vec<Option<Vec<f32>>>);
    impl ModuleVisitor<Ad> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
            let g = self.0.get::<Inner, D>(param.id).map(|g| {
                assert_eq!(g.dtype(), param.val().dtype(), "gradient dtype");
                g.into_data().convert::<f32>().into_vec::<f32>().unwrap()
            });
            self.1.push(g);
        }
    }
    let mut c = Collect(grads, Vec::new());
    model.visit(&mut c);
    c.1
}

/// Max over parameters of max |a − b| / max |b| (the parameter's scale); the same parameters
/// must have gradients on both sides, and there must be some.
pub fn max_relative(
    model: &Model<Ad>,
    a: &GradientsParams,
    b: &GradientsParams,
    what: &str,
) -> f64 {
    let (a, b) = (grad_values(model, a), grad_values(model, b));
    assert_eq!(a.len(), b.len());
    let mut worst = 0f64;
    let mut present = 0;
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        match (x, y) {
            (Some(x), Some(y)) => {
                present += 1;
                let scale = y.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                let d = x
                    .iter()
                    .zip(y)
                    .map(|(p, q)| (p - q).abs())
                    .fold(0f32, f32::max) as f64;
                assert!(d.is_finite(), "{what}: parameter {i}: non-finite gradient");
                if scale > 0.0 {
                    worst = worst.max(d / scale);
                } else {
                    assert_eq!(d, 0.0, "{what}: parameter {i}");
                }
            }
            (None, None) => {}
            _ => panic!(
                "{what}: parameter {i} has a gradient on one side only (first {}, second {})",
                x.is_some(),
                y.is_some()
            ),
        }
    }
    assert!(present > 0, "{what}: no gradients");
    worst
}
