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
//! `[B, chunk, V]` block does at a time (under autodiff, each block's logits are kept for the
//! backward: `[B, T, V]` in all, but none of the block's other vocabulary-sized temporaries).
//! The nodes' default `chunk` is 16: on the benchmark's update micro-batch (32 rows × 128
//! response tokens, vocabulary 32000) peak RSS 5.65 → 5.0–5.4 GB against 64, and the log-prob
//! pass 1.11 → 0.69 GB, at the same CPU time within noise.
//!
//! The `n` responses of one prompt share its images: the vision tower runs once per distinct
//! image of the batch and its embeddings are gathered per row ([`input_embeddings_shared`]).
//!
//! Differentiable when the model's backend is (update nodes); the `logprob` node passes the
//! non-autodiff model.

use std::collections::HashMap;

use anyhow::{Result, ensure};
use burn::prelude::*;
use flowrl_models::{Model, PaddedBatch, ProcessedImage, scatter_image_embeddings};

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
    /// Per entry of `images`, the index of its first occurrence in `images` (rows answering the
    /// same prompt carry the same images).
    image_first: Vec<usize>,
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
        let embeds =
            input_embeddings_shared(model, &self.tokens, &self.images, &self.image_first, device)?;
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

/// Input embeddings `[b, len, hidden]` of `tokens` with the image embeddings scattered into the
/// image-token positions, as `Model::input_embeddings` computes them, except that the vision
/// tower runs once per distinct image: `first[i]` is the index in `images` of the first image
/// equal to image i (`first[i] = i` for a first occurrence). The embeddings of the distinct images
/// are gathered (`select`) into row order, so a repeated image gets the same values, and in the
/// backward its rows' gradients are summed before the tower's backward (the same sum the tower's
/// weight gradients take over copies, up to float rounding order).
///
/// Why: a GRPO batch holds `n` responses per prompt; running the tower on each copy multiplies
/// its cost (about a fifth of the forward of the benchmark model) by `n`.
pub fn input_embeddings_shared<B: Backend>(
    model: &Model<B>,
    tokens: &PaddedBatch,
    images: &[ProcessedImage],
    first: &[usize],
    device: &B::Device,
) -> Result<Tensor<B, 3>> {
    ensure!(
        first.len() == images.len(),
        "{} first-occurrence indices for {} images",
        first.len(),
        images.len()
    );
    ensure!(
        first
            .iter()
            .enumerate()
            .all(|(i, &f)| f <= i && first[f] == f),
        "first-occurrence indices {first:?} do not point at first occurrences"
    );
    let vision = match model.vision() {
        Some(v) if first.iter().enumerate().any(|(i, &f)| f != i) => v,
        _ => return model.input_embeddings(tokens, images, device),
    };
    tokens.validate()?;
    let mut offset = vec![0usize; images.len()];
    let mut distinct = Vec::new();
    let mut next = 0;
    for (i, image) in images.iter().enumerate() {
        if first[i] == i {
            offset[i] = next;
            next += image.num_tokens;
            distinct.push(image.clone());
        }
    }
    let distinct_embeds = vision.embed_images(&distinct, device)?;
    let rows: Vec<i64> = images
        .iter()
        .enumerate()
        .flat_map(|(i, image)| {
            let o = offset[first[i]];
            (o..o + image.num_tokens).map(|r| r as i64)
        })
        .collect();
    let n = rows.len();
    let index = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [n]), device);
    let image_embeds = distinct_embeds.select(0, index);
    let text = model
        .causal_lm()
        .embed_tokens(tokens.ids_tensor::<B>(device));
    scatter_image_embeddings(text, &tokens.ids, vision.image_token_id(), image_embeds)
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};

    type Ad = Autodiff<Flex>;

    fn tiny() -> Model<Ad> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/tiny-qwen2-vl");
        Model::load(&dir, &Default::default()).unwrap()
    }

    /// A 56×56 image (4×4 patches, 4 image tokens) with pixel values from `seed`.
    fn image(seed: usize) -> ProcessedImage {
        let dim = 3 * 2 * 14 * 14;
        ProcessedImage {
            pixel_values: (0..16 * dim)
                .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0 - 1.0)
                .collect(),
            shape: vec![16, dim],
            grid: vec![1, 4, 4],
            num_tokens: 4,
            patch_positions: None,
        }
    }

    /// Rows answering prompts A, B, A (images A, B, A): rows 0 and 2 share their image.
    fn batch(image_token: u32) -> (PaddedBatch, Vec<ProcessedImage>) {
        let rows: Vec<Vec<u32>> = [3u32, 5, 3]
            .iter()
            .map(|&t| {
                let mut row = vec![t, t + 1];
                row.extend([image_token; 4]);
                row.extend([t + 2, t + 3, t + 4]);
                row
            })
            .collect();
        let images = vec![image(0), image(1), image(0)];
        (PaddedBatch::left_pad(&rows, 0), images)
    }

    fn values<const D: usize>(t: Tensor<Flex, D>) -> Vec<f32> {
        t.into_data().into_vec::<f32>().unwrap()
    }

    fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn shared_images_give_the_embeddings_and_vision_gradients_of_one_tower_run_per_row() {
        let model = tiny();
        let device = Default::default();
        let image_token = model.vision().unwrap().image_token_id();
        let (tokens, images) = batch(image_token);
        let shared =
            input_embeddings_shared(&model, &tokens, &images, &[0, 1, 0], &device).unwrap();
        let every = model.input_embeddings(&tokens, &images, &device).unwrap();
        let dims = every.dims();
        assert_eq!(shared.dims(), dims);
        // A fixed, position-dependent weighting so every embedding row gets its own gradient.
        let n: usize = dims.iter().product();
        let w = Tensor::<Ad, 1>::from_data(
            TensorData::new((0..n).map(|i| ((i % 13) as f32 - 6.0) / 7.0).collect(), [n]),
            &device,
        )
        .reshape(dims);
        let (sv, ev) = (
            values(shared.clone().inner()),
            values(every.clone().inner()),
        );
        let d = max_abs_diff(&sv, &ev);
        assert!(d <= 1e-6, "embeddings differ by {d}");
        let Model::QwenVl(m) = &model else {
            panic!("tiny-qwen2-vl is a Qwen2-VL model")
        };
        let embed = m.text.embed_tokens.val();
        let vision_w = m.visual.patch_embed.val();
        let g_shared = (shared * w.clone()).sum().backward();
        let g_every = (every * w).sum().backward();
        for (name, a, b) in [
            (
                "visual.patch_embed",
                values(vision_w.grad(&g_shared).unwrap()),
                values(vision_w.grad(&g_every).unwrap()),
            ),
            (
                "model.embed_tokens",
                values(embed.grad(&g_shared).unwrap()),
                values(embed.grad(&g_every).unwrap()),
            ),
        ] {
            let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let d = max_abs_diff(&a, &b);
            assert!(scale > 0.0, "{name}: zero gradient");
            assert!(
                d <= 1e-5 * scale,
                "{name}: gradients differ by {d} (scale {scale})"
            );
        }
    }

    #[test]
    fn first_occurrence_indices_must_point_backwards_at_first_occurrences() {
        let model = tiny();
        let device = Default::default();
        let (tokens, images) = batch(model.vision().unwrap().image_token_id());
        for bad in [vec![0, 1], vec![0, 2, 0], vec![0, 0, 1]] {
            let e = input_embeddings_shared(&model, &tokens, &images, &bad, &device).unwrap_err();
            assert!(e.to_string().contains("first-occurrence indices"), "{e}");
        }
    }
}
