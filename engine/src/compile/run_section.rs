//! Stage 2, shape of `[run]`: the section against its schema ([`run_params`]), giving the
//! [`RunConfig`]. The run's devices are the placement stage's.

use crate::diagnostic::{Diagnostic, SourceId, Span};
use crate::graph::{RunConfig, SpanIndex};
use crate::params::{ParamSchema, ParamSpec};
use crate::spec::STable;

use super::devices::Placement;
use super::schema::{SchemaChecker, table_of};

/// The `[run]` section's schema: [`RunConfig`]'s parameters, with the run's devices (which the
/// placement stage reads and resolves) after `seed`.
pub fn run_params() -> Vec<ParamSpec> {
    let mut specs = RunConfig::param_specs();
    let at = specs
        .iter()
        .position(|s| s.name == "seed")
        .map_or(0, |i| i + 1);
    specs.splice(at..at, Placement::run_specs());
    specs
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
