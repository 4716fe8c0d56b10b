//! What the operation thread and the background threads of a group share (the state, the failure
//! and the connection to each peer), and the background threads: one reader per connection, the
//! heartbeat and the watchdog.

use std::io::{self, BufReader, BufWriter};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::basics::{GroupError, group_error, lock, secs};
use super::wire::{Kind, decode_failure, encode_failure, read_frame, write_frame};

pub(super) type Handler = Arc<dyn Fn(&GroupError) + Send + Sync>;

pub(super) struct State {
    pub(super) failure: Option<GroupError>,
    pub(super) handler: Option<Handler>,
    /// Whether the handler was called (or must never be, after this rank's own abort).
    pub(super) fired: bool,
}

pub(super) struct Writer {
    pub(super) out: BufWriter<TcpStream>,
    pub(super) scratch: Vec<u8>,
}

/// The connection to one other rank.
pub(super) struct Peer {
    pub(super) rank: usize,
    /// For shutting the connection down.
    pub(super) stream: TcpStream,
    pub(super) writer: Mutex<Writer>,
    /// When the last byte arrived, in milliseconds since `Shared::epoch`.
    pub(super) last_seen_ms: AtomicU64,
    /// The peer said Bye.
    pub(super) gone: AtomicBool,
}

/// What the operation thread and the background threads share.
pub(super) struct Shared {
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) op_timeout: Duration,
    pub(super) liveness: Duration,
    pub(super) epoch: Instant,
    /// Indexed by the peer's rank: rank 0 holds ranks 1.., the others only rank 0.
    pub(super) peers: Vec<Option<Peer>>,
    pub(super) state: Mutex<State>,
    pub(super) closing: AtomicBool,
    pub(super) paused: AtomicBool,
    pub(super) stop: Mutex<bool>,
    pub(super) stop_signal: Condvar,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub(super) fn peers(&self) -> impl Iterator<Item = &Peer> {
        self.peers.iter().flatten()
    }

    pub(super) fn failure(&self) -> Option<GroupError> {
        lock(&self.state).failure.clone()
    }

    /// Records `error` as the group's failure unless one is recorded already (returns the first);
    /// rank 0 forwards it to every other rank but `skip`, and the handler is called once.
    pub(super) fn fail(&self, error: GroupError, skip: Option<usize>) -> GroupError {
        let handler = {
            let mut state = lock(&self.state);
            if let Some(first) = &state.failure {
                return first.clone();
            }
            if self.closing.load(Ordering::SeqCst) {
                return error;
            }
            state.failure = Some(error.clone());
            if state.fired {
                None
            } else {
                state.fired = state.handler.is_some();
                state.handler.clone()
            }
        };
        if self.rank == 0 {
            let text = encode_failure(&error);
            // The rank blamed last: if it is stalled, writing to it may block until the timeout.
            let mut order: Vec<usize> = (1..self.world)
                .filter(|&r| Some(r) != skip && Some(r) != error.rank)
                .collect();
            order.extend(error.rank.filter(|&r| r != 0 && Some(r) != skip));
            for r in order {
                let _ = self.send(r, Kind::Abort, &text, &[]);
            }
        }
        if let Some(handler) = handler {
            let error = error.clone();
            thread::spawn(move || handler(&error));
        }
        error
    }

    /// Sends one frame to rank `to` unless it said Bye.
    pub(super) fn send(
        &self,
        to: usize,
        kind: Kind,
        label: &str,
        payload: &[f32],
    ) -> io::Result<()> {
        let peer = self.peers[to]
            .as_ref()
            .ok_or_else(|| io::Error::other("no connection"))?;
        if peer.gone.load(Ordering::SeqCst) {
            return Err(io::Error::other(format!("rank {to} has left")));
        }
        let mut writer = lock(&peer.writer);
        let Writer { out, scratch } = &mut *writer;
        write_frame(out, scratch, kind, label, payload)
    }

    /// Sleeps for `duration` or until the group stops; true when it stops.
    fn wait_stop(&self, duration: Duration) -> bool {
        let stop = lock(&self.stop);
        let (stop, _) = self
            .stop_signal
            .wait_timeout_while(stop, duration, |stop| !*stop)
            .unwrap_or_else(|e| e.into_inner());
        *stop
    }
}

pub(super) fn reader_loop(
    shared: Arc<Shared>,
    from: usize,
    stream: TcpStream,
    inbox: Sender<(String, Vec<f32>)>,
) {
    let peer = shared.peers[from]
        .as_ref()
        .expect("reader of a missing peer");
    let mut input = BufReader::with_capacity(1 << 16, stream);
    let mut scratch = Vec::new();
    let touch = || peer.last_seen_ms.store(shared.now_ms(), Ordering::Relaxed);
    loop {
        match read_frame(&mut input, u64::MAX, &mut scratch, &mut || touch()) {
            Ok(frame) => {
                touch();
                match frame.kind {
                    Kind::Heartbeat => {}
                    Kind::Data => {
                        if inbox.send((frame.label, frame.payload)).is_err() {
                            return;
                        }
                    }
                    Kind::Abort => {
                        shared.fail(decode_failure(&frame.label, from), Some(from));
                    }
                    Kind::Bye => {
                        peer.gone.store(true, Ordering::SeqCst);
                        // Answer with the end of our side so the leaving rank's reader ends.
                        let _writer = lock(&peer.writer);
                        let _ = peer.stream.shutdown(Shutdown::Write);
                    }
                    kind => {
                        let message = format!(
                            "rank {from} sent an unexpected {kind:?} frame after the rendezvous"
                        );
                        shared.fail(group_error(message, Some(from)), None);
                    }
                }
            }
            Err(error) => {
                if !peer.gone.load(Ordering::SeqCst) {
                    let detail = if error.kind() == io::ErrorKind::UnexpectedEof {
                        String::new()
                    } else {
                        format!(" ({error})")
                    };
                    let message =
                        format!("rank {from}'s process exited or its connection broke{detail}");
                    shared.fail(group_error(message, Some(from)), Some(from));
                }
                return;
            }
        }
    }
}

pub(super) fn heartbeat_loop(shared: Arc<Shared>) {
    let every = (shared.liveness / 4).max(Duration::from_millis(1));
    while !shared.wait_stop(every) {
        if shared.paused.load(Ordering::SeqCst) {
            continue;
        }
        for peer in shared.peers() {
            let _ = shared.send(peer.rank, Kind::Heartbeat, "", &[]);
        }
    }
}

pub(super) fn watchdog_loop(shared: Arc<Shared>) {
    let every = (shared.liveness / 8).max(Duration::from_millis(1));
    let limit = shared.liveness.as_millis() as u64;
    while !shared.wait_stop(every) {
        if shared.failure().is_some() {
            continue;
        }
        for peer in shared.peers() {
            let silent = shared
                .now_ms()
                .saturating_sub(peer.last_seen_ms.load(Ordering::Relaxed));
            if !peer.gone.load(Ordering::SeqCst) && silent > limit {
                let message = format!(
                    "rank {} stopped answering: nothing received for {} (stalled, stopped or overloaded)",
                    peer.rank,
                    secs(Duration::from_millis(silent))
                );
                shared.fail(group_error(message, Some(peer.rank)), None);
                break;
            }
        }
    }
}
