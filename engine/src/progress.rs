//! Progress display: an indicatif step bar with the running nodes on a terminal, plain lines
//! (one per step) otherwise, or nothing.
//!
//! The step line shows the main metrics when nodes report them (verl names) and per-node timings.

use crate::scheduler::Event;
use crate::session::StepReport;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressMode {
    /// A bar when stdout is a terminal, else plain lines.
    Auto,
    Bar,
    Plain,
    Quiet,
}

/// Metrics shown on a step line, with short labels.
const SHOWN: &[(&str, &str)] = &[
    ("critic/score/mean", "score"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/kl_loss", "kl"),
    ("actor/entropy", "entropy"),
    ("response_length/mean", "len"),
    ("val/score", "val"),
];

pub struct Progress {
    bar: Option<ProgressBar>,
    plain: bool,
    total: u64,
    running: Vec<String>,
    started: Instant,
}

impl Progress {
    pub fn new(mode: ProgressMode, first_step: u64, total: u64) -> Self {
        let mode = match mode {
            ProgressMode::Auto if std::io::stdout().is_terminal() => ProgressMode::Bar,
            ProgressMode::Auto => ProgressMode::Plain,
            m => m,
        };
        let bar = (mode == ProgressMode::Bar).then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stdout());
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:30.cyan/blue} step {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}",
                )
                .expect("valid template")
                .progress_chars("█▉▊▋▌▍▎▏ "),
            );
            b.set_position(first_step);
            b
        });
        Progress {
            bar,
            plain: mode == ProgressMode::Plain,
            total,
            running: Vec::new(),
            started: Instant::now(),
        }
    }

    pub fn event(&mut self, e: Event<'_>) {
        match e {
            Event::NodeStarted(n) => self.running.push(n.to_string()),
            Event::NodeFinished(n, _) => self.running.retain(|r| r != n),
        }
        if let Some(b) = &self.bar {
            b.set_message(format!("running: {}", self.running.join(", ")));
        }
    }

    /// Prints the step's line.
    pub fn step_done(&mut self, report: &StepReport) {
        let line = step_line(report, self.total);
        if let Some(b) = &self.bar {
            b.println(line);
            b.set_position(report.step + 1);
            b.set_message("");
        } else if self.plain {
            println!("{line}");
        }
    }

    pub fn message(&self, text: &str) {
        if let Some(b) = &self.bar {
            b.println(text);
        } else if self.plain {
            println!("{text}");
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }

    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }
}

/// `step 3/60  score 0.531  pg_loss -0.0120 | 4.21s: gen 2.10 ref 0.40 ...`
pub fn step_line(report: &StepReport, total: u64) -> String {
    let mut s = format!("step {}/{total}", report.step + 1);
    s.push_str(&shown_metrics(report));
    let step_t = report.metrics.get("timing_s/step").copied().unwrap_or(0.0);
    s.push_str(&format!(" | {step_t:.2}s:"));
    for (k, v) in &report.metrics {
        if let Some(key) = k.strip_prefix("timing_s/")
            && key != "step"
        {
            s.push_str(&format!(" {key} {v:.2}"));
        }
    }
    let skipped: Vec<&str> = report
        .nodes
        .iter()
        .filter(|n| n.skipped)
        .map(|n| n.name.as_str())
        .collect();
    if !skipped.is_empty() {
        s.push_str(&format!(" (skipped: {})", skipped.join(", ")));
    }
    s
}

/// `before training  val 0.250 | eval 3.10s`: the pass before the first step.
pub fn before_train_line(report: &StepReport) -> String {
    let mut s = format!("before training{} |", shown_metrics(report));
    for (k, v) in &report.metrics {
        if let Some(key) = k.strip_prefix("timing_s/") {
            s.push_str(&format!(" {key} {v:.2}s"));
        }
    }
    s
}

/// `  score 0.531  pg_loss -0.0120`: the [`SHOWN`] metrics the report has.
fn shown_metrics(report: &StepReport) -> String {
    let mut s = String::new();
    for (key, label) in SHOWN {
        if let Some(v) = report.metrics.get(*key) {
            s.push_str(&format!("  {label} {}", fmt_num(*v)));
        }
    }
    s
}

fn fmt_num(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e5) {
        format!("{v:.3e}")
    } else {
        format!("{v:.4}")
    }
}
