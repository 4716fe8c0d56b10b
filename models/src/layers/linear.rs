//! [`Linear`]: a linear map in Hugging Face weight layout (`[out, in]`), with an optional bias
//! and LoRA adapter.

use burn::module::Param;
use burn::prelude::*;

use crate::lora::Lora;
use crate::weights::{Init, WeightNames, Weights, join, shaped};

/// `y = x·Wᵀ + b` with `W` stored `[out, in]` as in PyTorch / Hugging Face checkpoints, plus
/// `s · x·Aᵀ·Bᵀ` when the build attached a LoRA adapter ([`crate::lora`]).
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    pub weight: Param<Tensor<B, 2>>,
    pub bias: Option<Param<Tensor<B, 1>>>,
    pub lora: Option<Lora<B>>,
}

/// `{prefix}.weight` `[out, in]`, `{prefix}.bias` `[out]` when present, and the adapter the
/// source gives module `prefix`.
impl<B: Backend> Weights<B> for Linear<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        w.adapted(
            &join(prefix, "weight"),
            &mut self.weight,
            self.lora.as_ref(),
        );
        if let Some(b) = &mut self.bias {
            w.tensor(&join(prefix, "bias"), b, Init::Zeros);
        }
        w.adapter(prefix, &mut self.lora, &self.weight);
    }
}

impl<B: Backend> Linear<B> {
    /// `[out_dim, in_dim]` weight, `[out_dim]` bias when `bias`, no adapter (placeholders).
    pub fn new(device: &B::Device, in_dim: usize, out_dim: usize, bias: bool) -> Self {
        Self {
            weight: shaped(device, [out_dim, in_dim]),
            bias: bias.then(|| shaped(device, [out_dim])),
            lora: None,
        }
    }

    /// Applies the map over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dims = x.dims();
        let in_dim = dims[D - 1];
        let rows = x.shape().num_elements() / in_dim;
        let w = self.weight.val();
        let out_dim = w.dims()[0];
        let x = x.reshape([rows, in_dim]);
        let mut y = match &self.lora {
            Some(lora) => x.clone().matmul(w.transpose()) + lora.forward(x),
            None => x.matmul(w.transpose()),
        };
        if let Some(b) = &self.bias {
            y = y + b.val().unsqueeze_dim(0);
        }
        let mut out = dims;
        out[D - 1] = out_dim;
        y.reshape(out)
    }
}
