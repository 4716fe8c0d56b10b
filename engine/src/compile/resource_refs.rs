//! Stage 4, resources: every resource-typed parameter (of a node or of another resource) names a
//! declared resource of the right kind, and resources do not refer to each other in a cycle.

use crate::diagnostic::{Code, Diagnostic, did_you_mean};
use crate::registry::Registry;
use petgraph::graph::DiGraph;

use super::nodes::NodeDraft;
use super::resources::ResourceDraft;
use super::schema::ResourceRef;

/// Resolves the resource references; returns each resource's dependencies (the resources its
/// parameters name, by index).
pub(super) fn check(
    registry: &Registry,
    resources: &[ResourceDraft],
    nodes: &[NodeDraft<'_>],
    diags: &mut Vec<Diagnostic>,
) -> Vec<Vec<usize>> {
    for n in nodes {
        for r in &n.refs {
            resolve(registry, resources, r, diags);
        }
    }
    let deps: Vec<Vec<usize>> = resources
        .iter()
        .map(|d| {
            d.refs
                .iter()
                .filter_map(|r| resolve(registry, resources, r, diags))
                .collect()
        })
        .collect();
    check_cycles(resources, &deps, diags);
    deps
}

/// The index of the resource `r` names, or an error (unknown, or of another kind).
fn resolve(
    registry: &Registry,
    resources: &[ResourceDraft],
    r: &ResourceRef,
    diags: &mut Vec<Diagnostic>,
) -> Option<usize> {
    if let Some(i) = resources.iter().position(|d| d.name == r.name) {
        let actual = resources[i].kind.name();
        if actual == r.kind {
            return Some(i);
        }
        diags.push(
            Diagnostic::error(
                Code::UnknownResource,
                format!(
                    "`{}` expects a {} resource, but `{}` is a {actual}",
                    r.path, r.kind, r.name
                ),
            )
            .at(r.span)
            .with_note(
                resources[i].spans.header,
                format!("`{}` is declared here", r.name),
            ),
        );
        return None;
    }
    let same: Vec<&str> = resources
        .iter()
        .filter(|d| d.kind.name() == r.kind)
        .map(|d| d.name.as_str())
        .collect();
    let section = registry
        .resource_kind(&r.kind)
        .map_or_else(|| r.kind.clone(), |k| k.section().to_string());
    let help = did_you_mean(&r.name, same.iter().copied()).unwrap_or_else(|| {
        if same.is_empty() {
            format!("declare it as `[{section}.{}]`", r.name)
        } else {
            format!("declared {} resources: {}", r.kind, same.join(", "))
        }
    });
    diags.push(
        Diagnostic::error(
            Code::UnknownResource,
            format!("unknown {} resource `{}`", r.kind, r.name),
        )
        .at(r.span)
        .with_help(help),
    );
    None
}

/// Resources referring to each other in a loop.
fn check_cycles(resources: &[ResourceDraft], deps: &[Vec<usize>], diags: &mut Vec<Diagnostic>) {
    let mut g = DiGraph::<usize, ()>::new();
    let ix: Vec<_> = (0..resources.len()).map(|i| g.add_node(i)).collect();
    for (i, ds) in deps.iter().enumerate() {
        for &d in ds {
            g.add_edge(ix[d], ix[i], ());
        }
    }
    for scc in petgraph::algo::tarjan_scc(&g) {
        let self_loop = scc.len() == 1 && deps[g[scc[0]]].contains(&g[scc[0]]);
        if scc.len() > 1 || self_loop {
            let mut names: Vec<&str> = scc.iter().map(|&n| resources[g[n]].name.as_str()).collect();
            names.sort();
            let first = resources
                .iter()
                .position(|r| r.name == names[0])
                .unwrap_or(0);
            diags.push(
                Diagnostic::error(
                    Code::Cycle,
                    format!(
                        "resources refer to each other in a cycle: {}",
                        names.join(", ")
                    ),
                )
                .at(resources[first].spans.header),
            );
        }
    }
}
