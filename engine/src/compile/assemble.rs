//! After the checks: the checked parts put together as a [`Graph`] — nodes with their edges,
//! devices and repeats, resources with their dependencies, the step's DAG and the resolved
//! document (overrides applied) that a run directory saves. Nothing here can fail: it runs only
//! when no stage reported an error.

use crate::device::DeviceSpec;
use crate::diagnostic::{SourceMap, Span};
use crate::graph::{Edge, Graph, GraphNode, GraphResource, RunConfig};
use crate::spec::{SKind, STable, SValue};
use petgraph::graph::DiGraph;

use super::nodes::NodeDraft;
use super::resources::ResourceDraft;

/// What the stages produced, all of it checked.
pub(super) struct Checked<'d> {
    /// The document with the overrides applied.
    pub doc: &'d STable,
    pub run: RunConfig,
    /// The run's devices.
    pub devices: Vec<DeviceSpec>,
    pub resources: Vec<ResourceDraft>,
    /// For each resource, its own `device`.
    pub resource_devices: Vec<Option<DeviceSpec>>,
    /// For each resource, the resources it refers to.
    pub resource_deps: Vec<Vec<usize>>,
    pub nodes: Vec<NodeDraft<'d>>,
    /// For each node, its own `device`.
    pub node_devices: Vec<Option<DeviceSpec>>,
    /// For each node, its incoming edges.
    pub edges: Vec<Vec<Edge>>,
    /// For each node, the loop node that repeats it.
    pub repeated_by: Vec<Option<usize>>,
    /// For each node, the nodes it waits for within a step.
    pub dependencies: Vec<Vec<usize>>,
    /// A topological order of the nodes.
    pub order: Vec<usize>,
    /// Processes of the run.
    pub world: usize,
}

/// The [`Graph`] of checked parts, pointing into `sources`.
pub(super) fn graph(c: Checked<'_>, sources: SourceMap) -> Graph {
    let resolved = toml::to_string(
        &SValue {
            kind: SKind::Table(c.doc.clone()),
            span: Span::default(),
        }
        .to_toml(),
    )
    .unwrap_or_default();

    let mut dag = DiGraph::new();
    let idx: Vec<_> = (0..c.nodes.len()).map(|i| dag.add_node(i)).collect();
    for (to, es) in c.edges.iter().enumerate() {
        // A loop node's arguments to its repeated nodes are calls, not edges of the step's DAG.
        for e in es.iter().filter(|e| c.repeated_by[to] != Some(e.from)) {
            dag.add_edge(idx[e.from], idx[to], ());
        }
    }
    let repeats: Vec<Vec<usize>> = (0..c.nodes.len())
        .map(|l| {
            c.order
                .iter()
                .copied()
                .filter(|&r| c.repeated_by[r] == Some(l))
                .collect()
        })
        .collect();
    Graph {
        run: c.run,
        nodes: c
            .nodes
            .into_iter()
            .zip(c.edges)
            .zip(c.node_devices)
            .zip(repeats.into_iter().zip(c.repeated_by))
            .map(|(((n, inputs), device), (repeat, repeated_by))| GraphNode {
                name: n.name,
                kind: n.kind.expect("kinds resolved"),
                params: n.params,
                inputs,
                device,
                timing_key: n.timing_key,
                repeat,
                repeated_by,
                spans: n.spans,
            })
            .collect(),
        resources: c
            .resources
            .into_iter()
            .zip(c.resource_deps)
            .zip(c.resource_devices)
            .map(|((r, depends), device)| GraphResource {
                name: r.name,
                kind: r.kind,
                params: r.params,
                device,
                depends,
                spans: r.spans,
            })
            .collect(),
        devices: c.devices,
        world: c.world.max(1),
        order: c.order,
        dependencies: c.dependencies,
        dag,
        sources,
        resolved,
    }
}
