//! Batched autoregressive generation with a KV cache, over the model capabilities.
//!
//! One call generates a response for every prompt of a batch, in **chunks of rows** whose KV
//! cache fits [`GenerationConfig::cache_budget`] (all rows at once without one). Per chunk:
//! 1. **prefill**: the chunk's distinct prompts (a prompt asked n times, as in GRPO, is
//!    prefilled once and its cache rows and logits repeated for its n rows), in micro-batches of
//!    at most [`GenerationConfig::prefill_tokens`] padded tokens, every prompt left-padded to the
//!    longest prompt of the whole call (so chunks and micro-batches lay out their caches
//!    alike); image embeddings (vision capability) replace the image-token embeddings; position
//!    ids come from the model's multimodal-position capability when it has one, else plain 1-D
//!    positions from the mask; each forward fills its rows of the KV cache and gives the logits
//!    of the last prompt position;
//! 2. **decode**: the cache is reserved at its final length (`longest prompt + max_new_tokens −
//!    1` positions), so each step writes its keys and values in place; one token per step for
//!    every row of the batch: its position (`real tokens so far + rope delta` on every stream),
//!    the attention mask (kept on the device, `[rows, reserved length]`, sliced to the keys so
//!    far), its embedding; the prompt is never recomputed. A finished row stays in the batch,
//!    masked out of the results, until at most half the rows are alive: then the cache, the mask
//!    and the rows' state are compacted to the live rows (one gather per half of the rows, not
//!    one per finishing row).
//!
//! A row finishes at an EOS token of the model, at one of the extra stop tokens, or after
//! `max_new_tokens`; the stop token is kept in the response (verl keeps the EOS in the response
//! and its mask). Tokens are chosen with the rule of [`crate::sampling`], on the device where the
//! backend has the kernel ([`crate::kernels::sampling`]: one `[rows, 3]` read per step), else on
//! the host from the step's logits (the CPU).
//!
//! Gradients: generation must run on a backend without autodiff (pass the inner model, e.g.
//! `AutodiffModule::valid()`); nothing here builds a graph. Determinism: row r's token at
//! response position t draws the counter-based uniform `uniform(seeds[r], t)`, so a row's response
//! depends on its seed and its prompt only, not on which other rows share its batch or chunk:
//! a batch split over chunks or data-parallel replicas samples what the whole batch would (up
//! to float rounding of the batched forward passes).
//!
//! The caller asks for capabilities ([`ModelParts`]); no family name appears here.

use anyhow::{Result, ensure};
use burn::prelude::*;
use rayon::prelude::*;

use crate::capabilities::{
    CausalLm, KvCache, MultimodalPositions, PaddedBatch, PositionIds, ProcessedImage, Vision,
    embed_inputs, plain_positions,
};
use crate::sampling::{SamplingConfig, device_error, sample, uniform};

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

/// How long to generate, how to choose tokens, and how much device memory to use.
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
    /// Bytes the KV cache of the rows decoded together may take: the rows are generated in
    /// chunks of at most `budget / bytes per row` ([`cache_bytes_per_row`]). `None`: all rows
    /// at once.
    pub cache_budget: Option<u64>,
    /// Padded prompt tokens one prefill forward takes at most (at least one prompt per
    /// forward). `None`: the chunk's distinct prompts in one forward.
    pub prefill_tokens: Option<usize>,
}

impl GenerationConfig {
    /// `max_new_tokens` with `sampling`, no extra stop or suppressed tokens, pad id 0, no
    /// memory budgets.
    pub fn new(max_new_tokens: usize, sampling: SamplingConfig) -> Self {
        Self {
            max_new_tokens,
            sampling,
            stop_token_ids: Vec::new(),
            pad_token_id: 0,
            suppress_token_ids: Vec::new(),
            cache_budget: None,
            prefill_tokens: None,
        }
    }
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

impl Generation {
    fn empty(rows: usize) -> Self {
        Self {
            tokens: vec![Vec::new(); rows],
            log_probs: vec![Vec::new(); rows],
            stopped: vec![false; rows],
        }
    }
}

/// The values of a float tensor on the host.
fn read_floats<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("reading {D}-d floats: {e:?}"))
}

/// Positions a row's KV cache reserves: `prompt_len + max_new_tokens − 1` (the last token
/// sampled is never fed).
pub fn reserved_positions(prompt_len: usize, max_new_tokens: usize) -> usize {
    prompt_len + max_new_tokens.saturating_sub(1)
}

/// KV-cache bytes one row of `prompt_len + max_new_tokens` tokens holds once reserved:
/// [`CausalLm::kv_cache_bytes_per_token`] × [`reserved_positions`].
pub fn cache_bytes_per_row<B: Backend>(
    lm: &dyn CausalLm<B>,
    prompt_len: usize,
    max_new_tokens: usize,
) -> u64 {
    lm.kv_cache_bytes_per_token() as u64 * reserved_positions(prompt_len, max_new_tokens) as u64
}

/// Rows decoded together under a KV-cache budget: as many rows of `row_bytes` as `budget`
/// holds, at least one (the caller refuses a row larger than the budget).
pub fn rows_per_budget(row_bytes: u64, budget: u64) -> usize {
    ((budget / row_bytes.max(1)) as usize).max(1)
}

/// Distinct prompts one prefill forward takes: as many prompts padded to `longest` as
/// `prefill_tokens` holds, at least one; all of them without a limit.
pub fn prompts_per_prefill(prefill_tokens: Option<usize>, longest: usize, prompts: usize) -> usize {
    prefill_tokens.map_or(prompts, |tokens| (tokens / longest.max(1)).max(1))
}

/// Generates one response per prompt. See the module doc.
///
/// `seeds` holds one seed per prompt (the row's draws: [`crate::sampling::uniform`]).
pub fn generate<B: Backend>(
    model: &ModelParts<'_, B>,
    prompts: &[PromptInput<'_>],
    config: &GenerationConfig,
    seeds: &[u64],
    device: &B::Device,
) -> Result<Generation> {
    config.sampling.validate()?;
    let batch = prompts.len();
    ensure!(
        seeds.len() == batch,
        "generate: {} seeds for {batch} prompts (one per prompt)",
        seeds.len()
    );
    let mut out = Generation::empty(batch);
    if batch == 0 || config.max_new_tokens == 0 {
        return Ok(out);
    }
    ensure!(
        prompts.iter().all(|p| !p.ids.is_empty()),
        "cannot generate from an empty prompt"
    );
    let lm = model.lm;
    let longest = prompts.iter().map(|p| p.ids.len()).max().unwrap_or(0);
    ensure!(
        longest + config.max_new_tokens <= lm.context_length(),
        "prompt length {longest} + max_new_tokens {} = {} exceeds the model context of {} tokens",
        config.max_new_tokens,
        longest + config.max_new_tokens,
        lm.context_length()
    );
    let chunk = rows_per_chunk(lm, longest, config)?.min(batch);
    for start in (0..batch).step_by(chunk) {
        let end = (start + chunk).min(batch);
        let part = generate_chunk(
            model,
            &prompts[start..end],
            &seeds[start..end],
            longest,
            config,
            device,
        )?;
        out.tokens[start..end].clone_from_slice(&part.tokens);
        out.log_probs[start..end].clone_from_slice(&part.log_probs);
        out.stopped[start..end].copy_from_slice(&part.stopped);
    }
    Ok(out)
}

/// Rows whose reserved KV cache fits the budget (all of them without one); an error when not
/// even one row does.
fn rows_per_chunk<B: Backend>(
    lm: &dyn CausalLm<B>,
    longest: usize,
    config: &GenerationConfig,
) -> Result<usize> {
    let Some(budget) = config.cache_budget else {
        return Ok(usize::MAX);
    };
    let row = cache_bytes_per_row(lm, longest, config.max_new_tokens);
    ensure!(
        row <= budget,
        "the KV cache budget of {} cannot hold one row: a row of {} tokens (the longest prompt \
         {longest} + max_new_tokens {} − 1) needs {} ({} per token); raise the budget or lower \
         max_new_tokens or the prompt length",
        gib(budget),
        longest + config.max_new_tokens - 1,
        config.max_new_tokens,
        gib(row),
        lm.kv_cache_bytes_per_token()
    );
    Ok(rows_per_budget(row, budget))
}

/// Bytes in GiB, for messages.
fn gib(bytes: u64) -> String {
    format!("{:.3} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// What the prefill of a chunk leaves for its decoding: the cache (one row per distinct
/// prompt), the last prompt position's logits `[distinct, vocab]`, per distinct prompt its
/// attention mask row (padded to `longest`), its real length and its rope delta.
struct Prefilled<B: Backend> {
    cache: KvCache<B>,
    logits: Tensor<B, 2>,
    masks: Vec<Vec<u32>>,
    real: Vec<usize>,
    rope_deltas: Vec<i64>,
    streams: usize,
}

/// Prefills the distinct prompts `unique` in micro-batches of at most
/// `config.prefill_tokens` padded tokens, each prompt left-padded to `longest`.
fn prefill<B: Backend>(
    model: &ModelParts<'_, B>,
    unique: &[&PromptInput<'_>],
    longest: usize,
    config: &GenerationConfig,
    device: &B::Device,
) -> Result<Prefilled<B>> {
    let lm = model.lm;
    let per_forward = prompts_per_prefill(config.prefill_tokens, longest, unique.len());
    let mut caches = Vec::new();
    let mut logits = Vec::new();
    let mut masks = Vec::with_capacity(unique.len());
    let mut real = Vec::with_capacity(unique.len());
    let mut rope_deltas = Vec::with_capacity(unique.len());
    let mut streams = 1;
    for group in unique.chunks(per_forward) {
        let rows: Vec<Vec<u32>> = group.iter().map(|p| p.ids.to_vec()).collect();
        let padded = PaddedBatch::left_pad_to(&rows, config.pad_token_id, longest);
        let images: Vec<ProcessedImage> = group
            .iter()
            .flat_map(|p| p.images.iter().cloned())
            .collect();
        let positions: PositionIds = match model.positions {
            Some(mm) => mm.position_ids(&padded, &images)?,
            None => plain_positions(&padded),
        };
        streams = positions.streams;
        // Text-only prompts leave the vision tower out (it cannot run on zero images).
        let embeds = embed_inputs(lm, model.vision, &padded, &images, None, device)?;
        let mut cache = lm.new_cache();
        let hidden = lm.forward_hidden(
            padded.ids_tensor::<B>(device),
            embeds,
            positions.tensor::<B>(device),
            padded.mask_tensor::<B>(device),
            Some(&mut cache),
        );
        let [n, len, hidden_size] = hidden.dims();
        let last = hidden.slice([0..n, len - 1..len, 0..hidden_size]);
        let vocab = lm.vocab_size();
        logits.push(lm.lm_head(last).reshape([n, vocab]));
        caches.push(cache);
        for b in 0..n {
            masks.push(padded.mask_row(b).to_vec());
        }
        real.extend(padded.real_lengths());
        rope_deltas.extend(positions.rope_deltas.iter().copied());
    }
    Ok(Prefilled {
        cache: KvCache::concat(caches),
        logits: Tensor::cat(logits, 0),
        masks,
        real,
        rope_deltas,
        streams,
    })
}

/// Generates the rows of one chunk (see the module doc).
fn generate_chunk<B: Backend>(
    model: &ModelParts<'_, B>,
    prompts: &[PromptInput<'_>],
    seeds: &[u64],
    longest: usize,
    config: &GenerationConfig,
    device: &B::Device,
) -> Result<Generation> {
    let lm = model.lm;
    let rows = prompts.len();
    let max_new = config.max_new_tokens;
    let mut out = Generation::empty(rows);
    let (unique, source) = distinct_prompts(prompts);
    let Prefilled {
        mut cache,
        mut logits,
        masks,
        real,
        rope_deltas,
        streams,
    } = prefill(model, &unique, longest, config, device)?;
    if unique.len() < rows {
        cache.select_rows(&source);
        logits = logits.select(0, index_tensor::<B>(&source, device));
    }
    // The cache at its final length (the prompt + every fed token; the last one sampled is
    // never fed), allocated once: each decoding step writes its keys and values in place
    // instead of growing the cache with a `cat` per layer.
    let capacity = longest + max_new - 1;
    for slot in &mut cache.layers {
        crate::layers::reserve_kv(slot, capacity);
    }

    // Per batch slot (compacted with the cache): its row, its mask over every reserved key (the
    // prompt's, then 1 for each fed token), its seed and first decoding position.
    let mut slot_rows: Vec<usize> = (0..rows).collect();
    let mut mask = {
        let mut values = Vec::with_capacity(rows * capacity);
        for &u in &source {
            values.extend(masks[u].iter().map(|&m| m as i64));
            values.extend(std::iter::repeat_n(1i64, capacity - longest));
        }
        Tensor::<B, 1, Int>::from_data(TensorData::new(values, [rows * capacity]), device)
            .reshape([rows, capacity])
    };
    let mut seed_parts = seed_tensor::<B>(seeds, device);
    let first_position: Vec<i64> = source
        .iter()
        .map(|&u| real[u] as i64 + rope_deltas[u])
        .collect();
    // Never empty (a kernel argument): the kernel reads the first `suppress_token_ids.len()`.
    let suppress = {
        let mut ids: Vec<i64> = config
            .suppress_token_ids
            .iter()
            .map(|&t| t as i64)
            .collect();
        if ids.is_empty() {
            ids.push(-1);
        }
        Tensor::<B, 1, Int>::from_data(TensorData::new(ids.clone(), [ids.len()]), device)
    };
    let stops: Vec<u32> = lm
        .eos_token_ids()
        .into_iter()
        .chain(config.stop_token_ids.iter().copied())
        .collect();
    let mut alive = vec![true; rows];

    for step in 0..max_new {
        let n = slot_rows.len();
        let (picked, next) = choose_tokens(
            &logits,
            &slot_rows,
            &alive,
            seeds,
            step,
            &seed_parts,
            &suppress,
            config,
            device,
        )?;
        for (slot, &(token, log_prob)) in picked.iter().enumerate() {
            if !alive[slot] {
                continue;
            }
            let row = slot_rows[slot];
            out.tokens[row].push(token);
            out.log_probs[row].push(log_prob);
            if stops.contains(&token) {
                out.stopped[row] = true;
                alive[slot] = false;
            }
        }
        if step + 1 == max_new {
            break;
        }
        let live = alive.iter().filter(|&&a| a).count();
        if live == 0 {
            break;
        }
        let mut ids = next;
        if 2 * live <= n && live < n {
            // At most half the rows are alive: keep only them.
            let keep: Vec<usize> = (0..n).filter(|&s| alive[s]).collect();
            let index = index_tensor::<B>(&keep, device);
            cache.select_rows(&keep);
            mask = mask.select(0, index.clone());
            seed_parts = seed_parts.select(0, index.clone());
            ids = ids.select(0, index);
            slot_rows = keep.iter().map(|&s| slot_rows[s]).collect();
            alive = vec![true; keep.len()];
        }

        // One decoding step for every slot: token `step` sits at cache position longest + step.
        let n = slot_rows.len();
        let keys = longest + step + 1;
        let step_positions: Vec<i64> = (0..streams)
            .flat_map(|_| {
                slot_rows
                    .iter()
                    .map(|&row| first_position[row] + step as i64)
            })
            .collect();
        let step_positions =
            Tensor::<B, 1, Int>::from_data(TensorData::new(step_positions, [streams * n]), device)
                .reshape([streams, n, 1]);
        let step_mask = mask.clone().slice([0..n, 0..keys]);
        let ids = ids.reshape([n, 1]);
        let hidden = lm.forward_hidden(
            ids.clone(),
            lm.embed_tokens(ids),
            step_positions,
            step_mask,
            Some(&mut cache),
        );
        logits = lm.lm_head(hidden).reshape([n, lm.vocab_size()]);
    }
    Ok(out)
}

/// The (token, log-prob) of every slot, and the tokens as the next step's input `[slots]`.
type Chosen<B> = (Vec<(u32, f32)>, Tensor<B, 1, Int>);

/// The token and log-prob of every slot at response position `step`, and the tokens as the next
/// step's input `[slots]`: on the device when the backend has the sampling kernel (one read of
/// `[slots, 3]`), else on the host from the logits (finished slots are not sampled there).
#[allow(clippy::too_many_arguments)]
fn choose_tokens<B: Backend>(
    logits: &Tensor<B, 2>,
    slot_rows: &[usize],
    alive: &[bool],
    seeds: &[u64],
    step: usize,
    seed_parts: &Tensor<B, 2, Int>,
    suppress: &Tensor<B, 1, Int>,
    config: &GenerationConfig,
    device: &B::Device,
) -> Result<Chosen<B>> {
    if let Some(sampled) = crate::kernels::sampling::sample_on_device(
        logits,
        seed_parts,
        step,
        &config.sampling,
        suppress,
        config.suppress_token_ids.len(),
    ) {
        let values = read_floats(sampled.picked)?;
        let picked = values
            .chunks(3)
            .map(|row| Ok((device_error(row[0])?, row[1])))
            .collect::<Result<Vec<_>>>()?;
        return Ok((picked, sampled.ids));
    }
    let [n, vocab] = logits.dims();
    let values = read_floats(logits.clone())?;
    let picked = values
        .par_chunks(vocab)
        .zip(slot_rows.par_iter().zip(alive.par_iter()))
        .map(|(row_logits, (&row, &live))| {
            if !live {
                return Ok((0, 0.0));
            }
            let mut row_logits = row_logits.to_vec();
            for &t in &config.suppress_token_ids {
                if let Some(x) = row_logits.get_mut(t as usize) {
                    *x = f32::NEG_INFINITY;
                }
            }
            let s = sample(&row_logits, &config.sampling, uniform(seeds[row], step))?;
            Ok((s.token, s.log_prob))
        })
        .collect::<Result<Vec<_>>>()?;
    let ids: Vec<i64> = picked.iter().map(|&(t, _)| t as i64).collect();
    let next = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), device);
    Ok((picked, next))
}

/// Each seed as four 16-bit parts `[rows, 4]` (low first): exact in any int dtype.
fn seed_tensor<B: Backend>(seeds: &[u64], device: &B::Device) -> Tensor<B, 2, Int> {
    let parts: Vec<i64> = seeds
        .iter()
        .flat_map(|&s| (0..4).map(move |k| ((s >> (16 * k)) & 0xffff) as i64))
        .collect();
    Tensor::<B, 1, Int>::from_data(TensorData::new(parts, [seeds.len() * 4]), device)
        .reshape([seeds.len(), 4])
}

fn index_tensor<B: Backend>(idx: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    Tensor::from_data(
        TensorData::new(idx.iter().map(|&i| i as i64).collect(), [idx.len()]),
        device,
    )
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
