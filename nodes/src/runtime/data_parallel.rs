//! Data parallelism: one replica of a node per device of its [`Placement`], in every process of
//! the run, and the collective operations between replicas (burn-collective).
//!
//! A data-parallel node splits its work (prompts, rows, the rows of each mini-batch) over the
//! run's `W = devices × processes` replicas by their **global** index ([`shard`]); each replica
//! computes its share in its own thread, and the shares meet in an all-reduce:
//!
//! - *gather* (rollout, log-probs): every replica writes its rows into a zero matrix of the whole
//!   batch; the all-reduce **sum** of those matrices is the whole batch on every replica. Adding
//!   zeros is exact, so the gathered values are bit-identical to the replicas' own.
//! - *gradients* (updates): each replica's gradient, flattened in the model's parameter order, is
//!   summed and divided by `W` — the mean all-reduce of verl's FSDP actor, whose losses carry the
//!   factor `W` (`GlobalBatchInfo::dp_size`) so that the mean is the gradient of the whole
//!   mini-batch loss.
//!
//! Within a process the collective engine is burn-collective's local server (one peer per
//! replica thread); across processes its global orchestrator (`flowrl orchestrator`) connects the
//! processes' tensor services. Every collective call waits at most `Cluster::timeout` (10 min in
//! one process) for the other replicas: a replica that failed stops its siblings at once, and a
//! process that died or never joined stops the others with an error naming the wait, not a hang.
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

/// How long replicas of one process wait for each other when no cluster timeout is given.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(600);

/// The replicas of one node in this process, and the run's other processes.
#[derive(Clone, Debug)]
pub struct Replicas {
    placement: Placement,
    /// The node's name: labels its collective operations (see [`Replica::all_reduce_sum`]).
    node: String,
}

/// What one replica's work sees: its global index, the number of replicas, its device, and the
/// collective operations with its siblings.
pub struct Replica<'a> {
    /// Global index, `0..world`.
    pub index: usize,
    /// Replicas over all processes.
    pub world: usize,
    /// The device of this replica (`FlowBackend::device` makes it a burn device).
    pub device: DeviceSpec,
    peer: PeerId,
    timeout: Duration,
    abort: &'a AtomicBool,
    collective: bool,
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

    /// Runs `work` once per local replica, each in its own thread (inline with one replica in
    /// all), and returns the results in local replica order. The first error stops the other
    /// replicas' collective waits and is returned.
    pub fn run<T: Send>(&self, work: impl Fn(&Replica<'_>) -> Result<T> + Sync) -> Result<Vec<T>> {
        let world = self.world();
        let abort = AtomicBool::new(false);
        if world == 1 {
            let device = self.placement.devices[0];
            let r = Replica::new(0, 1, device, LOCAL_TIMEOUT, &abort, false, &self.node);
            return Ok(vec![work(&r)?]);
        }
        let guard = CollectiveSession::acquire(&self.placement)?;
        let first = self.placement.first_replica();
        let results = on_local_replicas(&self.placement, &self.node, work);
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
        let first_error = cause.or(aborted);
        match first_error {
            None => Ok(out),
            Some(e) => {
                guard.poison();
                Err(e)
            }
        }
    }
}

/// Runs `work` on one thread per local replica of `p`, each a collective peer with its global
/// index, and returns every result in local order; a failing replica sets the abort flag its
/// siblings' collective waits poll.
fn on_local_replicas<T: Send>(
    p: &Placement,
    node: &str,
    work: impl Fn(&Replica<'_>) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let abort = AtomicBool::new(false);
    let (timeout, first, world) = (timeout_of(p), p.first_replica(), p.world_replicas());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..p.local_replicas())
            .map(|i| {
                let (abort, work) = (&abort, &work);
                let device = p.devices[i];
                s.spawn(move || {
                    let r = Replica::new(first + i, world, device, timeout, abort, true, node);
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
            .collect()
    })
}

/// The error a replica returns when a sibling failed first.
#[derive(Debug)]
struct Aborted;

impl std::fmt::Display for Aborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stopped because another replica failed")
    }
}

impl std::error::Error for Aborted {}

fn is_abort(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Aborted>().is_some()
}

fn timeout_of(p: &Placement) -> Duration {
    p.cluster.as_ref().map_or(LOCAL_TIMEOUT, |c| c.timeout)
}

impl<'a> Replica<'a> {
    /// Replica `index` of `world` (its collective peer id is its index); without `collective`
    /// it is the only one and its collective operations are identities.
    fn new(
        index: usize,
        world: usize,
        device: DeviceSpec,
        timeout: Duration,
        abort: &'a AtomicBool,
        collective: bool,
        node: &'a str,
    ) -> Self {
        Replica {
            index,
            world,
            device,
            peer: PeerId(index as u32),
            timeout,
            abort,
            collective,
            node,
            calls: Default::default(),
        }
    }

    /// The element-wise sum of `values` over all replicas (every replica passes the same length).
    ///
    /// Replicas pair their collective calls by order. To catch a mismatch (processes running
    /// different graphs or settings) instead of summing unrelated numbers, each call appends a
    /// label — an integer below 2^16 derived from the node's name and the call's index — and
    /// checks that the sum of the labels is `world ×` its own (exact in f32).
    pub fn all_reduce_sum(&self, mut values: Vec<f32>) -> Result<Vec<f32>> {
        if !self.collective {
            return Ok(values);
        }
        let call = self.calls.get();
        self.calls.set(call + 1);
        let label = (flowrl_engine::derive_seed(call, 0, self.node) % (1 << 16) + 1) as f32;
        values.push(label);
        let len = values.len();
        let peer = self.peer;
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
            sum == label * self.world as f32,
            "collective operations out of order: call {call} of node `{}` on replica {} was summed              with other operations (label sum {sum}, expected {}); every process of a run must              run the same graph with the same settings",
            self.node,
            self.index,
            label * self.world as f32
        );
        Ok(out)
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

/// The process's registration with burn-collective: one at a time (the collective's local
/// server is a process-wide singleton), kept from the first data-parallel step to the end of the
/// process, and replaced when a node with another placement needs it.
struct Registration {
    local: usize,
    first: usize,
    cluster: Option<Cluster>,
    /// Set after a failed operation: the collective's state is unknown, register anew.
    poisoned: bool,
}

static SESSION: Mutex<Option<Registration>> = Mutex::new(None);

/// Exclusive use of the collective for one data-parallel operation of this process.
struct CollectiveSession {
    guard: MutexGuard<'static, Option<Registration>>,
}

impl CollectiveSession {
    fn acquire(p: &Placement) -> Result<Self> {
        let mut guard = SESSION.lock().unwrap_or_else(|e| e.into_inner());
        let wanted = Registration {
            local: p.local_replicas(),
            first: p.first_replica(),
            cluster: p.cluster.clone(),
            poisoned: false,
        };
        let current = guard.as_ref().is_some_and(|r| {
            !r.poisoned
                && r.local == wanted.local
                && r.first == wanted.first
                && r.cluster == wanted.cluster
        });
        if !current {
            if let Some(old) = guard.as_ref()
                && old.poisoned
                && old.cluster.is_some()
            {
                // The connections between processes are gone with the failure; the run stops.
                bail!(
                    "the collective between the run's processes failed earlier in this run (see \
                     the first error); a multi-process run cannot continue without all its \
                     processes"
                );
            }
            if let Some(old) = guard.take() {
                if old.poisoned {
                    burn_collective::reset_collective::<HostBackend>();
                } else {
                    for i in 0..old.local {
                        let _ = burn_collective::finish_collective::<HostBackend>(PeerId(
                            (old.first + i) as u32,
                        ));
                    }
                }
            }
            register(p).context("joining the replicas of the run")?;
            *guard = Some(wanted);
        }
        Ok(CollectiveSession { guard })
    }

    fn poison(mut self) {
        if let Some(r) = self.guard.as_mut() {
            r.poisoned = true;
        }
    }
}

/// Registers every local replica (one thread each: registration returns when all local peers,
/// and with a cluster all processes, have joined).
fn register(p: &Placement) -> Result<()> {
    let mut config = CollectiveConfig::default().with_num_devices(p.local_replicas());
    if let Some(c) = &p.cluster {
        quiet_network_layer();
        config = config
            .with_num_nodes(c.world as u32)
            .with_global_address(c.orchestrator.parse().map_err(|e: String| anyhow!(e))?)
            .with_node_address(c.node_address.parse().map_err(|e: String| anyhow!(e))?)
            .with_data_service_port(c.data_port);
    }
    let world = p.world_replicas();
    let results = on_local_replicas(p, "", |r| {
        let (peer, config) = (r.peer, config.clone());
        r.wait("registration", move || {
            burn_collective::register::<HostBackend>(peer, Default::default(), config)
        })
    });
    let failed = results.into_iter().find_map(Result::err);
    if let Some(e) = failed {
        burn_collective::reset_collective::<HostBackend>();
        let how = match &p.cluster {
            Some(c) => format!(
                " (process {} of {}; orchestrator {}, this process at {})",
                c.rank, c.world, c.orchestrator, c.node_address
            ),
            None => String::new(),
        };
        return Err(e.context(format!("the run's {world} replicas did not all join{how}")));
    }
    Ok(())
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
