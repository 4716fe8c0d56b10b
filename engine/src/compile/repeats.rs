//! Stage 6a, repeats: the `repeat` lists (rules in [`crate::repeat`]). A loop node (a kind with
//! a `repeated` input) may list other nodes to run again on demand within a step; this stage
//! checks that each list names nodes of the graph, each repeated by one loop node at most and
//! without nesting, and that the edges between a loop node, its members and the rest of the graph
//! fit: repeated inputs come from members, arguments go to members, members feed the loop node,
//! and no outside node reads a member's per-run value.

use crate::diagnostic::{Code, Diagnostic, Span, did_you_mean};
use crate::graph::Edge;
use crate::port::PortSpec;

use super::nodes::NodeDraft;

/// For each node, the loop node that repeats it.
pub(super) fn check(
    nodes: &[NodeDraft<'_>],
    edges: &[Vec<Edge>],
    diags: &mut Vec<Diagnostic>,
) -> Vec<Option<usize>> {
    let by = repeated_by(nodes, diags);
    for (l, node) in nodes.iter().enumerate() {
        let Some(kind) = &node.kind else { continue };
        let (ins, outs) = (kind.inputs(), kind.outputs());
        let lp = Loop::new(l, nodes, edges, &by);
        lp.check_inputs(&ins, diags);
        lp.check_arguments(&outs, diags);
        if lp.members.is_empty() {
            continue;
        }
        lp.check_members_feed(diags);
        lp.check_outside_readers(&outs, diags);
    }
    by
}

/// The `repeat` lists read: which loop node repeats each node (an error for each name that
/// cannot be repeated by this one).
fn repeated_by(nodes: &[NodeDraft<'_>], diags: &mut Vec<Diagnostic>) -> Vec<Option<usize>> {
    let mut by: Vec<Option<usize>> = vec![None; nodes.len()];
    for (l, node) in nodes.iter().enumerate() {
        let Some(kind) = node.kind.as_ref().filter(|_| !node.repeat.is_empty()) else {
            continue;
        };
        if !kind.inputs().iter().any(|s| s.repeated) {
            diags.push(
                Diagnostic::bad_repeat(
                    format!(
                        "node `{}` (kind `{}`) cannot repeat nodes: its kind has no repeated input",
                        node.name,
                        kind.name()
                    ),
                    node.spans.value_span("repeat"),
                )
                .with_help(
                    "`repeat` belongs to kinds that run other nodes on demand within a step \
                     (`flowrl nodes` shows their inputs marked `repeated`)",
                ),
            );
            continue;
        }
        for (name, span) in &node.repeat {
            let Some(r) = nodes.iter().position(|m| m.name == *name) else {
                let help = did_you_mean(name, nodes.iter().map(|m| m.name.as_str()))
                    .unwrap_or_else(|| "`repeat` lists nodes of this graph".into());
                diags.push(
                    Diagnostic::error(
                        Code::UnknownNode,
                        format!("node `{}` repeats unknown node `{name}`", node.name),
                    )
                    .at(*span)
                    .with_help(help),
                );
                continue;
            };
            let message = match by[r] {
                _ if r == l => format!("node `{name}` cannot repeat itself"),
                Some(other) if other == l => format!("`{name}` is listed twice in `repeat`"),
                Some(other) => format!(
                    "`{name}` is already repeated by `{}`; a node is repeated by at most one node",
                    nodes[other].name
                ),
                None if !nodes[r].repeat.is_empty() => {
                    format!("`{name}` repeats nodes itself; repeats do not nest")
                }
                None => {
                    by[r] = Some(l);
                    continue;
                }
            };
            diags.push(Diagnostic::bad_repeat(message, *span));
        }
    }
    by
}

/// One loop node `l` with the graph around it.
struct Loop<'a, 'd> {
    l: usize,
    nodes: &'a [NodeDraft<'d>],
    edges: &'a [Vec<Edge>],
    /// For each node, the loop node that repeats it.
    by: &'a [Option<usize>],
    /// The nodes it repeats.
    members: Vec<usize>,
    /// The members (and which of their outputs) that lead into the loop node.
    on_path: Vec<(usize, String)>,
}

impl<'a, 'd> Loop<'a, 'd> {
    fn new(
        l: usize,
        nodes: &'a [NodeDraft<'d>],
        edges: &'a [Vec<Edge>],
        by: &'a [Option<usize>],
    ) -> Self {
        let mut lp = Loop {
            l,
            nodes,
            edges,
            by,
            members: Vec::new(),
            on_path: Vec::new(),
        };
        lp.members = (0..nodes.len()).filter(|&r| lp.is_member(r)).collect();
        lp.on_path = lp.feeding();
        lp
    }

    fn node(&self) -> &NodeDraft<'d> {
        &self.nodes[self.l]
    }

    /// Whether node `i` is one that this loop node repeats.
    fn is_member(&self, i: usize) -> bool {
        self.by[i] == Some(self.l)
    }

    /// The span of the `inputs` entry of node `to` that edge `e` comes from.
    fn input_span(&self, to: usize, e: &Edge) -> Span {
        self.nodes[to]
            .spans
            .value_span(&format!("inputs.{}", e.port))
    }

    /// The loop node's inputs: repeated ones from its members, the others from outside.
    fn check_inputs(&self, ins: &[PortSpec], diags: &mut Vec<Diagnostic>) {
        let (node, nodes) = (self.node(), self.nodes);
        for e in &self.edges[self.l] {
            let repeated = ins.iter().any(|s| s.name == e.port && s.repeated);
            let member = self.is_member(e.from);
            if repeated && !member {
                diags.push(
                    Diagnostic::bad_repeat(
                        format!(
                            "`{}.{}` takes a new value from each run of the nodes `{}` repeats, \
                             but `{}` is not in its `repeat` list",
                            node.name, e.port, node.name, nodes[e.from].name
                        ),
                        self.input_span(self.l, e),
                    )
                    .with_help(format!(
                        "add `{}` (and the nodes it needs) to `{}`'s `repeat`",
                        nodes[e.from].name, node.name
                    )),
                );
            } else if !repeated && member {
                diags.push(Diagnostic::bad_repeat(
                    format!(
                        "`{}.{}` is read once per step, but `{}` is a node `{}` repeats; only \
                         its repeated inputs ({}) may come from those",
                        node.name,
                        e.port,
                        nodes[e.from].name,
                        node.name,
                        ins.iter()
                            .filter(|s| s.repeated)
                            .map(|s| s.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    self.input_span(self.l, e),
                ));
            }
        }
    }

    /// Arguments go to members only; members read no other output of the loop node.
    fn check_arguments(&self, outs: &[PortSpec], diags: &mut Vec<Diagnostic>) {
        let (node, nodes) = (self.node(), self.nodes);
        for (to, es) in self.edges.iter().enumerate() {
            for e in es.iter().filter(|e| e.from == self.l) {
                let argument = outs.iter().any(|s| s.name == e.from_port && s.argument);
                if argument && !self.is_member(to) {
                    diags.push(Diagnostic::bad_repeat(
                        format!(
                            "`{}.{}` is handed only to the nodes `{}` repeats, and `{}` is not one of them",
                            node.name, e.from_port, node.name, nodes[to].name
                        ),
                        self.input_span(to, e),
                    ));
                } else if !argument && self.is_member(to) {
                    diags.push(Diagnostic::bad_repeat(
                        format!(
                            "`{}` is repeated by `{}` and reads `{}.{}`, which exists only after `{}` has finished",
                            nodes[to].name, node.name, node.name, e.from_port, node.name
                        ),
                        self.input_span(to, e),
                    ));
                }
            }
        }
    }

    /// The members (and which of their outputs) that lead into the loop node.
    fn feeding(&self) -> Vec<(usize, String)> {
        let mut on_path: Vec<(usize, String)> = self.edges[self.l]
            .iter()
            .filter(|e| self.is_member(e.from))
            .map(|e| (e.from, e.from_port.clone()))
            .collect();
        let mut grew = true;
        while grew {
            grew = false;
            for &m in &self.members {
                if !on_path.iter().any(|(n, _)| *n == m) {
                    continue;
                }
                for e in self.edges[m].iter().filter(|e| self.is_member(e.from)) {
                    let key = (e.from, e.from_port.clone());
                    if !on_path.contains(&key) {
                        on_path.push(key);
                        grew = true;
                    }
                }
            }
        }
        on_path
    }

    /// Every member leads into the loop node (else listing it is a mistake).
    fn check_members_feed(&self, diags: &mut Vec<Diagnostic>) {
        let (node, nodes) = (self.node(), self.nodes);
        for &m in &self.members {
            if !self.on_path.iter().any(|(n, _)| *n == m) {
                let span = node
                    .repeat
                    .iter()
                    .find(|(name, _)| *name == nodes[m].name)
                    .map_or(node.spans.value_span("repeat"), |(_, s)| *s);
                diags.push(Diagnostic::bad_repeat(
                    format!(
                        "`repeat` lists `{}`, which feeds none of `{}`'s repeated inputs",
                        nodes[m].name, node.name
                    ),
                    span,
                ));
            }
        }
    }

    /// No node outside the loop reads a member's output on the way into the loop node (it would
    /// see only the last run's value).
    fn check_outside_readers(&self, outs: &[PortSpec], diags: &mut Vec<Diagnostic>) {
        let (node, nodes) = (self.node(), self.nodes);
        let loop_outputs: Vec<String> = outs
            .iter()
            .filter(|s| !s.argument)
            .map(|s| format!("`{}.{}`", node.name, s.name))
            .collect();
        for (to, es) in self.edges.iter().enumerate() {
            if to == self.l || self.is_member(to) {
                continue;
            }
            for e in es {
                if self.is_member(e.from) && self.on_path.contains(&(e.from, e.from_port.clone())) {
                    let help = if loop_outputs.is_empty() {
                        format!("`{}` has no outputs to read instead", node.name)
                    } else {
                        format!(
                            "read it through `{}`: {}",
                            node.name,
                            loop_outputs.join(", ")
                        )
                    };
                    diags.push(
                        Diagnostic::bad_repeat(
                            format!(
                                "`{}.{}` reads `{}.{}`, which `{}` repeats on its way into \
                                 `{}`; it would see only the last run",
                                nodes[to].name,
                                e.port,
                                nodes[e.from].name,
                                e.from_port,
                                node.name,
                                node.name
                            ),
                            self.input_span(to, e),
                        )
                        .with_help(help),
                    );
                }
            }
        }
    }
}
