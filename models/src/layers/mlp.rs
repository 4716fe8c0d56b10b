//! Activations (exact GELU, QuickGELU, SiLU) and the SwiGLU MLP ([`SwiGluMlp`]).

use burn::prelude::*;
use burn::tensor::activation::sigmoid;

use super::linear::Linear;
use crate::weights::{WeightNames, Weights, join};

/// Exact GELU `0.5·z·(1 + erf(z/√2))` (PyTorch `nn.GELU()` default).
pub fn gelu_erf<const D: usize, B: Backend>(z: Tensor<B, D>) -> Tensor<B, D> {
    z.clone() * (z * std::f64::consts::FRAC_1_SQRT_2).erf().add_scalar(1.0) * 0.5
}

/// QuickGELU `z·σ(1.702·z)` (CLIP / Qwen2-VL vision MLP).
pub fn quick_gelu<const D: usize, B: Backend>(z: Tensor<B, D>) -> Tensor<B, D> {
    z.clone() * sigmoid(z * 1.702)
}

/// SiLU `z·σ(z)`.
pub fn silu<const D: usize, B: Backend>(z: Tensor<B, D>) -> Tensor<B, D> {
    z.clone() * sigmoid(z)
}

/// Gated MLP `down(silu(gate(x)) ⊙ up(x))` (LLaMA/Qwen SwiGLU).
#[derive(Module, Debug)]
pub struct SwiGluMlp<B: Backend> {
    pub gate_proj: Linear<B>,
    pub up_proj: Linear<B>,
    pub down_proj: Linear<B>,
}

/// `{prefix}.{gate,up,down}_proj`.
impl<B: Backend> Weights<B> for SwiGluMlp<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        self.gate_proj.weights(w, &join(prefix, "gate_proj"));
        self.up_proj.weights(w, &join(prefix, "up_proj"));
        self.down_proj.weights(w, &join(prefix, "down_proj"));
    }
}

impl<B: Backend> SwiGluMlp<B> {
    pub fn new(device: &B::Device, dim: usize, hidden: usize, bias: bool) -> Self {
        Self {
            gate_proj: Linear::new(device, dim, hidden, bias),
            up_proj: Linear::new(device, dim, hidden, bias),
            down_proj: Linear::new(device, hidden, dim, bias),
        }
    }

    /// On the GPU backends the gate is one kernel ([`crate::kernels::elementwise::swiglu`]).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let gate = self.gate_proj.forward(x.clone());
        let up = self.up_proj.forward(x);
        let g = match crate::kernels::elementwise::swiglu(&gate, &up) {
            Some(g) => g,
            None => silu(gate) * up,
        };
        self.down_proj.forward(g)
    }
}
