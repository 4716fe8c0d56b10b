//! Small tensor helpers shared by the algorithms: shape checks, host copies, the masked mean.
//!
//! There is one masked-mean helper in the crate ([`masked_mean`]); every metric uses it.

use burn::prelude::*;

use crate::error::{AlgoError, Result};

/// Checks that `got` has the shape `expected`, naming `what` in the error.
pub fn check_same_shape<const D: usize>(
    what: &str,
    expected: [usize; D],
    got: [usize; D],
) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(AlgoError::ShapeMismatch {
            what: what.to_string(),
            expected: expected.to_vec(),
            got: got.to_vec(),
        })
    }
}

/// Copies a float tensor to the host as `f64` values (row-major).
pub fn to_host_f64<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data().iter::<f64>().collect()
}

/// Builds a `[rows, cols]` float tensor on `device` from row-major `f64` values (stored in the
/// backend's float dtype, so an f32 backend rounds once here).
pub fn from_host_2d<B: Backend>(
    values: Vec<f64>,
    rows: usize,
    cols: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}

/// verl `masked_sum` with selection semantics: Σ where(m≠0, x, 0)·m. Values under the mask
/// (even NaN or ±inf) never contribute.
pub fn masked_sum<B: Backend, const D: usize>(x: Tensor<B, D>, mask: Tensor<B, D>) -> Tensor<B, 1> {
    let invalid = mask.clone().equal_elem(0.0);
    x.mask_fill(invalid, 0.0).mul(mask).sum()
}

/// verl `masked_mean` (`verl.utils.torch_functional.masked_mean`): Σ(x·m) / (Σm + 1e-8),
/// with the selection semantics of `masked_sum` so masked NaN/inf cannot leak.
pub fn masked_mean<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    mask: Tensor<B, D>,
) -> Tensor<B, 1> {
    let count = mask.clone().sum();
    masked_sum(x, mask).div(count.add_scalar(1e-8))
}

/// Per-row `masked_sum`: `[B, T]` → `[B, 1]`, Σ_t where(m≠0, x, 0)·m.
pub(crate) fn row_masked_sum<B: Backend>(x: Tensor<B, 2>, mask: Tensor<B, 2>) -> Tensor<B, 2> {
    let invalid = mask.clone().equal_elem(0.0);
    x.mask_fill(invalid, 0.0).mul(mask).sum_dim(1)
}
