//! Stage 2, shape of `[run]`: the section against its schema ([`run_params`]), giving the
//! [`RunConfig`]. The run's devices are the placement stage's.

use crate::diagnostic::{Diagnostic, SourceId, Span};
use crate::graph::{RunConfig, SpanIndex};
use crate::params::{ParamSpec, ParamType};
use crate::spec::STable;

use super::schema::{SchemaChecker, table_of};

/// The trackers `[run] tracking` names.
pub const TRACKERS: &[&str] = &["jsonl", "tensorboard"];

/// The `[run]` section's schema.
pub fn run_params() -> Vec<ParamSpec> {
    vec![
        ParamSpec::int("steps")
            .default(1)
            .min(1.0)
            .doc("training steps (each runs the whole graph once); `--steps` overrides"),
        ParamSpec::int("seed")
            .default(0)
            .min(0.0)
            .doc("run seed; every random draw derives from (seed, step, node name)"),
        ParamSpec::string("device")
            .default("auto")
            .doc("`auto` | `cpu` | `cpu:N` | `cuda` | `cuda:N` | `vulkan` | `vulkan:N`; `auto` is CUDA when built with it and a GPU is present; short for `devices = [\"X\"]`"),
        ParamSpec::array("devices", ParamType::String).doc(
            "the devices of this process, all CPU replicas or all GPUs (`[\"cuda:0\", \"cuda:1\"]`): data-parallel nodes run one replica on each; instead of `device`",
        ),
        ParamSpec::path("out")
            .doc("run directory; default: a new timestamped directory under `runs/`"),
        ParamSpec::int("checkpoint_every")
            .default(0)
            .min(0.0)
            .doc("write a checkpoint every N steps and after the last step (0: never)"),
        ParamSpec::int("keep_checkpoints")
            .default(2)
            .min(0.0)
            .doc("how many of the newest checkpoints to keep (0: every one)"),
        ParamSpec::int("workers")
            .default(0)
            .min(0.0)
            .doc("worker threads running ready nodes concurrently (0: one per CPU core)"),
        ParamSpec::bool("plot")
            .default(true)
            .doc("draw plots of the main curves into the run directory at the end"),
        ParamSpec::array("tracking", ParamType::Enum(TRACKERS.iter().map(|t| t.to_string()).collect()))
            .default(serde_json::json!(["jsonl"]))
            .doc("where the metrics go: `jsonl` (metrics.jsonl, always written) and `tensorboard` (event files under the run directory's tensorboard/, with the graph and sampled generations; W&B imports them)"),
    ]
}

/// The `[run]` section of `doc` (all defaults when there is none; `None` after an error).
pub(super) fn check(
    doc: &STable,
    file: SourceId,
    diags: &mut Vec<Diagnostic>,
) -> Option<RunConfig> {
    let empty = STable::default();
    let (table, header) = match doc.get("run") {
        Some(e) => (
            table_of(e, "`run`", "write it as a section: `[run]`", diags)?,
            e.key_span,
        ),
        None => (&empty, Span::new(file, 0, 0)),
    };
    let mut spans = SpanIndex {
        header,
        ..Default::default()
    };
    let (params, _) = SchemaChecker::new("the `[run]` section", &mut spans, diags).check(
        table,
        &run_params(),
        &[],
    );
    params.parse::<RunConfig>().ok()
}
