//! Data parallelism: one replica of a node per device of its [`Placement`], in every process of
//! the run, and the collective operations between replicas.
//!
//! A data-parallel node splits its work (prompts, rows, the rows of each mini-batch) over the
//! run's `W = devices × processes` replicas by their **global** index ([`shard`]); each replica
//! computes its share in its own thread, and the shares meet in collective operations on flat
//! `f32` buffers ([`Replica`]): all-reduce (sum), reduce-scatter (sum), all-gather, broadcast
//! and barrier.
//!
//! - *gather* (rollout, log-probs): every replica writes its rows into a zero matrix of the whole
//!   batch; the all-reduce **sum** of those matrices is the whole batch on every replica. Adding
//!   zeros is exact, so the gathered values are bit-identical to the replicas' own.
//! - *gradients* (updates, [`crate::train::replicated`]): each replica's gradient, flattened in
//!   the model's parameter order, is summed and divided by `W` — the mean all-reduce of verl's
//!   FSDP actor — or reduce-scattered to the replica that owns each parameter (ZeRO stage 2).
//!
//! Within a process the replicas meet in a [`LocalGroup`] (shared memory, sums in replica
//! order, so every replica gets the same bits). Across processes one replica of each process
//! (its first) carries the process's part to rank 0 over TCP ([`TcpGroup`]: rendezvous at
//! `Cluster::master`, sums in rank order) and shares the answer with its siblings. Every wait
//! gives up after `Cluster::timeout` (10 min in one process): a replica that failed stops its
//! siblings at once; a process that fails tells the others why, and one that dies or stops
//! answering (no heartbeat for 30 s) is named by the others, which stop at once, inside a
//! collective or not.
//!
//! With one replica in all (the default), no collective is set up and the work runs inline.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use flowrl_engine::{Cluster, DeviceSpec, Placement};

use crate::runtime::backend::BackendKind;
use crate::runtime::collective::local::{Aborted, Deposit, LocalGroup, sum_in_order};
use crate::runtime::collective::tcp::{GroupError, JoinConfig, TcpGroup};

/// How long replicas of one process wait for each other when no cluster timeout is given.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(600);

/// A process from which nothing (not even a heartbeat) arrived for this long is declared stopped.
const LIVENESS: Duration = Duration::from_secs(30);

/// The replicas of one node in this process, and the run's other processes.
#[derive(Clone, Debug)]
pub struct Replicas {
    placement: Placement,
    /// The node's name: labels its collective operations.
    node: String,
}

/// What one replica's work sees: its global index, the number of replicas, its device, and the
/// collective operations with its siblings.
pub struct Replica<'a> {
    /// Global index, `0..world`.
    pub index: usize,
    /// Replicas over all processes.
    pub world: usize,
    /// Index among this process's replicas, `0..local`.
    pub local_index: usize,
    /// The device of this replica (`FlowBackend::device` makes it a burn device).
    pub device: DeviceSpec,
    /// The meeting point of this process's replicas; `None` when this replica is the only one.
    group: Option<&'a LocalGroup>,
    /// Replicas of this process, and the global index of its first.
    local: usize,
    first: usize,
    /// The run's processes, when there are several, and this process's link to them.
    cluster: Option<(&'a Cluster, &'a TcpGroup)>,
    abort: &'a AtomicBool,
    node: &'a str,
    /// Collective calls made so far by this replica in this operation.
    calls: std::cell::Cell<u64>,
}

impl Replicas {
    /// The replicas of node `node` placed by `placement`. Every device must have a backend in
    /// this binary ([`BackendKind::of`]).
    pub fn new(placement: &Placement, node: &str) -> Result<Self> {
        ensure!(
            !placement.devices.is_empty(),
            "a node needs at least one device"
        );
        for &d in &placement.devices {
            BackendKind::of(d).with_context(|| format!("node `{node}`"))?;
        }
        Ok(Replicas {
            placement: placement.clone(),
            node: node.to_string(),
        })
    }

    /// One replica on `device`, no collective (nodes that run once, tests).
    pub fn single(device: DeviceSpec) -> Self {
        Replicas {
            placement: Placement::single(device),
            node: String::new(),
        }
    }

    /// Replicas over all processes.
    pub fn world(&self) -> usize {
        self.placement.world_replicas()
    }

    /// Replicas in this process.
    pub fn local(&self) -> usize {
        self.placement.local_replicas()
    }

    /// This process's devices, one replica each.
    pub fn devices(&self) -> &[DeviceSpec] {
        &self.placement.devices
    }

    /// Global index of this process's first replica.
    pub fn first(&self) -> usize {
        self.placement.first_replica()
    }

    /// Runs `work` once per local replica, each in its own thread (inline with one replica in
    /// all), and returns the results in local replica order. The first error stops the other
    /// replicas' collective waits and is returned.
    pub fn run<T: Send>(&self, work: impl Fn(&Replica<'_>) -> Result<T> + Sync) -> Result<Vec<T>> {
        let world = self.world();
        let abort = AtomicBool::new(false);
        let p = &self.placement;
        let timeout = timeout_of(p);
        if world == 1 {
            let r = Replica::new(p, 0, None, None, &abort, &self.node);
            return Ok(vec![work(&r)?]);
        }
        let session = match &p.cluster {
            Some(c) => Some(CollectiveSession::acquire(c)?),
            None => None,
        };
        let group = LocalGroup::new(p.local_replicas(), timeout);
        let results = std::thread::scope(|s| {
            let handles: Vec<_> = (0..p.local_replicas())
                .map(|i| {
                    let (abort, work, group) = (&abort, &work, &group);
                    let node = self.node.as_str();
                    let link = session.as_ref().map(|s| s.group());
                    s.spawn(move || {
                        let r = Replica::new(p, i, Some(group), link, abort, node);
                        let out = work(&r);
                        if out.is_err() {
                            abort.store(true, Ordering::SeqCst);
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow!("a replica thread panicked")))
                })
                .collect::<Vec<_>>()
        });
        let first = p.first_replica();
        let mut out = Vec::with_capacity(results.len());
        // A sibling stopped by the failure reports `Aborted`; the error to return is the cause.
        let (mut cause, mut aborted) = (None, None);
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok(v) => out.push(v),
                Err(e) => {
                    let slot = if is_abort(&e) {
                        &mut aborted
                    } else {
                        &mut cause
                    };
                    slot.get_or_insert_with(|| e.context(format!("replica {}", first + i)));
                }
            }
        }
        match cause.or(aborted) {
            None => Ok(out),
            Some(e) => {
                if let Some(s) = session {
                    s.abort(&format!("{e:#}"));
                }
                Err(e)
            }
        }
    }
}

fn is_abort(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Aborted>().is_some()
}

fn timeout_of(p: &Placement) -> Duration {
    p.cluster.as_ref().map_or(LOCAL_TIMEOUT, |c| c.timeout)
}

impl<'a> Replica<'a> {
    /// Local replica `local_index` of placement `p`; without `group` it is the only replica in
    /// all and its collective operations are identities.
    fn new(
        p: &'a Placement,
        local_index: usize,
        group: Option<&'a LocalGroup>,
        link: Option<&'a TcpGroup>,
        abort: &'a AtomicBool,
        node: &'a str,
    ) -> Self {
        Replica {
            index: p.first_replica() + local_index,
            world: p.world_replicas(),
            local_index,
            device: p.devices[local_index],
            group,
            local: p.local_replicas(),
            first: p.first_replica(),
            cluster: p.cluster.as_ref().zip(link),
            abort,
            node,
            calls: Default::default(),
        }
    }

    /// One round with this process's other replicas: every local replica's `data`, in local
    /// order (just this one's when it is alone in its process).
    fn exchange(&self, op: &str, data: Vec<f32>) -> Result<Vec<Deposit>> {
        let call = self.calls.get();
        self.calls.set(call + 1);
        match self.group {
            Some(g) if self.local > 1 => {
                let label = format!("{op} #{call} of node `{}`", self.node);
                g.exchange(self.local_index, call, &label, data, self.abort)
            }
            _ => Ok(vec![Deposit {
                label: op.into(),
                data: std::sync::Arc::new(data),
            }]),
        }
    }

    /// Runs `across` on this process's first replica (the processes' part of an operation) and
    /// hands its answer to every local replica.
    fn across(&self, op: &str, across: impl FnOnce() -> Result<Vec<f32>>) -> Result<Vec<f32>> {
        let mine = if self.local_index == 0 {
            across()?
        } else {
            Vec::new()
        };
        if self.local == 1 {
            return Ok(mine);
        }
        let all = self.exchange(op, mine)?;
        Ok(all[0].data.as_ref().clone())
    }

    fn multi_process(&self) -> bool {
        self.cluster.is_some_and(|(c, _)| c.world > 1)
    }

    /// The link to the other processes, with the label of this replica's current operation.
    fn link(&self, op: &str) -> (&TcpGroup, String) {
        let (_, g) = self.cluster.expect("a multi-process run");
        let label = format!("{op} #{} of node `{}`", self.calls.get(), self.node);
        (g, label)
    }

    /// `counts` (one per global replica) summed per process.
    fn per_process(&self, counts: &[usize]) -> Vec<usize> {
        counts.chunks(self.local).map(|c| c.iter().sum()).collect()
    }

    /// The element-wise sum of `values` over all replicas (every replica passes the same length),
    /// added in replica order within a process, then in process order: every replica gets the
    /// same bits.
    pub fn all_reduce_sum(&self, values: Vec<f32>) -> Result<Vec<f32>> {
        if self.world == 1 {
            return Ok(values);
        }
        let local = sum_in_order(&self.exchange("all-reduce", values)?)?;
        if !self.multi_process() {
            return Ok(local);
        }
        self.across("all-reduce across processes", || {
            let (g, label) = self.link("all-reduce");
            let mut sum = local;
            g.all_reduce_sum(&label, &mut sum)?;
            Ok(sum)
        })
    }

    /// Every replica passes its own segment `mine` (`counts[index]` values; `counts` has one
    /// entry per global replica); returns all segments concatenated in replica order.
    pub fn all_gather(&self, mine: Vec<f32>, counts: &[usize]) -> Result<Vec<f32>> {
        self.check_counts("all-gather", counts, Some(mine.len()))?;
        if self.world == 1 {
            return Ok(mine);
        }
        let parts = self.exchange("all-gather", mine)?;
        let local: Vec<f32> = parts.iter().flat_map(|d| d.data.iter().copied()).collect();
        if !self.multi_process() {
            return Ok(local);
        }
        self.across("all-gather across processes", || {
            let (g, label) = self.link("all-gather");
            Ok(g.all_gather(&label, &local, &self.per_process(counts))?)
        })
    }

    /// Every replica passes a whole buffer (`counts` summed, one count per global replica);
    /// returns this replica's segment of their element-wise sum (`counts[index]` values from
    /// `counts[..index]` summed), added in the order of [`Replica::all_reduce_sum`].
    pub fn reduce_scatter_sum(&self, values: Vec<f32>, counts: &[usize]) -> Result<Vec<f32>> {
        self.check_counts("reduce-scatter", counts, None)?;
        let total: usize = counts.iter().sum();
        ensure!(
            values.len() == total,
            "reduce-scatter of {} values where the segments add up to {total}",
            values.len()
        );
        let start: usize = counts[..self.index].iter().sum();
        let mine = start..start + counts[self.index];
        if self.world == 1 {
            return Ok(values);
        }
        let local = sum_in_order(&self.exchange("reduce-scatter", values)?)?;
        if !self.multi_process() {
            return Ok(local[mine].to_vec());
        }
        // This process's segment (its replicas' segments in order), then this replica's.
        let segment = self.across("reduce-scatter across processes", || {
            let (g, label) = self.link("reduce-scatter");
            Ok(g.reduce_scatter_sum(&label, &local, &self.per_process(counts))?)
        })?;
        let offset: usize = counts[self.first..self.index].iter().sum();
        Ok(segment[offset..offset + counts[self.index]].to_vec())
    }

    /// `values` of replica `root` (global index), on every replica.
    pub fn broadcast(&self, values: Vec<f32>, root: usize) -> Result<Vec<f32>> {
        ensure!(
            root < self.world,
            "broadcast from replica {root} of {}",
            self.world
        );
        if self.world == 1 {
            return Ok(values);
        }
        let parts = self.exchange("broadcast", values)?;
        let local_root = root.checked_sub(self.first).filter(|&i| i < self.local);
        let here = local_root.map(|i| parts[i].data.as_ref().clone());
        if !self.multi_process() {
            return Ok(here.expect("the root is local in a one-process run"));
        }
        self.across("broadcast across processes", || {
            let (g, label) = self.link("broadcast");
            let mut values = here.unwrap_or_default();
            g.broadcast(&label, &mut values, root / self.local)?;
            Ok(values)
        })
    }

    /// Returns when every replica has called it.
    pub fn barrier(&self) -> Result<()> {
        self.all_reduce_sum(Vec::new()).map(|_| ())
    }

    /// Gathers rows of width `width` from all replicas: `rows` are this replica's
    /// `(global row, values)`; the result is the `[total_rows, width]` matrix, row-major.
    pub fn gather_rows(
        &self,
        total_rows: usize,
        width: usize,
        rows: impl IntoIterator<Item = (usize, Vec<f32>)>,
    ) -> Result<Vec<f32>> {
        let mut m = vec![0.0f32; total_rows * width];
        for (r, v) in rows {
            ensure!(
                r < total_rows && v.len() == width,
                "row {r} of width {} does not fit a [{total_rows}, {width}] gather",
                v.len()
            );
            m[r * width..(r + 1) * width].copy_from_slice(&v);
        }
        self.all_reduce_sum(m)
    }

    fn check_counts(&self, op: &str, counts: &[usize], mine: Option<usize>) -> Result<()> {
        ensure!(
            counts.len() == self.world,
            "{op} with {} segment counts for {} replicas",
            counts.len(),
            self.world
        );
        if let Some(n) = mine {
            ensure!(
                n == counts[self.index],
                "{op}: replica {} passed {n} values where its segment has {}",
                self.index,
                counts[self.index]
            );
        }
        Ok(())
    }
}

/// The contiguous share of `total` items of replica `index` of `world`: the first
/// `total mod world` replicas take one item more.
pub fn shard(total: usize, world: usize, index: usize) -> Range<usize> {
    let base = total / world;
    let extra = total % world;
    let start = index * base + index.min(extra);
    start..start + base + usize::from(index < extra)
}

/// This process's membership of the run's processes: joined at the first data-parallel operation
/// that needs them, left when the run ends ([`flowrl_engine::on_run_end`]).
struct Joined {
    cluster: Cluster,
    group: Arc<TcpGroup>,
}

static SESSION: Mutex<Option<Joined>> = Mutex::new(None);

/// Exclusive use of the link to the other processes for one data-parallel operation of this
/// process (processes pair their operations by order, so two nodes must not interleave theirs).
struct CollectiveSession {
    guard: MutexGuard<'static, Option<Joined>>,
}

impl CollectiveSession {
    fn acquire(cluster: &Cluster) -> Result<Self> {
        let mut guard = SESSION.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(j) if j.cluster != *cluster => bail!(
                "this process joined the run as process {} of {}, not {} of {}",
                j.cluster.rank,
                j.cluster.world,
                cluster.rank,
                cluster.world
            ),
            Some(j) => {
                if let Some(e) = j.group.failure() {
                    bail!("the run's processes cannot go on: {e}");
                }
            }
            None => {
                *guard = Some(Joined {
                    cluster: cluster.clone(),
                    group: Arc::new(join(cluster)?),
                });
            }
        }
        Ok(CollectiveSession { guard })
    }

    fn group(&self) -> &TcpGroup {
        &self.guard.as_ref().expect("joined").group
    }

    /// This process failed: the others stop, naming it and `reason`.
    fn abort(self, reason: &str) {
        self.group().abort(reason);
    }
}

/// Outside the nodes' operations (a checkpoint, which every process writes after the same
/// step): the processes' `mine` concatenated in rank order (`counts`: one per process), at rank 0
/// (`Some`), `None` on the others. `label` names the operation in a mismatch.
pub fn gather_to_rank_zero(
    label: &str,
    mine: &[f32],
    counts: &[usize],
) -> Result<Option<Vec<f32>>> {
    with_joined(|g| g.gather_to_root(label, mine, counts))
}

/// [`gather_to_rank_zero`] answered to every process.
pub fn all_gather_across_processes(
    label: &str,
    mine: &[f32],
    counts: &[usize],
) -> Result<Vec<f32>> {
    with_joined(|g| g.all_gather(label, mine, counts))
}

/// `op` on the link to the run's other processes, outside any node's operation.
fn with_joined<T>(op: impl FnOnce(&TcpGroup) -> Result<T, GroupError>) -> Result<T> {
    let joined = SESSION.lock().unwrap_or_else(|e| e.into_inner());
    let j = joined
        .as_ref()
        .context("a collective across processes before this process joined the run's processes")?;
    op(&j.group).map_err(|e| anyhow!("{e}"))
}

/// Joins the run's processes at rank 0 (`Cluster::master`). From then on a failure of another
/// process ends this one at once (exit code 1, the message naming the process), whatever it is
/// doing; the processes vote after every step on whether one of them was asked to stop
/// ([`flowrl_engine::stop_voted`]); when the run ends, this process leaves cleanly or, when its
/// run failed, tells the others why.
fn join(c: &Cluster) -> Result<TcpGroup> {
    let group = TcpGroup::join(JoinConfig {
        address: c.master.clone(),
        rank: c.rank,
        world: c.world,
        fingerprint: c.fingerprint.clone(),
        join_timeout: c.timeout,
        op_timeout: c.timeout,
        liveness: LIVENESS.min(c.timeout),
    })
    .map_err(|e| {
        anyhow!(
            "joining the run's {} processes as rank {}: {e}",
            c.world,
            c.rank
        )
    })?;
    group.on_failure(Box::new(|e| {
        eprintln!("error: {e}");
        std::process::exit(1);
    }));
    // After every step the processes or their SIGTERM flags together: a preempted process
    // stops every process after the same step, each with its checkpoint.
    flowrl_engine::on_stop_vote(Box::new(|step, asked| {
        let joined = SESSION.lock().unwrap_or_else(|e| e.into_inner());
        let Some(j) = joined.as_ref() else {
            return Ok(asked);
        };
        let mut vote = [if asked { 1.0 } else { 0.0 }];
        j.group
            .all_reduce_sum(&format!("stop vote after step {step}"), &mut vote)
            .map_err(|e| anyhow!("{e}"))?;
        Ok(vote[0] > 0.0)
    }));
    flowrl_engine::on_run_end(Box::new(|failure: Option<&str>| {
        let joined = SESSION.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(j) = joined {
            match (failure, Arc::try_unwrap(j.group)) {
                (Some(reason), Ok(g)) => g.abort(reason),
                (Some(reason), Err(g)) => g.abort(reason),
                (None, Ok(g)) => g.close(),
                (None, Err(_)) => {}
            }
        }
    }));
    Ok(group)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn shards_cover_the_items_once_and_differ_by_at_most_one() {
        for total in 0..20 {
            for world in 1..6 {
                let shards: Vec<_> = (0..world).map(|i| shard(total, world, i)).collect();
                assert_eq!(shards[0].start, 0);
                assert_eq!(shards[world - 1].end, total);
                for w in shards.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let lens: Vec<_> = shards.iter().map(|s| s.len()).collect();
                assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1);
            }
        }
    }

    fn placement(n: usize) -> Placement {
        Placement {
            devices: (0..n).map(DeviceSpec::Cpu).collect(),
            cluster: None,
        }
    }

    #[test]
    fn replicas_sum_and_gather_within_one_process() {
        let replicas = Replicas::new(&placement(3), "test").unwrap();
        let out = replicas
            .run(|r| {
                let sum = r.all_reduce_sum(vec![r.index as f32, 1.0])?;
                let rows =
                    shard(5, r.world, r.index).map(|row| (row, vec![row as f32 * 10.0, -1.0]));
                let gathered = r.gather_rows(5, 2, rows)?;
                Ok((sum, gathered))
            })
            .unwrap();
        assert_eq!(out.len(), 3);
        for (sum, gathered) in out {
            assert_eq!(sum, vec![3.0, 3.0]);
            assert_eq!(
                gathered,
                vec![0.0, -1.0, 10.0, -1.0, 20.0, -1.0, 30.0, -1.0, 40.0, -1.0]
            );
        }
    }

    #[test]
    fn replicas_gather_scatter_broadcast_and_meet() {
        let replicas = Replicas::new(&placement(3), "test").unwrap();
        // Uneven segments, one of them empty.
        let counts = [2, 0, 3];
        let out = replicas
            .run(|r| {
                let mine: Vec<f32> = (0..counts[r.index])
                    .map(|k| (10 * r.index + k) as f32)
                    .collect();
                let gathered = r.all_gather(mine, &counts)?;
                let full: Vec<f32> = (0..5).map(|k| (k * (r.index + 1)) as f32).collect();
                let scattered = r.reduce_scatter_sum(full, &counts)?;
                let root = r.broadcast(vec![r.index as f32; 2 + r.index], 2)?;
                r.barrier()?;
                Ok((gathered, scattered, root))
            })
            .unwrap();
        let sums = [0.0, 6.0, 12.0, 18.0, 24.0];
        for (i, (gathered, scattered, root)) in out.into_iter().enumerate() {
            assert_eq!(gathered, vec![0.0, 1.0, 20.0, 21.0, 22.0]);
            let start: usize = counts[..i].iter().sum();
            assert_eq!(scattered, sums[start..start + counts[i]].to_vec());
            assert_eq!(root, vec![2.0; 4]);
        }
    }

    #[test]
    fn a_failing_replica_stops_its_siblings_with_its_own_error() {
        let replicas = Replicas::new(&placement(2), "test").unwrap();
        let start = Instant::now();
        let err = replicas
            .run(|r| {
                if r.index == 1 {
                    bail!("replica one broke");
                }
                r.all_reduce_sum(vec![1.0]).map(|_| ())
            })
            .unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            start.elapsed()
        );
        let msg = format!("{err:#}");
        assert!(msg.contains("replica one broke"), "{msg}");
        // The collective is usable again afterwards.
        let out = replicas.run(|r| r.all_reduce_sum(vec![2.0])).unwrap();
        assert_eq!(out, vec![vec![4.0], vec![4.0]]);
    }

    #[test]
    fn operations_paired_out_of_order_are_an_error_not_a_wrong_sum() {
        let replicas = Replicas::new(&placement(2), "test").unwrap();
        let err = replicas
            .run(|r| {
                if r.index == 1 {
                    // As if this replica had skipped a collective call of the others.
                    r.calls.set(1);
                }
                r.all_reduce_sum(vec![1.0, 2.0])
            })
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("collective operations out of order"), "{msg}");
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_replicas_need_the_cuda_build() {
        let p = Placement {
            devices: vec![DeviceSpec::Cuda(0)],
            cluster: None,
        };
        let err = format!("{:#}", Replicas::new(&p, "test").unwrap_err());
        assert!(
            err.contains("cuda:0") && err.contains("--features cuda"),
            "{err}"
        );
    }

    #[test]
    fn replicas_know_their_devices() {
        let devices = replicas_devices(&placement(3));
        assert_eq!(devices, (0..3).map(DeviceSpec::Cpu).collect::<Vec<_>>());
        let one = Replicas::single(DeviceSpec::Cpu(1))
            .run(|r| Ok(r.device))
            .unwrap();
        assert_eq!(one, vec![DeviceSpec::Cpu(1)]);
    }

    fn replicas_devices(p: &Placement) -> Vec<DeviceSpec> {
        Replicas::new(p, "test")
            .unwrap()
            .run(|r| Ok(r.device))
            .unwrap()
    }
}
