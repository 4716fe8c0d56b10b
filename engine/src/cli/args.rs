//! The engine commands' arguments as clap parses them: the subcommands, the graph overrides and
//! the processes of a multi-process run that several commands share, and each command's own.

use crate::export::Format;
use crate::placement::{Cluster, Launch};
use crate::progress::ProgressMode;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

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
