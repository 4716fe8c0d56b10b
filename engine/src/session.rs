//! A built graph: resources and nodes constructed, ready to run steps, save and restore checkpoints.
//!
//! [`Session`] is the engine as a library: tests and embedders drive steps directly; the `run` module
//! adds the run directory, metrics file, progress and the step loop on top.
//!
//! Checkpoint layout (`<dir>` is written as `.tmp-<name>` and renamed when complete):
//! ```text
//! <dir>/run_state.json          {"completed_steps": N, "seed": S}
//! <dir>/nodes/<node>.json       each node's save_state
//! <dir>/resources/<resource>/   each resource kind's save hook (a model writes a HF layout)
//! ```

use crate::context::BuildContext;
use crate::device::{DeviceSpec, device_list};
use crate::graph::Graph;
use crate::node::Node;
use crate::placement::{Cluster, Placement};
use crate::resource::Resources;
use crate::scheduler::{self, Event, NodeReport, StepEnv, WorkerPool};
use anyhow::{Context as _, bail};
use std::collections::BTreeMap;
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

/// The state saved in `run_state.json`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RunState {
    pub completed_steps: u64,
    pub seed: u64,
}

pub struct Session {
    pub graph: Graph,
    nodes: Vec<Option<Box<dyn Node>>>,
    resources: Arc<Resources>,
    placements: Vec<Placement>,
    /// Each node's first device (what its `StepContext::device` reports).
    first_devices: Vec<DeviceSpec>,
    pool: WorkerPool,
    run_dir: Option<PathBuf>,
}

impl Session {
    /// Builds resources (in dependency order) and nodes for a process whose devices are `devices`
    /// (usually `graph.devices.clone()`) in the run described by `cluster` (`None`: this process
    /// is the whole run). Each node gets its [`Placement`]: a node pinned with `device` runs on
    /// that device, which must be among `devices`; a data-parallel kind runs on all of
    /// `devices`; any other kind, and every resource, on the first.
    ///
    /// When `devices` or the cluster's size differ from what the graph was compiled for, the
    /// kinds' constraints are checked again for the new replica count (and fail the build).
    pub fn build(
        mut graph: Graph,
        devices: Vec<DeviceSpec>,
        cluster: Option<Cluster>,
        run_dir: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        let Some(&first) = devices.first() else {
            bail!("a session needs at least one device");
        };
        let world = cluster.as_ref().map_or(1, |c| c.world);
        if let Some(c) = &cluster
            && c.rank >= c.world
        {
            bail!("rank {} is not below the world size {}", c.rank, c.world);
        }
        for n in &graph.nodes {
            if let Some(d) = n.device
                && !devices.contains(&d)
            {
                bail!(
                    "node `{}` is placed on {d}, which is not one of the session's devices [{}]",
                    n.name,
                    device_list(&devices)
                );
            }
        }
        if devices != graph.devices || world != graph.world {
            graph.devices = devices.clone();
            graph.world = world;
            let errors: Vec<_> = crate::compile::check_constraints(&graph)
                .into_iter()
                .filter(crate::diagnostic::Diagnostic::is_error)
                .collect();
            if !errors.is_empty() {
                bail!(
                    "the graph does not fit {} replica(s) per node on [{}] × {world} process(es):\n{}",
                    devices.len(),
                    device_list(&devices),
                    crate::diagnostic::render(&errors, &graph.sources)
                );
            }
        }
        let seed = graph.run.seed;
        let total_steps = graph.run.steps;
        let mut resources = Resources::default();
        let mut built = vec![false; graph.resources.len()];
        while built.iter().any(|b| !b) {
            let next = (0..graph.resources.len())
                .find(|&i| !built[i] && graph.resources[i].depends.iter().all(|&d| built[d]))
                .context("resources refer to each other in a cycle")?;
            let r = &graph.resources[next];
            let ctx = BuildContext {
                node: r.name.clone(),
                device: first,
                placement: Placement {
                    devices: vec![first],
                    cluster: cluster.clone(),
                },
                seed,
                total_steps,
                resources: Arc::new(resources.clone()),
                run_dir: run_dir.clone(),
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
        let env = StepEnv {
            step,
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
        metrics.insert("timing_s/step".into(), start.elapsed().as_secs_f64());
        Ok(StepReport {
            step,
            metrics,
            nodes: reports,
        })
    }

    /// Writes a checkpoint after `completed_steps` steps into `dir` (atomically: a temporary
    /// sibling is renamed into place).
    pub fn save_checkpoint(&self, dir: &Path, completed_steps: u64) -> anyhow::Result<()> {
        let name = dir
            .file_name()
            .context("checkpoint path has no file name")?
            .to_string_lossy()
            .to_string();
        let parent = dir.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent)?;
        let tmp = parent.join(format!(".tmp-{name}"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(tmp.join("nodes"))?;
        let state = RunState {
            completed_steps,
            seed: self.graph.run.seed,
        };
        std::fs::write(
            tmp.join("run_state.json"),
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
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::rename(&tmp, dir)
            .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
        Ok(())
    }

    /// Restores a checkpoint written by [`Session::save_checkpoint`]; returns its run state.
    pub fn load_checkpoint(&mut self, dir: &Path) -> anyhow::Result<RunState> {
        let text = std::fs::read_to_string(dir.join("run_state.json"))
            .with_context(|| format!("reading {}", dir.join("run_state.json").display()))?;
        let state: RunState = serde_json::from_str(&text)?;
        if state.seed != self.graph.run.seed {
            bail!(
                "checkpoint {} was written with seed {}, but the graph has seed {}",
                dir.display(),
                state.seed,
                self.graph.run.seed
            );
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
        for (i, n) in self.graph.nodes.iter().enumerate() {
            let f = dir.join("nodes").join(format!("{}.json", n.name));
            if f.exists() {
                let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f)?)?;
                self.nodes[i]
                    .as_mut()
                    .expect("nodes are home between steps")
                    .load_state(v)
                    .with_context(|| format!("restoring the state of node `{}`", n.name))?;
            }
        }
        Ok(state)
    }
}
