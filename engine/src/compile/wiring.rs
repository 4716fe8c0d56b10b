//! Stage 5, wiring: every `inputs` entry of a node names one of its kind's input ports and an
//! existing `node.port` whose type the input accepts (a mismatch names both ends and both
//! types), and every required input is wired (the help names a node that produces its type).
//!
//! Nodes whose kind the shape stage rejected are skipped, and so are edges from them.

use crate::diagnostic::{Code, Diagnostic, did_you_mean};
use crate::graph::Edge;
use crate::params::ParamType;
use crate::port::PortSpec;
use crate::spec::SEntry;

use super::nodes::NodeDraft;
use super::schema::table_of;

/// The input ports of one node's kind, and how diagnostics name the node.
struct InputPorts {
    /// "node `x` (kind `y`)".
    what: String,
    specs: Vec<PortSpec>,
}

impl InputPorts {
    /// The port that takes any name, if the kind has one.
    fn variadic(&self) -> Option<&PortSpec> {
        self.specs.iter().find(|s| s.variadic)
    }

    fn names(&self) -> Vec<&str> {
        self.specs.iter().map(|s| s.name.as_str()).collect()
    }
}

/// Each node's incoming edges, by node index.
pub(super) fn check(nodes: &[NodeDraft<'_>], diags: &mut Vec<Diagnostic>) -> Vec<Vec<Edge>> {
    let mut all = Vec::new();
    for n in nodes {
        let mut edges = Vec::new();
        let Some(kind) = &n.kind else {
            all.push(edges);
            continue;
        };
        let ports = InputPorts {
            what: format!("node `{}` (kind `{}`)", n.name, kind.name()),
            specs: kind.inputs(),
        };
        let mut wired: Vec<&str> = Vec::new();
        if let Some(inputs) = n.inputs {
            let Some(table) = table_of(
                inputs,
                "`inputs`",
                "write `inputs = { port = \"node.port\" }`",
                diags,
            ) else {
                // Not a table: reported; missing inputs would only repeat it.
                all.push(edges);
                continue;
            };
            for e in &table.entries {
                wired.push(&e.key);
                if let Some(edge) = edge(n, &ports, e, nodes, diags) {
                    edges.push(edge);
                }
            }
        }
        check_required(n, &ports, &wired, nodes, diags);
        all.push(edges);
    }
    all
}

/// Every required input of `n` is among the `wired` ones.
fn check_required(
    n: &NodeDraft<'_>,
    ports: &InputPorts,
    wired: &[&str],
    nodes: &[NodeDraft<'_>],
    diags: &mut Vec<Diagnostic>,
) {
    let names = ports.names();
    for s in ports.specs.iter().filter(|s| !s.optional && !s.variadic) {
        if wired.contains(&s.name.as_str()) {
            continue;
        }
        // Already reported as a misspelled port with a did-you-mean.
        let misspelled = wired.iter().any(|w| {
            !names.contains(w)
                && did_you_mean(w, names.iter().copied())
                    .is_some_and(|h| h.contains(&format!("`{}`", s.name)))
        });
        if misspelled && ports.variadic().is_none() {
            continue;
        }
        let producers: Vec<String> = nodes
            .iter()
            .filter(|m| m.name != n.name)
            .flat_map(|m| {
                m.kind.iter().flat_map(move |k| {
                    k.outputs()
                        .into_iter()
                        .filter(|o| s.ty.accepts(o.ty))
                        .map(move |o| format!("{}.{}", m.name, o.name))
                })
            })
            .collect();
        let help = match producers.first() {
            Some(p) => format!("wire it: `inputs = {{ {} = \"{p}\" }}`", s.name),
            None => format!("no node in this graph produces {}", s.ty),
        };
        let at = n.inputs.map_or(n.spans.header, |i| i.key_span);
        diags.push(
            Diagnostic::error(
                Code::MissingInput,
                format!(
                    "{} needs input `{}` ({}), which is not wired",
                    ports.what, s.name, s.ty
                ),
            )
            .at(at)
            .with_help(help),
        );
    }
}

/// The edge that the `inputs` entry `e` of node `n` declares, or an error.
fn edge(
    n: &NodeDraft<'_>,
    ports: &InputPorts,
    e: &SEntry,
    nodes: &[NodeDraft<'_>],
    diags: &mut Vec<Diagnostic>,
) -> Option<Edge> {
    let spec = match ports.specs.iter().find(|s| !s.variadic && s.name == e.key) {
        Some(s) => s,
        None => match ports.variadic() {
            Some(v) => v,
            None => {
                let names = ports.names();
                let help = did_you_mean(&e.key, names.iter().copied()).unwrap_or_else(|| {
                    if names.is_empty() {
                        "this kind takes no inputs".to_string()
                    } else {
                        format!("its inputs are: {}", names.join(", "))
                    }
                });
                diags.push(
                    Diagnostic::error(
                        Code::UnknownPort,
                        format!("{} has no input port `{}`", ports.what, e.key),
                    )
                    .at(e.key_span)
                    .with_help(help),
                );
                return None;
            }
        },
    };
    let Some(target) = e.value.as_str() else {
        diags.push(Diagnostic::wrong_type(
            &e.value,
            &ParamType::String,
            &format!("inputs.{}", e.key),
        ));
        return None;
    };
    let Some((src, port)) = target
        .rsplit_once('.')
        .filter(|(a, b)| !a.is_empty() && !b.is_empty())
    else {
        diags.push(
            Diagnostic::error(
                Code::BadWiring,
                format!(
                    "input `{}` of node `{}` must be \"node.port\", found \"{target}\"",
                    e.key, n.name
                ),
            )
            .at(e.value.span)
            .with_help(format!("e.g. `{} = \"data.prompts\"`", e.key)),
        );
        return None;
    };
    let Some(from) = nodes.iter().position(|m| m.name == src) else {
        let help = did_you_mean(src, nodes.iter().map(|m| m.name.as_str())).unwrap_or_else(|| {
            let all: Vec<&str> = nodes.iter().map(|m| m.name.as_str()).collect();
            format!("the nodes are: {}", all.join(", "))
        });
        diags.push(
            Diagnostic::error(
                Code::UnknownNode,
                format!(
                    "input `{}` of node `{}` is wired to unknown node `{src}`",
                    e.key, n.name
                ),
            )
            .at(e.value.span)
            .with_help(help),
        );
        return None;
    };
    let src_kind = nodes[from].kind.as_ref()?;
    let outs = src_kind.outputs();
    let Some(out) = outs.iter().find(|o| o.name == port) else {
        let names: Vec<&str> = outs.iter().map(|o| o.name.as_str()).collect();
        let help = did_you_mean(port, names.iter().copied()).unwrap_or_else(|| {
            if names.is_empty() {
                format!("`{src}` (kind `{}`) has no outputs", src_kind.name())
            } else {
                format!(
                    "`{src}` (kind `{}`) produces: {}",
                    src_kind.name(),
                    names.join(", ")
                )
            }
        });
        diags.push(
            Diagnostic::error(
                Code::UnknownOutput,
                format!(
                    "node `{src}` (kind `{}`) has no output port `{port}`",
                    src_kind.name()
                ),
            )
            .at(e.value.span)
            .with_help(help),
        );
        return None;
    };
    if !spec.ty.accepts(out.ty) {
        diags.push(
            Diagnostic::error(
                Code::PortTypeMismatch,
                format!(
                    "`{}.{}` expects {}, got {} from `{src}.{port}`",
                    n.name, e.key, spec.ty, out.ty
                ),
            )
            .at(e.value.span)
            .with_label(format!("this is {}", out.ty))
            .with_note(
                nodes[from].spans.header,
                format!("`{src}` (kind `{}`) is defined here", src_kind.name()),
            ),
        );
        return None;
    }
    Some(Edge {
        port: e.key.clone(),
        from,
        from_port: port.to_string(),
        ty: out.ty,
        optional: spec.optional,
    })
}
