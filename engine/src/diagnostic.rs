//! Diagnostics: what the graph compiler (and node kinds' `validate` hooks) report about a graph.
//!
//! A [`Diagnostic`] has a severity, a stable [`Code`], a message, an optional primary [`Span`] with a
//! label, secondary notes with their own spans, and an optional help line. [`render`] prints them the
//! way rustc does: `file:line:col`, the source line, the span underlined, then `= help: ...`.
//! This module does not decide what is wrong with a graph; the compiler stages do (the diagnostics
//! they emit in several places have named constructors in `compile/diagnostics.rs`).

use std::fmt::Write as _;

/// Which text a [`Span`] points into: the graph file (id 0) or one `--set` override (ids 1..).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SourceId(pub u32);

/// A byte range in one source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Span {
    pub source: SourceId,
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(source: SourceId, start: usize, end: usize) -> Self {
        Span { source, start, end }
    }
}

/// One named text that spans point into.
#[derive(Clone, Debug)]
pub struct Source {
    /// What the user sees in `--> name:line:col` (a path, or `--set #1`).
    pub name: String,
    pub text: String,
}

/// All sources of one compilation, indexed by [`SourceId`].
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    pub sources: Vec<Source>,
}

impl SourceMap {
    pub fn add(&mut self, name: impl Into<String>, text: impl Into<String>) -> SourceId {
        self.sources.push(Source {
            name: name.into(),
            text: text.into(),
        });
        SourceId(self.sources.len() as u32 - 1)
    }

    pub fn get(&self, id: SourceId) -> Option<&Source> {
        self.sources.get(id.0 as usize)
    }

    /// 1-based (line, column) of a byte offset; the column counts characters.
    pub fn line_col(&self, span: Span) -> (usize, usize) {
        let Some(src) = self.get(span.source) else {
            return (1, 1);
        };
        let off = span.start.min(src.text.len());
        let before = &src.text[..floor_char_boundary(&src.text, off)];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, col)
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Error,
    Warning,
}

/// Stable diagnostic codes. The numbers never change meaning; new checks get new numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    /// The file is not valid TOML.
    Syntax,
    /// A top-level section the engine does not know.
    UnknownSection,
    /// A key that the node kind, resource kind or `[run]` does not declare.
    UnknownKey,
    /// A required parameter is absent.
    MissingParam,
    /// A value of the wrong TOML type.
    WrongType,
    /// A number outside its declared range.
    OutOfRange,
    /// A value of the right type that is still not allowed (unknown enum variant, bad device...).
    InvalidValue,
    /// `kind = "..."` names no registered node kind.
    UnknownKind,
    /// A resource reference names no declared resource of the expected kind.
    UnknownResource,
    /// An `inputs` key that is not an input port of the node's kind.
    UnknownPort,
    /// An input wired to a node that does not exist.
    UnknownNode,
    /// An input wired to a port the source node's kind does not produce.
    UnknownOutput,
    /// The source port's type differs from the input port's type.
    PortTypeMismatch,
    /// A required input port is not wired.
    MissingInput,
    /// An `inputs` value that is not of the form `"node.port"`.
    BadWiring,
    /// One step of the graph must be acyclic.
    Cycle,
    /// A `repeat` list that does not fit the graph (see `flowrl_engine::repeat`).
    BadRepeat,
    /// A constraint declared by a node or resource kind (`validate` hooks).
    Constraint,
    /// A `--set` argument that cannot be applied.
    BadOverride,
    /// A CUDA device this machine or build does not have (with the number of GPUs).
    DeviceUnavailable,
    /// A node's or resource's `device` that is not one of the run's devices.
    DeviceNotInRun,
    /// `[run] devices` that repeats a device, mixes CPU and CUDA, holds `auto` or is empty.
    BadDeviceList,
    /// `[run] device` and `[run] devices` both given (also `--device` against a list).
    DeviceConflict,
    /// A warning: a parameter set in the graph that the node's configuration ignores (e.g. an
    /// option the chosen loss does not read).
    IgnoredParam,
    /// A warning: a deprecated form that still works (e.g. an exec program speaking an older
    /// protocol version).
    Deprecated,
}

impl Code {
    /// The stable code printed as `error[E0102]`.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Syntax => "E0001",
            Code::UnknownSection => "E0101",
            Code::UnknownKey => "E0102",
            Code::MissingParam => "E0103",
            Code::WrongType => "E0104",
            Code::OutOfRange => "E0105",
            Code::InvalidValue => "E0106",
            Code::UnknownKind => "E0201",
            Code::UnknownResource => "E0202",
            Code::UnknownPort => "E0301",
            Code::UnknownNode => "E0302",
            Code::UnknownOutput => "E0303",
            Code::PortTypeMismatch => "E0304",
            Code::MissingInput => "E0305",
            Code::BadWiring => "E0306",
            Code::Cycle => "E0401",
            Code::BadRepeat => "E0402",
            Code::Constraint => "E0501",
            Code::BadOverride => "E0601",
            Code::DeviceUnavailable => "E0701",
            Code::DeviceNotInRun => "E0702",
            Code::BadDeviceList => "E0703",
            Code::DeviceConflict => "E0704",
            Code::IgnoredParam => "W0501",
            Code::Deprecated => "W0502",
        }
    }

    /// Every code with a one-line description (used by docs and `--help`).
    pub fn all() -> &'static [(Code, &'static str)] {
        &[
            (Code::Syntax, "the file is not valid TOML"),
            (Code::UnknownSection, "unknown top-level section"),
            (Code::UnknownKey, "unknown key"),
            (Code::MissingParam, "missing required parameter"),
            (Code::WrongType, "value of the wrong type"),
            (Code::OutOfRange, "number out of range"),
            (Code::InvalidValue, "value not allowed"),
            (Code::UnknownKind, "unknown node kind"),
            (Code::UnknownResource, "unknown resource"),
            (Code::UnknownPort, "unknown input port"),
            (Code::UnknownNode, "input wired to an unknown node"),
            (Code::UnknownOutput, "input wired to an unknown output port"),
            (Code::PortTypeMismatch, "port type mismatch"),
            (Code::MissingInput, "required input not wired"),
            (Code::BadWiring, "input not of the form \"node.port\""),
            (Code::Cycle, "cycle in one step of the graph"),
            (
                Code::BadRepeat,
                "a `repeat` list that does not fit the graph",
            ),
            (
                Code::Constraint,
                "constraint of a node or resource kind violated",
            ),
            (Code::BadOverride, "--set override cannot be applied"),
            (
                Code::DeviceUnavailable,
                "device not available on this machine or build",
            ),
            (
                Code::DeviceNotInRun,
                "node or resource placed outside the run's devices",
            ),
            (
                Code::BadDeviceList,
                "bad device list (duplicate, mixed cpu/cuda, auto)",
            ),
            (Code::DeviceConflict, "both `device` and `devices` given"),
            (
                Code::IgnoredParam,
                "a parameter the node's configuration ignores (warning)",
            ),
            (
                Code::Deprecated,
                "a deprecated form that still works (warning)",
            ),
        ]
    }
}

/// One problem found in a graph.
#[derive(Clone, Debug)]
pub struct Diagnostic {
    pub severity: Severity,
    pub code: Code,
    pub message: String,
    /// Where the problem is; `None` for problems without a place (rare).
    pub span: Option<Span>,
    /// Text printed under the underline.
    pub label: Option<String>,
    /// Secondary places, each printed as its own snippet with a note.
    pub notes: Vec<(Span, String)>,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(code: Code, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            span: None,
            label: None,
            notes: Vec::new(),
            help: None,
        }
    }

    pub fn warning(code: Code, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, message)
        }
    }

    pub fn at(mut self, span: Span) -> Self {
        self.span = Some(span);
        self
    }

    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    pub fn with_note(mut self, span: Span, note: impl Into<String>) -> Self {
        self.notes.push((span, note.into()));
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// `did you mean `x`?` for the closest candidate: the smallest edit distance (OSA: a transposition
/// counts as one edit) among the
/// candidates within max(1, len/3) edits or with Jaro-Winkler similarity ≥ 0.85 (ties: higher
/// Jaro-Winkler, then the earlier candidate).
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let max_edits = (word.chars().count() / 3).max(1);
    let mut best: Option<(usize, f64, &str)> = None;
    for c in candidates {
        let lev = strsim::osa_distance(word, c);
        let jw = strsim::jaro_winkler(word, c);
        if lev > max_edits && jw < 0.85 {
            continue;
        }
        let better = best.is_none_or(|(bl, bj, _)| lev < bl || (lev == bl && jw > bj));
        if better {
            best = Some((lev, jw, c));
        }
    }
    best.map(|(_, _, c)| format!("did you mean `{c}`?"))
}

/// Sorts diagnostics by source, then position, then code, so output is stable.
pub fn sort(diags: &mut [Diagnostic]) {
    diags.sort_by(|a, b| {
        let ka = a.span.map(|s| (s.source, s.start, s.end));
        let kb = b.span.map(|s| (s.source, s.start, s.end));
        ka.cmp(&kb)
            .then_with(|| a.code.as_str().cmp(b.code.as_str()))
            .then_with(|| a.message.cmp(&b.message))
    });
}

/// Renders diagnostics as text (no colours), rustc-style.
pub fn render(diags: &[Diagnostic], sources: &SourceMap) -> String {
    let mut out = String::new();
    for d in diags {
        render_one(&mut out, d, sources);
        out.push('\n');
    }
    let errors = diags.iter().filter(|d| d.is_error()).count();
    let warnings = diags.len() - errors;
    let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    match (errors, warnings) {
        (0, 0) => {}
        (0, w) => {
            let _ = writeln!(out, "{} emitted", plural(w, "warning"));
        }
        (e, 0) => {
            let _ = writeln!(out, "{} found", plural(e, "error"));
        }
        (e, w) => {
            let _ = writeln!(
                out,
                "{} and {} found",
                plural(e, "error"),
                plural(w, "warning")
            );
        }
    }
    out
}

fn render_one(out: &mut String, d: &Diagnostic, sources: &SourceMap) {
    let sev = match d.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    let _ = writeln!(out, "{sev}[{}]: {}", d.code.as_str(), d.message);
    let mut spans: Vec<(Span, Option<&str>)> = Vec::new();
    if let Some(span) = d.span {
        spans.push((span, d.label.as_deref()));
    }
    for (span, note) in &d.notes {
        spans.push((*span, Some(note.as_str())));
    }
    let width = spans
        .iter()
        .map(|(s, _)| sources.line_col(*s).0.to_string().len())
        .max()
        .unwrap_or(1);
    let pad = " ".repeat(width);
    for (i, (span, label)) in spans.iter().enumerate() {
        let Some(src) = sources.get(span.source) else {
            continue;
        };
        let (line, col) = sources.line_col(*span);
        let arrow = if i == 0 { "-->" } else { ":::" };
        let _ = writeln!(out, "{pad}{arrow} {}:{line}:{col}", src.name);
        let text = src.text.lines().nth(line - 1).unwrap_or("");
        let _ = writeln!(out, "{pad} |");
        let _ = writeln!(out, "{line:>width$} | {text}");
        // Underline: from the column to the span end, clipped to this line.
        let line_len = text.chars().count();
        let span_chars = src
            .text
            .get(
                floor_char_boundary(&src.text, span.start)
                    ..floor_char_boundary(&src.text, span.end.min(src.text.len())),
            )
            .map_or(1, |s| s.split('\n').next().unwrap_or("").chars().count());
        let len = span_chars
            .max(1)
            .min(line_len.saturating_sub(col - 1).max(1));
        let mark = if i == 0 { "^" } else { "-" };
        let _ = write!(out, "{pad} | {}{}", " ".repeat(col - 1), mark.repeat(len));
        match label {
            Some(l) => {
                let _ = writeln!(out, " {l}");
            }
            None => out.push('\n'),
        }
    }
    if let Some(help) = &d.help {
        if !spans.is_empty() {
            let _ = writeln!(out, "{pad} |");
        }
        let _ = writeln!(out, "{pad} = help: {help}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_line_column_and_underline() {
        let mut sm = SourceMap::default();
        let id = sm.add("g.toml", "[nodes.a]\nkind = \"rollot\"\n");
        let d = Diagnostic::error(Code::UnknownKind, "unknown node kind `rollot`")
            .at(Span::new(id, 17, 25))
            .with_label("not a registered kind")
            .with_help("did you mean `rollout`?");
        let text = render(&[d], &sm);
        assert!(
            text.contains("error[E0201]: unknown node kind `rollot`"),
            "{text}"
        );
        assert!(text.contains("--> g.toml:2:8"), "{text}");
        assert!(text.contains("2 | kind = \"rollot\""), "{text}");
        assert!(
            text.contains("  |        ^^^^^^^^ not a registered kind"),
            "{text}"
        );
        assert!(text.contains("= help: did you mean `rollout`?"), "{text}");
        assert!(text.ends_with("1 error found\n"), "{text}");
    }

    #[test]
    fn did_you_mean_picks_closest_and_rejects_far() {
        let c = ["batch_size", "max_new_tokens", "n"];
        assert_eq!(
            did_you_mean("batch_szie", c).as_deref(),
            Some("did you mean `batch_size`?")
        );
        assert_eq!(did_you_mean("temperature", c), None);
    }
}
