//! Elementwise chains in one kernel each, computed in f32 and written once in the inputs'
//! dtype, with their backward as one kernel too under autodiff:
//! - SwiGLU's gate: `silu(g) ⊙ u = g · σ(g) · u` (the composite launches burn's eight-kernel
//!   sigmoid, then two products); backward `dg = dy · u · σ(g) · (1 + g · (1 − σ(g)))`,
//!   `du = dy · g · σ(g)`;
//! - rotate-half RoPE: `y = x · cos + swap_halves(x) · sin_signed` over the last dimension, the
//!   tables `[a, c, d]` broadcast over the heads of `x` `[a, c, heads, d]` (the composite: a
//!   `cat` of two narrows, two products, a sum); it is linear in x, so its backward is the same
//!   kernel with the sine read at the partner position: `dx[e] = dy[e] · cos[e] +
//!   dy[p] · sin_signed[p]`, `p` the position `e` swaps with.

use burn::prelude::*;

/// `silu(gate) ⊙ up` in one kernel (and its backward in one), or `None` where `B` has no such
/// kernel.
pub fn swiglu<B: Backend, const D: usize>(
    gate: &Tensor<B, D>,
    up: &Tensor<B, D>,
) -> Option<Tensor<B, D>> {
    #[cfg(any(feature = "cuda", feature = "vulkan"))]
    {
        if let Some(out) = super::on_cube!(B, R => gpu::swiglu_bare::<B, R, D>(gate, up)) {
            return Some(out);
        }
        super::on_autodiff_cube!(B, R, C => gpu::swiglu_tracked::<B, R, C, D>(gate, up))
    }
    #[cfg(not(any(feature = "cuda", feature = "vulkan")))]
    {
        let _ = (gate, up);
        None
    }
}

/// `x · cos + swap_halves(x) · sin_signed` with x `[a, c, heads, d]` and the tables `[a, c, d]`
/// (in x's dtype, constants: no gradient reaches them), in one kernel (and its backward in
/// one), or `None` where `B` has no such kernel.
pub fn rotate_half<B: Backend>(
    x: &Tensor<B, 4>,
    cos: &Tensor<B, 3>,
    sin_signed: &Tensor<B, 3>,
) -> Option<Tensor<B, 4>> {
    #[cfg(any(feature = "cuda", feature = "vulkan"))]
    {
        if let Some(out) = super::on_cube!(B, R => gpu::rotate_bare::<B, R>(x, cos, sin_signed)) {
            return Some(out);
        }
        super::on_autodiff_cube!(B, R, C => gpu::rotate_tracked::<B, R, C>(x, cos, sin_signed))
    }
    #[cfg(not(any(feature = "cuda", feature = "vulkan")))]
    {
        let _ = (x, cos, sin_signed);
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
    use burn_cubecl::kernel::into_contiguous;
    use cubecl::calculate_cube_count_elemwise;
    use cubecl::prelude::CubeDim;

    use crate::kernels::cube::{
        Cube, CubeRuntime, CubeTensor, empty_like, from_tracked, primitive, tensor, tracked,
    };

    mod kernel {
        use cubecl::prelude::*;

        #[cube(launch)]
        pub(super) fn swiglu_kernel<F: Float>(
            gate: &Tensor<F>,
            up: &Tensor<F>,
            out: &mut Tensor<F>,
            #[define(F)] _dtype: StorageType,
        ) {
            let i = ABSOLUTE_POS;
            if i >= out.len() {
                terminate!();
            }
            let g = f32::cast_from(gate[i]);
            let sigmoid = f32::recip(f32::new(1.0) + f32::exp(-g));
            out[i] = F::cast_from(g * sigmoid * f32::cast_from(up[i]));
        }

        #[cube(launch)]
        pub(super) fn swiglu_backward_kernel<F: Float>(
            gate: &Tensor<F>,
            up: &Tensor<F>,
            grad: &Tensor<F>,
            grad_gate: &mut Tensor<F>,
            grad_up: &mut Tensor<F>,
            #[define(F)] _dtype: StorageType,
        ) {
            let i = ABSOLUTE_POS;
            if i >= grad_gate.len() {
                terminate!();
            }
            let g = f32::cast_from(gate[i]);
            let dy = f32::cast_from(grad[i]);
            let sigmoid = f32::recip(f32::new(1.0) + f32::exp(-g));
            let silu = g * sigmoid;
            let dsilu = sigmoid * (f32::new(1.0) + g * (f32::new(1.0) - sigmoid));
            grad_gate[i] = F::cast_from(dy * f32::cast_from(up[i]) * dsilu);
            grad_up[i] = F::cast_from(dy * silu);
        }

        /// x `[a, c, heads, d]` contiguous, tables `[a, c, d]` contiguous; `transpose`: the
        /// backward (the sine read at the partner position).
        #[cube(launch)]
        pub(super) fn rotate_half_kernel<F: Float>(
            x: &Tensor<F>,
            cos: &Tensor<F>,
            sin_signed: &Tensor<F>,
            out: &mut Tensor<F>,
            heads: u32,
            d: u32,
            #[comptime] transpose: bool,
            #[define(F)] _dtype: StorageType,
        ) {
            let i = ABSOLUTE_POS;
            if i >= out.len() {
                terminate!();
            }
            let d = d as usize;
            let half = d / 2;
            let e = i % d;
            let row = i / d;
            let table = (row / heads as usize) * d;
            let mut partner = e + half;
            if e >= half {
                partner = e - half;
            }
            let mut sine = sin_signed[table + e];
            if transpose {
                sine = sin_signed[table + partner];
            }
            let rotated = f32::cast_from(x[i]) * f32::cast_from(cos[table + e])
                + f32::cast_from(x[row * d + partner]) * f32::cast_from(sine);
            out[i] = F::cast_from(rotated);
        }
    }

    const THREADS: u32 = 256;

    fn elementwise<R: CubeRuntime>(t: &CubeTensor<R>) -> (cubecl::prelude::CubeCount, CubeDim) {
        let cube_dim = CubeDim::new_1d(THREADS);
        let count = calculate_cube_count_elemwise(&t.client, t.meta.num_elements(), cube_dim);
        (count, cube_dim)
    }

    fn swiglu_forward<R: CubeRuntime>(gate: CubeTensor<R>, up: CubeTensor<R>) -> CubeTensor<R> {
        let (gate, up) = (into_contiguous(gate), into_contiguous(up));
        let out = empty_like(&gate, gate.dtype);
        let (count, dim) = elementwise(&gate);
        let dtype = gate.dtype;
        kernel::swiglu_kernel::launch::<R>(
            &gate.client.clone(),
            count,
            dim,
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            dtype.into(),
        );
        out
    }

    fn swiglu_backward<R: CubeRuntime>(
        gate: CubeTensor<R>,
        up: CubeTensor<R>,
        grad: CubeTensor<R>,
    ) -> (CubeTensor<R>, CubeTensor<R>) {
        let (gate, up, grad) = (
            into_contiguous(gate),
            into_contiguous(up),
            into_contiguous(grad),
        );
        let (grad_gate, grad_up) = (empty_like(&gate, gate.dtype), empty_like(&up, up.dtype));
        let (count, dim) = elementwise(&gate);
        let dtype = gate.dtype;
        kernel::swiglu_backward_kernel::launch::<R>(
            &gate.client.clone(),
            count,
            dim,
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            grad.into_tensor_arg(),
            grad_gate.clone().into_tensor_arg(),
            grad_up.clone().into_tensor_arg(),
            dtype.into(),
        );
        (grad_gate, grad_up)
    }

    fn rotate<R: CubeRuntime>(
        x: CubeTensor<R>,
        cos: CubeTensor<R>,
        sin_signed: CubeTensor<R>,
        transpose: bool,
    ) -> CubeTensor<R> {
        let s = x.meta.shape();
        let (heads, d) = (s[2], s[3]);
        let (x, cos, sin_signed) = (
            into_contiguous(x),
            into_contiguous(cos),
            into_contiguous(sin_signed),
        );
        let out = empty_like(&x, x.dtype);
        let (count, dim) = elementwise(&x);
        let dtype = x.dtype;
        kernel::rotate_half_kernel::launch::<R>(
            &x.client.clone(),
            count,
            dim,
            x.into_tensor_arg(),
            cos.into_tensor_arg(),
            sin_signed.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            heads as u32,
            d as u32,
            transpose,
            dtype.into(),
        );
        out
    }

    pub(super) fn swiglu_bare<B: Backend, R: CubeRuntime, const D: usize>(
        gate: &Tensor<B, D>,
        up: &Tensor<B, D>,
    ) -> Tensor<B, D> {
        tensor::<B, R, D>(swiglu_forward(
            primitive::<B, R, D>(gate.clone()),
            primitive::<B, R, D>(up.clone()),
        ))
    }

    pub(super) fn rotate_bare<B: Backend, R: CubeRuntime>(
        x: &Tensor<B, 4>,
        cos: &Tensor<B, 3>,
        sin_signed: &Tensor<B, 3>,
    ) -> Tensor<B, 4> {
        let dtype = x.dtype();
        tensor::<B, R, 4>(rotate(
            primitive::<B, R, 4>(x.clone()),
            primitive::<B, R, 3>(cos.clone().cast(dtype)),
            primitive::<B, R, 3>(sin_signed.clone().cast(dtype)),
            false,
        ))
    }

    type AD<R, C> = Autodiff<Cube<R>, C>;

    #[derive(Debug)]
    struct SwigluBackward;

    impl<R: CubeRuntime> Backward<Cube<R>, 2> for SwigluBackward {
        type State = (NodeId, NodeId);

        fn backward(
            self,
            ops: Ops<Self::State, 2>,
            grads: &mut Gradients,
            checkpointer: &mut Checkpointer,
        ) {
            let [node_gate, node_up] = ops.parents;
            let grad = grads.consume::<Cube<R>>(&ops.node);
            let (gate_id, up_id) = ops.state;
            let gate: CubeTensor<R> = checkpointer.retrieve_node_output(gate_id);
            let up: CubeTensor<R> = checkpointer.retrieve_node_output(up_id);
            let (grad_gate, grad_up) = swiglu_backward(gate, up, grad);
            if let Some(node) = node_gate {
                grads.register::<Cube<R>>(node.id, grad_gate);
            }
            if let Some(node) = node_up {
                grads.register::<Cube<R>>(node.id, grad_up);
            }
        }
    }

    pub(super) fn swiglu_tracked<
        B: Backend,
        R: CubeRuntime,
        C: CheckpointStrategy,
        const D: usize,
    >(
        gate: &Tensor<B, D>,
        up: &Tensor<B, D>,
    ) -> Tensor<B, D> {
        let gate = tracked::<B, AD<R, C>, D>(gate.clone());
        let up = tracked::<B, AD<R, C>, D>(up.clone());
        let out = match SwigluBackward
            .prepare::<C>([gate.node.clone(), up.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&gate), prep.checkpoint(&up));
                prep.finish(
                    state,
                    swiglu_forward(gate.primitive.clone(), up.primitive.clone()),
                )
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(swiglu_forward(gate.primitive.clone(), up.primitive.clone()))
            }
        };
        from_tracked::<B, AD<R, C>, D>(out)
    }

    #[derive(Debug)]
    struct RotateBackward;

    impl<R: CubeRuntime> Backward<Cube<R>, 1> for RotateBackward {
        /// The tables (constants).
        type State = (CubeTensor<R>, CubeTensor<R>);

        fn backward(
            self,
            ops: Ops<Self::State, 1>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            let [node_x] = ops.parents;
            let grad = grads.consume::<Cube<R>>(&ops.node);
            let (cos, sin_signed) = ops.state;
            if let Some(node) = node_x {
                grads.register::<Cube<R>>(node.id, rotate(grad, cos, sin_signed, true));
            }
        }
    }

    pub(super) fn rotate_tracked<B: Backend, R: CubeRuntime, C: CheckpointStrategy>(
        x: &Tensor<B, 4>,
        cos: &Tensor<B, 3>,
        sin_signed: &Tensor<B, 3>,
    ) -> Tensor<B, 4> {
        let dtype = x.dtype();
        let x = tracked::<B, AD<R, C>, 4>(x.clone());
        let table = |t: &Tensor<B, 3>| -> CubeTensor<R> {
            let t = tracked::<B, AD<R, C>, 3>(t.clone().detach().cast(dtype));
            t.primitive
        };
        let (cos, sin_signed) = (table(cos), table(sin_signed));
        let out = match RotateBackward
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let out = rotate(x.primitive.clone(), cos.clone(), sin_signed.clone(), false);
                prep.finish((cos, sin_signed), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(rotate(x.primitive.clone(), cos, sin_signed, false))
            }
        };
        from_tracked::<B, AD<R, C>, 4>(out)
    }
}
