//! Stage 1, syntax: the graph file parsed into a spanned document ([`crate::spec`]), then each
//! override applied to it in order.
//!
//! A syntax error in the file stops the compilation (no later stage has a document to read); an
//! override that cannot be applied is an error that points at the override, and the stages after
//! this one still run. What the keys mean is not checked here.

use crate::diagnostic::{Code, Diagnostic, SourceId, SourceMap};
use crate::spec::{self, SEntry, SKind, STable};

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

    /// The `--device` command-line argument (`run.device=...`); it replaces the graph's
    /// `[run] devices`, with a warning that says so.
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

/// The document the later stages read.
pub(super) struct Parsed {
    pub doc: STable,
}

/// Parses `text` (source `file`) and applies `overrides`, each added to `sources`; `None` when
/// the file itself is not valid TOML.
pub(super) fn parse(
    text: &str,
    file: SourceId,
    overrides: &[Override],
    sources: &mut SourceMap,
    diags: &mut Vec<Diagnostic>,
) -> Option<Parsed> {
    let mut doc = match spec::parse(text, file) {
        Ok(doc) => doc,
        Err(d) => {
            diags.extend(d);
            return None;
        }
    };
    for o in overrides {
        let id = sources.add(o.origin.clone(), o.text.clone());
        // `--device` places the whole run: it replaces a list the graph gives.
        let replaced = (o.origin == DEVICE_ARG)
            .then(|| take_run_entry(&mut doc, "devices"))
            .flatten();
        if let Err(d) = spec::apply_override(&mut doc, &o.text, id) {
            diags.push(d);
            continue;
        }
        if let Some(list) = replaced
            && let Some(run) = doc.get("run").and_then(|r| r.value.as_table())
            && let Some(device) = run.get("device")
        {
            diags.push(
                Diagnostic::warning(
                    Code::DeviceConflict,
                    format!(
                        "`--device {}` replaces the graph's `[run] devices`",
                        device.value.as_str().unwrap_or("?")
                    ),
                )
                .at(device.value.span)
                .with_note(list.key_span, "`[run] devices` is set here"),
            );
        }
    }
    Some(Parsed { doc })
}

/// Removes `[run] KEY` from `doc`, returning it.
fn take_run_entry(doc: &mut STable, key: &str) -> Option<SEntry> {
    let run = doc.entries.iter_mut().find(|e| e.key == "run")?;
    let SKind::Table(table) = &mut run.value.kind else {
        return None;
    };
    let i = table.entries.iter().position(|e| e.key == key)?;
    Some(table.entries.remove(i))
}
