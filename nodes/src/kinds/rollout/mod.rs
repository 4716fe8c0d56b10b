//! The `rollout` node kind: `n` sampled responses per prompt, generated in one batch with a KV
//! cache (`flowrl_models::generate`), on the model's non-autodiff view (no gradient graph).
//!
//! Responses are prompt-major (prompt i's samples are rows `i·n .. i·n + n`, verl's
//! `repeat(interleave=True)`) and share the prompt's uid (the GRPO group). The response mask is 1
//! for every generated token, EOS included (verl keeps the EOS in the response). The batch is
//! padded to the longest response of the step. The vision tokens (image, video) are suppressed
//! during sampling (a response cannot carry vision features).
//!
//! Metrics (verl's names): `response_length/mean|max|min`, `response_length/clip_ratio` (share of
//! responses cut at `max_new_tokens`), `prompt_length/mean|max`. Timing key: `gen`.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use flowrl_engine::{
    BuildContext, Diagnostic, Footprint, Inputs, Item, Node, NodeKind, Outputs, ParamSchema,
    ParamSpec, Params, Place, PlanCtx, Port, PortSpec, StepContext, ValidateCtx,
};
use flowrl_models::generate::{
    GenerationConfig, ModelParts, PromptInput, generate, prompts_per_prefill, reserved_positions,
    rows_per_budget,
};
use flowrl_models::sampling::SamplingConfig;
use serde::Deserialize;

use rand::Rng;

use crate::kinds::validate::{model_context_length, upstream_prompt_length};
use crate::resources::model::ModelResource;
use crate::runtime::backend::{FlowBackend, on_backend};
use crate::runtime::data_parallel::{Replicas, shard};
use crate::sizing::{PlannedModel, Prompts, compute_view_item, logit_bytes, planned_prompts};
use crate::values::{PromptBatch, RolloutBatch, TokenMatrix, port_types};

pub mod multi_turn;

/// The `rollout` kind.
pub struct RolloutKind;

const PROMPTS: Port<PromptBatch> = Port::new("prompts", port_types::PROMPTS);
const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);

/// Parameters of [`RolloutKind`] (verl's `actor_rollout_ref.rollout.*` names where they exist).
#[derive(Debug, Clone, Deserialize, Params)]
pub struct RolloutParams {
    /// the policy to sample from
    #[param(resource = "model", required)]
    pub model: String,
    /// responses per prompt (the GRPO group size)
    #[param(default = 1, min = 1.0)]
    pub n: usize,
    /// argmax decoding instead of sampling
    #[param(default = false)]
    pub greedy: bool,
    /// maximum response length in tokens (verl: response_length)
    #[param(required, min = 1.0)]
    pub max_new_tokens: usize,
    /// sampling temperature
    #[param(default = 1.0, gt = 0.0)]
    pub temperature: f64,
    /// nucleus mass; 1 = off
    #[param(default = 1.0, gt = 0.0, max = 1.0)]
    pub top_p: f64,
    /// keep the k most likely tokens; -1 or 0 = off
    #[param(default = -1, min = -1.0)]
    pub top_k: i64,
    /// extra stop tokens (each must be one token of the tokenizer), besides the model's EOS
    #[serde(default)]
    pub stop: Vec<String>,
    /// device memory (GiB) the KV cache of the rows decoded together may take; the rows are
    /// generated in chunks that fit
    #[param(default = KV_CACHE_GIB, gt = 0.0)]
    pub kv_cache_gib: f64,
    /// padded prompt tokens per prefill forward pass (verl/vLLM: max_num_batched_tokens)
    #[param(default = MAX_NUM_BATCHED_TOKENS, min = 1.0)]
    pub max_num_batched_tokens: usize,
}

/// Default of `kv_cache_gib`: with the weights and the training state of a 3B policy resident,
/// what one 80–141 GB GPU has left (docs/gpu.md).
pub const KV_CACHE_GIB: f64 = 32.0;
/// Default of `max_num_batched_tokens` (verl's default).
pub const MAX_NUM_BATCHED_TOKENS: usize = 8192;

impl RolloutParams {
    /// Greedy decoding of one response per prompt, at most `max_new_tokens`, from `model`, with
    /// the declared defaults of every other parameter (how `eval` and a writing judge generate).
    pub fn greedy(model: &str, max_new_tokens: usize) -> RolloutParams {
        let mut values: serde_json::Map<String, serde_json::Value> = Self::param_specs()
            .into_iter()
            .filter_map(|s| Some((s.name, s.default?)))
            .collect();
        values.insert("model".into(), model.into());
        values.insert("max_new_tokens".into(), max_new_tokens.into());
        values.insert("greedy".into(), true.into());
        Params::from_map(values)
            .parse()
            .expect("the rollout's declared defaults parse")
    }

    /// The sampling part.
    pub fn sampling(&self) -> SamplingConfig {
        SamplingConfig {
            greedy: self.greedy,
            temperature: self.temperature as f32,
            top_k: self.top_k.max(0) as usize,
            top_p: self.top_p as f32,
        }
    }
}

/// Checks the context-length arithmetic of a generating node: prompt length + `max_new`, its
/// `max_new_tokens`.
pub fn validate_generation(ctx: &ValidateCtx, max_new: usize) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let Some((context, model_desc)) = model_context_length(ctx, "model") else {
        return out;
    };
    let (prompt, prompt_desc) = upstream_prompt_length(ctx).unwrap_or((0, String::new()));
    let total = prompt + max_new;
    if total > context {
        let msg = if prompt > 0 {
            format!(
                "{prompt_desc} {prompt} + max_new_tokens {max_new} = {total} exceeds the context of {model_desc}: {context} tokens"
            )
        } else {
            format!(
                "max_new_tokens {max_new} exceeds the context of {model_desc}: {context} tokens"
            )
        };
        out.push(ctx.error("max_new_tokens", msg));
    }
    out
}

impl NodeKind for RolloutKind {
    fn name(&self) -> &str {
        "rollout"
    }

    fn doc(&self) -> &str {
        "Samples `n` responses per prompt with a KV cache (temperature, top-p, top-k, EOS and stop \
         tokens); responses of one prompt share its group uid. No gradients are tracked."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![PROMPTS.spec().doc("tokenized prompts")]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        vec![
            ROLLOUTS
                .spec()
                .doc("responses, masks, sampling log-probs, group uids"),
        ]
    }

    fn params(&self) -> Vec<ParamSpec> {
        RolloutParams::param_specs()
    }

    fn timing_key(&self) -> Option<&str> {
        Some("gen")
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        match ctx.parse::<RolloutParams>() {
            Ok(p) => validate_generation(ctx, p.max_new_tokens),
            Err(d) => d,
        }
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn capabilities(&self) -> Vec<flowrl_engine::Capability> {
        vec![crate::kinds::validate::GENERATES_ROLLOUTS]
    }

    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        rollout_footprint(ctx, &ctx.parse::<RolloutParams>().ok()?)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: RolloutParams = params.parse()?;
        p.sampling().validate()?;
        let model = ctx.resource::<ModelResource>(&p.model)?;
        let stop_ids = stop_token_ids(&model, &p.stop)?;
        Ok(Box::new(RolloutNode {
            replicas: Replicas::new(&ctx.placement, &ctx.node)?,
            params: p,
            model,
            stop_ids,
        }))
    }
}

/// The footprint of a rollout with `p`: its generation over the upstream prompts.
pub(crate) fn rollout_footprint(ctx: &PlanCtx, p: &RolloutParams) -> Option<Footprint> {
    let mut f = Footprint::default();
    let Some((m, prompts)) = planned_prompts(ctx, &mut f) else {
        return Some(f);
    };
    generation_footprint(&mut f, &m, ctx, Generation::of(p, prompts));
    Some(f)
}

/// What a generating node asks of [`generate`], for its footprint.
pub(crate) struct Generation {
    /// The prompts of a generation batch (all replicas together) and their sizes.
    pub prompts: Prompts,
    pub n: usize,
    pub max_new_tokens: usize,
    pub cache_budget: Option<u64>,
    pub prefill_tokens: Option<usize>,
}

impl Generation {
    /// What a rollout with `params` asks of [`generate`] for `prompts`: the budgets
    /// [`sample_rollouts`] gives it.
    pub(crate) fn of(params: &RolloutParams, prompts: Prompts) -> Self {
        Generation {
            prompts,
            n: params.n,
            max_new_tokens: params.max_new_tokens,
            cache_budget: Some(gib_bytes(params.kv_cache_gib)),
            prefill_tokens: Some(params.max_num_batched_tokens),
        }
    }
}

/// `GiB` as bytes.
pub(crate) fn gib_bytes(gib: f64) -> u64 {
    (gib * (1u64 << 30) as f64) as u64
}

/// The buffers of [`generate`] per replica, with the chunking it does: rows in chunks whose
/// reserved KV cache fits the budget ([`rows_per_budget`] of
/// [`flowrl_models::generate::cache_bytes_per_row`]'s product), distinct prompts prefilled
/// [`prompts_per_prefill`] at a time. Phases: `prefill` (one forward's activations and vision
/// pass, the distinct prompts' cache) and `decode` (the chunk's reserved cache, a step's logits
/// and activations).
pub(crate) fn generation_footprint(
    f: &mut Footprint,
    m: &PlannedModel,
    ctx: &PlanCtx,
    g: Generation,
) {
    let device = ctx.device();
    let len = g.prompts.len;
    let prompts = g.prompts.per_step.div_ceil(ctx.replicas().max(1));
    let rows = prompts * g.n;
    let s = &m.shape;
    let reserved = reserved_positions(len, g.max_new_tokens);
    let row_bytes = s.kv_cache_bytes_per_token * reserved as u64;
    let chunk = g
        .cache_budget
        .map_or(rows, |b| rows_per_budget(row_bytes, b))
        .min(rows)
        .max(1);
    let distinct = chunk.div_ceil(g.n).min(prompts).max(1);
    let per_forward = prompts_per_prefill(g.prefill_tokens, len, distinct).min(distinct);
    let view = compute_view_item(m);
    let prompt_cache = (distinct * len) as u64 * s.kv_cache_bytes_per_token;
    let mut prefill = vec![
        Item::new(
            format!(
                "prefill activations ({per_forward} prompts × {len} tokens, {})",
                g.prompts.source()
            ),
            (per_forward * len) as u64 * m.forward_bytes_per_token(len, device),
            Place::Device,
        )
        .hint("lower max_num_batched_tokens on the rollout"),
        Item::new(
            "vision tower pass",
            m.vision_bytes(per_forward, &g.prompts, device, false),
            Place::Device,
        ),
        Item::new(
            format!("KV cache of {distinct} distinct prompts"),
            prompt_cache,
            Place::Device,
        ),
    ];
    prefill.extend(view.clone());
    prefill.extend(crate::sizing::replica_weights(m));
    let mut decode = vec![
        Item::new(
            format!("KV cache ({chunk} rows × {reserved} positions)"),
            chunk as u64 * row_bytes,
            Place::Device,
        )
        .hint("lower kv_cache_gib on the rollout (its rows then decode in smaller chunks)"),
        Item::new(
            format!("KV cache of {distinct} distinct prompts (repeated n times)"),
            prompt_cache,
            Place::Device,
        ),
        Item::new(
            "a decoding step's logits and activations",
            chunk as u64
                * (logit_bytes(1, 1, s.vocab, 2)
                    + m.forward_bytes_per_token(len + g.max_new_tokens, device)),
            Place::Device,
        ),
    ];
    decode.extend(view);
    decode.extend(crate::sizing::replica_weights(m));
    f.phase("prefill", prefill);
    f.phase("decode", decode);
    let all_prompts = g.prompts.per_step as u64;
    let generated = all_prompts * g.n as u64 * g.max_new_tokens as u64;
    f.flops = m.forward_flops(all_prompts * len as u64, len, 0)
        + m.vision_flops(g.prompts.per_step, &g.prompts)
        + m.forward_flops(generated, len + g.max_new_tokens / 2, generated);
    f.flops_precision = Some(m.precision_name().into());
}

/// Token ids of stop strings (each must be a single token).
pub fn stop_token_ids(model: &ModelResource, stop: &[String]) -> Result<Vec<u32>> {
    if stop.is_empty() {
        return Ok(Vec::new());
    }
    let tok = model.tokenizer()?;
    stop.iter()
        .map(|s| {
            tok.token_to_id(s).with_context(|| {
                format!(
                    "stop token `{s}` is not a single token of the tokenizer of model `{}`",
                    model.name
                )
            })
        })
        .collect()
}

struct RolloutNode {
    replicas: Replicas,
    params: RolloutParams,
    model: Arc<ModelResource>,
    stop_ids: Vec<u32>,
}

impl Node for RolloutNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let prompts = inputs.get_arc(PROMPTS)?;
        let rollouts = sample_rollouts(
            &self.model,
            &prompts,
            &self.params,
            &self.stop_ids,
            &self.replicas,
            ctx,
        )?;
        record_length_metrics(&rollouts, self.params.max_new_tokens, ctx);
        Ok(Outputs::new().with(ROLLOUTS, rollouts))
    }
}

/// Generates `params.n` responses per prompt (see the module doc), the prompts split over
/// `replicas` ([`crate::runtime::data_parallel`]): [`sample_rollouts_seeded`] with one draw of the step's
/// RNG as the base seed.
pub fn sample_rollouts(
    model: &ModelResource,
    prompts: &Arc<PromptBatch>,
    params: &RolloutParams,
    stop_ids: &[u32],
    replicas: &Replicas,
    ctx: &mut StepContext,
) -> Result<RolloutBatch> {
    let base_seed: u64 = ctx.rng().random();
    sample_rollouts_seeded(model, prompts, params, stop_ids, replicas, base_seed)
}

/// [`sample_rollouts`] outside a graph step (`flowrl generate`): response `r` (prompt `r / n`,
/// sample `r % n`) draws with its own seed, derived from `base_seed` and `r`
/// ([`flowrl_models::sampling::uniform`]), so the responses do not depend on how the batch is
/// split. Greedy decoding draws nothing.
pub fn sample_rollouts_seeded(
    model: &ModelResource,
    prompts: &Arc<PromptBatch>,
    params: &RolloutParams,
    stop_ids: &[u32],
    replicas: &Replicas,
    base_seed: u64,
) -> Result<RolloutBatch> {
    ensure!(!prompts.is_empty(), "the prompt batch is empty");
    on_backend!(model.backend(), B => {
        sample_on::<B>(model, prompts, params, stop_ids, replicas, base_seed)
    })
}

/// [`sample_rollouts_seeded`] on the model's backend `B`.
fn sample_on<B: FlowBackend>(
    model: &ModelResource,
    prompts: &Arc<PromptBatch>,
    params: &RolloutParams,
    stop_ids: &[u32],
    replicas: &Replicas,
    base_seed: u64,
) -> Result<RolloutBatch> {
    let n = params.n;
    let tokenizer = model.tokenizer()?.clone();
    let b = prompts.len() * n;
    // A gathered row: [length, stopped, tokens (max_new_tokens), log-probs (max_new_tokens)];
    // token ids are exact in f32 below 2^24.
    let max_new = params.max_new_tokens;
    let width = 2 + 2 * max_new;
    let gathered = replicas.run(|r| {
        let (infer, device) = model.inference_model_on::<B>(replicas, r.local_index)?;
        let parts = ModelParts::of(&infer);
        let config = GenerationConfig {
            max_new_tokens: params.max_new_tokens,
            sampling: params.sampling(),
            stop_token_ids: stop_ids.to_vec(),
            pad_token_id: prompts.pad_token_id,
            suppress_token_ids: parts
                .vision
                .map(|v| v.vision_token_ids())
                .unwrap_or_default(),
            cache_budget: Some(gib_bytes(params.kv_cache_gib)),
            prefill_tokens: Some(params.max_num_batched_tokens),
        };
        let mut rows = Vec::new();
        let mut inputs = Vec::new();
        let mut seeds = Vec::new();
        for i in shard(prompts.len(), r.world, r.index) {
            let p = &prompts.prompts[i];
            for j in 0..n {
                rows.push(i * n + j);
                inputs.push(PromptInput {
                    ids: &p.input_ids,
                    images: &p.images,
                });
                seeds.push(row_seed(base_seed, i * n + j));
            }
        }
        let generation = generate(&parts, &inputs, &config, &seeds, &device)
            .with_context(|| format!("rollout of model `{}`", model.name))?;
        let encoded = rows.iter().enumerate().map(|(k, &row)| {
            let mut v = vec![0.0f32; width];
            let tokens = &generation.tokens[k];
            v[0] = tokens.len() as f32;
            v[1] = f32::from(u8::from(generation.stopped[k]));
            for (t, &id) in tokens.iter().enumerate() {
                v[2 + t] = id as f32;
            }
            v[2 + max_new..2 + max_new + tokens.len()].copy_from_slice(&generation.log_probs[k]);
            (row, v)
        });
        r.gather_rows(b, width, encoded)
    })?;
    let all = &gathered[0];

    let mut tokens = Vec::with_capacity(b);
    let mut log_probs = Vec::with_capacity(b);
    let mut stopped = Vec::with_capacity(b);
    for r in 0..b {
        let v = &all[r * width..(r + 1) * width];
        let len = v[0] as usize;
        tokens.push(
            v[2..2 + len]
                .iter()
                .map(|&x| x as u32)
                .collect::<Vec<u32>>(),
        );
        log_probs.push(&v[2 + max_new..2 + max_new + len]);
        stopped.push(v[1] > 0.5);
    }
    let t = tokens.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut mask = TokenMatrix::zeros(b, t);
    let mut logps = TokenMatrix::zeros(b, t);
    let mut texts = Vec::with_capacity(b);
    for r in 0..b {
        let len = tokens[r].len();
        mask.row_mut(r)[..len].fill(1.0);
        logps.row_mut(r)[..len].copy_from_slice(log_probs[r]);
        texts.push(
            tokenizer
                .decode(&tokens[r], true)
                .map_err(|e| anyhow::anyhow!("decoding response {r}: {e}"))?,
        );
    }
    let prompt_index = (0..b).map(|r| r / n).collect();
    let rollouts = RolloutBatch::for_prompts(
        prompts.clone(),
        prompt_index,
        tokens,
        mask,
        logps,
        texts,
        stopped.iter().map(|s| !s).collect(),
    );
    rollouts.check()?;
    Ok(rollouts)
}

/// The seed of response `row` in a step whose RNG drew `base`.
fn row_seed(base: u64, row: usize) -> u64 {
    flowrl_engine::derive_seed(base, row as u64, "rollout.row")
}

/// verl's response/prompt length metrics.
pub fn record_length_metrics(r: &RolloutBatch, max_new_tokens: usize, ctx: &mut StepContext) {
    let lens = r.response_lengths();
    if lens.is_empty() {
        return;
    }
    let b = lens.len() as f64;
    ctx.metric(
        "response_length/mean",
        lens.iter().sum::<usize>() as f64 / b,
    );
    ctx.metric("response_length/max", *lens.iter().max().unwrap() as f64);
    ctx.metric("response_length/min", *lens.iter().min().unwrap() as f64);
    let clipped = lens.iter().filter(|&&l| l >= max_new_tokens).count();
    ctx.metric("response_length/clip_ratio", clipped as f64 / b);
    if clipped == lens.len() {
        ctx.warn(format!(
            "every response of this step ({clipped}) was cut at max_new_tokens = {max_new_tokens}: \
             no answer finishes, so the rewards score unfinished text; raise max_new_tokens \
             (verl: data.max_response_length)"
        ));
    }
    let plens: Vec<usize> = r.prompt_ids.iter().map(Vec::len).collect();
    ctx.metric("prompt_length/mean", plens.iter().sum::<usize>() as f64 / b);
    ctx.metric("prompt_length/max", *plens.iter().max().unwrap() as f64);
}

flowrl_engine::register_node_kind!(RolloutKind);

#[cfg(test)]
mod tests {
    use super::*;

    /// The greedy rollout sets its model, length and greedy decoding, and takes every other
    /// parameter from the declared defaults.
    #[test]
    fn the_greedy_rollout_takes_the_declared_defaults() {
        let p = RolloutParams::greedy("judge", 7);
        assert_eq!(
            (p.model.as_str(), p.n, p.max_new_tokens, p.greedy),
            ("judge", 1, 7, true)
        );
        assert_eq!((p.temperature, p.top_p, p.top_k), (1.0, 1.0, -1));
        assert!(p.stop.is_empty());
        assert_eq!(
            (p.kv_cache_gib, p.max_num_batched_tokens),
            (KV_CACHE_GIB, MAX_NUM_BATCHED_TOKENS)
        );
    }
}
