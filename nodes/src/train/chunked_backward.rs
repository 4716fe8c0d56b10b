//! The two-stage chunked backward of a loss of the response log-probs and entropies (see
//! [`chunked_loss_backward`]), with at most one block of logits alive at a time.

use anyhow::{Result, ensure};
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use flowrl_models::Model;

use super::checkpoint::TrunkBackward;
use super::grad_sum::GradSum;
use super::leaf_copy::leaf_copy;

/// Per response token: log-prob of the token and entropy of the distribution, `[b, T]`.
pub struct ResponseLogProbs<B: Backend> {
    pub log_probs: Tensor<B, 2>,
    pub entropy: Tensor<B, 2>,
}

/// What [`chunked_loss_backward`] computed for one micro-batch besides its gradients.
pub struct LossPass<B: Backend> {
    /// The loss value (from the pass-1 values); not finite: no backward ran.
    pub loss: f64,
    /// The pass-1 log-probs and entropies `[b, T]`, constants (no graph).
    pub values: ResponseLogProbs<B>,
}

/// The gradients of a loss of the response log-probs and entropies with respect to `model`'s
/// parameters, with at most one `[B, chunk, V]` block of logits alive at a time, forward or
/// backward.
///
/// `response_hidden` `[B, T, H]` is the output of a trunk forward on `view` (the model itself,
/// or a recorded cast of it: [`Model::compute_view`]), with its graph, and the [`TrunkBackward`] of
/// that forward; `labels` `[B, T]`; `loss_of`
/// maps the log-probs and entropies `[B, T]` to the scalar loss. With x = (x_1, …, x_C) the
/// per-chunk log-prob and entropy blocks (x_c = f(h_c, W) for the LM head weights W and the
/// chunk's hidden states h_c = response_hidden[:, c]), the chain rule gives
///
/// ```text
/// dL/dθ = Σ_c (∂L/∂x_c)(x) · ∂x_c/∂θ,        ∂L/∂x = g  (one [B, T] pair, from the values)
/// ```
///
/// so the backward splits, exactly, into:
///
/// 1. **Pass 1, values only**: x chunk by chunk on the inner backend (no autodiff graph: no
///    logits are kept).
/// 2. **The loss**: `loss_of` on x as leaves, one backward through the (`[B, T]`-sized) loss
///    graph: g = ∂L/∂x. A non-finite loss stops here (nothing is added to `sum`).
/// 3. **Pass 2, per chunk**: the chunk's logits again from a leaf copy h_c of its hidden states
///    through leaf copies of the view's weights, and one backward of Σ g_c ⊙ x_c, whose
///    gradients are g_c·∂x_c/∂h_c (kept: `[B, len, H]`) and g_c·∂x_c/∂W (the LM head's, or the
///    tied embedding's, weight gradients, added to `sum` in f32). Then the chunk's graph is
///    gone.
/// 4. **Trunk**: one backward of Σ response_hidden ⊙ G, G = the chunks' hidden-state gradients
///    side by side (a constant): its gradient with respect to response_hidden is G, so this is
///    the trunk's share of dL/dθ (a tied embedding adds it to its LM-head share), taken by the
///    [`TrunkBackward`]: through the forward's graph, or segment by segment when checkpointed.
///
/// Why it is exact: ∂L/∂x_c is evaluated once at the same values the single graph sees, and
/// each block's contribution goes through the same operations as in the single graph (the same
/// chunk boundaries, so the same `entropy_and_logprobs_from_hidden` blocks); only the order in
/// which float gradients are summed differs (a tied embedding's two shares; the LM head's
/// per-chunk weight gradients, which are summed in f32 where a bf16 graph summed them in
/// bf16). Every metric of the caller is computed from the pass-1 values, which
/// are those of the single graph's forward.
///
/// The view's recorded casts (mixed precision) reach the masters only through the trunk
/// backward: a backward consumes the steps of the nodes it traverses, so pass 2 differentiates
/// with respect to leaf copies of the view's weights (same parameter ids), whose gradients
/// `sum` widens to f32 itself. Parameters of `model` that do not require gradients get none.
#[allow(clippy::too_many_arguments)]
pub fn chunked_loss_backward<B, L>(
    model: &Model<B>,
    view: &Model<B>,
    (response_hidden, trunk): (Tensor<B, 3>, TrunkBackward<B>),
    labels: Tensor<B, 2, Int>,
    temperature: f64,
    chunk: usize,
    loss_of: L,
    sum: &mut GradSum,
) -> Result<LossPass<B>>
where
    B: AutodiffBackend,
    L: FnOnce(Tensor<B, 2>, Tensor<B, 2>) -> Result<Tensor<B, 1>>,
{
    ensure!(chunk > 0, "chunk size must be >= 1");
    let [b, t, _] = response_hidden.dims();
    ensure!(
        labels.dims() == [b, t],
        "labels {:?} do not match the hidden states {:?}",
        labels.dims(),
        response_hidden.dims()
    );
    // Pass 1: values only, on the inner backend.
    let inner_view = view.valid();
    let hidden = response_hidden.clone().inner();
    let inner_labels = labels.clone().inner();
    let (entropy, log_probs) = flowrl_algorithms::entropy_and_logprobs_from_hidden(
        hidden.clone(),
        inner_labels,
        |h| inner_view.causal_lm().lm_head(h),
        temperature,
        chunk,
    )?;
    let values = ResponseLogProbs {
        log_probs: Tensor::<B, 2>::from_inner(log_probs.clone()),
        entropy: Tensor::<B, 2>::from_inner(entropy.clone()),
    };

    // The loss on the values as leaves: g = ∂L/∂x.
    let lp_leaf = Tensor::<B, 2>::from_inner(log_probs).require_grad();
    let ent_leaf = Tensor::<B, 2>::from_inner(entropy).require_grad();
    let loss = loss_of(lp_leaf.clone(), ent_leaf.clone())?;
    let value = loss.clone().detach().into_scalar().elem::<f64>();
    let pass = LossPass {
        loss: value,
        values,
    };
    if !value.is_finite() {
        return Ok(pass);
    }
    let grads = loss.backward();
    let g_lp = lp_leaf.grad(&grads);
    let g_ent = ent_leaf.grad(&grads);
    drop(grads);
    if g_lp.is_none() && g_ent.is_none() {
        // The loss does not depend on the log-probs or entropies: no gradient at all.
        return Ok(pass);
    }

    // Pass 2: per chunk, through leaf copies of the view's weights.
    let head = leaf_copy(model, inner_view);
    let mut hidden_grads = Vec::with_capacity(t.div_ceil(chunk));
    let mut start = 0;
    while start < t {
        let len = chunk.min(t - start);
        let h = Tensor::<B, 3>::from_inner(hidden.clone().narrow(1, start, len)).require_grad();
        let (ent, lp) = flowrl_algorithms::entropy_and_logprobs_from_hidden(
            h.clone(),
            labels.clone().narrow(1, start, len),
            |x| head.causal_lm().lm_head(x),
            temperature,
            len,
        )?;
        let weighted = |x: Tensor<B, 2>, g: &Option<Tensor<B::InnerBackend, 2>>| {
            g.as_ref()
                .map(|g| (x * Tensor::<B, 2>::from_inner(g.clone().narrow(1, start, len))).sum())
        };
        let surrogate = match (weighted(lp, &g_lp), weighted(ent, &g_ent)) {
            (Some(a), Some(e)) => a + e,
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => unreachable!("checked above"),
        };
        let grads = surrogate.backward();
        let g_h = h
            .grad(&grads)
            .unwrap_or_else(|| h.clone().inner().zeros_like());
        hidden_grads.push(g_h);
        sum.add(model, GradientsParams::from_grads::<B, _>(grads, &head));
        start += len;
    }

    // The trunk: Σ response_hidden ⊙ G has the gradient G with respect to response_hidden.
    let g = Tensor::<B, 3>::from_inner(Tensor::cat(hidden_grads, 1));
    trunk.backward((response_hidden * g).sum(), model, sum);
    Ok(pass)
}
