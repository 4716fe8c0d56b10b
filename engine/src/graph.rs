//! The typed graph: the output of the compiler and the input of the scheduler.
//!
//! Every node has a resolved kind, validated parameters (defaults filled), typed input edges and a
//! placement (its devices, resolved on the machine the graph was compiled for); resources likewise. `order` is a topological order of the nodes; `dag` is the same
//! dependency structure as a petgraph graph (used for cycle reports and export).

use crate::device::DeviceSpec;
use crate::diagnostic::{SourceMap, Span};
use crate::node::NodeKind;
use crate::port::PortType;
use crate::resource::ResourceKind;
use crate::{ParamChoice, Params};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

pub type NodeId = usize;
pub type ResourceId = usize;

/// Where the parts of one node or resource table are in the sources.
#[derive(Clone, Debug, Default)]
pub struct SpanIndex {
    /// The table's header (`[nodes.rollout]`), or its key for inline tables.
    pub header: Span,
    /// Value spans by dotted key path (`"n"`, `"kl.coef"`, `"inputs.prompts"`).
    pub values: BTreeMap<String, Span>,
    /// Key spans by dotted key path.
    pub keys: BTreeMap<String, Span>,
}

impl SpanIndex {
    pub fn has(&self, path: &str) -> bool {
        self.values.contains_key(path)
    }
    /// The value's span, else the header's.
    pub fn value_span(&self, path: &str) -> Span {
        self.values.get(path).copied().unwrap_or(self.header)
    }
    pub fn key_span(&self, path: &str) -> Span {
        self.keys.get(path).copied().unwrap_or(self.header)
    }
}

/// An input edge: `port = "from.from_port"`.
#[derive(Clone, Debug)]
pub struct Edge {
    pub port: String,
    pub from: NodeId,
    pub from_port: String,
    pub ty: PortType,
    /// Whether the input port is optional (a skipped producer does not skip this node).
    pub optional: bool,
}

pub struct GraphNode {
    pub name: String,
    pub kind: Arc<dyn NodeKind>,
    pub params: Params,
    pub inputs: Vec<Edge>,
    /// `device = "..."` on the node (one of the run's devices); `None`: the node runs on the run's
    /// devices (all of them for a data-parallel kind, the first one otherwise).
    pub device: Option<DeviceSpec>,
    /// `timing_s/<timing_key>` in the metrics.
    pub timing_key: String,
    /// The nodes this node runs on demand within a step (`repeat = [...]`, see
    /// [`crate::repeat`]), in a topological order.
    pub repeat: Vec<NodeId>,
    /// The loop node that repeats this node, if any (the scheduler then never dispatches it).
    pub repeated_by: Option<NodeId>,
    pub spans: SpanIndex,
}

impl GraphNode {
    /// The devices this node runs on in a process whose devices are `run_devices`.
    pub fn devices(&self, run_devices: &[DeviceSpec]) -> Vec<DeviceSpec> {
        crate::placement::node_devices(self.kind.data_parallel(), self.device, run_devices)
    }

    /// True when the node runs one replica per run device (a data-parallel kind not pinned to
    /// one device).
    pub fn spans_run_devices(&self) -> bool {
        self.kind.data_parallel() && self.device.is_none()
    }
}

pub struct GraphResource {
    pub name: String,
    pub kind: Arc<dyn ResourceKind>,
    pub params: Params,
    /// `device = "..."` in its section (one of the run's devices); `None`: the run's first
    /// device.
    pub device: Option<DeviceSpec>,
    /// Resources this one refers to (built first).
    pub depends: Vec<ResourceId>,
    pub spans: SpanIndex,
}

impl GraphResource {
    /// The device the resource is built on in a process whose devices are `run_devices`.
    pub fn device_in(&self, run_devices: &[DeviceSpec]) -> DeviceSpec {
        self.device.unwrap_or(run_devices[0])
    }
}

/// The `[run]` section, as the engine uses it; its schema is [`RunConfig::param_specs`] plus the
/// placement stage's `device` and `devices` ([`crate::compile::run_params`]), which resolve into
/// [`Graph::devices`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize, Params)]
pub struct RunConfig {
    /// training steps (each runs the whole graph once); `--steps` overrides
    #[param(default = 1, min = 1)]
    pub steps: u64,
    /// run seed; every random draw derives from (seed, step, node name)
    #[param(default = 0, min = 0)]
    pub seed: u64,
    /// run directory; default: a new timestamped directory under `runs/`
    pub out: Option<PathBuf>,
    /// write a checkpoint every N steps and after the last step (0: never)
    #[param(default = 0, min = 0)]
    pub checkpoint_every: u64,
    /// how many of the newest checkpoints to keep (0: every one)
    #[param(default = 2, min = 0)]
    pub keep_checkpoints: u64,
    /// worker threads running ready nodes concurrently (0: one per CPU core)
    #[param(default = 0, min = 0)]
    pub workers: u64,
    /// draw plots of the main curves into the run directory at the end
    #[param(default = true)]
    pub plot: bool,
    /// where the metrics go: `jsonl` (metrics.jsonl, always written) and `tensorboard` (event
    /// files under the run directory's tensorboard/, with the graph and sampled generations; W&B
    /// imports them)
    #[param(default = serde_json::json!(["jsonl"]))]
    pub tracking: Vec<Tracker>,
}

/// A destination of the metrics (`[run] tracking`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ParamChoice)]
pub enum Tracker {
    Jsonl,
    Tensorboard,
}

impl RunConfig {
    /// Whether the run writes TensorBoard event files (`tracking` has `tensorboard`).
    pub fn tensorboard(&self) -> bool {
        self.tracking.contains(&Tracker::Tensorboard)
    }
}

/// A checked graph, ready to build and run.
pub struct Graph {
    pub run: RunConfig,
    pub nodes: Vec<GraphNode>,
    pub resources: Vec<GraphResource>,
    /// The run's devices in this process, resolved on the machine the graph was compiled for
    /// (`[run] devices`, or the one `[run] device`); never empty.
    pub devices: Vec<DeviceSpec>,
    /// Processes of the run the graph was checked for (1 for a single-process run).
    pub world: usize,
    /// Nodes in a topological order.
    pub order: Vec<NodeId>,
    /// The nodes each node waits for in a step (see [`crate::repeat`]'s rules), by node.
    pub dependencies: Vec<Vec<NodeId>>,
    pub dag: petgraph::graph::DiGraph<NodeId, ()>,
    pub sources: SourceMap,
    /// The graph file with overrides applied, as TOML (saved in the run directory).
    pub resolved: String,
}

impl Graph {
    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Node `id`'s devices in this process (see [`GraphNode::devices`]).
    pub fn node_devices(&self, id: NodeId) -> Vec<DeviceSpec> {
        self.nodes[id].devices(&self.devices)
    }
}
