//! The graph compiler: TOML text (+ `--set` overrides) → a checked, typed [`Graph`].
//!
//! Stages, in order; each collects every problem it finds before the next one runs, and all
//! diagnostics are reported together, sorted by position:
//! 1. **syntax** — parse with spans ([`crate::spec`]); apply overrides (errors point at the override);
//! 2. **shape** — known sections; `[run]`, each resource section and each node table checked
//!    against its schema: unknown keys (did-you-mean), required keys, types, ranges, enum values;
//!    unknown node kinds (did-you-mean);
//! 3. **placement** — the run's devices (`[run] device` or `devices`: known, distinct, of one
//!    type, present on the target machine) and each node's `device` (one of the run's devices);
//! 4. **resources** — resource-typed parameters name a declared resource of the right kind;
//! 5. **wiring** — every `inputs` entry names a known input port and an existing `node.port`, the
//!    port types agree (both ends and both types named), every required input is wired;
//! 6. **cycles** — one step is a DAG; a cycle is printed as its whole chain;
//! 7. **constraints** — when everything above passed, each kind's `validate` hook (which may read
//!    the node's placement, e.g. to require work that splits evenly over its replicas).
//!
//! Devices are checked against a [`Target`]: the machine (CUDA compiled in, number of GPUs) and
//! the number of processes of the run. [`compile`] targets this machine and one process.

use crate::device::{DeviceRequest, DeviceSpec, Machine};
use crate::diagnostic::{self, Code, Diagnostic, SourceId, SourceMap, Span, did_you_mean};
use crate::graph::{Edge, Graph, GraphNode, GraphResource, RunConfig, SpanIndex};
use crate::node::{NodeKind, NodeTable, Subject, ValidateCtx};
use crate::params::{ParamSpec, ParamType, Params};
use crate::port::PortSpec;
use crate::registry::{NO_BUILTIN_HELP, Registry};
use crate::resource::ResourceKind;
use crate::spec::{self, SEntry, SKind, STable, SValue, with_article};
use petgraph::graph::DiGraph;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Keys of a node table that belong to the engine, not to the kind's parameters.
pub const NODE_KEYS: &[&str] = &["kind", "inputs", "device", "timing", "repeat"];

/// A failed compilation: the diagnostics (errors and warnings) and the sources they point into.
#[derive(Debug)]
pub struct Failure {
    pub diagnostics: Vec<Diagnostic>,
    pub sources: SourceMap,
}

impl Failure {
    /// The diagnostics rendered as text.
    pub fn render(&self) -> String {
        diagnostic::render(&self.diagnostics, &self.sources)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

impl std::error::Error for Failure {}

/// The `[run]` section's schema.
pub fn run_params() -> Vec<ParamSpec> {
    vec![
        ParamSpec::int("steps")
            .default(1)
            .min(1.0)
            .doc("training steps (each runs the whole graph once); `--steps` overrides"),
        ParamSpec::int("seed")
            .default(0)
            .min(0.0)
            .doc("run seed; every random draw derives from (seed, step, node name)"),
        ParamSpec::string("device")
            .default("auto")
            .doc("`auto` | `cpu` | `cpu:N` | `cuda` | `cuda:N` | `vulkan` | `vulkan:N`; `auto` is CUDA when built with it and a GPU is present; short for `devices = [\"X\"]`"),
        ParamSpec::array("devices", ParamType::String).doc(
            "the devices of this process, all CPU replicas or all GPUs (`[\"cuda:0\", \"cuda:1\"]`): data-parallel nodes run one replica on each; instead of `device`",
        ),
        ParamSpec::path("out")
            .doc("run directory; default: a new timestamped directory under `runs/`"),
        ParamSpec::int("checkpoint_every")
            .default(0)
            .min(0.0)
            .doc("write a checkpoint every N steps and after the last step (0: never)"),
        ParamSpec::int("keep_checkpoints")
            .default(2)
            .min(1.0)
            .doc("how many of the newest checkpoints to keep"),
        ParamSpec::int("workers")
            .default(0)
            .min(0.0)
            .doc("worker threads running ready nodes concurrently (0: one per CPU core)"),
        ParamSpec::bool("plot")
            .default(true)
            .doc("draw plots of the main curves into the run directory at the end"),
    ]
}

/// One `path.to.key=value` override and where it came from (shown in diagnostics: `--set #2`,
/// `--steps`, `--device`).
#[derive(Clone, Debug)]
pub struct Override {
    pub origin: String,
    pub text: String,
}

impl Override {
    pub fn new(origin: impl Into<String>, text: impl Into<String>) -> Self {
        Override {
            origin: origin.into(),
            text: text.into(),
        }
    }

    /// The `--device` command-line argument (`run.device=...`); when the graph has `[run] devices`
    /// it is an error that points at the argument.
    pub fn device(device: &str) -> Override {
        Override::new(DEVICE_ARG, format!("run.device=\"{device}\""))
    }

    /// `--set` arguments, numbered from 1 in the order given.
    pub fn sets(args: &[String]) -> Vec<Override> {
        args.iter()
            .enumerate()
            .map(|(i, a)| Override::new(format!("--set #{}", i + 1), a.clone()))
            .collect()
    }
}

/// The origin of the `--device` override.
const DEVICE_ARG: &str = "--device";

/// What a graph is compiled for: the machine its devices must exist on and the number of
/// processes of the run (kinds' `validate` hooks see `world × local devices` replicas).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub machine: Machine,
    /// Processes of the run (`--world`), at least 1.
    pub world: usize,
}

impl Target {
    /// This binary on this machine, one process.
    pub fn detect() -> Self {
        Target {
            machine: Machine::detect(),
            world: 1,
        }
    }
}

/// Compiles a graph file for this machine and one process ([`Target::detect`]). `name` is how the
/// file is shown in diagnostics (its path). Returns the graph and its warnings, or every
/// diagnostic.
pub fn compile(
    registry: &Registry,
    name: &str,
    text: &str,
    overrides: &[Override],
) -> Result<(Graph, Vec<Diagnostic>), Failure> {
    compile_for(registry, name, text, overrides, &Target::detect())
}

/// [`compile`] for another [`Target`] (a multi-process run, or a machine described by a test).
pub fn compile_for(
    registry: &Registry,
    name: &str,
    text: &str,
    overrides: &[Override],
    target: &Target,
) -> Result<(Graph, Vec<Diagnostic>), Failure> {
    let mut sources = SourceMap::default();
    let file = sources.add(name, text);
    let fail = |mut diagnostics: Vec<Diagnostic>, sources: SourceMap| {
        diagnostic::sort(&mut diagnostics);
        Err(Failure {
            diagnostics,
            sources,
        })
    };

    // Stage 1: syntax and overrides.
    let mut doc = match spec::parse(text, file) {
        Ok(doc) => doc,
        Err(d) => return fail(d, sources),
    };
    let mut diags = Vec::new();
    let mut device_arg = None;
    for o in overrides {
        let id = sources.add(o.origin.clone(), o.text.clone());
        if o.origin == DEVICE_ARG {
            device_arg = Some(id);
        }
        if let Err(d) = spec::apply_override(&mut doc, &o.text, id) {
            diags.push(d);
        }
    }

    let mut c = Compiler {
        registry,
        diags,
        file,
        machine: target.machine,
        device_arg,
    };
    // Stage 2: shape.
    let (run, run_devices) = c.check_run(&doc);
    let resources = c.check_resources(&doc);
    let nodes = c.check_nodes(&doc);
    c.check_sections(&doc);
    // Stage 3: placement.
    let node_devices = c.check_node_devices(&nodes, run_devices.as_deref());
    // Stage 4: resource references.
    let resource_deps = c.check_resource_refs(&resources, &nodes);
    // Stage 5: wiring.
    let edges = c.check_wiring(&nodes);
    // Stage 6: repeats and cycles.
    let repeated_by = c.check_repeats(&nodes, &edges);
    let dependencies = crate::repeat::dependencies(&edges, &repeated_by);
    let order = c.check_cycles(&nodes, &edges, &repeated_by, &dependencies);

    if c.diags.iter().any(Diagnostic::is_error) {
        return fail(c.diags, sources);
    }
    let order = order.expect("no cycle when there is no error");
    let resolved = toml::to_string(
        &SValue {
            kind: SKind::Table(doc.clone()),
            span: Span::default(),
        }
        .to_toml(),
    )
    .unwrap_or_default();

    let mut dag = DiGraph::new();
    let idx: Vec<_> = (0..nodes.len()).map(|i| dag.add_node(i)).collect();
    for (to, es) in edges.iter().enumerate() {
        // A loop node's arguments to its repeated nodes are calls, not edges of the step's DAG.
        for e in es.iter().filter(|e| repeated_by[to] != Some(e.from)) {
            dag.add_edge(idx[e.from], idx[to], ());
        }
    }
    let repeats: Vec<Vec<usize>> = (0..nodes.len())
        .map(|l| {
            order
                .iter()
                .copied()
                .filter(|&r| repeated_by[r] == Some(l))
                .collect()
        })
        .collect();
    let graph = Graph {
        run: run.expect("run section checked"),
        nodes: nodes
            .into_iter()
            .zip(edges)
            .zip(node_devices)
            .zip(repeats.into_iter().zip(repeated_by))
            .map(|(((n, inputs), device), (repeat, repeated_by))| GraphNode {
                name: n.name,
                kind: n.kind.expect("kinds resolved"),
                params: n.params,
                inputs,
                device,
                timing_key: n.timing_key,
                repeat,
                repeated_by,
                spans: n.spans,
            })
            .collect(),
        resources: resources
            .into_iter()
            .zip(resource_deps)
            .map(|(r, depends)| GraphResource {
                name: r.name,
                kind: r.kind,
                params: r.params,
                depends,
                spans: r.spans,
            })
            .collect(),
        devices: run_devices.expect("run devices checked"),
        world: target.world.max(1),
        order,
        dependencies,
        dag,
        sources,
        resolved,
    };

    // Stage 7: constraints declared by kinds.
    let mut diags = c.diags;
    diags.extend(check_constraints(&graph));
    if diags.iter().any(Diagnostic::is_error) {
        return fail(diags, graph.sources);
    }
    diagnostic::sort(&mut diags);
    Ok((graph, diags))
}

/// The constraint stage: every resource and node kind's `validate` hook on a graph whose earlier
/// stages passed. [`crate::Session::build`] runs it again when it places the graph on other
/// devices or processes than it was compiled for, since constraints may depend on the replicas.
pub fn check_constraints(graph: &Graph) -> Vec<Diagnostic> {
    let mut diags = Vec::new();
    for i in 0..graph.resources.len() {
        let ctx = ValidateCtx {
            graph,
            subject: Subject::Resource(i),
        };
        diags.extend(graph.resources[i].kind.validate(&ctx));
    }
    for i in 0..graph.nodes.len() {
        let ctx = ValidateCtx {
            graph,
            subject: Subject::Node(i),
        };
        diags.extend(graph.nodes[i].kind.validate(&ctx));
    }
    diags
}

/// A node after the shape stage.
struct NodeDraft<'d> {
    name: String,
    kind: Option<Arc<dyn NodeKind>>,
    params: Params,
    inputs: Option<&'d SEntry>,
    /// `device = "..."` as written, with its value's span.
    device: Option<(DeviceRequest, Span)>,
    timing_key: String,
    /// `repeat = [...]` as written: node names with their spans.
    repeat: Vec<(String, Span)>,
    spans: SpanIndex,
    /// Resource references: (param path, resource kind, name, span).
    refs: Vec<ResourceRef>,
}

struct ResourceDraft {
    name: String,
    kind: Arc<dyn ResourceKind>,
    params: Params,
    spans: SpanIndex,
    refs: Vec<ResourceRef>,
}

#[derive(Clone)]
struct ResourceRef {
    path: String,
    kind: String,
    name: String,
    span: Span,
}

struct Compiler<'r> {
    registry: &'r Registry,
    diags: Vec<Diagnostic>,
    file: SourceId,
    /// The machine devices are checked against.
    machine: Machine,
    /// The source of the `--device` argument, when given.
    device_arg: Option<SourceId>,
}

fn table_of<'a>(
    e: &'a SEntry,
    what: &str,
    help: &str,
    diags: &mut Vec<Diagnostic>,
) -> Option<&'a STable> {
    match &e.value.kind {
        SKind::Table(t) => Some(t),
        other => {
            diags.push(
                Diagnostic::error(
                    Code::WrongType,
                    format!(
                        "{what} must be a table, found {}",
                        with_article(other.type_name())
                    ),
                )
                .at(e.value.span)
                .with_help(help.to_string()),
            );
            None
        }
    }
}

impl Compiler<'_> {
    fn check_sections(&mut self, doc: &STable) {
        let mut known = vec!["run".to_string(), "nodes".to_string()];
        known.extend(
            self.registry
                .resource_kinds()
                .map(|k| k.section().to_string()),
        );
        for e in &doc.entries {
            if known.contains(&e.key) {
                continue;
            }
            let mut d =
                Diagnostic::error(Code::UnknownSection, format!("unknown section `{}`", e.key))
                    .at(e.key_span);
            d = match did_you_mean(&e.key, known.iter().map(String::as_str)) {
                _ if self.registry.lacks_builtin() => d.with_help(NO_BUILTIN_HELP),
                Some(h) => d.with_help(h),
                None => d.with_help(format!("sections are: {}", known.join(", "))),
            };
            self.diags.push(d);
        }
        if doc.get("nodes").is_none() {
            self.diags.push(
                Diagnostic::error(Code::MissingParam, "the graph has no `[nodes.*]` section")
                    .at(Span::new(self.file, 0, 0))
                    .with_help("declare nodes as `[nodes.NAME]` tables with `kind = \"...\"`"),
            );
        }
    }

    /// The `[run]` section and the run's devices (`None` after an error).
    fn check_run(&mut self, doc: &STable) -> (Option<RunConfig>, Option<Vec<DeviceSpec>>) {
        let empty = STable::default();
        let (table, header) = match doc.get("run") {
            Some(e) => match table_of(
                e,
                "`run`",
                "write it as a section: `[run]`",
                &mut self.diags,
            ) {
                Some(t) => (t, e.key_span),
                None => return (None, None),
            },
            None => (&empty, Span::new(self.file, 0, 0)),
        };
        let mut spans = SpanIndex {
            header,
            ..Default::default()
        };
        let mut refs = Vec::new();
        let map = check_params(
            table,
            &run_params(),
            &[],
            "the `[run]` section",
            "",
            &mut spans,
            &mut refs,
            &mut self.diags,
        );
        let params = Params::from_map(map);
        let devices = self.check_run_devices(table);
        (params.parse::<RunConfig>().ok(), devices)
    }

    /// `[run] device` or `[run] devices`, resolved on the target machine. Type errors were
    /// reported by the schema check; `None` after any error.
    fn check_run_devices(&mut self, table: &STable) -> Option<Vec<DeviceSpec>> {
        let errors = self.diags.len();
        let (one, list) = (table.get("device"), table.get("devices"));
        if let (Some(one), Some(list)) = (one, list) {
            self.diags.push(self.device_conflict(one, list));
            return None;
        }
        let Some(list) = list else {
            let Some(one) = one else {
                return Some(vec![self.auto()]);
            };
            let req = self.parse_device(one.value.as_str()?, one.value.span)?;
            return self
                .resolve_run_device(req, one.value.span)
                .map(|d| vec![d]);
        };
        // Not an array of strings: reported by the schema check.
        let SKind::Array(items) = &list.value.kind else {
            return None;
        };
        if items.iter().any(|i| i.as_str().is_none()) {
            return None;
        }
        if items.is_empty() {
            self.diags.push(
                Diagnostic::error(Code::BadDeviceList, "`[run] devices` is empty")
                    .at(list.value.span)
                    .with_help(
                        "list the devices of this process, e.g. `devices = [\"cpu:0\", \"cpu:1\"]`",
                    ),
            );
            return None;
        }
        // Duplicates and mixed types are mistakes on any machine: checked on the devices as
        // written, before each is looked up on the target machine.
        let mut listed: Vec<(DeviceRequest, DeviceSpec, Span)> = Vec::new();
        for item in items {
            let Some(req) = self.parse_device(item.as_str().expect("checked above"), item.span)
            else {
                continue;
            };
            let d = match req {
                DeviceRequest::Device(d) => d,
                DeviceRequest::Auto => {
                    self.diags.push(
                        Diagnostic::error(
                            Code::BadDeviceList,
                            "`auto` cannot be one of `[run] devices`",
                        )
                        .at(item.span)
                        .with_help(
                            "`auto` picks one device: write `device = \"auto\"`, or list the devices",
                        ),
                    );
                    continue;
                }
            };
            if let Some((_, _, first)) = listed.iter().find(|(_, e, _)| *e == d) {
                self.diags.push(
                    Diagnostic::error(
                        Code::BadDeviceList,
                        format!("`[run] devices` lists {d} twice"),
                    )
                    .at(item.span)
                    .with_note(*first, "first listed here")
                    .with_help("each device runs one replica; list it once"),
                );
                continue;
            }
            if let Some((_, first, first_span)) = listed.first()
                && first.type_name() != d.type_name()
            {
                self.diags.push(
                    Diagnostic::error(
                        Code::BadDeviceList,
                        format!(
                            "`[run] devices` mixes {} and {} devices",
                            first.type_name(),
                            d.type_name()
                        ),
                    )
                    .at(item.span)
                    .with_note(
                        *first_span,
                        format!("{first} is a {} device", first.type_name()),
                    )
                    .with_help(
                        "the replicas of a run are all CPU replicas (`cpu:N`), all GPUs (`cuda:N`) or all Vulkan adapters (`vulkan:N`)",
                    ),
                );
                continue;
            }
            listed.push((req, d, item.span));
        }
        let devices: Vec<DeviceSpec> = listed
            .into_iter()
            .filter_map(|(req, _, span)| self.resolve_run_device(req, span))
            .collect();
        (self.diags.len() == errors).then_some(devices)
    }

    /// `auto` on the target machine.
    fn auto(&self) -> DeviceSpec {
        self.machine
            .resolve(DeviceRequest::Auto)
            .expect("auto always resolves")
    }

    /// A device string (an error at `span` when it is not one).
    fn parse_device(&mut self, text: &str, span: Span) -> Option<DeviceRequest> {
        text.parse::<DeviceRequest>()
            .map_err(|msg| {
                self.diags
                    .push(Diagnostic::error(Code::InvalidValue, msg).at(span))
            })
            .ok()
    }

    /// A device of the run on the target machine (an error at `span` when it is not there).
    fn resolve_run_device(&mut self, req: DeviceRequest, span: Span) -> Option<DeviceSpec> {
        match self.machine.resolve(req) {
            Ok(d) => Some(d),
            Err(why) => {
                self.diags.push(
                    Diagnostic::error(
                        Code::DeviceUnavailable,
                        format!("the run is placed on {req}, but {why}"),
                    )
                    .at(span)
                    .with_help(why.help()),
                );
                None
            }
        }
    }

    /// `[run] device` and `[run] devices` both given: an error at the one given second (an
    /// override comes after the file); `--device` against a list says so.
    fn device_conflict(&self, one: &SEntry, list: &SEntry) -> Diagnostic {
        let written: Vec<String> = match &list.value.kind {
            SKind::Array(items) => items
                .iter()
                .map(|i| {
                    i.as_str()
                        .map_or_else(|| format!("{}", i.to_json()), str::to_string)
                })
                .collect(),
            _ => Vec::new(),
        };
        let list_text = format!("[{}]", written.join(", "));
        if Some(one.key_span.source) == self.device_arg {
            return Diagnostic::error(
                Code::DeviceConflict,
                format!(
                    "the graph places the run on {list_text} with `[run] devices`; `--device` cannot override a list"
                ),
            )
            .at(one.value.span)
            .with_note(list.key_span, "`[run] devices` is set here")
            .with_help("leave out `--device`, or choose the devices with `--set 'run.devices=[\"cuda:0\", \"cuda:1\"]'`");
        }
        let key = |e: &SEntry| (e.key_span.source, e.key_span.start);
        let (first, second) = if key(one) <= key(list) {
            (one, list)
        } else {
            (list, one)
        };
        Diagnostic::error(
            Code::DeviceConflict,
            "`[run] device` and `[run] devices` are both given",
        )
        .at(second.key_span)
        .with_note(first.key_span, format!("`{}` is given here", first.key))
        .with_help("`device = \"X\"` is short for `devices = [\"X\"]`; keep one of them")
    }

    /// Each node's `device`, resolved and checked against the run's devices (stage 3).
    fn check_node_devices(
        &mut self,
        nodes: &[NodeDraft<'_>],
        run_devices: Option<&[DeviceSpec]>,
    ) -> Vec<Option<DeviceSpec>> {
        let mut out = Vec::with_capacity(nodes.len());
        for n in nodes {
            let Some((req, span)) = n.device else {
                out.push(None);
                continue;
            };
            let d = match self.machine.resolve(req) {
                Ok(d) => d,
                Err(why) => {
                    self.diags.push(
                        Diagnostic::error(
                            Code::DeviceUnavailable,
                            format!("node `{}` is placed on {req}, but {why}", n.name),
                        )
                        .at(span)
                        .with_help(why.help()),
                    );
                    out.push(None);
                    continue;
                }
            };
            if let Some(run) = run_devices
                && !run.contains(&d)
            {
                self.diags.push(
                    Diagnostic::error(
                        Code::DeviceNotInRun,
                        format!(
                            "node `{}` is placed on {d}, which is not one of the run's devices [{}]",
                            n.name,
                            crate::device::device_list(run)
                        ),
                    )
                    .at(span)
                    .with_help(format!(
                        "add {d} to `[run] devices`, or remove the node's `device` to run it on the run's devices"
                    )),
                );
            }
            out.push(Some(d));
        }
        out
    }

    fn check_resources(&mut self, doc: &STable) -> Vec<ResourceDraft> {
        let mut out = Vec::new();
        for section in &doc.entries {
            let Some(kind) = self
                .registry
                .resource_kind_for_section(&section.key)
                .cloned()
            else {
                continue;
            };
            let Some(table) = table_of(
                section,
                &format!("`{}`", section.key),
                &format!(
                    "declare each resource as a section: `[{}.NAME]`",
                    section.key
                ),
                &mut self.diags,
            ) else {
                continue;
            };
            for e in &table.entries {
                let what = format!("`[{}.{}]`", section.key, e.key);
                let help = format!("write it as a section: `[{}.{}]`", section.key, e.key);
                let Some(t) = table_of(e, &what, &help, &mut self.diags) else {
                    continue;
                };
                let mut spans = SpanIndex {
                    header: e.key_span,
                    ..Default::default()
                };
                let mut refs = Vec::new();
                let desc = format!("{} ({} resource)", what, kind.name());
                let map = check_params(
                    t,
                    &kind.params(),
                    &[],
                    &desc,
                    "",
                    &mut spans,
                    &mut refs,
                    &mut self.diags,
                );
                out.push(ResourceDraft {
                    name: e.key.clone(),
                    kind: kind.clone(),
                    params: Params::from_map(map),
                    spans,
                    refs,
                });
            }
        }
        out
    }

    fn check_nodes<'d>(&mut self, doc: &'d STable) -> Vec<NodeDraft<'d>> {
        let mut out = Vec::new();
        let Some(section) = doc.get("nodes") else {
            return out;
        };
        let Some(table) = table_of(
            section,
            "`nodes`",
            "declare each node as a section: `[nodes.NAME]`",
            &mut self.diags,
        ) else {
            return out;
        };
        for e in &table.entries {
            let what = format!("node `{}`", e.key);
            let help = format!("write it as a section: `[nodes.{}]`", e.key);
            let Some(t) = table_of(e, &what, &help, &mut self.diags) else {
                continue;
            };
            let mut spans = SpanIndex {
                header: e.key_span,
                ..Default::default()
            };
            let kind = match t.get("kind") {
                None => {
                    self.diags.push(
                        Diagnostic::error(Code::MissingParam, format!("{what} has no `kind`"))
                            .at(e.key_span)
                            .with_help("add `kind = \"...\"`; `flowrl nodes` lists the kinds"),
                    );
                    None
                }
                Some(k) => {
                    spans.values.insert("kind".into(), k.value.span);
                    match k.value.as_str() {
                        None => {
                            self.diags
                                .push(wrong_type(&k.value, &ParamType::String, "kind"));
                            None
                        }
                        Some(name) => match self.registry.kind(name) {
                            Some(kind) => Some(kind.clone()),
                            None => {
                                let names: Vec<&str> =
                                    self.registry.kinds().map(|k| k.name()).collect();
                                let help = match did_you_mean(name, names.iter().copied()) {
                                    _ if self.registry.lacks_builtin() => NO_BUILTIN_HELP.into(),
                                    Some(h) => h,
                                    None => "`flowrl nodes` lists the kinds registered in this \
                                             binary; a kind defined in a plugin crate runs with \
                                             that plugin's binary (docs/plugins.md)"
                                        .into(),
                                };
                                self.diags.push(
                                    Diagnostic::error(
                                        Code::UnknownKind,
                                        format!("unknown node kind `{name}`"),
                                    )
                                    .at(k.value.span)
                                    .with_label("not a registered node kind")
                                    .with_help(help),
                                );
                                None
                            }
                        },
                    }
                }
            };
            // A kind may specialize itself from the node's table (ports and parameters per node).
            let kind = match kind {
                Some(k) => match k.instantiate(&NodeTable {
                    name: &e.key,
                    table: t,
                    header: e.key_span,
                }) {
                    Ok(special) => Some(special.unwrap_or(k)),
                    Err(d) => {
                        self.diags.extend(d);
                        None
                    }
                },
                None => None,
            };
            let device = t.get("device").and_then(|d| {
                spans.values.insert("device".into(), d.value.span);
                match d.value.as_str().map(str::parse::<DeviceRequest>) {
                    Some(Ok(DeviceRequest::Auto)) => {
                        self.diags.push(
                            Diagnostic::error(
                                Code::InvalidValue,
                                format!("{what} cannot be placed on `auto`"),
                            )
                            .at(d.value.span)
                            .with_help(
                                "a node's `device` pins it to one of the run's devices (`cpu:N`, \
                                 `cuda:N`); without it the node runs on the run's devices",
                            ),
                        );
                        None
                    }
                    Some(Ok(r)) => Some((r, d.value.span)),
                    Some(Err(msg)) => {
                        self.diags
                            .push(Diagnostic::error(Code::InvalidValue, msg).at(d.value.span));
                        None
                    }
                    None => {
                        self.diags
                            .push(wrong_type(&d.value, &ParamType::String, "device"));
                        None
                    }
                }
            });
            let timing_key = match t.get("timing") {
                Some(tk) => match tk.value.as_str() {
                    Some(s) => s.to_string(),
                    None => {
                        self.diags
                            .push(wrong_type(&tk.value, &ParamType::String, "timing"));
                        e.key.clone()
                    }
                },
                None => kind
                    .as_ref()
                    .and_then(|k| k.timing_key().map(str::to_string))
                    .unwrap_or_else(|| e.key.clone()),
            };
            let mut repeat = Vec::new();
            if let Some(r) = t.get("repeat") {
                spans.keys.insert("repeat".into(), r.key_span);
                spans.values.insert("repeat".into(), r.value.span);
                match &r.value.kind {
                    SKind::Array(items) => {
                        for item in items {
                            match item.as_str() {
                                Some(name) => repeat.push((name.to_string(), item.span)),
                                None => {
                                    self.diags
                                        .push(wrong_type(item, &ParamType::String, "repeat"))
                                }
                            }
                        }
                    }
                    _ => self.diags.push(
                        Diagnostic::error(Code::WrongType, "`repeat` must be a list of node names")
                            .at(r.value.span)
                            .with_help("e.g. `repeat = [\"data\", \"rollout\", \"reward\"]`"),
                    ),
                }
            }
            let inputs = t.get("inputs");
            if let Some(i) = inputs {
                spans.keys.insert("inputs".into(), i.key_span);
                spans.values.insert("inputs".into(), i.value.span);
                for e in i.value.as_table().map_or(&[][..], |t| &t.entries) {
                    spans.keys.insert(format!("inputs.{}", e.key), e.key_span);
                    spans
                        .values
                        .insert(format!("inputs.{}", e.key), e.value.span);
                }
            }
            // `devices` belongs to `[run]`; on a node it gets its own explanation rather than a
            // did-you-mean.
            let without_devices;
            let t = match (t.get("devices"), &kind) {
                (Some(d), Some(k)) => {
                    let help = if k.data_parallel() {
                        format!(
                            "kind `{}` is data-parallel: without `device` it runs one replica on each of `[run] devices`",
                            k.name()
                        )
                    } else {
                        format!(
                            "kind `{}` runs once per process: on the run's first device, or on the one its `device` names",
                            k.name()
                        )
                    };
                    self.diags.push(
                        Diagnostic::error(
                            Code::UnknownKey,
                            format!("{what} cannot take `devices`; a node takes one `device`"),
                        )
                        .at(d.key_span)
                        .with_help(help),
                    );
                    without_devices = STable {
                        entries: t
                            .entries
                            .iter()
                            .filter(|e| e.key != "devices")
                            .cloned()
                            .collect(),
                    };
                    &without_devices
                }
                _ => t,
            };
            let mut refs = Vec::new();
            let params = match &kind {
                Some(kind) => {
                    let desc = format!("{what} (kind `{}`)", kind.name());
                    // `repeat` is an engine key of loop kinds only (check_repeats explains it
                    // on the others).
                    let takes_repeat = kind.inputs().iter().any(|p| p.repeated);
                    let reserved: Vec<&str> = NODE_KEYS
                        .iter()
                        .copied()
                        .filter(|k| *k != "repeat" || takes_repeat)
                        .collect();
                    let without_repeat;
                    let t = if takes_repeat || t.get("repeat").is_none() {
                        t
                    } else {
                        without_repeat = STable {
                            entries: t
                                .entries
                                .iter()
                                .filter(|e| e.key != "repeat")
                                .cloned()
                                .collect(),
                        };
                        &without_repeat
                    };
                    check_params(
                        t,
                        &kind.params(),
                        &reserved,
                        &desc,
                        "",
                        &mut spans,
                        &mut refs,
                        &mut self.diags,
                    )
                }
                None => serde_json::Map::new(),
            };
            out.push(NodeDraft {
                name: e.key.clone(),
                kind,
                params: Params::from_map(params),
                inputs,
                device,
                timing_key,
                repeat,
                spans,
                refs,
            });
        }
        out
    }

    /// Resolves resource references; returns each resource's dependencies.
    fn check_resource_refs(
        &mut self,
        resources: &[ResourceDraft],
        nodes: &[NodeDraft<'_>],
    ) -> Vec<Vec<usize>> {
        let check = |r: &ResourceRef, diags: &mut Vec<Diagnostic>| -> Option<usize> {
            if let Some(i) = resources.iter().position(|d| d.name == r.name) {
                let actual = resources[i].kind.name();
                if actual == r.kind {
                    return Some(i);
                }
                diags.push(
                    Diagnostic::error(
                        Code::UnknownResource,
                        format!(
                            "`{}` expects a {} resource, but `{}` is a {actual}",
                            r.path, r.kind, r.name
                        ),
                    )
                    .at(r.span)
                    .with_note(
                        resources[i].spans.header,
                        format!("`{}` is declared here", r.name),
                    ),
                );
                return None;
            }
            let same: Vec<&str> = resources
                .iter()
                .filter(|d| d.kind.name() == r.kind)
                .map(|d| d.name.as_str())
                .collect();
            let section = self
                .registry
                .resource_kind(&r.kind)
                .map_or_else(|| r.kind.clone(), |k| k.section().to_string());
            let help = did_you_mean(&r.name, same.iter().copied()).unwrap_or_else(|| {
                if same.is_empty() {
                    format!("declare it as `[{section}.{}]`", r.name)
                } else {
                    format!("declared {} resources: {}", r.kind, same.join(", "))
                }
            });
            diags.push(
                Diagnostic::error(
                    Code::UnknownResource,
                    format!("unknown {} resource `{}`", r.kind, r.name),
                )
                .at(r.span)
                .with_help(help),
            );
            None
        };
        for n in nodes {
            for r in &n.refs {
                check(r, &mut self.diags);
            }
        }
        let deps: Vec<Vec<usize>> = resources
            .iter()
            .map(|d| {
                d.refs
                    .iter()
                    .filter_map(|r| check(r, &mut self.diags))
                    .collect()
            })
            .collect();
        // Resources referring to each other in a loop.
        let mut g = DiGraph::<usize, ()>::new();
        let ix: Vec<_> = (0..resources.len()).map(|i| g.add_node(i)).collect();
        for (i, ds) in deps.iter().enumerate() {
            for &d in ds {
                g.add_edge(ix[d], ix[i], ());
            }
        }
        for scc in petgraph::algo::tarjan_scc(&g) {
            let self_loop = scc.len() == 1 && deps[g[scc[0]]].contains(&g[scc[0]]);
            if scc.len() > 1 || self_loop {
                let mut names: Vec<&str> =
                    scc.iter().map(|&n| resources[g[n]].name.as_str()).collect();
                names.sort();
                let first = resources
                    .iter()
                    .position(|r| r.name == names[0])
                    .unwrap_or(0);
                self.diags.push(
                    Diagnostic::error(
                        Code::Cycle,
                        format!(
                            "resources refer to each other in a cycle: {}",
                            names.join(", ")
                        ),
                    )
                    .at(resources[first].spans.header),
                );
            }
        }
        deps
    }

    fn check_wiring(&mut self, nodes: &[NodeDraft<'_>]) -> Vec<Vec<Edge>> {
        let mut all = Vec::new();
        for n in nodes {
            let mut edges = Vec::new();
            let Some(kind) = &n.kind else {
                all.push(edges);
                continue;
            };
            let specs = kind.inputs();
            let variadic = specs.iter().find(|s| s.variadic);
            let what = format!("node `{}` (kind `{}`)", n.name, kind.name());
            let mut wired: Vec<&str> = Vec::new();
            if let Some(inputs) = n.inputs {
                let Some(table) = table_of(
                    inputs,
                    "`inputs`",
                    "write `inputs = { port = \"node.port\" }`",
                    &mut self.diags,
                ) else {
                    // Not a table: reported; missing inputs would only repeat it.
                    all.push(edges);
                    continue;
                };
                for e in &table.entries {
                    wired.push(&e.key);
                    if let Some(edge) = self.check_edge(n, &what, &specs, variadic, e, nodes) {
                        edges.push(edge);
                    }
                }
            }
            let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            for s in specs.iter().filter(|s| !s.optional && !s.variadic) {
                if wired.contains(&s.name.as_str()) {
                    continue;
                }
                // Already reported as a misspelled port with a did-you-mean.
                let misspelled = wired.iter().any(|w| {
                    !names.contains(w)
                        && did_you_mean(w, names.iter().copied())
                            .is_some_and(|h| h.contains(&format!("`{}`", s.name)))
                });
                if misspelled && variadic.is_none() {
                    continue;
                }
                let producers: Vec<String> = nodes
                    .iter()
                    .filter(|m| m.name != n.name)
                    .flat_map(|m| {
                        m.kind.iter().flat_map(move |k| {
                            k.outputs()
                                .into_iter()
                                .filter(|o| s.ty.accepts(o.ty))
                                .map(move |o| format!("{}.{}", m.name, o.name))
                        })
                    })
                    .collect();
                let help = match producers.first() {
                    Some(p) => format!("wire it: `inputs = {{ {} = \"{p}\" }}`", s.name),
                    None => format!("no node in this graph produces {}", s.ty),
                };
                let at = n.inputs.map_or(n.spans.header, |i| i.key_span);
                self.diags.push(
                    Diagnostic::error(
                        Code::MissingInput,
                        format!(
                            "{what} needs input `{}` ({}), which is not wired",
                            s.name, s.ty
                        ),
                    )
                    .at(at)
                    .with_help(help),
                );
            }
            all.push(edges);
        }
        all
    }

    fn check_edge(
        &mut self,
        n: &NodeDraft<'_>,
        what: &str,
        specs: &[PortSpec],
        variadic: Option<&PortSpec>,
        e: &SEntry,
        nodes: &[NodeDraft<'_>],
    ) -> Option<Edge> {
        let spec = match specs.iter().find(|s| !s.variadic && s.name == e.key) {
            Some(s) => s,
            None => match variadic {
                Some(v) => v,
                None => {
                    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                    let help = did_you_mean(&e.key, names.iter().copied()).unwrap_or_else(|| {
                        if names.is_empty() {
                            "this kind takes no inputs".to_string()
                        } else {
                            format!("its inputs are: {}", names.join(", "))
                        }
                    });
                    self.diags.push(
                        Diagnostic::error(
                            Code::UnknownPort,
                            format!("{what} has no input port `{}`", e.key),
                        )
                        .at(e.key_span)
                        .with_help(help),
                    );
                    return None;
                }
            },
        };
        let Some(target) = e.value.as_str() else {
            self.diags.push(wrong_type(
                &e.value,
                &ParamType::String,
                &format!("inputs.{}", e.key),
            ));
            return None;
        };
        let Some((src, port)) = target
            .rsplit_once('.')
            .filter(|(a, b)| !a.is_empty() && !b.is_empty())
        else {
            self.diags.push(
                Diagnostic::error(
                    Code::BadWiring,
                    format!(
                        "input `{}` of node `{}` must be \"node.port\", found \"{target}\"",
                        e.key, n.name
                    ),
                )
                .at(e.value.span)
                .with_help(format!("e.g. `{} = \"data.prompts\"`", e.key)),
            );
            return None;
        };
        let Some(from) = nodes.iter().position(|m| m.name == src) else {
            let help =
                did_you_mean(src, nodes.iter().map(|m| m.name.as_str())).unwrap_or_else(|| {
                    let all: Vec<&str> = nodes.iter().map(|m| m.name.as_str()).collect();
                    format!("the nodes are: {}", all.join(", "))
                });
            self.diags.push(
                Diagnostic::error(
                    Code::UnknownNode,
                    format!(
                        "input `{}` of node `{}` is wired to unknown node `{src}`",
                        e.key, n.name
                    ),
                )
                .at(e.value.span)
                .with_help(help),
            );
            return None;
        };
        let src_kind = nodes[from].kind.as_ref()?;
        let outs = src_kind.outputs();
        let Some(out) = outs.iter().find(|o| o.name == port) else {
            let names: Vec<&str> = outs.iter().map(|o| o.name.as_str()).collect();
            let help = did_you_mean(port, names.iter().copied()).unwrap_or_else(|| {
                if names.is_empty() {
                    format!("`{src}` (kind `{}`) has no outputs", src_kind.name())
                } else {
                    format!(
                        "`{src}` (kind `{}`) produces: {}",
                        src_kind.name(),
                        names.join(", ")
                    )
                }
            });
            self.diags.push(
                Diagnostic::error(
                    Code::UnknownOutput,
                    format!(
                        "node `{src}` (kind `{}`) has no output port `{port}`",
                        src_kind.name()
                    ),
                )
                .at(e.value.span)
                .with_help(help),
            );
            return None;
        };
        if !spec.ty.accepts(out.ty) {
            self.diags.push(
                Diagnostic::error(
                    Code::PortTypeMismatch,
                    format!(
                        "`{}.{}` expects {}, got {} from `{src}.{port}`",
                        n.name, e.key, spec.ty, out.ty
                    ),
                )
                .at(e.value.span)
                .with_label(format!("this is {}", out.ty))
                .with_note(
                    nodes[from].spans.header,
                    format!("`{src}` (kind `{}`) is defined here", src_kind.name()),
                ),
            );
            return None;
        }
        Some(Edge {
            port: e.key.clone(),
            from,
            from_port: port.to_string(),
            ty: out.ty,
            optional: spec.optional,
        })
    }

    /// The `repeat` lists (rules in [`crate::repeat`]): for each node, the loop node that repeats
    /// it.
    fn check_repeats(
        &mut self,
        nodes: &[NodeDraft<'_>],
        edges: &[Vec<Edge>],
    ) -> Vec<Option<usize>> {
        let mut by: Vec<Option<usize>> = vec![None; nodes.len()];
        let bad =
            |message: String, span: Span| Diagnostic::error(Code::BadRepeat, message).at(span);
        for (l, node) in nodes.iter().enumerate() {
            let Some(kind) = node.kind.as_ref().filter(|_| !node.repeat.is_empty()) else {
                continue;
            };
            if !kind.inputs().iter().any(|s| s.repeated) {
                self.diags.push(
                    bad(
                        format!(
                            "node `{}` (kind `{}`) cannot repeat nodes: its kind has no repeated input",
                            node.name,
                            kind.name()
                        ),
                        node.spans.value_span("repeat"),
                    )
                    .with_help(
                        "`repeat` belongs to kinds that run other nodes on demand within a step \
                         (`flowrl nodes` shows their inputs marked `repeated`)",
                    ),
                );
                continue;
            }
            for (name, span) in &node.repeat {
                let Some(r) = nodes.iter().position(|m| m.name == *name) else {
                    let help = did_you_mean(name, nodes.iter().map(|m| m.name.as_str()))
                        .unwrap_or_else(|| "`repeat` lists nodes of this graph".into());
                    self.diags.push(
                        Diagnostic::error(
                            Code::UnknownNode,
                            format!("node `{}` repeats unknown node `{name}`", node.name),
                        )
                        .at(*span)
                        .with_help(help),
                    );
                    continue;
                };
                match by[r] {
                    _ if r == l => self
                        .diags
                        .push(bad(format!("node `{name}` cannot repeat itself"), *span)),
                    Some(other) if other == l => self
                        .diags
                        .push(bad(format!("`{name}` is listed twice in `repeat`"), *span)),
                    Some(other) => self.diags.push(bad(
                        format!(
                            "`{name}` is already repeated by `{}`; a node is repeated by at most one node",
                            nodes[other].name
                        ),
                        *span,
                    )),
                    None if !nodes[r].repeat.is_empty() => self.diags.push(bad(
                        format!("`{name}` repeats nodes itself; repeats do not nest"),
                        *span,
                    )),
                    None => by[r] = Some(l),
                }
            }
        }
        for (l, node) in nodes.iter().enumerate() {
            let Some(kind) = &node.kind else { continue };
            let (ins, outs) = (kind.inputs(), kind.outputs());
            let members: Vec<usize> = (0..nodes.len()).filter(|&r| by[r] == Some(l)).collect();
            let input_span =
                |to: usize, e: &Edge| nodes[to].spans.value_span(&format!("inputs.{}", e.port));
            // The loop node's inputs: repeated ones from its members, the others from outside.
            for e in &edges[l] {
                let repeated = ins.iter().any(|s| s.name == e.port && s.repeated);
                let member = by[e.from] == Some(l);
                if repeated && !member {
                    self.diags.push(
                        bad(
                            format!(
                                "`{}.{}` takes a new value from each run of the nodes `{}` repeats, \
                                 but `{}` is not in its `repeat` list",
                                node.name, e.port, node.name, nodes[e.from].name
                            ),
                            input_span(l, e),
                        )
                        .with_help(format!(
                            "add `{}` (and the nodes it needs) to `{}`'s `repeat`",
                            nodes[e.from].name, node.name
                        )),
                    );
                } else if !repeated && member {
                    self.diags.push(bad(
                        format!(
                            "`{}.{}` is read once per step, but `{}` is a node `{}` repeats; only \
                             its repeated inputs ({}) may come from those",
                            node.name,
                            e.port,
                            nodes[e.from].name,
                            node.name,
                            ins.iter()
                                .filter(|s| s.repeated)
                                .map(|s| s.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        input_span(l, e),
                    ));
                }
            }
            // Arguments go to members only; members read no other output of the loop node.
            for (to, es) in edges.iter().enumerate() {
                for e in es.iter().filter(|e| e.from == l) {
                    let argument = outs.iter().any(|s| s.name == e.from_port && s.argument);
                    if argument && by[to] != Some(l) {
                        self.diags.push(bad(
                            format!(
                                "`{}.{}` is handed only to the nodes `{}` repeats, and `{}` is not one of them",
                                node.name, e.from_port, node.name, nodes[to].name
                            ),
                            input_span(to, e),
                        ));
                    } else if !argument && by[to] == Some(l) {
                        self.diags.push(bad(
                            format!(
                                "`{}` is repeated by `{}` and reads `{}.{}`, which exists only after `{}` has finished",
                                nodes[to].name, node.name, node.name, e.from_port, node.name
                            ),
                            input_span(to, e),
                        ));
                    }
                }
            }
            if members.is_empty() {
                continue;
            }
            // Which members (and which of their outputs) lead into the loop node.
            let mut on_path: Vec<(usize, String)> = edges[l]
                .iter()
                .filter(|e| by[e.from] == Some(l))
                .map(|e| (e.from, e.from_port.clone()))
                .collect();
            let mut grew = true;
            while grew {
                grew = false;
                for &m in &members {
                    if !on_path.iter().any(|(n, _)| *n == m) {
                        continue;
                    }
                    for e in edges[m].iter().filter(|e| by[e.from] == Some(l)) {
                        let key = (e.from, e.from_port.clone());
                        if !on_path.contains(&key) {
                            on_path.push(key);
                            grew = true;
                        }
                    }
                }
            }
            for &m in &members {
                if !on_path.iter().any(|(n, _)| *n == m) {
                    let span = node
                        .repeat
                        .iter()
                        .find(|(name, _)| *name == nodes[m].name)
                        .map_or(node.spans.value_span("repeat"), |(_, s)| *s);
                    self.diags.push(bad(
                        format!(
                            "`repeat` lists `{}`, which feeds none of `{}`'s repeated inputs",
                            nodes[m].name, node.name
                        ),
                        span,
                    ));
                }
            }
            let loop_outputs: Vec<String> = outs
                .iter()
                .filter(|s| !s.argument)
                .map(|s| format!("`{}.{}`", node.name, s.name))
                .collect();
            for (to, es) in edges.iter().enumerate() {
                if to == l || by[to] == Some(l) {
                    continue;
                }
                for e in es {
                    if by[e.from] == Some(l) && on_path.contains(&(e.from, e.from_port.clone())) {
                        let help = if loop_outputs.is_empty() {
                            format!("`{}` has no outputs to read instead", node.name)
                        } else {
                            format!(
                                "read it through `{}`: {}",
                                node.name,
                                loop_outputs.join(", ")
                            )
                        };
                        self.diags.push(
                            bad(
                                format!(
                                    "`{}.{}` reads `{}.{}`, which `{}` repeats on its way into \
                                     `{}`; it would see only the last run",
                                    nodes[to].name,
                                    e.port,
                                    nodes[e.from].name,
                                    e.from_port,
                                    node.name,
                                    node.name
                                ),
                                input_span(to, e),
                            )
                            .with_help(help),
                        );
                    }
                }
            }
        }
        by
    }

    /// Returns a topological order, or `None` (with diagnostics) when there is a cycle.
    fn check_cycles(
        &mut self,
        nodes: &[NodeDraft<'_>],
        edges: &[Vec<Edge>],
        repeated_by: &[Option<usize>],
        deps: &[Vec<usize>],
    ) -> Option<Vec<usize>> {
        // The order follows the step's dependencies (a repeated node's value exists once its
        // loop node is done); a loop node's arguments to its repeated nodes are no edge.
        let mut g = DiGraph::<usize, ()>::new();
        let ix: Vec<_> = (0..nodes.len()).map(|i| g.add_node(i)).collect();
        for (to, d) in deps.iter().enumerate() {
            for &from in d {
                g.add_edge(ix[from], ix[to], ());
            }
        }
        if let Ok(order) = petgraph::algo::toposort(&g, None) {
            return Some(order.into_iter().map(|i| g[i]).collect());
        }
        let edges: Vec<Vec<Edge>> = edges
            .iter()
            .enumerate()
            .map(|(to, es)| {
                es.iter()
                    .filter(|e| repeated_by[to] != Some(e.from))
                    .cloned()
                    .collect()
            })
            .collect();
        let edges = &edges[..];
        let mut g = DiGraph::<usize, ()>::new();
        let ix: Vec<_> = (0..nodes.len()).map(|i| g.add_node(i)).collect();
        for (to, es) in edges.iter().enumerate() {
            for e in es {
                g.add_edge(ix[e.from], ix[to], ());
            }
        }
        let mut reported = false;
        for scc in petgraph::algo::tarjan_scc(&g) {
            let members: Vec<usize> = scc.iter().map(|&i| g[i]).collect();
            let self_loop =
                members.len() == 1 && edges[members[0]].iter().any(|e| e.from == members[0]);
            if members.len() < 2 && !self_loop {
                continue;
            }
            // Start at the member defined first in the file and walk edges inside the SCC back to it.
            let start = *members
                .iter()
                .min_by_key(|&&m| nodes[m].spans.header.start)
                .expect("non-empty");
            let chain = find_cycle(start, &members, edges);
            let names: Vec<&str> = chain.iter().map(|&i| nodes[i].name.as_str()).collect();
            let mut text = names.join(" → ");
            text.push_str(&format!(" → {}", names[0]));
            // Each step of the chain: the input of chain[k+1] (or chain[0]) wired from chain[k].
            let mut d = Diagnostic::error(Code::Cycle, format!("cycle in the graph: {text}"));
            for k in 0..chain.len() {
                let (from, to) = (chain[k], chain[(k + 1) % chain.len()]);
                if let Some(e) = edges[to].iter().find(|e| e.from == from) {
                    let span = nodes[to].spans.value_span(&format!("inputs.{}", e.port));
                    let note = format!(
                        "`{}.{}` takes `{}.{}`",
                        nodes[to].name, e.port, nodes[from].name, e.from_port
                    );
                    if d.span.is_none() {
                        d = d.at(span).with_label(note);
                    } else {
                        d = d.with_note(span, note);
                    }
                }
            }
            self.diags.push(d.with_help(
                "one step of a graph must be acyclic; state carried from one step to the next \
                 belongs in a node's state or a resource",
            ));
            reported = true;
        }
        if !reported {
            // The edges are acyclic; the cycle goes through a loop node's repeat.
            self.diags.push(
                Diagnostic::error(
                    Code::Cycle,
                    "cycle in the graph through a `repeat`: a repeated node's values exist only \
                     once its loop node has finished, so nothing its loop node waits for may read \
                     them",
                )
                .at(nodes
                    .iter()
                    .find(|n| !n.repeat.is_empty())
                    .map_or(Span::default(), |n| n.spans.value_span("repeat"))),
            );
        }
        None
    }
}

/// A cycle through `start` using only `members` (which form a strongly connected component).
fn find_cycle(start: usize, members: &[usize], edges: &[Vec<Edge>]) -> Vec<usize> {
    // successors within the SCC: `to` is a successor of `from` when `to` has an input from `from`.
    let succ = |from: usize| -> Vec<usize> {
        let mut s: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&to| edges[to].iter().any(|e| e.from == from))
            .collect();
        s.sort();
        s
    };
    // BFS for the shortest path start → ... → start.
    let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(cur) = queue.pop_front() {
        for nxt in succ(cur) {
            if nxt == start {
                let mut path = vec![cur];
                let mut at = cur;
                while at != start {
                    at = prev[&at];
                    path.push(at);
                }
                path.reverse();
                path.dedup();
                return path;
            }
            if let std::collections::btree_map::Entry::Vacant(v) = prev.entry(nxt) {
                v.insert(cur);
                queue.push_back(nxt);
            }
        }
    }
    vec![start]
}

fn wrong_type(v: &SValue, expected: &ParamType, key: &str) -> Diagnostic {
    Diagnostic::error(
        Code::WrongType,
        format!(
            "`{key}` must be {}, found {}",
            expected_text(expected),
            with_article(v.kind.type_name())
        ),
    )
    .at(v.span)
}

fn expected_text(t: &ParamType) -> String {
    match t {
        ParamType::Int => "an integer".into(),
        ParamType::Float => "a number".into(),
        ParamType::Bool => "a boolean (true or false)".into(),
        ParamType::String | ParamType::Enum(_) => "a string".into(),
        ParamType::Path => "a path (string)".into(),
        ParamType::Array(e) => format!("an array of {e}"),
        ParamType::Table(_) => "a table".into(),
        ParamType::Resource(k) => format!("the name of a {k} resource (string)"),
        ParamType::Any => "a value".into(),
    }
}

/// Checks a table against a schema; returns the values (defaults filled) as JSON.
#[allow(clippy::too_many_arguments)]
fn check_params(
    table: &STable,
    specs: &[ParamSpec],
    reserved: &[&str],
    what: &str,
    prefix: &str,
    spans: &mut SpanIndex,
    refs: &mut Vec<ResourceRef>,
    diags: &mut Vec<Diagnostic>,
) -> serde_json::Map<String, Json> {
    let mut map = serde_json::Map::new();
    for e in &table.entries {
        if prefix.is_empty() && reserved.contains(&e.key.as_str()) {
            continue;
        }
        let path = format!("{prefix}{}", e.key);
        spans.keys.insert(path.clone(), e.key_span);
        spans.values.insert(path.clone(), e.value.span);
        let Some(spec) = specs.iter().find(|s| s.name == e.key) else {
            let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            if prefix.is_empty() {
                names.extend(reserved.iter().copied());
            }
            let help = did_you_mean(&e.key, names.iter().copied()).unwrap_or_else(|| {
                if names.is_empty() {
                    format!("{what} takes no parameters")
                } else {
                    format!("known keys: {}", names.join(", "))
                }
            });
            diags.push(
                Diagnostic::error(Code::UnknownKey, format!("unknown key `{path}` in {what}"))
                    .at(e.key_span)
                    .with_help(help),
            );
            continue;
        };
        if let Some(v) = check_value(&e.value, spec, &path, what, spans, refs, diags) {
            map.insert(e.key.clone(), v);
        }
    }
    for spec in specs {
        if map.contains_key(&spec.name) || table.get(&spec.name).is_some() {
            continue;
        }
        if let Some(d) = &spec.default {
            map.insert(spec.name.clone(), d.clone());
        } else if let ParamType::Table(fields) = &spec.ty
            && !spec.required
            && !spec.switch
            && fields.iter().any(|f| f.default.is_some())
        {
            // An absent table whose fields have defaults gets those defaults.
            let sub = check_params(
                &STable::default(),
                fields,
                &[],
                what,
                &format!("{prefix}{}.", spec.name),
                spans,
                refs,
                diags,
            );
            map.insert(spec.name.clone(), Json::Object(sub));
        } else if spec.required {
            // A misspelling of this key was already reported as an unknown key with a
            // did-you-mean; reporting the key as missing too would say the same thing twice.
            let misspelled = table.entries.iter().any(|e| {
                !specs.iter().any(|s| s.name == e.key)
                    && did_you_mean(&e.key, specs.iter().map(|s| s.name.as_str()))
                        .is_some_and(|h| h.contains(&format!("`{}`", spec.name)))
            });
            if misspelled {
                continue;
            }
            let path = format!("{prefix}{}", spec.name);
            let mut help = format!("add `{} = ...`", spec.name);
            if !spec.doc.is_empty() {
                help.push_str(&format!(" ({}: {})", expected_text(&spec.ty), spec.doc));
            }
            diags.push(
                Diagnostic::error(
                    Code::MissingParam,
                    format!("{what} is missing required parameter `{path}`"),
                )
                .at(spans.header)
                .with_help(help),
            );
        }
    }
    map
}

fn check_value(
    v: &SValue,
    spec: &ParamSpec,
    path: &str,
    what: &str,
    spans: &mut SpanIndex,
    refs: &mut Vec<ResourceRef>,
    diags: &mut Vec<Diagnostic>,
) -> Option<Json> {
    check_typed(v, &spec.ty, spec, path, what, spans, refs, diags)
}

#[allow(clippy::too_many_arguments)]
fn check_typed(
    v: &SValue,
    ty: &ParamType,
    spec: &ParamSpec,
    path: &str,
    what: &str,
    spans: &mut SpanIndex,
    refs: &mut Vec<ResourceRef>,
    diags: &mut Vec<Diagnostic>,
) -> Option<Json> {
    let range = |x: f64, diags: &mut Vec<Diagnostic>| -> bool {
        if spec.in_range(x) {
            return true;
        }
        let r = spec.range_text().unwrap_or_default();
        let shown = match &v.kind {
            SKind::Integer(i) => i.to_string(),
            _ => x.to_string(),
        };
        diags.push(
            Diagnostic::error(
                Code::OutOfRange,
                format!("`{path}` must be {r}, got {shown}"),
            )
            .at(v.span)
            .with_help(if spec.doc.is_empty() {
                format!("`{}`: {ty}, {r}", spec.name)
            } else {
                format!("`{}`: {}", spec.name, spec.doc)
            }),
        );
        false
    };
    match (ty, &v.kind) {
        (ParamType::Any, _) => Some(v.to_json()),
        (ParamType::Int, SKind::Integer(i)) => range(*i as f64, diags).then(|| Json::from(*i)),
        (ParamType::Float, SKind::Integer(i)) => {
            range(*i as f64, diags).then(|| Json::from(*i as f64))
        }
        (ParamType::Float, SKind::Float(f)) => {
            if !f.is_finite() {
                diags.push(
                    Diagnostic::error(
                        Code::InvalidValue,
                        format!("`{path}` must be finite, got {f}"),
                    )
                    .at(v.span),
                );
                return None;
            }
            range(*f, diags).then(|| Json::from(*f))
        }
        (ParamType::Bool, SKind::Boolean(b)) => Some(Json::Bool(*b)),
        (ParamType::String | ParamType::Path, SKind::String(s)) => Some(Json::String(s.clone())),
        (ParamType::Enum(variants), SKind::String(s)) => {
            if variants.iter().any(|x| x == s) {
                return Some(Json::String(s.clone()));
            }
            let help = did_you_mean(s, variants.iter().map(String::as_str)).unwrap_or_else(|| {
                let q: Vec<String> = variants.iter().map(|x| format!("\"{x}\"")).collect();
                format!("allowed: {}", q.join(", "))
            });
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    format!("`{path}` cannot be \"{s}\" in {what}"),
                )
                .at(v.span)
                .with_help(help),
            );
            None
        }
        (ParamType::Resource(kind), SKind::String(s)) => {
            refs.push(ResourceRef {
                path: path.to_string(),
                kind: kind.clone(),
                name: s.clone(),
                span: v.span,
            });
            Some(Json::String(s.clone()))
        }
        (ParamType::Array(elem), SKind::Array(items)) => {
            let mut out = Vec::new();
            let mut ok = true;
            for (k, item) in items.iter().enumerate() {
                let p = format!("{path}[{k}]");
                match check_typed(item, elem, spec, &p, what, spans, refs, diags) {
                    Some(j) => out.push(j),
                    None => ok = false,
                }
            }
            ok.then_some(Json::Array(out))
        }
        (ParamType::Table(fields), SKind::Table(t)) => {
            let sub = check_params(
                t,
                fields,
                &[],
                what,
                &format!("{path}."),
                spans,
                refs,
                diags,
            );
            Some(Json::Object(sub))
        }
        _ => {
            diags.push(wrong_type(v, ty, path).with_help(if spec.doc.is_empty() {
                format!("`{}`: {ty}", spec.name)
            } else {
                format!("`{}`: {ty} — {}", spec.name, spec.doc)
            }));
            None
        }
    }
}
