//! `generate` against a reference decode loop written here with the public capabilities: the
//! reference grows the KV cache by a `cat` per step (the cache of plain `forward_hidden` calls)
//! and uploads each step's mask, where `generate` reserves the cache at its final length after
//! the prefill, writes each step in place and slices a mask kept on the device; finished rows
//! leave the reference's batch as `generate`'s do (once at most half the rows are alive), at
//! once, or never (finished rows are fed their last token, their outputs ignored). Greedy and
//! seeded sampling, on batches where rows stop at different steps, for the Qwen decoders
//! (`layers::Attention`) and Gemma 4 (its own attention, sliding windows and KV-shared layers):
//! the same tokens and stop flags, and the same log-probs bit for bit against the reference
//! with `generate`'s compaction, within 1e-6 relative against the others (their forward passes
//! run on other rows, so their rounding may differ).

mod common;

use anyhow::Result;
use burn::backend::Flex;
use burn::prelude::*;
use common::model_cases;
use flowrl_models::generate::{Generation, GenerationConfig, ModelParts, PromptInput, generate};
use flowrl_models::sampling::{SamplingConfig, sample, uniform};
use flowrl_models::{KvCache, Model, PaddedBatch, embed_inputs, plain_positions};

type B = Flex;

/// When finished rows leave the reference's batch.
#[derive(Clone, Copy, PartialEq)]
enum Compaction {
    /// Once at most half the rows are alive (what `generate` does).
    AtHalf,
    /// As soon as a row finishes.
    AtOnce,
    /// Never.
    Never,
}

/// The reference loop (see the module doc).
fn reference(
    parts: &ModelParts<'_, B>,
    prompts: &[PromptInput<'_>],
    config: &GenerationConfig,
    seeds: &[u64],
    compaction: Compaction,
) -> Result<Generation> {
    let device = Default::default();
    let lm = parts.lm;
    let batch = prompts.len();
    let mut out = Generation {
        tokens: vec![Vec::new(); batch],
        log_probs: vec![Vec::new(); batch],
        stopped: vec![false; batch],
    };
    // Distinct prompts prefilled once, as `generate` does (same prefill batch).
    let mut unique: Vec<&PromptInput<'_>> = Vec::new();
    let source: Vec<usize> = prompts
        .iter()
        .map(|p| {
            unique
                .iter()
                .position(|u| u.ids == p.ids)
                .unwrap_or_else(|| {
                    unique.push(p);
                    unique.len() - 1
                })
        })
        .collect();
    let rows: Vec<Vec<u32>> = unique.iter().map(|p| p.ids.to_vec()).collect();
    let padded = PaddedBatch::left_pad(&rows, config.pad_token_id);
    let positions = match parts.positions {
        Some(mm) => mm.position_ids(&padded, &[])?,
        None => plain_positions(&padded),
    };
    let embeds = embed_inputs(lm, parts.vision, &padded, &[], None, &device)?;
    let mut cache: KvCache<B> = lm.new_cache();
    let hidden = lm.forward_hidden(
        padded.ids_tensor::<B>(&device),
        embeds,
        positions.tensor::<B>(&device),
        padded.mask_tensor::<B>(&device),
        Some(&mut cache),
    );
    let [u, len, h] = hidden.dims();
    let first = host_rows(lm.lm_head(hidden.slice([0..u, len - 1..len, 0..h])));
    cache.select_rows(&source);
    let mut logits: Vec<Vec<f32>> = source.iter().map(|&s| first[s].clone()).collect();
    let mut masks: Vec<Vec<u32>> = source
        .iter()
        .map(|&s| padded.mask_row(s).to_vec())
        .collect();
    let prompt_real = padded.real_lengths();
    let mut real: Vec<usize> = source.iter().map(|&s| prompt_real[s]).collect();
    let deltas: Vec<i64> = source.iter().map(|&s| positions.rope_deltas[s]).collect();
    let stops: Vec<u32> = lm
        .eos_token_ids()
        .into_iter()
        .chain(config.stop_token_ids.iter().copied())
        .collect();
    // `in_batch`: the rows of the decode batch, in order; `last`: each row's last token.
    let mut in_batch: Vec<usize> = (0..batch).collect();
    let mut last = vec![0u32; batch];
    for step in 0..config.max_new_tokens {
        for (slot, &row) in in_batch.iter().enumerate() {
            if out.stopped[row] {
                continue;
            }
            let row_logits = &mut logits[slot];
            for &t in &config.suppress_token_ids {
                if let Some(x) = row_logits.get_mut(t as usize) {
                    *x = f32::NEG_INFINITY;
                }
            }
            let s = sample(row_logits, &config.sampling, uniform(seeds[row], step))?;
            out.tokens[row].push(s.token);
            out.log_probs[row].push(s.log_prob);
            out.stopped[row] = stops.contains(&s.token);
            last[row] = s.token;
        }
        if step + 1 == config.max_new_tokens || in_batch.iter().all(|&r| out.stopped[r]) {
            break;
        }
        let keep: Vec<usize> = (0..in_batch.len())
            .filter(|&s| !out.stopped[in_batch[s]])
            .collect();
        let compact = match compaction {
            Compaction::AtHalf => 2 * keep.len() <= in_batch.len(),
            Compaction::AtOnce => true,
            Compaction::Never => false,
        };
        if compact && keep.len() < in_batch.len() {
            cache.select_rows(&keep);
            in_batch = keep.iter().map(|&s| in_batch[s]).collect();
        }
        let n = in_batch.len();
        let pos: Vec<i64> = (0..positions.streams)
            .flat_map(|_| in_batch.iter().map(|&r| real[r] as i64 + deltas[r]))
            .collect();
        let mut mask = Vec::new();
        for &r in &in_batch {
            masks[r].push(1);
            real[r] += 1;
            mask.extend(masks[r].iter().map(|&m| m as i64));
        }
        let keys = masks[in_batch[0]].len();
        let ids = Tensor::<B, 1, Int>::from_data(
            TensorData::new(in_batch.iter().map(|&r| last[r] as i64).collect(), [n]),
            &device,
        )
        .reshape([n, 1]);
        let hidden = lm.forward_hidden(
            ids.clone(),
            lm.embed_tokens(ids),
            Tensor::<B, 1, Int>::from_data(TensorData::new(pos, [positions.streams * n]), &device)
                .reshape([positions.streams, n, 1]),
            Tensor::<B, 1, Int>::from_data(TensorData::new(mask, [n * keys]), &device)
                .reshape([n, keys]),
            Some(&mut cache),
        );
        logits = host_rows(lm.lm_head(hidden));
    }
    Ok(out)
}

fn host_rows(logits: Tensor<B, 3>) -> Vec<Vec<f32>> {
    let [_, _, vocab] = logits.dims();
    let data = logits.into_data().into_vec::<f32>().unwrap();
    data.chunks(vocab).map(<[f32]>::to_vec).collect()
}

fn seeds() -> Vec<u64> {
    (100..105).collect()
}

/// Same tokens and stop flags; log-probs bit for bit (`exact`) or within 1e-6 relative (the
/// batch of the forward passes differs, so its float rounding may).
fn assert_same(what: &str, got: &Generation, want: &Generation, exact: bool) {
    assert_eq!(got.tokens, want.tokens, "{what}: tokens");
    assert_eq!(got.stopped, want.stopped, "{what}: stop flags");
    for (r, (a, b)) in got.log_probs.iter().zip(&want.log_probs).enumerate() {
        for (t, (x, y)) in a.iter().zip(b).enumerate() {
            let tol = if exact { 0.0 } else { 1e-6 * y.abs().max(1.0) };
            assert!(
                (x - y).abs() <= tol,
                "{what}: row {r} token {t}: log-prob {x} vs {y}"
            );
        }
    }
}

#[test]
fn reserved_cache_and_dropped_rows_decode_like_the_reference_loop() {
    let device = Default::default();
    let mut cases = 0;
    // Every distinct model configuration of the fixture cases (the cases of a family share
    // theirs), on text-only prompts built here: random weights, so the case's inputs and
    // expected outputs are not read.
    let mut seen = std::collections::BTreeSet::new();
    for dir in model_cases(&["qwen2_vl", "qwen3_vl", "gemma4"]) {
        let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
        if !seen.insert(config.clone()) {
            continue;
        }
        let model = Model::<B>::random(&config, &device, 5).unwrap();
        let parts = ModelParts::of(&model);
        let vocab = parts.lm.vocab_size() as u32;
        let (a, b, c): (Vec<u32>, Vec<u32>, Vec<u32>) = (
            vec![1, 2, 3, 4, 5 % vocab],
            vec![7 % vocab, 8 % vocab],
            vec![9 % vocab, 3, 11 % vocab],
        );
        let order = [&a, &b, &a, &c, &b];
        let prompts: Vec<PromptInput<'_>> = order
            .iter()
            .map(|ids| PromptInput { ids, images: &[] })
            .collect();
        for sampling in [SamplingConfig::greedy(), SamplingConfig::default()] {
            let what = format!("{} greedy={}", dir.display(), sampling.greedy);
            let free = GenerationConfig {
                // The model's EOS ids are left to chance; the stops below are chosen.
                suppress_token_ids: parts.lm.eos_token_ids(),
                ..GenerationConfig::new(10, sampling.clone())
            };
            let unstopped = generate(&parts, &prompts, &free, &seeds(), &device).unwrap();
            assert_same(
                &format!("{what}, no stops, vs cat cache"),
                &unstopped,
                &reference(&parts, &prompts, &free, &seeds(), Compaction::AtHalf).unwrap(),
                true,
            );
            // Stop tokens that end some rows early, at different steps: per row, the first
            // token that row had not produced before (from step 1 + 2·row on), for up to three
            // rows (another row that produces it earlier stops there); a batch of constant rows
            // (greedy on a random model) stops row 0's prompt at its first token instead.
            let mut stop_ids = Vec::new();
            for (r, row) in unstopped.tokens.iter().enumerate() {
                let new_at = |s: &usize| !row[..*s].contains(&row[*s]);
                if let Some(s) = (1 + 2 * r..row.len()).find(new_at)
                    && !stop_ids.contains(&row[s])
                    && stop_ids.len() < 3
                {
                    stop_ids.push(row[s]);
                }
            }
            if stop_ids.is_empty() {
                stop_ids.push(unstopped.tokens[0][0]);
            }
            let config = GenerationConfig {
                stop_token_ids: stop_ids,
                ..free
            };
            let got = generate(&parts, &prompts, &config, &seeds(), &device).unwrap();
            let lengths: std::collections::BTreeSet<usize> =
                got.tokens.iter().map(Vec::len).collect();
            assert!(
                got.stopped.iter().any(|&s| s) && lengths.len() >= 2,
                "{what}: rows should stop at different steps: {:?}",
                got.tokens
            );
            assert_same(
                &format!("{what}, stops, vs cat cache + rows compacted at half"),
                &got,
                &reference(&parts, &prompts, &config, &seeds(), Compaction::AtHalf).unwrap(),
                true,
            );
            assert_same(
                &format!("{what}, stops, vs cat cache + rows dropped at once"),
                &got,
                &reference(&parts, &prompts, &config, &seeds(), Compaction::AtOnce).unwrap(),
                false,
            );
            assert_same(
                &format!("{what}, stops, vs cat cache + every row kept"),
                &got,
                &reference(&parts, &prompts, &config, &seeds(), Compaction::Never).unwrap(),
                false,
            );
        }
        cases += 1;
    }
    assert!(
        cases >= 1,
        "no fixture model configuration found under the fixtures' qwen2_vl, qwen3_vl, gemma4"
    );
}
