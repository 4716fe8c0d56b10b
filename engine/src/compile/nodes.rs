//! Stage 2, shape of the node tables: each `[nodes.NAME]` gets its kind (a registered kind, or
//! did-you-mean), the engine's keys (`kind`, `inputs`, `device`, `timing`, `repeat`) read as
//! written, and the rest checked against the kind's schema.
//!
//! What the engine keys name is checked by later stages: `device` by placement, `inputs` by
//! wiring, `repeat` by the repeat stage.

use crate::device::DeviceRequest;
use crate::diagnostic::{Code, Diagnostic, Span, did_you_mean};
use crate::graph::SpanIndex;
use crate::node::{NodeKind, NodeTable};
use crate::params::{ParamType, Params};
use crate::registry::{NO_BUILTIN_HELP, Registry};
use crate::spec::{SEntry, SKind, STable};
use std::sync::Arc;

use super::schema::{ResourceRef, SchemaChecker, table_of};

/// Keys of a node table that belong to the engine, not to the kind's parameters.
pub const NODE_KEYS: &[&str] = &["kind", "inputs", "device", "timing", "repeat"];

/// A node after the shape stage.
pub(super) struct NodeDraft<'d> {
    pub name: String,
    /// `None` after an error (an unknown kind, say): later stages skip what needs it.
    pub kind: Option<Arc<dyn NodeKind>>,
    pub params: Params,
    pub inputs: Option<&'d SEntry>,
    /// `device = "..."` as written, with its value's span.
    pub device: Option<(DeviceRequest, Span)>,
    pub timing_key: String,
    /// `repeat = [...]` as written: node names with their spans.
    pub repeat: Vec<(String, Span)>,
    pub spans: SpanIndex,
    /// The resources its parameters name.
    pub refs: Vec<ResourceRef>,
}

/// Every node of `doc`, in file order.
pub(super) fn check<'d>(
    registry: &Registry,
    doc: &'d STable,
    diags: &mut Vec<Diagnostic>,
) -> Vec<NodeDraft<'d>> {
    let mut out = Vec::new();
    let Some(section) = doc.get("nodes") else {
        return out;
    };
    let Some(table) = table_of(
        section,
        "`nodes`",
        "declare each node as a section: `[nodes.NAME]`",
        diags,
    ) else {
        return out;
    };
    // The nodes that name a kind: what a kind-less node (a typo in `--set nodes.NAME.…`) most
    // likely meant.
    let named: Vec<&str> = table
        .entries
        .iter()
        .filter(|o| o.value.as_table().is_some_and(|t| t.get("kind").is_some()))
        .map(|o| o.key.as_str())
        .collect();
    for e in &table.entries {
        let what = format!("node `{}`", e.key);
        let help = format!("write it as a section: `[nodes.{}]`", e.key);
        let Some(t) = table_of(e, &what, &help, diags) else {
            continue;
        };
        let mut spans = SpanIndex {
            header: e.key_span,
            ..Default::default()
        };
        let kind = kind(registry, e, t, &named, &mut spans, diags);
        let device = device(t, &what, &mut spans, diags);
        let timing_key = match t.get("timing") {
            Some(tk) => match tk.value.as_str() {
                Some(s) => s.to_string(),
                None => {
                    diags.push(Diagnostic::wrong_type(
                        &tk.value,
                        &ParamType::String,
                        "timing",
                    ));
                    e.key.clone()
                }
            },
            None => kind
                .as_ref()
                .and_then(|k| k.timing_key().map(str::to_string))
                .unwrap_or_else(|| e.key.clone()),
        };
        let repeat = repeat_list(t, &mut spans, diags);
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
        let (params, refs) = match &kind {
            Some(kind) => params(kind.as_ref(), t, &what, &mut spans, diags),
            None => (Params::from_map(serde_json::Map::new()), Vec::new()),
        };
        out.push(NodeDraft {
            name: e.key.clone(),
            kind,
            params,
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

/// The node's kind: registered under `kind = "..."`, then specialized by the kind from the
/// node's table (ports and parameters per node).
fn kind(
    registry: &Registry,
    e: &SEntry,
    t: &STable,
    named: &[&str],
    spans: &mut SpanIndex,
    diags: &mut Vec<Diagnostic>,
) -> Option<Arc<dyn NodeKind>> {
    let Some(k) = t.get("kind") else {
        let help = match did_you_mean(&e.key, named.iter().copied()) {
            Some(h) => {
                format!("{h} (a node the graph declares); a new node needs `kind = \"...\"`")
            }
            None => "add `kind = \"...\"`; `flowrl nodes` lists the kinds".into(),
        };
        diags.push(
            Diagnostic::error(
                Code::MissingParam,
                format!("node `{}` has no `kind`", e.key),
            )
            .at(e.key_span)
            .with_help(help),
        );
        return None;
    };
    spans.values.insert("kind".into(), k.value.span);
    let Some(name) = k.value.as_str() else {
        diags.push(Diagnostic::wrong_type(&k.value, &ParamType::String, "kind"));
        return None;
    };
    let Some(kind) = registry.kind(name) else {
        let names: Vec<&str> = registry.kinds().map(|k| k.name()).collect();
        let help = match did_you_mean(name, names.iter().copied()) {
            _ if registry.lacks_builtin() => NO_BUILTIN_HELP.into(),
            Some(h) => h,
            None => "`flowrl nodes` lists the kinds registered in this binary; a kind defined in \
                     a plugin crate runs with that plugin's binary (docs/plugins.md)"
                .into(),
        };
        diags.push(
            Diagnostic::error(Code::UnknownKind, format!("unknown node kind `{name}`"))
                .at(k.value.span)
                .with_label("not a registered node kind")
                .with_help(help),
        );
        return None;
    };
    let kind = kind.clone();
    match kind.instantiate(&NodeTable {
        name: &e.key,
        table: t,
        header: e.key_span,
    }) {
        Ok(special) => Some(special.unwrap_or(kind)),
        Err(d) => {
            diags.extend(d);
            None
        }
    }
}

/// `device = "..."` of a node's or a resource's table as written (a device string other than
/// `auto`).
pub(super) fn device(
    t: &STable,
    what: &str,
    spans: &mut SpanIndex,
    diags: &mut Vec<Diagnostic>,
) -> Option<(DeviceRequest, Span)> {
    let d = t.get("device")?;
    spans.values.insert("device".into(), d.value.span);
    match d.value.as_str().map(str::parse::<DeviceRequest>) {
        Some(Ok(DeviceRequest::Auto)) => {
            diags.push(
                Diagnostic::invalid_value(
                    format!("{what} cannot be placed on `auto`"),
                    d.value.span,
                )
                .with_help(
                    "`device` pins it to one of the run's devices (`cpu:N`, `cuda:N`); \
                     without it, it is placed on the run's devices",
                ),
            );
            None
        }
        Some(Ok(r)) => Some((r, d.value.span)),
        Some(Err(msg)) => {
            diags.push(Diagnostic::invalid_value(msg, d.value.span));
            None
        }
        None => {
            diags.push(Diagnostic::wrong_type(
                &d.value,
                &ParamType::String,
                "device",
            ));
            None
        }
    }
}

/// `repeat = [...]` as written: the names listed, with their spans.
fn repeat_list(
    t: &STable,
    spans: &mut SpanIndex,
    diags: &mut Vec<Diagnostic>,
) -> Vec<(String, Span)> {
    let mut repeat = Vec::new();
    let Some(r) = t.get("repeat") else {
        return repeat;
    };
    spans.keys.insert("repeat".into(), r.key_span);
    spans.values.insert("repeat".into(), r.value.span);
    match &r.value.kind {
        SKind::Array(items) => {
            for item in items {
                match item.as_str() {
                    Some(name) => repeat.push((name.to_string(), item.span)),
                    None => diags.push(Diagnostic::wrong_type(item, &ParamType::String, "repeat")),
                }
            }
        }
        _ => diags.push(
            Diagnostic::error(Code::WrongType, "`repeat` must be a list of node names")
                .at(r.value.span)
                .with_help("e.g. `repeat = [\"data\", \"rollout\", \"reward\"]`"),
        ),
    }
    repeat
}

/// The kind's parameters from the node's table: every key but the engine's.
fn params(
    kind: &dyn NodeKind,
    t: &STable,
    what: &str,
    spans: &mut SpanIndex,
    diags: &mut Vec<Diagnostic>,
) -> (Params, Vec<ResourceRef>) {
    // `devices` belongs to `[run]`; on a node it gets its own explanation rather than a
    // did-you-mean.
    let without_devices;
    let t = match t.get("devices") {
        Some(d) => {
            let help = if kind.data_parallel() {
                format!(
                    "kind `{}` is data-parallel: without `device` it runs one replica on each of `[run] devices`",
                    kind.name()
                )
            } else {
                format!(
                    "kind `{}` runs once per process: on the run's first device, or on the one its `device` names",
                    kind.name()
                )
            };
            diags.push(
                Diagnostic::error(
                    Code::UnknownKey,
                    format!("{what} cannot take `devices`; a node takes one `device`"),
                )
                .at(d.key_span)
                .with_help(help),
            );
            without_devices = without(t, "devices");
            &without_devices
        }
        None => t,
    };
    // `repeat` is an engine key of loop kinds only (the repeat stage explains it on the others).
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
        without_repeat = without(t, "repeat");
        &without_repeat
    };
    let desc = format!("{what} (kind `{}`)", kind.name());
    SchemaChecker::new(&desc, spans, diags).check(t, &kind.params(), &reserved)
}

/// `t` without its entry `key`.
fn without(t: &STable, key: &str) -> STable {
    STable {
        entries: t.entries.iter().filter(|e| e.key != key).cloned().collect(),
    }
}
