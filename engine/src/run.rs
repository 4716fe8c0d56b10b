//! The step loop of `flowrl run`: run directory, resume, metrics, checkpoints, progress, plots.
//!
//! Input: a compiled [`Graph`] and [`RunOptions`]; output: a [`RunSummary`] or the first error.
//! A resumed run restores the newest complete checkpoint ([`RunDir::resume_point`]: newer,
//! incomplete ones are reported and passed over) and continues at the following step; because
//! every random draw derives from (seed, step, node name), it reproduces the uninterrupted run.
//! A run killed before its first checkpoint resumes from step 1. A run that starts at step 1
//! first runs the pass before training ([`Session::run_before_train`]: an `eval` node's
//! `before_train`), logged as step 0. SIGTERM (how clusters preempt
//! a job) stops the run at the next step boundary with a checkpoint of that step, whatever
//! `checkpoint_every` says, and the process exits 0; `--resume` continues it. The processes of
//! a multi-process run vote after every step ([`crate::placement::stop_voted`]): a SIGTERM to any
//! of them stops all after the same step.

use crate::device::{DeviceSpec, device_list};
use crate::graph::Graph;
use crate::placement::Cluster;
use crate::plan::{DeviceProbe, Plan};
use crate::progress::{Progress, ProgressMode};
use crate::rundir::{RUN_FILE, RunDir, write_atomic};
use crate::session::{Session, StepReport};
use crate::tensorboard::EventWriter;
use anyhow::Context as _;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The plan a run was checked against, in its run directory.
pub const PLAN_FILE: &str = "plan.json";

/// How to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The graph file (recorded in `run.json`; names the default run directory).
    pub graph_file: Option<PathBuf>,
    /// Exact run directory. Default: a new timestamped directory under `[run] out`, or under
    /// `runs/<graph file stem>`.
    pub out: Option<PathBuf>,
    /// Continue the run in `out` from its newest checkpoint.
    pub resume: bool,
    /// Replace a run already in `out`.
    pub force: bool,
    pub progress: ProgressMode,
    /// The processes of a multi-process run (`None`: this process is the whole run).
    pub cluster: Option<Cluster>,
    /// The graph's memory and time plan: written to `plan.json`, and the source of the step's
    /// `perf/*` metrics (`None`: neither).
    pub plan: Option<PlanRecord>,
}

/// What a run keeps of its plan ([`crate::plan`]): the JSON it writes once, the FLOPs per step
/// and the devices' peak throughput for the MFU, and the probe that reads device memory.
#[derive(Clone)]
pub struct PlanRecord {
    pub json: serde_json::Value,
    pub step_flops: f64,
    /// Σ over the run's devices of their throughput in the precision the step mostly runs in.
    pub peak_flops: Option<f64>,
    pub probe: Option<Arc<dyn DeviceProbe>>,
}

impl std::fmt::Debug for PlanRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanRecord")
            .field("step_flops", &self.step_flops)
            .field("peak_flops", &self.peak_flops)
            .finish_non_exhaustive()
    }
}

impl PlanRecord {
    pub fn of(plan: &Plan, probe: Option<Arc<dyn DeviceProbe>>) -> Self {
        let peak: Option<f64> = plan
            .devices
            .iter()
            .map(|(_, i)| i.flops_per_second(&plan.flops_precision))
            .sum();
        PlanRecord {
            json: crate::plan::to_json(plan),
            step_flops: plan.step_flops,
            peak_flops: peak.filter(|p| *p > 0.0),
            probe,
        }
    }

    /// The step's `perf/*` metrics (verl's names): `perf/max_memory_allocated_gb` (the largest
    /// over the run's devices of what the probe reports: a CPU device's is the process's resident
    /// peak), `perf/cpu_memory_used_gb` (the process's resident set now) and `perf/mfu`
    /// (the plan's FLOPs over the step's time × the devices' peak throughput), each when known.
    fn metrics(&self, devices: &[DeviceSpec], step_seconds: Option<f64>) -> Vec<(String, f64)> {
        const GB: f64 = (1u64 << 30) as f64;
        let mut out = Vec::new();
        let allocated = devices
            .iter()
            .filter_map(|&d| self.probe.as_ref()?.max_memory_allocated(d))
            .max();
        if let Some(b) = allocated {
            out.push(("perf/max_memory_allocated_gb".into(), b as f64 / GB));
        }
        if let Some(b) = crate::plan::process_rss_bytes() {
            out.push(("perf/cpu_memory_used_gb".into(), b as f64 / GB));
        }
        if let (Some(peak), Some(t)) = (self.peak_flops, step_seconds)
            && t > 0.0
        {
            out.push(("perf/mfu".into(), self.step_flops / (t * peak)));
        }
        out
    }
}

#[derive(Clone, Debug)]
pub struct RunSummary {
    pub run_dir: PathBuf,
    pub first_step: u64,
    pub steps: u64,
    pub seconds: f64,
    pub plot: Option<PathBuf>,
    /// Warnings printed on the way (checkpoints passed over on resume, ...).
    pub warnings: Vec<String>,
    /// The step after which a SIGTERM stopped the run (its checkpoint written), if one did.
    pub stopped_after: Option<u64>,
}

/// Where a new run goes when `--out` is not given. Each process of a multi-process run writes
/// its own directory: `rank` (given when the run has several processes) adds a `-rankR` suffix.
pub fn default_run_dir(graph: &Graph, graph_file: Option<&Path>, rank: Option<usize>) -> PathBuf {
    let base = match &graph.run.out {
        Some(o) => o.clone(),
        None => {
            let stem = graph_file
                .and_then(|p| p.file_stem())
                .map_or_else(|| "run".to_string(), |s| s.to_string_lossy().to_string());
            Path::new("runs").join(stem)
        }
    };
    let fresh = RunDir::fresh_path(&base);
    let Some(rank) = rank else {
        return fresh;
    };
    let name = fresh
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().to_string());
    let mut p = base.join(format!("{name}-rank{rank}"));
    let mut k = 2;
    while p.exists() {
        p = base.join(format!("{name}-{k}-rank{rank}"));
        k += 1;
    }
    p
}

/// Runs the graph to its last step (or to a SIGTERM), then lets the run's processes know how it
/// ended ([`crate::placement::run_ended`]).
pub fn run(graph: Graph, opts: &RunOptions) -> anyhow::Result<RunSummary> {
    let out = run_steps(graph, opts);
    let failure = out.as_ref().err().map(|e| format!("{e:#}"));
    crate::placement::run_ended(failure.as_deref());
    out
}

fn run_steps(graph: Graph, opts: &RunOptions) -> anyhow::Result<RunSummary> {
    let devices = graph.devices.clone();
    let rank = opts.cluster.as_ref().map(|c| c.rank);
    let dir = match (&opts.out, opts.resume) {
        (Some(p), true) => {
            let dir = RunDir::open(p)?;
            dir.remove_leftovers()?;
            dir
        }
        (None, true) => anyhow::bail!("--resume needs the run directory"),
        (Some(p), false) => RunDir::create(p, opts.force)?,
        (None, false) => {
            let path = default_run_dir(&graph, opts.graph_file.as_deref(), rank);
            RunDir::create(&path, false)?
        }
    };
    let total = graph.run.steps;
    let every = graph.run.checkpoint_every;
    let keep = match graph.run.keep_checkpoints {
        0 => usize::MAX,
        k => k as usize,
    };
    let plot = graph.run.plot;
    // Opened before anything is built, so that a tracker that cannot write stops the run now.
    let mut trackers = Trackers::open(&graph.run, &dir.path)?;
    let mut session = Session::build(graph, opts.cluster.clone(), Some(dir.path.clone()))?;
    // Written once the graph has built, so that a failed build (a missing model directory, ...)
    // leaves no "run" behind that would block the next attempt; atomically, so that a kill
    // leaves a graph `--resume` can compile.
    write_atomic(&dir.graph_file(), session.graph.resolved.as_bytes())
        .with_context(|| format!("writing {}", dir.graph_file().display()))?;
    let run_info = serde_json::json!({
        "graph_file": opts.graph_file.as_ref().map(|p| p.display().to_string()),
        "devices": device_list(&devices),
        "rank": rank.unwrap_or(0),
        "world": opts.cluster.as_ref().map_or(1, |c| c.world),
        "flowrl_version": env!("CARGO_PKG_VERSION"),
        "steps": session.graph.run.steps,
        "seed": session.graph.run.seed,
    });
    write_atomic(
        &dir.path.join(RUN_FILE),
        serde_json::to_string_pretty(&run_info)?.as_bytes(),
    )?;
    if let Some(p) = &opts.plan {
        write_atomic(
            &dir.path.join(PLAN_FILE),
            serde_json::to_string_pretty(&p.json)?.as_bytes(),
        )?;
    }

    let mut first = 0;
    let mut warnings = Vec::new();
    let mut resumed_from = None;
    if opts.resume {
        match dir.resume_point()? {
            Some(point) => {
                for w in &point.warnings {
                    eprintln!("warning: {w}");
                }
                warnings.extend(point.warnings);
                let state = session.load_checkpoint(&point.path)?;
                first = state.completed_steps;
                resumed_from = Some(point.path);
            }
            None => {
                let w = format!(
                    "{} holds no checkpoint yet: the run starts over at step 1",
                    dir.path.display()
                );
                eprintln!("warning: {w}");
                warnings.push(w);
            }
        }
    }
    let mut metrics = dir.metrics_writer(first)?;
    let mut progress = Progress::new(opts.progress, first, total);
    if let Some(ckpt) = &resumed_from {
        progress.message(&format!(
            "resuming {} at step {}/{total} from {}",
            dir.path.display(),
            first + 1,
            ckpt.display()
        ));
    } else if opts.resume {
        progress.message(&format!(
            "resuming {} at step 1/{total}",
            dir.path.display()
        ));
    } else {
        progress.message(&format!("run directory: {}", dir.path.display()));
    }
    // SIGTERM sets the flag instead of ending the process, until the run returns.
    let preempted = Arc::new(AtomicBool::new(false));
    let watch = signal_hook::flag::register(signal_hook::consts::SIGTERM, preempted.clone())
        .context("watching for SIGTERM")?;
    let _unwatch = Unregister(watch);
    let mut stopped_after = None;
    if first == 0 {
        trackers.graph(&session.graph.resolved)?;
    }
    if first == 0
        && let Some(report) = session
            .run_before_train(&mut |e| progress.event(e))
            .inspect_err(|_| progress.finish())?
    {
        for n in &report.nodes {
            for w in &n.warnings {
                progress.message(&format!("warning: node `{}`: {w}", n.name));
            }
        }
        metrics.write(0, &report.metrics)?;
        trackers.step(0, &report.metrics, &report)?;
        progress.message(&crate::progress::before_train_line(&report));
    }
    for step in first..total {
        let mut report = session
            .run_step(step, &mut |e| progress.event(e))
            .inspect_err(|_| progress.finish())?;
        if let Some(p) = &opts.plan {
            let seconds = report.metrics.get("timing_s/step").copied();
            report.metrics.extend(p.metrics(&devices, seconds));
        }
        let world = opts.cluster.as_ref().map_or(1, |c| c.world);
        report
            .metrics
            .extend(throughput(&report.metrics, devices.len() * world));
        for n in &report.nodes {
            for w in &n.warnings {
                progress.message(&format!("warning: node `{}`: {w}", n.name));
            }
        }
        metrics.write(step + 1, &report.metrics)?;
        trackers.step(step + 1, &report.metrics, &report)?;
        progress.step_done(&report);
        // Every process of a multi-process run votes after every step, so that a SIGTERM to
        // any of them stops all after the same step.
        let asked = preempted.load(Ordering::SeqCst);
        let stop = crate::placement::stop_voted(step + 1, asked)? && step + 1 < total;
        if stop || (every > 0 && ((step + 1) % every == 0 || step + 1 == total)) {
            session.save_checkpoint(&dir.checkpoint(step + 1), step + 1)?;
            dir.prune_checkpoints(keep, step + 1)?;
        }
        if stop {
            let whose = if asked {
                "SIGTERM"
            } else {
                "SIGTERM to another process of the run"
            };
            progress.message(&format!(
                "{whose}: stopped after step {}/{total} with its checkpoint; continue with \
                 `flowrl run --resume {}`",
                step + 1,
                dir.path.display()
            ));
            stopped_after = Some(step + 1);
            break;
        }
    }
    progress.finish();
    let plot_path = if plot {
        match crate::plot::plot_run(&dir.path, None) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("warning: could not draw plots: {e:#}");
                None
            }
        }
    } else {
        None
    };
    Ok(RunSummary {
        run_dir: dir.path.clone(),
        first_step: first,
        steps: total,
        seconds: progress.elapsed().as_secs_f64(),
        plot: plot_path,
        warnings,
        stopped_after,
    })
}

/// verl's `perf/time_per_step` (the step's seconds) and, when a node reported
/// `perf/total_num_tokens`, `perf/throughput`: those tokens per second per device (verl's
/// `compute_throughout_metrics`, over the run's `devices` in all its processes).
fn throughput(metrics: &BTreeMap<String, f64>, devices: usize) -> Vec<(String, f64)> {
    let Some(&seconds) = metrics.get("timing_s/step") else {
        return Vec::new();
    };
    let mut out = vec![("perf/time_per_step".to_string(), seconds)];
    if let Some(&tokens) = metrics.get("perf/total_num_tokens")
        && seconds > 0.0
    {
        out.push((
            "perf/throughput".into(),
            tokens / (seconds * devices.max(1) as f64),
        ));
    }
    out
}

/// Where the metrics go besides `metrics.jsonl` (`[run] tracking`).
struct Trackers {
    /// Event files under the run directory's `tensorboard/`.
    tensorboard: Option<EventWriter>,
}

impl Trackers {
    fn open(run: &crate::graph::RunConfig, run_dir: &Path) -> anyhow::Result<Trackers> {
        let tensorboard = match run.tensorboard() {
            true => Some(
                EventWriter::create(&run_dir.join(crate::rundir::TENSORBOARD_DIR))
                    .context("[run] tracking = tensorboard")?,
            ),
            false => None,
        };
        Ok(Trackers { tensorboard })
    }

    /// The graph, once at the start of a run: its resolved TOML as text.
    fn graph(&mut self, resolved: &str) -> anyhow::Result<()> {
        if let Some(tb) = &mut self.tensorboard {
            tb.text("graph", 0, &format!("```toml\n{resolved}\n```"))?;
        }
        Ok(())
    }

    /// A step's metrics line and the texts and pictures its nodes logged.
    fn step(
        &mut self,
        step: u64,
        metrics: &BTreeMap<String, f64>,
        report: &StepReport,
    ) -> anyhow::Result<()> {
        let Some(tb) = &mut self.tensorboard else {
            return Ok(());
        };
        tb.scalars(step, metrics.iter().map(|(k, v)| (k, *v)))?;
        for media in report.nodes.iter().flat_map(|n| &n.media) {
            match media {
                crate::Media::Text { tag, markdown } => tb.text(tag, step, markdown)?,
                crate::Media::Image {
                    tag,
                    png,
                    width,
                    height,
                } => tb.image(tag, step, png, *width, *height, 3)?,
            }
        }
        Ok(())
    }
}

/// Restores SIGTERM's default action when the run returns.
struct Unregister(signal_hook::SigId);

impl Drop for Unregister {
    fn drop(&mut self) {
        signal_hook::low_level::unregister(self.0);
    }
}
