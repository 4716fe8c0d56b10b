//! Layers shared by the model families: linear maps in Hugging Face weight layout, RMSNorm,
//! LayerNorm, rotate-half RoPE driven by explicit position ids, grouped-query attention with
//! padding + causal masks and a KV cache (the Qwen decoders' [`Attention`], with optional q/k
//! norms), the SwiGLU MLP and the GELU variants.
//!
//! Every layer has a `new` (its sizes, placeholder tensors) and a `weights` that names each
//! tensor once for both loading and export ([`crate::weights::Weights`]), next to its `forward`. burn's built-in rotary encoding (interleaved pairs, contiguous offsets) and its
//! attention (no GQA, no position ids) do not fit Hugging Face models, hence these.

mod kv_cache;
mod linear;
mod masked_attention;
mod mlp;
mod norm;
mod rotary;
mod self_attention;
#[cfg(test)]
mod tests;

pub use crate::kernels::attention::MaskRule;
pub(crate) use kv_cache::{append_kv, reserve_kv};
pub use linear::Linear;
pub use masked_attention::{
    AttentionMask, MASKED, attention, causal_padding_bias, causal_padding_window_bias,
    grouped_attention_bias, grouped_query_attention, repeat_kv,
};
pub use mlp::{SwiGluMlp, gelu_erf, quick_gelu, silu};
pub use norm::{LayerNorm, RmsNorm, cast_to, rms_normalize};
pub use rotary::{Rotary, apply_rotary, inv_freq, rope_tables, rotate_half};
pub use self_attention::{Attention, AttentionShape};
