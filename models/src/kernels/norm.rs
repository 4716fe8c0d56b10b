//! RMSNorm in one kernel: `y = x · r · w` with `r = rsqrt(mean(x²) + eps)` over the last
//! dimension, computed in f32 and written in x's dtype (transformers' `Qwen2RMSNorm` computes the
//! variance in f32; the product with the weight is taken in f32 too, before the one rounding to
//! x's dtype). One cube per row: a strided sum of squares, a tree reduction in shared memory, a
//! strided write. Replaces the composite's seven kernels (pow, mean, +eps, sqrt, recip, two
//! products).
//!
//! Backward, one cube per row again: with `s = Σ_e x_e · w_e · dy_e` over the row,
//! `dx = r · w · dy − x · r³ · s / dim`, and the per-element `dy · x · r`, which a sum over the
//! rows (one burn reduction) turns into `dw`.

use burn::prelude::*;

/// `x · rsqrt(mean(x²) + eps) · weight` (no weight: the plain normalisation) in one kernel (and
/// its backward in one, plus a reduction for the weight's gradient), or `None` where `B` has no
/// such kernel.
pub fn rms_norm<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    weight: Option<&Tensor<B, 1>>,
    eps: f64,
) -> Option<Tensor<B, D>> {
    #[cfg(any(feature = "cuda", feature = "vulkan"))]
    {
        if let Some(out) = super::on_cube!(B, R => gpu::rms_norm_bare::<B, R, D>(x, weight, eps)) {
            return Some(out);
        }
        super::on_autodiff_cube!(B, R, C => gpu::rms_norm_tracked::<B, R, C, D>(x, weight, eps))
    }
    #[cfg(not(any(feature = "cuda", feature = "vulkan")))]
    {
        let _ = (x, weight, eps);
        None
    }
}

#[cfg(any(feature = "cuda", feature = "vulkan"))]
mod gpu {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::prelude::*;
    use burn::tensor::{DType, TensorPrimitive};
    use burn_cubecl::kernel::into_contiguous;
    use cubecl::prelude::CubeDim;

    use crate::kernels::cube::{
        Cube, CubeRuntime, CubeTensor, cube_count_1d, empty, empty_like, from_tracked, primitive,
        tensor, tracked,
    };

    /// Threads per row.
    const THREADS: u32 = 128;

    mod kernel {
        use cubecl::prelude::*;

        /// `Σ value` over the cube, every thread gets it.
        #[cube]
        fn row_sum(value: f32, shared: &mut SharedMemory<f32>, t: usize) -> f32 {
            shared[t] = value;
            sync_cube();
            let mut stride = (CUBE_DIM_X / 2) as usize;
            while stride > 0 {
                if t < stride {
                    shared[t] = shared[t] + shared[t + stride];
                }
                sync_cube();
                stride /= 2;
            }
            let total = shared[0];
            sync_cube();
            total
        }

        #[cube(launch)]
        pub(super) fn rms_norm_kernel<F: Float>(
            x: &Tensor<F>,
            weight: &Tensor<F>,
            out: &mut Tensor<F>,
            rows: u32,
            dim: u32,
            eps: f32,
            #[comptime] threads: u32,
            #[comptime] scaled: bool,
            #[define(F)] _dtype: StorageType,
        ) {
            let row = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
            if row >= rows {
                terminate!();
            }
            let base = (row * dim) as usize;
            let t = UNIT_POS_X;
            let mut sum = 0.0f32;
            let mut i = t;
            while i < dim {
                let v = f32::cast_from(x[base + i as usize]);
                sum += v * v;
                i += threads;
            }
            let mut shared = SharedMemory::<f32>::new(threads as usize);
            let total = row_sum(sum, &mut shared, t as usize);
            let inv = f32::recip(f32::sqrt(total / f32::cast_from(dim) + eps));
            let mut j = t;
            while j < dim {
                let mut y = f32::cast_from(x[base + j as usize]) * inv;
                if scaled {
                    y *= f32::cast_from(weight[j as usize]);
                }
                out[base + j as usize] = F::cast_from(y);
                j += threads;
            }
        }

        /// `dx` (x's dtype) and, with a weight, `dy · x · r` per element (f32, for `dw`).
        #[cube(launch)]
        #[allow(clippy::too_many_arguments)]
        pub(super) fn rms_norm_backward_kernel<F: Float>(
            x: &Tensor<F>,
            weight: &Tensor<F>,
            grad: &Tensor<F>,
            grad_x: &mut Tensor<F>,
            weighted: &mut Tensor<f32>,
            rows: u32,
            dim: u32,
            eps: f32,
            #[comptime] threads: u32,
            #[comptime] scaled: bool,
            #[define(F)] _dtype: StorageType,
        ) {
            let row = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
            if row >= rows {
                terminate!();
            }
            let base = (row * dim) as usize;
            let t = UNIT_POS_X;
            let mut squares = 0.0f32;
            let mut dots = 0.0f32;
            let mut i = t;
            while i < dim {
                let v = f32::cast_from(x[base + i as usize]);
                let mut w = f32::new(1.0);
                if scaled {
                    w = f32::cast_from(weight[i as usize]);
                }
                squares += v * v;
                dots += v * w * f32::cast_from(grad[base + i as usize]);
                i += threads;
            }
            let mut shared = SharedMemory::<f32>::new(threads as usize);
            let total = row_sum(squares, &mut shared, t as usize);
            let s = row_sum(dots, &mut shared, t as usize);
            let r = f32::recip(f32::sqrt(total / f32::cast_from(dim) + eps));
            let r3 = r * r * r / f32::cast_from(dim);
            let mut j = t;
            while j < dim {
                let v = f32::cast_from(x[base + j as usize]);
                let dy = f32::cast_from(grad[base + j as usize]);
                let mut w = f32::new(1.0);
                if scaled {
                    w = f32::cast_from(weight[j as usize]);
                    weighted[base + j as usize] = dy * v * r;
                }
                grad_x[base + j as usize] = F::cast_from(r * w * dy - v * r3 * s);
                j += threads;
            }
        }
    }

    /// Rows and width of a tensor normalised over its last dimension.
    fn rows_dim<R: CubeRuntime>(x: &CubeTensor<R>) -> (usize, usize) {
        let dim = *x.meta.shape().last().unwrap_or(&1);
        (x.meta.num_elements() / dim.max(1), dim)
    }

    fn forward<R: CubeRuntime>(
        x: CubeTensor<R>,
        weight: Option<CubeTensor<R>>,
        eps: f64,
    ) -> CubeTensor<R> {
        let x = into_contiguous(x);
        let (rows, dim) = rows_dim(&x);
        let scaled = weight.is_some();
        let weight = weight.map(into_contiguous).unwrap_or_else(|| x.clone());
        let out = empty_like(&x, x.dtype);
        let dtype = x.dtype;
        kernel::rms_norm_kernel::launch::<R>(
            &x.client.clone(),
            cube_count_1d(rows),
            CubeDim::new_1d(THREADS),
            x.into_tensor_arg(),
            weight.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            rows as u32,
            dim as u32,
            eps as f32,
            THREADS,
            scaled,
            dtype.into(),
        );
        out
    }

    /// `dx`, and `dw` `[dim]` (in the weight's dtype) when there is a weight.
    fn backward<R: CubeRuntime>(
        x: CubeTensor<R>,
        weight: Option<CubeTensor<R>>,
        grad: CubeTensor<R>,
        eps: f64,
    ) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
        let (x, grad) = (into_contiguous(x), into_contiguous(grad));
        let (rows, dim) = rows_dim(&x);
        let scaled = weight.is_some();
        let weight_dtype = weight.as_ref().map(|w| w.dtype);
        let weight = weight.map(into_contiguous).unwrap_or_else(|| x.clone());
        let grad_x = empty_like(&x, x.dtype);
        let weighted = if scaled {
            empty_like(&x, DType::F32)
        } else {
            empty(&x, vec![1], DType::F32)
        };
        let dtype = x.dtype;
        kernel::rms_norm_backward_kernel::launch::<R>(
            &x.client.clone(),
            cube_count_1d(rows),
            CubeDim::new_1d(THREADS),
            x.into_tensor_arg(),
            weight.into_tensor_arg(),
            grad.into_tensor_arg(),
            grad_x.clone().into_tensor_arg(),
            weighted.clone().into_tensor_arg(),
            rows as u32,
            dim as u32,
            eps as f32,
            THREADS,
            scaled,
            dtype.into(),
        );
        let grad_weight = weight_dtype.map(|wd| {
            Tensor::<Cube<R>, 1>::from_primitive(TensorPrimitive::Float(weighted))
                .reshape([rows, dim])
                .sum_dim(0)
                .reshape([dim])
                .cast(wd)
                .into_primitive()
                .tensor()
        });
        (grad_x, grad_weight)
    }

    pub(super) fn rms_norm_bare<B: Backend, R: CubeRuntime, const D: usize>(
        x: &Tensor<B, D>,
        weight: Option<&Tensor<B, 1>>,
        eps: f64,
    ) -> Tensor<B, D> {
        let dtype = x.dtype();
        let weight = weight.map(|w| primitive::<B, R, 1>(w.clone().cast(dtype)));
        tensor::<B, R, D>(forward(primitive::<B, R, D>(x.clone()), weight, eps))
    }

    type AD<R, C> = Autodiff<Cube<R>, C>;

    #[derive(Debug)]
    struct RmsNormBackward;

    impl<R: CubeRuntime> Backward<Cube<R>, 2> for RmsNormBackward {
        /// x and the weight (checkpointed), eps.
        type State = (NodeId, NodeId, f64);

        fn backward(
            self,
            ops: Ops<Self::State, 2>,
            grads: &mut Gradients,
            checkpointer: &mut Checkpointer,
        ) {
            let [node_x, node_w] = ops.parents;
            let grad = grads.consume::<Cube<R>>(&ops.node);
            let (x_id, w_id, eps) = ops.state;
            let x: CubeTensor<R> = checkpointer.retrieve_node_output(x_id);
            let w: CubeTensor<R> = checkpointer.retrieve_node_output(w_id);
            let w_dtype = w.dtype;
            let w = Tensor::<Cube<R>, 1>::from_primitive(TensorPrimitive::Float(w))
                .cast(x.dtype)
                .into_primitive()
                .tensor();
            let (grad_x, grad_w) = backward(x, Some(w), grad, eps);
            if let Some(node) = node_x {
                grads.register::<Cube<R>>(node.id, grad_x);
            }
            if let (Some(node), Some(g)) = (node_w, grad_w) {
                let g = Tensor::<Cube<R>, 1>::from_primitive(TensorPrimitive::Float(g))
                    .cast(w_dtype)
                    .into_primitive()
                    .tensor();
                grads.register::<Cube<R>>(node.id, g);
            }
        }
    }

    #[derive(Debug)]
    struct RmsNormalizeBackward;

    impl<R: CubeRuntime> Backward<Cube<R>, 1> for RmsNormalizeBackward {
        type State = (NodeId, f64);

        fn backward(
            self,
            ops: Ops<Self::State, 1>,
            grads: &mut Gradients,
            checkpointer: &mut Checkpointer,
        ) {
            let [node_x] = ops.parents;
            let grad = grads.consume::<Cube<R>>(&ops.node);
            let (x_id, eps) = ops.state;
            let x: CubeTensor<R> = checkpointer.retrieve_node_output(x_id);
            let (grad_x, _) = backward(x, None, grad, eps);
            if let Some(node) = node_x {
                grads.register::<Cube<R>>(node.id, grad_x);
            }
        }
    }

    pub(super) fn rms_norm_tracked<
        B: Backend,
        R: CubeRuntime,
        C: CheckpointStrategy,
        const D: usize,
    >(
        x: &Tensor<B, D>,
        weight: Option<&Tensor<B, 1>>,
        eps: f64,
    ) -> Tensor<B, D> {
        let x = tracked::<B, AD<R, C>, D>(x.clone());
        let out = match weight {
            Some(w) => {
                let w = tracked::<B, AD<R, C>, 1>(w.clone());
                let weight_in = |w: &CubeTensor<R>| {
                    Tensor::<Cube<R>, 1>::from_primitive(TensorPrimitive::Float(w.clone()))
                        .cast(x.primitive.dtype)
                        .into_primitive()
                        .tensor()
                };
                match RmsNormBackward
                    .prepare::<C>([x.node.clone(), w.node.clone()])
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(mut prep) => {
                        let state = (prep.checkpoint(&x), prep.checkpoint(&w), eps);
                        let out = forward(x.primitive.clone(), Some(weight_in(&w.primitive)), eps);
                        prep.finish(state, out)
                    }
                    OpsKind::UnTracked(prep) => prep.finish(forward(
                        x.primitive.clone(),
                        Some(weight_in(&w.primitive)),
                        eps,
                    )),
                }
            }
            None => match RmsNormalizeBackward
                .prepare::<C>([x.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(mut prep) => {
                    let state = (prep.checkpoint(&x), eps);
                    prep.finish(state, forward(x.primitive.clone(), None, eps))
                }
                OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive.clone(), None, eps)),
            },
        };
        from_tracked::<B, AD<R, C>, D>(out)
    }
}
