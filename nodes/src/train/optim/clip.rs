//! Global-norm gradient clipping, as `torch.nn.utils.clip_grad_norm_` (norm type 2).
//!
//! ```text
//! total_norm = sqrt( Σ_params Σ_elements g² )          one norm over all gradients together
//! coef       = min(1, max_norm / (total_norm + 1e-6))
//! g          ← g · coef                                  every gradient, same factor
//! ```
//!
//! burn's `GradientClipping::Norm` clips each tensor by its own norm, which changes the direction
//! of the update; verl (through FSDP / torch) clips by the global norm. `clip_grad_norm` returns the
//! norm before clipping, which verl logs as `actor/grad_norm`; a non-finite norm means the step
//! must be skipped (verl: "grad_norm is not finite, skip this update").

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

/// The 2-norm of all gradients of `model` in `grads`, as one vector (f64 on the host).
pub fn global_grad_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &GradientsParams,
) -> f64 {
    grad_sum_squares(model, grads).sqrt()
}

/// `Σ g²` over all gradients of `model` in `grads` (summed on the device, read as f64): the
/// square of [`global_grad_norm`], which a sharded optimizer adds up over replicas.
pub fn grad_sum_squares<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &GradientsParams,
) -> f64 {
    struct SumSquares<'a, B: AutodiffBackend> {
        grads: &'a GradientsParams,
        total: Option<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for SumSquares<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                let s = g.square().sum();
                self.total = Some(match self.total.take() {
                    Some(t) => t + s,
                    None => s,
                });
            }
        }
    }
    let mut v = SumSquares::<B> { grads, total: None };
    model.visit(&mut v);
    match v.total {
        Some(t) => t.into_scalar().elem::<f64>(),
        None => 0.0,
    }
}

/// Multiplies every gradient of `model` in `grads` by `factor`.
pub fn scale_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    factor: f64,
) {
    struct Scale<'a> {
        grads: &'a mut GradientsParams,
        factor: f64,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                self.grads
                    .register::<B::InnerBackend, D>(param.id, g.mul_scalar(self.factor));
            }
        }
    }
    model.visit(&mut Scale { grads, factor });
}

/// torch's `clip_grad_norm_(params, max_norm)`: returns the total norm before clipping and scales
/// the gradients by `min(1, max_norm / (norm + 1e-6))` when the norm is finite (a non-finite norm
/// leaves the gradients as they are; the caller skips the step).
pub fn clip_grad_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> f64 {
    let norm = global_grad_norm(model, grads);
    if norm.is_finite() {
        let coef = (max_norm / (norm + 1e-6)).min(1.0);
        if coef < 1.0 {
            scale_grads(model, grads, coef);
        }
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::backend::AutodiffBackend;

    type B = crate::runtime::backend::CpuBackend;
    type Inner = <B as AutodiffBackend>::InnerBackend;

    fn setup() -> (Linear<B>, GradientsParams) {
        let device = Default::default();
        let lin: Linear<B> = LinearConfig::new(3, 2).init(&device);
        let x = Tensor::<B, 2>::from_data([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]], &device);
        let loss = lin.forward(x).sum().mul_scalar(3.0);
        let grads = GradientsParams::from_grads(loss.backward(), &lin);
        (lin, grads)
    }

    fn flat(lin: &Linear<B>, grads: &GradientsParams) -> Vec<f64> {
        let mut v: Vec<f64> = grads
            .get::<Inner, 2>(lin.weight.id)
            .unwrap()
            .into_data()
            .convert::<f64>()
            .into_vec()
            .unwrap();
        v.extend(
            grads
                .get::<Inner, 1>(lin.bias.as_ref().unwrap().id)
                .unwrap()
                .into_data()
                .convert::<f64>()
                .into_vec::<f64>()
                .unwrap(),
        );
        v
    }

    #[test]
    fn norm_is_over_all_tensors_and_clipping_keeps_the_direction() {
        let (lin, mut grads) = setup();
        let before = flat(&lin, &grads);
        let expected = before.iter().map(|g| g * g).sum::<f64>().sqrt();
        let norm = global_grad_norm(&lin, &grads);
        assert!((norm - expected).abs() < 1e-4 * expected);

        let max_norm = expected / 4.0;
        let returned = clip_grad_norm(&lin, &mut grads, max_norm);
        assert!(
            (returned - expected).abs() < 1e-4 * expected,
            "returns the pre-clip norm"
        );
        let after = flat(&lin, &grads);
        let coef = max_norm / (expected + 1e-6);
        for (a, b) in after.iter().zip(&before) {
            assert!((a - b * coef).abs() < 1e-5, "one factor for every tensor");
        }
        let new_norm = global_grad_norm(&lin, &grads);
        assert!((new_norm - max_norm).abs() < 1e-4);
    }

    #[test]
    fn small_gradients_are_untouched() {
        let (lin, mut grads) = setup();
        let before = flat(&lin, &grads);
        clip_grad_norm(&lin, &mut grads, 1e9);
        assert_eq!(flat(&lin, &grads), before);
    }

    #[test]
    fn non_finite_norm_is_reported_and_grads_left_alone() {
        let (lin, mut grads) = setup();
        let w = grads.remove::<Inner, 2>(lin.weight.id).unwrap();
        grads.register::<Inner, 2>(lin.weight.id, w.mul_scalar(f32::NAN));
        let norm = clip_grad_norm(&lin, &mut grads, 1.0);
        assert!(!norm.is_finite());
    }
}
