//! Stage 2, shape of the resource sections: each `[SECTION.NAME]` of a registered resource kind
//! (`[models.policy]`, say) against its kind's schema. Whether the resources that parameters name
//! exist is the resource stage's (`resource_refs.rs`).

use crate::device::DeviceRequest;
use crate::diagnostic::{Diagnostic, Span};
use crate::graph::SpanIndex;
use crate::params::Params;
use crate::registry::Registry;
use crate::resource::ResourceKind;
use crate::spec::STable;
use std::sync::Arc;

use super::schema::{ResourceRef, SchemaChecker, table_of};

/// The keys of a resource section that the engine reads, not the kind: `device`.
pub const RESOURCE_KEYS: &[&str] = &["device"];

/// A resource after the shape stage.
pub(super) struct ResourceDraft {
    pub name: String,
    pub kind: Arc<dyn ResourceKind>,
    pub params: Params,
    pub spans: SpanIndex,
    /// The other resources its parameters name.
    pub refs: Vec<ResourceRef>,
    /// `device = "..."` as written, with its value's span.
    pub device: Option<(DeviceRequest, Span)>,
}

/// Every resource declared in `doc`, in file order.
pub(super) fn check(
    registry: &Registry,
    doc: &STable,
    diags: &mut Vec<Diagnostic>,
) -> Vec<ResourceDraft> {
    let mut out = Vec::new();
    for section in &doc.entries {
        let Some(kind) = registry.resource_kind_for_section(&section.key).cloned() else {
            continue;
        };
        let Some(table) = table_of(
            section,
            &format!("`{}`", section.key),
            &format!(
                "declare each resource as a section: `[{}.NAME]`",
                section.key
            ),
            diags,
        ) else {
            continue;
        };
        for e in &table.entries {
            let what = format!("`[{}.{}]`", section.key, e.key);
            let help = format!("write it as a section: `[{}.{}]`", section.key, e.key);
            let Some(t) = table_of(e, &what, &help, diags) else {
                continue;
            };
            let mut spans = SpanIndex {
                header: e.key_span,
                ..Default::default()
            };
            let desc = format!("{} ({} resource)", what, kind.name());
            let device = super::nodes::device(t, &what, &mut spans, diags);
            let (params, refs) = SchemaChecker::new(&desc, &mut spans, diags).check(
                t,
                &kind.params(),
                RESOURCE_KEYS,
            );
            out.push(ResourceDraft {
                name: e.key.clone(),
                kind: kind.clone(),
                params,
                spans,
                refs,
                device,
            });
        }
    }
    out
}
