//! The `eval` node kind: greedy generation on the validation prompts after every `every`-th step
//! (steps k, 2k, … as verl's `test_freq`), after the last step, and before the first
//! (`before_train`, verl's `val_before_train`, logged as step 0); metrics per `data_source`.
//!
//! Wire `prompts` to the dataset node's `val_prompts` and, to evaluate the weights after the
//! step's update (and keep the order deterministic), `after` to the update node's `done`.
//!
//! Scoring, as verl validates with the training reward function: by default private copies of
//! the graph's training reward — the reward node whose scores no other reward node reads — and
//! of the reward nodes it reads (DAPO's `reward` → `overlong`; a `reward.combined` over a judge
//! and a rule), built from their kinds and parameters, plugins and `exec` programs included; a
//! graph with two such final nodes must choose. Otherwise the built-in rule named by `reward`
//! (geo3k when the graph has no reward node), or a reward node of the graph that the eval node
//! repeats (see
//! `flowrl_engine::repeat`): list it in `repeat`, wire its `rollouts` to `eval.rollouts` (each
//! chunk of responses is handed to it) and `eval.scores` to its `scores`:
//!
//! ```toml
//! [nodes.val_reward]
//! kind = "exec"                 # or any reward.* kind
//! timing = "eval"               # its time counts in timing_s/eval
//! inputs = { rollouts = "eval.rollouts" }
//!
//! [nodes.eval]
//! kind = "eval"
//! repeat = ["val_reward"]
//! inputs = { prompts = "data.val_prompts", after = "update.done", scores = "val_reward.scores" }
//! ```
//!
//! Metrics: `val/<data_source>/score` (mean reward), `val/<data_source>/accuracy` (mean of the
//! reward's `acc` component when it has one, else of the reward), `val/score` and `val/accuracy`
//! over all prompts, `val/response_length/mean`.
//!
//! With a `tools` table (and `rollout.multi_turn`'s other turn parameters) the responses are
//! multi-turn, generated as `rollout.multi_turn` generates them, greedily; then also
//! `val/tool_calls/mean` and `val/tool_calls/rate` (responses with a call).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use flowrl_algorithms::rewards::BuiltinReward;
use flowrl_engine::{
    BuildContext, Diagnostic, Footprint, Graph, Inputs, Node, NodeKind, Outputs, ParamSchema,
    ParamSpec, Params, Payload, PlanCtx, Port, PortSpec, Resources, StepContext, ValidateCtx,
    Value,
};
use rand::Rng;
use serde::Deserialize;

use crate::kinds::reward::support::ScoreColumns;
use crate::kinds::rollout::multi_turn::{MultiTurn, TurnParams, validate_turns};
use crate::kinds::rollout::{
    Generation, RolloutParams, generation_footprint, sample_rollouts, stop_token_ids,
    validate_generation,
};
use crate::kinds::sink::trajectories::{PictureFolder, trajectory_line};
use crate::resources::model::ModelResource;
use crate::runtime::data_parallel::Replicas;
use crate::sizing::{Prompts, planned_prompts};
use crate::values::{ModelUpdate, PromptBatch, RolloutBatch, ScoreBatch, port_types};
use flowrl_engine::graph::NodeId;
use flowrl_engine::rundir::GENERATIONS_DIR;

/// The `eval` kind.
pub struct EvalKind;

const PROMPTS: Port<PromptBatch> = Port::new("prompts", port_types::PROMPTS);
const AFTER: Port<ModelUpdate> = Port::new("after", port_types::MODEL_UPDATE);
const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);
const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);

#[derive(Debug, Clone, Deserialize, Params)]
struct EvalParams {
    /// the model to evaluate
    #[param(resource = "model", required)]
    model: String,
    /// evaluate after steps N, 2N, … (and after the last step)
    #[param(default = 5, min = 1.0)]
    every: u64,
    /// also evaluate the initial weights before the first step, logged as step 0
    #[param(default = true)]
    before_train: bool,
    /// a built-in rule to score with instead of the graph's training reward node (without one:
    /// geo3k)
    #[param(one_of = &["geo3k", "exact_match", "format"])]
    reward: Option<String>,
    /// prompts per generation batch
    #[param(default = 64, min = 1.0)]
    batch_size: usize,
    /// maximum response length in tokens (verl: response_length)
    #[param(required, min = 1.0)]
    max_new_tokens: usize,
    /// validation responses logged at each evaluation (the first N prompts, at most
    /// `batch_size`; verl's log_val_generations): generations/val_step_NNNNNN.jsonl in the run
    /// directory, and the trackers' `val/generations/*` (prompt, response, score, picture)
    #[param(default = 4, min = 0)]
    log_generations: usize,
    /// extra stop tokens (each must be one token of the tokenizer), besides the model's EOS
    #[serde(default)]
    stop: Vec<String>,
    /// with `tools`, the responses are multi-turn, as `rollout.multi_turn`'s (greedy)
    #[serde(flatten)]
    turns: TurnParams,
}

impl EvalParams {
    /// The greedy rollout (n = 1) an evaluation batch is generated with, at the rollout's
    /// default budgets.
    fn rollout(&self) -> RolloutParams {
        RolloutParams::greedy(&self.model, self.max_new_tokens)
    }
}

impl NodeKind for EvalKind {
    fn name(&self) -> &str {
        "eval"
    }

    fn doc(&self) -> &str {
        "Greedy generation on the validation prompts after every `every`-th step, the last step and \
         (`before_train`) before the first; reward and accuracy per data_source \
         (val/<data_source>/score, val/<data_source>/accuracy)."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            PROMPTS
                .spec()
                .doc("the validation prompts (dataset `val_prompts`)"),
            AFTER
                .spec()
                .optional()
                .doc("an update node's `done`: evaluate after that update"),
            SCORES.spec().optional().repeated().doc(
                "the scores of a reward node in `repeat`, for each chunk (instead of `reward`)",
            ),
        ]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        vec![
            ROLLOUTS
                .spec()
                .argument()
                .doc("each chunk of greedy responses, handed to the reward node in `repeat`"),
        ]
    }

    fn params(&self) -> Vec<ParamSpec> {
        EvalParams::param_specs()
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let p = match ctx.parse::<EvalParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        let mut out = validate_generation(ctx, p.max_new_tokens);
        out.extend(validate_turns(ctx, &p.turns, p.max_new_tokens, false));
        if ctx.input(SCORES.name()).is_some() {
            if ctx.is_set("reward") {
                out.push(ctx.warning(
                    "reward",
                    "`reward` is ignored: the responses are scored by the reward node wired to \
                     `scores`",
                ));
            }
        } else if !ctx.is_set("reward")
            && let rewards = training_rewards(ctx.graph(), ctx.name())
            && rewards.len() > 1
        {
            out.push(ctx.error(
                "reward",
                format!(
                    "the graph has {} reward nodes ({}): say which scores validation, with a \
                     built-in `reward` or a reward node in `repeat` wired to `scores`",
                    rewards.len(),
                    rewards
                        .iter()
                        .map(|r| format!("`{r}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        out
    }

    /// A rollout of `batch_size` validation prompts (n = 1, greedy) with the rollout's default
    /// budgets.
    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let p = ctx.parse::<EvalParams>().ok()?;
        let mut f = Footprint::default();
        let Some((m, prompts)) = planned_prompts(ctx, &mut f) else {
            return Some(f);
        };
        let prompts = Prompts {
            per_step: p.batch_size,
            ..prompts
        };
        generation_footprint(&mut f, &m, ctx, Generation::of(&p.rollout(), prompts));
        // Evaluated every `every` steps: its FLOPs per step on average.
        f.flops /= p.every as f64;
        Some(f)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: EvalParams = params.parse()?;
        let model = ctx.resource::<ModelResource>(&p.model)?;
        let scorer = Scorer::of(&p, ctx)?;
        let stop_ids = stop_token_ids(&model, &p.stop)?;
        let multi_turn = match &p.turns.tools {
            serde_json::Value::Null => None,
            _ => Some(
                MultiTurn::new(p.rollout(), p.turns.clone(), model.clone())
                    .with_context(|| format!("node `{}`", ctx.node))?,
            ),
        };
        Ok(Box::new(EvalNode {
            p,
            model,
            scorer,
            stop_ids,
            multi_turn,
        }))
    }
}

/// The graph's reward nodes as `eval` sees them: nodes (other than `eval`'s repeats and loop
/// nodes) with a `scores` output that read only `rollouts` and other reward nodes' `scores`.
fn reward_nodes(graph: &Graph, eval: &str) -> Vec<NodeId> {
    let eval_id = graph.node_id(eval);
    let mut ids: Vec<NodeId> = (0..graph.nodes.len())
        .filter(|&i| {
            let n = &graph.nodes[i];
            n.name != eval
                && (eval_id.is_none() || n.repeated_by != eval_id)
                && n.repeat.is_empty()
                && !n.inputs.is_empty()
                && n.kind
                    .outputs()
                    .iter()
                    .any(|o| !o.argument && o.ty == SCORES.port_type())
                && n.inputs
                    .iter()
                    .all(|e| e.ty == ROLLOUTS.port_type() || e.ty == SCORES.port_type())
        })
        .collect();
    // A node that reads the scores of a node that is none is none either.
    loop {
        let before = ids.len();
        let kept: Vec<NodeId> = ids
            .iter()
            .copied()
            .filter(|&i| {
                graph.nodes[i]
                    .inputs
                    .iter()
                    .all(|e| e.ty == ROLLOUTS.port_type() || ids.contains(&e.from))
            })
            .collect();
        ids = kept;
        if ids.len() == before {
            return ids;
        }
    }
}

/// The graph's training rewards, which `eval` scores with unless its `reward` is set or its
/// `scores` wired: the reward nodes ([`reward_nodes`]) whose scores no other reward node reads
/// (the default graph's `reward`; DAPO's `overlong`, which shapes `reward`'s scores).
fn training_rewards<'g>(graph: &'g Graph, eval: &str) -> Vec<&'g str> {
    let rewards = reward_nodes(graph, eval);
    rewards
        .iter()
        .filter(|&&i| {
            !rewards
                .iter()
                .any(|&j| graph.nodes[j].inputs.iter().any(|e| e.from == i))
        })
        .map(|&i| graph.nodes[i].name.as_str())
        .collect()
}

/// The reward node `name` and the reward nodes whose scores it reads, directly or not, in the
/// graph's order: what a copy of it runs.
fn reward_chain(graph: &Graph, eval: &str, name: &str) -> Vec<NodeId> {
    let rewards = reward_nodes(graph, eval);
    let mut needed: Vec<NodeId> = graph.node_id(name).into_iter().collect();
    let mut k = 0;
    while k < needed.len() {
        for e in &graph.nodes[needed[k]].inputs {
            if e.ty == SCORES.port_type() && rewards.contains(&e.from) && !needed.contains(&e.from)
            {
                needed.push(e.from);
            }
        }
        k += 1;
    }
    graph
        .order
        .iter()
        .copied()
        .filter(|i| needed.contains(i))
        .collect()
}

/// Where an input of a copied reward node comes from.
enum Source {
    /// The eval node's responses.
    Rollouts,
    /// Output `port` of the chain's `index`-th node: `Copied(index, port)`.
    Copied(usize, String),
}

/// A private copy of one node of the training reward.
struct CopiedNode {
    name: String,
    node: Box<dyn Node>,
    inputs: Vec<(String, Source)>,
    /// Its (first) `Scores` output.
    scores_port: String,
}

/// What scores the responses.
enum Scorer {
    /// A built-in rule.
    Rule(BuiltinReward),
    /// Private copies of the graph's training reward and the reward nodes it reads, run in
    /// order on the eval node's responses; the last one's scores count.
    Copy {
        chain: Vec<CopiedNode>,
        resources: Arc<Resources>,
    },
    /// The reward node wired to `scores`, which the eval node repeats.
    Repeated,
}

impl Scorer {
    fn of(p: &EvalParams, ctx: &BuildContext) -> Result<Scorer> {
        if let Some(rule) = &p.reward {
            return Ok(Scorer::Rule(BuiltinReward::from_name(rule)?));
        }
        let Some(graph) = &ctx.graph else {
            return Ok(Scorer::Rule(BuiltinReward::from_name("geo3k")?));
        };
        let me = graph.node_id(&ctx.node).map(|i| &graph.nodes[i]);
        if me.is_some_and(|n| n.inputs.iter().any(|e| e.port == SCORES.name())) {
            return Ok(Scorer::Repeated);
        }
        let name = match training_rewards(graph, &ctx.node)[..] {
            [] => return Ok(Scorer::Rule(BuiltinReward::from_name("geo3k")?)),
            [name] => name,
            ref several => anyhow::bail!(
                "the graph has several reward nodes ({}): set `reward` or wire `scores`",
                several.join(", ")
            ),
        };
        let ids = reward_chain(graph, &ctx.node, name);
        let mut chain = Vec::with_capacity(ids.len());
        for &id in &ids {
            let n = &graph.nodes[id];
            let inputs = n
                .inputs
                .iter()
                .map(|e| {
                    let source = match ids.iter().position(|&j| j == e.from) {
                        Some(k) if e.ty == SCORES.port_type() => {
                            Source::Copied(k, e.from_port.clone())
                        }
                        _ => Source::Rollouts,
                    };
                    (e.port.clone(), source)
                })
                .collect();
            let scores_port = n
                .kind
                .outputs()
                .into_iter()
                .find(|o| !o.argument && o.ty == SCORES.port_type())
                .map(|o| o.name)
                .context("a reward node without a Scores output")?;
            chain.push(CopiedNode {
                name: format!("{}/{}", ctx.node, n.name),
                node: ctx.build_copy(&n.name)?,
                inputs,
                scores_port,
            });
        }
        Ok(Scorer::Copy {
            chain,
            resources: ctx.resources.clone(),
        })
    }

    /// Runs the copied chain on `rollouts`: the scores of the last node (its first `Scores`
    /// output).
    fn run_copies(
        chain: &mut [CopiedNode],
        resources: &Arc<Resources>,
        rollouts: &Arc<RolloutBatch>,
        ctx: &mut StepContext,
    ) -> Result<Arc<ScoreBatch>> {
        let names: Vec<String> = chain.iter().map(|c| c.name.clone()).collect();
        let mut outputs: Vec<Outputs> = Vec::with_capacity(chain.len());
        for c in chain.iter_mut() {
            let mut inputs = Inputs::new(c.name.clone());
            for (port, source) in &c.inputs {
                let value = match source {
                    Source::Rollouts => {
                        Value::new(ROLLOUTS.port_type(), Payload::opaque_arc(rollouts.clone()))
                    }
                    Source::Copied(k, from_port) => {
                        let scores: Arc<ScoreBatch> = outputs[*k]
                            .get_arc(from_port)
                            .with_context(|| format!("`{}` gave no `{from_port}`", names[*k]))?;
                        Value::new(SCORES.port_type(), Payload::opaque_arc(scores))
                    }
                };
                inputs.insert(port.clone(), value);
            }
            let mut copy_ctx = StepContext::new(
                c.name.clone(),
                ctx.step(),
                ctx.total_steps(),
                ctx.seed(),
                ctx.device(),
                resources.clone(),
            );
            let got = c
                .node
                .run(&inputs, &mut copy_ctx)
                .with_context(|| format!("scoring with `{}`", c.name))?;
            for w in copy_ctx.warnings() {
                ctx.warn(format!("{}: {w}", c.name));
            }
            outputs.push(got);
        }
        let last = chain.last().context("no reward node to score with")?;
        let port = last.scores_port.clone();
        outputs
            .last()
            .and_then(|o| o.get_arc::<ScoreBatch>(&port))
            .with_context(|| format!("`{}` gave no `{port}`", last.name))
    }
}

struct EvalNode {
    p: EvalParams,
    model: Arc<ModelResource>,
    scorer: Scorer,
    stop_ids: Vec<u32>,
    /// Multi-turn generation, when the node declares tools.
    multi_turn: Option<MultiTurn>,
}

#[derive(Default)]
struct SourceStats {
    score: f64,
    accuracy: f64,
    /// Σ of each score component.
    components: BTreeMap<String, f64>,
    count: usize,
}

impl Node for EvalNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        if !(ctx.step() + 1).is_multiple_of(self.p.every) && !ctx.is_last_step() {
            return Ok(Outputs::new());
        }
        self.evaluate(inputs, ctx)
    }

    fn before_train(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        if !self.p.before_train {
            return Ok(Outputs::skipped());
        }
        self.evaluate(inputs, ctx)
    }

    fn runs_before_train(&self) -> bool {
        self.p.before_train
    }
}

impl EvalNode {
    /// Generates greedily for every validation prompt and records the `val/*` metrics.
    fn evaluate(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let prompts = inputs.get_arc(PROMPTS)?;
        let params = self.p.rollout();
        let mut per_source: BTreeMap<String, SourceStats> = BTreeMap::new();
        let mut lengths = 0usize;
        let mut total = 0usize;
        let (mut tool_calls, mut tool_users) = (0usize, 0usize);
        let mut generations: Vec<LoggedResponse> = Vec::new();
        for (generations_chunk, chunk) in split(&prompts, self.p.batch_size).into_iter().enumerate()
        {
            // Generation runs where the model lives.
            let here = Replicas::single(self.model.device);
            let rollouts = Arc::new(match &self.multi_turn {
                Some(m) => m.sample(&Arc::new(chunk), &here, ctx.rng().random())?,
                None => sample_rollouts(
                    &self.model,
                    &Arc::new(chunk),
                    &params,
                    &self.stop_ids,
                    &here,
                    ctx,
                )?,
            });
            for t in &rollouts.trajectories {
                tool_calls += t.tool_calls;
                tool_users += usize::from(t.tool_calls > 0);
            }
            let scored = match &mut self.scorer {
                Scorer::Rule(rule) => ScoreColumns::of_rule(rule, &rollouts)?,
                Scorer::Repeated => {
                    // The reward node's own critic/score/* would overwrite the training reward's.
                    let repeat = ctx.repeat()?;
                    repeat.report_metrics(false);
                    let got = repeat.run(Outputs::new().with_arc(ROLLOUTS, rollouts.clone()))?;
                    let scores: Arc<ScoreBatch> = got.get_arc(SCORES)?;
                    checked_columns(&scores, &rollouts)?
                }
                Scorer::Copy { chain, resources } => {
                    let scores = Scorer::run_copies(chain, resources, &rollouts, ctx)?;
                    checked_columns(&scores, &rollouts)?
                }
            };
            for r in 0..rollouts.len() {
                let score = scored.scores[r];
                let components = scored.row(r);
                let acc = components
                    .iter()
                    .find(|(name, _)| name == "acc")
                    .map_or(score, |(_, v)| *v);
                let e = per_source
                    .entry(rollouts.data_source[r].clone())
                    .or_default();
                e.score += score;
                e.accuracy += acc;
                e.count += 1;
                for (name, v) in &components {
                    *e.components.entry(name.clone()).or_default() += v;
                }
                if generations.len() < self.p.log_generations && generations_chunk == 0 {
                    generations.push(LoggedResponse {
                        rollouts: rollouts.clone(),
                        row: r,
                        score,
                        components,
                    });
                }
                lengths += rollouts.response_ids[r].len();
                total += 1;
            }
        }
        let (mut score, mut accuracy) = (0.0, 0.0);
        for (source, s) in &per_source {
            let n = s.count as f64;
            ctx.metric(format!("val/{source}/score"), s.score / n);
            ctx.metric(format!("val/{source}/accuracy"), s.accuracy / n);
            // verl's names (ray_trainer._validate): val-core/<source>/<var>/mean@1 for the core
            // variable (`acc` when the reward has it, else `reward`), val-aux/ for the others.
            let core = if s.components.contains_key("acc") {
                "acc"
            } else {
                "reward"
            };
            let vars = std::iter::once(("reward", s.score))
                .chain(s.components.iter().map(|(k, v)| (k.as_str(), *v)));
            for (var, sum) in vars {
                let section = if var == core { "val-core" } else { "val-aux" };
                ctx.metric(format!("{section}/{source}/{var}/mean@1"), sum / n);
            }
            score += s.score;
            accuracy += s.accuracy;
        }
        if total > 0 {
            ctx.metric("val/score", score / total as f64);
            ctx.metric("val/accuracy", accuracy / total as f64);
            ctx.metric("val/response_length/mean", lengths as f64 / total as f64);
            if self.multi_turn.is_some() {
                ctx.metric("val/tool_calls/mean", tool_calls as f64 / total as f64);
                ctx.metric("val/tool_calls/rate", tool_users as f64 / total as f64);
            }
        }
        log_generations(&generations, ctx)?;
        Ok(Outputs::new())
    }
}

/// A validation response kept for the generations log.
struct LoggedResponse {
    rollouts: Arc<RolloutBatch>,
    row: usize,
    score: f64,
    components: Vec<(String, f64)>,
}

/// Writes the kept responses to `generations/val_step_NNNNNN.jsonl` under the run directory (as
/// `sink.trajectories` writes a line; the prompts' pictures under `generations/val_images/`),
/// and logs each for the trackers: `val/generations/<k>` (prompt, response, ground truth, score)
/// and `val/generations/<k>/image` (the prompt's first picture).
fn log_generations(generations: &[LoggedResponse], ctx: &mut StepContext) -> Result<()> {
    if generations.is_empty() {
        return Ok(());
    }
    let step = if ctx.is_before_train() {
        0
    } else {
        ctx.step() + 1
    };
    if let Some(run_dir) = ctx.run_dir() {
        let dir = run_dir.join(GENERATIONS_DIR);
        let mut pictures = PictureFolder::new(
            dir.join("val_images"),
            format!("{GENERATIONS_DIR}/val_images/"),
        )?;
        let mut lines = String::new();
        for g in generations {
            let mut line =
                trajectory_line(&g.rollouts, g.row, g.score, &g.components, &mut pictures)?;
            line["step"] = serde_json::json!(step);
            lines.push_str(&serde_json::to_string(&line)?);
            lines.push('\n');
        }
        let path = dir.join(format!("val_step_{step:06}.jsonl"));
        std::fs::write(&path, lines).with_context(|| format!("writing {}", path.display()))?;
    }
    if ctx.wants_media() {
        for (k, g) in generations.iter().enumerate() {
            let (b, r) = (&g.rollouts, g.row);
            let prompt = &b.prompts.prompts[b.prompt_index[r]];
            let text: Vec<String> = prompt
                .messages
                .iter()
                .map(|m| format!("{}: {}", m.role, m.content))
                .collect();
            let components: Vec<String> = g
                .components
                .iter()
                .map(|(name, v)| format!("{name} {v:.3}"))
                .collect();
            ctx.log_text(
                format!("val/generations/{k}"),
                format!(
                    "**{}** · score {:.3} ({}) · ground truth `{}`\n\n**prompt**\n\n```\n{}\n```\n\n\
                     **response**\n\n```\n{}\n```",
                    b.data_source[r],
                    g.score,
                    components.join(", "),
                    b.ground_truth[r],
                    text.join("\n"),
                    b.response_text[r],
                ),
            );
            if let Some(picture) = prompt.pictures.first() {
                let mut png = Vec::new();
                picture
                    .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
                    .context("encoding a validation picture")?;
                ctx.log_image(
                    format!("val/generations/{k}/image"),
                    png,
                    picture.width(),
                    picture.height(),
                );
            }
        }
    }
    Ok(())
}

/// The scores a reward node gave the responses of `rollouts`, checked to be theirs in number.
fn checked_columns(scored: &ScoreBatch, rollouts: &RolloutBatch) -> Result<ScoreColumns> {
    scored.check()?;
    anyhow::ensure!(
        scored.rollouts.len() == rollouts.len(),
        "the reward node scored {} responses, eval handed it {}",
        scored.rollouts.len(),
        rollouts.len()
    );
    Ok(ScoreColumns::of_batch(scored))
}

/// `batch` in consecutive pieces of at most `size` prompts.
fn split(batch: &PromptBatch, size: usize) -> Vec<PromptBatch> {
    batch
        .prompts
        .chunks(size.max(1))
        .map(|c| PromptBatch {
            prompts: c.to_vec(),
            pad_token_id: batch.pad_token_id,
            image_token_id: batch.image_token_id,
            epoch: batch.epoch,
        })
        .collect()
}

flowrl_engine::register_node_kind!(EvalKind);
