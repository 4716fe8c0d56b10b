//! The CPU backend's fast paths: operations that reach into burn-flex's own tensors
//! ([`FlexTensor`]) when a generic `B` is the Flex backend, because its tensor ops would copy or
//! allocate where the values can be used where they lie. Each entry point tests the backend's
//! tensor type ([`std::any::TypeId`]) and answers "not here" for every other backend, whose
//! caller then takes the tensor ops:
//!
//! - `write_positions`: a KV-cache write into the cache's own storage (burn-flex's
//!   `slice_assign` keeps a second handle on its input, so it copies the whole cache first);
//! - [`is_host_f32`], [`host_values`] and [`HostMatrix`]: an f32 tensor's values as host
//!   memory, for kernels that run over the values themselves (the fused AdamW step).
//!
//! Every downcast to burn-flex's types lives here. burn 0.21's own `Dispatch` backend does not
//! replace them: it picks a backend at run time and wraps each backend's tensors in an enum whose
//! accessors to the inner primitive are private to burn, so code over `Dispatch` could not reach
//! a `FlexTensor`'s storage either, and it puts a match on the backend in front of every op.
//! flowrl picks its backend once per run and compiles the whole pass for it (flowrl-nodes'
//! `on_backend!`), so these few type tests are the only run-time dispatch it needs.

use std::any::Any;

use burn::backend::flex::FlexTensor;
use burn::prelude::*;
use burn::tensor::DType;

/// `dst[:, :, at..at + l, :] = src` for a KV cache `dst` of `dims = [b, h, capacity, d]` and new
/// positions `src` `[b, h, l, d]`, when both are Flex tensors and `dst` is the only handle on its
/// whole contiguous storage: the write goes into that storage, and true is returned. False
/// (nothing written) for any other backend or layout; the caller then uses `slice_assign`.
pub(crate) fn write_positions<B: Backend>(
    dst: &mut B::FloatTensorPrimitive,
    src: B::FloatTensorPrimitive,
    dims: [usize; 4],
    l: usize,
    at: usize,
) -> bool {
    let Some(dst) = (dst as &mut dyn Any).downcast_mut::<FlexTensor>() else {
        return false;
    };
    let src: Box<dyn Any> = Box::new(src);
    match src.downcast::<FlexTensor>() {
        Ok(src) => write_flex_positions(dst, &src, dims, l, at),
        Err(_) => false,
    }
}

/// [`write_positions`] on Flex tensors of one float dtype: false (nothing written) when `dst`
/// is shared, not a whole contiguous buffer, or of another dtype than `src`.
fn write_flex_positions(
    dst: &mut FlexTensor,
    src: &FlexTensor,
    [b, h, capacity, d]: [usize; 4],
    l: usize,
    at: usize,
) -> bool {
    use burn::tensor::{bf16, f16};
    // One copy per (row, kv head): its `l` new positions, `l·d` contiguous values.
    macro_rules! copy {
        ($e:ty) => {{
            let src = src.to_contiguous();
            match (src.as_slice::<$e>(), dst.try_storage_mut::<$e>()) {
                (Some(src), Some(dst)) => {
                    let span = l * d;
                    for (row, values) in src.chunks_exact(span).enumerate().take(b * h) {
                        let to = (row * capacity + at) * d;
                        dst[to..to + span].copy_from_slice(values);
                    }
                    true
                }
                _ => false,
            }
        }};
    }
    let whole = dst.is_unique()
        && dst.is_contiguous()
        && dst.layout().start_offset() == 0
        && dst.bytes().len() == b * h * capacity * d * dst.dtype().size()
        && dst.dtype() == src.dtype();
    if !whole {
        return false;
    }
    if src.layout().num_elements() != b * h * l * d {
        return false;
    }
    match dst.dtype() {
        DType::F32 => copy!(f32),
        DType::BF16 => copy!(bf16),
        DType::F16 => copy!(f16),
        _ => false,
    }
}

/// True for an f32 tensor whose values are host memory the process can address directly (the
/// CPU backend's): kernels that run over the values themselves, such as the fused AdamW step
/// (flowrl-nodes' `train::optim`), take this path, every other backend the tensor ops.
pub fn is_host_f32<B: Backend, const D: usize>(t: &Tensor<B, D>) -> bool {
    t.dtype() == burn::tensor::DType::F32
        && std::any::TypeId::of::<B::FloatTensorPrimitive>() == std::any::TypeId::of::<FlexTensor>()
}

fn into_host<B: Backend, const D: usize>(t: Tensor<B, D>) -> FlexTensor {
    let burn::tensor::TensorPrimitive::Float(p) = t.into_primitive() else {
        unreachable!("is_host_f32 checked a float tensor")
    };
    let p: Box<dyn std::any::Any> = Box::new(p);
    *p.downcast().expect("is_host_f32 checked the backend")
}

/// The values of a [`is_host_f32`] tensor as a vector: its own buffer when nothing else holds it
/// and it is one whole contiguous buffer (burn-flex's `into_data` then unwraps it), else a copy.
pub fn host_values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    into_host(t)
        .into_data()
        .into_vec::<f32>()
        .expect("an f32 tensor")
}

/// A [`is_host_f32`] tensor read where it lies: contiguous, or a 2-D view with its strides (a
/// `Linear` weight's gradient from the matmul backward is stored transposed); any other layout
/// is made contiguous first.
pub struct HostMatrix(FlexTensor);

impl HostMatrix {
    pub fn new<B: Backend, const D: usize>(t: Tensor<B, D>) -> Self {
        let t = into_host(t);
        if t.is_contiguous() || t.layout().shape().num_dims() == 2 {
            HostMatrix(t)
        } else {
            HostMatrix(t.to_contiguous())
        }
    }

    /// `(rows, cols, row stride, column stride, offset)` of the `n` values as the row-major
    /// `[rows, cols]` view of the parameter (one row of `n` when contiguous).
    pub fn layout(&self, n: usize) -> (usize, usize, isize, isize, usize) {
        let offset = self.0.layout().start_offset();
        if self.0.is_contiguous() {
            (1, n, n as isize, 1, offset)
        } else {
            let (shape, strides) = (self.0.layout().shape(), self.0.layout().strides());
            (shape[0], shape[1], strides[0], strides[1], offset)
        }
    }

    /// The storage the layout indexes.
    pub fn values(&self) -> &[f32] {
        self.0.storage::<f32>()
    }
}
