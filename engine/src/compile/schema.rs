//! The schema check that the shape stage runs on every table it reads (`[run]`, each resource,
//! each node): the table's keys against a list of [`ParamSpec`]s.
//!
//! It reports unknown keys (with a did-you-mean), missing required keys, values of the wrong
//! type, numbers out of range and strings that are no variant of an enum; it fills in defaults
//! and records the span of every key and value and every resource a parameter names (resolved by
//! the resource stage). It does not know what the table is for: the caller names the subject
//! (`what`) and says which keys belong to the engine (`reserved`).

use crate::diagnostic::{Code, Diagnostic, Span, did_you_mean};
use crate::graph::SpanIndex;
use crate::params::{ParamSpec, ParamType, Params};
use crate::spec::{SEntry, SKind, STable, SValue};
use serde_json::Value as Json;

use super::diagnostics::expected_text;

/// A resource named by a resource-typed parameter: (param path, resource kind, name, span).
#[derive(Clone)]
pub(super) struct ResourceRef {
    pub path: String,
    pub kind: String,
    pub name: String,
    pub span: Span,
}

/// The table in entry `e`, or an error naming `what` with `help` (`None`).
pub(super) fn table_of<'a>(
    e: &'a SEntry,
    what: &str,
    help: &str,
    diags: &mut Vec<Diagnostic>,
) -> Option<&'a STable> {
    match &e.value.kind {
        SKind::Table(t) => Some(t),
        _ => {
            diags.push(Diagnostic::not_a_table(what, &e.value, help));
            None
        }
    }
}

/// Checks the tables of one subject (a node, a resource, `[run]`) against their schemas.
pub(super) struct SchemaChecker<'a> {
    /// The subject as diagnostics name it: "node `x` (kind `y`)", "the `[run]` section".
    what: &'a str,
    /// Where each key and value of the subject is; the check adds the ones it reads.
    spans: &'a mut SpanIndex,
    refs: Vec<ResourceRef>,
    diags: &'a mut Vec<Diagnostic>,
}

impl<'a> SchemaChecker<'a> {
    pub fn new(what: &'a str, spans: &'a mut SpanIndex, diags: &'a mut Vec<Diagnostic>) -> Self {
        SchemaChecker {
            what,
            spans,
            refs: Vec::new(),
            diags,
        }
    }

    /// Checks `table` against `specs`, skipping the engine's `reserved` keys; returns the values
    /// (defaults filled) and the resources they name.
    pub fn check(
        mut self,
        table: &STable,
        specs: &[ParamSpec],
        reserved: &[&str],
    ) -> (Params, Vec<ResourceRef>) {
        let map = self.params(table, specs, reserved, "");
        (Params::from_map(map), self.refs)
    }

    /// The keys of a table (or of a sub-table at `prefix`, such as `kl.`) as JSON.
    fn params(
        &mut self,
        table: &STable,
        specs: &[ParamSpec],
        reserved: &[&str],
        prefix: &str,
    ) -> serde_json::Map<String, Json> {
        let what = self.what;
        let mut map = serde_json::Map::new();
        for e in &table.entries {
            if prefix.is_empty() && reserved.contains(&e.key.as_str()) {
                continue;
            }
            let path = format!("{prefix}{}", e.key);
            self.spans.keys.insert(path.clone(), e.key_span);
            self.spans.values.insert(path.clone(), e.value.span);
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
                self.diags
                    .push(Diagnostic::unknown_key(&path, what, e.key_span, help));
                continue;
            };
            if let Some(v) = self.value(&e.value, &spec.ty, spec, &path) {
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
                let prefix = format!("{prefix}{}.", spec.name);
                let sub = self.params(&STable::default(), fields, &[], &prefix);
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
                self.diags.push(Diagnostic::missing_param(
                    what,
                    &path,
                    self.spans.header,
                    help,
                ));
            }
        }
        map
    }

    /// One value of type `ty` (the parameter's type, or its element type inside an array) of
    /// parameter `spec`, at `path`.
    fn value(&mut self, v: &SValue, ty: &ParamType, spec: &ParamSpec, path: &str) -> Option<Json> {
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
            (ParamType::Int, SKind::Integer(i)) => {
                range(*i as f64, self.diags).then(|| Json::from(*i))
            }
            (ParamType::Float, SKind::Integer(i)) => {
                range(*i as f64, self.diags).then(|| Json::from(*i as f64))
            }
            (ParamType::Float, SKind::Float(f)) => {
                if !f.is_finite() {
                    self.diags.push(Diagnostic::invalid_value(
                        format!("`{path}` must be finite, got {f}"),
                        v.span,
                    ));
                    return None;
                }
                range(*f, self.diags).then(|| Json::from(*f))
            }
            (ParamType::Bool, SKind::Boolean(b)) => Some(Json::Bool(*b)),
            (ParamType::String | ParamType::Path, SKind::String(s)) => {
                Some(Json::String(s.clone()))
            }
            (ParamType::Enum(variants), SKind::String(s)) => {
                if variants.iter().any(|x| x == s) {
                    return Some(Json::String(s.clone()));
                }
                let help =
                    did_you_mean(s, variants.iter().map(String::as_str)).unwrap_or_else(|| {
                        let q: Vec<String> = variants.iter().map(|x| format!("\"{x}\"")).collect();
                        format!("allowed: {}", q.join(", "))
                    });
                self.diags.push(
                    Diagnostic::invalid_value(
                        format!("`{path}` cannot be \"{s}\" in {}", self.what),
                        v.span,
                    )
                    .with_help(help),
                );
                None
            }
            (ParamType::Resource(kind), SKind::String(s)) => {
                self.refs.push(ResourceRef {
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
                    match self.value(item, elem, spec, &format!("{path}[{k}]")) {
                        Some(j) => out.push(j),
                        None => ok = false,
                    }
                }
                ok.then_some(Json::Array(out))
            }
            (ParamType::Table(fields), SKind::Table(t)) => {
                let sub = self.params(t, fields, &[], &format!("{path}."));
                Some(Json::Object(sub))
            }
            _ => {
                self.diags
                    .push(
                        Diagnostic::wrong_type(v, ty, path).with_help(if spec.doc.is_empty() {
                            format!("`{}`: {ty}", spec.name)
                        } else {
                            format!("`{}`: {ty} — {}", spec.name, spec.doc)
                        }),
                    );
                None
            }
        }
    }
}
