//! Facts the node kinds' `validate` hooks read from the graph before anything is loaded: a model
//! resource's context length (from its `config.json`) and the prompt length limit of the dataset
//! node upstream.

use std::path::Path;

use flowrl_engine::{ResourceView, ValidateCtx};

/// The directory of a model resource, following `from` copies to their source.
pub fn model_dir(view: ResourceView<'_>) -> Option<String> {
    let mut v = view;
    for _ in 0..16 {
        if let Some(p) = v.params().get_str("path") {
            return Some(p.to_string());
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
    let data = ctx.node()?.find_upstream(|k| k.starts_with("dataset"))?;
    let len = data.params().get_i64("max_prompt_length")?;
    Some((len as usize, format!("`{}.max_prompt_length`", data.name())))
}

/// Prompts per training batch upstream: a `filter.groups` node's `batch_size` when one sets it
/// (dynamic sampling), else the dataset node's `batch_size`.
pub fn upstream_batch_size(ctx: &ValidateCtx) -> Option<(usize, String)> {
    if let Some(filter) = ctx.node()?.find_upstream(|k| k == "filter.groups")
        && let Some(b) = filter.params().get_i64("batch_size")
    {
        return Some((b as usize, filter.name().to_string()));
    }
    dataset_batch_size(ctx)
}

/// `batch_size` of the dataset node upstream (prompts per generation batch).
pub fn dataset_batch_size(ctx: &ValidateCtx) -> Option<(usize, String)> {
    let data = ctx.node()?.find_upstream(|k| k.starts_with("dataset"))?;
    let b = data.params().get_i64("batch_size")?;
    Some((b as usize, data.name().to_string()))
}

/// `n` of the rollout node upstream.
pub fn upstream_rollout_n(ctx: &ValidateCtx) -> Option<usize> {
    let r = ctx.node()?.find_upstream(|k| k == "rollout")?;
    r.params().get_i64("n").map(|n| n as usize)
}
