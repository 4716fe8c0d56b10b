//! The memory and time plan of a graph, before anything loads (`flowrl plan`, and the check
//! `flowrl validate` and `flowrl run` make).
//!
//! Every node kind and resource kind declares what it holds ([`crate::NodeKind::footprint`],
//! [`crate::ResourceKind::footprint`]), sized from the graph's parameters and the models'
//! `config.json`. The plan places those buffers in memory pools — each device of the run, the
//! host, and the whole process (the host with every CPU device, plus the runtime this binary
//! already holds) — and takes, per pool:
//!
//! `peak = Σ resident + max over sets S of nodes that may run at once (|S| ≤ workers) of
//!         Σ_{n ∈ S} max over n's phases of the phase's buffers in the pool`,
//!
//! where nodes may run at once when neither waits for the other (the scheduler's rule). Host
//! memory (the host and CPU devices) adds [`RETAINED`] of every other node's largest phase: the
//! binaries' allocator keeps freed pages (`nodes/src/runtime/allocator.rs`), and a node whose
//! buffers have other sizes than the one before it reuses only part of them. A kind
//! that declares nothing is listed as unknown, never counted as zero. FLOPs add up over the
//! nodes; the step time is `Σ_n flops_n / (replicas_n · device throughput)`, the throughput
//! measured (CPU: a short matmul calibration) or taken from a datasheet (GPUs), always an
//! estimate.

mod devices;
mod footprint;
mod report;

pub use devices::{
    DeviceInfo, DeviceProbe, GPU_MODELS, GpuModel, host_available_bytes, process_peak_rss_bytes,
    process_rss_bytes,
};
pub use footprint::{Footprint, Item, Phase, Place, PlanCtx, ResourcePlan};
pub use report::{gib as report_gib, render, to_json};

use crate::device::DeviceSpec;
use crate::graph::Graph;
use crate::node::{Subject, ValidateCtx};
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The share of the other nodes' largest phases that host memory keeps at the peak: mimalloc
/// with purging off keeps every freed page, and a node whose buffers differ in size from those
/// before it reuses only part of them. Fitted to the measured peaks of bench/results/plan.md
/// (one value for every graph there).
pub const RETAINED: f64 = 0.5;

/// A memory pool of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pool {
    Device(DeviceSpec),
    Host,
    /// The host and every CPU device together, plus the runtime: the process's resident set.
    Process,
}

impl std::fmt::Display for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pool::Device(d) => write!(f, "{d}"),
            Pool::Host => f.write_str("host"),
            Pool::Process => f.write_str("process"),
        }
    }
}

/// One buffer at a pool's peak.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The node or resource that declared it (`runtime` for what the process already holds).
    pub node: String,
    /// `resident`, or the node's phase at the peak.
    pub phase: String,
    pub what: String,
    pub bytes: u64,
    pub hint: Option<String>,
}

/// A pool's peak and what makes it.
#[derive(Clone, Debug)]
pub struct PoolPlan {
    pub pool: Pool,
    pub peak_bytes: u64,
    /// `(node, phase)` of the transient buffers at the peak (empty when only resident ones).
    pub peak_at: Vec<(String, String)>,
    /// Every buffer alive at the peak, largest first.
    pub breakdown: Vec<Entry>,
    /// What the pool can hold, and where that number comes from.
    pub capacity: Option<(u64, String)>,
}

impl PoolPlan {
    /// True when the pool's capacity is known and the peak exceeds it.
    pub fn exceeds(&self) -> bool {
        self.capacity
            .as_ref()
            .is_some_and(|(c, _)| self.peak_bytes > *c)
    }
}

/// One node's or resource's declaration, summed per phase (on its first device and on the
/// host), for the per-node table.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSummary {
    pub name: String,
    pub kind: String,
    /// `(phase, bytes on each of its devices, host bytes)`; `resident` first.
    pub phases: Vec<(String, u64, u64)>,
    pub flops: f64,
    /// The kind declares nothing.
    pub unknown: bool,
}

/// The plan of a graph.
pub struct Plan {
    /// Every resource, then every node, as declared.
    pub summaries: Vec<NodeSummary>,
    /// The run's devices, then the host, then the process.
    pub pools: Vec<PoolPlan>,
    /// Bytes this process held before the graph built anything (binary, libraries, runtime).
    pub runtime_bytes: u64,
    pub step_flops: f64,
    pub step_seconds_estimate: Option<f64>,
    /// The devices' throughput and memory, with their sources.
    pub devices: Vec<(DeviceSpec, DeviceInfo)>,
    /// The precision most of the step's FLOPs run in (for the MFU's peak throughput).
    pub flops_precision: String,
    /// Nodes and resources whose kinds declare nothing.
    pub unknown: Vec<String>,
    /// What declared kinds could not size.
    pub not_sized: Vec<String>,
}

impl Plan {
    pub fn pool(&self, pool: Pool) -> Option<&PoolPlan> {
        self.pools.iter().find(|p| p.pool == pool)
    }

    /// The pools that do not fit their capacity.
    pub fn overflows(&self) -> Vec<&PoolPlan> {
        self.pools.iter().filter(|p| p.exceeds()).collect()
    }
}

/// A declared buffer placed in a pool.
struct Placed {
    pool: Pool,
    entry: Entry,
}

/// Plans `graph` with the devices described by `info`; `runtime` tells what the process holds
/// once the kinds have sized their footprints and the devices were probed (the binary, its
/// libraries and threads, the tokenizer and data reader the sizing ran: the part of the run's
/// resident set that no kind declares), asked after both.
pub fn plan(
    graph: &Graph,
    info: &dyn Fn(DeviceSpec) -> DeviceInfo,
    runtime: &dyn Fn() -> u64,
) -> Plan {
    let mut unknown = Vec::new();
    let mut not_sized = Vec::new();
    let mut resident: Vec<Placed> = Vec::new();
    let mut summaries = Vec::new();
    // Resources first, in dependency order, so that a `from` copy reads its source's shape.
    let mut shapes: BTreeMap<String, Arc<dyn Any + Send + Sync>> = BTreeMap::new();
    for id in resource_order(graph) {
        let r = &graph.resources[id];
        let device = r.device_in(&graph.devices);
        let ctx = PlanCtx {
            validate: ValidateCtx {
                graph,
                subject: Subject::Resource(id),
            },
            shapes: &shapes,
            replicas: 1,
            local_replicas: 1,
            device,
        };
        let declared = r.kind.footprint(&ctx);
        summaries.push(summary(
            &r.name,
            r.kind.name(),
            declared.as_ref().map(|p| &p.footprint),
        ));
        match declared {
            None => unknown.push(format!("resource `{}` (kind `{}`)", r.name, r.kind.name())),
            Some(p) => {
                for u in &p.footprint.not_sized {
                    not_sized.push(format!("resource `{}`: {u}", r.name));
                }
                for item in &p.footprint.resident {
                    place(&mut resident, &r.name, "resident", item, &[device]);
                }
                if let Some(s) = p.shape {
                    shapes.insert(r.name.clone(), s);
                }
            }
        }
    }
    // Nodes: resident buffers, and per node its phases' buffers.
    let mut phases: Vec<Vec<(String, Vec<Placed>)>> = Vec::new();
    let mut step_flops = 0.0;
    let mut seconds = Some(0.0);
    let mut by_precision: BTreeMap<String, f64> = BTreeMap::new();
    let infos: Vec<(DeviceSpec, DeviceInfo)> =
        graph.devices.iter().map(|&d| (d, info(d))).collect();
    for (id, n) in graph.nodes.iter().enumerate() {
        let devices = graph.node_devices(id);
        let replicas = if n.spans_run_devices() {
            devices.len() * graph.world
        } else {
            1
        };
        let ctx = PlanCtx {
            validate: ValidateCtx {
                graph,
                subject: Subject::Node(id),
            },
            shapes: &shapes,
            replicas,
            local_replicas: if n.spans_run_devices() {
                devices.len()
            } else {
                1
            },
            device: devices[0],
        };
        let mut node_phases = Vec::new();
        let declared = n.kind.footprint(&ctx);
        summaries.push(summary(&n.name, n.kind.name(), declared.as_ref()));
        match declared {
            None => unknown.push(format!("node `{}` (kind `{}`)", n.name, n.kind.name())),
            Some(f) => {
                for u in &f.not_sized {
                    not_sized.push(format!("node `{}`: {u}", n.name));
                }
                for item in &f.resident {
                    place(&mut resident, &n.name, "resident", item, &devices);
                }
                for ph in &f.phases {
                    let mut placed = Vec::new();
                    for item in &ph.items {
                        place(&mut placed, &n.name, &ph.name, item, &devices);
                    }
                    node_phases.push((ph.name.clone(), placed));
                }
                step_flops += f.flops;
                if f.flops > 0.0 {
                    let precision = f.flops_precision.as_deref().unwrap_or("f32");
                    *by_precision.entry(precision.to_string()).or_default() += f.flops;
                    let rate = infos
                        .iter()
                        .find(|(d, _)| *d == devices[0])
                        .and_then(|(_, i)| i.flops_per_second(precision));
                    seconds = match (seconds, rate) {
                        (Some(s), Some(r)) => Some(s + f.flops / (replicas as f64 * r)),
                        _ => None,
                    };
                }
            }
        }
        phases.push(node_phases);
    }
    let runtime_bytes = runtime();
    let workers = workers(graph);
    let concurrent = independent_pairs(graph);
    let mut pools: Vec<Pool> = graph.devices.iter().map(|&d| Pool::Device(d)).collect();
    pools.push(Pool::Host);
    pools.push(Pool::Process);
    let host_capacity =
        host_available_bytes().map(|b| (b, "MemAvailable in /proc/meminfo".to_string()));
    let pool_plans = pools
        .into_iter()
        .map(|pool| {
            let capacity = match pool {
                Pool::Device(DeviceSpec::Cpu(_)) | Pool::Host => None,
                Pool::Device(d) => infos
                    .iter()
                    .find(|(x, _)| *x == d)
                    .and_then(|(_, i)| i.memory.clone()),
                Pool::Process => host_capacity.clone().map(|(b, s)| (b + runtime_bytes, format!("{s} + this process's {}", crate::plan::report::gib(runtime_bytes)))),
            };
            let mut p = pool_peak(pool, &resident, &phases, &concurrent, workers);
            if pool == Pool::Process {
                p.peak_bytes += runtime_bytes;
                p.breakdown.push(Entry {
                    node: "runtime".into(),
                    phase: "resident".into(),
                    what: "this binary, its runtime, tokenizer and data reader (measured: the planning process)".into(),
                    bytes: runtime_bytes,
                    hint: None,
                });
                p.breakdown.sort_by_key(|e| std::cmp::Reverse(e.bytes));
            }
            p.capacity = capacity;
            p
        })
        .collect();
    Plan {
        summaries,
        pools: pool_plans,
        runtime_bytes,
        step_flops,
        step_seconds_estimate: seconds,
        devices: infos,
        flops_precision: by_precision
            .into_iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or("f32".into(), |(p, _)| p),
        unknown,
        not_sized,
    }
}

/// A declaration summed per phase.
fn summary(name: &str, kind: &str, f: Option<&Footprint>) -> NodeSummary {
    let sums = |items: &[Item]| {
        let on = |place| {
            items
                .iter()
                .filter(|i| i.place == place)
                .map(|i| i.bytes)
                .sum::<u64>()
        };
        (
            on(Place::Device) + on(Place::First).max(on(Place::Replicas)),
            on(Place::Host),
        )
    };
    let mut phases = Vec::new();
    if let Some(f) = f {
        if !f.resident.is_empty() {
            let (d, h) = sums(&f.resident);
            phases.push(("resident".to_string(), d, h));
        }
        for p in &f.phases {
            let (d, h) = sums(&p.items);
            phases.push((p.name.clone(), d, h));
        }
    }
    NodeSummary {
        name: name.to_string(),
        kind: kind.to_string(),
        phases,
        flops: f.map_or(0.0, |f| f.flops),
        unknown: f.is_none(),
    }
}

/// Maps `item` (declared by `owner` in `phase`) into its pools: a device item goes to each of
/// `devices` and, for CPU devices, to the process; a host item to the host and the process.
fn place(out: &mut Vec<Placed>, owner: &str, phase: &str, item: &Item, devices: &[DeviceSpec]) {
    let entry = || Entry {
        node: owner.to_string(),
        phase: phase.to_string(),
        what: item.what.clone(),
        bytes: item.bytes,
        hint: item.hint.clone(),
    };
    match item.place {
        Place::Host => {
            out.push(Placed {
                pool: Pool::Host,
                entry: entry(),
            });
            out.push(Placed {
                pool: Pool::Process,
                entry: entry(),
            });
        }
        Place::Device | Place::First | Place::Replicas => {
            let (skip, take) = match item.place {
                Place::First => (0, 1),
                Place::Replicas => (1, devices.len()),
                _ => (0, devices.len()),
            };
            for &d in devices.iter().skip(skip).take(take) {
                out.push(Placed {
                    pool: Pool::Device(d),
                    entry: entry(),
                });
                if matches!(d, DeviceSpec::Cpu(_)) {
                    out.push(Placed {
                        pool: Pool::Process,
                        entry: entry(),
                    });
                }
            }
        }
    }
}

/// The peak of one pool (see the module doc for the rule).
fn pool_peak(
    pool: Pool,
    resident: &[Placed],
    phases: &[Vec<(String, Vec<Placed>)>],
    concurrent: &[Vec<bool>],
    workers: usize,
) -> PoolPlan {
    let host_memory = match pool {
        Pool::Device(d) => d.type_name() == "cpu",
        Pool::Host | Pool::Process => true,
    };
    let mut breakdown: Vec<Entry> = resident
        .iter()
        .filter(|p| p.pool == pool)
        .map(|p| p.entry.clone())
        .collect();
    let base: u64 = breakdown.iter().map(|e| e.bytes).sum();
    // Each node's largest phase in this pool.
    let largest: Vec<(u64, usize)> = phases
        .iter()
        .map(|ph| {
            ph.iter()
                .enumerate()
                .map(|(k, (_, items))| {
                    (
                        items
                            .iter()
                            .filter(|p| p.pool == pool)
                            .map(|p| p.entry.bytes)
                            .sum(),
                        k,
                    )
                })
                .max()
                .unwrap_or((0, 0))
        })
        .collect();
    let mut candidates: Vec<usize> = (0..phases.len()).filter(|&n| largest[n].0 > 0).collect();
    candidates.sort_by(|a, b| largest[*b].0.cmp(&largest[*a].0));
    candidates.truncate(16);
    let mut best = (0u64, Vec::new());
    heaviest_set(
        &candidates,
        &largest,
        concurrent,
        workers,
        &mut Vec::new(),
        0,
        0,
        &mut best,
    );
    let mut peak_at = Vec::new();
    for &n in &best.1 {
        let (name, items) = &phases[n][largest[n].1];
        breakdown.extend(
            items
                .iter()
                .filter(|p| p.pool == pool)
                .map(|p| p.entry.clone()),
        );
        if let Some(p) = items.first() {
            peak_at.push((p.entry.node.clone(), name.clone()));
        }
    }
    let mut retained = 0;
    if host_memory {
        for (n, &(bytes, phase)) in largest.iter().enumerate() {
            if bytes == 0 || best.1.contains(&n) {
                continue;
            }
            let kept = (bytes as f64 * RETAINED) as u64;
            retained += kept;
            let owner = phases[n][phase]
                .1
                .first()
                .map_or(String::new(), |p| p.entry.node.clone());
            breakdown.push(Entry {
                node: owner,
                phase: phases[n][phase].0.clone(),
                what: format!(
                    "freed buffers the allocator keeps ({:.0} % of the phase's)",
                    RETAINED * 100.0
                ),
                bytes: kept,
                hint: None,
            });
        }
    }
    breakdown.sort_by_key(|e| std::cmp::Reverse(e.bytes));
    PoolPlan {
        pool,
        peak_bytes: base + best.0 + retained,
        peak_at,
        breakdown,
        capacity: None,
    }
}

/// The set of at most `workers` pairwise-concurrent candidates with the largest sum
/// (exhaustive over at most 16 candidates).
#[allow(clippy::too_many_arguments)]
fn heaviest_set(
    candidates: &[usize],
    largest: &[(u64, usize)],
    concurrent: &[Vec<bool>],
    workers: usize,
    chosen: &mut Vec<usize>,
    from: usize,
    sum: u64,
    best: &mut (u64, Vec<usize>),
) {
    if sum > best.0 {
        *best = (sum, chosen.clone());
    }
    if chosen.len() == workers {
        return;
    }
    for k in from..candidates.len() {
        let n = candidates[k];
        if chosen.iter().all(|&c| concurrent[c][n]) {
            chosen.push(n);
            heaviest_set(
                candidates,
                largest,
                concurrent,
                workers,
                chosen,
                k + 1,
                sum + largest[n].0,
                best,
            );
            chosen.pop();
        }
    }
}

/// `m[a][b]`: nodes `a` and `b` may run at the same time (neither waits for the other, directly
/// or through others).
fn independent_pairs(graph: &Graph) -> Vec<Vec<bool>> {
    let n = graph.nodes.len();
    let mut reach = vec![vec![false; n]; n];
    for (start, row) in reach.iter_mut().enumerate() {
        let mut stack = graph.dependencies[start].clone();
        while let Some(d) = stack.pop() {
            if !std::mem::replace(&mut row[d], true) {
                stack.extend(graph.dependencies[d].iter().copied());
            }
        }
    }
    (0..n)
        .map(|a| {
            (0..n)
                .map(|b| a != b && !reach[a][b] && !reach[b][a])
                .collect()
        })
        .collect()
}

/// Nodes the scheduler runs at once at most: `[run] workers`, or one per CPU (0), never more
/// than the nodes.
fn workers(graph: &Graph) -> usize {
    let w = match graph.run.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        w => w as usize,
    };
    w.min(graph.nodes.len()).max(1)
}

/// Resources in an order where each comes after those it refers to.
fn resource_order(graph: &Graph) -> Vec<usize> {
    let mut order = Vec::new();
    let mut done = vec![false; graph.resources.len()];
    while order.len() < graph.resources.len() {
        let before = order.len();
        for (i, r) in graph.resources.iter().enumerate() {
            if !done[i] && r.depends.iter().all(|&d| done[d]) {
                done[i] = true;
                order.push(i);
            }
        }
        if order.len() == before {
            // A cycle is a compile error; keep the rest in declaration order.
            order.extend((0..graph.resources.len()).filter(|&i| !done[i]));
            break;
        }
    }
    order
}
