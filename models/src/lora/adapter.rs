//! The adapter of one linear map, `s · dropout(x)·Aᵀ·Bᵀ`, and the thread's dropout stream that
//! makes its masks reproducible (see [`super`]).

use std::cell::Cell;

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// The adapter of one linear map (see the module doc).
#[derive(Module, Debug)]
pub struct Lora<B: Backend> {
    /// `lora_A` `[r, in]`.
    pub a: Param<Tensor<B, 2>>,
    /// `lora_B` `[out, r]`.
    pub b: Param<Tensor<B, 2>>,
    /// `alpha / r`.
    pub scaling: f64,
    /// Dropout probability on the adapter's input, applied only under autodiff (training).
    pub dropout: f64,
}

thread_local! {
    /// The dropout seed of this thread's current scope and the number of masks drawn in it.
    static DROPOUT_STREAM: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    /// Whether adapters apply dropout outside autodiff too ([`TrainingSweep`]).
    static TRAINING_SWEEP: Cell<bool> = const { Cell::new(false) };
}

/// Where this thread's dropout stream stands: its seed and the number of masks drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropoutPosition(u64, u64);

impl DropoutPosition {
    /// The stream's position now.
    pub fn now() -> Self {
        let (seed, k) = DROPOUT_STREAM.with(Cell::get);
        Self(seed, k)
    }
}

/// While alive, adapters apply dropout on a backend without autodiff too: the graph-free
/// forward sweep of gradient checkpointing, whose segments are recomputed under autodiff
/// ([`DropoutScope::replay`]) and must see the same masks.
pub struct TrainingSweep {
    outer: bool,
}

impl TrainingSweep {
    pub fn enter() -> Self {
        Self {
            outer: TRAINING_SWEEP.with(|c| c.replace(true)),
        }
    }
}

impl Drop for TrainingSweep {
    fn drop(&mut self) {
        TRAINING_SWEEP.with(|c| c.set(self.outer));
    }
}

/// While alive, the adapters' dropout masks this thread draws come from `seed` (the k-th mask
/// depends only on `seed` and k), so a training step's masks are reproducible, on resume too.
/// Update nodes hold one per replica and mini-batch; dropping it restores the outer stream.
pub struct DropoutScope {
    outer: (u64, u64),
}

impl DropoutScope {
    pub fn enter(seed: u64) -> Self {
        Self::replay(DropoutPosition(seed, 0))
    }

    /// A scope that draws the masks drawn from `position` on again (a recomputed segment).
    pub fn replay(position: DropoutPosition) -> Self {
        Self {
            outer: DROPOUT_STREAM.with(|c| c.replace((position.0, position.1))),
        }
    }
}

impl Drop for DropoutScope {
    fn drop(&mut self) {
        DROPOUT_STREAM.with(|c| c.set(self.outer));
    }
}

/// An inverted-dropout mask of `n` values: `1/keep` with probability `keep`, else 0.
fn dropout_mask(n: usize, keep: f64) -> Vec<f32> {
    let (seed, k) = DROPOUT_STREAM.with(|c| {
        let (seed, k) = c.get();
        c.set((seed, k + 1));
        (seed, k)
    });
    let mut rng = StdRng::seed_from_u64(seed ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let scale = (1.0 / keep) as f32;
    (0..n)
        .map(|_| {
            if rng.random::<f64>() < keep {
                scale
            } else {
                0.0
            }
        })
        .collect()
}

impl<B: Backend> Lora<B> {
    /// `s · dropout(x)·Aᵀ·Bᵀ` for rows `x` `[n, in]` (in the dtype of `x`). Dropout acts only
    /// in training (under autodiff, or inside a [`TrainingSweep`]), with masks from the
    /// thread's [`DropoutScope`].
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let training = B::ad_enabled(&x.device()) || TRAINING_SWEEP.with(Cell::get);
        let x = if self.dropout > 0.0 && training {
            let mask = dropout_mask(x.shape().num_elements(), 1.0 - self.dropout);
            let mask = Tensor::<B, 2>::from_data(
                TensorData::new(mask, x.shape()),
                (&x.device(), x.dtype()),
            );
            x * mask
        } else {
            x
        };
        x.matmul(self.a.val().transpose())
            .matmul(self.b.val().transpose())
            * self.scaling
    }

    /// `W + s·B·A`, computed in f32 and returned in the dtype of `weight`.
    pub fn merge_into(&self, weight: Tensor<B, 2>) -> Tensor<B, 2> {
        let dtype = weight.dtype();
        let delta = self
            .b
            .val()
            .cast(DType::F32)
            .matmul(self.a.val().cast(DType::F32))
            * self.scaling;
        (weight.cast(DType::F32) + delta).cast(dtype)
    }
}
