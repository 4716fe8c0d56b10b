//! A built graph: resources and nodes constructed, ready to run steps, save and restore checkpoints.
//!
//! [`Session`] is the engine as a library: tests and embedders drive steps directly; the `run` module
//! adds the run directory, metrics file, progress and the step loop on top.
//!
//! Checkpoint layout (`<dir>` is written as `.tmp-<name>` and renamed when complete):
//! ```text
//! <dir>/run_state.json          {"completed_steps": N, "seed": S, "nodes": {name: kind}, "resources": {name: kind}}
//! <dir>/nodes/<node>.json       each node's save_state
//! <dir>/resources/<resource>/   each resource kind's save hook (a model writes a HF layout)
//! <dir>/manifest.json           every other file's size and CRC-32, written last (see `rundir`)
//! ```
//! A restore first checks the checkpoint against the graph — same seed, same node and resource
//! names and kinds (parameters may differ: a resume may change a learning rate or `--steps`), no
//! state of a node or resource the graph lacks — and only then loads anything.

use crate::context::BuildContext;
use crate::device::DeviceSpec;
use crate::graph::Graph;
use crate::node::Node;
use crate::placement::{Cluster, Placement};
use crate::resource::Resources;
use crate::rundir::{Manifest, RUN_STATE_FILE, read_small};
use crate::scheduler::{self, Event, NodeReport, StepEnv, WorkerPool};
use anyhow::{Context as _, bail, ensure};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// The result of one step: merged metrics (node metrics in topological order, then
/// `timing_s/<key>` summed per key, then `timing_s/step`) and per-node reports.
#[derive(Clone, Debug)]
pub struct StepReport {
    /// 0-based step index.
    pub step: u64,
    pub metrics: BTreeMap<String, f64>,
    pub nodes: Vec<NodeReport>,
}

/// The state saved in `run_state.json`: how far the run got, and the graph it belongs to.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RunState {
    pub completed_steps: u64,
    pub seed: u64,
    /// The graph's nodes, name → kind (absent in checkpoints of a flowrl before manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<BTreeMap<String, String>>,
    /// The graph's resources, name → kind (absent like `nodes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<BTreeMap<String, String>>,
}

impl RunState {
    /// The state of `graph` after `completed_steps` steps.
    pub fn of(graph: &Graph, completed_steps: u64) -> Self {
        let (nodes, resources) = graph_summary(graph);
        RunState {
            completed_steps,
            seed: graph.run.seed,
            nodes: Some(nodes),
            resources: Some(resources),
        }
    }

    /// Parses the text of a `run_state.json`.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        serde_json::from_str(text).context("run_state.json is not valid")
    }

    /// How the graph this state was saved with differs from `graph` (names and kinds of nodes
    /// and resources); empty when they agree or the state predates the summary.
    pub fn graph_differences(&self, graph: &Graph) -> Vec<String> {
        let (nodes, resources) = graph_summary(graph);
        let mut out = Vec::new();
        for (what, saved, now) in [
            ("node", &self.nodes, nodes),
            ("resource", &self.resources, resources),
        ] {
            let Some(saved) = saved else { continue };
            for (name, kind) in saved {
                match now.get(name) {
                    None => out.push(format!(
                        "{what} `{name}` (kind `{kind}`) is not in the graph"
                    )),
                    Some(k) if k != kind => out.push(format!(
                        "{what} `{name}` has kind `{kind}` in the checkpoint, `{k}` in the graph"
                    )),
                    Some(_) => {}
                }
            }
            for (name, kind) in &now {
                if !saved.contains_key(name) {
                    out.push(format!(
                        "the graph's {what} `{name}` (kind `{kind}`) is not in the checkpoint"
                    ));
                }
            }
        }
        out
    }
}

/// Node and resource names → kinds.
fn graph_summary(graph: &Graph) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let nodes = graph
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.kind.name().to_string()))
        .collect();
    let resources = graph
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.kind.name().to_string()))
        .collect();
    (nodes, resources)
}

pub struct Session {
    pub graph: Arc<Graph>,
    nodes: Vec<Option<Box<dyn Node>>>,
    resources: Arc<Resources>,
    placements: Vec<Placement>,
    /// Each node's first device (what its `StepContext::device` reports).
    first_devices: Vec<DeviceSpec>,
    pool: WorkerPool,
    run_dir: Option<PathBuf>,
}

impl Session {
    /// Builds resources (in dependency order) and nodes for this process of the run described by
    /// `cluster` (`None`: this process is the whole run), on the devices the graph was compiled
    /// for ([`Graph::devices`]). Each node gets its [`Placement`]: a node pinned with `device`
    /// runs on that device; a data-parallel kind runs on all of the devices; any other kind on
    /// the first, and a resource on its `device` or the first. The compiler checked the pins and
    /// the kinds' constraints for these devices and for [`Graph::world`] processes, so a cluster
    /// of another size is refused.
    pub fn build(
        graph: Graph,
        cluster: Option<Cluster>,
        run_dir: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        let world = cluster.as_ref().map_or(1, |c| c.world);
        if let Some(c) = &cluster
            && c.rank >= c.world
        {
            bail!("rank {} is not below the world size {}", c.rank, c.world);
        }
        if world != graph.world {
            bail!(
                "the graph was checked for {} process(es), but this run has {world}: compile it \
                 for the run's processes (`--world {world}`)",
                graph.world
            );
        }
        let devices = graph.devices.clone();
        let graph = Arc::new(graph);
        let seed = graph.run.seed;
        let total_steps = graph.run.steps;
        let mut resources = Resources::default();
        let mut built = vec![false; graph.resources.len()];
        while built.iter().any(|b| !b) {
            let next = (0..graph.resources.len())
                .find(|&i| !built[i] && graph.resources[i].depends.iter().all(|&d| built[d]))
                .context("resources refer to each other in a cycle")?;
            let r = &graph.resources[next];
            let device = r.device_in(&devices);
            let ctx = BuildContext {
                node: r.name.clone(),
                device,
                placement: Placement {
                    devices: vec![device],
                    cluster: cluster.clone(),
                },
                seed,
                total_steps,
                resources: Arc::new(resources.clone()),
                run_dir: run_dir.clone(),
                graph: Some(graph.clone()),
            };
            let value = r
                .kind
                .build(&r.params, &ctx)
                .with_context(|| format!("building {} resource `{}`", r.kind.name(), r.name))?;
            resources.insert(r.name.clone(), r.kind.clone(), value);
            built[next] = true;
        }
        let resources = Arc::new(resources);
        let placements: Vec<Placement> = graph
            .nodes
            .iter()
            .map(|n| Placement {
                devices: n.devices(&devices),
                cluster: cluster.clone(),
            })
            .collect();
        let first_devices: Vec<DeviceSpec> = placements.iter().map(|p| p.devices[0]).collect();
        let mut nodes = Vec::with_capacity(graph.nodes.len());
        for (i, n) in graph.nodes.iter().enumerate() {
            let ctx = BuildContext {
                node: n.name.clone(),
                device: first_devices[i],
                placement: placements[i].clone(),
                seed,
                total_steps,
                resources: resources.clone(),
                run_dir: run_dir.clone(),
                graph: Some(graph.clone()),
            };
            let node = n.kind.build(&n.params, &ctx).with_context(|| {
                format!("building node `{}` (kind `{}`)", n.name, n.kind.name())
            })?;
            nodes.push(Some(node));
        }
        // The processes of a multi-process run pair their collective operations by order, so
        // each runs its nodes one at a time in the graph's topological order (the same order in
        // every process); replicas within a process still run in parallel inside their node.
        let workers = match graph.run.workers {
            _ if world > 1 => 1,
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            w => w as usize,
        }
        .min(graph.nodes.len().max(1));
        Ok(Session {
            graph,
            nodes,
            resources,
            placements,
            first_devices,
            pool: WorkerPool::new(workers),
            run_dir,
        })
    }

    pub fn resources(&self) -> &Arc<Resources> {
        &self.resources
    }

    /// Where each node runs, by node index.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// Runs step `step` (0-based).
    pub fn run_step(
        &mut self,
        step: u64,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> anyhow::Result<StepReport> {
        let start = Instant::now();
        let mut report = self.run_pass(step, false, on_event)?;
        report
            .metrics
            .insert("timing_s/step".into(), start.elapsed().as_secs_f64());
        Ok(report)
    }

    /// The pass before the first step ([`crate::Node::before_train`]): the nodes that evaluate
    /// the initial weights run, the others are skipped. `None` when no node reported a metric.
    pub fn run_before_train(
        &mut self,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> anyhow::Result<Option<StepReport>> {
        let report = self.run_pass(0, true, on_event)?;
        let reported = report.nodes.iter().any(|n| !n.metrics.is_empty());
        Ok(reported.then_some(report))
    }

    /// Runs the graph once: step `step`, or the pass before the first step. The metrics are the
    /// nodes' and `timing_s/<key>`, the seconds of the nodes that ran summed per timing key.
    fn run_pass(
        &mut self,
        step: u64,
        before_train: bool,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> anyhow::Result<StepReport> {
        let env = StepEnv {
            step,
            before_train,
            media: self.graph.run.tensorboard(),
            total_steps: self.graph.run.steps,
            seed: self.graph.run.seed,
            devices: &self.first_devices,
            resources: &self.resources,
            run_dir: self.run_dir.as_ref(),
        };
        let reports =
            scheduler::run_step(&self.pool, &self.graph, &mut self.nodes, &env, on_event)?;
        let mut metrics = BTreeMap::new();
        for r in &reports {
            for (k, v) in &r.metrics {
                metrics.insert(k.clone(), *v);
            }
        }
        for r in &reports {
            if r.skipped {
                continue;
            }
            let key = &self.graph.nodes[self.graph.node_id(&r.name).expect("known")].timing_key;
            *metrics.entry(format!("timing_s/{key}")).or_insert(0.0) += r.seconds;
        }
        Ok(StepReport {
            step,
            metrics,
            nodes: reports,
        })
    }

    /// Writes a checkpoint after `completed_steps` steps into `dir` (atomically: a temporary
    /// sibling, its manifest written last and every file synced, is renamed into place).
    pub fn save_checkpoint(&self, dir: &Path, completed_steps: u64) -> anyhow::Result<()> {
        let name = dir
            .file_name()
            .context("checkpoint path has no file name")?
            .to_string_lossy()
            .to_string();
        let parent = dir.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent)?;
        let tmp = parent.join(format!("{}{name}", crate::rundir::TMP_PREFIX));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(tmp.join("nodes"))?;
        let state = RunState::of(&self.graph, completed_steps);
        std::fs::write(
            tmp.join(RUN_STATE_FILE),
            serde_json::to_string_pretty(&state)?,
        )?;
        for (i, n) in self.graph.nodes.iter().enumerate() {
            let node = self.nodes[i]
                .as_ref()
                .expect("nodes are home between steps");
            if let Some(s) = node
                .save_state()
                .with_context(|| format!("saving the state of node `{}`", n.name))?
            {
                std::fs::write(
                    tmp.join("nodes").join(format!("{}.json", n.name)),
                    serde_json::to_string_pretty(&s)?,
                )?;
            }
        }
        for (name, entry) in self.resources.iter() {
            let rdir = tmp.join("resources").join(name);
            std::fs::create_dir_all(&rdir)?;
            entry
                .kind
                .save(entry.value.as_ref(), &rdir)
                .with_context(|| format!("saving {} resource `{name}`", entry.kind.name()))?;
        }
        Manifest::write(&tmp)
            .with_context(|| format!("writing the manifest of {}", tmp.display()))?;
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::rename(&tmp, dir)
            .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
        // The rename itself is durable once the directory holding it is synced.
        File::open(parent).and_then(|d| d.sync_all()).ok();
        Ok(())
    }

    /// Restores a checkpoint written by [`Session::save_checkpoint`]; returns its run state.
    /// Everything is checked against the graph (see the module doc) and every node state parsed
    /// before anything is loaded; the caller checks the files against the manifest
    /// ([`crate::rundir::check_checkpoint`]).
    pub fn load_checkpoint(&mut self, dir: &Path) -> anyhow::Result<RunState> {
        self.restore(dir)
            .with_context(|| format!("restoring checkpoint {}", dir.display()))
    }

    fn restore(&mut self, dir: &Path) -> anyhow::Result<RunState> {
        let state = read_small(&dir.join(RUN_STATE_FILE)).and_then(|t| RunState::parse(&t))?;
        if state.seed != self.graph.run.seed {
            bail!(
                "it was written with seed {}, but the graph has seed {}",
                state.seed,
                self.graph.run.seed
            );
        }
        let differences = state.graph_differences(&self.graph);
        if !differences.is_empty() {
            bail!(
                "{RUN_STATE_FILE} belongs to another graph: {}",
                differences.join("; ")
            );
        }
        for entry in read_dir_if_any(&dir.join("resources"))? {
            let file = entry.to_string_lossy().to_string();
            ensure!(
                self.resources.iter().any(|(name, _)| *name == file),
                "resources/{file} holds the state of resource `{file}`, which the graph does not \
                 have"
            );
        }
        let mut node_states = Vec::new();
        for entry in read_dir_if_any(&dir.join("nodes"))? {
            let file = entry.to_string_lossy().to_string();
            let node = file
                .strip_suffix(".json")
                .and_then(|name| self.graph.node_id(name));
            let Some(i) = node else {
                bail!(
                    "nodes/{file} is not the state of a node of the graph (its nodes: {})",
                    self.graph
                        .nodes
                        .iter()
                        .map(|n| n.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            };
            let path = dir.join("nodes").join(&file);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("nodes/{file} is not valid JSON"))?;
            node_states.push((i, v));
        }
        for (name, entry) in self.resources.iter() {
            let rdir = dir.join("resources").join(name);
            if rdir.exists() {
                entry
                    .kind
                    .load(entry.value.as_ref(), &rdir)
                    .with_context(|| {
                        format!("restoring {} resource `{name}`", entry.kind.name())
                    })?;
            }
        }
        node_states.sort_by_key(|(i, _)| *i);
        for (i, v) in node_states {
            self.nodes[i]
                .as_mut()
                .expect("nodes are home between steps")
                .load_state(v)
                .with_context(|| {
                    format!("restoring the state of node `{}`", self.graph.nodes[i].name)
                })?;
        }
        Ok(state)
    }
}

/// The names of a directory's entries, sorted; none when it does not exist.
fn read_dir_if_any(dir: &Path) -> anyhow::Result<Vec<std::ffi::OsString>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut names = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    names.sort();
    Ok(names)
}
