//! The `dataset.parquet` node kind: verl-format prompt files → one [`PromptBatch`] per step.
//!
//! ```toml
//! [nodes.data]
//! kind = "dataset.parquet"
//! path = "datasets/shapes/train.parquet"     # or paths = ["a.parquet", "b.parquet"]
//! val_path = "datasets/shapes/test.parquet"  # optional: the whole split on `val_prompts`
//! model = "policy"                           # template, tokenizer and image processor
//! batch_size = 8
//! max_prompt_length = 256
//! ```
//!
//! Everything about reading, encoding, filtering, truncation, shuffling and epochs is
//! `flowrl_datasets` ([`PromptDataset`]); this file maps graph parameters to it (verl's `data.*`
//! names), loads everything at build time (so bad rows fail before step 0), and saves the
//! data position (epoch, cursor, seed) as the node's state so that a resumed run sees the same
//! next batch. Metrics: `training/epoch`, `data/filtered_overlong`, `data/truncated`,
//! `data/skipped_mismatched` and `data/skipped_bad` (counts of the load, reported at the run's
//! first step, not again by a resumed process).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use flowrl_datasets::{DataPosition, PromptDataset, PromptEncoder};
use flowrl_engine::{
    BuildContext, Capability, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec,
    Params, Payload, Port, PortSpec, StepContext, ValidateCtx, Value,
};
use flowrl_engine::{Footprint, Item, Place, PlanCtx};
use flowrl_models::hub::resolve_model_path;

use crate::sizing::{PlannedModel, Prompts};

use super::params::DatasetParams;
use crate::kinds::validate::PROMPT_SOURCE;
use crate::resources::model::ModelResource;
use crate::values::{PromptBatch, port_types};

/// The `dataset.parquet` kind.
pub struct DatasetParquet;

/// The step's training prompts.
const PROMPTS: Port<PromptBatch> = Port::new("prompts", port_types::PROMPTS);
/// The whole validation split.
const VAL_PROMPTS: Port<PromptBatch> = Port::new("val_prompts", port_types::PROMPTS);

impl NodeKind for DatasetParquet {
    fn name(&self) -> &str {
        "dataset.parquet"
    }

    fn doc(&self) -> &str {
        "Reads verl-format prompt parquet files (prompt messages, images, reward_model.ground_truth, \
         data_source), renders the model's chat template, tokenizes, expands image tokens, filters or \
         truncates long prompts, and emits `batch_size` shuffled prompts per step, epoch after epoch."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }

    fn outputs(&self) -> Vec<PortSpec> {
        vec![
            PROMPTS.spec().doc("the step's batch of training prompts"),
            VAL_PROMPTS
                .spec()
                .doc("every prompt of `val_path`, in file order (only with `val_path`)"),
        ]
    }

    fn params(&self) -> Vec<ParamSpec> {
        DatasetParams::param_specs()
    }

    fn capabilities(&self) -> Vec<Capability> {
        vec![PROMPT_SOURCE]
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        let p = match ctx.parse::<DatasetParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        match (p.path.is_some(), p.paths.is_some()) {
            (true, true) => out.push(ctx.error("paths", "give either `path` or `paths`, not both")),
            (false, false) => out.push(ctx.error(
                "path",
                "no training data: set `path = \"train.parquet\"` or `paths = [...]`",
            )),
            _ => {}
        }
        match (p.model.is_some(), p.model_dir.is_some()) {
            (true, true) => out.push(ctx.error("model_dir", "give either `model` or `model_dir`, not both")),
            (false, false) => out.push(ctx.error(
                "model",
                "the prompts need a chat template and tokenizer: set `model = \"policy\"` or `model_dir = \"...\"`",
            )),
            _ => {}
        }
        if let Some(dir) = &p.model_dir {
            match resolve_model_path(dir) {
                Err(e) => out.push(ctx.error("model_dir", format!("{e:#}"))),
                Ok(dir) if !dir.is_dir() => {
                    out.push(ctx.error("model_dir", format!("`{}` does not exist", dir.display())))
                }
                Ok(_) => {}
            }
        }
        let mut files: Vec<(&str, &PathBuf)> = [("path", &p.path), ("val_path", &p.val_path)]
            .into_iter()
            .filter_map(|(key, f)| Some((key, f.as_ref()?)))
            .collect();
        files.extend(p.paths.iter().flatten().map(|f| ("paths", f)));
        for (key, f) in files {
            if !f.exists() {
                out.push(ctx.error(key, format!("`{}` does not exist", f.display())));
            }
        }
        out
    }

    /// On the host: the rows read at build time (their encoded images, text and token ids:
    /// [`RECORD_EXPANSION`] × the files' sizes, and [`ROW_STRUCTURES`] per row), a batch's pixel values and the validation
    /// split's, sized from the first rows of the data ([`prompt_sizes`]).
    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let p = ctx.parse::<DatasetParams>().ok()?;
        let mut f = Footprint::default();
        let files: Vec<PathBuf> = p
            .train_paths()
            .into_iter()
            .chain(p.val_path.clone())
            .collect();
        let bytes: u64 = files
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum();
        let rows: u64 = files
            .iter()
            .filter_map(|f| flowrl_datasets::verl::summarize_file(f).ok())
            .map(|s| s.num_rows as u64)
            .sum();
        f.resident(Item::new(
            format!("{rows} rows read at build (images encoded, text, token ids)"),
            bytes * RECORD_EXPANSION + rows * ROW_STRUCTURES,
            Place::Host,
        ));
        let sizes = p
            .model
            .as_deref()
            .and_then(|m| ctx.shape::<PlannedModel>(m))
            .and_then(|m| Prompts::upstream(ctx, &m));
        let Some(sizes) = sizes else {
            f.not_sized("the prompts' pixel values (no `model` resource to size them with)");
            return Some(f);
        };
        let pixels = |prompts: usize| (prompts * sizes.pixel_values * 4) as u64;
        f.resident(
            Item::new(
                format!(
                    "a batch's pixel values (f32, {} a prompt, {})",
                    sizes.pixel_values,
                    sizes.source()
                ),
                pixels(p.batch_size),
                Place::Host,
            )
            .hint("lower batch_size on the dataset"),
        );
        if let Some(val) = &p.val_path {
            let rows = flowrl_datasets::verl::summarize_file(val).map_or(0, |s| s.num_rows);
            f.resident(Item::new(
                format!("the validation split's pixel values ({rows} prompts, f32)"),
                pixels(rows),
                Place::Host,
            ));
            // Building the split's one batch copies every prompt's pixel values once more.
            f.phase(
                "build",
                vec![Item::new(
                    "the validation split's batch, being built",
                    pixels(rows),
                    Place::Host,
                )],
            );
        }
        Some(f)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        Ok(Box::new(build_node(params, ctx)?))
    }
}

/// Host bytes a row read at build time takes per byte of its parquet file (the encoded images as
/// stored, the rendered text and the token ids).
const RECORD_EXPANSION: u64 = 2;
/// Host bytes of a row's parsed structures besides (its messages, `extra_info` as JSON, its
/// source file and row, the allocations' headers).
const ROW_STRUCTURES: u64 = 4 << 10;

/// Loads the training (and validation) data: all reading and encoding happens here.
fn build_node(params: &Params, ctx: &BuildContext) -> Result<DatasetNode> {
    let p: DatasetParams = params.parse()?;
    let dir = match (&p.model, &p.model_dir) {
        (Some(name), _) => ctx.resource::<ModelResource>(name)?.dir.clone(),
        (None, Some(dir)) => {
            resolve_model_path(dir).with_context(|| format!("node `{}`: model_dir", ctx.node))?
        }
        (None, None) => bail!("dataset.parquet needs `model` or `model_dir`"),
    };
    let encoder = Arc::new(PromptEncoder::from_model_dir(&dir).with_context(|| {
        format!(
            "node `{}`: loading the prompt encoder of {}",
            ctx.node,
            dir.display()
        )
    })?);
    let options = p.options(p.seed.unwrap_or(ctx.seed))?;
    let train = PromptDataset::load(&p.train_paths(), encoder.clone(), options.clone())?;
    anyhow::ensure!(
        train.len() >= options.batch_size,
        "node `{}`: {} prompts are left after loading (filtered as overlong: {}, skipped as mismatched: {}, \
             skipped as bad: {}), fewer than batch_size {}",
        ctx.node,
        train.len(),
        train.report().filtered_overlong,
        train.report().skipped_mismatched.len(),
        train.report().skipped_bad.len(),
        options.batch_size
    );
    let val = match &p.val_path {
        Some(path) => {
            let mut vo = options.clone();
            vo.shuffle = false;
            let ds = PromptDataset::load(std::slice::from_ref(path), encoder, vo)?;
            // One batch holding the whole split, built once and shared by every step.
            let mut all = PromptBatch {
                prompts: Vec::with_capacity(ds.len()),
                pad_token_id: 0,
                image_token_id: None,
                epoch: 0,
            };
            for b in ds.eval_batches() {
                let b = b?;
                all.pad_token_id = b.pad_token_id;
                all.image_token_id = b.image_token_id;
                all.prompts.extend(b.prompts);
            }
            Some(Value::new(VAL_PROMPTS.port_type(), Payload::new(all)))
        }
        None => None,
    };
    Ok(DatasetNode {
        train,
        val,
        reported: false,
        restored: false,
    })
}

struct DatasetNode {
    train: PromptDataset,
    val: Option<Value>,
    reported: bool,
    /// Restored from a checkpoint: the run's first step already reported the load.
    restored: bool,
}

impl DatasetNode {
    fn next_batch(&mut self) -> Result<PromptBatch> {
        self.train.next_batch()
    }
}

impl Node for DatasetNode {
    fn run(&mut self, _inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        if !self.reported {
            let r = self.train.report();
            // The run's first step reports the load; a resumed process only warns again, so
            // its metrics.jsonl continues the uninterrupted run's line for line.
            if !self.restored {
                ctx.metric("data/filtered_overlong", r.filtered_overlong as f64);
                ctx.metric("data/truncated", r.truncated as f64);
                ctx.metric("data/skipped_mismatched", r.skipped_mismatched.len() as f64);
                ctx.metric("data/skipped_bad", r.skipped_bad.len() as f64);
            }
            for s in r.skipped_mismatched.iter().chain(&r.skipped_bad).take(3) {
                ctx.warn(format!(
                    "skipped {} row {}: {}",
                    s.source.file.display(),
                    s.source.row,
                    s.reason
                ));
            }
            self.reported = true;
        }
        let batch = self.next_batch()?;
        ctx.metric("training/epoch", batch.epoch as f64);
        let mut out = Outputs::new().with(PROMPTS, batch);
        if let Some(v) = &self.val {
            out = out.with_value(VAL_PROMPTS.name(), v);
        }
        Ok(out)
    }

    /// Before training only the validation prompts: the training data does not move.
    fn before_train(&mut self, _inputs: &Inputs, _ctx: &mut StepContext) -> Result<Outputs> {
        Ok(match &self.val {
            Some(v) => Outputs::new().with_value(VAL_PROMPTS.name(), v),
            None => Outputs::skipped(),
        })
    }

    fn runs_before_train(&self) -> bool {
        self.val.is_some()
    }

    fn save_state(&self) -> Result<Option<serde_json::Value>> {
        Ok(Some(serde_json::to_value(self.train.position())?))
    }

    fn load_state(&mut self, state: serde_json::Value) -> Result<()> {
        let position: DataPosition = serde_json::from_value(state)
            .context("dataset.parquet: reading the saved data position")?;
        self.restored = true;
        self.train.set_position(position)
    }
}

flowrl_engine::register_node_kind!(DatasetParquet);

#[cfg(test)]
mod tests {
    use super::*;
    use flowrl_engine::{DeviceSpec, Resources};

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// The shapes test split read as text-only data, encoded with the tiny tokenizer's template.
    fn params(extra: serde_json::Value) -> Params {
        let mut v = serde_json::json!({
            "path": root().join("datasets/shapes/test.parquet"),
            "model_dir": root().join("assets/tokenizer"),
            "batch_size": 4,
            "shuffle": true,
            "seed": 3,
            "max_prompt_length": 128,
            "truncation": "error",
            "filter_overlong_prompts": true,
            "prompt_key": "prompt",
            "image_key": "",
            "ground_truth_key": "reward_model.ground_truth",
            "data_source_key": "data_source",
            "skip_mismatched_rows": false,
            "skip_bad_rows": false,
            "video_key": "videos",
            "video_sample_fps": 2.0,
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        Params::from_map(v.as_object().unwrap().clone())
    }

    fn ctx() -> BuildContext {
        BuildContext {
            node: "data".into(),
            device: DeviceSpec::Cpu(0),
            placement: flowrl_engine::Placement::single(DeviceSpec::Cpu(0)),
            seed: 1,
            total_steps: 10,
            resources: Arc::new(Resources::default()),
            run_dir: None,
            graph: None,
        }
    }

    fn rows(b: &PromptBatch) -> Vec<(String, usize)> {
        b.prompts
            .iter()
            .map(|p| (p.uid.clone(), p.source.row))
            .collect()
    }

    #[test]
    fn emits_batches_and_resumes_from_saved_state() {
        let p = params(serde_json::json!({}));
        let mut node = build_node(&p, &ctx()).unwrap();
        let mut step = StepContext::new(
            "data",
            0,
            10,
            1,
            DeviceSpec::Cpu(0),
            Arc::new(Resources::default()),
        );
        node.run(&Inputs::new("data"), &mut step).unwrap();
        let state = node.save_state().unwrap().unwrap();
        assert_eq!(state["cursor"], 4);
        let want: Vec<_> = (0..60).map(|_| rows(&node.next_batch().unwrap())).collect();
        assert!(
            want.iter().any(|b| b[0].0.starts_with("e1-")),
            "crosses an epoch"
        );

        let mut resumed = build_node(&p, &ctx()).unwrap();
        resumed.load_state(state).unwrap();
        for w in want {
            assert_eq!(rows(&resumed.next_batch().unwrap()), w);
        }
    }

    #[test]
    fn seed_defaults_to_the_run_seed_and_val_path_loads_the_whole_split() {
        let p = params(serde_json::json!({
            "seed": null,
            "val_path": root().join("datasets/shapes/test.parquet"),
        }));
        let node = build_node(&p, &ctx()).unwrap();
        assert_eq!(node.train.position().seed, 1);
        let val: &PromptBatch = node.val.as_ref().unwrap().downcast_ref().unwrap();
        assert_eq!(val.len(), flowrl_datasets::synth::DEFAULT_TEST);
        assert_eq!(val.prompts[0].source.row, 0);
    }

    #[test]
    fn missing_files_are_build_errors_with_the_path() {
        let p = params(serde_json::json!({"path": "nowhere/train.parquet"}));
        let e = build_node(&p, &ctx()).err().unwrap().to_string();
        assert!(e.contains("nowhere/train.parquet: cannot open"), "{e}");
    }
}
