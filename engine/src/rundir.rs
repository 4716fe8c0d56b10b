//! The run directory: what a run leaves on disk, and the rules that keep it whole.
//!
//! ```text
//! <run>/graph.toml        the resolved graph (overrides applied): `--resume` compiles it again
//! <run>/run.json          what started the run (graph file, device, flowrl version)
//! <run>/metrics.jsonl     one JSON object per step, appended and flushed after each step
//! <run>/checkpoints/step_NNNNNN/   see `session` for the layout; the newest N are kept
//! <run>/plots.svg         the main curves, drawn at the end (and by `flowrl plot`)
//! ```
//! A directory that already holds a run is refused unless the caller resumes it or forces a fresh
//! start (which removes only the files listed above).

use anyhow::{Context as _, bail};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

pub const GRAPH_FILE: &str = "graph.toml";
pub const RUN_FILE: &str = "run.json";
pub const METRICS_FILE: &str = "metrics.jsonl";
pub const CHECKPOINTS_DIR: &str = "checkpoints";
pub const PLOT_FILE: &str = "plots.svg";

/// A run directory.
#[derive(Clone, Debug)]
pub struct RunDir {
    pub path: PathBuf,
}

impl RunDir {
    /// Whether `path` already holds a run.
    pub fn holds_run(path: &Path) -> bool {
        [GRAPH_FILE, RUN_FILE, METRICS_FILE, CHECKPOINTS_DIR]
            .iter()
            .any(|f| path.join(f).exists())
    }

    /// Prepares `path` for a new run. A directory holding another run is refused unless `force`,
    /// which removes that run's files.
    pub fn create(path: &Path, force: bool) -> anyhow::Result<RunDir> {
        if Self::holds_run(path) {
            if !force {
                bail!(
                    "{} already holds a run; continue it with `flowrl run --resume {}`, \
                     or replace it with `--force`",
                    path.display(),
                    path.display()
                );
            }
            for f in [GRAPH_FILE, RUN_FILE, METRICS_FILE, PLOT_FILE] {
                let p = path.join(f);
                if p.exists() {
                    std::fs::remove_file(&p)
                        .with_context(|| format!("removing {}", p.display()))?;
                }
            }
            let c = path.join(CHECKPOINTS_DIR);
            if c.exists() {
                std::fs::remove_dir_all(&c).with_context(|| format!("removing {}", c.display()))?;
            }
        }
        std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(RunDir {
            path: path.to_path_buf(),
        })
    }

    /// Opens a directory holding a run, for `--resume`.
    pub fn open(path: &Path) -> anyhow::Result<RunDir> {
        if !path.join(GRAPH_FILE).exists() {
            bail!(
                "{} does not hold a run (no {GRAPH_FILE}); start one with `flowrl run GRAPH --out {}`",
                path.display(),
                path.display()
            );
        }
        Ok(RunDir {
            path: path.to_path_buf(),
        })
    }

    /// A fresh directory under `base` named by the current UTC time (`20261129-114500`), with a
    /// `-2`, `-3`... suffix if that name is taken.
    pub fn fresh_path(base: &Path) -> PathBuf {
        let stamp = utc_stamp(std::time::SystemTime::now());
        let mut p = base.join(&stamp);
        let mut k = 2;
        while p.exists() {
            p = base.join(format!("{stamp}-{k}"));
            k += 1;
        }
        p
    }

    pub fn graph_file(&self) -> PathBuf {
        self.path.join(GRAPH_FILE)
    }
    pub fn metrics_file(&self) -> PathBuf {
        self.path.join(METRICS_FILE)
    }
    pub fn checkpoints(&self) -> PathBuf {
        self.path.join(CHECKPOINTS_DIR)
    }
    pub fn checkpoint(&self, completed_steps: u64) -> PathBuf {
        self.checkpoints()
            .join(format!("step_{completed_steps:06}"))
    }

    /// Complete checkpoints, oldest first, as (completed steps, path).
    pub fn list_checkpoints(&self) -> Vec<(u64, PathBuf)> {
        let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(self.checkpoints())
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                let n = name.strip_prefix("step_")?.parse().ok()?;
                e.path()
                    .join("run_state.json")
                    .exists()
                    .then(|| (n, e.path()))
            })
            .collect();
        out.sort();
        out
    }

    /// Removes all but the newest `keep` checkpoints.
    pub fn prune_checkpoints(&self, keep: usize) -> anyhow::Result<()> {
        let all = self.list_checkpoints();
        for (_, p) in all.iter().take(all.len().saturating_sub(keep)) {
            std::fs::remove_dir_all(p).with_context(|| format!("removing {}", p.display()))?;
        }
        Ok(())
    }

    /// Opens `metrics.jsonl` for appending, first dropping lines of steps after `keep_steps`
    /// (steps a killed run wrote after its last checkpoint, which a resume will run again).
    pub fn metrics_writer(&self, keep_steps: u64) -> anyhow::Result<MetricsWriter> {
        let path = self.metrics_file();
        if path.exists() {
            let kept: Vec<String> = read_lines(&path)?
                .into_iter()
                .filter(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .ok()
                        .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
                        .is_some_and(|s| s <= keep_steps)
                })
                .collect();
            let mut text = kept.join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            std::fs::write(&path, text)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(MetricsWriter { file })
    }
}

fn read_lines(path: &Path) -> anyhow::Result<Vec<String>> {
    let f = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(BufReader::new(f)
        .lines()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|l| !l.trim().is_empty())
        .collect())
}

/// Appends one JSON line per step and flushes it.
pub struct MetricsWriter {
    file: File,
}

impl MetricsWriter {
    /// Writes `{"step": step, ...metrics}`; `step` is 1-based (verl's `global_steps`). Non-finite
    /// values are written as `null`.
    pub fn write(&mut self, step: u64, metrics: &BTreeMap<String, f64>) -> anyhow::Result<()> {
        let mut obj = serde_json::Map::new();
        obj.insert("step".into(), step.into());
        for (k, v) in metrics {
            obj.insert(
                k.clone(),
                serde_json::Number::from_f64(*v).map_or(serde_json::Value::Null, Into::into),
            );
        }
        let line = serde_json::to_string(&serde_json::Value::Object(obj))?;
        writeln!(self.file, "{line}")?;
        self.file.flush()?;
        self.file.sync_data().ok();
        Ok(())
    }
}

/// Reads `metrics.jsonl`: one map per line (`null` values are skipped).
pub fn read_metrics(path: &Path) -> anyhow::Result<Vec<BTreeMap<String, f64>>> {
    read_lines(path)?
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let v: serde_json::Value = serde_json::from_str(l)
                .with_context(|| format!("{}:{}: not a JSON line", path.display(), i + 1))?;
            let obj = v
                .as_object()
                .with_context(|| format!("{}:{}: not a JSON object", path.display(), i + 1))?;
            Ok(obj
                .iter()
                .filter_map(|(k, v)| v.as_f64().map(|f| (k.clone(), f)))
                .collect())
        })
        .collect()
}

/// `YYYYmmdd-HHMMSS` in UTC (civil-from-days, H. Hinnant's algorithm).
pub fn utc_stamp(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamp_matches_known_dates() {
        let t = |s: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
        assert_eq!(utc_stamp(t(0)), "19700101-000000");
        assert_eq!(utc_stamp(t(951_782_400)), "20000229-000000");
        assert_eq!(utc_stamp(t(1_798_544_715)), "20261229-114515");
    }

    #[test]
    fn refuses_existing_run_unless_forced_and_truncates_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r");
        let rd = RunDir::create(&p, false).unwrap();
        std::fs::write(rd.graph_file(), "x").unwrap();
        let err = RunDir::create(&p, false).unwrap_err().to_string();
        assert!(err.contains("already holds a run"), "{err}");
        let mut w = rd.metrics_writer(0).unwrap();
        for s in 1..=3 {
            w.write(s, &BTreeMap::from([("a".to_string(), s as f64)]))
                .unwrap();
        }
        drop(w);
        rd.metrics_writer(2).unwrap();
        let m = read_metrics(&rd.metrics_file()).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1]["a"], 2.0);
        let rd = RunDir::create(&p, true).unwrap();
        assert!(!rd.graph_file().exists() && !rd.metrics_file().exists());
    }
}
