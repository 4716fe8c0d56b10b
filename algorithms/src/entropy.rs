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
//! shift is detached; the gradient does not depend on it).

use burn::prelude::*;

use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::{AlgoError, Result};

/// z − max(z) (max detached) and log Σ exp(z − max) `[B, t, 1]` of one `[B, t, V]` block.
fn shift_lse<B: Backend>(logits: Tensor<B, 3>) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let max = logits.clone().detach().max_dim(2);
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

/// Entropy and label log-probs of one block.
fn both<B: Backend>(
    logits: Tensor<B, 3>,
    labels: Tensor<B, 2, Int>,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let (shifted, lse) = shift_lse(logits);
    (
        entropy_of(shifted.clone(), lse.clone()),
        logp_of(shifted, lse, labels),
    )
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

/// Entropy and label log-probs `[B, T]` from hidden states `[B, T, H]`: `lm_head` maps a
/// `[B, t, H]` chunk to logits `[B, t, V]`, which are divided by `temperature` (verl divides
/// logits by the sampling temperature before these functions) and reduced at once, so only
/// one chunk of logits exists at a time.
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
    if temperature.is_nan() || temperature <= 0.0 || temperature.is_infinite() {
        return Err(AlgoError::InvalidParameter(format!(
            "temperature must be finite and > 0, got {temperature}"
        )));
    }
    let [b, t, _] = hidden.dims();
    check_labels([b, t, 1], &labels)?;
    chunked(t, chunk, |start, len| {
        let logits = lm_head(hidden.clone().narrow(1, start, len));
        let [lb, lt, v] = logits.dims();
        if [lb, lt] != [b, len] || v == 0 {
            return Err(AlgoError::ShapeMismatch {
                what: "lm_head output".into(),
                expected: vec![b, len, v.max(1)],
                got: vec![lb, lt, v],
            });
        }
        let labels = labels.clone().narrow(1, start, len);
        check_label_range(&labels, v)?;
        let logits = if temperature == 1.0 {
            logits
        } else {
            logits.div_scalar(temperature)
        };
        Ok(both(logits, labels))
    })
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
