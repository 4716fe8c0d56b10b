//! Plots of runs' curves (`flowrl plot RUN…`, and `RUN_DIR/plots.svg` at the end of a run): one
//! SVG titled with the runs' names and graph files, and one small chart per metric family.
//!
//! Panels, in order: "accuracy" (training `critic/score/acc/mean` with validation `val/accuracy`),
//! "score" (`critic/score/mean` with `val/score`), the main actor curves, the response length
//! (training and validation), every other `val/<m>` family and the remaining `val-core/*`
//! metrics; when none of these exist, every metric that is not a timing. A family's
//! per-data-source series (flowrl's `val/<source>/<m>`, verl's `val-core/<source>/acc/mean@N`
//! for accuracy and `…/reward/mean@N` for score) is a line of the family's panel when a run has
//! several sources, or no overall `val/<m>`; with one source it equals `val/<m>` and is left out.
//! Validation and other sparse series are drawn as markers joined by a dashed line, so that the
//! line between two evaluations is not read as measured. A value recorded as non-finite (`null`
//! in the file) is marked by a red × at the top of its panel and listed in the panel's header.
//!
//! Several runs overlay in the same panels, each in its own colour. A run is a run directory, a
//! flowrl `metrics.jsonl` (`{"step": N, "<metric>": value, …}`) or a file of verl's file logger
//! (`trainer.logger=['file']`: `{"step": N, "data": {"<metric>": value, …}}`); both name metrics
//! as verl does, so their panels line up. SVG needs no font files (text is laid out by the
//! viewer).

use crate::rundir::{METRICS_FILE, PLOT_FILE, RUN_FILE};
use anyhow::{Context as _, anyhow, bail, ensure};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The main actor curves, one panel each, drawn after accuracy and score.
pub const ACTOR_METRICS: &[&str] = &[
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/ppo_kl",
    "actor/pg_clipfrac",
    "actor/grad_norm",
];

/// Panels that put a training metric and its validation counterpart `val/<m>` on the same axes:
/// (title, training metric, `m`).
const ACCURACY_FAMILY: (&str, &str, &str) = ("accuracy", "critic/score/acc/mean", "accuracy");
const SCORE_FAMILY: (&str, &str, &str) = ("score", "critic/score/mean", "score");
const RESPONSE_LENGTH_FAMILY: (&str, &str, &str) = (
    "response_length/mean",
    "response_length/mean",
    "response_length/mean",
);

/// Width of one panel, and height of its chart below the header, in pixels.
const PANEL_WIDTH: u32 = 460;
const CHART_HEIGHT: u32 = 290;
/// Height of one header row (caption, legend, non-finite note) and of one title line.
const ROW_HEIGHT: u32 = 18;
const TITLE_LINE_HEIGHT: u32 = 24;
/// Colours of lines: by role within a panel for one run, by run for several (no red: red marks
/// non-finite values).
const PALETTE: &[RGBColor] = &[
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x7f, 0x7f, 0x7f),
];
const NON_FINITE_COLOUR: RGBColor = RGBColor(0xd6, 0x27, 0x28);

/// How to draw: `smooth` is the weight of the exponential moving average drawn over dense
/// training series (0 draws the values as they are).
#[derive(Clone, Debug, Default)]
pub struct PlotOptions {
    pub smooth: f64,
}

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

fn parse_metrics_line(line: &str) -> anyhow::Result<MetricsRow> {
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

/// TensorBoard's debiased exponential moving average of the finite values of `series`:
/// `s_t = weight·s_{t−1} + (1 − weight)·x_t`, divided by `1 − weight^t`; `None` stays `None`.
pub fn smooth(series: &[(u64, Option<f64>)], weight: f64) -> Series {
    let (mut average, mut count) = (0.0, 0);
    series
        .iter()
        .map(|&(step, value)| {
            let smoothed = value.map(|x| {
                average = weight * average + (1.0 - weight) * x;
                count += 1;
                average / (1.0 - weight.powi(count))
            });
            (step, smoothed)
        })
        .collect()
}

/// What a line of a panel shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// The panel's one metric.
    Only,
    /// A training metric, one value per step.
    Train,
    /// A validation metric over all data sources.
    Val,
    /// A validation metric of one data source.
    ValSource(String),
}

impl Role {
    /// The line's name in the legend of one run ("" for the panel's one metric).
    pub fn label(&self) -> String {
        match self {
            Role::Only => String::new(),
            Role::Train => "train".into(),
            Role::Val => "val".into(),
            Role::ValSource(source) => format!("val {source}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct PanelLine {
    pub key: String,
    pub role: Role,
}

/// One chart: a metric family's lines, each drawn for every run that has it.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub title: String,
    pub lines: Vec<PanelLine>,
}

impl Panel {
    /// The header: the title, then the metrics drawn when they are not the title itself
    /// (per-source lines are named by the legend, unless the panel has no other).
    pub fn caption(&self) -> String {
        let mut keys: Vec<&str> = self
            .lines
            .iter()
            .filter(|l| !matches!(l.role, Role::ValSource(_)))
            .map(|l| l.key.as_str())
            .collect();
        if keys.is_empty() {
            keys = self.lines.iter().map(|l| l.key.as_str()).collect();
        }
        if keys.first() == Some(&self.title.as_str()) {
            keys.join(" · ")
        } else {
            format!("{}: {}", self.title, keys.join(" · "))
        }
    }
}

/// verl's validation variables that are flowrl's `val/<m>` families: the reward's `acc`
/// component is `accuracy`, the reward itself `score`.
const VERL_VALIDATION_FAMILIES: &[(&str, &str)] = &[("acc", "accuracy"), ("reward", "score")];

/// The per-data-source validation series among `keys`, as key → (`m`, source): flowrl's
/// `val/<source>/<m>` where `val/<m>` is a key too (the longest such `m`), and verl's
/// `val-core/<source>/<var>/mean@N` (and `val-aux/…`) for the variables of
/// [`VERL_VALIDATION_FAMILIES`].
fn val_sources<'a>(
    keys: impl Iterator<Item = &'a String> + Clone,
) -> BTreeMap<String, (String, String)> {
    let overall: BTreeSet<&str> = keys
        .clone()
        .filter_map(|k| k.strip_prefix("val/"))
        .collect();
    let flowrl = |key: &String| {
        let rest = key.strip_prefix("val/")?;
        let metric = overall
            .iter()
            .filter(|m| rest.len() > m.len() + 1 && rest.ends_with(&format!("/{m}")))
            .max_by_key(|m| m.len())?;
        let source = &rest[..rest.len() - metric.len() - 1];
        Some((metric.to_string(), source.to_string()))
    };
    let verl = |key: &String| {
        let rest = key
            .strip_prefix("val-core/")
            .or_else(|| key.strip_prefix("val-aux/"))?;
        let (rest, statistic) = rest.rsplit_once('/')?;
        let (source, variable) = rest.rsplit_once('/')?;
        let (_, metric) = VERL_VALIDATION_FAMILIES
            .iter()
            .find(|(v, _)| *v == variable)?;
        (statistic.starts_with("mean@") && !source.is_empty())
            .then(|| (metric.to_string(), source.to_string()))
    };
    keys.filter_map(|key| Some((key.clone(), flowrl(key).or_else(|| verl(key))?)))
        .collect()
}

/// The per-source series of `run` drawn as lines, one per (family, source) (flowrl's name where
/// verl's names the same series); none for a family of one source when the run has its overall
/// `val/<m>`, which that source's series would repeat.
fn shown_sources(run: &RunMetrics) -> BTreeMap<String, (String, String)> {
    let mut by_family: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (key, (metric, source)) in val_sources(run.series.keys()) {
        let chosen = by_family
            .entry(metric)
            .or_default()
            .entry(source)
            .or_insert_with(|| key.clone());
        if key.starts_with("val/") {
            *chosen = key;
        }
    }
    by_family
        .into_iter()
        .filter(|(metric, sources)| {
            sources.len() >= 2 || !run.series.contains_key(&format!("val/{metric}"))
        })
        .flat_map(|(metric, sources)| {
            sources
                .into_iter()
                .map(move |(source, key)| (key, (metric.clone(), source)))
        })
        .collect()
}

/// The panels of `runs`, in display order (see the module's documentation).
pub fn choose_panels(runs: &[RunMetrics]) -> Vec<Panel> {
    let present: BTreeSet<&str> = runs
        .iter()
        .flat_map(|r| r.series.keys().map(String::as_str))
        .collect();
    let mut source_keys = BTreeSet::new();
    let mut shown: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for run in runs {
        source_keys.extend(val_sources(run.series.keys()).into_keys());
        for (key, (metric, source)) in shown_sources(run) {
            shown.entry(metric).or_default().insert((source, key));
        }
    }
    let val_lines = |metric: &str| -> Vec<PanelLine> {
        let overall = format!("val/{metric}");
        let mut lines = Vec::new();
        if present.contains(overall.as_str()) {
            lines.push(PanelLine {
                key: overall,
                role: Role::Val,
            });
        }
        for (source, key) in shown.get(metric).into_iter().flatten() {
            lines.push(PanelLine {
                key: key.clone(),
                role: Role::ValSource(source.clone()),
            });
        }
        lines
    };
    let family = |(title, train, metric): (&str, &str, &str)| -> Option<Panel> {
        let mut lines = Vec::new();
        if present.contains(train) {
            lines.push(PanelLine {
                key: train.to_string(),
                role: Role::Train,
            });
        }
        lines.extend(val_lines(metric));
        (!lines.is_empty()).then(|| Panel {
            title: title.to_string(),
            lines,
        })
    };
    let single = |key: &str, role: Role| Panel {
        title: key.to_string(),
        lines: vec![PanelLine {
            key: key.to_string(),
            role,
        }],
    };

    let mut panels: Vec<Panel> = [ACCURACY_FAMILY, SCORE_FAMILY]
        .into_iter()
        .filter_map(family)
        .collect();
    panels.extend(
        ACTOR_METRICS
            .iter()
            .filter(|k| present.contains(*k))
            .map(|k| single(k, Role::Only)),
    );
    panels.extend(family(RESPONSE_LENGTH_FAMILY));
    let in_families = [ACCURACY_FAMILY, SCORE_FAMILY, RESPONSE_LENGTH_FAMILY].map(|f| f.2);
    for key in &present {
        let Some(metric) = key.strip_prefix("val/") else {
            continue;
        };
        if !source_keys.contains(*key) && !in_families.contains(&metric) {
            panels.push(Panel {
                title: key.to_string(),
                lines: val_lines(metric),
            });
        }
    }
    panels.extend(
        present
            .iter()
            .filter(|k| k.starts_with("val-core/") && !source_keys.contains(**k))
            .map(|k| single(k, Role::Val)),
    );
    if panels.is_empty() {
        panels = present
            .iter()
            .filter(|k| !k.starts_with("timing_s/"))
            .take(12)
            .map(|k| single(k, Role::Only))
            .collect();
    }
    panels
}

/// Draws `run_dir` into `output` (default `run_dir/plots.svg`); returns the path written.
pub fn plot_run(run_dir: &Path, output: Option<&Path>) -> anyhow::Result<PathBuf> {
    plot_runs(&[run_dir.to_path_buf()], output, &PlotOptions::default())
}

/// Draws `inputs` (run directories or metrics files) overlaid into `output`; returns the path
/// written. Without `output`, one run is drawn into its directory's `plots.svg` (a metrics file
/// not named `metrics.jsonl`: next to it, as `<stem>.svg`); several runs need `output`.
pub fn plot_runs(
    inputs: &[PathBuf],
    output: Option<&Path>,
    options: &PlotOptions,
) -> anyhow::Result<PathBuf> {
    ensure!(!inputs.is_empty(), "no run to plot");
    ensure!(
        (0.0..1.0).contains(&options.smooth),
        "the smoothing weight is {}; it must be at least 0 and below 1",
        options.smooth
    );
    let out = match output {
        Some(p) => p.to_path_buf(),
        None => default_output(inputs)?,
    };
    let mut runs = inputs
        .iter()
        .map(|p| RunMetrics::read(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let names: Vec<String> = runs.iter().map(|r| r.name.clone()).collect();
    for (run, input) in runs.iter_mut().zip(inputs) {
        if names.iter().filter(|n| **n == run.name).count() > 1 {
            run.name = input.display().to_string();
        }
    }
    let svg = render_svg(&runs, options).with_context(|| {
        let list: Vec<String> = inputs.iter().map(|p| p.display().to_string()).collect();
        format!("plotting {}", list.join(", "))
    })?;
    std::fs::write(&out, svg).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

/// Where one run's plots go by default (see [`plot_runs`]).
fn default_output(inputs: &[PathBuf]) -> anyhow::Result<PathBuf> {
    let [input] = inputs else {
        bail!(
            "{} runs are drawn into one file: name it with -o FILE (e.g. -o compare.svg)",
            inputs.len()
        );
    };
    if input.is_dir() {
        return Ok(input.join(PLOT_FILE));
    }
    if input.file_name().is_some_and(|n| n == METRICS_FILE) {
        return Ok(input.with_file_name(PLOT_FILE));
    }
    Ok(input.with_extension("svg"))
}

/// A line as drawn for one run.
struct DrawnLine<'a> {
    label: String,
    colour: RGBColor,
    /// Markers at each value, for sparse series.
    marker: Option<Marker>,
    values: &'a Series,
    /// The moving average drawn over `values` (then drawn faint), when smoothing.
    smoothed: Option<Series>,
}

#[derive(Clone, Copy)]
enum Marker {
    Circle,
    Triangle,
}

/// The lines of `panel` for each run that has them, coloured by role for one run and by run for
/// several.
fn drawn_lines<'a>(
    panel: &Panel,
    runs: &'a [RunMetrics],
    options: &PlotOptions,
) -> Vec<DrawnLine<'a>> {
    let mut out = Vec::new();
    for (run_index, run) in runs.iter().enumerate() {
        let shown = shown_sources(run);
        let mut source_index = 0;
        for line in &panel.lines {
            let is_source = matches!(line.role, Role::ValSource(_));
            let role_index = match &line.role {
                Role::Only | Role::Train => 0,
                Role::Val => 1,
                Role::ValSource(_) => {
                    source_index += 1;
                    1 + source_index
                }
            };
            let Some(values) = run.series.get(&line.key) else {
                continue;
            };
            if is_source && !shown.contains_key(&line.key) {
                continue;
            }
            let sparse = run.is_sparse(&line.key);
            let (colour, label) = if runs.len() == 1 {
                (PALETTE[role_index % PALETTE.len()], line.role.label())
            } else {
                let label = format!("{} {}", run.name, line.role.label());
                (
                    PALETTE[run_index % PALETTE.len()],
                    label.trim_end().to_string(),
                )
            };
            let marker = sparse.then_some(if is_source && runs.len() > 1 {
                Marker::Triangle
            } else {
                Marker::Circle
            });
            let smoothed = (options.smooth > 0.0 && !sparse && !is_validation(&line.key))
                .then(|| smooth(values, options.smooth));
            out.push(DrawnLine {
                label,
                colour,
                marker,
                values,
                smoothed,
            });
        }
    }
    out
}

/// "non-finite at steps …" for the lines of a panel that have non-finite values, naming the line
/// when the panel has several.
fn non_finite_note(lines: &[DrawnLine]) -> Option<String> {
    let groups: Vec<String> = lines
        .iter()
        .filter_map(|line| {
            let steps: Vec<u64> = line
                .values
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(s, _)| *s)
                .collect();
            if steps.is_empty() {
                return None;
            }
            let mut text = step_list(&steps);
            if lines.len() > 1 && !line.label.is_empty() {
                text.push_str(&format!(" ({})", line.label));
            }
            Some(text)
        })
        .collect();
    (!groups.is_empty()).then(|| format!("non-finite at steps {}", groups.join("; ")))
}

/// `steps` as a list, the first eight and the count when longer.
fn step_list(steps: &[u64]) -> String {
    const SHOWN: usize = 8;
    let list: Vec<String> = steps.iter().take(SHOWN).map(u64::to_string).collect();
    if steps.len() > SHOWN {
        format!("{} … ({} in all)", list.join(", "), steps.len())
    } else {
        list.join(", ")
    }
}

/// Estimated width in pixels of `text` at `size` (SVG text is laid out by the viewer; this only
/// places legend entries).
fn text_width(text: &str, size: f64) -> i32 {
    (text.chars().count() as f64 * size * 0.58).ceil() as i32
}

const LEGEND_FONT: f64 = 12.0;
const SWATCH: i32 = 20;

/// The legend's entries of `lines` as rows of (line, x offset), wrapped to `width`.
fn legend_rows<'a>(lines: &'a [DrawnLine<'a>], width: i32) -> Vec<Vec<(&'a DrawnLine<'a>, i32)>> {
    let mut rows: Vec<Vec<(&DrawnLine, i32)>> = Vec::new();
    let mut x = 0;
    for line in lines.iter().filter(|l| !l.label.is_empty()) {
        let entry = SWATCH + 4 + text_width(&line.label, LEGEND_FONT) + 14;
        if rows.is_empty() || (x + entry > width && x > 0) {
            rows.push(Vec::new());
            x = 0;
        }
        rows.last_mut().expect("a row").push((line, x));
        x += entry;
    }
    rows
}

fn svg_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing the SVG: {e}")
}

/// The SVG of `runs`: a title line per run (its name and graph file), then the panels, three per
/// row.
pub fn render_svg(runs: &[RunMetrics], options: &PlotOptions) -> anyhow::Result<String> {
    let panels = choose_panels(runs);
    ensure!(!panels.is_empty(), "no metric to plot");
    let lines: Vec<Vec<DrawnLine>> = panels
        .iter()
        .map(|p| drawn_lines(p, runs, options))
        .collect();
    let legend_width = PANEL_WIDTH as i32 - 24;
    let legend_row_count = lines
        .iter()
        .map(|l| legend_rows(l, legend_width).len())
        .max()
        .unwrap_or(0) as u32;
    let has_notes = lines.iter().any(|l| non_finite_note(l).is_some());
    let header_height = 8 + ROW_HEIGHT * (1 + legend_row_count + u32::from(has_notes));

    let steps = runs.iter().flat_map(|r| r.steps.iter().copied());
    let (first, last) = steps.fold((u64::MAX, 0), |(a, b), s| (a.min(s), b.max(s)));
    // Padded so that markers at the first and last steps are drawn whole.
    let x_pad = ((last.saturating_sub(first)) as f64 * 0.02).max(0.25);
    let x_range = (first as f64 - x_pad, last as f64 + x_pad);

    let cols = panels.len().clamp(1, 3);
    let nrows = panels.len().div_ceil(cols);
    let title_height = 12 + TITLE_LINE_HEIGHT * runs.len() as u32;
    let panel_height = header_height + CHART_HEIGHT;
    let size = (
        PANEL_WIDTH * cols as u32,
        title_height + panel_height * nrows as u32,
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(svg_error)?;
        let (title_area, body) = root.split_vertically(title_height);
        draw_title(&title_area, runs)?;
        let areas = body.split_evenly((nrows, cols));
        for ((panel, lines), area) in panels.iter().zip(&lines).zip(&areas) {
            draw_panel(area, panel, lines, x_range, header_height, legend_width)?;
        }
        root.present().map_err(svg_error)?;
    }
    Ok(svg)
}

/// One line per run: its name and graph file, in the run's colour when there are several.
fn draw_title(area: &DrawingArea<SVGBackend, Shift>, runs: &[RunMetrics]) -> anyhow::Result<()> {
    let centre = area.dim_in_pixel().0 as i32 / 2;
    for (i, run) in runs.iter().enumerate() {
        let text = match &run.graph_file {
            Some(graph) => format!("{} — {graph}", run.name),
            None => run.name.clone(),
        };
        let colour = if runs.len() == 1 {
            BLACK
        } else {
            PALETTE[i % PALETTE.len()]
        };
        let style = TextStyle::from(("sans-serif", 19, FontStyle::Bold).into_font())
            .color(&colour)
            .pos(Pos::new(HPos::Center, VPos::Top));
        let y = 8 + TITLE_LINE_HEIGHT as i32 * i as i32;
        area.draw_text(&text, &style, (centre, y))
            .map_err(svg_error)?;
    }
    Ok(())
}

fn draw_panel(
    area: &DrawingArea<SVGBackend, Shift>,
    panel: &Panel,
    lines: &[DrawnLine],
    (x0, x1): (f64, f64),
    header_height: u32,
    legend_width: i32,
) -> anyhow::Result<()> {
    let (header, plot_area) = area.split_vertically(header_height);
    let centre = PANEL_WIDTH as i32 / 2;
    let caption = TextStyle::from(("sans-serif", 15).into_font())
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    header
        .draw_text(&panel.caption(), &caption, (centre, 6))
        .map_err(svg_error)?;
    let mut y = 6 + ROW_HEIGHT as i32;
    for row in legend_rows(lines, legend_width) {
        let width: i32 = row.last().map_or(0, |(l, x)| {
            x + SWATCH + 4 + text_width(&l.label, LEGEND_FONT)
        });
        let left = (PANEL_WIDTH as i32 - width) / 2;
        for (line, x) in row {
            let (sx, sy) = (left + x, y + 7);
            let style = line.colour.stroke_width(2);
            header
                .draw(&PathElement::new(vec![(sx, sy), (sx + SWATCH, sy)], style))
                .map_err(svg_error)?;
            let centre = (sx + SWATCH / 2, sy);
            match line.marker {
                Some(Marker::Circle) => header.draw(&Circle::new(centre, 4, line.colour.filled())),
                Some(Marker::Triangle) => {
                    header.draw(&TriangleMarker::new(centre, 5, line.colour.filled()))
                }
                None => Ok(()),
            }
            .map_err(svg_error)?;
            let text = TextStyle::from(("sans-serif", LEGEND_FONT).into_font())
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Top));
            header
                .draw_text(&line.label, &text, (sx + SWATCH + 4, y))
                .map_err(svg_error)?;
        }
        y += ROW_HEIGHT as i32;
    }
    let note = non_finite_note(lines);
    if let Some(note) = &note {
        let style = TextStyle::from(("sans-serif", LEGEND_FONT).into_font())
            .color(&NON_FINITE_COLOUR)
            .pos(Pos::new(HPos::Center, VPos::Top));
        header
            .draw_text(
                note,
                &style,
                (centre, header_height as i32 - ROW_HEIGHT as i32),
            )
            .map_err(svg_error)?;
    }

    let finite = lines
        .iter()
        .flat_map(|l| l.values.iter().filter_map(|(_, v)| *v));
    let (low, high) = finite.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (y0, y1) = if low > high {
        (0.0, 1.0)
    } else if low == high {
        (low - 0.5, high + 0.5)
    } else {
        let pad = (high - low) * 0.05;
        // Room at the top for the non-finite markers.
        let top = if note.is_some() { 2.5 * pad } else { pad };
        (low - pad, high + top)
    };
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(8)
        .margin_top(2)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(svg_error)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_labels(6)
        // Steps are whole numbers: a tick between two is left unlabelled.
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{x:.0}")
            } else {
                String::new()
            }
        })
        .y_labels(6)
        .draw()
        .map_err(svg_error)?;

    for line in lines {
        let main_style = line.colour.stroke_width(2);
        if let Some(smoothed) = &line.smoothed {
            draw_segments(
                &mut chart,
                line.values,
                line.colour.mix(0.3).stroke_width(1),
                false,
            )?;
            draw_segments(&mut chart, smoothed, main_style, false)?;
        } else {
            draw_segments(&mut chart, line.values, main_style, line.marker.is_some())?;
        }
        if let Some(marker) = line.marker {
            let points = line
                .values
                .iter()
                .filter_map(|(s, v)| Some((*s as f64, (*v)?)));
            let style = line.colour.filled();
            match marker {
                Marker::Circle => chart
                    .draw_series(points.map(|p| Circle::new(p, 4, style)))
                    .map(|_| ()),
                Marker::Triangle => chart
                    .draw_series(points.map(|p| TriangleMarker::new(p, 5, style)))
                    .map(|_| ()),
            }
            .map_err(svg_error)?;
        }
    }
    let marker_y = y1 - (y1 - y0) * 0.03;
    let crosses = lines.iter().flat_map(|l| {
        l.values
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(move |(s, _)| {
                Cross::new((*s as f64, marker_y), 5, NON_FINITE_COLOUR.stroke_width(2))
            })
    });
    chart.draw_series(crosses).map_err(svg_error)?;
    Ok(())
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Draws `values` as lines broken where a value is non-finite, dashed for a sparse series; a
/// point with no finite neighbour in a solid line is drawn as a dot.
fn draw_segments(
    chart: &mut Chart,
    values: &Series,
    style: ShapeStyle,
    dashed: bool,
) -> anyhow::Result<()> {
    let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for (step, value) in values {
        match value {
            Some(v) => segments
                .last_mut()
                .expect("a segment")
                .push((*step as f64, *v)),
            None => segments.push(Vec::new()),
        }
    }
    for segment in segments.into_iter().filter(|s| !s.is_empty()) {
        if dashed {
            chart
                .draw_series(DashedLineSeries::new(segment, 5, 4, style))
                .map_err(svg_error)?;
        } else if let [point] = segment[..] {
            chart
                .draw_series(std::iter::once(Circle::new(point, 2, style.filled())))
                .map_err(svg_error)?;
        } else {
            chart
                .draw_series(LineSeries::new(segment, style))
                .map_err(svg_error)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_main_metrics_to_svg() {
        let dir = tempfile::tempdir().unwrap();
        let mut lines = String::new();
        for s in 1..=5 {
            lines.push_str(&format!(
                "{{\"step\":{s},\"critic/score/mean\":{},\"val/acc\":0.5,\"timing_s/step\":1.0}}\n",
                s as f64 / 10.0
            ));
        }
        std::fs::write(dir.path().join(METRICS_FILE), lines).unwrap();
        let run = RunMetrics::read(dir.path()).unwrap();
        let titles: Vec<String> = choose_panels(&[run]).into_iter().map(|p| p.title).collect();
        assert_eq!(titles, ["score", "val/acc"]);
        let out = plot_run(dir.path(), None).unwrap();
        assert_eq!(out, dir.path().join(PLOT_FILE));
        let svg = std::fs::read_to_string(out).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..50.min(svg.len())]);
        assert!(svg.contains("critic/score/mean"));
        assert!(svg.contains("<polyline"));
    }

    #[test]
    fn smoothing_is_a_debiased_moving_average_that_passes_over_gaps() {
        let s = smooth(&[(1, Some(1.0)), (2, None), (3, Some(3.0))], 0.5);
        assert_eq!(s[0], (1, Some(1.0)));
        assert_eq!(s[1], (2, None));
        let (step, v) = s[2];
        assert_eq!(step, 3);
        assert!((v.unwrap() - 1.75 / 0.75).abs() < 1e-12, "{v:?}");
        assert_eq!(
            smooth(&[(1, Some(2.0)), (2, Some(4.0))], 0.0)[1],
            (2, Some(4.0))
        );
    }

    #[test]
    fn python_non_finite_literals_read_as_null() {
        let row =
            parse_metrics_line(r#"{"step": 3, "a": NaN, "b": -Infinity, "c": 1.5, "d": "NaN"}"#)
                .unwrap();
        assert_eq!(row.step, 3);
        assert_eq!(row.values["a"], None);
        assert_eq!(row.values["b"], None);
        assert_eq!(row.values["c"], Some(1.5));
        assert!(!row.values.contains_key("d"), "strings are not values");
        let err = format!("{:#}", parse_metrics_line(r#"{"a": 1}"#).unwrap_err());
        assert!(err.contains("no \"step\""), "{err}");
    }

    #[test]
    fn per_source_series_are_found_by_the_longest_family() {
        let keys: Vec<String> = [
            "val/accuracy",
            "val/a/b/accuracy",
            "val/response_length/mean",
            "val/c/response_length/mean",
            "val-core/d/e/acc/mean@4",
            "val-aux/d/e/reward/mean@4",
            "val-aux/d/e/format/mean@4",
            "val-core/d/e/acc/best@4/mean",
        ]
        .map(String::from)
        .to_vec();
        let sources = val_sources(keys.iter());
        assert_eq!(
            sources["val/a/b/accuracy"],
            ("accuracy".to_string(), "a/b".to_string())
        );
        assert_eq!(
            sources["val/c/response_length/mean"],
            ("response_length/mean".to_string(), "c".to_string())
        );
        assert_eq!(
            sources["val-core/d/e/acc/mean@4"],
            ("accuracy".to_string(), "d/e".to_string())
        );
        assert_eq!(
            sources["val-aux/d/e/reward/mean@4"],
            ("score".to_string(), "d/e".to_string())
        );
        assert_eq!(sources.len(), 4, "{sources:?}");
    }
}
