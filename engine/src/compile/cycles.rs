//! Stage 6b, cycles: one step of the graph is a DAG. The order follows the step's dependencies
//! ([`crate::repeat::dependencies`]: a repeated node's value exists once its loop node is done);
//! a cycle is printed as its whole chain, each link pointing at the input that closes it.

use crate::diagnostic::{Code, Diagnostic, Span};
use crate::graph::Edge;
use petgraph::graph::DiGraph;
use std::collections::BTreeMap;

use super::nodes::NodeDraft;

/// A topological order of the nodes, or `None` (with diagnostics) when there is a cycle.
pub(super) fn check(
    nodes: &[NodeDraft<'_>],
    edges: &[Vec<Edge>],
    repeated_by: &[Option<usize>],
    deps: &[Vec<usize>],
    diags: &mut Vec<Diagnostic>,
) -> Option<Vec<usize>> {
    let mut g = DiGraph::<usize, ()>::new();
    let ix: Vec<_> = (0..nodes.len()).map(|i| g.add_node(i)).collect();
    for (to, d) in deps.iter().enumerate() {
        for &from in d {
            g.add_edge(ix[from], ix[to], ());
        }
    }
    if let Ok(order) = petgraph::algo::toposort(&g, None) {
        return Some(order.into_iter().map(|i| g[i]).collect());
    }
    // A loop node's arguments to its repeated nodes are no edge.
    let edges: Vec<Vec<Edge>> = edges
        .iter()
        .enumerate()
        .map(|(to, es)| {
            es.iter()
                .filter(|e| repeated_by[to] != Some(e.from))
                .cloned()
                .collect()
        })
        .collect();
    let mut reported = false;
    for members in cycles(nodes.len(), &edges) {
        diags.push(chain_diagnostic(nodes, &edges, &members));
        reported = true;
    }
    if !reported {
        // The edges are acyclic; the cycle goes through a loop node's repeat.
        diags.push(
            Diagnostic::error(
                Code::Cycle,
                "cycle in the graph through a `repeat`: a repeated node's values exist only \
                 once its loop node has finished, so nothing its loop node waits for may read \
                 them",
            )
            .at(nodes
                .iter()
                .find(|n| !n.repeat.is_empty())
                .map_or(Span::default(), |n| n.spans.value_span("repeat"))),
        );
    }
    None
}

/// The nodes of each cycle of `edges` (strongly connected components of two or more nodes, or a
/// node wired to itself).
fn cycles(n: usize, edges: &[Vec<Edge>]) -> Vec<Vec<usize>> {
    let mut g = DiGraph::<usize, ()>::new();
    let ix: Vec<_> = (0..n).map(|i| g.add_node(i)).collect();
    for (to, es) in edges.iter().enumerate() {
        for e in es {
            g.add_edge(ix[e.from], ix[to], ());
        }
    }
    petgraph::algo::tarjan_scc(&g)
        .into_iter()
        .map(|scc| scc.iter().map(|&i| g[i]).collect::<Vec<usize>>())
        .filter(|members| {
            let self_loop =
                members.len() == 1 && edges[members[0]].iter().any(|e| e.from == members[0]);
            members.len() >= 2 || self_loop
        })
        .collect()
}

/// The error for one cycle: its chain from the member defined first in the file, each link
/// pointing at the input it is wired through.
fn chain_diagnostic(nodes: &[NodeDraft<'_>], edges: &[Vec<Edge>], members: &[usize]) -> Diagnostic {
    let start = *members
        .iter()
        .min_by_key(|&&m| nodes[m].spans.header.start)
        .expect("non-empty");
    let chain = find_cycle(start, members, edges);
    let names: Vec<&str> = chain.iter().map(|&i| nodes[i].name.as_str()).collect();
    let mut text = names.join(" → ");
    text.push_str(&format!(" → {}", names[0]));
    // Each step of the chain: the input of chain[k+1] (or chain[0]) wired from chain[k].
    let mut d = Diagnostic::error(Code::Cycle, format!("cycle in the graph: {text}"));
    for k in 0..chain.len() {
        let (from, to) = (chain[k], chain[(k + 1) % chain.len()]);
        if let Some(e) = edges[to].iter().find(|e| e.from == from) {
            let span = nodes[to].spans.value_span(&format!("inputs.{}", e.port));
            let note = format!(
                "`{}.{}` takes `{}.{}`",
                nodes[to].name, e.port, nodes[from].name, e.from_port
            );
            if d.span.is_none() {
                d = d.at(span).with_label(note);
            } else {
                d = d.with_note(span, note);
            }
        }
    }
    d.with_help(
        "one step of a graph must be acyclic; state carried from one step to the next belongs \
         in a node's state or a resource",
    )
}

/// A cycle through `start` using only `members` (which form a strongly connected component).
fn find_cycle(start: usize, members: &[usize], edges: &[Vec<Edge>]) -> Vec<usize> {
    // successors within the SCC: `to` is a successor of `from` when `to` has an input from `from`.
    let succ = |from: usize| -> Vec<usize> {
        let mut s: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&to| edges[to].iter().any(|e| e.from == from))
            .collect();
        s.sort();
        s
    };
    // BFS for the shortest path start → ... → start.
    let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(cur) = queue.pop_front() {
        for nxt in succ(cur) {
            if nxt == start {
                let mut path = vec![cur];
                let mut at = cur;
                while at != start {
                    at = prev[&at];
                    path.push(at);
                }
                path.reverse();
                path.dedup();
                return path;
            }
            if let std::collections::btree_map::Entry::Vacant(v) = prev.entry(nxt) {
                v.insert(cur);
                queue.push_back(nxt);
            }
        }
    }
    vec![start]
}
