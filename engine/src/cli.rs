//! The engine's command-line interface: `run`, `validate`, `plan`, `graph`, `nodes`, `plot`.
//!
//! A binary embeds these commands with `#[command(flatten)]` (see `src/main.rs`, which adds
//! `flowrl data`) or runs them alone with [`main_with`] (plugin binaries, through flowrl-nodes).
//! Exit codes:
//! 0 success, 78 configuration error (sysexits' EX_CONFIG: the graph, an override, the device, or
//! launch settings that contradict each other), 1 any other failure, 2 bad command-line usage (clap).

use crate::compile::{Override, Target, compile_for};
use crate::device::{DeviceSpec, Machine, device_list};
use crate::diagnostic::{self, did_you_mean};
use crate::export::{Format, export};
use crate::graph::Graph;
use crate::node::NodeKind;
use crate::params::ParamSpec;
use crate::placement::{Cluster, Launch};
use crate::plan::{self, GPU_MODELS, GpuModel, Plan, Pool};
use crate::progress::ProgressMode;
use crate::registry::Registry;
use crate::resource::ResourceKind;
use crate::run::{RunOptions, run};
use crate::rundir::RunDir;
use clap::{Args, Parser, Subcommand};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// sysexits' EX_CONFIG.
pub const EXIT_CONFIG: u8 = 78;

const GRAPH_HELP: &str = "\
A graph file is TOML: a [run] section (steps, seed, device, ...), resources such as
[models.policy], and nodes [nodes.NAME] with `kind = \"...\"`, `inputs = { port = \"node.port\" }`
and the kind's parameters. `flowrl nodes` lists the kinds and their parameters.";

const SCALE_OUT_HELP: &str = "\
Devices: `[run] device = \"cuda:0\"` or `[run] devices = [\"cuda:0\", \"cuda:1\"]` (or CPU replicas
`[\"cpu:0\", \"cpu:1\"]`, or `vulkan:N`). Data-parallel nodes (rollout, logprob, update.*) run one replica per
device and all-reduce their gradients; other nodes run on the first device or their own `device`.

Several processes (one per machine, or one per GPU): every process runs the same graph with its
rank, the number of processes and rank 0's address, which rank 0 listens on:
  flowrl run g.toml --rank 0 --world 2 --master HOST0:29500
  flowrl run g.toml --rank 1 --world 2 --master HOST0:29500
or reads them from torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or Slurm's
(SLURM_PROCID, SLURM_NTASKS, the first host of SLURM_JOB_NODELIST, MASTER_PORT or 29500).
Without --out each process writes its own run directory (suffix -rankR). A process that fails,
dies or stops answering stops the others within --collective-timeout seconds (30 for a process
that stopped answering), naming it.";

/// The engine's subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Check a graph, then run it step by step (metrics, checkpoints, plots in a run directory).
    #[command(
        after_help = "Examples:\n  flowrl run graphs/grpo_vlm.toml\n  flowrl run graphs/grpo_vlm.toml --steps 10 --set nodes.rollout.n=4 --out runs/try\n  flowrl run --resume runs/try --steps 20",
        after_long_help = SCALE_OUT_HELP
    )]
    Run(RunArgs),
    /// Check a graph and report every problem at once (exit code 78 if there is one).
    #[command(after_help = GRAPH_HELP, after_long_help = SCALE_OUT_HELP)]
    Validate(ValidateArgs),
    /// Export a graph as Graphviz dot, Mermaid, a self-contained HTML page, or JSON.
    #[command(
        after_help = "Example:\n  flowrl graph graphs/grpo_vlm.toml --format dot | dot -Tsvg > graph.svg"
    )]
    Graph(GraphArgs),
    /// List the node kinds (and resource kinds), or describe one: ports, parameters, defaults.
    Nodes(NodesArgs),
    /// Draw the main curves of one run or several (overlaid) into an SVG file.
    Plot(PlotArgs),
    /// Predict a graph's memory per device, host and process, and its time per step, before
    /// anything loads.
    #[command(
        after_help = "Examples:\n  flowrl plan graphs/grpo_vlm.toml\n  flowrl plan graphs/grpo_vlm.toml --json            (schema: docs/plan.md)\n  flowrl plan graphs/grpo_vlm.toml --gpu h200 --device cuda:0\n  flowrl plan my_8gpu_graph.toml --gpu h100 --gpus 8  ([run] devices = [\"cuda:0\", ...])"
    )]
    Plan(PlanArgs),
}

/// Overrides shared by the commands that read a graph.
#[derive(Debug, Clone, Args)]
pub struct GraphInput {
    /// Override any key of the graph, checked like the file: `--set nodes.rollout.n=4`
    /// (values are TOML; text that is not a TOML value is a string). Repeatable.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    /// Device: `auto` (CUDA when built with it and a GPU is present, else CPU), `cpu[:N]`,
    /// `cuda[:N]`, `vulkan[:N]` (feature `vulkan`: any Vulkan driver, Mesa's software one
    /// included). Overrides `[run] device` (an error when the graph lists `[run] devices`).
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
}

/// The processes of a multi-process run: every process runs the same graph with its own rank.
/// Flags not given are read from torchrun's or Slurm's variables ([`Cluster::from_launch`]).
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// This process's rank, 0..WORLD (default: RANK or SLURM_PROCID, else 0).
    #[arg(long, value_name = "R")]
    pub rank: Option<usize>,
    /// Number of processes of the run (default: WORLD_SIZE or SLURM_NTASKS, else 1).
    #[arg(long, value_name = "W")]
    pub world: Option<usize>,
    /// Rank 0's address, which rank 0 listens on and the others connect to (default:
    /// MASTER_ADDR:MASTER_PORT, or the first host of SLURM_JOB_NODELIST). Needed by `run` when
    /// the run has several processes.
    #[arg(long, value_name = "HOST:PORT")]
    pub master: Option<String>,
    /// Seconds the rendezvous and each collective operation wait for the other processes before
    /// the run stops with an error naming the missing one.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub collective_timeout: u64,
}

impl ClusterArgs {
    fn launch(&self) -> Launch<'_> {
        Launch {
            rank: self.rank,
            world: self.world,
            master: self.master.as_deref(),
            timeout: Duration::from_secs(self.collective_timeout),
        }
    }

    /// The checked cluster (`None` for one process); the error names the flag or variable at
    /// fault.
    pub fn cluster(&self) -> Result<Option<Cluster>, String> {
        Cluster::from_launch(&self.launch(), &|k| std::env::var(k).ok())
    }

    /// The number of processes `validate` checks the graph for: the ranks are checked as for
    /// `run`, but `validate` connects to nothing and so needs no address.
    pub fn world_to_validate(&self) -> Result<usize, String> {
        Cluster::ranks(&self.launch(), &|k| std::env::var(k).ok()).map(|(_, world)| world)
    }
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
    /// Replace a run that already exists in --out; run a graph whose memory plan does not fit.
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
    #[command(flatten, next_help_heading = "Several processes")]
    pub cluster: ClusterArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ValidateArgs {
    pub graph: PathBuf,
    /// Accept a graph whose memory plan exceeds a device's (or the host's) memory.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub input: GraphInput,
    #[command(flatten, next_help_heading = "Several processes")]
    pub cluster: ClusterArgs,
}

#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    pub graph: PathBuf,
    /// Print the plan as JSON (schema: docs/plan.md).
    #[arg(long)]
    pub json: bool,
    /// Plan for a machine with GPUs of this model instead of this machine's devices (datasheet
    /// memory and throughput): h200, h100, a100.
    #[arg(long, value_name = "MODEL")]
    pub gpu: Option<String>,
    /// GPUs of the machine --gpu describes (the graph's devices say which of them the run uses).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "gpu")]
    pub gpus: usize,
    #[command(flatten)]
    pub input: GraphInput,
    #[command(flatten, next_help_heading = "Several processes")]
    pub cluster: ClusterArgs,
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
#[command(
    after_help = "Examples:\n  flowrl plot runs/try\n  flowrl plot runs/try --smooth 0.6\n  flowrl plot runs/a runs/b ~/verl/logs/grpo/qwen.jsonl -o compare.svg"
)]
pub struct PlotArgs {
    /// Runs to draw, overlaid: run directories, or metrics files (flowrl's metrics.jsonl, or the
    /// JSON lines of verl's `trainer.logger=['file']`).
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// Output file (default with one run: RUN_DIR/plots.svg, or FILE's name with .svg for a
    /// metrics file named otherwise; required with several runs).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Draw dense training curves as exponential moving averages with this weight (0 ≤ W < 1,
    /// as TensorBoard's smoothing), the values faint behind; validation and other sparse series
    /// are never smoothed.
    #[arg(long, value_name = "W", default_value_t = 0.0)]
    pub smooth: f64,
}

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
        Command::Run(a) => cmd_run(a, registry),
        Command::Validate(a) => cmd_validate(a, registry),
        Command::Plan(a) => cmd_plan(a, registry),
        Command::Graph(a) => cmd_graph(a, registry),
        Command::Nodes(a) => cmd_nodes(a, registry),
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

/// The device a process with a local rank (torchrun's `LOCAL_RANK`, Slurm's `SLURM_LOCALID`)
/// runs on: process L of a machine, one GPU each, takes the machine's GPU L — the graph's one GPU
/// (`cuda`, `cuda:0`, `auto` on a GPU machine) counted from there, as torchrun's convention wants
/// — unless `--device` names it, or `CUDA_VISIBLE_DEVICES` already gives the process one GPU (a
/// launcher binding each task to its GPU). `Ok(None)`: the graph's devices stand. A graph that
/// lists several devices per process, with local rank above 0, contradicts one process per GPU:
/// an error naming both.
fn local_device(
    cluster: Option<&Cluster>,
    devices: &[DeviceSpec],
    device_flag: Option<&str>,
    visible: Option<&str>,
) -> Result<Option<String>, String> {
    let Some((local, var)) = cluster.and_then(|c| c.local_rank) else {
        return Ok(None);
    };
    let bound = visible.is_some_and(|v| v.split(',').filter(|s| !s.trim().is_empty()).count() == 1);
    if local == 0 || device_flag.is_some() || bound {
        return Ok(None);
    }
    match devices {
        [DeviceSpec::Cpu(_)] => Ok(None),
        [DeviceSpec::Cuda(n)] => Ok(Some(format!("cuda:{}", n + local))),
        [DeviceSpec::Vulkan(n)] => Ok(Some(format!("vulkan:{}", n + local))),
        several => Err(format!(
            "{var}={local} contradicts the graph's [run] devices = [{}]: with one process per \
             GPU each process names one device (the process of {var} L runs on the graph's GPU \
             counted from L, or on --device); a graph that lists several devices runs one \
             process per machine",
            device_list(several)
        )),
    }
}

fn cmd_run(a: &RunArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
    let cluster = match a.cluster.cluster() {
        Ok(c) => c,
        Err(msg) => return Ok(config_error(msg)),
    };
    let world = cluster.as_ref().map_or(1, |c| c.world);
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
    let mut graph = match load(registry, &graph_file, &a.input, extra.clone(), world)? {
        Ok(g) => g,
        Err(code) => return Ok(code),
    };
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    match local_device(
        cluster.as_ref(),
        &graph.devices,
        a.input.device.as_deref(),
        visible.as_deref(),
    ) {
        Ok(None) => {}
        Ok(Some(device)) => {
            let input = GraphInput {
                device: Some(device),
                ..a.input.clone()
            };
            graph = match load(registry, &graph_file, &input, extra, world)? {
                Ok(g) => g,
                Err(code) => return Ok(code),
            };
        }
        Err(msg) => return Ok(config_error(msg)),
    }
    let plan = machine_plan(&graph, registry, None);
    if let Some(code) = refuse_overflow(&plan, a.force) {
        return Ok(code);
    }
    let cluster = cluster.map(|mut c| {
        c.fingerprint = fingerprint(&graph_file, a, &graph, a.resume.as_deref());
        c
    });
    let opts = RunOptions {
        plan: Some(crate::run::PlanRecord::of(
            &plan,
            registry.device_probe().cloned(),
        )),
        graph_file: Some(graph_file),
        out,
        resume,
        force: a.force,
        progress: a.progress,
        cluster,
    };
    let s = run(graph, &opts)?;
    if let Some(step) = s.stopped_after {
        println!(
            "stopped by SIGTERM after step {step} of {} (checkpoint written); run directory: {}",
            s.steps,
            s.run_dir.display()
        );
    } else if s.first_step >= s.steps {
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

/// What every process of a run must agree on (checked at the rendezvous): the graph file's text
/// with the overrides and steps, the number of devices per process (replica indices depend on
/// it), and whether it resumes, from which checkpoint step (`resume`: the run directory). The
/// devices themselves may differ (`--device cuda:$LOCAL_RANK`).
fn fingerprint(
    graph_file: &Path,
    a: &RunArgs,
    graph: &Graph,
    resume: Option<&Path>,
) -> Vec<(String, String)> {
    let resumes = match resume {
        None => "no".to_string(),
        Some(dir) => match RunDir::open(dir).and_then(|d| d.resume_point()) {
            Ok(Some(point)) => format!("from the checkpoint of step {}", point.completed_steps),
            Ok(None) => "from step 1 (no checkpoint yet)".to_string(),
            Err(e) => format!("from an unusable run directory ({e:#})"),
        },
    };
    let mut hash = crc32fast::Hasher::new();
    hash.update(&std::fs::read(graph_file).unwrap_or_default());
    for s in &a.input.set {
        hash.update(s.as_bytes());
        hash.update(b"\n");
    }
    vec![
        (
            "graph file and --set overrides (crc32)".into(),
            format!("{:08x}", hash.finalize()),
        ),
        ("steps".into(), graph.run.steps.to_string()),
        (
            "devices per process".into(),
            graph.devices.len().to_string(),
        ),
        ("--resume".into(), resumes),
    ]
}

fn cmd_validate(a: &ValidateArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
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

fn cmd_plan(a: &PlanArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
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
fn plan_summary(plan: &Plan) -> String {
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
fn refuse_overflow(plan: &Plan, force: bool) -> Option<ExitCode> {
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

fn cmd_nodes(a: &NodesArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(local: Option<usize>) -> Cluster {
        Cluster {
            rank: 3,
            world: 4,
            master: "h:1".into(),
            timeout: Duration::from_secs(1),
            fingerprint: Vec::new(),
            local_rank: local.map(|l| (l, "LOCAL_RANK")),
        }
    }

    #[test]
    fn the_local_rank_picks_the_processs_gpu() {
        let one = [DeviceSpec::Cuda(0)];
        let c = cluster(Some(3));
        assert_eq!(
            local_device(Some(&c), &one, None, None),
            Ok(Some("cuda:3".into()))
        );
        let vk = [DeviceSpec::Vulkan(1)];
        assert_eq!(
            local_device(Some(&c), &vk, None, None),
            Ok(Some("vulkan:4".into()))
        );
        // The devices stand: CPU replicas, local rank 0 or none, --device, a bound GPU.
        assert_eq!(
            local_device(Some(&c), &[DeviceSpec::Cpu(0)], None, None),
            Ok(None)
        );
        assert_eq!(
            local_device(Some(&cluster(Some(0))), &one, None, None),
            Ok(None)
        );
        assert_eq!(
            local_device(Some(&cluster(None)), &one, None, None),
            Ok(None)
        );
        assert_eq!(local_device(None, &one, None, None), Ok(None));
        assert_eq!(local_device(Some(&c), &one, Some("cuda:1"), None), Ok(None));
        assert_eq!(local_device(Some(&c), &one, None, Some("5")), Ok(None));
        assert_eq!(
            local_device(Some(&c), &one, None, Some("0,1,2,3")),
            Ok(Some("cuda:3".into()))
        );
        let err = local_device(
            Some(&c),
            &[DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)],
            None,
            None,
        )
        .unwrap_err();
        assert!(
            err.starts_with(
                "LOCAL_RANK=3 contradicts the graph's [run] devices = [cuda:0, cuda:1]"
            ),
            "{err}"
        );
    }
}
