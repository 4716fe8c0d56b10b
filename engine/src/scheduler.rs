//! The scheduler: runs one step of a built graph on a crossbeam worker pool.
//!
//! Nodes move to a worker thread with their inputs and context, and come back with their outputs
//! (ownership passing, no locks around nodes). A node runs as soon as every node it takes inputs from
//! has finished, so independent nodes run concurrently. A failing (or panicking) node stops the step:
//! nothing new is dispatched, the nodes in flight finish, and the error names the node, its kind and
//! the cause. A node whose required input comes from a skipped node is skipped too.
//! This module knows nothing about run directories, checkpoints or progress bars.

use crate::context::StepContext;
use crate::device::DeviceSpec;
use crate::graph::{Graph, NodeId};
use crate::node::Node;
use crate::resource::Resources;
use crate::value::{Inputs, Outputs, Value};
use crossbeam_channel::{Receiver, Sender, unbounded};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

struct Task {
    id: NodeId,
    node: Box<dyn Node>,
    inputs: Inputs,
    ctx: StepContext,
}

struct Done {
    id: NodeId,
    node: Box<dyn Node>,
    result: anyhow::Result<Outputs>,
    ctx: StepContext,
    seconds: f64,
}

/// Persistent worker threads.
pub struct WorkerPool {
    tx: Option<Sender<Task>>,
    rx: Receiver<Done>,
    handles: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    pub fn new(workers: usize) -> Self {
        let (task_tx, task_rx) = unbounded::<Task>();
        let (done_tx, done_rx) = unbounded::<Done>();
        let handles = (0..workers.max(1))
            .map(|i| {
                let rx = task_rx.clone();
                let tx = done_tx.clone();
                std::thread::Builder::new()
                    .name(format!("flowrl-worker-{i}"))
                    .spawn(move || {
                        for mut t in rx {
                            let start = Instant::now();
                            let result = if t.ctx.before_train {
                                caught(&mut t.node, &t.inputs, &mut t.ctx, |n, i, c| {
                                    n.before_train(i, c)
                                })
                            } else {
                                run_caught(&mut t.node, &t.inputs, &mut t.ctx)
                            };
                            let done = Done {
                                id: t.id,
                                node: t.node,
                                result,
                                ctx: t.ctx,
                                seconds: start.elapsed().as_secs_f64(),
                            };
                            if tx.send(done).is_err() {
                                break;
                            }
                        }
                    })
                    .expect("spawn worker thread")
            })
            .collect();
        WorkerPool {
            tx: Some(task_tx),
            rx: done_rx,
            handles,
        }
    }
}

/// `node.run(inputs, ctx)`, with a panic turned into the node's error ([`panic_error`]).
pub(crate) fn run_caught(
    node: &mut Box<dyn Node>,
    inputs: &Inputs,
    ctx: &mut StepContext,
) -> anyhow::Result<Outputs> {
    caught(node, inputs, ctx, |n, i, c| n.run(i, c))
}

/// `call(node, inputs, ctx)`, with a panic turned into the node's error ([`panic_error`]).
fn caught(
    node: &mut Box<dyn Node>,
    inputs: &Inputs,
    ctx: &mut StepContext,
    call: impl FnOnce(&mut Box<dyn Node>, &Inputs, &mut StepContext) -> anyhow::Result<Outputs>,
) -> anyhow::Result<Outputs> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(node, inputs, ctx)))
        .unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(panic_error(&msg, ctx.device()))
        })
}

/// The error of a node that panicked on `device`. GPU backends panic when an allocation fails
/// (cubecl's memory pool also caps one buffer at about a quarter of the device's memory); such a
/// panic gets a hint at what to lower.
pub(crate) fn panic_error(msg: &str, device: crate::DeviceSpec) -> anyhow::Error {
    let lower = msg.to_lowercase();
    let out_of_memory = ["out of memory", "outofmemory", "allocat", "max_allocation"]
        .iter()
        .any(|k| lower.contains(k));
    if out_of_memory {
        anyhow::anyhow!(
            "panicked on {device}: {msg}\nhelp: the device ran out of memory (or a single \
             buffer exceeded its limit): lower the node's micro_batch_size (or \
             max_tokens_per_micro_batch) or chunk, the rollout's kv_cache_gib or \
             max_num_batched_tokens (or its n or max_new_tokens), or the data batch_size"
        )
    } else {
        anyhow::anyhow!("panicked on {device}: {msg}")
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.tx.take();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Progress events while a step runs.
pub enum Event<'a> {
    NodeStarted(&'a str),
    NodeFinished(&'a str, f64),
}

/// What one node did in one step.
#[derive(Clone, Debug)]
pub struct NodeReport {
    pub name: String,
    pub seconds: f64,
    pub skipped: bool,
    pub metrics: Vec<(String, f64)>,
    pub warnings: Vec<String>,
    /// Texts and pictures for the trackers.
    pub media: Vec<crate::Media>,
}

/// Everything shared by the nodes of one step.
pub struct StepEnv<'a> {
    pub step: u64,
    /// The pass before the first step ([`Node::before_train`]) rather than step `step`.
    pub before_train: bool,
    /// Whether a tracker takes texts and pictures ([`crate::Media`]).
    pub media: bool,
    pub total_steps: u64,
    pub seed: u64,
    pub devices: &'a [DeviceSpec],
    pub resources: &'a Arc<Resources>,
    pub run_dir: Option<&'a PathBuf>,
}

/// Runs one step. `nodes[i]` is `Some` for every node on entry and on return.
pub fn run_step(
    pool: &WorkerPool,
    graph: &Graph,
    nodes: &mut [Option<Box<dyn Node>>],
    env: &StepEnv<'_>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> anyhow::Result<Vec<NodeReport>> {
    let n = graph.nodes.len();
    // Loop nodes that run their part of the graph: in a step all; in the pass before training
    // those that take part in it, the members of the others being dispatched like any node.
    let looping: Vec<bool> = (0..n)
        .map(|i| {
            !env.before_train
                || nodes[i]
                    .as_ref()
                    .is_some_and(|node| node.runs_before_train())
        })
        .collect();
    let repeated = |i: NodeId| graph.nodes[i].repeated_by.is_some_and(|l| looping[l]);
    // Repeated nodes are run by their loop node, never dispatched here.
    let deps: Vec<Vec<NodeId>> = if env.before_train {
        // The step's dependencies route around the loops; the pass waits for the edges.
        graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let mut d: Vec<NodeId> = g
                    .inputs
                    .iter()
                    .map(|e| e.from)
                    .filter(|&p| p != i && !repeated(p))
                    .collect();
                d.sort_unstable();
                d.dedup();
                d
            })
            .collect()
    } else {
        graph
            .dependencies
            .iter()
            .map(|d| d.iter().copied().filter(|&p| !repeated(p)).collect())
            .collect()
    };
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut consumers: Vec<Vec<NodeId>> = vec![Vec::new(); n];
    for (to, d) in deps.iter().enumerate() {
        for &from in d {
            consumers[from].push(to);
        }
    }
    let rank: Vec<usize> = {
        let mut r = vec![0; n];
        for (pos, &id) in graph.order.iter().enumerate() {
            r[id] = pos;
        }
        r
    };
    let mut outputs: HashMap<(NodeId, String), Value> = HashMap::new();
    let mut reports: Vec<Option<NodeReport>> = vec![None; n];
    let mut ready: Vec<NodeId> = (0..n)
        .filter(|&i| waiting[i] == 0 && !repeated(i))
        .collect();
    let mut in_flight = 0usize;
    let mut failure: Option<anyhow::Error> = None;
    let tx = pool.tx.as_ref().expect("pool is open");
    let context = |id: NodeId| StepContext {
        node: graph.nodes[id].name.clone(),
        step: env.step,
        total_steps: env.total_steps,
        seed: env.seed,
        device: env.devices[id],
        resources: env.resources.clone(),
        run_dir: env.run_dir.cloned(),
        rng: None,
        metrics: Vec::new(),
        warnings: Vec::new(),
        repeat: None,
        before_train: env.before_train,
        wants_media: env.media,
        media: Vec::new(),
    };
    let skipped_report = |id: NodeId| NodeReport {
        name: graph.nodes[id].name.clone(),
        seconds: 0.0,
        skipped: true,
        metrics: Vec::new(),
        warnings: Vec::new(),
        media: Vec::new(),
    };

    loop {
        // Dispatch ready nodes in topological order (skips resolve immediately).
        while failure.is_none() && !ready.is_empty() {
            ready.sort_by_key(|&i| std::cmp::Reverse(rank[i]));
            let id = ready.pop().expect("non-empty");
            let g = &graph.nodes[id];
            let gather = |to: NodeId| {
                let mut inputs = Inputs::new(graph.nodes[to].name.clone());
                let mut skip = false;
                for e in &graph.nodes[to].inputs {
                    if graph.nodes[e.from].repeated_by == Some(id) || e.from == id {
                        continue; // the loop node's own repeat provides these
                    }
                    match outputs.get(&(e.from, e.from_port.clone())) {
                        Some(v) => inputs.insert(e.port.clone(), v.clone()),
                        None if e.optional => {}
                        None => skip = true,
                    }
                }
                (inputs, skip)
            };
            let (inputs, mut skip) = gather(id);
            let mut repeat = None;
            if !g.repeat.is_empty() && looping[id] && !skip {
                let mut members = Vec::new();
                for &r in &g.repeat {
                    let (outside, s) = gather(r);
                    skip |= s;
                    members.push((r, outside));
                }
                if !skip {
                    repeat = Some(crate::repeat::Repeat::new(
                        graph, id, env.step, members, nodes, &context,
                    ));
                }
            }
            if skip {
                for &r in g.repeat.iter().filter(|_| looping[id]) {
                    reports[r] = Some(skipped_report(r));
                }
                reports[id] = Some(skipped_report(id));
                for &c in &consumers[id] {
                    waiting[c] -= 1;
                    if waiting[c] == 0 {
                        ready.push(c);
                    }
                }
                continue;
            }
            let mut ctx = context(id);
            ctx.repeat = repeat;
            let node = nodes[id].take().expect("node present");
            on_event(Event::NodeStarted(&g.name));
            tx.send(Task {
                id,
                node,
                inputs,
                ctx,
            })
            .map_err(|_| anyhow::anyhow!("worker pool stopped"))?;
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        let mut done = pool
            .rx
            .recv()
            .map_err(|_| anyhow::anyhow!("worker pool stopped"))?;
        in_flight -= 1;
        let id = done.id;
        let g = &graph.nodes[id];
        nodes[id] = Some(done.node);
        let mut seconds = done.seconds;
        // Give the repeated nodes back; their last run's outputs become the step's.
        if let Some(repeat) = done.ctx.repeat.take() {
            seconds -= repeat.seconds();
            let report_metrics = repeat.report_metrics;
            for r in repeat.nodes {
                nodes[r.id] = Some(r.node);
                let ran = r.ran;
                if let Some(values) = r.last {
                    for (port, v) in values {
                        outputs.insert((r.id, port), v);
                    }
                }
                reports[r.id] = Some(NodeReport {
                    name: r.name,
                    seconds: r.seconds,
                    skipped: !ran,
                    metrics: if report_metrics {
                        r.ctx.metrics
                    } else {
                        Vec::new()
                    },
                    warnings: r.ctx.warnings,
                    media: r.ctx.media,
                });
            }
        }
        on_event(Event::NodeFinished(&g.name, seconds));
        // In the pass before the first step a node gives what it can; its consumers that miss
        // a required input are skipped.
        let consumed = if env.before_train {
            Vec::new()
        } else {
            consumed_ports(graph, id)
        };
        let outs = match done
            .result
            .and_then(|o| check_outputs(&g.kind, &consumed, o))
        {
            Ok(o) => o,
            Err(e) => {
                if failure.is_none() {
                    let when = if env.before_train {
                        "before the first step".to_string()
                    } else {
                        format!("at step {}", env.step + 1)
                    };
                    failure = Some(e.context(format!(
                        "node `{}` (kind `{}`) failed {when}",
                        g.name,
                        g.kind.name(),
                    )));
                }
                continue;
            }
        };
        let specs = g.kind.outputs();
        for (port, payload) in outs.values {
            let ty = specs
                .iter()
                .find(|s| s.name == port)
                .map(|s| s.ty)
                .expect("checked");
            outputs.insert((id, port), Value::new(ty, payload));
        }
        reports[id] = Some(NodeReport {
            name: g.name.clone(),
            seconds,
            skipped: outs.skipped,
            metrics: done.ctx.metrics,
            warnings: done.ctx.warnings,
            media: done.ctx.media,
        });
        for &c in &consumers[id] {
            waiting[c] -= 1;
            if waiting[c] == 0 {
                ready.push(c);
            }
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(graph
        .order
        .iter()
        .filter_map(|&i| reports[i].take())
        .collect())
}

/// The output ports of node `id` that some node reads (other than the loop node's arguments,
/// which are handed over during its run).
pub(crate) fn consumed_ports(graph: &Graph, id: NodeId) -> Vec<String> {
    let specs = graph.nodes[id].kind.outputs();
    graph
        .nodes
        .iter()
        .flat_map(|m| m.inputs.iter())
        .filter(|e| e.from == id)
        .filter(|e| !specs.iter().any(|s| s.name == e.from_port && s.argument))
        .map(|e| e.from_port.clone())
        .collect()
}

/// Every declared output present (unless skipped and except arguments), nothing undeclared.
pub(crate) fn check_outputs(
    kind: &Arc<dyn crate::NodeKind>,
    consumed: &[String],
    outs: Outputs,
) -> anyhow::Result<Outputs> {
    let specs = kind.outputs();
    for port in outs.values.keys() {
        if !specs.iter().any(|s| &s.name == port && !s.argument) {
            anyhow::bail!(
                "returned output `{port}`, which kind `{}` does not declare (outputs: {})",
                kind.name(),
                specs
                    .iter()
                    .filter(|s| !s.argument)
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if !outs.skipped {
        for s in &specs {
            if !outs.values.contains_key(&s.name) && consumed.contains(&s.name) {
                anyhow::bail!("did not produce output `{}` ({})", s.name, s.ty);
            }
        }
    }
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceSpec;

    #[test]
    fn panics_name_the_device_and_allocation_failures_say_what_to_lower() {
        let e = panic_error("index out of bounds", DeviceSpec::Cpu(0)).to_string();
        assert_eq!(e, "panicked on cpu:0: index out of bounds");
        let e = panic_error(
            "Unable to allocate 4294967296 bytes: out of memory",
            DeviceSpec::Cuda(1),
        )
        .to_string();
        assert!(
            e.starts_with("panicked on cuda:1: Unable to allocate"),
            "{e}"
        );
        assert!(
            e.contains("micro_batch_size") && e.contains("kv_cache_gib"),
            "{e}"
        );
    }
}
