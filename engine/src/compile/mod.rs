//! The graph compiler: TOML text (+ `--set` overrides) → a checked, typed [`Graph`].
//!
//! [`compile_for`] tells the whole story. The stages run in order; each collects every problem it
//! finds before the next one runs (a stage reads what the earlier ones produced, skipping what
//! they rejected), and all diagnostics are reported together, sorted by position:
//! 1. **syntax** (`syntax.rs`) — parse with spans ([`crate::spec`]); apply overrides (errors point
//!    at the override);
//! 2. **shape** (`run_section.rs`, `resources.rs`, `nodes.rs`, `sections.rs`, all checking
//!    tables with `schema.rs`) — known sections; `[run]`, each resource section and each node
//!    table checked against its schema: unknown keys (did-you-mean), required keys, types,
//!    ranges, enum values; unknown node kinds (did-you-mean);
//! 3. **placement** (`devices.rs`) — the run's devices (`[run] device` or `devices`: known,
//!    distinct, of one type, present on the target machine) and each node's `device` (one of the
//!    run's devices);
//! 4. **resources** (`resource_refs.rs`) — resource-typed parameters name a declared resource of
//!    the right kind;
//! 5. **wiring** (`wiring.rs`) — every `inputs` entry names a known input port and an existing
//!    `node.port`, the port types agree (both ends and both types named), every required input is
//!    wired;
//! 6. **repeats and cycles** (`repeats.rs`, `cycles.rs`) — `repeat` lists fit the graph; one step
//!    is a DAG; a cycle is printed as its whole chain;
//! 7. **constraints** (`constraints.rs`) — when everything above passed and the checked parts are
//!    assembled into a [`Graph`] (`assemble.rs`), each kind's `validate` hook (which may read the
//!    node's placement, e.g. to require work that splits evenly over its replicas).
//!
//! The diagnostics that several stages emit are built by named constructors (`diagnostics.rs`).
//! Devices are checked against a [`Target`]: the machine (CUDA compiled in, number of GPUs) and
//! the number of processes of the run. [`compile`] targets this machine and one process.

mod assemble;
mod constraints;
mod cycles;
mod devices;
mod diagnostics;
mod nodes;
mod repeats;
mod resource_refs;
mod resources;
mod run_section;
mod schema;
mod sections;
mod syntax;
mod wiring;

pub use constraints::check_constraints;
pub use nodes::NODE_KEYS;
pub use run_section::run_params;
pub use syntax::Override;

use crate::device::Machine;
use crate::diagnostic::{self, Diagnostic, SourceMap};
use crate::graph::Graph;
use crate::registry::Registry;

/// A failed compilation: the diagnostics (errors and warnings) and the sources they point into.
#[derive(Debug)]
pub struct Failure {
    pub diagnostics: Vec<Diagnostic>,
    pub sources: SourceMap,
}

impl Failure {
    /// The diagnostics rendered as text.
    pub fn render(&self) -> String {
        diagnostic::render(&self.diagnostics, &self.sources)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

impl std::error::Error for Failure {}

/// What a graph is compiled for: the machine its devices must exist on and the number of
/// processes of the run (kinds' `validate` hooks see `world × local devices` replicas).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub machine: Machine,
    /// Processes of the run (`--world`), at least 1.
    pub world: usize,
}

impl Target {
    /// This binary on this machine, one process.
    pub fn detect() -> Self {
        Target {
            machine: Machine::detect(),
            world: 1,
        }
    }
}

/// Compiles a graph file for this machine and one process ([`Target::detect`]). `name` is how the
/// file is shown in diagnostics (its path). Returns the graph and its warnings, or every
/// diagnostic.
pub fn compile(
    registry: &Registry,
    name: &str,
    text: &str,
    overrides: &[Override],
) -> Result<(Graph, Vec<Diagnostic>), Failure> {
    compile_for(registry, name, text, overrides, &Target::detect())
}

/// [`compile`] for another [`Target`] (a multi-process run, or a machine described by a test).
pub fn compile_for(
    registry: &Registry,
    name: &str,
    text: &str,
    overrides: &[Override],
    target: &Target,
) -> Result<(Graph, Vec<Diagnostic>), Failure> {
    let mut sources = SourceMap::default();
    let file = sources.add(name, text);
    let mut diags = Vec::new();

    // 1. Syntax: the spanned document with the overrides applied.
    let Some(syntax::Parsed { doc }) =
        syntax::parse(text, file, overrides, &mut sources, &mut diags)
    else {
        return fail(diags, sources);
    };
    // 2. Shape: every section against its schema.
    let run = run_section::check(&doc, file, &mut diags);
    let resources = resources::check(registry, &doc, &mut diags);
    let nodes = nodes::check(registry, &doc, &mut diags);
    sections::check(registry, &doc, file, &mut diags);
    // 3. Placement: the run's devices, then each resource's and node's.
    let placement = devices::Placement::new(target.machine);
    let run_devices = placement.check_run(&doc, &mut diags);
    let resource_devices =
        placement.check_resources(&resources, run_devices.as_deref(), &mut diags);
    let node_devices = placement.check_nodes(&nodes, run_devices.as_deref(), &mut diags);
    // 4. Resource references.
    let resource_deps = resource_refs::check(registry, &resources, &nodes, &mut diags);
    // 5. Wiring.
    let edges = wiring::check(&nodes, &mut diags);
    // 6. Repeats and cycles.
    let repeated_by = repeats::check(&nodes, &edges, &mut diags);
    let dependencies = crate::repeat::dependencies(&edges, &repeated_by);
    let order = cycles::check(&nodes, &edges, &repeated_by, &dependencies, &mut diags);
    if diags.iter().any(Diagnostic::is_error) {
        return fail(diags, sources);
    }

    let graph = assemble::graph(
        assemble::Checked {
            doc: &doc,
            run: run.expect("run section checked"),
            devices: run_devices.expect("run devices checked"),
            resources,
            resource_devices,
            resource_deps,
            nodes,
            node_devices,
            edges,
            repeated_by,
            dependencies,
            order: order.expect("no cycle when there is no error"),
            world: target.world,
        },
        sources,
    );
    // 7. Constraints declared by kinds.
    diags.extend(check_constraints(&graph));
    if diags.iter().any(Diagnostic::is_error) {
        return fail(diags, graph.sources);
    }
    diagnostic::sort(&mut diags);
    Ok((graph, diags))
}

/// The compilation failed: every diagnostic, sorted by position.
fn fail<T>(mut diagnostics: Vec<Diagnostic>, sources: SourceMap) -> Result<T, Failure> {
    diagnostic::sort(&mut diagnostics);
    Err(Failure {
        diagnostics,
        sources,
    })
}
