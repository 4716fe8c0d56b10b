//! The `rollout.multi_turn` node kind: responses that call tools and read their answers —
//! pictures included ("thinking with images") — before they answer (verl's tool agent loop,
//! TRL's `tools`).
//!
//! Per response, turn by turn: the policy samples until an end-of-turn token (or its token
//! limit); the tool calls of the turn's text are parsed in the family's syntax
//! ([`crate::tools::call`]) and run ([`crate::tools::ToolSet`]); their answers, text and
//! pictures, are rendered through the model's chat template as tool messages with the next
//! generation prompt ([`crate::tools::render`]) and appended as tokens; then the next turn.
//! A response ends at a turn without tool calls, at a turn cut at its token limit, after
//! `max_turns` turns (the last turn's calls are not run), or when the tool answers and one more
//! token would pass `max_new_tokens` (the response then ends at the turn boundary before them).
//!
//! **Token in, token out.** Each turn's sampled tokens are kept as sampled (never decoded and
//! re-encoded); the next turn's context is the previous context's ids plus them plus the
//! template segment's ids. The response is the segments one after the other
//! ([`crate::values::Trajectory`]): loss mask 1 on the policy's tokens, 0 on the template's
//! and the tools'; sampling log-probs 0 there. Tool pictures are processed by the model's
//! image processor and follow the prompt's pictures, so the log-prob, value and update nodes
//! (which take the whole response with its mask) run them through the vision tower and the
//! position ids (multimodal RoPE included) exactly as generation did: each turn is generated
//! from the whole context so far, pictures included, with [`generate`].
//!
//! **The check** ([`check_trajectory`]): before a batch leaves the node, per response, the
//! vision tokens of prompt and response equal the tokens its pictures become, in every
//! template segment too, and every template segment's ids equal its rendered text tokenized
//! and expanded again; a mismatch is an error naming the response and the segment.
//!
//! Rows finish independently: a finished row takes no place in the next turn's batch.
//! Sampling is seeded per response and turn, so a response does not depend on how the batch
//! is split over replicas (as for `rollout`). Replicas exchange their finished rows (ids,
//! segments, messages, tool pictures) as bytes; every process then has the whole batch.
//!
//! **Tools in the prompt.** The tools' OpenAI function descriptions are passed to the chat
//! template's `tools` variable, as `apply_chat_template(..., tools=...)` does: a template that
//! writes them (Qwen2.5's and Qwen3's system block, say) gets the prompts encoded again with them
//! (the dataset encodes prompts without tools); the tiny models' templates do not read it.
//!
//! **Replayed turns** (`replay_turns = "KEY"`): the assistant turns are the texts of each
//! prompt's `extra_info.KEY` list, tokenized and followed by the model's EOS, instead of
//! sampled (log-probs 0); the tools run and the template renders as for sampled turns. With
//! `update.sft` reading these rollouts it is SFT on tool-using conversations.
//!
//! `sink.trajectories` writes the responses, their messages and pictures as JSONL.
//!
//! Metrics: `response_length/*`, `prompt_length/*` as `rollout`; `num_turns/mean|max|min`
//! (verl's: the prompt, the assistant turns and the tool-answer turns), `tool_calls/mean`,
//! `tool_calls/rate` (share of responses with at least one call), `tool_errors/mean`,
//! `tool_images/mean` (tool pictures per response), `multi_turn/over_budget_ratio` (share
//! that ended at the length budget).

use std::sync::Arc;

use anyhow::{Context, Result, anyhow, ensure};
use flowrl_datasets::PromptEncoder;
use flowrl_datasets::template::multimodal_messages;
use flowrl_engine::{
    BuildContext, Diagnostic, Footprint, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec,
    Params, PlanCtx, Port, PortSpec, StepContext, ValidateCtx,
};
use flowrl_models::ProcessedImage;
use flowrl_models::generate::{GenerationConfig, ModelParts, PromptInput, generate};
use image::RgbImage;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};
use tokenizers::Tokenizer;

use super::{
    RolloutParams, gib_bytes, record_length_metrics, rollout_footprint, stop_token_ids,
    validate_generation,
};
use crate::resources::model::ModelResource;
use crate::runtime::backend::{FlowBackend, on_backend};
use crate::runtime::data_parallel::{Replica, Replicas, shard};
use crate::tools::ToolSet;
use crate::tools::call::CallSyntax;
use crate::tools::render::{TurnTemplate, tool_message};
use crate::values::trajectory::{Finish, Segment, SegmentKind};
use crate::values::{PromptBatch, RolloutBatch, TokenMatrix, Trajectory, port_types};

/// The `rollout.multi_turn` kind.
pub struct MultiTurnKind;

const PROMPTS: Port<PromptBatch> = Port::new("prompts", port_types::PROMPTS);
const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);

/// The tool-call syntaxes `format` accepts (verl: `multi_turn.format`).
const FORMATS: &[&str] = &["auto", "hermes", "gemma4"];

/// The multi-turn parameters, shared by `rollout.multi_turn` and `eval` (verl's
/// `actor_rollout_ref.rollout.multi_turn.*` names where they exist).
#[derive(Debug, Clone, Deserialize, Params)]
pub struct TurnParams {
    /// most tokens of one assistant turn (default: the whole budget)
    #[param(min = 1.0)]
    pub max_tokens_per_turn: Option<usize>,
    /// most assistant turns of a response (verl: max_assistant_turns)
    #[param(default = 4, min = 1.0)]
    pub max_turns: usize,
    /// most tool calls run per response; later calls are answered with an error
    #[param(default = 8, min = 0.0)]
    pub max_tool_calls: usize,
    /// most tool calls run per turn (verl: max_parallel_calls)
    #[param(default = 1, min = 1.0)]
    pub max_parallel_calls: usize,
    /// tool-call syntax: `hermes` (`<tool_call>{json}</tool_call>`, Qwen), `gemma4`
    /// (`<|tool_call>call:name{...}<tool_call|>`) or `auto` (from the tokenizer and template)
    #[param(one_of = FORMATS, default = "auto")]
    pub format: String,
    /// teacher forcing: the assistant turns are the texts of the prompt's
    /// `extra_info[replay_turns]` (each followed by the model's EOS) instead of sampled; the
    /// tools still run (SFT warm starts on tool use)
    pub replay_turns: Option<String>,
    /// the tools, by the name the model calls them (see the module doc of `flowrl_nodes::tools`)
    #[serde(default)]
    pub tools: Json,
}

/// Parameters of [`MultiTurnKind`].
#[derive(Debug, Clone, Deserialize, Params)]
pub struct MultiTurnParams {
    /// `rollout`'s parameters; `max_new_tokens` is the length budget of a whole response:
    /// every turn and every tool answer (verl: response_length)
    #[serde(flatten)]
    pub rollout: RolloutParams,
    #[serde(flatten)]
    pub turns: TurnParams,
}

/// The checks of [`TurnParams`] for a response budget of `max_new` tokens; `required`: at
/// least one tool must be declared.
pub fn validate_turns(
    ctx: &ValidateCtx,
    p: &TurnParams,
    max_new: usize,
    required: bool,
) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    if let Some(t) = p.max_tokens_per_turn
        && t > max_new
    {
        out.push(ctx.warning(
            "max_tokens_per_turn",
            format!(
                "max_tokens_per_turn {t} is more than the response budget max_new_tokens {max_new}: a turn gets at most the budget"
            ),
        ));
    }
    match ToolSet::from_spec(&p.tools) {
        Ok(tools) if tools.is_empty() && required => out.push(ctx.error(
            "tools",
            "declare at least one tool (`[nodes.NAME.tools.zoom_in]`); without tools use `rollout`",
        )),
        Ok(_) => {}
        Err(errors) => out.extend(errors.into_iter().map(|(at, m)| ctx.error(&at, m))),
    }
    out
}

impl NodeKind for MultiTurnKind {
    fn name(&self) -> &str {
        "rollout.multi_turn"
    }

    fn doc(&self) -> &str {
        "Samples `n` multi-turn responses per prompt: the policy calls tools (crop, zoom_in, \
         rotate), reads their answers, pictures included, rendered by its chat template, and \
         goes on; its own tokens are kept as sampled and carry loss mask 1, the template's and \
         the tools' 0."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![PROMPTS.spec().doc("tokenized prompts")]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        vec![ROLLOUTS.spec().doc(
            "whole responses (turns and tool answers), masks on the policy's tokens, tool pictures",
        )]
    }

    fn params(&self) -> Vec<ParamSpec> {
        MultiTurnParams::param_specs()
    }

    fn timing_key(&self) -> Option<&str> {
        Some("gen")
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let p = match ctx.parse::<MultiTurnParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        let mut out = validate_generation(ctx, p.rollout.max_new_tokens);
        out.extend(validate_turns(
            ctx,
            &p.turns,
            p.rollout.max_new_tokens,
            true,
        ));
        out
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn capabilities(&self) -> Vec<flowrl_engine::Capability> {
        vec![crate::kinds::validate::GENERATES_ROLLOUTS]
    }

    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        // Every turn's context is at most the prompt and the response budget: the cache a
        // single-turn rollout of `max_new_tokens` reserves.
        rollout_footprint(ctx, &ctx.parse::<MultiTurnParams>().ok()?.rollout)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: MultiTurnParams = params.parse()?;
        let model = ctx.resource::<ModelResource>(&p.rollout.model)?;
        let rollout = MultiTurn::new(p.rollout, p.turns, model)
            .with_context(|| format!("node `{}`", ctx.node))?;
        Ok(Box::new(MultiTurnNode {
            replicas: Replicas::new(&ctx.placement, &ctx.node)?,
            rollout,
        }))
    }
}

struct MultiTurnNode {
    replicas: Replicas,
    rollout: MultiTurn,
}

impl Node for MultiTurnNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let prompts = inputs.get_arc(PROMPTS)?;
        let base_seed: u64 = ctx.rng().random();
        let rollouts = self.rollout.sample(&prompts, &self.replicas, base_seed)?;
        record_length_metrics(&rollouts, self.rollout.rollout.max_new_tokens, ctx);
        record_turn_metrics(&rollouts, ctx);
        Ok(Outputs::new().with(ROLLOUTS, rollouts))
    }
}

/// A multi-turn rollout: what `rollout.multi_turn` and a multi-turn `eval` run.
pub struct MultiTurn {
    pub rollout: RolloutParams,
    pub turns: TurnParams,
    pub model: Arc<ModelResource>,
    pub stop_ids: Vec<u32>,
    pub template: TurnTemplate,
    pub tools: ToolSet,
    pub syntax: CallSyntax,
    /// The model's first EOS token, which ends a replayed turn.
    pub eos: Option<u32>,
}

impl MultiTurn {
    /// Builds the tools, the chat template's turn segments and the tool-call syntax of `model`.
    pub fn new(
        rollout: RolloutParams,
        turns: TurnParams,
        model: Arc<ModelResource>,
    ) -> Result<Self> {
        rollout.sampling().validate()?;
        let tools = ToolSet::from_spec(&turns.tools).map_err(|errors| {
            let lines: Vec<String> = errors.iter().map(|(at, m)| format!("{at}: {m}")).collect();
            anyhow!("{}", lines.join("; "))
        })?;
        let stop_ids = stop_token_ids(&model, &rollout.stop)?;
        let encoder = Arc::new(
            PromptEncoder::from_model_dir(&model.dir)
                .with_context(|| format!("loading the chat template of model `{}`", model.name))?,
        );
        let syntax = match turns.format.as_str() {
            "hermes" => CallSyntax::Hermes,
            "gemma4" => CallSyntax::Gemma4,
            _ => CallSyntax::detect(
                |t| encoder.tokenizer.token_to_id(t).is_some(),
                encoder.template.source(),
            ),
        };
        let eos = on_backend!(model.backend(), B => {
            let s = model.lock::<B>()?;
            s.model.causal_lm().eos_token_ids().first().copied()
        });
        let template = TurnTemplate::new(encoder, &model.name, tools.functions())?;
        Ok(MultiTurn {
            rollout,
            turns,
            model,
            stop_ids,
            template,
            tools,
            syntax,
            eos,
        })
    }

    /// Tokens of one turn at most.
    fn turn_limit(&self) -> usize {
        self.turns
            .max_tokens_per_turn
            .unwrap_or(self.rollout.max_new_tokens)
            .min(self.rollout.max_new_tokens)
    }
}

/// A tool picture as bytes (replicas exchange finished rows).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Picture {
    width: u32,
    height: u32,
    rgb: Vec<u8>,
}

/// One response as its replica finished it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    /// Global response index (prompt-major).
    row: usize,
    ids: Vec<u32>,
    log_probs: Vec<f32>,
    segments: Vec<Segment>,
    messages: Vec<Json>,
    pictures: Vec<Picture>,
    tool_calls: usize,
    tool_errors: usize,
    finish: Option<Finish>,
    /// The tool pictures processed (not exchanged: processed again where missing).
    #[serde(skip)]
    images: Vec<ProcessedImage>,
}

impl Row {
    fn new(row: usize) -> Self {
        Row {
            row,
            ids: Vec::new(),
            log_probs: Vec::new(),
            segments: Vec::new(),
            messages: Vec::new(),
            pictures: Vec::new(),
            tool_calls: 0,
            tool_errors: 0,
            finish: None,
            images: Vec::new(),
        }
    }

    fn push(
        &mut self,
        kind: SegmentKind,
        ids: &[u32],
        log_probs: Option<&[f32]>,
        text: String,
        images: usize,
    ) {
        self.segments.push(Segment {
            kind,
            start: self.ids.len(),
            len: ids.len(),
            text,
            images,
        });
        self.ids.extend_from_slice(ids);
        match log_probs {
            Some(l) => self.log_probs.extend_from_slice(l),
            None => self.log_probs.extend(std::iter::repeat_n(0.0, ids.len())),
        }
    }

    fn pictures(&self) -> Vec<Arc<RgbImage>> {
        self.pictures
            .iter()
            .map(|p| {
                Arc::new(
                    RgbImage::from_raw(p.width, p.height, p.rgb.clone())
                        .expect("a picture's bytes match its size"),
                )
            })
            .collect()
    }
}

impl MultiTurn {
    /// `n` responses per prompt, the prompts split over `replicas` (see the module doc).
    pub fn sample(
        &self,
        prompts: &Arc<PromptBatch>,
        replicas: &Replicas,
        base_seed: u64,
    ) -> Result<RolloutBatch> {
        ensure!(!prompts.is_empty(), "the prompt batch is empty");
        let prompts = &self.with_tools(prompts)?;
        let rows = on_backend!(self.model.backend(), B => {
            self.rows_on::<B>(prompts, replicas, base_seed)
        })?;
        self.batch(prompts, rows)
    }

    /// Every response's [`Row`], in row order, on every replica.
    fn rows_on<B: FlowBackend>(
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
    fn after_turn(
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

    /// The prompt's messages in the layout its text was rendered with (verl's multimodal item
    /// layout, or plain strings): the one whose rendering with the generation prompt, with or
    /// without the tools, is the prompt's text.
    fn prompt_messages(&self, prompt: &flowrl_datasets::Prompt) -> Result<Vec<Json>> {
        let template = &self.template.encoder().template;
        for multimodal in [true, false] {
            let messages = multimodal_messages(&prompt.messages, multimodal)
                .as_array()
                .cloned()
                .unwrap_or_default();
            let text = Some(prompt.text.as_str());
            if template
                .render(&Json::Array(messages.clone()), true)
                .ok()
                .as_deref()
                == text
                || self.template.render(&messages, true).ok().as_deref() == text
            {
                return Ok(messages);
            }
        }
        Err(anyhow!(
            "prompt {}: its messages do not render to its text with the chat template of model `{}`",
            prompt.uid,
            self.model.name
        ))
    }

    /// The prompts encoded again with the tools in the chat template's `tools` variable, when
    /// the template writes them (the dataset renders prompts without tools): text, ids and
    /// placeholder expansion as the dataset's encoder does them.
    fn with_tools(&self, prompts: &Arc<PromptBatch>) -> Result<Arc<PromptBatch>> {
        if !self.template.writes_tools() {
            return Ok(prompts.clone());
        }
        let encoder = self.template.encoder();
        let mut batch = (**prompts).clone();
        for p in &mut batch.prompts {
            let messages = self.prompt_messages(p)?;
            let text = self.template.render(&messages, true)?;
            if text == p.text {
                continue;
            }
            let (videos, stills): (Vec<ProcessedImage>, Vec<ProcessedImage>) =
                p.images.iter().cloned().partition(|i| i.video.is_some());
            let mut ids = encoder.tokenize(&encoder.expand_video_text(&text, &videos)?)?;
            if !stills.is_empty() {
                let processor = encoder
                    .processor
                    .as_ref()
                    .ok_or_else(|| anyhow!("prompt {} has pictures but no processor", p.uid))?;
                ids = processor.expand_placeholders(&ids, &stills)?;
            }
            p.input_ids = ids;
            p.text = text;
        }
        Ok(Arc::new(batch))
    }

    /// The batch of `rows` (in row order): padded matrices, texts, trajectories; checked.
    fn batch(&self, prompts: &Arc<PromptBatch>, mut rows: Vec<Row>) -> Result<RolloutBatch> {
        let n = self.rollout.n;
        let b = rows.len();
        let t = rows.iter().map(|r| r.ids.len()).max().unwrap_or(0).max(1);
        let mut mask = TokenMatrix::zeros(b, t);
        let mut logps = TokenMatrix::zeros(b, t);
        let mut texts = Vec::with_capacity(b);
        let mut trajectories = Vec::with_capacity(b);
        let tokenizer = &self.template.encoder().tokenizer;
        let processor = self.template.encoder().processor.clone();
        for (i, row) in rows.iter_mut().enumerate() {
            let pictures = row.pictures();
            // Rows from other replicas arrive without their processed pictures.
            if row.images.len() != pictures.len() {
                let processor = processor.as_ref().ok_or_else(|| {
                    anyhow!("tool pictures for a model without an image processor")
                })?;
                row.images = pictures
                    .iter()
                    .map(|p| processor.process(p))
                    .collect::<Result<_>>()?;
            }
            let trajectory = Trajectory {
                messages: std::mem::take(&mut row.messages),
                segments: std::mem::take(&mut row.segments),
                images: std::mem::take(&mut row.images),
                pictures,
                tool_calls: row.tool_calls,
                tool_errors: row.tool_errors,
                finish: row.finish.unwrap_or(Finish::Stop),
            };
            mask.row_mut(i)[..row.ids.len()].copy_from_slice(&trajectory.mask(row.ids.len()));
            logps.row_mut(i)[..row.ids.len()].copy_from_slice(&row.log_probs);
            texts.push(
                tokenizer
                    .decode(&row.ids, true)
                    .map_err(|e| anyhow!("decoding response {i}: {e}"))?,
            );
            trajectories.push(Arc::new(trajectory));
        }
        let truncated = trajectories
            .iter()
            .map(|t| matches!(t.finish, Finish::Length | Finish::Budget))
            .collect();
        let rollouts = RolloutBatch::for_prompts(
            prompts.clone(),
            (0..b).map(|r| r / n).collect(),
            rows.into_iter().map(|r| r.ids).collect(),
            mask,
            logps,
            texts,
            truncated,
        )
        .with_trajectories(trajectories);
        rollouts.check()?;
        for r in 0..rollouts.len() {
            check_trajectory(&rollouts, r, self.template.encoder())?;
        }
        Ok(rollouts)
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
fn fitting_groups(lengths: &[usize], limits: &[usize], context: usize) -> Vec<Vec<usize>> {
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

/// Sends this replica's rows to every replica and returns all of them (as bytes of JSON in
/// `f32`s, exact: each is below 2^24).
fn exchange_rows(r: &Replica<'_>, mine: &[Row]) -> Result<Vec<Row>> {
    let bytes = serde_json::to_vec(mine)?;
    // The length in two 16-bit halves, each exact in an f32.
    let len = bytes.len();
    let halves = vec![(len >> 16) as f32, (len & 0xffff) as f32];
    let lengths = r.all_gather(halves, &vec![2; r.world])?;
    let counts: Vec<usize> = lengths
        .chunks(2)
        .map(|h| ((h[0] as usize) << 16) | h[1] as usize)
        .collect();
    let all = r.all_gather(bytes.iter().map(|&x| f32::from(x)).collect(), &counts)?;
    let mut rows = Vec::new();
    let mut at = 0;
    for &count in &counts {
        let part: Vec<u8> = all[at..at + count].iter().map(|&x| x as u8).collect();
        rows.extend(serde_json::from_slice::<Vec<Row>>(&part)?);
        at += count;
    }
    Ok(rows)
}

/// The check of the module doc for response `r`: its vision tokens against its pictures, and
/// its template segments against their text. The error names the response and the segment.
pub fn check_trajectory(rollouts: &RolloutBatch, r: usize, encoder: &PromptEncoder) -> Result<()> {
    let Some(t) = rollouts.trajectories.get(r) else {
        return Ok(());
    };
    let prompt = &rollouts.prompts.prompts[rollouts.prompt_index[r]];
    let name = || format!("response {r} (prompt {})", rollouts.uid[r]);
    let vision: Vec<u32> = [encoder.image_token_id(), encoder.video_token_id()]
        .into_iter()
        .flatten()
        .collect();
    let count = |ids: &[u32]| ids.iter().filter(|t| vision.contains(t)).count();
    let ids = &rollouts.response_ids[r];
    let tokens = count(&prompt.input_ids) + count(ids);
    let features: usize = prompt
        .images
        .iter()
        .chain(&t.images)
        .map(|i| i.num_tokens)
        .sum();
    ensure!(
        tokens == features,
        "{}: its prompt and response hold {tokens} image tokens, its {} picture(s) become {features}",
        name(),
        prompt.images.len() + t.images.len()
    );
    let mut image = 0;
    for (k, s) in t.segments.iter().enumerate() {
        let seg = &ids[s.start..s.start + s.len];
        let images = &t.images[image..image + s.images];
        image += s.images;
        let expected: usize = images.iter().map(|i| i.num_tokens).sum();
        ensure!(
            count(seg) == expected,
            "{}, segment {k} ({:?}): {} image tokens for {} picture(s) of {expected} tokens",
            name(),
            s.kind,
            count(seg),
            images.len()
        );
        if s.kind == SegmentKind::Template {
            let mut again = encoder.tokenize(&s.text)?;
            if !images.is_empty() {
                let processor = encoder.processor.as_ref().expect("pictures were processed");
                again = processor.expand_placeholders(&again, images)?;
            }
            ensure!(
                again == seg,
                "{}, segment {k}: its ids are not its text as the chat template renders and the \
                 tokenizer encodes it ({:?})",
                name(),
                s.text
            );
        }
    }
    Ok(())
}

/// The metrics of the module doc.
fn record_turn_metrics(r: &RolloutBatch, ctx: &mut StepContext) {
    let t = &r.trajectories;
    if t.is_empty() {
        return;
    }
    let b = t.len() as f64;
    let turns: Vec<usize> = t.iter().map(|t| 1 + t.segments.len()).collect();
    let mean = |f: &dyn Fn(&Trajectory) -> f64| t.iter().map(|x| f(x)).sum::<f64>() / b;
    ctx.metric("num_turns/mean", turns.iter().sum::<usize>() as f64 / b);
    ctx.metric("num_turns/max", *turns.iter().max().unwrap() as f64);
    ctx.metric("num_turns/min", *turns.iter().min().unwrap() as f64);
    ctx.metric("tool_calls/mean", mean(&|x| x.tool_calls as f64));
    ctx.metric(
        "tool_calls/rate",
        mean(&|x| f64::from(u8::from(x.tool_calls > 0))),
    );
    ctx.metric("tool_errors/mean", mean(&|x| x.tool_errors as f64));
    ctx.metric("tool_images/mean", mean(&|x| x.images.len() as f64));
    ctx.metric(
        "multi_turn/over_budget_ratio",
        mean(&|x| f64::from(u8::from(x.finish == Finish::Budget))),
    );
}

flowrl_engine::register_node_kind!(MultiTurnKind);

#[cfg(test)]
#[path = "multi_turn_tests.rs"]
mod tests;
