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
//! (its first) carries the process's part to the others through burn-collective's global
//! orchestrator (`flowrl orchestrator`), and shares the answer with its siblings. Every wait
//! gives up after `Cluster::timeout` (10 min in one process): a replica that failed stops its
//! siblings at once, and a process that died or never joined stops the others with an error
//! naming the wait, not a hang.
//!
//! With one replica in all (the default), no collective is set up and the work runs inline.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn_collective::{CollectiveConfig, PeerId, ReduceOperation};
use flowrl_engine::{Cluster, DeviceSpec, Placement};

use crate::runtime::backend::{BackendKind, HostBackend};
use crate::runtime::collective::local::{Aborted, Deposit, LocalGroup, sum_in_order};

/// How long replicas of one process wait for each other when no cluster timeout is given.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(600);

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
    /// The run's processes, when there are several.
    cluster: Option<&'a Cluster>,
    timeout: Duration,
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
            let r = Replica::new(p, 0, None, timeout, &abort, &self.node);
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
                    s.spawn(move || {
                        let r = Replica::new(p, i, Some(group), timeout, abort, node);
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
                    s.poison();
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
        timeout: Duration,
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
            cluster: p.cluster.as_ref(),
            timeout,
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
        self.cluster.is_some_and(|c| c.world > 1)
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
            self.processes_sum(local)
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
        let total: usize = counts.iter().sum();
        let before: usize = counts[..self.first].iter().sum();
        self.across("all-gather across processes", || {
            // Zeros elsewhere: the sum over processes is the concatenation, exactly.
            let mut m = vec![0.0f32; total];
            m[before..before + local.len()].copy_from_slice(&local);
            self.processes_sum(m)
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
        let sum = self.all_reduce_sum(values)?;
        Ok(sum[mine].to_vec())
    }

    /// `values` of replica `root` (global index), on every replica.
    pub fn broadcast(&self, values: Vec<f32>, root: usize) -> Result<Vec<f32>> {
        ensure!(root < self.world, "broadcast from replica {root} of {}", self.world);
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
            // The length first, then the values summed with zeros from the other processes.
            let len = here.as_ref().map_or(0, Vec::len);
            let len = self.processes_sum(vec![len as f32])?[0] as usize;
            self.processes_sum(here.unwrap_or_else(|| vec![0.0; len]))
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

    /// The sum of `values` over the run's processes (this process's first replica only).
    ///
    /// Processes pair their calls by order. To catch a mismatch (processes running different
    /// graphs or settings) instead of summing unrelated numbers, each call appends a label — an
    /// integer below 2^16 derived from the node's name and the call's index — and checks that
    /// the sum of the labels is `processes ×` its own (exact in f32).
    fn processes_sum(&self, mut values: Vec<f32>) -> Result<Vec<f32>> {
        let cluster = self.cluster.expect("a multi-process run");
        let call = self.calls.get();
        let label = (flowrl_engine::derive_seed(call, 0, self.node) % (1 << 16) + 1) as f32;
        values.push(label);
        let len = values.len();
        let peer = PeerId(cluster.rank as u32);
        let mut out = self.wait("all-reduce", move || {
            let device = Default::default();
            let t = Tensor::<HostBackend, 1>::from_data(TensorData::new(values, [len]), &device);
            burn_collective::all_reduce::<HostBackend>(
                peer,
                t.into_primitive().tensor(),
                ReduceOperation::Sum,
            )
            .map(|p| {
                Tensor::<HostBackend, 1>::from_primitive(TensorPrimitive::Float(p))
                    .into_data()
                    .into_vec::<f32>()
                    .unwrap_or_default()
            })
        })?;
        ensure!(
            out.len() == len,
            "all-reduce returned {} values for {len}",
            out.len()
        );
        let sum = out.pop().expect("label");
        ensure!(
            sum == label * cluster.world as f32,
            "collective operations out of order: call {call} of node `{}` on process {} was \
             summed with other operations (label sum {sum}, expected {}); every process of a run \
             must run the same graph with the same settings",
            self.node,
            cluster.rank,
            label * cluster.world as f32
        );
        Ok(out)
    }

    /// Runs a blocking collective call on a helper thread and waits for it at most the
    /// timeout, polling the abort flag, so a missing peer never hangs the run.
    fn wait<T: Send + 'static>(
        &self,
        what: &str,
        call: impl FnOnce() -> std::result::Result<T, burn_collective::CollectiveError> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(call());
        });
        let start = Instant::now();
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => bail!(
                    "collective {what} failed ({e:?}): the connection to another replica's \
                     process broke (a process failed or exited; see its log)"
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("collective {what}: the collective thread ended without an answer")
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if self.abort.load(Ordering::SeqCst) {
                return Err(Aborted.into());
            }
            if start.elapsed() >= self.timeout {
                bail!(
                    "collective {what} timed out after {} s: replica {} of {} waited for the \
                     others, and at least one did not take part (a process failed or exited, or \
                     never joined; see its log)",
                    self.timeout.as_secs(),
                    self.index,
                    self.world
                );
            }
        }
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

/// The process's registration with burn-collective's orchestrator (one peer: the process),
/// kept from the first data-parallel step to the end of the process.
struct Registration {
    cluster: Cluster,
    /// Set after a failed operation: the connections between the processes are gone.
    poisoned: bool,
}

static SESSION: Mutex<Option<Registration>> = Mutex::new(None);

/// Exclusive use of the processes' collective for one data-parallel operation of this process
/// (processes pair their operations by order, so two nodes must not interleave theirs).
struct CollectiveSession {
    guard: MutexGuard<'static, Option<Registration>>,
}

impl CollectiveSession {
    fn acquire(cluster: &Cluster) -> Result<Self> {
        let mut guard = SESSION.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(r) if r.poisoned => bail!(
                "the collective between the run's processes failed earlier in this run (see the \
                 first error); a multi-process run cannot continue without all its processes"
            ),
            Some(r) if r.cluster == *cluster => {}
            Some(r) => bail!(
                "this process joined the run as process {} of {}, not {} of {}",
                r.cluster.rank,
                r.cluster.world,
                cluster.rank,
                cluster.world
            ),
            None => {
                register(cluster).context("joining the processes of the run")?;
                *guard = Some(Registration {
                    cluster: cluster.clone(),
                    poisoned: false,
                });
            }
        }
        Ok(CollectiveSession { guard })
    }

    fn poison(mut self) {
        if let Some(r) = self.guard.as_mut() {
            r.poisoned = true;
        }
    }
}

/// Registers this process with the orchestrator; returns when every process has joined, or
/// fails after the cluster's timeout.
fn register(c: &Cluster) -> Result<()> {
    quiet_network_layer();
    let config = CollectiveConfig::default()
        .with_num_devices(1)
        .with_num_nodes(c.world as u32)
        .with_global_address(c.orchestrator.parse().map_err(|e: String| anyhow!(e))?)
        .with_node_address(c.node_address.parse().map_err(|e: String| anyhow!(e))?)
        .with_data_service_port(c.data_port);
    let peer = PeerId(c.rank as u32);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(burn_collective::register::<HostBackend>(
            peer,
            Default::default(),
            config,
        ));
    });
    let failed = match rx.recv_timeout(c.timeout) {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => format!("registration failed ({e:?})"),
        Err(_) => format!("not every process joined within {} s", c.timeout.as_secs()),
    };
    burn_collective::reset_collective::<HostBackend>();
    bail!(
        "{failed} (process {} of {}; orchestrator {}, this process at {})",
        c.rank,
        c.world,
        c.orchestrator,
        c.node_address
    )
}

/// burn-communication installs an INFO-level log subscriber with its first server (one line per
/// tensor download), and burn-collective's network tasks panic when a peer process closes its
/// connection, which every process of a finished run does. Before the first server starts: a
/// WARN-level subscriber on stderr, and a panic hook that reports a panic of those tasks in one
/// line (the collective call waiting on it still fails with its own error or timeout).
fn quiet_network_layer() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .with_writer(std::io::stderr)
            .try_init();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            // Only burn-collective's and burn-communication's runtime runs on these threads.
            let network_task = std::thread::current().name() == Some("tokio-rt-worker");
            if network_task {
                eprintln!("note: a collective network task stopped: {message}");
            } else {
                previous(info);
            }
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

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
