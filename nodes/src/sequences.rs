//! Response-token log-probs and entropies of rollouts under a model, shared by the `logprob`,
//! `update.ppo` and `update.sft` nodes.
//!
//! A set of rollout rows becomes one forward batch laid out as
//! `[left padding | prompt (P) | response (T) | right padding]`: prompts left-padded to the
//! longest prompt `P`, responses right-padded to the rollouts' `T`, one attention mask over both.
//! Position ids come from the model's capability on that mask (multimodal RoPE continues through
//! the response exactly as during decoding). The logits that predict response token `t` sit at
//! sequence position `P − 1 + t`; only those `T` hidden states go through the LM head, in chunks
//! of `chunk` positions (`flowrl_algorithms::entropy_and_logprobs_from_hidden`), divided by the
//! sampling temperature as verl's actor does. So the `[B, P + T, V]` logits never exist; one
//! `[B, chunk, V]` block does at a time.
//!
//! Differentiable when the model's backend is (update nodes); the `logprob` node passes the
//! non-autodiff model.

use anyhow::{Result, ensure};
use burn::prelude::*;
use flowrl_models::{Model, PaddedBatch, ProcessedImage};

use crate::values::RolloutBatch;

/// Rows of a rollout batch laid out for one forward pass (see the module doc).
#[derive(Debug, Clone)]
pub struct SequenceBatch {
    /// `[b, P + T]` token ids and attention mask.
    pub tokens: PaddedBatch,
    /// Longest prompt `P`.
    pub prompt_len: usize,
    /// Response width `T`.
    pub response_len: usize,
    /// `[b, T]` response ids (0 at padding), the labels of the log-probs.
    pub labels: Vec<i64>,
    /// `[b, T]` response mask.
    pub mask: Vec<f32>,
    /// The rows' images, in row order.
    pub images: Vec<ProcessedImage>,
}

impl SequenceBatch {
    /// Lays out `rows` of `rollouts` (see the module doc).
    pub fn new(rollouts: &RolloutBatch, rows: &[usize]) -> Result<Self> {
        ensure!(!rows.is_empty(), "no rows to lay out");
        let pad = rollouts.prompts.pad_token_id;
        let t = rollouts.response_len();
        ensure!(t > 0, "the rollouts hold no response token");
        let p = rows
            .iter()
            .map(|&r| rollouts.prompt_ids[r].len())
            .max()
            .unwrap_or(0);
        let len = p + t;
        let b = rows.len();
        let mut ids = Vec::with_capacity(b * len);
        let mut attention = Vec::with_capacity(b * len);
        let mut labels = Vec::with_capacity(b * t);
        let mut mask = Vec::with_capacity(b * t);
        let mut images = Vec::new();
        for &r in rows {
            let prompt = &rollouts.prompt_ids[r];
            let response = &rollouts.response_ids[r];
            ids.extend(std::iter::repeat_n(pad, p - prompt.len()));
            attention.extend(std::iter::repeat_n(0, p - prompt.len()));
            ids.extend_from_slice(prompt);
            attention.extend(std::iter::repeat_n(1, prompt.len()));
            ids.extend_from_slice(response);
            attention.extend(std::iter::repeat_n(1, response.len()));
            ids.extend(std::iter::repeat_n(pad, t - response.len()));
            attention.extend(std::iter::repeat_n(0, t - response.len()));
            labels.extend(response.iter().map(|&x| x as i64));
            labels.extend(std::iter::repeat_n(0, t - response.len()));
            mask.extend_from_slice(rollouts.response_mask.row(r));
            images.extend(
                rollouts.prompts.prompts[rollouts.prompt_index[r]]
                    .images
                    .iter()
                    .cloned(),
            );
        }
        Ok(Self {
            tokens: PaddedBatch {
                ids,
                attention_mask: attention,
                batch: b,
                len,
            },
            prompt_len: p,
            response_len: t,
            labels,
            mask,
            images,
        })
    }

    /// `[b, T]` response mask tensor.
    pub fn mask_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2> {
        Tensor::<B, 1>::from_data(
            TensorData::new(self.mask.clone(), [self.mask.len()]),
            device,
        )
        .reshape([self.tokens.batch, self.response_len])
    }

    /// Log-probs and entropies `[b, T]` of the response tokens (see the module doc).
    pub fn log_probs<B: Backend>(
        &self,
        model: &Model<B>,
        temperature: f64,
        chunk: usize,
        device: &B::Device,
    ) -> Result<ResponseLogProbs<B>> {
        let lm = model.causal_lm();
        let embeds = model.input_embeddings(&self.tokens, &self.images, device)?;
        let positions = model.position_ids(&self.tokens, &self.images)?;
        let hidden = lm.forward_hidden(
            self.tokens.ids_tensor::<B>(device),
            embeds,
            positions.tensor::<B>(device),
            self.tokens.mask_tensor::<B>(device),
            None,
        );
        let response_hidden = hidden.narrow(1, self.prompt_len - 1, self.response_len);
        let labels = Tensor::<B, 1, Int>::from_data(
            TensorData::new(self.labels.clone(), [self.labels.len()]),
            device,
        )
        .reshape([self.tokens.batch, self.response_len]);
        let (entropy, log_probs) = flowrl_algorithms::entropy_and_logprobs_from_hidden(
            response_hidden,
            labels,
            |h| lm.lm_head(h),
            temperature,
            chunk,
        )?;
        Ok(ResponseLogProbs { log_probs, entropy })
    }
}

/// Per response token: log-prob of the token and entropy of the distribution, `[b, T]`.
pub struct ResponseLogProbs<B: Backend> {
    pub log_probs: Tensor<B, 2>,
    pub entropy: Tensor<B, 2>,
}

/// Host copy of a `[rows, cols]` tensor, padding positions (mask 0) set to 0.
pub fn masked_host<B: Backend>(t: Tensor<B, 2>, mask: &[f32]) -> Result<Vec<f32>> {
    let v = t
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("reading a tensor: {e:?}"))?;
    Ok(v.iter()
        .zip(mask)
        .map(|(&x, &m)| if m > 0.5 { x } else { 0.0 })
        .collect())
}
