//! Plots of a run's main curves (`flowrl plot RUN_DIR`, and at the end of a run): one SVG with a
//! small line chart per metric, read from `metrics.jsonl`.
//!
//! Shown: the main verl metrics that the run reported (score, losses, entropy, KL, grad norm,
//! response length) and every `val/*` metric; when none of these exist, every metric that is not a
//! timing. SVG needs no font files (text is laid out by the viewer).

use crate::rundir::{METRICS_FILE, PLOT_FILE, read_metrics};
use anyhow::{Context as _, bail};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The main curves, in display order.
pub const MAIN_METRICS: &[&str] = &[
    "critic/score/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/ppo_kl",
    "actor/pg_clipfrac",
    "actor/grad_norm",
    "response_length/mean",
];

/// Which metrics to draw from the rows of a metrics file.
pub fn choose_metrics(rows: &[BTreeMap<String, f64>]) -> Vec<String> {
    let present: std::collections::BTreeSet<&str> = rows
        .iter()
        .flat_map(|r| r.keys().map(String::as_str))
        .collect();
    let mut out: Vec<String> = MAIN_METRICS
        .iter()
        .filter(|m| present.contains(*m))
        .map(|m| m.to_string())
        .collect();
    out.extend(
        present
            .iter()
            .filter(|m| m.starts_with("val/"))
            .map(|m| m.to_string()),
    );
    if out.is_empty() {
        out = present
            .iter()
            .filter(|m| **m != "step" && !m.starts_with("timing_s/"))
            .take(12)
            .map(|m| m.to_string())
            .collect();
    }
    out
}

/// Draws `run_dir/metrics.jsonl` into `output` (default `run_dir/plots.svg`); returns the path.
pub fn plot_run(run_dir: &Path, output: Option<&Path>) -> anyhow::Result<PathBuf> {
    let rows = read_metrics(&run_dir.join(METRICS_FILE))?;
    if rows.is_empty() {
        bail!("{} has no steps yet", run_dir.join(METRICS_FILE).display());
    }
    let metrics = choose_metrics(&rows);
    if metrics.is_empty() {
        bail!(
            "{} holds no metric to plot",
            run_dir.join(METRICS_FILE).display()
        );
    }
    let out = output.map_or_else(|| run_dir.join(PLOT_FILE), Path::to_path_buf);
    let cols = metrics.len().clamp(1, 3);
    let nrows = metrics.len().div_ceil(cols);
    let (w, h) = (420 * cols as u32, 300 * nrows as u32);
    {
        let root = SVGBackend::new(&out, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        let areas = root.split_evenly((nrows, cols));
        for (name, area) in metrics.iter().zip(areas.iter()) {
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter_map(|r| Some((*r.get("step")?, *r.get(name)?)))
                .filter(|(_, y)| y.is_finite())
                .collect();
            draw_one(area, name, &pts).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    std::fs::metadata(&out).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

fn draw_one<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    name: &str,
    pts: &[(f64, f64)],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (x0, x1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (x0, x1) = if pts.is_empty() {
        (0.0, 1.0)
    } else if x0 == x1 {
        (x0 - 0.5, x1 + 0.5)
    } else {
        (x0, x1)
    };
    let (y0, y1) = if pts.is_empty() {
        (0.0, 1.0)
    } else if y0 == y1 {
        (y0 - 0.5, y1 + 0.5)
    } else {
        let pad = (y1 - y0) * 0.05;
        (y0 - pad, y1 + pad)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(name, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_labels(6)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_labels(6)
        .draw()?;
    chart.draw_series(LineSeries::new(pts.iter().copied(), &BLUE))?;
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
        let rows = read_metrics(&dir.path().join(METRICS_FILE)).unwrap();
        assert_eq!(choose_metrics(&rows), vec!["critic/score/mean", "val/acc"]);
        let out = plot_run(dir.path(), None).unwrap();
        let svg = std::fs::read_to_string(out).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..50.min(svg.len())]);
        assert!(svg.contains("critic/score/mean"));
        assert!(svg.contains("<polyline"));
    }
}
