//! Token entropy and label log-probabilities from logits: verl's
//! `torch_functional.entropy_from_logits`, `logprobs_from_logits` and
//! `core_algos.compute_entropy_loss`.
//!
//! For logits z over a vocabulary of size V (natural-log units):
//!
//! * entropy H = logsumexp(z) − Σ_v softmax(z)_v · z_v
//! * log-prob of label y: log p(y) = z_y − logsumexp(z)
//!
//! Both are evaluated on z − max(z) (exact shift invariance), which keeps float32 accurate
//! for logits with a large common offset. The chunked variants process `chunk` positions
//! along the sequence at a time, so the softmax-sized temporaries never cover the whole
//! `[B, T, V]` tensor; [`entropy_and_logprobs_from_hidden`] goes further and computes the
//! logits themselves chunk by chunk from hidden states through an `lm_head` closure, so a
//! full `[B, T, V]` logits tensor never exists. All functions are differentiable (the max
//! shift is a constant of the graph, `row_max`; the gradient does not depend on it).
//!
//! [`sum_pi_squared_from_hidden`] gives Σ_v softmax(z)_v² per position the same way (verl
//! `torch_functional.calculate_sum_pi_squared_from_logits`, what the optimal-token-baseline
//! estimators read).

use burn::prelude::*;

use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::{AlgoError, Result};

/// max(z) over the vocabulary `[B, t, 1]`, as a constant of the graph: a leaf of its own,
/// computed on the device from an untracked copy of the logits and marked as requiring a
/// gradient (computed and dropped: a `[B, t, 1]` reduction). With `z − z.detach().max_dim(2)`,
/// burn-autodiff's checkpointing cannot recompute the subtraction (one input is a detached,
/// untracked value) and keeps its vocabulary-sized output for the backward; with a leaf it
/// keeps only the leaf and recomputes the shift. Same values, so the same log-probs, entropies
/// and gradients of everything else (tests/lm_head_constant_max.rs); on a backend without
/// autodiff the mark does nothing. No host round trip: the LM-head loop never waits for the
/// device.
fn row_max<B: Backend>(logits: &Tensor<B, 3>) -> Tensor<B, 3> {
    logits
        .clone()
        .detach()
        .set_require_grad(false)
        .max_dim(2)
        .require_grad()
}

/// z − max(z) (max a constant, [`row_max`]) and log Σ exp(z − max) `[B, t, 1]` of one
/// `[B, t, V]` block.
fn shift_lse<B: Backend>(logits: Tensor<B, 3>) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let max = row_max(&logits);
    let shifted = logits.sub(max);
    let lse = shifted.clone().exp().sum_dim(2).log();
    (shifted, lse)
}

/// H = lse − Σ softmax·z on the shifted block: `[B, t]`.
fn entropy_of<B: Backend>(shifted: Tensor<B, 3>, lse: Tensor<B, 3>) -> Tensor<B, 2> {
    let probs = shifted.clone().sub(lse.clone()).exp();
    lse.sub(probs.mul(shifted).sum_dim(2)).squeeze_dim(2)
}

/// z_y − lse on the shifted block: `[B, t]`.
fn logp_of<B: Backend>(
    shifted: Tensor<B, 3>,
    lse: Tensor<B, 3>,
    labels: Tensor<B, 2, Int>,
) -> Tensor<B, 2> {
    shifted
        .gather(2, labels.unsqueeze_dim(2))
        .sub(lse)
        .squeeze_dim(2)
}

/// Entropy and label log-probs `[B, t]` of one `[B, t, V]` block, with three vocabulary-sized
/// tensors instead of the five that [`entropy_of`] + [`logp_of`] build (and fewer again in the
/// backward). With x = z − max(z) (max a constant, [`row_max`]), e = exp(x), s = Σ_v e_v:
///
/// * log p(y) = x_y − log s (= z_y − logsumexp(z));
/// * H = log s − Σ_v e_v·x_v / s (= lse − Σ softmax(z)·z, since softmax = e / s and the shift
///   cancels: Σ softmax·(z − max) = Σ softmax·z − max).
///
/// Same values up to float rounding; the full tensors are x, e and e·x. This is the LM-head
/// path of every log-prob and update pass (32k-vocabulary blocks), where each full tensor is a
/// pass over memory in the forward and one or two more in the backward.
fn both<B: Backend>(
    logits: Tensor<B, 3>,
    labels: Tensor<B, 2, Int>,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let max = row_max(&logits);
    let shifted = logits.sub(max);
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

fn check_labels<B: Backend>(logits_dims: [usize; 3], labels: &Tensor<B, 2, Int>) -> Result<()> {
    let [b, t, _] = logits_dims;
    if labels.dims() != [b, t] {
        return Err(AlgoError::ShapeMismatch {
            what: "labels vs logits[..2]".into(),
            expected: vec![b, t],
            got: labels.dims().to_vec(),
        });
    }
    Ok(())
}

/// Labels must index the vocabulary (checked on the host: B·T integers, negligible next to the
/// logits), so that the gather below can never read out of bounds.
fn check_label_range<B: Backend>(labels: &Tensor<B, 2, Int>, v: usize) -> Result<()> {
    let data = labels.to_data();
    if let Some((i, bad)) = data
        .iter::<i64>()
        .enumerate()
        .find(|(_, x)| *x < 0 || *x as u64 >= v as u64)
    {
        return Err(AlgoError::InvalidParameter(format!(
            "label {bad} at flat position {i} is outside the vocabulary 0..{v}"
        )));
    }
    Ok(())
}

fn check_vocab(v: usize) -> Result<()> {
    if v == 0 {
        return Err(AlgoError::Empty(
            "logits have an empty vocabulary dimension".into(),
        ));
    }
    Ok(())
}

/// verl `entropy_from_logits`: H `[B, T]` from logits `[B, T, V]`.
pub fn entropy_from_logits<B: Backend>(logits: Tensor<B, 3>) -> Result<Tensor<B, 2>> {
    check_vocab(logits.dims()[2])?;
    let (shifted, lse) = shift_lse(logits);
    Ok(entropy_of(shifted, lse))
}

/// verl `logprobs_from_logits` (label logit − logsumexp): `[B, T]` from logits `[B, T, V]`
/// and integer labels `[B, T]` (labels outside `0..V` are an error).
pub fn logprobs_from_logits<B: Backend>(
    logits: Tensor<B, 3>,
    labels: Tensor<B, 2, Int>,
) -> Result<Tensor<B, 2>> {
    check_vocab(logits.dims()[2])?;
    check_labels(logits.dims(), &labels)?;
    check_label_range(&labels, logits.dims()[2])?;
    let (shifted, lse) = shift_lse(logits);
    Ok(logp_of(shifted, lse, labels))
}

/// Entropy and label log-probs `[B, T]` each, computed `chunk` sequence positions at a time
/// (verl `entropy_from_logits_with_chunking` chunks the same computation).
pub fn entropy_and_logprobs_chunked<B: Backend>(
    logits: Tensor<B, 3>,
    labels: Tensor<B, 2, Int>,
    chunk: usize,
) -> Result<(Tensor<B, 2>, Tensor<B, 2>)> {
    let [_, t, v] = logits.dims();
    check_vocab(v)?;
    check_labels(logits.dims(), &labels)?;
    check_label_range(&labels, v)?;
    chunked(t, chunk, |start, len| {
        Ok(both(
            logits.clone().narrow(1, start, len),
            labels.clone().narrow(1, start, len),
        ))
    })
}

/// `temperature` must be finite and > 0.
fn check_temperature(temperature: f64) -> Result<()> {
    if temperature.is_nan() || temperature <= 0.0 || temperature.is_infinite() {
        return Err(AlgoError::InvalidParameter(format!(
            "temperature must be finite and > 0, got {temperature}"
        )));
    }
    Ok(())
}

/// Logits `[B, len, V]` of positions `start..start + len` of `hidden` `[B, T, H]` through
/// `lm_head`, divided by `temperature` (unless it is 1); an error when `lm_head` does not map
/// the chunk to `[B, len, V ≥ 1]`.
fn chunk_logits<B: Backend, F>(
    hidden: &Tensor<B, 3>,
    lm_head: &F,
    temperature: f64,
    start: usize,
    len: usize,
) -> Result<Tensor<B, 3>>
where
    F: Fn(Tensor<B, 3>) -> Tensor<B, 3>,
{
    let b = hidden.dims()[0];
    let logits = lm_head(hidden.clone().narrow(1, start, len));
    let [lb, lt, v] = logits.dims();
    if [lb, lt] != [b, len] || v == 0 {
        return Err(AlgoError::ShapeMismatch {
            what: "lm_head output".into(),
            expected: vec![b, len, v.max(1)],
            got: vec![lb, lt, v],
        });
    }
    Ok(if temperature == 1.0 {
        logits
    } else {
        logits.div_scalar(temperature)
    })
}

/// Entropy and label log-probs `[B, T]` from hidden states `[B, T, H]`: `lm_head` maps a
/// `[B, t, H]` chunk to logits `[B, t, V]`, which are divided by `temperature` (verl divides
/// logits by the sampling temperature before these functions) and reduced at once, so only
/// one chunk of logits exists at a time. The labels are checked against the vocabulary once,
/// on the host (one read of `[B, T]` integers).
pub fn entropy_and_logprobs_from_hidden<B: Backend, F>(
    hidden: Tensor<B, 3>,
    labels: Tensor<B, 2, Int>,
    lm_head: F,
    temperature: f64,
    chunk: usize,
) -> Result<(Tensor<B, 2>, Tensor<B, 2>)>
where
    F: Fn(Tensor<B, 3>) -> Tensor<B, 3>,
{
    check_temperature(temperature)?;
    let [b, t, _] = hidden.dims();
    check_labels([b, t, 1], &labels)?;
    chunked(t, chunk, |start, len| {
        let logits = chunk_logits(&hidden, &lm_head, temperature, start, len)?;
        if start == 0 {
            // Once for every chunk: the vocabulary is known from the first.
            check_label_range(&labels, logits.dims()[2])?;
        }
        Ok(both(logits, labels.clone().narrow(1, start, len)))
    })
}

/// Σ_v π_v² `[B, T]` with π = softmax(z / temperature), from hidden states `[B, T, H]` through
/// `lm_head`, `chunk` positions at a time (verl `calculate_sum_pi_squared_from_logits`:
/// exp(logsumexp(2z) − 2·logsumexp(z)), evaluated on z − max(z)). It lies in [1/V, 1]: 1/V for
/// uniform logits, 1 for a one-hot distribution.
pub fn sum_pi_squared_from_hidden<B: Backend, F>(
    hidden: Tensor<B, 3>,
    lm_head: F,
    temperature: f64,
    chunk: usize,
) -> Result<Tensor<B, 2>>
where
    F: Fn(Tensor<B, 3>) -> Tensor<B, 3>,
{
    check_temperature(temperature)?;
    let t = hidden.dims()[1];
    let (sums, _) = chunked(t, chunk, |start, len| {
        let z = chunk_logits(&hidden, &lm_head, temperature, start, len)?;
        let max = row_max(&z);
        let shifted = z.sub(max);
        let lse = shifted.clone().exp().sum_dim(2).log();
        let lse2 = shifted.mul_scalar(2.0).exp().sum_dim(2).log();
        let s = lse2.sub(lse.mul_scalar(2.0)).exp().squeeze_dim(2);
        Ok((s.clone(), s))
    })?;
    Ok(sums)
}

fn chunked<B: Backend>(
    t: usize,
    chunk: usize,
    mut f: impl FnMut(usize, usize) -> Result<(Tensor<B, 2>, Tensor<B, 2>)>,
) -> Result<(Tensor<B, 2>, Tensor<B, 2>)> {
    if chunk == 0 {
        return Err(AlgoError::InvalidParameter(
            "chunk size must be >= 1".into(),
        ));
    }
    if t == 0 {
        return Err(AlgoError::Empty("sequence length is 0".into()));
    }
    let mut ents = Vec::new();
    let mut logps = Vec::new();
    let mut start = 0;
    while start < t {
        let len = chunk.min(t - start);
        let (e, l) = f(start, len)?;
        ents.push(e);
        logps.push(l);
        start += len;
    }
    Ok((Tensor::cat(ents, 1), Tensor::cat(logps, 1)))
}

/// verl `compute_entropy_loss(logits, response_mask, loss_agg_mode)`: the entropy reduced
/// with [`agg_loss`] and the local (default) normalisation.
pub fn entropy_loss<B: Backend>(
    logits: Tensor<B, 3>,
    response_mask: Tensor<B, 2>,
    mode: LossAggMode,
) -> Result<Tensor<B, 1>> {
    let h = entropy_from_logits(logits)?;
    agg_loss(h, response_mask, mode, &GlobalBatchInfo::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};

    type Ad = Autodiff<Flex>;

    #[test]
    fn sum_pi_squared_of_known_distributions() {
        // Row 0: uniform over 4 (Σπ² = 1/4); row 1: logits ln(1), ln(3) → π = (1/4, 3/4) with
        // two −inf-like entries: Σπ² = 10/16. Temperature 2 on row 0 changes nothing.
        let data: Vec<f32> = vec![0.0, 0.0, 0.0, 0.0, 0.0, 3f32.ln(), -100.0, -100.0];
        let h = Tensor::<Flex, 3>::from_data(TensorData::new(data, [2, 1, 4]), &Default::default());
        let s: Vec<f32> = sum_pi_squared_from_hidden(h.clone(), |x| x, 1.0, 1)
            .unwrap()
            .into_data()
            .iter::<f32>()
            .collect();
        assert!(
            (s[0] - 0.25).abs() < 1e-6 && (s[1] - 0.625).abs() < 1e-6,
            "{s:?}"
        );
        let hot = sum_pi_squared_from_hidden(h.mul_scalar(100.0), |x| x, 1.0, 2).unwrap();
        let hot: Vec<f32> = hot.into_data().iter::<f32>().collect();
        assert!((hot[1] - 1.0).abs() < 1e-6, "{hot:?}");
        assert!(
            sum_pi_squared_from_hidden(
                Tensor::<Flex, 3>::zeros([1, 1, 2], &Default::default()),
                |x| x,
                0.0,
                1
            )
            .is_err()
        );
    }

    fn values<const D: usize>(t: Tensor<Flex, D>) -> Vec<f32> {
        t.into_data().into_vec::<f32>().unwrap()
    }

    /// The fused block computation (`both`, behind the chunked functions) gives the values and
    /// the logits gradient of the separate formulas (`entropy_from_logits` +
    /// `logprobs_from_logits`), on logits with a large common offset and a wide spread.
    #[test]
    fn fused_block_matches_the_separate_formulas_in_values_and_gradient() {
        let device = Default::default();
        let [b, t, v] = [2, 5, 300];
        let n = b * t * v;
        let z: Vec<f32> = (0..n)
            .map(|i| 40.0 + ((i * 7919) % 997) as f32 / 997.0 * 12.0 - 6.0)
            .collect();
        let labels: Vec<i64> = (0..b * t).map(|i| ((i * 131) % v) as i64).collect();
        let weights: Vec<f32> = (0..b * t).map(|i| (i % 7) as f32 / 3.0 - 1.0).collect();
        let run = |fused: bool| {
            let logits = Tensor::<Ad, 1>::from_data(TensorData::new(z.clone(), [n]), &device)
                .reshape([b, t, v])
                .require_grad();
            let y =
                Tensor::<Ad, 1, Int>::from_data(TensorData::new(labels.clone(), [b * t]), &device)
                    .reshape([b, t]);
            let (h, lp) = if fused {
                entropy_and_logprobs_chunked(logits.clone(), y, 2).unwrap()
            } else {
                (
                    entropy_from_logits(logits.clone()).unwrap(),
                    logprobs_from_logits(logits.clone(), y).unwrap(),
                )
            };
            let w = Tensor::<Ad, 1>::from_data(TensorData::new(weights.clone(), [b * t]), &device)
                .reshape([b, t]);
            let loss = (h.clone() * w.clone()).sum() + (lp.clone() * w.mul_scalar(0.5)).sum();
            let grads = loss.backward();
            (
                values(h.inner()),
                values(lp.inner()),
                values(logits.grad(&grads).unwrap()),
            )
        };
        let (h1, l1, g1) = run(true);
        let (h0, l0, g0) = run(false);
        for (name, a, b, tol) in [
            ("entropy", h1, h0, 2e-6),
            ("log-prob", l1, l0, 2e-6),
            ("logits gradient", g1, g0, 1e-6),
        ] {
            let d = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
                .fold(0.0f32, f32::max);
            assert!(d <= tol, "{name}: relative difference {d} > {tol}");
        }
    }
}
