//! What every part of the group shares: how a process joins ([`JoinConfig`]), the group's error
//! ([`GroupError`]), and the small helpers for waiting, locking and socket setup.

use std::fmt;
use std::io;
use std::net::TcpStream;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// How often a waiting operation looks at the group's failure.
pub(super) const POLL: Duration = Duration::from_millis(20);

/// How a process joins the group of a run.
#[derive(Debug, Clone)]
pub struct JoinConfig {
    /// "host:port" rank 0 listens on (binds it) and the others connect to.
    pub address: String,
    /// This process's rank, in `0..world`.
    pub rank: usize,
    /// The number of ranks of the run.
    pub world: usize,
    /// What must be equal on every rank, as (name, value) pairs, e.g. `("graph", "<hash>")`,
    /// `("resumed from step", "40")`. Rank 0 refuses a rank whose list differs and names the first
    /// differing name with both values.
    pub fingerprint: Vec<(String, String)>,
    /// How long the rendezvous waits for all ranks (non-root ranks retry connecting every
    /// ~100 ms until then).
    pub join_timeout: Duration,
    /// How long one collective waits for the other ranks to reach it (a rank alive but not
    /// arriving: a deadlock or a very slow step).
    pub op_timeout: Duration,
    /// A peer from which nothing (not even a heartbeat) has arrived for this long is declared
    /// stalled. Heartbeats are sent every `liveness / 4` by a background thread.
    pub liveness: Duration,
}

/// Why the group cannot go on, and the rank blamed, if any.
#[derive(Debug, Clone)]
pub struct GroupError {
    /// What happened, naming the ranks, the operation and the address involved.
    pub message: String,
    /// The rank blamed, if any.
    pub rank: Option<usize>,
}

impl fmt::Display for GroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for GroupError {}

pub(super) fn group_error(message: impl Into<String>, rank: Option<usize>) -> GroupError {
    GroupError {
        message: message.into(),
        rank,
    }
}

/// "30 s", "1.5 s".
pub(super) fn secs(duration: Duration) -> String {
    let s = duration.as_secs_f64();
    if s >= 10.0 || (s - s.round()).abs() < 1e-9 {
        format!("{} s", s.round() as u64)
    } else {
        format!("{s:.1} s")
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(super) fn setup(stream: &TcpStream, liveness: Duration) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(liveness.max(Duration::from_millis(10))))
}
