//! The plugin API: what a node kind implements.
//!
//! A [`NodeKind`] describes a kind of node (its name, doc, typed ports, parameter schema, an optional
//! `validate` hook for constraints on its parameters and neighbours) and builds [`Node`]s. A
//! [`Node`] runs once per step: it gets the values on its input ports and returns its outputs.
//! Kinds are registered with [`crate::register_node_kind!`] or added to a [`crate::Registry`].
//!
//! Parameters are declared once, as the serde struct the kind deserializes (`#[derive(Params)]`,
//! see [`crate::params`]); ports once, as [`crate::Port`] constants (see [`crate::port`]):
//!
//! ```
//! use flowrl_engine::*;
//!
//! const NUMBERS: ValueType<Vec<f64>> = ValueType::new("Numbers");
//! const OUT: Port<Vec<f64>> = Port::new("numbers", NUMBERS);
//!
//! /// Emits `count` numbers drawn uniformly from [0, 1) each step.
//! struct Uniform;
//!
//! #[derive(serde::Deserialize, Params)]
//! struct UniformParams {
//!     /// numbers per step
//!     #[param(default = 4, min = 1)]
//!     count: usize,
//! }
//!
//! impl NodeKind for Uniform {
//!     fn name(&self) -> &str { "example.uniform" }
//!     fn doc(&self) -> &str { "Emits `count` uniform numbers per step." }
//!     fn inputs(&self) -> Vec<PortSpec> { vec![] }
//!     fn outputs(&self) -> Vec<PortSpec> { vec![OUT.spec()] }
//!     fn params(&self) -> Vec<ParamSpec> { UniformParams::param_specs() }
//!     fn build(&self, params: &Params, _ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
//!         let p: UniformParams = params.parse()?;
//!         Ok(Box::new(UniformNode { count: p.count }))
//!     }
//! }
//!
//! struct UniformNode { count: usize }
//!
//! impl Node for UniformNode {
//!     fn run(&mut self, _inputs: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
//!         use rand::Rng;
//!         let v: Vec<f64> = (0..self.count).map(|_| ctx.rng().random::<f64>()).collect();
//!         ctx.metric("uniform/mean", v.iter().sum::<f64>() / v.len() as f64);
//!         Ok(Outputs::new().with(OUT, v))
//!     }
//! }
//!
//! flowrl_engine::register_node_kind!(Uniform);
//! ```

use crate::context::{BuildContext, StepContext};
use crate::diagnostic::{Code, Diagnostic, Span};
use crate::graph::{Graph, NodeId, ResourceId};
use crate::params::{ParamSpec, Params};
use crate::plan::{Footprint, PlanCtx};
use crate::port::{PortSpec, PortType};
use crate::spec::STable;
use crate::value::{Inputs, Outputs};
use serde::de::DeserializeOwned;
use std::fmt;
use std::sync::Arc;

/// Something a node kind says it does, for other kinds' `validate` hooks to find it upstream
/// without knowing kind names ([`NodeView::find_upstream_with`]). The crate that defines what the
/// capability promises (which parameters such a kind has, say) defines the constant:
/// `pub const SAMPLES_PROMPTS: Capability = Capability::new("samples_prompts")`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Capability(&'static str);

impl Capability {
    pub const fn new(name: &'static str) -> Self {
        Capability(name)
    }

    pub const fn name(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A kind of node (`kind = "..."` in a graph).
pub trait NodeKind: Send + Sync {
    /// The name used in `kind = "..."`, dotted by family (`"reward.boxed"`, `"update.ppo"`).
    fn name(&self) -> &str;
    /// What the node does (first line is the summary shown by `flowrl nodes`).
    fn doc(&self) -> &str;
    fn inputs(&self) -> Vec<PortSpec>;
    fn outputs(&self) -> Vec<PortSpec>;
    fn params(&self) -> Vec<ParamSpec>;
    /// The key under which the engine records this node's time, `timing_s/<key>` (e.g. rollout →
    /// `"gen"`); `None` uses the node's name. A graph may override it with `timing = "..."`.
    fn timing_key(&self) -> Option<&str> {
        None
    }
    /// True when the kind splits its work over replicas (see [`crate::Placement`]): it then runs
    /// on every device of the run unless the graph pins it to one with `device = "..."`. Other
    /// kinds run once per process, on the run's first device or their own `device`.
    fn data_parallel(&self) -> bool {
        false
    }
    /// What the kind declares it does, for [`NodeView::find_upstream_with`] (default: nothing).
    fn capabilities(&self) -> Vec<Capability> {
        Vec::new()
    }
    /// Constraints on the node's parameters and neighbours, reported with the numbers in the
    /// message (e.g. batch × n divisible by the micro-batch size). Runs after the schema, wiring and
    /// port-type checks have passed for this node.
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let _ = ctx;
        Vec::new()
    }
    /// What a node of this kind holds, per replica, and its FLOPs per step, sized from its
    /// parameters, its neighbours and the resources' shapes (see [`crate::plan`]); runs after
    /// `validate` passed. `None` (the default): the kind declares nothing, and the plan shows
    /// the node as unknown rather than as zero.
    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let _ = ctx;
        None
    }
    /// Builds a node from validated parameters.
    fn build(&self, params: &Params, ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>>;
    /// For kinds whose ports and parameters depend on the node's own table (the `exec` kind asks
    /// an external program for them in a handshake): the kind to use for this one node. Its
    /// `inputs`, `outputs`, `params`, `validate` and `build` then apply to that node alone (it
    /// should keep this kind's `name`). Called in the shape stage, before the node's parameters
    /// are checked; errors are reported like any other diagnostic and the node is then left out
    /// of the wiring checks. Default: `Ok(None)`, this kind as it is.
    fn instantiate(
        &self,
        node: &NodeTable<'_>,
    ) -> Result<Option<Arc<dyn NodeKind>>, Vec<Diagnostic>> {
        let _ = node;
        Ok(None)
    }
}

/// What [`NodeKind::instantiate`] sees: the node's name and its table as written in the graph.
pub struct NodeTable<'a> {
    pub(crate) name: &'a str,
    pub(crate) table: &'a STable,
    pub(crate) header: Span,
}

impl NodeTable<'_> {
    /// The node's name (`reward` for `[nodes.reward]`).
    pub fn name(&self) -> &str {
        self.name
    }

    /// The value of `key` as JSON (`None` when absent).
    pub fn get(&self, key: &str) -> Option<serde_json::Value> {
        self.table.get(key).map(|e| e.value.to_json())
    }

    /// An error (code E0106) pointing at `key`'s value, or at the table header when it is absent.
    pub fn error(&self, key: &str, message: impl Into<String>) -> Diagnostic {
        let span = self.table.get(key).map_or(self.header, |e| e.value.span);
        Diagnostic::error(Code::InvalidValue, message).at(span)
    }
}

/// A node of a running graph.
pub trait Node: Send {
    /// Runs one step.
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs>;
    /// Runs in the pass before the first step of a run that starts at step 1 (verl's
    /// `val_before_train`): the weights are the initial ones and nothing trains. The pass runs
    /// the graph's nodes in order with this method instead of [`Node::run`]; a node may return
    /// some of its outputs (a dataset its validation prompts), and a node missing a required
    /// input is skipped. The pass's metrics are logged as step 0. Default: skipped.
    fn before_train(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        let _ = (inputs, ctx);
        Ok(Outputs::skipped())
    }
    /// Whether [`Node::before_train`] does something. A loop node that does runs its `repeat`
    /// nodes in the pass as in a step; the members of a loop node that does not are run by the
    /// pass directly (DAPO's filter repeats the dataset, whose validation prompts the pass needs).
    fn runs_before_train(&self) -> bool {
        false
    }
    /// Small state to keep in checkpoints (data position, counters). Large binary state belongs in
    /// a resource, whose kind saves files.
    fn save_state(&self) -> anyhow::Result<Option<serde_json::Value>> {
        Ok(None)
    }
    /// Restores what [`Node::save_state`] returned.
    fn load_state(&mut self, state: serde_json::Value) -> anyhow::Result<()> {
        let _ = state;
        anyhow::bail!("this node saved state but does not implement `load_state`")
    }
}

/// What a kind's `validate` hook sees: the node (or resource) being checked and the graph around it.
pub struct ValidateCtx<'a> {
    pub(crate) graph: &'a Graph,
    pub(crate) subject: Subject,
}

#[derive(Clone, Copy)]
pub(crate) enum Subject {
    Node(NodeId),
    Resource(ResourceId),
}

impl<'a> ValidateCtx<'a> {
    /// The node's (or resource's) name.
    pub fn name(&self) -> &'a str {
        match self.subject {
            Subject::Node(i) => &self.graph.nodes[i].name,
            Subject::Resource(i) => &self.graph.resources[i].name,
        }
    }

    /// The whole graph being checked.
    pub fn graph(&self) -> &'a Graph {
        self.graph
    }

    pub fn params(&self) -> &'a Params {
        match self.subject {
            Subject::Node(i) => &self.graph.nodes[i].params,
            Subject::Resource(i) => &self.graph.resources[i].params,
        }
    }

    /// The parameters as the kind's own struct, as `build` gets them. `validate` runs after the
    /// schema checks passed, so this fails only when the struct and the schema disagree (a bug of
    /// the kind), with an error at the table header, as the hook's return value:
    /// `let p = match ctx.parse::<EmaParams>() { Ok(p) => p, Err(d) => return d };`.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, Vec<Diagnostic>> {
        self.params().parse().map_err(|e| {
            let spans = match self.subject {
                Subject::Node(i) => &self.graph.nodes[i].spans,
                Subject::Resource(i) => &self.graph.resources[i].spans,
            };
            vec![
                Diagnostic::error(
                    Code::InvalidValue,
                    format!(
                        "`{}`: {e} (the kind's parameter struct does not match its schema)",
                        self.name()
                    ),
                )
                .at(spans.header),
            ]
        })
    }

    /// The node wired to input `port` (`None` if the port is not wired).
    pub fn input(&self, port: &str) -> Option<NodeView<'a>> {
        match self.subject {
            Subject::Node(i) => NodeView {
                graph: self.graph,
                id: i,
            }
            .input(port),
            Subject::Resource(_) => None,
        }
    }

    /// Every node of the graph, in the graph's order (a resource's plan reads which nodes use
    /// it, and how).
    pub fn nodes(&self) -> Vec<NodeView<'a>> {
        (0..self.graph.nodes.len())
            .map(|id| NodeView {
                graph: self.graph,
                id,
            })
            .collect()
    }

    /// The declared resource a parameter of type `Resource` refers to.
    pub fn resource_param(&self, key: &str) -> Option<ResourceView<'a>> {
        let name = self.params().get_str(key)?;
        self.resource(name)
    }

    pub fn resource(&self, name: &str) -> Option<ResourceView<'a>> {
        let id = self.graph.resources.iter().position(|r| r.name == name)?;
        Some(ResourceView {
            graph: self.graph,
            id,
        })
    }

    /// The span of a parameter's value (dotted path for nested tables); the table header when the
    /// key is absent (its default applies).
    pub fn span_of(&self, key: &str) -> Span {
        let spans = match self.subject {
            Subject::Node(i) => &self.graph.nodes[i].spans,
            Subject::Resource(i) => &self.graph.resources[i].spans,
        };
        spans.value_span(key)
    }

    /// Whether the graph (or a `--set` override) sets parameter `key` (dotted path for nested
    /// tables), rather than leaving it to its default.
    pub fn is_set(&self, key: &str) -> bool {
        match self.subject {
            Subject::Node(i) => self.graph.nodes[i].spans.has(key),
            Subject::Resource(i) => self.graph.resources[i].spans.has(key),
        }
    }

    /// An error (code E0501) pointing at parameter `key`.
    pub fn error(&self, key: &str, message: impl Into<String>) -> Diagnostic {
        let spans = match self.subject {
            Subject::Node(i) => &self.graph.nodes[i].spans,
            Subject::Resource(i) => &self.graph.resources[i].spans,
        };
        let d = Diagnostic::error(Code::Constraint, message).at(spans.value_span(key));
        if spans.has(key) {
            d
        } else {
            d.with_label(format!("`{key}` takes its default value here"))
        }
    }

    /// A warning (code W0501) pointing at parameter `key`, which the graph sets but the node's
    /// configuration ignores; validation still succeeds.
    pub fn warning(&self, key: &str, message: impl Into<String>) -> Diagnostic {
        let spans = match self.subject {
            Subject::Node(i) => &self.graph.nodes[i].spans,
            Subject::Resource(i) => &self.graph.resources[i].spans,
        };
        let span = if spans.keys.contains_key(key) {
            spans.key_span(key)
        } else {
            spans.value_span(key)
        };
        Diagnostic::warning(Code::IgnoredParam, message).at(span)
    }
}

/// The accessors [`NodeView`] and [`ResourceView`] share: the name, kind and parameters of
/// entry `self.id` of the graph's `$list`.
macro_rules! view_accessors {
    ($list:ident) => {
        pub fn name(&self) -> &'a str {
            &self.graph.$list[self.id].name
        }
        pub fn kind(&self) -> &'a str {
            self.graph.$list[self.id].kind.name()
        }
        pub fn params(&self) -> &'a Params {
            &self.graph.$list[self.id].params
        }
    };
}

/// A read-only view of a node of the graph being validated.
#[derive(Clone, Copy)]
pub struct NodeView<'a> {
    graph: &'a Graph,
    id: NodeId,
}

impl<'a> NodeView<'a> {
    view_accessors!(nodes);
    /// The replicas the node runs as, over all processes (its devices × the run's processes).
    pub fn replicas(&self) -> usize {
        self.graph.node_devices(self.id).len() * self.graph.world
    }
    /// The nodes this node repeats (its `repeat` list, see [`crate::Repeat`]), in the graph's
    /// order.
    pub fn repeats(&self) -> Vec<NodeView<'a>> {
        self.graph.nodes[self.id]
            .repeat
            .iter()
            .map(|&id| NodeView {
                graph: self.graph,
                id,
            })
            .collect()
    }
    /// The types of this node's output ports.
    pub fn output_types(&self) -> Vec<crate::PortType> {
        self.graph.nodes[self.id]
            .kind
            .outputs()
            .iter()
            .map(|o| o.ty)
            .collect()
    }
    /// The node wired to this node's input `port`.
    pub fn input(&self, port: &str) -> Option<NodeView<'a>> {
        let e = self.graph.nodes[self.id]
            .inputs
            .iter()
            .find(|e| e.port == port)?;
        Some(NodeView {
            graph: self.graph,
            id: e.from,
        })
    }
    /// The declared resource named `name`.
    pub fn resource(&self, name: &str) -> Option<ResourceView<'a>> {
        let id = self.graph.resources.iter().position(|r| r.name == name)?;
        Some(ResourceView {
            graph: self.graph,
            id,
        })
    }
    /// What this node's kind declares it does ([`NodeKind::capabilities`]).
    pub fn capabilities(&self) -> Vec<Capability> {
        self.graph.nodes[self.id].kind.capabilities()
    }
    pub fn has_capability(&self, capability: Capability) -> bool {
        self.capabilities().contains(&capability)
    }
    /// Whether one of this node's output ports has type `ty`.
    pub fn produces(&self, ty: impl Into<PortType>) -> bool {
        self.output_types().contains(&ty.into())
    }
    /// The first node upstream (breadth-first, this node included) whose kind satisfies `pred`,
    /// e.g. the data node feeding a rollout: `view.find_upstream(|k| k.starts_with("dataset"))`.
    /// Prefer [`NodeView::find_upstream_producing`] and [`NodeView::find_upstream_with`], which
    /// do not depend on kind names.
    pub fn find_upstream(&self, pred: impl Fn(&str) -> bool) -> Option<NodeView<'a>> {
        self.find_upstream_node(|n| pred(n.kind()))
    }
    /// The first node upstream (breadth-first, this node included) with an output of type `ty`,
    /// e.g. the data node feeding a rollout: `view.find_upstream_producing(PROMPTS)`.
    pub fn find_upstream_producing(&self, ty: impl Into<PortType>) -> Option<NodeView<'a>> {
        let ty = ty.into();
        self.find_upstream_node(|n| n.output_types().contains(&ty))
    }
    /// The first node upstream (breadth-first, this node included) whose kind declares
    /// `capability` ([`NodeKind::capabilities`]).
    pub fn find_upstream_with(&self, capability: Capability) -> Option<NodeView<'a>> {
        self.find_upstream_node(|n| n.has_capability(capability))
    }
    fn find_upstream_node(&self, pred: impl Fn(&NodeView<'a>) -> bool) -> Option<NodeView<'a>> {
        let mut queue = std::collections::VecDeque::from([self.id]);
        let mut seen = vec![false; self.graph.nodes.len()];
        while let Some(i) = queue.pop_front() {
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            let view = NodeView {
                graph: self.graph,
                id: i,
            };
            if pred(&view) {
                return Some(view);
            }
            queue.extend(self.graph.nodes[i].inputs.iter().map(|e| e.from));
        }
        None
    }
}

impl<'a> ValidateCtx<'a> {
    /// The node being validated as a view (for `find_upstream`); `None` for resources.
    pub fn node(&self) -> Option<NodeView<'a>> {
        match self.subject {
            Subject::Node(id) => Some(NodeView {
                graph: self.graph,
                id,
            }),
            Subject::Resource(_) => None,
        }
    }
}

/// A read-only view of a declared resource.
#[derive(Clone, Copy)]
pub struct ResourceView<'a> {
    graph: &'a Graph,
    id: ResourceId,
}

impl<'a> ResourceView<'a> {
    view_accessors!(resources);
    /// The device its section names (`device = "cpu:1"`), if any.
    pub fn pinned_device(&self) -> Option<crate::DeviceSpec> {
        self.graph.resources[self.id].device
    }
    /// The device it is built on: its own, else the run's first.
    pub fn device(&self) -> crate::DeviceSpec {
        self.graph.resources[self.id].device_in(&self.graph.devices)
    }
    /// Follows a resource-reference parameter (e.g. `from`) to the resource it names.
    pub fn follow(&self, key: &str) -> Option<ResourceView<'a>> {
        let name = self.params().get_str(key)?;
        let id = self.graph.resources.iter().position(|r| r.name == name)?;
        Some(ResourceView {
            graph: self.graph,
            id,
        })
    }
}
