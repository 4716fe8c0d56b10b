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

mod batch;
mod check;
mod prompts;
mod row;
mod turns;

use std::sync::Arc;

use anyhow::{Context, Result, anyhow, ensure};
use flowrl_datasets::PromptEncoder;
use flowrl_engine::{
    BuildContext, Diagnostic, Footprint, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec,
    Params, PlanCtx, Port, PortSpec, StepContext, ValidateCtx,
};
use rand::Rng;
use serde::Deserialize;
use serde_json::Value as Json;

use super::{
    RolloutParams, record_length_metrics, rollout_footprint, stop_token_ids, validate_generation,
};
use crate::resources::model::ModelResource;
use crate::runtime::backend::on_backend;
use crate::runtime::data_parallel::Replicas;
use crate::tools::ToolSet;
use crate::tools::call::CallSyntax;
use crate::tools::render::TurnTemplate;
use crate::values::trajectory::Finish;
use crate::values::{PromptBatch, RolloutBatch, Trajectory, port_types};

pub use check::check_trajectory;

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
mod tests;
