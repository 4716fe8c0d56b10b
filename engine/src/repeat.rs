//! Repeats inside one step: a node that runs a part of the graph on demand.
//!
//! Some steps cannot be a plain DAG. DAPO's dynamic sampling generates, scores and filters prompt
//! batches until enough groups survive; an evaluation scores each of its chunks of responses with
//! a reward node of the graph. Both are a node (the *loop node*) that runs other nodes (the ones
//! its `repeat` key lists) as many times as it needs, within one step:
//!
//! ```toml
//! [nodes.filter]
//! kind   = "filter.groups"
//! repeat = ["data", "rollout", "reward"]      # run again for every further generation batch
//! inputs = { scores = "reward.scores" }        # a `repeated` input: a new value per run
//! ```
//!
//! The rules, checked by the compiler:
//! - only a kind with at least one [`PortSpec::repeated`](crate::PortSpec::repeated) input takes `repeat`; each such input,
//!   when wired, comes from a node in the list, and every listed node feeds the loop node;
//! - a repeated node takes its inputs from other repeated nodes of the same loop, from the loop
//!   node's [`PortSpec::argument`](crate::PortSpec::argument) outputs (what the loop node hands to each run), or from nodes
//!   outside, which run before the loop node;
//! - outside nodes may read a repeated node's outputs (e.g. the dataset's `val_prompts`); they see
//!   the last run's values, after the loop node has finished, and are skipped when it made no run.
//!   An output on the way into the loop node (the unfiltered `rollout.rollouts`) may only be read
//!   through the loop node, which is what it is there for;
//! - a node is repeated by at most one loop node, and a loop node is not itself repeated.
//!
//! At run time the loop node gets a [`Repeat`] from [`crate::StepContext::repeat`] and calls
//! [`Repeat::run`]; the repeated nodes run one after the other on the loop node's worker thread,
//! each with one [`crate::StepContext`] for the whole step (so its random stream continues from run
//! to run). Their metrics are those of their last run (unless the loop node turns them off with
//! [`Repeat::report_metrics`]), their `timing_s` the sum of all runs (not counted again in the
//! loop node's time).

use crate::context::StepContext;
use crate::graph::{Edge, Graph, NodeId};
use crate::node::{Node, NodeKind};
use crate::port::PortType;
use crate::value::{Inputs, Outputs, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The nodes each node waits for in a step, given every node's input edges and which loop node,
/// if any, repeats it. A producer that is repeated by a loop node stands for that loop node
/// (its values exist once the loop node has finished); a loop node also waits for what its
/// repeated nodes take from outside, and for its repeated nodes themselves (which only orders
/// them before it: the scheduler never dispatches a repeated node). Edges from a loop node into
/// its own repeated nodes are call arguments, not dependencies.
pub(crate) fn dependencies(
    edges: &[Vec<Edge>],
    repeated_by: &[Option<NodeId>],
) -> Vec<Vec<NodeId>> {
    let stand_in = |p: NodeId| repeated_by[p].unwrap_or(p);
    let mut deps: Vec<Vec<NodeId>> = vec![Vec::new(); edges.len()];
    for (to, es) in edges.iter().enumerate() {
        for e in es {
            let d = match repeated_by[to] {
                // A repeated node: its own loop's argument is no dependency; siblings are.
                Some(l) if e.from == l => continue,
                Some(l) if repeated_by[e.from] == Some(l) => e.from,
                _ if repeated_by[e.from] == Some(to) => e.from,
                _ => stand_in(e.from),
            };
            deps[to].push(d);
            // What a repeated node takes from outside, its loop node waits for.
            if let Some(l) = repeated_by[to]
                && repeated_by[e.from] != Some(l)
                && e.from != l
            {
                deps[l].push(stand_in(e.from));
            }
        }
    }
    for d in &mut deps {
        d.sort_unstable();
        d.dedup();
    }
    deps
}

/// One repeated node, with what it needs to run on its own.
pub(crate) struct RepeatedNode {
    pub(crate) id: NodeId,
    pub(crate) name: String,
    pub(crate) kind: Arc<dyn NodeKind>,
    pub(crate) node: Box<dyn Node>,
    pub(crate) ctx: StepContext,
    /// Values of its inputs from outside the repeat (fixed for the step).
    pub(crate) outside: Inputs,
    /// Inputs from siblings: (port, sibling index, its port, optional).
    pub(crate) siblings: Vec<(String, usize, String, bool)>,
    /// Inputs from the loop node's arguments: (port, argument port, optional).
    pub(crate) arguments: Vec<(String, String, bool)>,
    /// Its output ports that some node reads (they must be produced unless skipped).
    pub(crate) consumed: Vec<String>,
    /// The last run's outputs (`None` before the first run or when it was skipped).
    pub(crate) last: Option<BTreeMap<String, Value>>,
    /// Whether it ran at least once (not skipped) this step.
    pub(crate) ran: bool,
    pub(crate) seconds: f64,
}

/// The nodes a loop node repeats, ready to run (see the module documentation).
pub struct Repeat {
    pub(crate) loop_node: String,
    pub(crate) step: u64,
    /// In a topological order.
    pub(crate) nodes: Vec<RepeatedNode>,
    /// The loop node's repeated inputs: (its port, repeated node index, that node's port).
    pub(crate) pulled: Vec<(String, usize, String)>,
    /// The loop node's argument outputs and their types.
    pub(crate) argument_types: Vec<(String, PortType)>,
    pub(crate) runs: u64,
    /// Whether the repeated nodes' metrics go into the step's metrics.
    pub(crate) report_metrics: bool,
}

impl Repeat {
    /// The repeat of loop node `id` for one step: its repeated nodes (`members`, in the graph's
    /// order, each with the values of its inputs from outside) taken out of `nodes` until the
    /// loop node is done.
    pub(crate) fn new(
        graph: &Graph,
        id: NodeId,
        step: u64,
        members: Vec<(NodeId, Inputs)>,
        nodes: &mut [Option<Box<dyn Node>>],
        context: &dyn Fn(NodeId) -> StepContext,
    ) -> Repeat {
        let index = |n: NodeId| members.iter().position(|(m, _)| *m == n);
        let argument_types = graph.nodes[id]
            .kind
            .outputs()
            .into_iter()
            .filter(|s| s.argument)
            .map(|s| (s.name, s.ty))
            .collect();
        let pulled = graph.nodes[id]
            .inputs
            .iter()
            .filter_map(|e| Some((e.port.clone(), index(e.from)?, e.from_port.clone())))
            .collect();
        let repeated = members
            .iter()
            .map(|(r, outside)| {
                let g = &graph.nodes[*r];
                let mut siblings = Vec::new();
                let mut arguments = Vec::new();
                for e in &g.inputs {
                    if e.from == id {
                        arguments.push((e.port.clone(), e.from_port.clone(), e.optional));
                    } else if let Some(k) = index(e.from) {
                        siblings.push((e.port.clone(), k, e.from_port.clone(), e.optional));
                    }
                }
                RepeatedNode {
                    id: *r,
                    name: g.name.clone(),
                    kind: g.kind.clone(),
                    node: nodes[*r].take().expect("node present"),
                    ctx: context(*r),
                    outside: outside.clone(),
                    siblings,
                    arguments,
                    consumed: crate::scheduler::consumed_ports(graph, *r),
                    last: None,
                    ran: false,
                    seconds: 0.0,
                }
            })
            .collect();
        Repeat {
            loop_node: graph.nodes[id].name.clone(),
            step,
            nodes: repeated,
            pulled,
            argument_types,
            runs: 0,
            report_metrics: true,
        }
    }

    /// Runs every repeated node once, in order, handing them `arguments` (values of the loop
    /// node's argument outputs, by port name), and returns the values of the loop node's repeated
    /// inputs (a port is absent when its producer was skipped). The first error stops the run and
    /// names the repeated node and the run (1-based).
    pub fn run(&mut self, arguments: Outputs) -> anyhow::Result<Inputs> {
        self.runs += 1;
        let run = self.runs;
        let mut args: BTreeMap<String, Value> = BTreeMap::new();
        for (port, payload) in arguments.values {
            let Some((_, ty)) = self.argument_types.iter().find(|(p, _)| *p == port) else {
                anyhow::bail!(
                    "node `{}` handed `{port}` to its repeated nodes, which is not one of its \
                     argument outputs ({})",
                    self.loop_node,
                    self.argument_types
                        .iter()
                        .map(|(p, _)| p.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            };
            args.insert(port, Value::new(*ty, payload));
        }
        for i in 0..self.nodes.len() {
            let (done, rest) = self.nodes.split_at_mut(i);
            let n = &mut rest[0];
            n.last = None;
            let mut inputs = n.outside.clone();
            let mut skip = false;
            for (port, from, from_port, optional) in &n.siblings {
                match done[*from].last.as_ref().and_then(|o| o.get(from_port)) {
                    Some(v) => inputs.insert(port.clone(), v.clone()),
                    None if *optional => {}
                    None => skip = true,
                }
            }
            for (port, arg, optional) in &n.arguments {
                match args.get(arg) {
                    Some(v) => inputs.insert(port.clone(), v.clone()),
                    None if *optional => {}
                    None => anyhow::bail!(
                        "node `{}` ran its repeated node `{}` without the argument `{arg}`, which \
                         `{}.{port}` takes",
                        self.loop_node,
                        n.name,
                        n.name
                    ),
                }
            }
            if skip {
                continue;
            }
            let start = Instant::now();
            n.ran = true;
            let result = crate::scheduler::run_caught(&mut n.node, &inputs, &mut n.ctx);
            n.seconds += start.elapsed().as_secs_f64();
            let outs = result
                .and_then(|o| crate::scheduler::check_outputs(&n.kind, &n.consumed, o))
                .map_err(|e| {
                    e.context(format!(
                        "node `{}` (kind `{}`) failed in run {run} of `{}`'s repeat at step {}",
                        n.name,
                        n.kind.name(),
                        self.loop_node,
                        self.step + 1
                    ))
                })?;
            if outs.skipped {
                continue;
            }
            let specs = n.kind.outputs();
            let values = outs
                .values
                .into_iter()
                .map(|(port, payload)| {
                    let ty = specs
                        .iter()
                        .find(|s| s.name == port)
                        .map(|s| s.ty)
                        .expect("checked");
                    (port, Value::new(ty, payload))
                })
                .collect();
            n.last = Some(values);
        }
        let mut out = Inputs::new(self.loop_node.clone());
        for (port, from, from_port) in &self.pulled {
            if let Some(v) = self.nodes[*from]
                .last
                .as_ref()
                .and_then(|o| o.get(from_port))
            {
                out.insert(port.clone(), v.clone());
            }
        }
        Ok(out)
    }

    /// Whether the repeated nodes' metrics (of their last run) go into the step's metrics; on by
    /// default. A loop node that reports its own summary turns it off (an evaluation's reward
    /// node would otherwise overwrite the training reward's `critic/score/*`).
    pub fn report_metrics(&mut self, on: bool) {
        self.report_metrics = on;
    }

    /// How many times [`Repeat::run`] has been called this step.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Seconds spent in the repeated nodes so far this step.
    pub(crate) fn seconds(&self) -> f64 {
        self.nodes.iter().map(|n| n.seconds).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(from: NodeId, port: &str) -> Edge {
        Edge {
            port: port.into(),
            from,
            from_port: "out".into(),
            ty: PortType::ANY,
            optional: false,
        }
    }

    #[test]
    fn repeated_producers_stand_for_their_loop_node() {
        // 0 data → 1 rollout → 2 reward → 3 filter (repeats 0..=2) → 4 update; 5 eval reads data.
        let edges = vec![
            vec![],
            vec![edge(0, "prompts")],
            vec![edge(1, "rollouts")],
            vec![edge(2, "scores")],
            vec![edge(3, "scores")],
            vec![edge(0, "prompts")],
        ];
        let by = vec![Some(3), Some(3), Some(3), None, None, None];
        let deps = dependencies(&edges, &by);
        assert_eq!(deps[1], vec![0]);
        assert_eq!(deps[3], vec![2]);
        assert_eq!(deps[4], vec![3]);
        assert_eq!(
            deps[5],
            vec![3],
            "eval waits for the loop node, not for `data`"
        );
    }

    #[test]
    fn arguments_are_no_dependency_and_outside_inputs_are_the_loops() {
        // 0 data; 1 reward repeated by 2 eval, reward takes eval's argument and `0`.
        let edges = vec![
            vec![],
            vec![edge(2, "rollouts"), edge(0, "x")],
            vec![edge(1, "scores")],
        ];
        let by = vec![None, Some(2), None];
        let deps = dependencies(&edges, &by);
        assert_eq!(deps[1], vec![0]);
        assert_eq!(deps[2], vec![0, 1]);
    }
}
