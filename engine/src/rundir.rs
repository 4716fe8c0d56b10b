//! The run directory: what a run leaves on disk, and the rules that keep it whole.
//!
//! ```text
//! <run>/graph.toml        the resolved graph (overrides applied): `--resume` compiles it again
//! <run>/run.json          what started the run (graph file, device, flowrl version)
//! <run>/metrics.jsonl     one JSON object per step, appended and flushed after each step
//! <run>/checkpoints/step_NNNNNN/   see `session` for the layout; the newest N are kept
//! <run>/plots.svg         the main curves, drawn at the end (and by `flowrl plot`)
//! <run>/tensorboard/      TensorBoard event files (`[run] tracking = ["tensorboard"]`)
//! <run>/generations/      the evaluation's logged responses (`eval.log_generations`)
//! ```
//! A directory that already holds a run is refused unless the caller resumes it or forces a fresh
//! start (which removes only the files listed above).
//!
//! A checkpoint is complete when its [`Manifest`] (`manifest.json`, written last: every file with
//! its size and CRC-32) matches its files. `--resume` takes the newest complete checkpoint and
//! says which newer ones it passed over and why ([`RunDir::resume_point`]); pruning never counts
//! or keeps an incomplete one. A checkpoint without a manifest, written by a flowrl before
//! manifests, is accepted with a warning (its run_state.json has no graph summary, which tells it
//! apart from a newer checkpoint whose manifest was lost).

use anyhow::{Context as _, bail, ensure};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

pub const GRAPH_FILE: &str = "graph.toml";
pub const RUN_FILE: &str = "run.json";
pub const METRICS_FILE: &str = "metrics.jsonl";
pub const CHECKPOINTS_DIR: &str = "checkpoints";
pub const PLOT_FILE: &str = "plots.svg";
/// TensorBoard's event files (`[run] tracking = ["tensorboard"]`).
pub const TENSORBOARD_DIR: &str = "tensorboard";
/// The evaluation's logged generations (`eval.log_generations`).
pub const GENERATIONS_DIR: &str = "generations";
/// A checkpoint's list of files, sizes and checksums (see [`Manifest`]).
pub const MANIFEST_FILE: &str = "manifest.json";
/// A checkpoint's run state (see [`crate::session::RunState`]).
pub const RUN_STATE_FILE: &str = "run_state.json";
/// The prefix of a checkpoint being written (renamed to `step_NNNNNN` when complete).
pub const TMP_PREFIX: &str = ".tmp-";

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
            for d in [CHECKPOINTS_DIR, TENSORBOARD_DIR, GENERATIONS_DIR] {
                let d = path.join(d);
                if d.exists() {
                    std::fs::remove_dir_all(&d)
                        .with_context(|| format!("removing {}", d.display()))?;
                }
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

    /// Every checkpoint directory (`step_NNNNNN`), complete or not, oldest first, as
    /// (completed steps, path).
    pub fn list_checkpoints(&self) -> Vec<(u64, PathBuf)> {
        let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(self.checkpoints())
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter(|e| e.path().is_dir())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                let n = name.strip_prefix("step_")?.parse().ok()?;
                Some((n, e.path()))
            })
            .collect();
        out.sort();
        out
    }

    /// The checkpoint `--resume` continues from: the newest one that is complete (its files
    /// match its manifest, checksums included), with a note on each newer one passed over.
    /// `Ok(None)` when the run has no checkpoint yet; an error naming each one's fault when
    /// none is complete.
    pub fn resume_point(&self) -> anyhow::Result<Option<ResumePoint>> {
        let all = self.list_checkpoints();
        if all.is_empty() {
            return Ok(None);
        }
        let mut passed = Vec::new();
        for (n, path) in all.iter().rev() {
            let name = checkpoint_name(path);
            match check_checkpoint(path, true) {
                Integrity::Complete => {
                    return Ok(Some(ResumePoint::new(*n, path, passed, None)));
                }
                Integrity::Unverified => {
                    let warning = format!(
                        "checkpoint {name} has no {MANIFEST_FILE} (written by a flowrl before \
                         checkpoint manifests): its files cannot be verified"
                    );
                    return Ok(Some(ResumePoint::new(*n, path, passed, Some(warning))));
                }
                Integrity::Incomplete(why) => {
                    passed.push(format!("checkpoint {name} is incomplete ({why})"))
                }
            }
        }
        bail!(
            "{} holds no complete checkpoint to resume from: {}\n\
             help: start the run over with `flowrl run --force`",
            self.checkpoints().display(),
            passed.join("; ")
        )
    }

    /// After checkpoint `latest` was written: removes leftovers of interrupted writes
    /// (`.tmp-*`), checkpoints after `latest` (incomplete ones a resume passed over) and
    /// incomplete ones before it (sizes checked against their manifests), then all but the
    /// newest `keep` of the rest. `latest` itself, complete by construction, is always kept.
    pub fn prune_checkpoints(&self, keep: usize, latest: u64) -> anyhow::Result<()> {
        // Renamed out of the way first, so that a process killed mid-removal leaves a temporary
        // directory (removed by the next prune or resume), never a half-removed checkpoint.
        let remove = |p: &Path| {
            let name = p
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().to_string());
            let doomed = p.with_file_name(format!("{TMP_PREFIX}removed-{name}"));
            std::fs::rename(p, &doomed)
                .and_then(|()| std::fs::remove_dir_all(&doomed))
                .with_context(|| format!("removing {}", p.display()))
        };
        self.remove_leftovers()?;
        let mut kept = Vec::new();
        for (n, p) in self.list_checkpoints() {
            let complete = n == latest
                || (n < latest && !matches!(check_checkpoint(&p, false), Integrity::Incomplete(_)));
            if complete {
                kept.push(p);
            } else {
                remove(&p)?;
            }
        }
        for p in kept.iter().take(kept.len().saturating_sub(keep.max(1))) {
            remove(p)?;
        }
        Ok(())
    }

    /// Removes what interrupted checkpoint writes and removals left (temporary directories).
    pub fn remove_leftovers(&self) -> anyhow::Result<()> {
        for e in std::fs::read_dir(self.checkpoints()).into_iter().flatten() {
            let e = e?;
            if e.file_name().to_string_lossy().starts_with(TMP_PREFIX) && e.path().is_dir() {
                std::fs::remove_dir_all(e.path())
                    .with_context(|| format!("removing {}", e.path().display()))?;
            }
        }
        Ok(())
    }

    /// Opens `metrics.jsonl` for appending, first dropping lines of steps after `keep_steps`
    /// (steps a killed run wrote after its last checkpoint, which a resume will run again); at
    /// `keep_steps` 0 every line, step 0 (the pass before training, run again) included.
    pub fn metrics_writer(&self, keep_steps: u64) -> anyhow::Result<MetricsWriter> {
        let path = self.metrics_file();
        if path.exists() {
            let kept: Vec<String> = read_lines(&path)?
                .into_iter()
                .filter(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .ok()
                        .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
                        .is_some_and(|s| keep_steps > 0 && s <= keep_steps)
                })
                .collect();
            let mut text = kept.join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            write_atomic(&path, text.as_bytes())?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(MetricsWriter { file })
    }
}

/// Where a resume continues (see [`RunDir::resume_point`]).
#[derive(Clone, Debug)]
pub struct ResumePoint {
    pub completed_steps: u64,
    pub path: PathBuf,
    /// What the user should read: newer checkpoints passed over and why, or that this one is
    /// unverified. Empty when the newest checkpoint is complete.
    pub warnings: Vec<String>,
}

impl ResumePoint {
    fn new(n: u64, path: &Path, passed: Vec<String>, unverified: Option<String>) -> Self {
        let mut warnings = Vec::new();
        if !passed.is_empty() {
            warnings.push(format!(
                "{}: resuming from {}",
                passed.join("; "),
                checkpoint_name(path)
            ));
        }
        warnings.extend(unverified);
        ResumePoint {
            completed_steps: n,
            path: path.to_path_buf(),
            warnings,
        }
    }
}

fn checkpoint_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().to_string(),
    )
}

/// What a checkpoint directory's files say about it.
#[derive(Clone, Debug, PartialEq)]
pub enum Integrity {
    /// Its files match its manifest.
    Complete,
    /// Written by a flowrl before manifests: nothing to check against.
    Unverified,
    /// Why it cannot be used (the first difference found).
    Incomplete(String),
}

/// Checks the checkpoint `dir` against its manifest: sizes always, CRC-32s when `checksums`.
pub fn check_checkpoint(dir: &Path, checksums: bool) -> Integrity {
    let manifest = dir.join(MANIFEST_FILE);
    if !manifest.is_file() {
        let run_state = dir.join(RUN_STATE_FILE);
        return match read_small(&run_state).and_then(|t| crate::session::RunState::parse(&t)) {
            Err(e) => Integrity::Incomplete(format!("{MANIFEST_FILE} is missing; {e:#}")),
            // Written by a flowrl that writes manifests: the manifest was lost.
            Ok(s) if s.nodes.is_some() => {
                Integrity::Incomplete(format!("{MANIFEST_FILE} is missing"))
            }
            Ok(_) => Integrity::Unverified,
        };
    }
    match read_small(&manifest)
        .and_then(|t| Manifest::parse(&t))
        .and_then(|m| m.verify(dir, checksums))
    {
        Ok(()) => Integrity::Complete,
        Err(e) => Integrity::Incomplete(format!("{e:#}")),
    }
}

/// Reads a file of run metadata (run_state.json, manifest.json), refusing one over 64 MiB (no
/// such file is near that size; a larger one is not what it claims to be).
pub fn read_small(path: &Path) -> anyhow::Result<String> {
    const MAX: u64 = 64 << 20;
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().to_string());
    let f = File::open(path).with_context(|| format!("{name} is missing or unreadable"))?;
    let mut text = String::new();
    f.take(MAX + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("{name} is not UTF-8 text"))?;
    ensure!(text.len() as u64 <= MAX, "{name} is larger than 64 MiB");
    Ok(text)
}

/// `manifest.json` of a checkpoint: every other file under the checkpoint directory with its
/// size in bytes and its CRC-32 (IEEE, as zlib and gzip compute it), written after all of them
/// so that its presence means the write finished.
///
/// ```json
/// {"format": 1, "files": [{"path": "run_state.json", "bytes": 97, "crc32": "5d41a8c2"}, ...]}
/// ```
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    pub files: Vec<ManifestEntry>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    /// Relative to the checkpoint directory, `/`-separated.
    pub path: String,
    pub bytes: u64,
    /// Eight lower-case hex digits.
    pub crc32: String,
}

impl Manifest {
    pub const FORMAT: u32 = 1;

    /// The manifest of the files under `dir` (the manifest itself excluded), each flushed to
    /// disk once read.
    pub fn of_dir(dir: &Path) -> anyhow::Result<Manifest> {
        let mut files = Vec::new();
        for rel in files_under(dir)? {
            if rel == MANIFEST_FILE {
                continue;
            }
            let path = dir.join(&rel);
            let mut f = File::open(&path).with_context(|| format!("reading {}", path.display()))?;
            let (bytes, crc) = crc32_of(&mut f, &path)?;
            f.sync_all()
                .with_context(|| format!("syncing {}", path.display()))?;
            files.push(ManifestEntry {
                path: rel,
                bytes,
                crc32: format!("{crc:08x}"),
            });
        }
        Ok(Manifest {
            format: Self::FORMAT,
            files,
        })
    }

    /// Writes the manifest of `dir` into it (see [`Manifest::of_dir`]).
    pub fn write(dir: &Path) -> anyhow::Result<()> {
        let m = Self::of_dir(dir)?;
        let path = dir.join(MANIFEST_FILE);
        let mut f = File::create(&path).with_context(|| format!("writing {}", path.display()))?;
        f.write_all(serde_json::to_string_pretty(&m)?.as_bytes())?;
        f.sync_all()?;
        Ok(())
    }

    /// Parses and checks a manifest's text: known format, safe relative paths, each listed once,
    /// eight-digit hex checksums.
    pub fn parse(text: &str) -> anyhow::Result<Manifest> {
        let m: Manifest =
            serde_json::from_str(text).with_context(|| format!("{MANIFEST_FILE} is not valid"))?;
        ensure!(
            m.format == Self::FORMAT,
            "{MANIFEST_FILE} has format {}, this flowrl reads format {}",
            m.format,
            Self::FORMAT
        );
        let mut seen = BTreeSet::new();
        for e in &m.files {
            let safe = !e.path.is_empty()
                && !e.path.starts_with('/')
                && !e.path.contains('\\')
                && e.path
                    .split('/')
                    .all(|c| !c.is_empty() && c != "." && c != "..");
            ensure!(
                safe,
                "{MANIFEST_FILE} lists `{}`, not a path inside the checkpoint",
                e.path
            );
            ensure!(
                seen.insert(&e.path),
                "{MANIFEST_FILE} lists `{}` twice",
                e.path
            );
            ensure!(
                e.crc32.len() == 8 && u32::from_str_radix(&e.crc32, 16).is_ok(),
                "{MANIFEST_FILE}: `{}` has checksum `{}`, not eight hex digits",
                e.path,
                e.crc32
            );
        }
        Ok(m)
    }

    /// The first difference between the manifest and the files under `dir`: a listed file
    /// missing or of another size, with `checksums` another CRC-32, or a file it does not list.
    pub fn verify(&self, dir: &Path, checksums: bool) -> anyhow::Result<()> {
        for e in &self.files {
            let path = dir.join(&e.path);
            let Ok(meta) = std::fs::metadata(&path) else {
                bail!("{} is missing", e.path);
            };
            ensure!(
                meta.len() == e.bytes,
                "{}: {} bytes, manifest says {}",
                e.path,
                meta.len(),
                e.bytes
            );
            if checksums {
                let mut f =
                    File::open(&path).with_context(|| format!("reading {}", path.display()))?;
                let (_, crc) = crc32_of(&mut f, &path)?;
                let crc = format!("{crc:08x}");
                ensure!(
                    crc == e.crc32,
                    "{}: CRC-32 {crc}, manifest says {} (the contents changed)",
                    e.path,
                    e.crc32
                );
            }
        }
        let listed: BTreeSet<&str> = self.files.iter().map(|e| e.path.as_str()).collect();
        for rel in files_under(dir)? {
            ensure!(
                rel == MANIFEST_FILE || listed.contains(rel.as_str()),
                "{rel} is not in the manifest"
            );
        }
        Ok(())
    }
}

/// The files under `dir`, relative and `/`-separated, sorted.
fn files_under(dir: &Path) -> anyhow::Result<Vec<String>> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) -> anyhow::Result<()> {
        for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().to_string();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            if e.file_type()?.is_dir() {
                walk(&e.path(), &rel, out)?;
            } else {
                out.push(rel);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out)?;
    out.sort();
    Ok(out)
}

/// Size and CRC-32 of the file `f` (at `path`), read in 1 MiB pieces.
fn crc32_of(f: &mut File, path: &Path) -> anyhow::Result<(u64, u32)> {
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((n, h.finalize()))
}

/// Writes `bytes` to `path` through a temporary sibling renamed into place, so that a kill leaves
/// either the old file or the new one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .context("no file name")?
        .to_string_lossy()
        .to_string();
    let tmp = path.with_file_name(format!("{TMP_PREFIX}{name}"));
    let mut f = File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
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
    /// Writes `{"step": step, ...metrics}`; `step` is 1-based (verl's `global_steps`), 0 for the
    /// pass before training. Non-finite values are written as `null`.
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

    /// A checkpoint directory of `n` steps with one file, its manifest written.
    fn checkpoint(rd: &RunDir, n: u64) -> PathBuf {
        let c = rd.checkpoint(n);
        std::fs::create_dir_all(c.join("nodes")).unwrap();
        std::fs::write(c.join("nodes/a.json"), format!("{{\"n\": {n}}}")).unwrap();
        Manifest::write(&c).unwrap();
        c
    }

    #[test]
    fn pruning_keeps_the_newest_complete_checkpoints_and_drops_damaged_and_stale_ones() {
        let dir = tempfile::tempdir().unwrap();
        let rd = RunDir::create(&dir.path().join("r"), false).unwrap();
        let c: Vec<PathBuf> = (1..=5).map(|n| checkpoint(&rd, n)).collect();
        std::fs::create_dir_all(rd.checkpoints().join(".tmp-step_000006")).unwrap();
        // Step 4 lost a file; step 5 is newer than the checkpoint just written (3): a resume
        // passed over it.
        std::fs::remove_file(c[3].join("nodes/a.json")).unwrap();
        std::fs::write(c[4].join("nodes/a.json"), "{}").unwrap();
        rd.prune_checkpoints(2, 3).unwrap();
        let left: Vec<u64> = rd.list_checkpoints().into_iter().map(|(n, _)| n).collect();
        assert_eq!(left, [2, 3]);
        assert!(!rd.checkpoints().join(".tmp-step_000006").exists());
        // keep = 1 keeps the one just written whatever else is there.
        rd.prune_checkpoints(1, 3).unwrap();
        let left: Vec<u64> = rd.list_checkpoints().into_iter().map(|(n, _)| n).collect();
        assert_eq!(left, [3]);
    }

    #[test]
    fn the_manifest_names_the_first_difference() {
        let dir = tempfile::tempdir().unwrap();
        let rd = RunDir::create(&dir.path().join("r"), false).unwrap();
        let c = checkpoint(&rd, 1);
        assert_eq!(check_checkpoint(&c, true), Integrity::Complete);
        std::fs::write(c.join("nodes/a.json"), "{\"n\": 2}").unwrap();
        assert_eq!(
            check_checkpoint(&c, false),
            Integrity::Complete,
            "sizes only"
        );
        let Integrity::Incomplete(why) = check_checkpoint(&c, true) else {
            panic!("a changed byte goes unnoticed");
        };
        assert!(why.starts_with("nodes/a.json: CRC-32 "), "{why}");
        assert!(why.ends_with("(the contents changed)"), "{why}");
        for (text, msg) in [
            (
                "{\"format\": 2, \"files\": []}",
                "has format 2, this flowrl reads format 1",
            ),
            (
                "{\"format\": 1, \"files\": [{\"path\": \"../x\", \"bytes\": 1, \"crc32\": \"00000000\"}]}",
                "lists `../x`, not a path inside the checkpoint",
            ),
            (
                "{\"format\": 1, \"files\": [{\"path\": \"x\", \"bytes\": 1, \"crc32\": \"0\"}]}",
                "`x` has checksum `0`, not eight hex digits",
            ),
        ] {
            let e = format!("{:#}", Manifest::parse(text).unwrap_err());
            assert!(e.contains(msg), "{e}");
        }
    }
}
