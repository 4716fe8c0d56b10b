//! Batched autoregressive generation with a KV cache, over the model capabilities.
//!
//! One call generates a response for every prompt of a batch:
//! 1. **prefill**: the distinct prompts are left-padded into one `[U, L]` batch (a prompt asked
//!    n times, as in GRPO, is prefilled once and its cache rows and logits repeated for its n
//!    rows); image embeddings (vision capability) replace the image-token embeddings; position
//!    ids come from the model's multimodal-position capability when it has one, else plain 1-D
//!    positions from the mask; one forward pass fills the KV cache and gives the logits of the
//!    last prompt position;
//! 2. **decode**: one token per step for the rows still running: its embedding, its position
//!    (`real tokens so far + rope delta` on every stream), the mask grown by one, its keys and
//!    values written into the cache (reserved after the prefill at its final length, so no step
//!    copies it); the prompt is never recomputed. Finished rows are dropped from the cache and
//!    from the batch (their RNGs are not drawn from again, the other rows' streams are
//!    unchanged).
//!
//! A row finishes at an EOS token of the model, at one of the extra stop tokens, or after
//! `max_new_tokens`; the stop token is kept in the response (verl keeps the EOS in the response
//! and its mask). Tokens are chosen by [`crate::sampling::sample`], which also gives their
//! log-probs.
//!
//! Gradients: generation must run on a backend without autodiff (pass the inner model, e.g.
//! `AutodiffModule::valid()`); nothing here builds a graph. Determinism: every row draws from its
//! own RNG (one uniform per sampled token), so a row's response depends on its RNG and its prompt
//! only, not on which other rows share the batch: a batch split over data-parallel replicas
//! samples what the whole batch would (up to float rounding of the batched forward passes).
//!
//! The caller asks for capabilities ([`ModelParts`]); no family name appears here.

use anyhow::{Result, ensure};
use burn::prelude::*;
use rand::Rng;
use rayon::prelude::*;

use crate::capabilities::{
    CausalLm, KvCache, MultimodalPositions, PaddedBatch, PositionIds, ProcessedImage, Vision,
    embed_inputs, plain_positions,
};
use crate::sampling::{SamplingConfig, sample};

/// The capabilities generation uses, borrowed from a loaded model.
pub struct ModelParts<'a, B: Backend> {
    /// Token ids → logits (required).
    pub lm: &'a dyn CausalLm<B>,
    /// Images → embeddings; `None` for text-only models (prompts must then hold no images).
    pub vision: Option<&'a dyn Vision<B>>,
    /// Multimodal RoPE positions; `None` → plain 1-D positions from the attention mask.
    pub positions: Option<&'a dyn MultimodalPositions>,
}

impl<'a, B: Backend> ModelParts<'a, B> {
    /// The capabilities of a loaded model.
    pub fn of(model: &'a crate::Model<B>) -> Self {
        Self {
            lm: model.causal_lm(),
            vision: model.vision(),
            positions: model.multimodal_positions(),
        }
    }
}

/// How long to generate and how to choose tokens.
#[derive(Debug, Clone)]
pub struct GenerationConfig {
    /// Maximum response length, stop token included.
    pub max_new_tokens: usize,
    /// Token selection.
    pub sampling: SamplingConfig,
    /// Extra token ids that end a response, besides the model's EOS ids.
    pub stop_token_ids: Vec<u32>,
    /// Id used for left padding of the prompts (masked out; any valid id works).
    pub pad_token_id: u32,
    /// Token ids that are never generated (their logits are set to −∞ before sampling), e.g. the
    /// image token, which a response must not contain.
    pub suppress_token_ids: Vec<u32>,
}

/// One prompt: its token ids (image placeholders already expanded) and its processed images, in
/// the order their image tokens appear.
#[derive(Debug, Clone, Copy)]
pub struct PromptInput<'a> {
    pub ids: &'a [u32],
    pub images: &'a [ProcessedImage],
}

/// The generated responses, one per prompt, in input order.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Response token ids (stop token included when one was produced).
    pub tokens: Vec<Vec<u32>>,
    /// Per response token: its log-prob (see [`crate::sampling`]).
    pub log_probs: Vec<Vec<f32>>,
    /// True when the row ended on EOS / a stop token, false when cut at `max_new_tokens`.
    pub stopped: Vec<bool>,
}

/// Generates one response per prompt. See the module doc.
///
/// `rngs` holds one RNG per prompt.
pub fn generate<B: Backend, R: Rng + Send>(
    model: &ModelParts<'_, B>,
    prompts: &[PromptInput<'_>],
    config: &GenerationConfig,
    rngs: &mut [R],
    device: &B::Device,
) -> Result<Generation> {
    config.sampling.validate()?;
    let batch = prompts.len();
    ensure!(
        rngs.len() == batch,
        "generate: {} RNGs for {batch} prompts (one per prompt)",
        rngs.len()
    );
    let mut out = Generation {
        tokens: vec![Vec::new(); batch],
        log_probs: vec![Vec::new(); batch],
        stopped: vec![false; batch],
    };
    if batch == 0 || config.max_new_tokens == 0 {
        return Ok(out);
    }
    let lm = model.lm;
    // Identical prompts (a GRPO batch asks each prompt n times) are prefilled once: `source[b]` is
    // row b's prompt among `unique`; after the prefill the cache rows and last logits are repeated.
    let (unique, source) = distinct_prompts(prompts);
    let rows: Vec<Vec<u32>> = unique.iter().map(|p| p.ids.to_vec()).collect();
    ensure!(
        rows.iter().all(|r| !r.is_empty()),
        "cannot generate from an empty prompt"
    );
    let padded = PaddedBatch::left_pad(&rows, config.pad_token_id);
    let longest = padded.len;
    ensure!(
        longest + config.max_new_tokens <= lm.context_length(),
        "prompt length {longest} + max_new_tokens {} = {} exceeds the model context of {} tokens",
        config.max_new_tokens,
        longest + config.max_new_tokens,
        lm.context_length()
    );
    let images: Vec<ProcessedImage> = unique
        .iter()
        .flat_map(|p| p.images.iter().cloned())
        .collect();
    let positions: PositionIds = match model.positions {
        Some(mm) => mm.position_ids(&padded, &images)?,
        None => plain_positions(&padded),
    };

    // Prefill.
    let prompt_ids = padded.ids_tensor::<B>(device);
    // Text-only prompts leave the vision tower out (it cannot run on zero images).
    let embeds = embed_inputs(lm, model.vision, &padded, &images, None, device)?;
    let mut cache: KvCache<B> = lm.new_cache();
    let hidden = lm.forward_hidden(
        prompt_ids,
        embeds,
        positions.tensor::<B>(device),
        padded.mask_tensor::<B>(device),
        Some(&mut cache),
    );
    let [distinct, len, hidden_size] = hidden.dims();
    let last = hidden.slice([0..distinct, len - 1..len, 0..hidden_size]);
    let prompt_logits = host_rows(lm.lm_head(last))?;
    if distinct < batch {
        cache.select_rows(&source);
    }
    // The cache at its final length (the prompt + every fed token; the last one sampled is
    // never fed), allocated once: each decoding step writes its keys and values in place
    // instead of growing the cache with a `cat` per layer.
    let capacity = longest + config.max_new_tokens - 1;
    for slot in &mut cache.layers {
        crate::layers::reserve_kv(slot, capacity);
    }
    let mut logits: Vec<Vec<f32>> = source.iter().map(|&u| prompt_logits[u].clone()).collect();

    // Per row (original index): attention mask over every cached key, real token count, rope delta.
    let mut masks: Vec<Vec<u32>> = source
        .iter()
        .map(|&u| padded.mask_row(u).to_vec())
        .collect();
    let prompt_real = padded.real_lengths();
    let mut real: Vec<usize> = source.iter().map(|&u| prompt_real[u]).collect();
    let rope_deltas: Vec<i64> = source.iter().map(|&u| positions.rope_deltas[u]).collect();
    let mut active: Vec<usize> = (0..batch).collect();
    let stops: Vec<u32> = lm
        .eos_token_ids()
        .into_iter()
        .chain(config.stop_token_ids.iter().copied())
        .collect();

    for step in 0..config.max_new_tokens {
        // Choose a token for every running row (rows in parallel: each has its own RNG).
        let mut row_rngs = rngs_of(rngs, &active);
        let chosen = logits
            .par_iter_mut()
            .zip(row_rngs.par_iter_mut())
            .map(|(row_logits, rng)| {
                for &t in &config.suppress_token_ids {
                    if let Some(x) = row_logits.get_mut(t as usize) {
                        *x = f32::NEG_INFINITY;
                    }
                }
                sample(row_logits, &config.sampling, &mut **rng)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut next = Vec::with_capacity(active.len());
        for (s, &row) in chosen.iter().zip(&active) {
            out.tokens[row].push(s.token);
            out.log_probs[row].push(s.log_prob);
            if stops.contains(&s.token) {
                out.stopped[row] = true;
            }
            next.push(s.token);
        }
        if step + 1 == config.max_new_tokens {
            break;
        }
        // Drop the rows that just finished.
        let keep: Vec<usize> = (0..active.len())
            .filter(|&slot| !out.stopped[active[slot]])
            .collect();
        if keep.is_empty() {
            break;
        }
        if keep.len() < active.len() {
            cache.select_rows(&keep);
            next = keep.iter().map(|&s| next[s]).collect();
            active = keep.iter().map(|&s| active[s]).collect();
        }

        // One decoding step for the running rows.
        let n = active.len();
        let step_positions: Vec<i64> = (0..positions.streams)
            .flat_map(|_| {
                active
                    .iter()
                    .map(|&row| real[row] as i64 + rope_deltas[row])
            })
            .collect();
        let step_positions = Tensor::<B, 1, Int>::from_data(
            TensorData::new(step_positions, [positions.streams * n]),
            device,
        )
        .reshape([positions.streams, n, 1]);
        let mut step_mask = Vec::with_capacity(n * (masks[active[0]].len() + 1));
        for &row in &active {
            masks[row].push(1);
            real[row] += 1;
            step_mask.extend(masks[row].iter().map(|&m| m as i64));
        }
        let keys = masks[active[0]].len();
        let step_mask =
            Tensor::<B, 1, Int>::from_data(TensorData::new(step_mask, [n * keys]), device)
                .reshape([n, keys]);
        let ids = Tensor::<B, 1, Int>::from_data(
            TensorData::new(next.iter().map(|&t| t as i64).collect(), [n]),
            device,
        )
        .reshape([n, 1]);
        let hidden = lm.forward_hidden(
            ids.clone(),
            lm.embed_tokens(ids),
            step_positions,
            step_mask,
            Some(&mut cache),
        );
        logits = host_rows(lm.lm_head(hidden))?;
    }
    Ok(out)
}

/// The distinct prompts (same ids and images) in first-seen order, and per prompt the index of
/// its copy among them.
fn distinct_prompts<'p, 'a>(
    prompts: &'p [PromptInput<'a>],
) -> (Vec<&'p PromptInput<'a>>, Vec<usize>) {
    let mut unique: Vec<&PromptInput<'a>> = Vec::new();
    let source = prompts
        .iter()
        .map(|p| {
            let same = |u: &&PromptInput<'a>| {
                u.ids == p.ids && (std::ptr::eq(u.images, p.images) || u.images == p.images)
            };
            unique.iter().position(same).unwrap_or_else(|| {
                unique.push(p);
                unique.len() - 1
            })
        })
        .collect();
    (unique, source)
}

/// The RNGs of the `active` rows (ascending row indices), in that order.
fn rngs_of<'a, R>(rngs: &'a mut [R], active: &[usize]) -> Vec<&'a mut R> {
    rngs.iter_mut()
        .enumerate()
        .filter(|(row, _)| active.binary_search(row).is_ok())
        .map(|(_, rng)| rng)
        .collect()
}

/// `[rows, 1, vocab]` logits → one host `Vec<f32>` per row.
fn host_rows<B: Backend>(logits: Tensor<B, 3>) -> Result<Vec<Vec<f32>>> {
    let [rows, _, vocab] = logits.dims();
    let data = logits
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("reading logits: {e:?}"))?;
    Ok(data.chunks(vocab).take(rows).map(<[f32]>::to_vec).collect())
}
