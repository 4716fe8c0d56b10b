//! Stage 1 of the compiler: TOML text → a spanned document, and `--set` overrides applied to it.
//!
//! The document keeps, for every key and value, its [`Span`] in the graph file or in the `--set`
//! argument it came from, so every later stage can point at the exact place. It does not interpret
//! the document (that is `compile`'s job).

use crate::diagnostic::{Code, Diagnostic, SourceId, Span};
use serde_json::Value as Json;
use toml::de::{DeTable, DeValue};

/// A value with its span.
#[derive(Clone, Debug)]
pub struct SValue {
    pub kind: SKind,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum SKind {
    String(String),
    Integer(i64),
    Float(f64),
    Boolean(bool),
    Datetime(String),
    Array(Vec<SValue>),
    Table(STable),
}

/// A table: entries in source order.
#[derive(Clone, Debug, Default)]
pub struct STable {
    pub entries: Vec<SEntry>,
}

#[derive(Clone, Debug)]
pub struct SEntry {
    pub key: String,
    pub key_span: Span,
    pub value: SValue,
}

impl STable {
    pub fn get(&self, key: &str) -> Option<&SEntry> {
        self.entries.iter().find(|e| e.key == key)
    }
    fn get_mut(&mut self, key: &str) -> Option<&mut SEntry> {
        self.entries.iter_mut().find(|e| e.key == key)
    }
}

impl SKind {
    /// The TOML type name used in messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            SKind::String(_) => "string",
            SKind::Integer(_) => "integer",
            SKind::Float(_) => "float",
            SKind::Boolean(_) => "boolean",
            SKind::Datetime(_) => "datetime",
            SKind::Array(_) => "array",
            SKind::Table(_) => "table",
        }
    }
}

/// "an integer", "a string": a type name with its article.
pub fn with_article(ty: &str) -> String {
    if ty.starts_with(['a', 'e', 'i', 'o', 'u']) {
        format!("an {ty}")
    } else {
        format!("a {ty}")
    }
}

impl SValue {
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            SKind::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_table(&self) -> Option<&STable> {
        match &self.kind {
            SKind::Table(t) => Some(t),
            _ => None,
        }
    }

    /// The value as JSON (datetimes become strings).
    pub fn to_json(&self) -> Json {
        match &self.kind {
            SKind::String(s) | SKind::Datetime(s) => Json::String(s.clone()),
            SKind::Integer(i) => Json::from(*i),
            SKind::Float(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
            SKind::Boolean(b) => Json::Bool(*b),
            SKind::Array(a) => Json::Array(a.iter().map(SValue::to_json).collect()),
            SKind::Table(t) => Json::Object(
                t.entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.to_json()))
                    .collect(),
            ),
        }
    }

    /// The value as a `toml::Value` (for the resolved graph written to the run directory).
    pub fn to_toml(&self) -> toml::Value {
        match &self.kind {
            SKind::String(s) => toml::Value::String(s.clone()),
            SKind::Datetime(s) => s
                .parse()
                .map_or_else(|_| toml::Value::String(s.clone()), toml::Value::Datetime),
            SKind::Integer(i) => toml::Value::Integer(*i),
            SKind::Float(f) => toml::Value::Float(*f),
            SKind::Boolean(b) => toml::Value::Boolean(*b),
            SKind::Array(a) => toml::Value::Array(a.iter().map(SValue::to_toml).collect()),
            SKind::Table(t) => toml::Value::Table(
                t.entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.to_toml()))
                    .collect(),
            ),
        }
    }
}

fn span_of(source: SourceId, r: std::ops::Range<usize>, offset: usize) -> Span {
    Span::new(source, r.start + offset, r.end + offset)
}

fn convert(v: &toml::Spanned<DeValue<'_>>, source: SourceId, offset: usize) -> SValue {
    let span = span_of(source, v.span(), offset);
    let kind = match v.get_ref() {
        DeValue::String(s) => SKind::String(s.to_string()),
        DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) => SKind::Integer(n),
            // Out of i64's range: keep as a float so range checks still report it.
            Err(_) => SKind::Float(i.as_str().parse().unwrap_or(f64::INFINITY)),
        },
        DeValue::Float(f) => SKind::Float(f.as_str().parse().unwrap_or(f64::NAN)),
        DeValue::Boolean(b) => SKind::Boolean(*b),
        DeValue::Datetime(d) => SKind::Datetime(d.to_string()),
        DeValue::Array(a) => SKind::Array(a.iter().map(|e| convert(e, source, offset)).collect()),
        DeValue::Table(t) => SKind::Table(convert_table(t, source, offset)),
    };
    SValue { kind, span }
}

fn convert_table(t: &DeTable<'_>, source: SourceId, offset: usize) -> STable {
    let mut entries: Vec<SEntry> = t
        .iter()
        .map(|(k, v)| SEntry {
            key: k.get_ref().to_string(),
            key_span: span_of(source, k.span(), offset),
            value: convert(v, source, offset),
        })
        .collect();
    entries.sort_by_key(|e| (e.key_span.start, e.key_span.end));
    STable { entries }
}

fn syntax_error(e: &toml::de::Error, source: SourceId, offset: usize, len: usize) -> Diagnostic {
    let span = e
        .span()
        .map_or(Span::new(source, len, len), |r| span_of(source, r, offset));
    let msg = e.message().trim().to_string();
    let first = msg.lines().next().unwrap_or("invalid TOML").to_string();
    let mut d = Diagnostic::error(Code::Syntax, format!("invalid TOML: {first}")).at(span);
    let rest: Vec<&str> = msg
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .collect();
    if !rest.is_empty() {
        d = d.with_help(rest.join("; "));
    }
    d
}

/// Parses a graph file. Syntax errors are all returned (best-effort recovery).
pub fn parse(text: &str, source: SourceId) -> Result<STable, Vec<Diagnostic>> {
    let (doc, errors) = DeTable::parse_recoverable(text);
    if !errors.is_empty() {
        return Err(errors
            .iter()
            .map(|e| syntax_error(e, source, 0, text.len()))
            .collect());
    }
    Ok(convert_table(doc.get_ref(), source, 0))
}

/// Applies one `--set path.to.key=value` argument, whose full text is source `source`. The value is
/// parsed as TOML; text that is not a TOML value is taken as a string (`--set run.device=cpu`).
// One diagnostic per override is returned by value like every other diagnostic.
#[allow(clippy::result_large_err)]
pub fn apply_override(doc: &mut STable, arg: &str, source: SourceId) -> Result<(), Diagnostic> {
    let whole = Span::new(source, 0, arg.len());
    let Some(eq) = arg.find('=') else {
        return Err(
            Diagnostic::error(Code::BadOverride, format!("`--set {arg}` has no `=`"))
                .at(whole)
                .with_help("write `--set path.to.key=value`, e.g. `--set nodes.data.batch_size=4`"),
        );
    };
    let (path, raw) = (&arg[..eq], &arg[eq + 1..]);
    // Path segments with their spans.
    let mut segs: Vec<(&str, Span)> = Vec::new();
    let mut start = 0;
    for part in path.split('.') {
        segs.push((part.trim(), Span::new(source, start, start + part.len())));
        start += part.len() + 1;
    }
    if let Some((_, sp)) = segs.iter().find(|(s, _)| s.is_empty()) {
        return Err(Diagnostic::error(
            Code::BadOverride,
            format!("`--set {arg}`: empty key in path"),
        )
        .at(*sp)
        .with_help("write `--set path.to.key=value`"));
    }
    let value = if raw.trim().is_empty() {
        SValue {
            kind: SKind::String(String::new()),
            span: Span::new(source, eq + 1, arg.len()),
        }
    } else {
        match DeValue::parse(raw) {
            Ok(v) => convert(&v, source, eq + 1),
            Err(_) => SValue {
                kind: SKind::String(raw.to_string()),
                span: Span::new(source, eq + 1, arg.len()),
            },
        }
    };
    let mut table = doc;
    for (i, (seg, seg_span)) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        if last {
            match table.get_mut(seg) {
                Some(e) => {
                    e.key_span = *seg_span;
                    e.value = value;
                }
                None => table.entries.push(SEntry {
                    key: seg.to_string(),
                    key_span: *seg_span,
                    value,
                }),
            }
            return Ok(());
        }
        if table.get(seg).is_none() {
            table.entries.push(SEntry {
                key: seg.to_string(),
                key_span: *seg_span,
                value: SValue {
                    kind: SKind::Table(STable::default()),
                    span: *seg_span,
                },
            });
        }
        let entry = table.get_mut(seg).expect("inserted above");
        let prefix = segs[..=i]
            .iter()
            .map(|(s, _)| *s)
            .collect::<Vec<_>>()
            .join(".");
        match &mut entry.value.kind {
            SKind::Table(t) => table = t,
            other => {
                let ty = with_article(other.type_name());
                return Err(Diagnostic::error(
                    Code::BadOverride,
                    format!("cannot set `{path}`: `{prefix}` is {ty}, not a table"),
                )
                .at(*seg_span)
                .with_note(entry.value.span, format!("`{prefix}` is defined here")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_spans() {
        let text = "[nodes.a]\nkind = \"x\"\nn = 4\n";
        let doc = parse(text, SourceId(0)).unwrap();
        let nodes = doc.get("nodes").unwrap().value.as_table().unwrap();
        let a = nodes.get("a").unwrap();
        assert_eq!(&text[a.key_span.start..a.key_span.end], "a");
        let n = a.value.as_table().unwrap().get("n").unwrap();
        assert!(matches!(n.value.kind, SKind::Integer(4)));
        assert_eq!(&text[n.value.span.start..n.value.span.end], "4");
    }

    #[test]
    fn reports_all_syntax_errors() {
        let errs = parse("a = \nb = [1,\n", SourceId(0)).unwrap_err();
        assert!(!errs.is_empty());
        assert!(errs.iter().all(|d| d.code == Code::Syntax));
    }

    #[test]
    fn overrides_replace_create_and_point_at_argument() {
        let mut doc = parse("[nodes.a]\nn = 4\n", SourceId(0)).unwrap();
        apply_override(&mut doc, "nodes.a.n=8", SourceId(1)).unwrap();
        apply_override(&mut doc, "run.device=cpu", SourceId(2)).unwrap();
        let a = doc
            .get("nodes")
            .unwrap()
            .value
            .as_table()
            .unwrap()
            .get("a")
            .unwrap();
        let n = a.value.as_table().unwrap().get("n").unwrap();
        assert!(matches!(n.value.kind, SKind::Integer(8)));
        assert_eq!(n.value.span, Span::new(SourceId(1), 10, 11));
        let dev = doc
            .get("run")
            .unwrap()
            .value
            .as_table()
            .unwrap()
            .get("device")
            .unwrap();
        assert_eq!(dev.value.as_str(), Some("cpu"));
        let err = apply_override(&mut doc, "nodes.a.n.x=1", SourceId(3)).unwrap_err();
        assert_eq!(err.code, Code::BadOverride);
        assert_eq!(
            err.message,
            "cannot set `nodes.a.n.x`: `nodes.a.n` is an integer, not a table"
        );
        assert!(apply_override(&mut doc, "novalue", SourceId(4)).is_err());
    }
}
