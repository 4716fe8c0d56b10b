//! The collective operations between the processes ("ranks") of a multi-process run, over TCP.
//!
//! **Topology.** A star: rank 0 listens on [`JoinConfig::address`] and every other rank opens one
//! connection to it. All traffic goes through rank 0; the other ranks never talk to each other.
//!
//! **Protocol.** Every message is a frame: a `u64` length of the rest, a kind byte (Hello,
//! Welcome, Refuse, Data, Heartbeat, Abort, Bye), a `u32`-prefixed UTF-8 label and a payload of
//! little-endian `f32` values; all integers are little-endian. In the rendezvous each rank sends
//! Hello (protocol version, rank, world size, fingerprint); once every rank has said hello with
//! settings equal to rank 0's, rank 0 answers Welcome to all, otherwise it sends Refuse with the
//! reason to every rank connected so far. In a collective every rank sends one Data frame to
//! rank 0: its signature (operation, label and sizes) and its values. Rank 0 waits for them in
//! rank order, checks that every signature equals its own, computes the result and answers every
//! rank with a Data frame.
//!
//! **Determinism.** Sums are computed only at rank 0, element by element, with sequential `f32`
//! adds in rank order (rank 0's value, plus rank 1's, plus rank 2's, …). Every rank receives the
//! same bytes, so results are bit-identical on all ranks and independent of arrival order.
//!
//! **Failure model.** No wait is unbounded. One reader thread per connection reads every frame
//! (any frame is a sign of life); a heartbeat thread sends a Heartbeat every `liveness / 4`; a
//! watchdog thread declares a peer stalled when nothing arrived from it for `liveness`. A
//! connection that ends without Bye, a stalled peer, an Abort, a collective mismatch and a
//! collective that times out are recorded as the group's failure (the first one wins): rank 0
//! forwards it as Abort to the other ranks, every later operation fails at once with it, and the
//! [`TcpGroup::on_failure`] handler is called once from a background thread. Bye (sent by
//! [`TcpGroup::close`]) is a clean leave, not a failure.
//!
//! **Use.** One thread runs the collectives of a group, at most one operation at a time; the
//! other methods may be called from any thread.

mod basics;
mod ops;
mod rendezvous;
mod shared;
mod wire;

use std::io::{self, BufWriter};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub use basics::{GroupError, JoinConfig};
use basics::{group_error, lock};
use rendezvous::{rendezvous_peer, rendezvous_root};
use shared::{Handler, Peer, Shared, State, Writer, heartbeat_loop, reader_loop, watchdog_loop};
use wire::{Kind, encode_failure};

/// How long `close` waits for the peers to acknowledge Bye.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

type Inbox = Mutex<Receiver<(String, Vec<f32>)>>;

/// The group of all ranks of a run: see the module documentation. `Send + Sync`; one thread runs
/// its collectives, at most one at a time.
pub struct TcpGroup {
    shared: Arc<Shared>,
    /// The Data frames received from each peer, indexed by rank.
    inboxes: Vec<Option<Inbox>>,
    readers: Vec<JoinHandle<()>>,
    tickers: Vec<JoinHandle<()>>,
    done: bool,
}

impl TcpGroup {
    /// Meets the other ranks of the run (see [`JoinConfig`]) and starts the background threads.
    pub fn join(config: JoinConfig) -> Result<TcpGroup, GroupError> {
        if config.rank >= config.world {
            return Err(group_error(
                format!(
                    "rank {} is out of range for a run of {} ranks",
                    config.rank, config.world
                ),
                None,
            ));
        }
        let streams = match (config.world, config.rank) {
            (1, _) => vec![],
            (_, 0) => rendezvous_root(&config)?,
            _ => vec![Some(rendezvous_peer(&config)?)],
        };
        let fail = |e: io::Error| {
            group_error(
                format!("rank {} cannot set up its connections: {e}", config.rank),
                None,
            )
        };
        let mut peers = Vec::new();
        let mut inboxes = Vec::new();
        let mut ends = Vec::new();
        for (rank, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                peers.push(None);
                inboxes.push(None);
                continue;
            };
            stream.set_read_timeout(None).map_err(fail)?;
            let writer = Writer {
                out: BufWriter::with_capacity(1 << 16, stream.try_clone().map_err(fail)?),
                scratch: Vec::new(),
            };
            let (sender, receiver) = mpsc::channel();
            ends.push((rank, stream.try_clone().map_err(fail)?, sender));
            peers.push(Some(Peer {
                rank,
                stream,
                writer: Mutex::new(writer),
                last_seen_ms: AtomicU64::new(0),
                gone: AtomicBool::new(false),
            }));
            inboxes.push(Some(Mutex::new(receiver)));
        }
        let shared = Arc::new(Shared {
            rank: config.rank,
            world: config.world,
            op_timeout: config.op_timeout,
            liveness: config.liveness,
            epoch: Instant::now(),
            peers,
            state: Mutex::new(State {
                failure: None,
                handler: None,
                fired: false,
            }),
            closing: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            stop: Mutex::new(false),
            stop_signal: Condvar::new(),
        });
        let mut group = TcpGroup {
            shared: shared.clone(),
            inboxes,
            readers: vec![],
            tickers: vec![],
            done: false,
        };
        if config.world == 1 {
            return Ok(group);
        }
        let spawn = |name: String, body: Box<dyn FnOnce() + Send>| {
            thread::Builder::new().name(name).spawn(body).map_err(fail)
        };
        for (rank, stream, sender) in ends {
            let shared = shared.clone();
            group.readers.push(spawn(
                format!("collective-read-{rank}"),
                Box::new(move || reader_loop(shared, rank, stream, sender)),
            )?);
        }
        let beat = shared.clone();
        group.tickers.push(spawn(
            "collective-heartbeat".into(),
            Box::new(move || heartbeat_loop(beat)),
        )?);
        group.tickers.push(spawn(
            "collective-watchdog".into(),
            Box::new(move || watchdog_loop(shared)),
        )?);
        Ok(group)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// The number of ranks of the run.
    pub fn world(&self) -> usize {
        self.shared.world
    }

    /// This rank failed locally (`reason`): tells every other rank (through rank 0) so they stop
    /// with "rank R failed: reason"; after this every operation of this group returns an error.
    /// This rank's own failure handler is not called.
    pub fn abort(&self, reason: &str) {
        let error = group_error(
            format!("rank {} failed: {reason}", self.rank()),
            Some(self.rank()),
        );
        {
            let mut state = lock(&self.shared.state);
            state.fired = true;
            state.failure.get_or_insert(error.clone());
        }
        let text = encode_failure(&error);
        for peer in self.shared.peers() {
            let _ = self.shared.send(peer.rank, Kind::Abort, &text, &[]);
        }
    }

    /// The first failure seen by this group so far (a peer that died, stalled, aborted or sent a
    /// mismatched operation), if any; non-blocking.
    pub fn failure(&self) -> Option<GroupError> {
        self.shared.failure()
    }

    /// Registers a callback called once, from a background thread, as soon as a failure is
    /// detected, even while no operation is in progress (at once when a failure is already
    /// recorded and no handler was called for it). Replaces a previous handler.
    pub fn on_failure(&self, handler: Box<dyn Fn(&GroupError) + Send + Sync>) {
        let handler: Handler = Arc::from(handler);
        let pending = {
            let mut state = lock(&self.shared.state);
            state.handler = Some(handler.clone());
            let pending = state.failure.clone().filter(|_| !state.fired);
            state.fired |= pending.is_some();
            pending
        };
        if let Some(error) = pending {
            thread::spawn(move || handler(&error));
        }
    }

    /// Clean end of the run: tells the peers this rank is leaving normally (a peer leaving with
    /// Bye is not a failure), then stops the background threads and closes the connections.
    pub fn close(mut self) {
        self.shut_down(true);
    }

    /// Tests: stop sending heartbeats (simulates a stopped process, e.g. SIGSTOP).
    #[doc(hidden)]
    pub fn pause_heartbeats(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
    }

    fn shut_down(&mut self, graceful: bool) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let shared = &self.shared;
        shared.closing.store(true, Ordering::SeqCst);
        *lock(&shared.stop) = true;
        shared.stop_signal.notify_all();
        if graceful {
            for peer in shared.peers() {
                let _ = shared.send(peer.rank, Kind::Bye, "", &[]);
                let _ = peer.stream.shutdown(Shutdown::Write);
            }
            // Each peer answers Bye by ending its side; until then our readers drain the
            // connections, so closing them loses nothing the peers sent.
            let deadline = Instant::now() + CLOSE_GRACE;
            while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(5));
            }
        }
        for peer in shared.peers() {
            let _ = peer.stream.shutdown(Shutdown::Both);
        }
        for thread in self.readers.drain(..).chain(self.tickers.drain(..)) {
            let _ = thread.join();
        }
    }
}

impl Drop for TcpGroup {
    /// Without `close`: shuts the connections down without Bye, which the peers see as this
    /// process having exited.
    fn drop(&mut self) {
        self.shut_down(false);
    }
}

#[cfg(test)]
mod tests;
