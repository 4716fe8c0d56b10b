//! The engine's command-line interface: `run`, `validate`, `plan`, `graph`, `nodes`, `plot`.
//!
//! A binary embeds these commands with `#[command(flatten)]` (see `src/main.rs`, which adds
//! `flowrl data`) or runs them alone with [`main_with`] (plugin binaries, through flowrl-nodes).
//! Exit codes:
//! 0 success, 78 configuration error (sysexits' EX_CONFIG: the graph, an override, the device, or
//! launch settings that contradict each other), 1 any other failure, 2 bad command-line usage (clap).

mod args;
mod nodes;
mod plan;
mod run;
mod validate;

pub use args::{
    ClusterArgs, Command, GraphArgs, GraphInput, NodesArgs, PlanArgs, PlotArgs, RunArgs,
    ValidateArgs,
};
pub use nodes::{describe_kind, describe_resource_kind, list_kinds};
pub use plan::machine_plan;

use crate::compile::{Override, Target, compile_for};
use crate::device::Machine;
use crate::diagnostic;
use crate::export::export;
use crate::graph::Graph;
use crate::registry::Registry;
use clap::Parser;
use std::path::Path;
use std::process::ExitCode;

/// sysexits' EX_CONFIG.
pub const EXIT_CONFIG: u8 = 78;

/// A standalone CLI with only the engine's commands.
#[derive(Debug, Parser)]
#[command(version, about = "flowrl: RL post-training graphs", long_about = None)]
struct EngineCli {
    #[command(subcommand)]
    command: Command,
}

/// Parses the process arguments and runs an engine command with `registry` (for plugin
/// binaries, through flowrl-nodes' `main_with_builtin_and`).
pub fn main_with(registry: Registry) -> ExitCode {
    let cli = EngineCli::parse();
    execute(&cli.command, &registry)
}

/// Runs one command; returns the process exit code.
pub fn execute(cmd: &Command, registry: &Registry) -> ExitCode {
    let result = match cmd {
        Command::Run(a) => run::cmd_run(a, registry),
        Command::Validate(a) => validate::cmd_validate(a, registry),
        Command::Plan(a) => plan::cmd_plan(a, registry),
        Command::Graph(a) => cmd_graph(a, registry),
        Command::Nodes(a) => nodes::cmd_nodes(a, registry),
        Command::Plot(a) => {
            let options = crate::plot::PlotOptions { smooth: a.smooth };
            crate::plot::plot_runs(&a.runs, a.output.as_deref(), &options).map(|p| {
                println!("wrote {}", p.display());
                ExitCode::SUCCESS
            })
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::FAILURE
    })
}

/// Reads and compiles a graph for this machine and `world` processes (devices and placement are
/// checked there); on failure prints the diagnostics and returns the exit code.
fn load(
    registry: &Registry,
    path: &Path,
    input: &GraphInput,
    extra: Vec<Override>,
    world: usize,
) -> anyhow::Result<Result<Graph, ExitCode>> {
    load_for(registry, path, input, extra, world, Machine::detect())
}

/// [`load`] for another machine (`flowrl plan --gpu`).
fn load_for(
    registry: &Registry,
    path: &Path,
    input: &GraphInput,
    extra: Vec<Override>,
    world: usize,
    machine: Machine,
) -> anyhow::Result<Result<Graph, ExitCode>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read graph file {}: {e}", path.display()))?;
    let mut overrides = Override::sets(&input.set);
    overrides.extend(extra);
    if let Some(d) = &input.device {
        overrides.push(Override::device(d));
    }
    let target = Target { machine, world };
    match compile_for(
        registry,
        &path.display().to_string(),
        &text,
        &overrides,
        &target,
    ) {
        Ok((graph, warnings)) => {
            if !warnings.is_empty() {
                eprint!("{}", diagnostic::render(&warnings, &graph.sources));
            }
            Ok(Ok(graph))
        }
        Err(f) => {
            eprint!("{}", f.render());
            Ok(Err(ExitCode::from(EXIT_CONFIG)))
        }
    }
}

/// A bad flag value is a usage error (exit code 2).
fn usage_error(msg: String) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(2)
}

/// Launch settings (flags, launcher variables, the graph's devices) that contradict each other
/// are a configuration error (exit code 78).
fn config_error(msg: String) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(EXIT_CONFIG)
}

fn cmd_graph(a: &GraphArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
    let graph = match load(registry, &a.graph, &a.input, Vec::new(), 1)? {
        Ok(g) => g,
        Err(code) => return Ok(code),
    };
    let text = export(&graph, a.format);
    match &a.output {
        Some(p) => {
            std::fs::write(p, text)?;
            eprintln!("wrote {}", p.display());
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}
