//! `flowrl validate`: every problem of a graph at once, then a one-line summary of it and of its
//! memory plan.

use super::plan::{plan_summary, refuse_overflow};
use super::{ValidateArgs, config_error, load, machine_plan};
use crate::device::device_list;
use crate::registry::Registry;
use std::process::ExitCode;

pub(super) fn cmd_validate(a: &ValidateArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
    let world = match a.cluster.world_to_validate() {
        Ok(w) => w,
        Err(msg) => return Ok(config_error(msg)),
    };
    let graph = match load(registry, &a.graph, &a.input, Vec::new(), world)? {
        Ok(g) => g,
        Err(code) => return Ok(code),
    };
    let plan = machine_plan(&graph, registry, None);
    if let Some(code) = refuse_overflow(&plan, a.force) {
        return Ok(code);
    }
    let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let processes = if world > 1 {
        format!(" × {world} processes")
    } else {
        String::new()
    };
    println!(
        "{}: ok ({}, {}, {}; order: {}; devices: {}{processes})",
        a.graph.display(),
        count(graph.nodes.len(), "node"),
        count(graph.resources.len(), "resource"),
        count(
            graph.nodes.iter().map(|n| n.inputs.len()).sum::<usize>(),
            "edge"
        ),
        graph
            .order
            .iter()
            .map(|&i| graph.nodes[i].name.as_str())
            .collect::<Vec<_>>()
            .join(" → "),
        device_list(&graph.devices)
    );
    println!("memory: {}", plan_summary(&plan));
    Ok(ExitCode::SUCCESS)
}
