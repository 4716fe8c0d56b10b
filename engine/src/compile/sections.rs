//! Stage 2, shape of the document: its top-level sections are `[run]`, `[nodes.*]` and the
//! sections of the registered resource kinds, and it has nodes. What is inside each section is
//! checked by the other shape checks.

use crate::diagnostic::{Code, Diagnostic, SourceId, Span, did_you_mean};
use crate::registry::{NO_BUILTIN_HELP, Registry};
use crate::spec::STable;

/// Reports unknown sections (with a did-you-mean) and a graph without nodes.
pub(super) fn check(
    registry: &Registry,
    doc: &STable,
    file: SourceId,
    diags: &mut Vec<Diagnostic>,
) {
    let mut known = vec!["run".to_string(), "nodes".to_string()];
    known.extend(registry.resource_kinds().map(|k| k.section().to_string()));
    for e in &doc.entries {
        if known.contains(&e.key) {
            continue;
        }
        let mut d = Diagnostic::error(Code::UnknownSection, format!("unknown section `{}`", e.key))
            .at(e.key_span);
        d = match did_you_mean(&e.key, known.iter().map(String::as_str)) {
            _ if registry.lacks_builtin() => d.with_help(NO_BUILTIN_HELP),
            Some(h) => d.with_help(h),
            None => d.with_help(format!("sections are: {}", known.join(", "))),
        };
        diags.push(d);
    }
    if doc.get("nodes").is_none() {
        diags.push(
            Diagnostic::error(Code::MissingParam, "the graph has no `[nodes.*]` section")
                .at(Span::new(file, 0, 0))
                .with_help("declare nodes as `[nodes.NAME]` tables with `kind = \"...\"`"),
        );
    }
}
