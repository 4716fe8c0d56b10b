//! The engine's command-line interface: `run`, `validate`, `graph`, `nodes`, `plot`.
//!
//! A binary embeds these commands with `#[command(flatten)]` (see `src/main.rs`, which adds
//! `flowrl data`) or runs them alone with [`main_with`] (see `examples/custom_node`). Exit codes:
//! 0 success, 78 configuration error (sysexits' EX_CONFIG: the graph, an override or the device),
//! 1 any other failure, 2 bad command-line usage (clap).

use crate::compile::{Override, compile};
use crate::device::{DeviceRequest, DeviceSpec};
use crate::diagnostic::{self, did_you_mean};
use crate::export::{Format, export};
use crate::graph::Graph;
use crate::node::NodeKind;
use crate::params::ParamSpec;
use crate::progress::ProgressMode;
use crate::registry::Registry;
use crate::resource::ResourceKind;
use crate::run::{RunOptions, run};
use crate::rundir::RunDir;
use clap::{Args, Parser, Subcommand};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// sysexits' EX_CONFIG.
pub const EXIT_CONFIG: u8 = 78;

const GRAPH_HELP: &str = "\
A graph file is TOML: a [run] section (steps, seed, device, ...), resources such as
[models.policy], and nodes [nodes.NAME] with `kind = \"...\"`, `inputs = { port = \"node.port\" }`
and the kind's parameters. `flowrl nodes` lists the kinds and their parameters.";

/// The engine's subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Check a graph, then run it step by step (metrics, checkpoints, plots in a run directory).
    #[command(
        after_help = "Examples:\n  flowrl run graphs/grpo_vlm.toml\n  flowrl run graphs/grpo_vlm.toml --steps 10 --set nodes.rollout.n=4 --out runs/try\n  flowrl run --resume runs/try --steps 20"
    )]
    Run(RunArgs),
    /// Check a graph and report every problem at once (exit code 78 if there is one).
    #[command(after_help = GRAPH_HELP)]
    Validate(ValidateArgs),
    /// Export a graph as Graphviz dot, Mermaid, a self-contained HTML page, or JSON.
    #[command(
        after_help = "Example:\n  flowrl graph graphs/grpo_vlm.toml --format dot | dot -Tsvg > graph.svg"
    )]
    Graph(GraphArgs),
    /// List the node kinds (and resource kinds), or describe one: ports, parameters, defaults.
    Nodes(NodesArgs),
    /// Draw the main curves of a run (metrics.jsonl) into an SVG file.
    Plot(PlotArgs),
}

/// Overrides shared by the commands that read a graph.
#[derive(Debug, Clone, Args)]
pub struct GraphInput {
    /// Override any key of the graph, checked like the file: `--set nodes.rollout.n=4`
    /// (values are TOML; text that is not a TOML value is a string). Repeatable.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    /// Device: `auto` (CUDA when built with it and a GPU is present, else CPU), `cpu`, `cuda`,
    /// `cuda:N`. Overrides `[run] device`.
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The graph file (not needed with --resume, which uses the run's saved graph).
    #[arg(required_unless_present = "resume")]
    pub graph: Option<PathBuf>,
    /// Run directory. Default: a new timestamped directory under `[run] out` or `runs/<graph>`.
    #[arg(long, conflicts_with = "resume")]
    pub out: Option<PathBuf>,
    /// Continue the run in DIR from its newest checkpoint.
    #[arg(long, value_name = "DIR", conflicts_with = "graph")]
    pub resume: Option<PathBuf>,
    /// Replace a run that already exists in --out.
    #[arg(long)]
    pub force: bool,
    /// Number of steps (overrides `[run] steps`; with --resume, the new total).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Progress display.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,
    #[command(flatten)]
    pub input: GraphInput,
}

#[derive(Debug, Clone, Args)]
pub struct ValidateArgs {
    pub graph: PathBuf,
    #[command(flatten)]
    pub input: GraphInput,
}

#[derive(Debug, Clone, Args)]
pub struct GraphArgs {
    pub graph: PathBuf,
    #[arg(long, short, value_enum, default_value_t = Format::Dot)]
    pub format: Format,
    /// Write to FILE instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub input: GraphInput,
}

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Examples:\n  flowrl nodes rollout\n  flowrl nodes --graph examples/python_reward/grpo_python_reward.toml reward"
)]
pub struct NodesArgs {
    /// A node kind (or resource kind) to describe in full; with --graph, a node of that graph.
    pub kind: Option<String>,
    /// List the nodes of this graph as compiled (kinds that take their ports and parameters
    /// from the node, such as `exec`, show what the node declares).
    #[arg(long, value_name = "FILE")]
    pub graph: Option<PathBuf>,
    #[command(flatten)]
    pub input: GraphInput,
}

#[derive(Debug, Clone, Args)]
pub struct PlotArgs {
    /// A run directory (holding metrics.jsonl).
    pub run_dir: PathBuf,
    /// Output file (default: RUN_DIR/plots.svg).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

/// A standalone CLI with only the engine's commands.
#[derive(Debug, Parser)]
#[command(version, about = "flowrl: RL post-training graphs", long_about = None)]
struct EngineCli {
    #[command(subcommand)]
    command: Command,
}

/// Parses the process arguments and runs an engine command with `registry` (for binaries that
/// add their own kinds, e.g. `examples/custom_node`).
pub fn main_with(registry: Registry) -> ExitCode {
    let cli = EngineCli::parse();
    execute(&cli.command, &registry)
}

/// Runs one command; returns the process exit code.
pub fn execute(cmd: &Command, registry: &Registry) -> ExitCode {
    let result = match cmd {
        Command::Run(a) => cmd_run(a, registry),
        Command::Validate(a) => cmd_validate(a, registry),
        Command::Graph(a) => cmd_graph(a, registry),
        Command::Nodes(a) => cmd_nodes(a, registry),
        Command::Plot(a) => crate::plot::plot_run(&a.run_dir, a.output.as_deref()).map(|p| {
            println!("wrote {}", p.display());
            ExitCode::SUCCESS
        }),
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::FAILURE
    })
}

/// Reads and compiles a graph; on failure prints the diagnostics and returns the exit code.
fn load(
    registry: &Registry,
    path: &Path,
    input: &GraphInput,
    extra: Vec<Override>,
) -> anyhow::Result<Result<Graph, ExitCode>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read graph file {}: {e}", path.display()))?;
    let mut overrides = Override::sets(&input.set);
    overrides.extend(extra);
    if let Some(d) = &input.device {
        overrides.push(Override::new("--device", format!("run.device=\"{d}\"")));
    }
    match compile(registry, &path.display().to_string(), &text, &overrides) {
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

fn resolve_device(graph: &Graph) -> Result<DeviceSpec, String> {
    graph.run.device.parse::<DeviceRequest>()?.resolve()
}

/// [`load`], then resolves the run device; an unusable device is printed and returns the config
/// exit code.
fn load_on_device(
    registry: &Registry,
    path: &Path,
    input: &GraphInput,
    extra: Vec<Override>,
) -> anyhow::Result<Result<(Graph, DeviceSpec), ExitCode>> {
    let graph = match load(registry, path, input, extra)? {
        Ok(g) => g,
        Err(code) => return Ok(Err(code)),
    };
    match resolve_device(&graph) {
        Ok(d) => Ok(Ok((graph, d))),
        Err(msg) => {
            eprintln!("error: {msg}");
            Ok(Err(ExitCode::from(EXIT_CONFIG)))
        }
    }
}

fn cmd_run(a: &RunArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
    let extra: Vec<Override> = a
        .steps
        .map(|s| Override::new("--steps", format!("run.steps={s}")))
        .into_iter()
        .collect();
    let (graph_file, out, resume) = match &a.resume {
        Some(dir) => (RunDir::open(dir)?.graph_file(), Some(dir.clone()), true),
        None => (
            a.graph.clone().expect("clap requires it"),
            a.out.clone(),
            false,
        ),
    };
    let graph = match load_on_device(registry, &graph_file, &a.input, extra)? {
        Ok((g, _)) => g,
        Err(code) => return Ok(code),
    };
    let opts = RunOptions {
        graph_file: Some(graph_file),
        out,
        resume,
        force: a.force,
        progress: a.progress,
    };
    let s = run(graph, &opts)?;
    if s.first_step >= s.steps {
        println!(
            "{}: all {} steps already ran (pass --steps N to run more)",
            s.run_dir.display(),
            s.first_step
        );
    } else {
        println!(
            "finished steps {}..{} in {:.1}s; run directory: {}",
            s.first_step + 1,
            s.steps,
            s.seconds,
            s.run_dir.display()
        );
    }
    if let Some(p) = s.plot {
        println!("plots: {}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_validate(a: &ValidateArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
    let graph = match load_on_device(registry, &a.graph, &a.input, Vec::new())? {
        Ok((g, _)) => g,
        Err(code) => return Ok(code),
    };
    let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    println!(
        "{}: ok ({}, {}, {}; order: {})",
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
            .join(" → ")
    );
    Ok(ExitCode::SUCCESS)
}

fn cmd_graph(a: &GraphArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
    let (graph, run_device) = match load_on_device(registry, &a.graph, &a.input, Vec::new())? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let devices: Vec<DeviceSpec> = graph
        .nodes
        .iter()
        .map(|n| {
            n.device
                .and_then(|r| r.resolve().ok())
                .unwrap_or(run_device)
        })
        .collect();
    let text = export(&graph, &devices, a.format);
    match &a.output {
        Some(p) => {
            std::fs::write(p, text)?;
            eprintln!("wrote {}", p.display());
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_nodes(a: &NodesArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
    if let Some(file) = &a.graph {
        let graph = match load(registry, file, &a.input, Vec::new())? {
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
    s.push_str("\nInputs:\n");
    let inputs = k.inputs();
    if inputs.is_empty() {
        s.push_str("  (none)\n");
    }
    for p in inputs {
        let name = if p.variadic {
            "<any name>".to_string()
        } else {
            p.name.clone()
        };
        let opt = if p.optional && !p.variadic {
            ", optional"
        } else {
            ""
        };
        let _ = writeln!(s, "  {name} : {}{opt}{}", p.ty, dash(&p.doc));
    }
    s.push_str("\nOutputs:\n");
    let outputs = k.outputs();
    if outputs.is_empty() {
        s.push_str("  (none)\n");
    }
    for p in outputs {
        let _ = writeln!(s, "  {} : {}{}", p.name, p.ty, dash(&p.doc));
    }
    s.push_str("\nParameters:\n");
    let params = k.params();
    if params.is_empty() {
        s.push_str("  (none)\n");
    }
    describe_params(&mut s, &params, "  ");
    s.push_str("\nEngine keys: kind, inputs = { port = \"node.port\" }, device, timing\n");
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

fn dash(doc: &str) -> String {
    if doc.is_empty() {
        String::new()
    } else {
        format!(" — {doc}")
    }
}
