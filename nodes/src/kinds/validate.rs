//! Facts the node kinds' `validate` hooks read from the graph before anything is loaded: a model
//! resource's context length (from its `config.json`) and the prompt length limit of the dataset
//! node upstream.
//!
//! The hooks find their neighbours by what those declare, never by kind name: the capabilities
//! below, each a promise about the declaring kind's parameters, which a hook reads through the
//! struct next to it ([`RolloutSampling`], [`PromptSource`], [`DynamicSampling`]), so any kind
//! that declares one (a plugin's included) is checked like the built-in one.

use std::path::Path;

use flowrl_engine::{Capability, NodeView, ResourceView, ValidateCtx};
use serde::Deserialize;

/// A kind that samples responses to its prompts (`rollout`): its parameters include `n`
/// (responses per prompt), `greedy` (a boolean: argmax decoding) and `max_new_tokens` (the
/// longest response), read as [`RolloutSampling`].
pub const GENERATES_ROLLOUTS: Capability = Capability::new("generates_rollouts");

/// A kind that emits a batch of training prompts per step (`dataset.parquet`): its parameters
/// include `batch_size` (prompts per step) and `max_prompt_length` (prompt tokens), read as
/// [`PromptSource`].
pub const PROMPT_SOURCE: Capability = Capability::new("prompt_source");

/// A kind that keeps generating batches until enough prompt groups pass a filter
/// (`filter.groups`, DAPO's dynamic sampling): its parameters include an optional `batch_size`,
/// the groups (prompts) per training batch, read as [`DynamicSampling`].
pub const DYNAMIC_SAMPLING: Capability = Capability::new("dynamic_sampling");

/// The parameters that [`GENERATES_ROLLOUTS`] promises (each `None` when the kind leaves it
/// unset).
#[derive(Debug, Clone, Deserialize)]
pub struct RolloutSampling {
    pub n: Option<usize>,
    pub greedy: Option<bool>,
    pub max_new_tokens: Option<usize>,
}

/// The parameters that [`PROMPT_SOURCE`] promises.
#[derive(Debug, Clone, Deserialize)]
pub struct PromptSource {
    pub batch_size: Option<usize>,
    pub max_prompt_length: Option<usize>,
}

/// The parameters that [`DYNAMIC_SAMPLING`] promises.
#[derive(Debug, Clone, Deserialize)]
pub struct DynamicSampling {
    pub batch_size: Option<usize>,
}

/// The first node upstream of `view` (itself included) that declares [`GENERATES_ROLLOUTS`], with
/// its sampling parameters.
pub fn rollout_upstream<'a>(view: &NodeView<'a>) -> Option<(NodeView<'a>, RolloutSampling)> {
    let r = view.find_upstream_with(GENERATES_ROLLOUTS)?;
    Some((r, r.params().parse().ok()?))
}

/// The first node upstream of `view` (itself included) that declares [`PROMPT_SOURCE`], with
/// its parameters.
pub fn prompt_source_upstream<'a>(view: &NodeView<'a>) -> Option<(NodeView<'a>, PromptSource)> {
    let d = view.find_upstream_with(PROMPT_SOURCE)?;
    Some((d, d.params().parse().ok()?))
}

/// The directory of a model resource, following `from` copies to their source (a hub id
/// resolved through the local cache; as written when it is not there).
pub fn model_dir(view: ResourceView<'_>) -> Option<String> {
    let mut v = view;
    for _ in 0..16 {
        if let Some(p) = v.params().get_str("path") {
            return Some(match flowrl_models::hub::resolve_model_path(Path::new(p)) {
                Ok(dir) => dir.display().to_string(),
                Err(_) => p.to_string(),
            });
        }
        v = v.follow("from")?;
    }
    None
}

/// `max_position_embeddings` of a Hugging Face `config.json` (flat or under `text_config`).
pub fn context_length_of(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("text_config")
        .and_then(|t| t.get("max_position_embeddings"))
        .or_else(|| json.get("max_position_embeddings"))
        .and_then(|v| v.as_u64())
        .map(|v| v as usize)
}

/// The context length of the model named by resource parameter `key`, with a description for
/// messages (`model `policy` (assets/x/config.json max_position_embeddings)`).
pub fn model_context_length(ctx: &ValidateCtx, key: &str) -> Option<(usize, String)> {
    let view = ctx.resource_param(key)?;
    let dir = model_dir(view)?;
    let len = context_length_of(Path::new(&dir))?;
    Some((
        len,
        format!(
            "model `{}` ({dir}/config.json max_position_embeddings)",
            view.name()
        ),
    ))
}

/// `max_prompt_length` of the dataset node upstream of the node being validated.
pub fn upstream_prompt_length(ctx: &ValidateCtx) -> Option<(usize, String)> {
    let (data, p) = prompt_source_upstream(&ctx.node()?)?;
    let len = p.max_prompt_length?;
    Some((len, format!("`{}.max_prompt_length`", data.name())))
}

/// Prompts per training batch upstream: a `filter.groups` node's `batch_size` when one sets it
/// (dynamic sampling), else the dataset node's `batch_size`.
pub fn upstream_batch_size(ctx: &ValidateCtx) -> Option<(usize, String)> {
    if let Some(filter) = ctx.node()?.find_upstream_with(DYNAMIC_SAMPLING)
        && let Ok(DynamicSampling {
            batch_size: Some(b),
        }) = filter.params().parse()
    {
        return Some((b, filter.name().to_string()));
    }
    dataset_batch_size(ctx)
}

/// `batch_size` of the dataset node upstream (prompts per generation batch).
pub fn dataset_batch_size(ctx: &ValidateCtx) -> Option<(usize, String)> {
    let (data, p) = prompt_source_upstream(&ctx.node()?)?;
    Some((p.batch_size?, data.name().to_string()))
}

/// `n` of the rollout node upstream.
pub fn upstream_rollout_n(ctx: &ValidateCtx) -> Option<usize> {
    rollout_upstream(&ctx.node()?)?.1.n
}
