//! The sizes of a `dataset.parquet` node's prompts as the plan sees them, from a sample of its
//! first training file ([`prompt_sizes`]).

use std::path::PathBuf;

use flowrl_datasets::PromptEncoder;
use flowrl_datasets::dataset::PromptSizes;
use flowrl_engine::NodeView;
use flowrl_models::hub::resolve_model_path;

use super::params::DatasetParams;

/// Rows of the first training file the plan encodes to size the prompts.
const SAMPLED_ROWS: usize = 256;

/// The sizes of the prompts of a dataset node `node` (a `dataset.parquet`: `path` or `paths`,
/// `model` or `model_dir`) from its first training file's first [`SAMPLED_ROWS`] rows, encoded
/// as the node encodes them; computed once per process for the same files and settings.
/// `None` when the node is of another kind or its rows cannot be encoded (its build will say
/// why).
pub(crate) fn prompt_sizes(node: &NodeView<'_>) -> Option<PromptSizes> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static SAMPLED: Mutex<Option<HashMap<String, Option<PromptSizes>>>> = Mutex::new(None);
    let p: DatasetParams = node.params().parse().ok()?;
    let dir = match (&p.model, &p.model_dir) {
        (Some(name), _) => {
            let view = node.resource(name)?;
            PathBuf::from(crate::kinds::validate::model_dir(view)?)
        }
        (None, Some(dir)) => resolve_model_path(dir).ok()?,
        (None, None) => return None,
    };
    let first = p.train_paths().into_iter().next()?;
    let options = p.options(0).ok()?;
    let key = format!(
        "{}|{}|{}|{}",
        first.display(),
        dir.display(),
        serde_json::to_string(&options.read).ok()?,
        p.max_prompt_length
    );
    let mut cache = SAMPLED.lock().unwrap_or_else(|e| e.into_inner());
    *cache
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert_with(|| {
            let encoder = PromptEncoder::from_model_dir(&dir).ok()?;
            flowrl_datasets::dataset::sample_sizes(&first, &encoder, &options, SAMPLED_ROWS).ok()
        })
}
