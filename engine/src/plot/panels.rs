//! Which panels the runs get, and which lines each draws (see the module doc of [`super`]).

use super::read::RunMetrics;
use std::collections::{BTreeMap, BTreeSet};

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
pub(super) fn val_sources<'a>(
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
pub(super) fn shown_sources(run: &RunMetrics) -> BTreeMap<String, (String, String)> {
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
