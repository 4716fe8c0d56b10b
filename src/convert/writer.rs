//! The converted graph as TOML text: a header that records the input and flowrl's version and
//! lists every verl key that does not appear in the graph (with why), then the sections, each
//! value followed by the verl key it came from.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use super::input::VerlConfig;
use super::mapping::{Conversion, NoteKind};

/// Renders `conv` (converted from `input`, read as `cfg`).
pub fn render(conv: &Conversion, cfg: &VerlConfig, input: &Path) -> String {
    let mut out = String::new();
    let version = env!("CARGO_PKG_VERSION");
    let _ = writeln!(
        out,
        "# Converted from verl by `flowrl convert verl` (flowrl {version})."
    );
    let _ = writeln!(out, "# Input: {} ({})", input.display(), cfg.form);
    let _ = writeln!(out, "#");
    let _ = writeln!(out, "#   flowrl validate GRAPH    (then: flowrl run GRAPH)");
    let _ = writeln!(out, "#");
    let _ = writeln!(
        out,
        "# Each value below names the verl key it comes from; docs/from-verl.md maps every key."
    );

    let mut no_effect: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut not_carried = Vec::new();
    let mut unknown = Vec::new();
    for note in &conv.notes {
        let kv = if note.value.is_empty() {
            note.key.clone()
        } else {
            format!("{} = {}", note.key, note.value)
        };
        match &note.kind {
            NoteKind::NoEffect(why) => no_effect.entry(why).or_default().push(kv),
            NoteKind::NotCarried(why) => not_carried.push(format!("{kv}: {why}")),
            NoteKind::Unknown => unknown.push(kv),
        }
    }
    if !no_effect.is_empty() {
        let _ = writeln!(out, "#");
        let _ = writeln!(
            out,
            "# verl keys of the input with no meaning for this graph (known, not needed):"
        );
        for (why, keys) in &no_effect {
            let _ = writeln!(out, "#   {why}:");
            for k in keys {
                let _ = writeln!(out, "#     {k}");
            }
        }
    }
    if !not_carried.is_empty() {
        let _ = writeln!(out, "#");
        let _ = writeln!(
            out,
            "# NOT carried over (flowrl does not do what these ask):"
        );
        for line in &not_carried {
            let _ = writeln!(out, "#   {line}");
        }
    }
    if !unknown.is_empty() {
        let _ = writeln!(out, "#");
        let _ = writeln!(out, "# Unknown to this converter (not converted):");
        for k in &unknown {
            let _ = writeln!(out, "#   {k}");
        }
    }

    for s in &conv.sections {
        let _ = writeln!(out);
        let _ = writeln!(out, "[{}]", s.name);
        for c in &s.comment {
            let _ = writeln!(out, "# {c}");
        }
        for e in &s.entries {
            let line = format!("{} = {}", e.key, e.value);
            if e.from.is_empty() {
                let _ = writeln!(out, "{line}");
            } else {
                let _ = writeln!(out, "{line:<39} # {}", e.from);
            }
        }
    }
    out
}
