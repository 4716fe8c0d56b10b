//! The Qwen3-VL text decoder (transformers `Qwen3VLTextModel`, `Qwen3VLTextDecoderLayer`,
//! `Qwen3VLTextAttention` in `modeling_qwen3_vl.py`).
//!
//! Layer i, pre-norm:
//!
//! ```text
//! a = RMSNorm(h)
//! q = RMSNorm_hd(a·Wqᵀ) per head, k = RMSNorm_hd(a·Wkᵀ) per head, v = a·Wvᵀ   (q_norm, k_norm over head_dim)
//! q, k = rope(q, k)                                (interleaved M-RoPE, after the norms)
//! h += o_proj(softmax(q·kᵀ/√head_dim + mask)·v)    (GQA, causal + padding mask, KV cache)
//! h += down(silu(gate(a')) ⊙ up(a')),  a' = RMSNorm(h)
//! h += deepstack_i   at the image-token positions, for i < number of DeepStack features
//! ```
//!
//! `head_dim` is explicit, so `q_proj` / `o_proj` may be non-square. The cache holds k after
//! k_norm and RoPE. The layers are Qwen2-VL's ([`DecoderLayer`], with
//! [`crate::layers::Attention`]'s optional q/k norms switched on); what is Qwen3-VL's own is the
//! interleaved rotary table, the hub names and the DeepStack additions. DeepStack features arrive inside the input embeddings (see
//! [`TextModel::forward`]); decode steps (text tokens only) carry none.

use std::ops::Range;

use burn::module::Param;
use burn::prelude::*;

use super::config::TextConfig;
use super::positions::interleaved_rope_tables;
use crate::capabilities::{DecoderInputs, KvCache};
use crate::layers::{RmsNorm, inv_freq};
pub use crate::qwen2_vl::text::{DecoderLayer, TextTrace};
use crate::qwen2_vl::text::{embed, logits, new_stack, run_layers, stack_weights};
use crate::weights::{WeightNames, Weights, join};

/// Checkpoint prefix of the decoder.
pub const PREFIX: &str = "model.language_model";

/// Embeddings, decoder layers, final norm and LM head.
#[derive(Module, Debug)]
pub struct TextModel<B: Backend> {
    /// `[vocab, hidden]`.
    pub embed_tokens: Param<Tensor<B, 2>>,
    pub layers: Vec<DecoderLayer<B>>,
    pub norm: RmsNorm<B>,
    /// `[vocab, hidden]`; `None` when tied to `embed_tokens`.
    pub lm_head: Option<Param<Tensor<B, 2>>>,
    pub inv_freq: Vec<f32>,
    pub mrope_section: [usize; 3],
    pub hidden_size: usize,
}

/// `model.language_model.*` and `lm_head.weight` ([`stack_weights`]).
impl<B: Backend> Weights<B> for TextModel<B> {
    fn weights<W: WeightNames<B>>(&mut self, w: &mut W, prefix: &str) {
        let (embed, layers, norm) = (&mut self.embed_tokens, &mut self.layers, &mut self.norm);
        stack_weights(
            w,
            &join(prefix, PREFIX),
            embed,
            layers,
            norm,
            &mut self.lm_head,
        );
    }
}

impl<B: Backend> TextModel<B> {
    pub fn new(device: &B::Device, c: &TextConfig) -> Self {
        let s = new_stack(device, &c.shape());
        Self {
            embed_tokens: s.embed_tokens,
            layers: s.layers,
            norm: s.norm,
            lm_head: s.lm_head,
            inv_freq: inv_freq(c.rope_theta, c.head_dim),
            mrope_section: [0, 1, 2].map(|i| c.mrope_section[i]),
            hidden_size: c.hidden_size,
        }
    }

    /// `[b, l, hidden]` embeddings of `ids` `[b, l]`.
    pub fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        embed(&self.embed_tokens, ids)
    }

    /// Decoder over `embeds`; returns the final-normed hidden states `[b, l, hidden]`.
    ///
    /// `embeds` is `[b, l, hidden·(1 + K)]`: channels `0..hidden` are the input embeddings,
    /// block `j ≥ 1` the DeepStack feature added to the residual stream after layer `j − 1`
    /// (zero at text positions, so adding the whole block is transformers'
    /// `h[visual_pos_masks] += feature`; see [`crate::capabilities::Vision::embed_images`]).
    /// K = 0 for text-only inputs. When `trace` is given it receives the residual stream around
    /// every layer (for parity tests).
    pub fn forward(
        &self,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
        cache: Option<&mut KvCache<B>>,
        trace: Option<&mut TextTrace<B>>,
    ) -> Tensor<B, 3> {
        let inputs = self.decoder_inputs(embeds);
        let (cos, sin) = self.rope(positions);
        let h = run_layers(
            &self.layers,
            inputs.stream,
            &self.deepstack_blocks(inputs.layer_inputs),
            cos,
            sin,
            attention_mask,
            cache,
            trace,
        );
        self.norm.forward(h)
    }

    /// The residual stream (channels `0..hidden` of `embeds`) and, when `embeds` carries
    /// DeepStack blocks, the blocks as layer inputs (block j is read by layer j).
    pub fn decoder_inputs(&self, embeds: Tensor<B, 3>) -> DecoderInputs<B> {
        let [_, _, width] = embeds.dims();
        let hidden = self.hidden_size;
        assert!(
            width.is_multiple_of(hidden) && width >= hidden,
            "input embeddings are {width} wide, not a multiple of the hidden size {hidden}"
        );
        if width == hidden {
            return DecoderInputs {
                stream: embeds,
                layer_inputs: None,
            };
        }
        DecoderInputs {
            stream: embeds.clone().narrow(2, 0, hidden),
            layer_inputs: Some(embeds.narrow(2, hidden, width - hidden)),
        }
    }

    /// Layer i reads DeepStack block i, channels `i·hidden .. (i + 1)·hidden`.
    pub fn layer_input_channels(&self, layers: Range<usize>) -> Range<usize> {
        layers.start * self.hidden_size..layers.end * self.hidden_size
    }

    /// `layers` over the residual stream `h` (no cache), with their DeepStack blocks
    /// `layer_inputs` (the first block is the first layer's; layers past the last block get
    /// none).
    pub fn segment(
        &self,
        layers: Range<usize>,
        h: Tensor<B, 3>,
        layer_inputs: Option<Tensor<B, 3>>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
    ) -> Tensor<B, 3> {
        let (cos, sin) = self.rope(positions);
        run_layers(
            &self.layers[layers],
            h,
            &self.deepstack_blocks(layer_inputs),
            cos,
            sin,
            attention_mask,
            None,
            None,
        )
    }

    /// The final norm.
    pub fn final_norm(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
        self.norm.forward(h)
    }

    /// `[b, l, k·hidden]` DeepStack channels as k blocks of `hidden`.
    fn deepstack_blocks(&self, channels: Option<Tensor<B, 3>>) -> Vec<Tensor<B, 3>> {
        let Some(channels) = channels else {
            return Vec::new();
        };
        let hidden = self.hidden_size;
        (0..channels.dims()[2] / hidden)
            .map(|j| channels.clone().narrow(2, j * hidden, hidden))
            .collect()
    }

    /// The interleaved M-RoPE tables of `positions`.
    fn rope(&self, positions: Tensor<B, 3, Int>) -> (Tensor<B, 3>, Tensor<B, 3>) {
        interleaved_rope_tables(positions, &self.inv_freq, self.mrope_section)
    }

    /// `hidden · Wᵀ` with the LM head (or the tied embedding table), returned in f32.
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        logits(&self.embed_tokens, &self.lm_head, hidden)
    }
}
