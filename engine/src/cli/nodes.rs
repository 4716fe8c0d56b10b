//! `flowrl nodes`: the listing of the node and resource kinds, the page that describes one
//! kind (ports, parameters, placement), and the nodes of a compiled graph.

use super::{EXIT_CONFIG, NodesArgs, load};
use crate::diagnostic::did_you_mean;
use crate::node::NodeKind;
use crate::params::ParamSpec;
use crate::registry::Registry;
use crate::resource::ResourceKind;
use std::fmt::Write as _;
use std::process::ExitCode;

pub(super) fn cmd_nodes(a: &NodesArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
    if let Some(file) = &a.graph {
        let graph = match load(registry, file, &a.input, Vec::new(), 1)? {
            Ok(g) => g,
            Err(code) => return Ok(code),
        };
        match &a.kind {
            None => {
                println!(
                    "Nodes of {} (`flowrl nodes --graph FILE NODE` for ports and parameters):",
                    file.display()
                );
                let width = graph.nodes.iter().map(|n| n.name.len()).max().unwrap_or(0);
                let kw = graph
                    .nodes
                    .iter()
                    .map(|n| n.kind.name().len())
                    .max()
                    .unwrap_or(0);
                for n in &graph.nodes {
                    println!(
                        "  {:width$}  {:kw$}  {}",
                        n.name,
                        n.kind.name(),
                        summary(n.kind.doc())
                    );
                }
            }
            Some(name) => match graph.node_id(name) {
                Some(id) => print!("{}", describe_kind(graph.nodes[id].kind.as_ref())),
                None => {
                    let hint = did_you_mean(name, graph.nodes.iter().map(|n| n.name.as_str()))
                        .unwrap_or_else(|| "`flowrl nodes --graph FILE` lists them".into());
                    eprintln!("error: {} has no node `{name}`; {hint}", file.display());
                    return Ok(ExitCode::from(EXIT_CONFIG));
                }
            },
        }
        return Ok(ExitCode::SUCCESS);
    }
    match &a.kind {
        None => print!("{}", list_kinds(registry)),
        Some(name) => {
            if let Some(k) = registry.kind(name) {
                print!("{}", describe_kind(k.as_ref()));
            } else if let Some(r) = registry
                .resource_kind(name)
                .or_else(|| registry.resource_kind_for_section(name))
            {
                print!("{}", describe_resource_kind(r.as_ref()));
            } else {
                let names: Vec<&str> = registry
                    .kinds()
                    .map(|k| k.name())
                    .chain(registry.resource_kinds().map(|k| k.name()))
                    .collect();
                let hint = did_you_mean(name, names.iter().copied())
                    .unwrap_or_else(|| "`flowrl nodes` lists them".into());
                eprintln!("error: no node kind named `{name}`; {hint}");
                return Ok(ExitCode::from(EXIT_CONFIG));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn summary(doc: &str) -> &str {
    doc.lines().next().unwrap_or("")
}

/// The `flowrl nodes` listing.
pub fn list_kinds(registry: &Registry) -> String {
    let mut s = String::from("Node kinds (`flowrl nodes KIND` for ports and parameters):\n");
    let width = registry.kinds().map(|k| k.name().len()).max().unwrap_or(0);
    for k in registry.kinds() {
        let _ = writeln!(s, "  {:width$}  {}", k.name(), summary(k.doc()));
    }
    let mut rk: Vec<_> = registry.resource_kinds().collect();
    if !rk.is_empty() {
        rk.sort_by_key(|k| k.name().to_string());
        s.push_str("\nResource kinds (declared as `[SECTION.NAME]`):\n");
        for k in rk {
            let _ = writeln!(
                s,
                "  {} [{}.*]  {}",
                k.name(),
                k.section(),
                summary(k.doc())
            );
        }
    }
    s
}

fn describe_params(s: &mut String, params: &[ParamSpec], indent: &str) {
    for p in params {
        let mut line = format!("{indent}{} : {}", p.name, p.ty);
        if p.required {
            line.push_str(", required");
        }
        if let Some(d) = &p.default {
            let _ = write!(line, ", default {d}");
        }
        if let Some(r) = p.range_text() {
            let _ = write!(line, ", {r}");
        }
        let _ = writeln!(s, "{line}");
        if !p.doc.is_empty() {
            let _ = writeln!(s, "{indent}    {}", p.doc);
        }
        if let crate::params::ParamType::Table(fields) = &p.ty {
            describe_params(s, fields, &format!("{indent}    {}.", p.name));
        }
    }
}

/// The `flowrl nodes KIND` page.
pub fn describe_kind(k: &dyn NodeKind) -> String {
    let mut s = format!("{}\n\n{}\n", k.name(), k.doc().trim_end());
    if let Some(t) = k.timing_key() {
        let _ = writeln!(s, "\nTiming metric: timing_s/{t}");
    }
    let inputs = k.inputs();
    section(&mut s, "Inputs", inputs.is_empty());
    for p in inputs {
        let name = if p.variadic {
            "<any name>".to_string()
        } else {
            p.name.clone()
        };
        let opt = flag(p.optional && !p.variadic, ", optional");
        let repeated = flag(p.repeated, ", repeated (from the nodes in `repeat`)");
        let _ = writeln!(s, "  {name} : {}{opt}{repeated}{}", p.ty, dash(&p.doc));
    }
    let outputs = k.outputs();
    section(&mut s, "Outputs", outputs.is_empty());
    for p in outputs {
        let argument = flag(p.argument, ", argument (handed to the nodes in `repeat`)");
        let _ = writeln!(s, "  {} : {}{argument}{}", p.name, p.ty, dash(&p.doc));
    }
    let params = k.params();
    section(&mut s, "Parameters", params.is_empty());
    describe_params(&mut s, &params, "  ");
    s.push_str(if k.data_parallel() {
        "\nPlacement: data-parallel: one replica on each of the run's devices (`device` pins it to one)\n"
    } else {
        "\nPlacement: once per process, on the run's first device (or its `device`)\n"
    });
    s.push_str("\nEngine keys: kind, inputs = { port = \"node.port\" }, device, timing");
    s.push_str(if k.inputs().iter().any(|p| p.repeated) {
        ", repeat = [\"node\", ...]\n"
    } else {
        "\n"
    });
    s
}

pub fn describe_resource_kind(k: &dyn ResourceKind) -> String {
    let mut s = format!(
        "{} (resource, declared as [{}.NAME])\n\n{}\n\nParameters:\n",
        k.name(),
        k.section(),
        k.doc().trim_end()
    );
    describe_params(&mut s, &k.params(), "  ");
    s
}

/// A heading of the `flowrl nodes KIND` page, with `(none)` under it when nothing follows.
fn section(s: &mut String, title: &str, empty: bool) {
    let _ = writeln!(s, "\n{title}:");
    if empty {
        s.push_str("  (none)\n");
    }
}

/// `text` when `on`, else nothing.
fn flag(on: bool, text: &str) -> &str {
    if on { text } else { "" }
}

fn dash(doc: &str) -> String {
    if doc.is_empty() {
        String::new()
    } else {
        format!(" — {doc}")
    }
}
