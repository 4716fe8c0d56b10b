//! The turn loop: each replica's responses sampled (or replayed) turn by turn, their tool calls
//! run and the answers appended, until every response has ended.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow, ensure};
use flowrl_models::ProcessedImage;
use flowrl_models::generate::{GenerationConfig, ModelParts, PromptInput, generate};
use image::RgbImage;
use serde_json::{Value as Json, json};
use tokenizers::Tokenizer;

use super::MultiTurn;
use super::row::{Picture, Row, exchange_rows};
use crate::kinds::rollout::gib_bytes;
use crate::runtime::backend::FlowBackend;
use crate::runtime::data_parallel::{Replicas, shard};
use crate::tools::render::tool_message;
use crate::values::PromptBatch;
use crate::values::trajectory::{Finish, SegmentKind};

impl MultiTurn {
    /// Every response's [`Row`], in row order, on every replica.
    pub(super) fn rows_on<B: FlowBackend>(
        &self,
        prompts: &Arc<PromptBatch>,
        replicas: &Replicas,
        base_seed: u64,
    ) -> Result<Vec<Row>> {
        let n = self.rollout.n;
        let b = prompts.len() * n;
        let mut gathered = replicas.run(|r| {
            let (infer, device) = self
                .model
                .inference_model_on::<B>(replicas, r.local_index)?;
            let parts = ModelParts::of(&infer);
            let rows: Vec<usize> = shard(prompts.len(), r.world, r.index)
                .flat_map(|i| i * n..i * n + n)
                .collect();
            let mine = self.turns(&parts, &device, prompts, &rows, base_seed)?;
            if r.world == 1 {
                return Ok(mine);
            }
            exchange_rows(r, &mine)
        })?;
        let mut rows = gathered.swap_remove(0);
        ensure!(rows.len() == b, "{} responses gathered for {b}", rows.len());
        rows.sort_by_key(|row| row.row);
        Ok(rows)
    }

    /// Runs the turns of `rows` (see the module doc).
    fn turns<B: burn::prelude::Backend>(
        &self,
        parts: &ModelParts<'_, B>,
        device: &B::Device,
        prompts: &PromptBatch,
        rows: &[usize],
        base_seed: u64,
    ) -> Result<Vec<Row>> {
        let (p, t) = (&self.rollout, &self.turns);
        let n = p.n;
        let budget = p.max_new_tokens;
        let tokenizer = &self.template.encoder().tokenizer;
        let prompt_messages: Vec<Vec<Json>> = prompts
            .prompts
            .iter()
            .map(|prompt| self.prompt_messages(prompt))
            .collect::<Result<_>>()?;
        let mut states: Vec<Row> = rows.iter().map(|&r| Row::new(r)).collect();
        for turn in 0..t.max_turns {
            let mut live = Vec::new();
            let mut limits = Vec::new();
            for (k, s) in states.iter_mut().enumerate() {
                if s.finish.is_some() {
                    continue;
                }
                let room = budget.saturating_sub(s.ids.len());
                if room == 0 {
                    s.finish = Some(Finish::Budget);
                    continue;
                }
                live.push(k);
                limits.push(self.turn_limit().min(room));
            }
            if live.is_empty() {
                break;
            }
            if let Some(key) = &t.replay_turns {
                for (j, &k) in live.iter().enumerate() {
                    let prompt = &prompts.prompts[states[k].row / n];
                    let history = &prompt_messages[states[k].row / n];
                    let turns = prompt.extra_info.get(key).and_then(Json::as_array);
                    let Some(text) = turns.and_then(|v| v.get(turn)).and_then(Json::as_str) else {
                        ensure!(
                            turns.is_some(),
                            "prompt {}: extra_info has no list `{key}` of turns to replay",
                            prompt.uid
                        );
                        states[k].finish = Some(Finish::Stop);
                        continue;
                    };
                    let mut tokens = self.template.encoder().tokenize(text)?;
                    tokens.extend(self.eos);
                    let cut = tokens.len() > limits[j];
                    tokens.truncate(limits[j]);
                    let zeros = vec![0.0; tokens.len()];
                    self.after_turn(
                        &mut states[k],
                        &tokens,
                        &zeros,
                        !cut,
                        turn,
                        prompt,
                        history,
                        tokenizer,
                    )?;
                }
                continue;
            }
            let contexts: Vec<(Vec<u32>, Vec<ProcessedImage>)> = live
                .iter()
                .map(|&k| {
                    let s = &states[k];
                    let prompt = &prompts.prompts[s.row / n];
                    let mut ids = prompt.input_ids.clone();
                    ids.extend_from_slice(&s.ids);
                    let mut images = prompt.images.clone();
                    images.extend(s.images.iter().cloned());
                    (ids, images)
                })
                .collect();
            let seeds: Vec<u64> = live
                .iter()
                .map(|&k| turn_seed(base_seed, states[k].row, turn))
                .collect();
            let lengths: Vec<usize> = contexts.iter().map(|(ids, _)| ids.len()).collect();
            let mut generated = vec![(Vec::new(), Vec::new(), false); live.len()];
            for group in fitting_groups(&lengths, &limits, parts.lm.context_length()) {
                let inputs: Vec<PromptInput<'_>> = group
                    .iter()
                    .map(|&j| PromptInput {
                        ids: &contexts[j].0,
                        images: &contexts[j].1,
                    })
                    .collect();
                let group_seeds: Vec<u64> = group.iter().map(|&j| seeds[j]).collect();
                let config = GenerationConfig {
                    max_new_tokens: group.iter().map(|&j| limits[j]).max().unwrap_or(1),
                    sampling: p.sampling(),
                    stop_token_ids: self.stop_ids.clone(),
                    pad_token_id: prompts.pad_token_id,
                    suppress_token_ids: parts
                        .vision
                        .map(|v| v.vision_token_ids())
                        .unwrap_or_default(),
                    cache_budget: Some(gib_bytes(p.kv_cache_gib)),
                    prefill_tokens: Some(p.max_num_batched_tokens),
                };
                let g = generate(parts, &inputs, &config, &group_seeds, device)
                    .with_context(|| format!("turn {} of model `{}`", turn + 1, self.model.name))?;
                for (i, &j) in group.iter().enumerate() {
                    generated[j] = (g.tokens[i].clone(), g.log_probs[i].clone(), g.stopped[i]);
                }
            }
            for (j, &k) in live.iter().enumerate() {
                let limit = limits[j];
                let (all, all_log_probs, ended) = &generated[j];
                let cut = all.len() > limit;
                let tokens = &all[..all.len().min(limit)];
                let log_probs = &all_log_probs[..tokens.len()];
                let stopped = *ended && !cut;
                let prompt = &prompts.prompts[states[k].row / n];
                let history = &prompt_messages[states[k].row / n];
                self.after_turn(
                    &mut states[k],
                    tokens,
                    log_probs,
                    stopped,
                    turn,
                    prompt,
                    history,
                    tokenizer,
                )?;
            }
        }
        for s in &mut states {
            s.finish.get_or_insert(Finish::Stop);
        }
        Ok(states)
    }

    /// Appends a sampled turn to `s`, runs its tool calls and appends their answers (see the
    /// module doc for when the response ends instead).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn after_turn(
        &self,
        s: &mut Row,
        tokens: &[u32],
        log_probs: &[f32],
        stopped: bool,
        turn: usize,
        prompt: &flowrl_datasets::Prompt,
        prompt_messages: &[Json],
        tokenizer: &Tokenizer,
    ) -> Result<()> {
        let p = &self.turns;
        s.push(
            SegmentKind::Policy,
            tokens,
            Some(log_probs),
            String::new(),
            0,
        );
        let decode = |ids: &[u32]| {
            tokenizer
                .decode(ids, false)
                .map_err(|e| anyhow!("decoding a turn: {e}"))
        };
        // The turn's content: its text without the end-of-turn token the template writes.
        let (content, end) = if stopped && !tokens.is_empty() {
            let last = tokens.len() - 1;
            (decode(&tokens[..last])?, decode(&tokens[last..])?)
        } else {
            (decode(tokens)?, String::new())
        };
        let calls = self.syntax.parse(&content);
        let mut message = json!({"role": "assistant", "content": content});
        let parsed: Vec<Json> = calls
            .iter()
            .filter_map(|c| c.as_ref().ok())
            .map(|c| json!({"type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        if !parsed.is_empty() {
            message["tool_calls"] = Json::Array(parsed);
        }
        if !stopped {
            s.messages.push(message);
            s.finish = Some(Finish::Length);
            return Ok(());
        }
        if calls.is_empty() {
            s.messages.push(message);
            s.finish = Some(Finish::Stop);
            return Ok(());
        }
        if turn + 1 == p.max_turns {
            s.messages.push(message);
            s.finish = Some(Finish::MaxTurns);
            return Ok(());
        }
        // The conversation's pictures so far: the prompt's, then earlier tool answers'.
        let mut seen: Vec<Arc<RgbImage>> = prompt.pictures.clone();
        seen.extend(s.pictures());
        let mut answers = Vec::new();
        let mut new_pictures: Vec<Arc<RgbImage>> = Vec::new();
        let (mut calls_made, mut errors) = (0, 0);
        for (k, call) in calls.iter().enumerate() {
            calls_made += 1;
            let made = s.tool_calls + calls_made;
            let (name, result) = match call {
                Err(message) => ("error".to_string(), Err(message.clone())),
                Ok(c) if k >= p.max_parallel_calls => (
                    c.name.clone(),
                    Err(format!(
                        "Error: at most {} tool call(s) per turn are run; this one was not",
                        p.max_parallel_calls
                    )),
                ),
                Ok(c) if made > p.max_tool_calls => (
                    c.name.clone(),
                    Err(format!(
                        "Error: at most {} tool call(s) per response are run; this one was not",
                        p.max_tool_calls
                    )),
                ),
                Ok(c) => (
                    c.name.clone(),
                    self.tools.call(&c.name, &c.arguments, &seen),
                ),
            };
            match result {
                Ok(out) => {
                    let pictures: Vec<Arc<RgbImage>> =
                        out.pictures.into_iter().map(Arc::new).collect();
                    answers.push(tool_message(&name, &out.text, pictures.len()));
                    seen.extend(pictures.iter().cloned());
                    new_pictures.extend(pictures);
                }
                Err(text) => {
                    errors += 1;
                    answers.push(tool_message(&name, &text, 0));
                }
            }
        }
        s.tool_calls += calls_made;
        s.tool_errors += errors;
        let mut history = prompt_messages.to_vec();
        history.extend(s.messages.iter().map(for_template));
        history.push(for_template(&message));
        s.messages.push(message);
        let segment = self
            .template
            .tool_segment(&history, &end, &answers, &new_pictures)
            .with_context(|| format!("response {} after turn {}", s.row, turn + 1))?;
        if s.ids.len() + segment.ids.len() + 1 > self.rollout.max_new_tokens {
            s.finish = Some(Finish::Budget);
            return Ok(());
        }
        s.push(
            SegmentKind::Template,
            &segment.ids,
            None,
            segment.text,
            segment.images.len(),
        );
        s.messages.extend(answers);
        s.pictures.extend(new_pictures.iter().map(|p| Picture {
            width: p.width(),
            height: p.height(),
            rgb: p.as_raw().clone(),
        }));
        s.images.extend(segment.images);
        Ok(())
    }
}

/// A message as the chat template gets it: without flowrl's `tool_calls` record (the
/// assistant's text holds the calls as sampled, which is what the template must write).
fn for_template(message: &Json) -> Json {
    let mut m = message.clone();
    if let Some(o) = m.as_object_mut() {
        o.remove("tool_calls");
    }
    m
}

/// The rows of a turn in groups that one generation call can take: each group's longest
/// context plus its largest token limit fits the model's `context` (each row fits alone: its
/// prompt and the response budget do). Longest contexts first, so a group's rows are of like
/// lengths (less padding, a smaller reserved cache); every row keeps its own seed, so the
/// grouping does not change what it samples.
pub(super) fn fitting_groups(
    lengths: &[usize],
    limits: &[usize],
    context: usize,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&j| (std::cmp::Reverse(lengths[j]), j));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let (mut longest, mut limit) = (0, 0);
    for j in order {
        let fits = lengths[j].max(longest) + limits[j].max(limit) <= context;
        if !current.is_empty() && !fits {
            groups.push(std::mem::take(&mut current));
            (longest, limit) = (0, 0);
        }
        longest = longest.max(lengths[j]);
        limit = limit.max(limits[j]);
        current.push(j);
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

/// The seed of response `row`'s turn `turn` in a step whose RNG drew `base`.
fn turn_seed(base: u64, row: usize, turn: usize) -> u64 {
    flowrl_engine::derive_seed(base, row as u64, &format!("rollout.multi_turn.{turn}"))
}
