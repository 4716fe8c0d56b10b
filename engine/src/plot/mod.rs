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
//!
//! [`read`] reads runs, [`panels`] chooses the panels, [`draw`] renders them.

mod draw;
mod panels;
mod read;

pub use draw::{render_svg, smooth};
pub use panels::{ACTOR_METRICS, Panel, PanelLine, Role, choose_panels};
pub use read::{MetricsRow, RunMetrics, Series, is_validation, read_metric_rows};

use crate::rundir::{METRICS_FILE, PLOT_FILE};
use anyhow::{Context as _, bail, ensure};
use std::path::{Path, PathBuf};

/// How to draw: `smooth` is the weight of the exponential moving average drawn over dense
/// training series (0 draws the values as they are).
#[derive(Clone, Debug, Default)]
pub struct PlotOptions {
    pub smooth: f64,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundir::METRICS_FILE;
    use panels::val_sources;
    use read::parse_metrics_line;

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
