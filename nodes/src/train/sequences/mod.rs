//! Response-token log-probs and entropies of rollouts under a model, shared by the `logprob`,
//! `update.ppo` and `update.sft` nodes, and the gradients of the update nodes' losses of them.
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
//! Under autodiff, one graph through every block ([`SequenceBatch::log_probs`]) would keep each
//! block's logits for the backward: `[B, T, V]` floats in all (f32: the models cast logits to
//! f32), 12 GB for a 152k vocabulary and 20k response tokens. The update nodes therefore use
//! [`SequenceBatch::loss_gradients`] ([`chunked_loss_backward`]): a two-stage backward (trunk
//! once with its graph; log-probs and entropies as values; the loss's gradient with respect to
//! them; per chunk, the logits again and that chunk's backward; then the trunk's backward from
//! the collected hidden-state gradients), exact by the chain rule, with one chunk of logits (and
//! its log-softmax intermediates) alive at a time, forward or backward. The `logprob` node runs
//! [`SequenceBatch::log_probs`] on the non-autodiff model. With the update nodes'
//! `gradient_checkpointing`, the trunk keeps no graph either: its backward recomputes the decoder
//! one layer at a time ([`crate::train::checkpoint`]).
//!
//! The nodes' default `chunk` is 16: a smaller block lowers the peak memory of the update and of
//! the log-prob pass at the same CPU time (bench/results/profile.md).
//!
//! The `n` responses of one prompt share its images: the vision tower runs once per distinct
//! image of the batch and its embeddings are gathered per row ([`Model::input_embeddings_shared`]).
//! A multi-turn response's tool pictures ([`crate::values::Trajectory`]) follow its prompt's
//! pictures, in the order of their tokens in the response.
//!
//! **Padding-free** ([`Layout::PaddingFree`], verl `use_remove_padding`): the sequences
//! (prompt + response, no padding) are packed one after the other into rows of the longest
//! sequence's length `C`, first-fit by decreasing length (ties in row order), each row's free
//! tail padded. The attention mask numbers a row's sequences 1, 2, …, so attention stays inside
//! each ([`flowrl_models::layers::causal_padding_bias`]); each sequence keeps the position ids it
//! has in the padded layout (computed there by the model's capability, multimodal RoPE
//! included, and copied over); the hidden states that predict the response tokens are gathered
//! back into `[b, T, H]`, so the LM head, the loss and everything after see the padded path's
//! shapes and values (equal within float rounding: the matmuls run over other rows). The
//! decoder then runs over `rows · C` positions instead of `b · (P + T)`: with responses of
//! mixed lengths, most of the padding is gone. The LM head still runs over the `[b, T]`
//! response slots, the padded ones included.

use std::collections::HashMap;

use anyhow::{Result, ensure};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use flowrl_models::weights::Precision;
use flowrl_models::{Model, PaddedBatch, PositionIds, ProcessedImage};

use crate::train::checkpoint::{TrunkBackward, checkpointed_trunk};
use crate::train::chunked_backward::{LossPass, ResponseLogProbs, chunked_loss_backward};
use crate::train::grad_sum::GradSum;
use crate::values::RolloutBatch;

/// How the rows of a micro-batch are laid out for the forward pass (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// One row per sequence: the prompt left-padded to the longest, the response right-padded.
    #[default]
    Padded,
    /// Sequences packed one after the other into rows of the longest sequence's length.
    PaddingFree,
}

impl Layout {
    /// [`Layout::PaddingFree`] when `padding_free`, else [`Layout::Padded`].
    pub fn padding_free(padding_free: bool) -> Self {
        if padding_free {
            Self::PaddingFree
        } else {
            Self::Padded
        }
    }
}

/// Rows of a rollout batch laid out for one forward pass (see the module doc).
#[derive(Debug, Clone)]
pub struct SequenceBatch {
    /// The forward pass's token ids and attention mask: `[b, P + T]` padded, or `[rows, C]`
    /// packed (the mask then numbers each row's sequences).
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
    /// Per entry of `images`, the index of its first occurrence in `images` (rows answering the
    /// same prompt carry the same images).
    image_first: Vec<usize>,
    /// Where each sequence sits in the packed rows ([`Layout::PaddingFree`]); `None` when padded.
    packing: Option<Packing>,
}

/// A padding-free layout of the rows of a [`SequenceBatch`] (see the module doc).
#[derive(Debug, Clone)]
struct Packing {
    /// The padded layout of the same rows, where each sequence's position ids are computed.
    padded: PaddedBatch,
    /// The rows' images in row order (the padded layout's).
    padded_images: Vec<ProcessedImage>,
    /// Per sequence, in row order: its packed row and the offset of its first token there.
    starts: Vec<(usize, usize)>,
    /// Per sequence: its prompt and response lengths.
    lengths: Vec<(usize, usize)>,
}

impl SequenceBatch {
    /// Lays out `rows` of `rollouts` padded (see the module doc).
    pub fn new(rollouts: &RolloutBatch, rows: &[usize]) -> Result<Self> {
        Self::with_layout(rollouts, rows, Layout::Padded)
    }

    /// Lays out `rows` of `rollouts` in `layout` (see the module doc).
    pub fn with_layout(rollouts: &RolloutBatch, rows: &[usize], layout: Layout) -> Result<Self> {
        let padded = Self::padded(rollouts, rows)?;
        Ok(match layout {
            Layout::Padded => padded,
            Layout::PaddingFree => padded.packed(rollouts, rows),
        })
    }

    /// Number of sequences (rows of the `[b, T]` outputs).
    pub fn rows(&self) -> usize {
        self.labels.len() / self.response_len
    }

    /// The padded layout.
    fn padded(rollouts: &RolloutBatch, rows: &[usize]) -> Result<Self> {
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
        let mut image_first = Vec::new();
        let mut first_of: HashMap<(usize, usize), usize> = HashMap::new();
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
            let prompt_index = rollouts.prompt_index[r];
            for (k, image) in rollouts.prompts.prompts[prompt_index]
                .images
                .iter()
                .enumerate()
            {
                image_first.push(*first_of.entry((prompt_index, k)).or_insert(images.len()));
                images.push(image.clone());
            }
            // A multi-turn response's tool pictures follow its prompt's, each its own.
            for image in rollouts.response_images(r) {
                image_first.push(images.len());
                images.push(image.clone());
            }
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
            image_first,
            packing: None,
        })
    }

    /// This padded layout's rows packed padding-free (see the module doc); `rows` are the rows
    /// of `rollouts` it lays out, in its order.
    fn packed(self, rollouts: &RolloutBatch, rows: &[usize]) -> Self {
        let lengths: Vec<(usize, usize)> = rows
            .iter()
            .map(|&r| (rollouts.prompt_ids[r].len(), rollouts.response_ids[r].len()))
            .collect();
        let total: Vec<usize> = lengths.iter().map(|&(p, r)| p + r).collect();
        let width = total.iter().copied().max().unwrap_or(0);
        // First fit by decreasing length, ties in row order: deterministic.
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(total[i]), i));
        let mut fill: Vec<usize> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let mut starts = vec![(0, 0); rows.len()];
        for i in order {
            let bin = match fill.iter().position(|&f| f + total[i] <= width) {
                Some(bin) => bin,
                None => {
                    fill.push(0);
                    members.push(Vec::new());
                    fill.len() - 1
                }
            };
            starts[i] = (bin, fill[bin]);
            fill[bin] += total[i];
            members[bin].push(i);
        }
        // Each sequence's tokens and images, from its padded row.
        let len = self.tokens.len;
        let mut image_ranges = Vec::with_capacity(rows.len());
        let mut next = 0;
        for &r in rows {
            let n = rollouts.prompts.prompts[rollouts.prompt_index[r]]
                .images
                .len()
                + rollouts.response_images(r).len();
            image_ranges.push(next..next + n);
            next += n;
        }
        let pad = rollouts.prompts.pad_token_id;
        let mut ids = vec![pad; fill.len() * width];
        let mut attention = vec![0u32; fill.len() * width];
        let mut images = Vec::with_capacity(self.images.len());
        let mut image_first = Vec::with_capacity(self.images.len());
        let mut first_of: HashMap<usize, usize> = HashMap::new();
        for (bin, seqs) in members.iter().enumerate() {
            for (segment, &i) in seqs.iter().enumerate() {
                let (p, r) = lengths[i];
                let from = i * len + self.prompt_len - p;
                let to = bin * width + starts[i].1;
                ids[to..to + p + r].copy_from_slice(&self.tokens.ids[from..from + p + r]);
                attention[to..to + p + r].fill(segment as u32 + 1);
                for k in image_ranges[i].clone() {
                    let first = self.image_first[k];
                    image_first.push(*first_of.entry(first).or_insert(images.len()));
                    images.push(self.images[k].clone());
                }
            }
        }
        let packed = PaddedBatch {
            ids,
            attention_mask: attention,
            batch: fill.len(),
            len: width,
        };
        Self {
            packing: Some(Packing {
                padded: self.tokens,
                padded_images: self.images,
                starts,
                lengths,
            }),
            tokens: packed,
            images,
            image_first,
            ..self
        }
    }

    /// The position ids of the forward pass: the model's on the padded layout, copied to where
    /// each sequence sits when packed.
    fn position_ids<B: Backend>(&self, model: &Model<B>) -> Result<PositionIds> {
        let Some(packing) = &self.packing else {
            return model.position_ids(&self.tokens, &self.images);
        };
        let padded = model.position_ids(&packing.padded, &packing.padded_images)?;
        let (rows, width) = (self.tokens.batch, self.tokens.len);
        let mut ids = vec![0i64; padded.streams * rows * width];
        for (i, (&(bin, offset), &(p, r))) in
            packing.starts.iter().zip(&packing.lengths).enumerate()
        {
            for s in 0..padded.streams {
                let from = (s * padded.batch + i) * padded.len + self.prompt_len - p;
                let to = (s * rows + bin) * width + offset;
                ids[to..to + p + r].copy_from_slice(&padded.ids[from..from + p + r]);
            }
        }
        Ok(PositionIds {
            streams: padded.streams,
            batch: rows,
            len: width,
            ids,
            rope_deltas: vec![0; rows],
        })
    }

    /// Per response slot `(row, t)` of `[b, T]`, the index in the flattened `[rows · C]` packed
    /// positions of the hidden state that predicts it (a padded slot repeats its row's last
    /// prompt position: its value is masked).
    fn packed_response_index(&self, packing: &Packing) -> Vec<i64> {
        let width = self.tokens.len;
        let mut index = Vec::with_capacity(self.labels.len());
        for (&(bin, offset), &(p, r)) in packing.starts.iter().zip(&packing.lengths) {
            let last_prompt = bin * width + offset + p - 1;
            index.extend((0..self.response_len).map(|t| (last_prompt + t.min(r)) as i64));
        }
        index
    }

    /// `[b, T]` response mask tensor.
    pub fn mask_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2> {
        Tensor::<B, 1>::from_data(
            TensorData::new(self.mask.clone(), [self.mask.len()]),
            device,
        )
        .reshape([self.rows(), self.response_len])
    }

    /// The final hidden states `[b, T, H]` that predict the response tokens (sequence positions
    /// `P − 1 .. P − 1 + T`) and the labels `[b, T]` (see the module doc).
    pub fn response_hidden<B: Backend>(
        &self,
        model: &Model<B>,
        device: &B::Device,
    ) -> Result<(Tensor<B, 3>, Tensor<B, 2, Int>)> {
        let (ids, embeds, positions, mask) = self.trunk_inputs(model, device)?;
        let hidden = model
            .causal_lm()
            .forward_hidden(ids, embeds, positions, mask, None);
        Ok(self.response_positions(hidden, device))
    }

    /// [`Self::response_hidden`] on `view` (`model` or a recorded cast of it) for a backward,
    /// with the [`TrunkBackward`] that takes the trunk's share of the gradients: through the
    /// forward's graph, or, with `checkpointing`, by recomputing each decoder segment
    /// ([`crate::train::checkpoint`]).
    #[allow(clippy::type_complexity)]
    pub fn response_hidden_for_backward<B: AutodiffBackend>(
        &self,
        model: &Model<B>,
        view: &Model<B>,
        checkpointing: bool,
        device: &B::Device,
    ) -> Result<(Tensor<B, 3>, Tensor<B, 2, Int>, TrunkBackward<B>)> {
        if !checkpointing {
            let (hidden, labels) = self.response_hidden(view, device)?;
            return Ok((hidden, labels, TrunkBackward::Graph));
        }
        let (ids, embeds, positions, mask) = self.trunk_inputs(view, device)?;
        let (hidden, trunk) = checkpointed_trunk(model, view, ids, embeds, positions, mask);
        let (hidden, labels) = self.response_positions(hidden, device);
        Ok((hidden, labels, trunk))
    }

    /// The decoder's inputs: token ids, input embeddings (the vision tower once per distinct
    /// image), position ids and the attention mask.
    #[allow(clippy::type_complexity)]
    fn trunk_inputs<B: Backend>(
        &self,
        model: &Model<B>,
        device: &B::Device,
    ) -> Result<(
        Tensor<B, 2, Int>,
        Tensor<B, 3>,
        Tensor<B, 3, Int>,
        Tensor<B, 2, Int>,
    )> {
        let embeds =
            model.input_embeddings_shared(&self.tokens, &self.images, &self.image_first, device)?;
        let positions = self.position_ids(model)?;
        Ok((
            self.tokens.ids_tensor::<B>(device),
            embeds,
            positions.tensor::<B>(device),
            self.tokens.mask_tensor::<B>(device),
        ))
    }

    /// The hidden states `[b, T, H]` of the positions that predict the response tokens, out of
    /// the trunk's `hidden` (padded or packed rows), and the labels `[b, T]`.
    fn response_positions<B: Backend>(
        &self,
        hidden: Tensor<B, 3>,
        device: &B::Device,
    ) -> (Tensor<B, 3>, Tensor<B, 2, Int>) {
        let (b, t) = (self.rows(), self.response_len);
        let response_hidden = match &self.packing {
            None => hidden.narrow(1, self.prompt_len - 1, t),
            Some(packing) => {
                let [rows, width, h] = hidden.dims();
                let index = self.packed_response_index(packing);
                let index = Tensor::<B, 1, Int>::from_data(TensorData::new(index, [b * t]), device);
                hidden
                    .reshape([rows * width, h])
                    .select(0, index)
                    .reshape([b, t, h])
            }
        };
        let labels = Tensor::<B, 1, Int>::from_data(
            TensorData::new(self.labels.clone(), [self.labels.len()]),
            device,
        )
        .reshape([b, t]);
        (response_hidden, labels)
    }

    /// Log-probs and entropies `[b, T]` of the response tokens (see the module doc), through one
    /// graph when `B` is an autodiff backend (the update nodes use [`Self::loss_gradients`]
    /// instead, which never keeps more than one chunk of logits).
    pub fn log_probs<B: Backend>(
        &self,
        model: &Model<B>,
        temperature: f64,
        chunk: usize,
        device: &B::Device,
    ) -> Result<ResponseLogProbs<B>> {
        let (response_hidden, labels) = self.response_hidden(model, device)?;
        let lm = model.causal_lm();
        let (entropy, log_probs) = flowrl_algorithms::entropy_and_logprobs_from_hidden(
            response_hidden,
            labels,
            |h| lm.lm_head(h),
            temperature,
            chunk,
        )?;
        Ok(ResponseLogProbs { log_probs, entropy })
    }

    /// [`Self::log_probs`] and Σ_v π_v² `[b, T]` of the same (temperature-scaled) distributions
    /// (verl's `calculate_sum_pi_squared`, read by the optimal-token-baseline estimators), from
    /// one trunk pass; the LM head runs twice over the response positions.
    pub fn log_probs_and_sum_pi_squared<B: Backend>(
        &self,
        model: &Model<B>,
        temperature: f64,
        chunk: usize,
        device: &B::Device,
    ) -> Result<(ResponseLogProbs<B>, Tensor<B, 2>)> {
        let (response_hidden, labels) = self.response_hidden(model, device)?;
        let lm = model.causal_lm();
        let (entropy, log_probs) = flowrl_algorithms::entropy_and_logprobs_from_hidden(
            response_hidden.clone(),
            labels,
            |h| lm.lm_head(h),
            temperature,
            chunk,
        )?;
        let sum_pi_squared = flowrl_algorithms::sum_pi_squared_from_hidden(
            response_hidden,
            |h| lm.lm_head(h),
            temperature,
            chunk,
        )?;
        Ok((ResponseLogProbs { log_probs, entropy }, sum_pi_squared))
    }

    /// The gradients of `loss_of(log_probs, entropy)` over these rows with respect to `model`'s
    /// parameters, computing in `precision`, by the two-stage backward of
    /// [`chunked_loss_backward`]: one forward of the trunk on one [`Model::compute_view`] of `model`,
    /// whose graph both stages hang off (the LM-head stage through leaf copies of the view's
    /// weights, the trunk stage through the view itself, so each recorded cast is consumed by
    /// exactly one backward); the gradients land on `model`'s (f32) parameters. With
    /// `checkpointing` the trunk keeps no graph and its segments are recomputed in the backward
    /// ([`crate::train::checkpoint`]).
    #[allow(clippy::too_many_arguments)]
    pub fn loss_gradients<B, L>(
        &self,
        model: &Model<B>,
        precision: Precision,
        checkpointing: bool,
        temperature: f64,
        chunk: usize,
        device: &B::Device,
        loss_of: L,
    ) -> Result<LossGradients<B>>
    where
        B: AutodiffBackend,
        L: FnOnce(Tensor<B, 2>, Tensor<B, 2>) -> Result<Tensor<B, 1>>,
    {
        let mut sum = GradSum::on_device();
        let pass = self.loss_gradients_into(
            model,
            precision,
            checkpointing,
            temperature,
            chunk,
            device,
            loss_of,
            &mut sum,
        )?;
        Ok(LossGradients {
            loss: pass.loss,
            grads: pass.loss.is_finite().then(|| sum.into_device()),
            values: pass.values,
        })
    }

    /// [`Self::loss_gradients`] adding the gradients to `sum` as the backward hands them over
    /// (nothing when the loss is not finite).
    #[allow(clippy::too_many_arguments)]
    pub fn loss_gradients_into<B, L>(
        &self,
        model: &Model<B>,
        precision: Precision,
        checkpointing: bool,
        temperature: f64,
        chunk: usize,
        device: &B::Device,
        loss_of: L,
        sum: &mut GradSum,
    ) -> Result<LossPass<B>>
    where
        B: AutodiffBackend,
        L: FnOnce(Tensor<B, 2>, Tensor<B, 2>) -> Result<Tensor<B, 1>>,
    {
        let view = model.compute_view(precision);
        let (response_hidden, labels, trunk) =
            self.response_hidden_for_backward(model, &view, checkpointing, device)?;
        chunked_loss_backward(
            model,
            &view,
            (response_hidden, trunk),
            labels,
            temperature,
            chunk,
            loss_of,
            sum,
        )
    }
}

/// What [`SequenceBatch::loss_gradients`] computed for one micro-batch.
pub struct LossGradients<B: Backend> {
    /// The loss value (from the pass-1 values).
    pub loss: f64,
    /// The loss's gradients on the model's parameters, accumulated over the LM-head chunks and
    /// the trunk; `None` when the loss is not finite (then no backward ran).
    pub grads: Option<GradientsParams>,
    /// The pass-1 log-probs and entropies `[b, T]`, constants (no graph).
    pub values: ResponseLogProbs<B>,
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

#[cfg(test)]
mod tests;
