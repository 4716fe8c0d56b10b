//! The flash attention under burn's autodiff: the backward op ([`FlashBackward`]) that
//! recomputes the scores, and the tracked forward that records it.

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;

use super::launch::{backward, dims4, forward};
use super::params::MaskRule;
use crate::kernels::cube::{Cube, CubeRuntime, CubeTensor, from_tracked, tracked};

/// The backward op: the gradients of q, k and v from the recomputed scores.
#[derive(Debug)]
struct FlashBackward;

/// What the backward keeps: q, k and v (checkpointed), the segments, the output and its
/// log-sum-exp, the rule and the scale.
type FlashState<R> = (
    NodeId,
    NodeId,
    NodeId,
    CubeTensor<R>,
    CubeTensor<R>,
    CubeTensor<R>,
    MaskRule,
    f64,
);

impl<R: CubeRuntime> Backward<Cube<R>, 3> for FlashBackward {
    type State = FlashState<R>;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_q, node_k, node_v] = ops.parents;
        let grad_out = grads.consume::<Cube<R>>(&ops.node);
        let (q_id, k_id, v_id, segments, out, lse, rule, scale) = ops.state;
        let q: CubeTensor<R> = checkpointer.retrieve_node_output(q_id);
        let k: CubeTensor<R> = checkpointer.retrieve_node_output(k_id);
        let v: CubeTensor<R> = checkpointer.retrieve_node_output(v_id);
        let (grad_q, grad_k, grad_v) =
            backward::<R>(&q, &k, &v, &segments, &out, &lse, &grad_out, rule, scale);
        let keys = segments.meta.shape()[1];
        // A reserved cache is never differentiated, but k and v may be longer than the
        // keys read; their gradient beyond is 0.
        let pad = |g: CubeTensor<R>, like: &CubeTensor<R>| -> CubeTensor<R> {
            if like.meta.shape()[2] == keys {
                return g;
            }
            let full =
                Tensor::<Cube<R>, 4>::zeros(like.meta.shape().to_vec(), (&like.device, like.dtype));
            let [b, h, _, d] = dims4(&g);
            full.slice_assign(
                [0..b, 0..h, 0..keys, 0..d],
                Tensor::from_primitive(TensorPrimitive::Float(g)),
            )
            .into_primitive()
            .tensor()
        };
        if let Some(node) = node_q {
            grads.register::<Cube<R>>(node.id, grad_q);
        }
        if let Some(node) = node_k {
            grads.register::<Cube<R>>(node.id, pad(grad_k, &k));
        }
        if let Some(node) = node_v {
            grads.register::<Cube<R>>(node.id, pad(grad_v, &v));
        }
    }
}

/// The forward under burn's autodiff: a compute-bound op whose backward is
/// [`FlashBackward`].
pub(super) fn forward_tracked<B: Backend, R: CubeRuntime, C: CheckpointStrategy>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    segments: &Tensor<B, 2, Int>,
    rule: MaskRule,
    scale: f64,
) -> Tensor<B, 4> {
    type AD<R, C> = Autodiff<Cube<R>, C>;
    let (q, k, v) = (
        tracked::<B, AD<R, C>, 4>(q),
        tracked::<B, AD<R, C>, 4>(k),
        tracked::<B, AD<R, C>, 4>(v),
    );
    let segments: Tensor<AD<R, C>, 2, Int> = crate::kernels::switch::cast(segments.clone());
    let segments: CubeTensor<R> = segments.into_primitive();
    let out = match FlashBackward
        .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let (q_id, k_id, v_id) = (
                prep.checkpoint(&q),
                prep.checkpoint(&k),
                prep.checkpoint(&v),
            );
            let (out, lse) = forward::<R>(
                &q.primitive,
                &k.primitive,
                &v.primitive,
                &segments,
                rule,
                scale,
                true,
            );
            let lse = lse.expect("asked for the log-sum-exp");
            prep.finish(
                (q_id, k_id, v_id, segments, out.clone(), lse, rule, scale),
                out,
            )
        }
        OpsKind::UnTracked(prep) => {
            let (out, _) = forward::<R>(
                &q.primitive,
                &k.primitive,
                &v.primitive,
                &segments,
                rule,
                scale,
                false,
            );
            prep.finish(out)
        }
    };
    from_tracked::<B, AD<R, C>, 4>(out)
}
