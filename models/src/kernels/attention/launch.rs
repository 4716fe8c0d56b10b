//! The launchers: the kernels' checked sizes and cube counts, the forward and the backward on the
//! runtime's tensors, and the forward on a bare cubecl backend.

use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::TensorPrimitive;
use cubecl::prelude::{CubeCount, CubeDim};

use super::kernel;
use super::params::{BLOCK_Q, MaskRule, tile};
use crate::kernels::cube::{
    Cube, CubeRuntime, CubeTensor, empty, int_primitive, primitive, tensor,
};

/// The kernels' common sizes, checked.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    queries: usize,
    keys: usize,
    d: usize,
}

impl Sizes {
    fn of<R: CubeRuntime>(q: &CubeTensor<R>, k: &CubeTensor<R>, segments: &CubeTensor<R>) -> Self {
        let [batch, heads, queries, d] = dims4(q);
        let [_, kv_heads, _, _] = dims4(k);
        let keys = segments.meta.shape()[1];
        assert!(
            heads % kv_heads == 0 && keys >= queries && k.meta.shape()[2] >= keys,
            "flash attention: {heads} heads over {kv_heads} kv heads, {queries} queries, \
             {keys} keys, {} cached",
            k.meta.shape()[2]
        );
        Self {
            batch,
            heads,
            kv_heads,
            queries,
            keys,
            d,
        }
    }

    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// One cube per `BLOCK_Q` stacked query rows of one kv head of one batch row.
    fn query_cubes(&self) -> CubeCount {
        let blocks = (self.group() * self.queries).div_ceil(BLOCK_Q);
        CubeCount::Static(blocks as u32, self.kv_heads as u32, self.batch as u32)
    }

    /// One cube per `BLOCK_Q` keys of one kv head of one batch row.
    fn key_cubes(&self) -> CubeCount {
        let blocks = self.keys.div_ceil(BLOCK_Q);
        CubeCount::Static(blocks as u32, self.kv_heads as u32, self.batch as u32)
    }
}

pub(super) fn dims4<R: CubeRuntime>(t: &CubeTensor<R>) -> [usize; 4] {
    let s = t.meta.shape();
    [s[0], s[1], s[2], s[3]]
}

/// `[b, L, heads, d]` contiguous seen as `[b, heads, L, d]` (dims 1 and 2 swapped).
fn heads_forward<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    Tensor::<Cube<R>, 4>::from_primitive(TensorPrimitive::Float(t))
        .swap_dims(1, 2)
        .into_primitive()
        .tensor()
}

/// The forward on the runtime's tensors: the output `[b, heads, L, d]` (a view of a
/// contiguous `[b, L, heads, d]`) and, when asked, the log-sum-exp `[b, heads, L]`.
pub(super) fn forward<R: CubeRuntime>(
    q: &CubeTensor<R>,
    k: &CubeTensor<R>,
    v: &CubeTensor<R>,
    segments: &CubeTensor<R>,
    rule: MaskRule,
    scale: f64,
    with_lse: bool,
) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    let s = Sizes::of(q, k, segments);
    let out = empty(q, vec![s.batch, s.queries, s.heads, s.d], q.dtype);
    let lse = empty(
        q,
        if with_lse {
            vec![s.batch, s.heads, s.queries]
        } else {
            vec![1]
        },
        DType::F32,
    );
    kernel::forward_kernel::launch::<R>(
        &q.client,
        s.query_cubes(),
        CubeDim::new_1d(BLOCK_Q as u32),
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        segments.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        s.queries as u32,
        s.keys as u32,
        rule.window.unwrap_or(0) as u32,
        scale as f32,
        s.d,
        tile(s.d),
        s.group(),
        rule.causal,
        with_lse,
        [q.dtype.into(), segments.dtype.into()],
    );
    (heads_forward(out), with_lse.then_some(lse))
}

/// The gradients of q, k and v (in their dtype: q's `[b, heads, L, d]` as a view of a
/// contiguous `[b, L, heads, d]`, k's and v's `[b, kv_heads, T, d]` contiguous).
#[allow(clippy::too_many_arguments)]
pub(super) fn backward<R: CubeRuntime>(
    q: &CubeTensor<R>,
    k: &CubeTensor<R>,
    v: &CubeTensor<R>,
    segments: &CubeTensor<R>,
    out: &CubeTensor<R>,
    lse: &CubeTensor<R>,
    grad_out: &CubeTensor<R>,
    rule: MaskRule,
    scale: f64,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let s = Sizes::of(q, k, segments);
    let grad_q = empty(q, vec![s.batch, s.queries, s.heads, s.d], q.dtype);
    let delta = empty(q, vec![s.batch, s.heads, s.queries], DType::F32);
    let window = rule.window.unwrap_or(0) as u32;
    kernel::backward_query_kernel::launch::<R>(
        &q.client,
        s.query_cubes(),
        CubeDim::new_1d(BLOCK_Q as u32),
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        segments.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        grad_out.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        grad_q.clone().into_tensor_arg(),
        delta.clone().into_tensor_arg(),
        s.queries as u32,
        s.keys as u32,
        window,
        scale as f32,
        s.d,
        tile(s.d),
        s.group(),
        rule.causal,
        [q.dtype.into(), segments.dtype.into()],
    );
    let grad_k = empty(k, vec![s.batch, s.kv_heads, s.keys, s.d], k.dtype);
    let grad_v = empty(v, vec![s.batch, s.kv_heads, s.keys, s.d], v.dtype);
    kernel::backward_key_kernel::launch::<R>(
        &q.client,
        s.key_cubes(),
        CubeDim::new_1d(BLOCK_Q as u32),
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        segments.clone().into_tensor_arg(),
        grad_out.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        delta.into_tensor_arg(),
        grad_k.clone().into_tensor_arg(),
        grad_v.clone().into_tensor_arg(),
        s.queries as u32,
        s.keys as u32,
        window,
        scale as f32,
        s.d,
        tile(s.d),
        s.group(),
        rule.causal,
        [q.dtype.into(), segments.dtype.into()],
    );
    (heads_forward(grad_q), grad_k, grad_v)
}

/// The forward on a bare cubecl backend (no gradient).
pub(super) fn forward_bare<B: Backend, R: CubeRuntime>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    segments: &Tensor<B, 2, Int>,
    rule: MaskRule,
    scale: f64,
) -> Tensor<B, 4> {
    let (out, _) = forward::<R>(
        &primitive::<B, R, 4>(q),
        &primitive::<B, R, 4>(k),
        &primitive::<B, R, 4>(v),
        &int_primitive::<B, R, 2>(segments.clone()),
        rule,
        scale,
        false,
    );
    tensor::<B, R, 4>(out)
}
