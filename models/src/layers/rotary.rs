//! Rotate-half RoPE driven by explicit position ids: the inverse frequencies, the cos/sin
//! tables ([`rope_tables`], multimodal sections included) and the rotation ([`Rotary`],
//! [`apply_rotary`]).

use burn::prelude::*;
use burn::tensor::DType;

use super::norm::cast_to;

/// `rotate_half(x) = [−x[d/2:], x[:d/2]]` over the last dimension.
pub fn rotate_half<const D: usize, B: Backend>(x: Tensor<B, D>) -> Tensor<B, D> {
    let d = x.dims()[D - 1];
    let half = d / 2;
    let x1 = x.clone().narrow(D - 1, 0, half);
    let x2 = x.narrow(D - 1, half, half);
    Tensor::cat(vec![x2.neg(), x1], D - 1)
}

/// Rotate-half RoPE: `x·cos + rotate_half(x)·sin` (cos/sin broadcast against `x`, cast to its
/// dtype).
pub fn apply_rotary<const D: usize, B: Backend>(
    x: Tensor<B, D>,
    cos: Tensor<B, D>,
    sin: Tensor<B, D>,
) -> Tensor<B, D> {
    let dtype = x.dtype();
    x.clone() * cos.cast(dtype) + rotate_half(x) * sin.cast(dtype)
}

/// Rotate-half RoPE with its cos/sin tables in the compute dtype, cast once per forward (not
/// per layer): `x·cos + rotate_half(x)·sin`, where
/// `rotate_half(x)·sin = [−x₂·sin₁, x₁·sin₂] = swap_halves(x)·[−sin₁, sin₂]` (the sign moves
/// from x onto the table; `(−a)·b = a·(−b)` exactly in IEEE arithmetic). Same values as
/// [`apply_rotary`].
///
/// On the GPU backends one kernel per rotation ([`crate::kernels::elementwise::rotate_half`]),
/// reading the `[a, c, d]` tables for every head. Elsewhere the tables are laid out once,
/// contiguous, in the layout of the tensors they rotate (`[.., heads, head_dim]`, the layout a
/// projection's output has before the heads are moved forward), so that every layer's
/// rotation is two same-shape products and a sum: on the Flex CPU backend an elementwise
/// product of a permuted view with a broadcast table walks a scalar strided iterator, about an
/// order of magnitude slower than the contiguous path, in the forward and again in the
/// backward.
#[derive(Debug, Clone)]
pub struct Rotary<B: Backend> {
    /// `[a, c, head_dim]`.
    cos: Tensor<B, 3>,
    /// `[−sin(angle), sin(angle)]` over the two halves of the head dimension, `[a, c, head_dim]`.
    sin_signed: Tensor<B, 3>,
    heads: usize,
    /// The composite's tables `[a, c, heads, head_dim]`, built on first use.
    laid_out: std::cell::OnceCell<(Tensor<B, 4>, Tensor<B, 4>)>,
}

impl<B: Backend> Rotary<B> {
    /// Tables for `heads` heads in `dtype` from cos/sin `[a, c, head_dim]` (as [`rope_tables`]
    /// returns them: `a` = batch, `c` = length; or `a` = 1, `c` = patches).
    pub fn new(cos: Tensor<B, 3>, sin: Tensor<B, 3>, heads: usize, dtype: DType) -> Self {
        let d = sin.dims()[2];
        let half = d / 2;
        let sin_signed = Tensor::cat(
            vec![
                sin.clone().narrow(2, 0, half).neg(),
                sin.narrow(2, half, d - half),
            ],
            2,
        );
        Self {
            cos: cast_to(cos, dtype),
            sin_signed: cast_to(sin_signed, dtype),
            heads,
            laid_out: std::cell::OnceCell::new(),
        }
    }

    /// Rotates `x` `[a, c, heads, head_dim]` (in the tables' dtype).
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        if let Some(y) = crate::kernels::elementwise::rotate_half(&x, &self.cos, &self.sin_signed) {
            return y;
        }
        let (cos, sin_signed) = self.laid_out.get_or_init(|| {
            let lay = |t: &Tensor<B, 3>| t.clone().unsqueeze_dim::<4>(2).repeat_dim(2, self.heads);
            (lay(&self.cos), lay(&self.sin_signed))
        });
        let d = x.dims()[3];
        let half = d / 2;
        let swapped = Tensor::cat(
            vec![
                x.clone().narrow(3, half, d - half),
                x.clone().narrow(3, 0, half),
            ],
            3,
        );
        x * cos.clone() + swapped * sin_signed.clone()
    }
}

/// RoPE inverse frequencies `1 / theta^(2i/dim)`, i = 0..dim/2 − 1 (computed in f64, stored f32).
pub fn inv_freq(theta: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| (1.0 / theta.powf(2.0 * i as f64 / dim as f64)) as f32)
        .collect()
}

/// cos/sin tables `[batch, len, head_dim]` of rotate-half RoPE from explicit position ids
/// `[streams, batch, len]`.
///
/// Half-dimension slot i takes its position from stream `s(i)`: with one stream every slot uses
/// it; with several, `sections` (Qwen2-VL's `mrope_section`, summing to head_dim/2) assigns
/// consecutive slots to streams 0, 1, 2. `angle_i = pos[s(i)]·inv_freq[i]`,
/// `cos = [cos(angle), cos(angle)]` (HF `apply_multimodal_rotary_pos_emb`).
pub fn rope_tables<B: Backend>(
    positions: Tensor<B, 3, Int>,
    inv_freq: &[f32],
    sections: &[usize],
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let [streams, batch, len] = positions.dims();
    let half = inv_freq.len();
    let device = positions.device();
    let freq = Tensor::<B, 1>::from_data(TensorData::new(inv_freq.to_vec(), [half]), &device)
        .reshape([1, 1, half]);
    let pos = positions.float();
    let angles = if streams == 1 {
        pos.reshape([batch, len, 1]) * freq
    } else {
        let mut parts = Vec::with_capacity(sections.len());
        let mut start = 0;
        for (s, &n) in sections.iter().enumerate() {
            let p = pos
                .clone()
                .narrow(0, s.min(streams - 1), 1)
                .reshape([batch, len, 1]);
            parts.push(p * freq.clone().narrow(2, start, n));
            start += n;
        }
        Tensor::cat(parts, 2)
    };
    let emb = Tensor::cat(vec![angles.clone(), angles], 2);
    (emb.clone().cos(), emb.sin())
}
