//! The LM-head block's max shift as a graph constant (`entropy::row_max`: the row maxima are
//! computed on the device from the detached logits and enter the graph as a leaf) against the detached max it replaced
//! (`z − z.detach().max_dim(2)`, written out here), under the update's autodiff backend
//! (`Autodiff<Flex, BalancedCheckpointing>`): the same entropies and log-probs (≤ 1e-6), the
//! same gradients of the hidden states and of the LM-head weight (≤ 1e-5 relative), chunked
//! with a temperature, and the same Σπ² of `sum_pi_squared_from_hidden`.

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::Distribution;
use flowrl_algorithms::entropy::{entropy_and_logprobs_from_hidden, sum_pi_squared_from_hidden};

type AB = Autodiff<Flex, BalancedCheckpointing>;

const T: f64 = 0.7;

/// The block before the change: z / T, max detached, then `both`'s formulas.
fn detached_max_reference(
    hidden: Tensor<AB, 3>,
    w: Tensor<AB, 2>,
    labels: Tensor<AB, 2, Int>,
) -> (Tensor<AB, 2>, Tensor<AB, 2>) {
    let z = hidden.matmul(w.unsqueeze_dim(0)).div_scalar(T);
    let shifted = z.clone().sub(z.detach().max_dim(2));
    let e = shifted.clone().exp();
    let s = e.clone().sum_dim(2);
    let log_s = s.clone().log();
    let entropy = log_s
        .clone()
        .sub(e.mul(shifted.clone()).sum_dim(2).div(s))
        .squeeze_dim(2);
    let logp = shifted
        .gather(2, labels.unsqueeze_dim(2))
        .sub(log_s)
        .squeeze_dim(2);
    (entropy, logp)
}

fn host<const D: usize>(t: Tensor<AB, D>) -> Vec<f32> {
    t.into_data().into_vec::<f32>().unwrap()
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{what}[{i}]: {a} vs {b}"
        );
    }
}

#[test]
fn constant_max_gives_the_detached_max_values_and_gradients() {
    let device = Default::default();
    <AB as Backend>::seed(&device, 3);
    let (b, t, h, v) = (3, 7, 16, 301);
    let hidden_values = Tensor::<AB, 3>::random([b, t, h], Distribution::Normal(0.0, 2.0), &device);
    let w_values = Tensor::<AB, 2>::random([h, v], Distribution::Normal(0.0, 1.0), &device);
    let labels =
        Tensor::<AB, 2, Int>::random([b, t], Distribution::Uniform(0.0, v as f64), &device);
    let leaves = || {
        (
            hidden_values.clone().detach().require_grad(),
            w_values.clone().detach().require_grad(),
        )
    };
    // Both paths: values, then the gradients of a loss mixing both outputs.
    let run = |new: bool| {
        let (hidden, w) = leaves();
        let (entropy, logp) = if new {
            let w2 = w.clone();
            entropy_and_logprobs_from_hidden(
                hidden.clone(),
                labels.clone(),
                move |x| x.matmul(w2.clone().unsqueeze_dim(0)),
                T,
                3,
            )
            .unwrap()
        } else {
            detached_max_reference(hidden.clone(), w.clone(), labels.clone())
        };
        let loss = logp.clone().sum().mul_scalar(-1.0) + entropy.clone().sum().mul_scalar(0.3);
        let grads = loss.backward();
        (
            host(entropy.detach()),
            host(logp.detach()),
            host(Tensor::<AB, 3>::from_inner(hidden.grad(&grads).unwrap())),
            host(Tensor::<AB, 2>::from_inner(w.grad(&grads).unwrap())),
        )
    };
    let (e_new, lp_new, gh_new, gw_new) = run(true);
    let (e_old, lp_old, gh_old, gw_old) = run(false);
    close("entropy", &e_new, &e_old, 1e-6);
    close("log-prob", &lp_new, &lp_old, 1e-6);
    close("hidden gradient", &gh_new, &gh_old, 1e-5);
    close("lm-head gradient", &gw_new, &gw_old, 1e-5);

    // Σπ², same shift.
    let (hidden, w) = leaves();
    let sums = sum_pi_squared_from_hidden(
        hidden.clone(),
        move |x| x.matmul(w.clone().unsqueeze_dim(0)),
        T,
        3,
    )
    .unwrap();
    let z = hidden
        .matmul(w_values.clone().unsqueeze_dim(0))
        .div_scalar(T);
    let shifted = z.clone().sub(z.detach().max_dim(2));
    let lse = shifted.clone().exp().sum_dim(2).log();
    let lse2 = shifted.mul_scalar(2.0).exp().sum_dim(2).log();
    let want = lse2.sub(lse.mul_scalar(2.0)).exp().squeeze_dim::<2>(2);
    close("sum pi squared", &host(sums), &host(want), 1e-6);
}
