//! Runs' metrics: a run directory, a flowrl `metrics.jsonl` or a verl file-logger file, read
//! into series by metric.

use crate::rundir::{METRICS_FILE, RUN_FILE};
use anyhow::{Context as _, bail, ensure};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One metric's values by step, ascending; `None` where the run recorded a non-finite value.
pub type Series = Vec<(u64, Option<f64>)>;

/// One line of a metrics file: its step and values, `None` for `null` (a non-finite value).
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsRow {
    pub step: u64,
    pub values: BTreeMap<String, Option<f64>>,
}

/// One run's metrics, as read from its directory or file.
#[derive(Clone, Debug, Default)]
pub struct RunMetrics {
    /// The run's name in titles and legends: its directory's name, or the file's stem.
    pub name: String,
    /// The graph file the run was started with (`run.json`'s `graph_file`), when known.
    pub graph_file: Option<String>,
    pub series: BTreeMap<String, Series>,
    /// Every step the file has a line for.
    pub steps: BTreeSet<u64>,
}

impl RunMetrics {
    /// Reads a run directory (its `metrics.jsonl` and `run.json`) or a metrics file of either
    /// format.
    pub fn read(path: &Path) -> anyhow::Result<RunMetrics> {
        let (file, run_dir) = if path.is_dir() {
            let file = path.join(METRICS_FILE);
            ensure!(
                file.is_file(),
                "{} holds no {METRICS_FILE}: not a run directory, or a run that has not finished \
                 a step",
                path.display()
            );
            (file, Some(path.to_path_buf()))
        } else if path.is_file() {
            let in_run_dir = path.file_name().is_some_and(|n| n == METRICS_FILE);
            let dir = path.parent().map(Path::to_path_buf);
            (path.to_path_buf(), dir.filter(|_| in_run_dir))
        } else {
            bail!("{}: no such run directory or metrics file", path.display());
        };
        let name = match &run_dir {
            Some(dir) => path_name(dir, |p| p.file_name()),
            None => path_name(&file, |p| p.file_stem()),
        };
        let graph_file = run_dir.as_deref().and_then(graph_file_of);
        let rows = read_metric_rows(&file)?;
        ensure!(!rows.is_empty(), "{} has no steps yet", file.display());
        Ok(RunMetrics::from_rows(name, graph_file, &rows))
    }

    /// A run of `rows`; a value a step repeats replaces the earlier one.
    pub fn from_rows(name: String, graph_file: Option<String>, rows: &[MetricsRow]) -> RunMetrics {
        let mut by_key: BTreeMap<String, BTreeMap<u64, Option<f64>>> = BTreeMap::new();
        for row in rows {
            for (key, value) in &row.values {
                by_key
                    .entry(key.clone())
                    .or_default()
                    .insert(row.step, *value);
            }
        }
        RunMetrics {
            name,
            graph_file,
            series: by_key
                .into_iter()
                .map(|(k, v)| (k, v.into_iter().collect()))
                .collect(),
            steps: rows.iter().map(|r| r.step).collect(),
        }
    }

    /// Whether `key` is drawn as points: a validation metric, or one with values at fewer than
    /// half of the run's steps (or at fewer than two).
    pub fn is_sparse(&self, key: &str) -> bool {
        let n = self.series.get(key).map_or(0, Vec::len);
        is_validation(key) || n < 2 || 2 * n < self.steps.len()
    }
}

/// The name of `path` by `part` (file name or stem), resolving `.` and `..` through the file
/// system; the path as written when it has none.
fn path_name(path: &Path, part: impl Fn(&Path) -> Option<&std::ffi::OsStr>) -> String {
    part(path)
        .map(|n| n.to_string_lossy().to_string())
        .filter(|n| n != "." && n != "..")
        .or_else(|| {
            let full = std::fs::canonicalize(path).ok()?;
            part(&full).map(|n| n.to_string_lossy().to_string())
        })
        .unwrap_or_else(|| path.display().to_string())
}

/// `run.json`'s `graph_file` in `run_dir`; `None` when the file is missing or has none (the title
/// then names the run only).
fn graph_file_of(run_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(run_dir.join(RUN_FILE)).ok()?;
    let run: serde_json::Value = serde_json::from_str(&text).ok()?;
    run.get("graph_file")?.as_str().map(str::to_string)
}

/// Whether `key` is a validation metric (flowrl's `val/*`, verl's `val-core/*` and `val-aux/*`),
/// computed every few steps.
pub fn is_validation(key: &str) -> bool {
    key.starts_with("val/") || key.starts_with("val-core/") || key.starts_with("val-aux/")
}

/// Reads a metrics file line by line, keeping `null` values as `None` (where
/// [`crate::rundir::read_metrics`] skips them). A line is flowrl's `{"step": N, "<metric>": value,
/// …}` or verl's file logger's `{"step": N, "data": {…}}`; the bare `NaN` and `Infinity` of
/// Python's `json` module read as `null`. Values that are not numbers are skipped.
pub fn read_metric_rows(path: &Path) -> anyhow::Result<Vec<MetricsRow>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            parse_metrics_line(l).with_context(|| format!("{}:{}", path.display(), i + 1))
        })
        .collect()
}

pub(super) fn parse_metrics_line(line: &str) -> anyhow::Result<MetricsRow> {
    let value: serde_json::Value = serde_json::from_str(line)
        .or_else(|e| serde_json::from_str(&non_finite_literals_as_null(line)).map_err(|_| e))
        .context("not a JSON line")?;
    let obj = value.as_object().context("not a JSON object")?;
    let step = obj
        .get("step")
        .and_then(|s| {
            s.as_u64().or_else(|| {
                s.as_f64()
                    .filter(|f| *f >= 0.0 && f.fract() == 0.0)
                    .map(|f| f as u64)
            })
        })
        .context("no \"step\" that is a whole number")?;
    let fields = match obj.get("data").and_then(serde_json::Value::as_object) {
        Some(data) => data,
        None => obj,
    };
    let values = fields
        .iter()
        .filter(|(k, _)| k.as_str() != "step")
        .filter_map(|(k, v)| match v {
            serde_json::Value::Null => Some((k.clone(), None)),
            serde_json::Value::Number(n) => Some((k.clone(), n.as_f64())),
            _ => None,
        })
        .collect();
    Ok(MetricsRow { step, values })
}

/// `line` with `NaN`, `Infinity` and `-Infinity` outside strings replaced by `null`.
fn non_finite_literals_as_null(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        } else if let Some(word) = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|w| rest.starts_with(w))
        {
            out.push_str("null");
            rest = &rest[word.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}
