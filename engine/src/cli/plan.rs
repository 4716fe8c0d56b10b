//! `flowrl plan` and the memory plan the other commands check before they run a graph: the plan
//! on this machine or on GPUs of a named model, its one-line summary, and the refusal of a plan
//! that does not fit.

use super::{EXIT_CONFIG, PlanArgs, config_error, load_for, usage_error};
use crate::device::{DeviceSpec, Machine};
use crate::graph::Graph;
use crate::plan::{self, GPU_MODELS, GpuModel, Plan, Pool};
use crate::registry::Registry;
use std::process::ExitCode;

pub(super) fn cmd_plan(a: &PlanArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
    let world = match a.cluster.world_to_validate() {
        Ok(w) => w,
        Err(msg) => return Ok(config_error(msg)),
    };
    let gpu = match &a.gpu {
        None => None,
        Some(name) => match GpuModel::named(name) {
            Some(g) => Some(g),
            None => {
                let names: Vec<&str> = GPU_MODELS.iter().map(|g| g.name).collect();
                return Ok(usage_error(format!(
                    "--gpu {name}: unknown GPU model; known: {}",
                    names.join(", ")
                )));
            }
        },
    };
    let machine = match gpu {
        Some(_) => Machine {
            cuda_compiled: true,
            gpus: a.gpus,
            vulkan_compiled: crate::device::vulkan_compiled(),
        },
        None => Machine::detect(),
    };
    let graph = match load_for(registry, &a.graph, &a.input, Vec::new(), world, machine)? {
        Ok(g) => g,
        Err(code) => return Ok(code),
    };
    let plan = machine_plan(&graph, registry, gpu);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&plan::to_json(&plan))?);
    } else {
        println!(
            "Plan of {} (estimates, before anything loads):\n",
            a.graph.display()
        );
        print!("{}", plan::render(&plan));
    }
    Ok(ExitCode::SUCCESS)
}

/// The plan of `graph` on this machine's devices (as the registry's probe measures them), or
/// on GPUs of model `gpu` (datasheet figures).
pub fn machine_plan(graph: &Graph, registry: &Registry, gpu: Option<&GpuModel>) -> Plan {
    let runtime = || plan::process_rss_bytes().unwrap_or(0);
    let info = |d: DeviceSpec| match (d, gpu) {
        (DeviceSpec::Cuda(_), Some(g)) => g.info(),
        _ => registry
            .device_probe()
            .map(|p| p.probe(d))
            .unwrap_or_default(),
    };
    plan::plan(graph, &info, &runtime)
}

/// One line for `validate`: each pool's peak against what it holds.
pub(super) fn plan_summary(plan: &Plan) -> String {
    let mut parts = Vec::new();
    for p in &plan.pools {
        let show = match p.pool {
            Pool::Device(d) => d.type_name() != "cpu",
            Pool::Host => false,
            Pool::Process => true,
        };
        if !show {
            continue;
        }
        let cap = p
            .capacity
            .as_ref()
            .map(|(c, _)| format!(" of {}", plan::report_gib(*c)))
            .unwrap_or_default();
        parts.push(format!(
            "{} peak {}{cap}",
            p.pool,
            plan::report_gib(p.peak_bytes)
        ));
    }
    if !plan.unknown.is_empty() {
        parts.push(format!(
            "{} unknown (`flowrl plan` lists them)",
            plan.unknown.len()
        ));
    }
    parts.join("; ")
}

/// A plan that does not fit: the table and what to change, exit code 78, unless `force`.
/// Kinds that declare nothing are a warning: the check cannot see them.
pub(super) fn refuse_overflow(plan: &Plan, force: bool) -> Option<ExitCode> {
    for u in &plan.unknown {
        eprintln!("warning: the memory plan cannot size {u}: it is run unchecked");
    }
    let over = plan.overflows();
    if over.is_empty() {
        return None;
    }
    let what: Vec<String> = over
        .iter()
        .map(|p| {
            format!(
                "{} needs {} but holds {}",
                p.pool,
                plan::report_gib(p.peak_bytes),
                plan::report_gib(p.capacity.as_ref().map_or(0, |c| c.0))
            )
        })
        .collect();
    if force {
        eprintln!(
            "warning: the memory plan does not fit ({}); running anyway (--force)",
            what.join("; ")
        );
        return None;
    }
    eprintln!(
        "error: the graph does not fit in memory: {}\n",
        what.join("; ")
    );
    eprint!("{}", plan::render(plan));
    eprintln!("\n(`--force` runs it anyway)");
    Some(ExitCode::from(EXIT_CONFIG))
}
