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

use std::fmt;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The first field of every Hello; ranks speaking another version are refused.
const PROTOCOL: &str = "flowrl-collective/1";
/// Payloads are converted to and from bytes in pieces of this size.
const CHUNK_BYTES: usize = 1 << 20;
/// How often a waiting operation looks at the group's failure.
const POLL: Duration = Duration::from_millis(20);
/// How often a non-root rank retries to connect during the rendezvous.
const RETRY: Duration = Duration::from_millis(100);
/// The largest frame accepted during the rendezvous.
const MAX_HELLO: u64 = 1 << 20;
/// The longest label of a frame.
const MAX_LABEL: usize = 1 << 20;
/// The most values reserved up front for an incoming payload.
const MAX_PREALLOC: usize = 1 << 26;
/// How long `close` waits for the peers to acknowledge Bye.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

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

fn group_error(message: impl Into<String>, rank: Option<usize>) -> GroupError {
    GroupError {
        message: message.into(),
        rank,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Hello = 1,
    Welcome = 2,
    Refuse = 3,
    Data = 4,
    Heartbeat = 5,
    Abort = 6,
    Bye = 7,
}

impl Kind {
    fn from_byte(byte: u8) -> Option<Kind> {
        Some(match byte {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Refuse,
            4 => Kind::Data,
            5 => Kind::Heartbeat,
            6 => Kind::Abort,
            7 => Kind::Bye,
            _ => return None,
        })
    }
}

struct Frame {
    kind: Kind,
    label: String,
    payload: Vec<f32>,
}

/// Writes one frame, converting the payload through `scratch` piece by piece, and flushes.
fn write_frame(
    out: &mut impl Write,
    scratch: &mut Vec<u8>,
    kind: Kind,
    label: &str,
    payload: &[f32],
) -> io::Result<()> {
    if label.len() > MAX_LABEL {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "frame label too long",
        ));
    }
    let len = 1 + 4 + label.len() as u64 + 4 * payload.len() as u64;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(&[kind as u8])?;
    out.write_all(&(label.len() as u32).to_le_bytes())?;
    out.write_all(label.as_bytes())?;
    for chunk in payload.chunks(CHUNK_BYTES / 4) {
        scratch.clear();
        for value in chunk {
            scratch.extend_from_slice(&value.to_le_bytes());
        }
        out.write_all(scratch)?;
    }
    out.flush()
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Reads one frame of at most `max_len` bytes; `progress` is called after every piece of payload.
fn read_frame(
    input: &mut impl Read,
    max_len: u64,
    scratch: &mut Vec<u8>,
    progress: &mut dyn FnMut(),
) -> io::Result<Frame> {
    let mut head = [0u8; 13];
    input.read_exact(&mut head)?;
    let len = u64::from_le_bytes(head[..8].try_into().unwrap());
    if !(5..=max_len).contains(&len) {
        return Err(invalid(format!("frame of {len} bytes")));
    }
    let kind = Kind::from_byte(head[8])
        .ok_or_else(|| invalid(format!("frame of unknown kind {}", head[8])))?;
    let label_len = u32::from_le_bytes(head[9..13].try_into().unwrap()) as u64;
    if label_len > len - 5 || label_len > MAX_LABEL as u64 {
        return Err(invalid(format!("frame label of {label_len} bytes")));
    }
    let mut label = vec![0u8; label_len as usize];
    input.read_exact(&mut label)?;
    let label = String::from_utf8(label).map_err(|_| invalid("frame label is not UTF-8".into()))?;
    let payload_bytes = len - 5 - label_len;
    if !payload_bytes.is_multiple_of(4) {
        return Err(invalid(format!("payload of {payload_bytes} bytes")));
    }
    let mut payload = Vec::with_capacity(((payload_bytes / 4) as usize).min(MAX_PREALLOC));
    let mut left = payload_bytes as usize;
    while left > 0 {
        let take = left.min(CHUNK_BYTES);
        scratch.resize(take, 0);
        input.read_exact(&mut scratch[..take])?;
        payload.extend(
            scratch[..take]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        left -= take;
        progress();
    }
    Ok(Frame {
        kind,
        label,
        payload,
    })
}

/// Sends one frame on a stream outside a running group (rendezvous).
fn send_once(stream: &TcpStream, kind: Kind, label: &str) -> io::Result<()> {
    write_frame(
        &mut BufWriter::new(stream),
        &mut Vec::new(),
        kind,
        label,
        &[],
    )
}

/// Packs strings as `<byte length>:<text>` one after the other.
fn encode_fields(fields: &[&str]) -> String {
    let mut out = String::new();
    for field in fields {
        out.push_str(&field.len().to_string());
        out.push(':');
        out.push_str(field);
    }
    out
}

fn decode_fields(mut text: &str) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    while !text.is_empty() {
        let colon = text.find(':')?;
        let len: usize = text[..colon].parse().ok()?;
        let end = colon.checked_add(1 + len)?;
        fields.push(text.get(colon + 1..end)?.to_string());
        text = &text[end..];
    }
    Some(fields)
}

fn encode_failure(error: &GroupError) -> String {
    let rank = error.rank.map(|r| r.to_string()).unwrap_or_default();
    encode_fields(&[&rank, &error.message])
}

fn decode_failure(text: &str, from: usize) -> GroupError {
    match decode_fields(text).as_deref() {
        Some([rank, message]) => group_error(message.clone(), rank.parse().ok()),
        _ => group_error(format!("rank {from} aborted: {text}"), Some(from)),
    }
}

/// "30 s", "1.5 s".
fn secs(duration: Duration) -> String {
    let s = duration.as_secs_f64();
    if s >= 10.0 || (s - s.round()).abs() < 1e-9 {
        format!("{} s", s.round() as u64)
    } else {
        format!("{s:.1} s")
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn setup(stream: &TcpStream, liveness: Duration) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(liveness.max(Duration::from_millis(10))))
}

type Handler = Arc<dyn Fn(&GroupError) + Send + Sync>;
type Fingerprint = Vec<(String, String)>;
type Inbox = Mutex<Receiver<(String, Vec<f32>)>>;

struct State {
    failure: Option<GroupError>,
    handler: Option<Handler>,
    /// Whether the handler was called (or must never be, after this rank's own abort).
    fired: bool,
}

struct Writer {
    out: BufWriter<TcpStream>,
    scratch: Vec<u8>,
}

/// The connection to one other rank.
struct Peer {
    rank: usize,
    /// For shutting the connection down.
    stream: TcpStream,
    writer: Mutex<Writer>,
    /// When the last byte arrived, in milliseconds since `Shared::epoch`.
    last_seen_ms: AtomicU64,
    /// The peer said Bye.
    gone: AtomicBool,
}

/// What the operation thread and the background threads share.
struct Shared {
    rank: usize,
    world: usize,
    op_timeout: Duration,
    liveness: Duration,
    epoch: Instant,
    /// Indexed by the peer's rank: rank 0 holds ranks 1.., the others only rank 0.
    peers: Vec<Option<Peer>>,
    state: Mutex<State>,
    closing: AtomicBool,
    paused: AtomicBool,
    stop: Mutex<bool>,
    stop_signal: Condvar,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn peers(&self) -> impl Iterator<Item = &Peer> {
        self.peers.iter().flatten()
    }

    fn failure(&self) -> Option<GroupError> {
        lock(&self.state).failure.clone()
    }

    /// Records `error` as the group's failure unless one is recorded already (returns the first);
    /// rank 0 forwards it to every other rank but `skip`, and the handler is called once.
    fn fail(&self, error: GroupError, skip: Option<usize>) -> GroupError {
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
    fn send(&self, to: usize, kind: Kind, label: &str, payload: &[f32]) -> io::Result<()> {
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

fn reader_loop(
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

fn heartbeat_loop(shared: Arc<Shared>) {
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

fn watchdog_loop(shared: Arc<Shared>) {
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

/// Rank 0's rendezvous: the connections to ranks 1.., indexed by rank.
fn rendezvous_root(config: &JoinConfig) -> Result<Vec<Option<TcpStream>>, GroupError> {
    let address = &config.address;
    let listener = TcpListener::bind(address)
        .and_then(|listener| listener.set_nonblocking(true).map(|_| listener))
        .map_err(|e| group_error(format!("rank 0 cannot listen on {address}: {e}"), Some(0)))?;
    let deadline = Instant::now() + config.join_timeout;
    let mut joined: Vec<Option<(TcpStream, SocketAddr)>> =
        (0..config.world).map(|_| None).collect();
    let refuse_all = |error: &GroupError, joined: &[Option<(TcpStream, SocketAddr)>]| {
        for (stream, _) in joined.iter().flatten() {
            let _ = send_once(stream, Kind::Refuse, &encode_failure(error));
        }
    };
    loop {
        let missing: Vec<usize> = (1..config.world).filter(|&r| joined[r].is_none()).collect();
        if missing.is_empty() {
            break;
        }
        match listener.accept() {
            Ok((stream, from)) => match admit(config, &stream, from, deadline, &joined) {
                Ok(Some(rank)) => joined[rank] = Some((stream, from)),
                Ok(None) => {}
                Err(error) => {
                    let _ = send_once(&stream, Kind::Refuse, &encode_failure(&error));
                    refuse_all(&error, &joined);
                    return Err(error);
                }
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() >= deadline => {
                let list = missing
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                let ranks = if missing.len() == 1 { "rank" } else { "ranks" };
                let message = format!(
                    "{ranks} {list} of {} did not join within {} at {address}",
                    config.world,
                    secs(config.join_timeout)
                );
                let error = group_error(message, Some(missing[0]));
                refuse_all(&error, &joined);
                return Err(error);
            }
            Err(_) => thread::sleep(POLL),
        }
    }
    for (rank, (stream, _)) in joined
        .iter()
        .enumerate()
        .filter_map(|(rank, entry)| Some((rank, entry.as_ref()?)))
    {
        if let Err(e) = send_once(stream, Kind::Welcome, "") {
            let error = group_error(
                format!("rank {rank}'s connection broke during the rendezvous at {address}: {e}"),
                Some(rank),
            );
            refuse_all(&error, &joined);
            return Err(error);
        }
    }
    Ok(joined
        .into_iter()
        .map(|entry| entry.map(|(stream, _)| stream))
        .collect())
}

/// Reads the Hello of a new connection: its rank when admitted, `None` when it is not a rank of
/// a run (ignored), an error when the run must be refused.
fn admit(
    config: &JoinConfig,
    stream: &TcpStream,
    from: SocketAddr,
    deadline: Instant,
    joined: &[Option<(TcpStream, SocketAddr)>],
) -> Result<Option<usize>, GroupError> {
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    if stream
        .set_nonblocking(false)
        .and_then(|_| setup(stream, config.liveness))
        .and_then(|_| stream.set_read_timeout(Some(wait)))
        .is_err()
    {
        return Ok(None);
    }
    let hello = match read_frame(&mut &*stream, MAX_HELLO, &mut Vec::new(), &mut || {}) {
        Ok(frame) if frame.kind == Kind::Hello => frame,
        _ => return Ok(None),
    };
    let Some((protocol, rank, world, theirs)) = parse_hello(&hello.label) else {
        return Ok(None);
    };
    let refused = |message: String, rank: Option<usize>| {
        let message = format!("rendezvous at {} refused: {message}", config.address);
        Err(group_error(message, rank))
    };
    if protocol != PROTOCOL {
        let message = format!("a process at {from} speaks {protocol}, rank 0 speaks {PROTOCOL}");
        return refused(message, None);
    }
    if world != config.world {
        let message = format!(
            "rank {rank} says the run has {world} ranks, rank 0 says {}",
            config.world
        );
        return refused(message, Some(rank));
    }
    if rank == 0 || rank >= world {
        let message = format!("a process at {from} says it is rank {rank} of {world}");
        return refused(message, None);
    }
    if let Some((_, earlier)) = &joined[rank] {
        let message = format!("rank {rank} joined twice (from {earlier} and from {from})");
        return refused(message, Some(rank));
    }
    match difference(rank, &config.fingerprint, &theirs) {
        Some(message) => refused(message, Some(rank)),
        None => Ok(Some(rank)),
    }
}

/// Hello: protocol, rank, world and the fingerprint's (name, value) pairs.
fn parse_hello(text: &str) -> Option<(String, usize, usize, Fingerprint)> {
    let mut fields = decode_fields(text)?.into_iter();
    let protocol = fields.next()?;
    let rank = fields.next()?.parse().ok()?;
    let world = fields.next()?.parse().ok()?;
    let rest: Vec<String> = fields.collect();
    let pairs = rest
        .chunks(2)
        .map(|pair| Some((pair[0].clone(), pair.get(1)?.clone())));
    Some((protocol, rank, world, pairs.collect::<Option<_>>()?))
}

/// The first setting that differs between rank 0 (`ours`) and rank `rank` (`theirs`).
fn difference(
    rank: usize,
    ours: &[(String, String)],
    theirs: &[(String, String)],
) -> Option<String> {
    let value = |list: &[(String, String)], name: &str| {
        let found = list.iter().find(|(n, _)| n == name);
        found.map_or("no such setting".to_string(), |(_, v)| format!("`{v}`"))
    };
    ours.iter().chain(theirs).find_map(|(name, _)| {
        let (mine, other) = (value(ours, name), value(theirs, name));
        let message = format!("`{name}` differs: rank {rank} has {other}, rank 0 has {mine}");
        (mine != other).then_some(message)
    })
}

fn connect_once(address: &str, deadline: Instant) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the address resolves to nothing");
    for target in address.to_socket_addrs()? {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(10), Duration::from_secs(2));
        match TcpStream::connect_timeout(&target, wait) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// A non-root rank's rendezvous: the connection to rank 0.
fn rendezvous_peer(config: &JoinConfig) -> Result<TcpStream, GroupError> {
    let (rank, address) = (config.rank, &config.address);
    let deadline = Instant::now() + config.join_timeout;
    let stream = loop {
        match connect_once(address, deadline) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() >= deadline => {
                let message = format!(
                    "rank {rank} cannot reach rank 0 at {address} within {} ({e})",
                    secs(config.join_timeout)
                );
                return Err(group_error(message, Some(0)));
            }
            Err(_) => thread::sleep(RETRY.min(deadline.saturating_duration_since(Instant::now()))),
        }
    };
    let broke = |e: io::Error| {
        group_error(
            format!(
                "rank {rank} lost its connection to rank 0 at {address} during the rendezvous: {e}"
            ),
            Some(0),
        )
    };
    setup(&stream, config.liveness).map_err(broke)?;
    let (rank_text, world_text) = (rank.to_string(), config.world.to_string());
    let mut fields = vec![PROTOCOL, &rank_text, &world_text];
    fields.extend(
        config
            .fingerprint
            .iter()
            .flat_map(|(name, value)| [name.as_str(), value.as_str()]),
    );
    send_once(&stream, Kind::Hello, &encode_fields(&fields)).map_err(broke)?;
    // Rank 0 was listening before this connection, so it answers within its join timeout from now.
    stream
        .set_read_timeout(Some(config.join_timeout + Duration::from_secs(1)))
        .map_err(broke)?;
    let why = match read_frame(&mut &stream, MAX_HELLO, &mut Vec::new(), &mut || {}) {
        Ok(frame) if frame.kind == Kind::Welcome => {
            stream.set_read_timeout(None).map_err(broke)?;
            return Ok(stream);
        }
        Ok(frame) if frame.kind == Kind::Refuse => return Err(decode_failure(&frame.label, 0)),
        Ok(frame) => format!("it answered with {:?}", frame.kind),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            format!("no answer within {}", secs(config.join_timeout))
        }
        Err(e) => format!("the connection ended ({e}); rank 0's own error names the reason"),
    };
    let message = format!("rank {rank} was not welcomed by rank 0 at {address}: {why}");
    Err(group_error(message, Some(0)))
}

/// What rank 0 answers in a collective: rank r receives `values[parts[r]]`.
struct Answer {
    values: Vec<f32>,
    parts: Vec<Range<usize>>,
}

impl Answer {
    fn to_all(values: Vec<f32>, world: usize) -> Answer {
        let parts = vec![0..values.len(); world];
        Answer { values, parts }
    }
}

/// `first + rows[0] + rows[1] + …` element by element, in this order.
fn sum_in_rank_order(first: &[f32], rows: &[Vec<f32>]) -> Vec<f32> {
    let mut sum = first.to_vec();
    for row in rows {
        sum.iter_mut()
            .zip(row)
            .for_each(|(sum, value)| *sum += *value);
    }
    sum
}

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

    /// Element-wise sum over ranks, summed at rank 0 in rank order (0, 1, …, W−1, sequential f32
    /// adds), result written back into `data` on every rank (identical bits everywhere).
    pub fn all_reduce_sum(&self, label: &str, data: &mut [f32]) -> Result<(), GroupError> {
        let what = format!("all_reduce_sum `{label}`");
        let sig = format!("{what} over {} values", data.len());
        let world = self.world();
        let sum = self.exchange(&what, &sig, data, |rows| {
            Answer::to_all(sum_in_rank_order(data, &rows[1..]), world)
        })?;
        data.copy_from_slice(&sum);
        Ok(())
    }

    /// Every rank passes its own segment `mine` (`mine.len() == counts[rank]`); returns the
    /// concatenation of all ranks' segments in rank order (`counts.iter().sum()` values).
    pub fn all_gather(
        &self,
        label: &str,
        mine: &[f32],
        counts: &[usize],
    ) -> Result<Vec<f32>, GroupError> {
        self.gather("all_gather", label, mine, counts, true)
    }

    /// [`TcpGroup::all_gather`] whose answer only rank 0 receives (`Some`; the others `None`
    /// once rank 0 has it): how one rank collects what is written once, without sending it back.
    pub fn gather_to_root(
        &self,
        label: &str,
        mine: &[f32],
        counts: &[usize],
    ) -> Result<Option<Vec<f32>>, GroupError> {
        let all = self.gather("gather_to_root", label, mine, counts, false)?;
        Ok((self.rank() == 0).then_some(all))
    }

    /// The concatenation of every rank's `mine`, answered to every rank (`to_all`) or to rank
    /// 0 only (the others get nothing).
    fn gather(
        &self,
        op: &str,
        label: &str,
        mine: &[f32],
        counts: &[usize],
        to_all: bool,
    ) -> Result<Vec<f32>, GroupError> {
        let what = format!("{op} `{label}`");
        self.check_counts(&what, counts)?;
        if mine.len() != counts[self.rank()] {
            let problem = format!(
                "this rank passes {} values but counts[{}] is {}",
                mine.len(),
                self.rank(),
                counts[self.rank()]
            );
            return Err(self.invalid(&what, problem));
        }
        let world = self.world();
        self.exchange(
            &what,
            &format!("{what} with counts {counts:?}"),
            mine,
            |rows| {
                let mut all = mine.to_vec();
                rows[1..].iter().for_each(|row| all.extend_from_slice(row));
                let mut parts = vec![0..all.len(); world];
                if !to_all {
                    parts[1..].fill(0..0);
                }
                Answer { values: all, parts }
            },
        )
    }

    /// Every rank passes a full buffer (`counts.iter().sum()` values); returns rank r's segment
    /// (`counts[r]` values, starting at `counts[..r].iter().sum()`) of the element-wise sum (same
    /// summation order as [`TcpGroup::all_reduce_sum`]). Rank 0 sends each rank only its segment.
    pub fn reduce_scatter_sum(
        &self,
        label: &str,
        data: &[f32],
        counts: &[usize],
    ) -> Result<Vec<f32>, GroupError> {
        let what = format!("reduce_scatter_sum `{label}`");
        self.check_counts(&what, counts)?;
        let total: usize = counts.iter().sum();
        if data.len() != total {
            let problem = format!(
                "this rank passes {} values but the counts add up to {total}",
                data.len()
            );
            return Err(self.invalid(&what, problem));
        }
        self.exchange(
            &what,
            &format!("{what} with counts {counts:?}"),
            data,
            |rows| {
                let mut end = 0;
                let parts = counts
                    .iter()
                    .map(|&count| {
                        end += count;
                        end - count..end
                    })
                    .collect();
                Answer {
                    values: sum_in_rank_order(data, &rows[1..]),
                    parts,
                }
            },
        )
    }

    /// `data` of rank `root` replaces `data` on every rank (the length may differ before the
    /// call on the other ranks).
    pub fn broadcast(
        &self,
        label: &str,
        data: &mut Vec<f32>,
        root: usize,
    ) -> Result<(), GroupError> {
        let what = format!("broadcast `{label}`");
        if root >= self.world() {
            return Err(self.invalid(
                &what,
                format!(
                    "root {root} is not a rank of a run of {} ranks",
                    self.world()
                ),
            ));
        }
        let (world, is_root) = (self.world(), self.rank() == root);
        let mine: &[f32] = if is_root { data } else { &[] };
        let values = self.exchange(
            &what,
            &format!("{what} from rank {root}"),
            mine,
            |mut rows| {
                let values = if root == 0 {
                    data.clone()
                } else {
                    std::mem::take(&mut rows[root])
                };
                let mut parts = vec![0..values.len(); world];
                parts[root] = 0..0; // the root only learns that everyone arrived
                Answer { values, parts }
            },
        )?;
        if !is_root {
            *data = values;
        }
        Ok(())
    }

    /// Returns once every rank has called `barrier` with the same label.
    pub fn barrier(&self, label: &str) -> Result<(), GroupError> {
        let what = format!("barrier `{label}`");
        let world = self.world();
        self.exchange(&what, &what, &[], |_| Answer::to_all(Vec::new(), world))
            .map(drop)
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

    fn check(&self) -> Result<(), GroupError> {
        self.failure().map_or(Ok(()), Err)
    }

    /// A mistake of this rank's caller: fails the group (telling the others), returns the failure.
    fn invalid(&self, what: &str, problem: String) -> GroupError {
        self.abort(&format!("{what}: {problem}"));
        self.failure().expect("abort records a failure")
    }

    fn check_counts(&self, what: &str, counts: &[usize]) -> Result<(), GroupError> {
        if counts.len() == self.world() {
            return Ok(());
        }
        Err(self.invalid(
            what,
            format!(
                "counts has {} entries for a run of {} ranks",
                counts.len(),
                self.world()
            ),
        ))
    }

    /// One collective: every rank sends `mine` (under the signature `sig`) to rank 0, which
    /// computes the answer from every rank's values (`rows[r]` for r ≥ 1, its own are `mine`),
    /// sends each rank its part and returns its own.
    fn exchange(
        &self,
        what: &str,
        sig: &str,
        mine: &[f32],
        compute: impl FnOnce(Vec<Vec<f32>>) -> Answer,
    ) -> Result<Vec<f32>, GroupError> {
        self.check()?;
        if self.rank() != 0 {
            // Rank 0 knows which rank is missing: it gets the time to report first.
            let deadline = Instant::now() + self.shared.op_timeout + self.shared.liveness;
            self.send_data(0, sig, what, mine)?;
            return self.receive(0, sig, what, deadline);
        }
        let deadline = Instant::now() + self.shared.op_timeout;
        let mut rows = vec![Vec::new()];
        for r in 1..self.world() {
            rows.push(self.receive(r, sig, what, deadline)?);
        }
        let Answer { values, parts } = compute(rows);
        for r in 1..self.world() {
            self.send_data(r, sig, what, &values[parts[r].clone()])?;
        }
        Ok(if parts[0] == (0..values.len()) {
            values
        } else {
            values[parts[0].clone()].to_vec()
        })
    }

    fn send_data(
        &self,
        to: usize,
        sig: &str,
        what: &str,
        values: &[f32],
    ) -> Result<(), GroupError> {
        self.shared.send(to, Kind::Data, sig, values).map_err(|e| {
            let message = format!(
                "rank {} cannot send {what} to rank {to}: the connection broke ({e})",
                self.rank()
            );
            self.shared.fail(group_error(message, Some(to)), None)
        })
    }

    /// Waits for the Data frame of rank `from` for the operation `sig` until `deadline`.
    fn receive(
        &self,
        from: usize,
        sig: &str,
        what: &str,
        deadline: Instant,
    ) -> Result<Vec<f32>, GroupError> {
        let inbox = lock(
            self.inboxes[from]
                .as_ref()
                .expect("no connection to this rank"),
        );
        let me = self.rank();
        loop {
            self.check()?;
            let now = Instant::now();
            if now >= deadline {
                let error = if me == 0 {
                    group_error(
                        format!(
                            "rank {from} did not reach {what} within {}",
                            secs(self.shared.op_timeout)
                        ),
                        Some(from),
                    )
                } else {
                    let waited = secs(self.shared.op_timeout + self.shared.liveness);
                    group_error(
                        format!(
                            "{what} did not complete within {waited}: the run's other ranks did not all reach it (no answer from rank 0)"
                        ),
                        None,
                    )
                };
                return Err(self.shared.fail(error, None));
            }
            match inbox.recv_timeout(POLL.min(deadline - now)) {
                Ok((got, values)) if got == sig => return Ok(values),
                Ok((got, _)) => {
                    let (caller, answered) = if me == 0 {
                        (from, "called")
                    } else {
                        (0, "answered")
                    };
                    let message = format!(
                        "collective mismatch: rank {caller} {answered} {got} where rank {me} called {sig}"
                    );
                    return Err(self.shared.fail(group_error(message, Some(caller)), None));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.check()?;
                    let peer = self.shared.peers[from]
                        .as_ref()
                        .expect("no connection to this rank");
                    let message = if peer.gone.load(Ordering::SeqCst) {
                        format!(
                            "rank {from} left the group (it closed normally) but rank {me} called {what}"
                        )
                    } else {
                        format!("rank {from}'s process exited or its connection broke")
                    };
                    return Err(self.shared.fail(group_error(message, Some(from)), None));
                }
            }
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
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::AtomicUsize;

    const _: fn() = || {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<TcpGroup>();
    };

    fn free_address() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
    }

    fn config(address: &str, rank: usize, world: usize) -> JoinConfig {
        JoinConfig {
            address: address.to_string(),
            rank,
            world,
            fingerprint: vec![
                ("graph".into(), "abc".into()),
                ("resumed from step".into(), "40".into()),
            ],
            join_timeout: Duration::from_secs(10),
            op_timeout: Duration::from_secs(20),
            liveness: Duration::from_secs(5),
        }
    }

    /// Runs `body` on `world` rank threads joined at `config(rank)`; returns their results.
    fn run<T: Send>(
        world: usize,
        config: impl Fn(usize) -> JoinConfig + Sync,
        body: impl Fn(usize, TcpGroup) -> T + Sync,
    ) -> Vec<T> {
        thread::scope(|s| {
            let handles: Vec<_> = (0..world)
                .map(|rank| {
                    let (config, body) = (&config, &body);
                    s.spawn(move || {
                        body(
                            rank,
                            TcpGroup::join(config(rank))
                                .unwrap_or_else(|e| panic!("rank {rank} join: {e}")),
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn joins(configs: Vec<JoinConfig>) -> Vec<Result<TcpGroup, GroupError>> {
        thread::scope(|s| {
            let handles: Vec<_> = configs
                .into_iter()
                .map(|c| s.spawn(move || TcpGroup::join(c)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    fn inputs(rank: usize) -> Vec<f32> {
        match rank {
            0 => vec![1e8, 1.0, 0.1, -3.5, 7.0],
            1 => vec![1.0, 1e8, 0.2, 1e-3, 1.5],
            _ => vec![-1e8, -1e8, 0.3, 2.25, -0.75],
        }
    }

    #[test]
    fn collectives_are_correct_and_identical_on_every_rank() {
        let address = free_address();
        let outputs = run(
            3,
            |r| config(&address, r, 3),
            |rank, g| {
                let mut out = Vec::new();
                let mut data = inputs(rank);
                g.all_reduce_sum("grads", &mut data).unwrap();
                let expected: Vec<f32> = (0..5)
                    .map(|i| inputs(0)[i] + inputs(1)[i] + inputs(2)[i])
                    .collect();
                assert_eq!(expected[0], 0.0, "rank order matters for this value");
                assert_eq!(bits(&data), bits(&expected));
                out.push(bits(&data));

                let counts = [2, 0, 3];
                let mine: Vec<f32> = (0..counts[rank])
                    .map(|i| (rank * 10 + i) as f32 + 0.5)
                    .collect();
                let all = g.all_gather("params", &mine, &counts).unwrap();
                assert_eq!(all, vec![0.5, 1.5, 20.5, 21.5, 22.5]);
                let at_root = g.gather_to_root("state", &mine, &counts).unwrap();
                assert_eq!(at_root, (rank == 0).then_some(all));

                let counts = [1, 3, 0];
                let full: Vec<f32> = (0..4).map(|i| inputs(rank)[i] * (i + 1) as f32).collect();
                let segment = g.reduce_scatter_sum("shards", &full, &counts).unwrap();
                let term = |r: usize, i: usize| inputs(r)[i] * (i + 1) as f32;
                let summed: Vec<f32> = (0..4)
                    .map(|i| term(0, i) + term(1, i) + term(2, i))
                    .collect();
                let start: usize = counts[..rank].iter().sum();
                assert_eq!(bits(&segment), bits(&summed[start..start + counts[rank]]));

                for root in [1, 2, 0] {
                    let mut data = if rank == root {
                        vec![root as f32, 2.0, 3.0]
                    } else {
                        vec![9.0; rank]
                    };
                    g.broadcast("weights", &mut data, root).unwrap();
                    assert_eq!(data, vec![root as f32, 2.0, 3.0]);
                }
                g.barrier("end of setup").unwrap();

                for i in 0..2000 {
                    let mut data = [rank as f32, i as f32, 1.0];
                    g.all_reduce_sum("loop", &mut data).unwrap();
                    assert_eq!(data, [3.0, 3.0 * i as f32, 3.0]);
                }

                let n = 16 << 20; // 64 MiB of f32
                let mut big: Vec<f32> = (0..n)
                    .map(|i| (i % 1000) as f32 * (rank + 1) as f32)
                    .collect();
                g.all_reduce_sum("big", &mut big).unwrap();
                assert!(
                    big.iter()
                        .enumerate()
                        .all(|(i, v)| *v == (i % 1000) as f32 * 6.0)
                );
                assert!(g.failure().is_none());
                g.close();
                out
            },
        );
        assert!(outputs.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn a_group_of_one_is_the_identity() {
        let g = TcpGroup::join(config("127.0.0.1:1", 0, 1)).unwrap();
        let mut data = vec![1.0, 2.0];
        g.all_reduce_sum("x", &mut data).unwrap();
        assert_eq!(data, vec![1.0, 2.0]);
        assert_eq!(g.all_gather("x", &[3.0], &[1]).unwrap(), vec![3.0]);
        assert_eq!(
            g.gather_to_root("x", &[3.0], &[1]).unwrap(),
            Some(vec![3.0])
        );
        assert_eq!(g.reduce_scatter_sum("x", &[4.0], &[1]).unwrap(), vec![4.0]);
        g.broadcast("x", &mut data, 0).unwrap();
        g.barrier("x").unwrap();
        g.close();
    }

    fn all_refused(results: Vec<Result<TcpGroup, GroupError>>, needles: &[&str]) {
        for result in results {
            let error = result.err().expect("the rendezvous must fail");
            for needle in needles {
                assert!(
                    error.message.contains(needle),
                    "`{needle}` missing from: {error}"
                );
            }
        }
    }

    #[test]
    fn rendezvous_refuses_a_different_world() {
        let address = free_address();
        let mut other = config(&address, 1, 3);
        other.join_timeout = Duration::from_secs(5);
        all_refused(
            joins(vec![config(&address, 0, 2), other]),
            &["rank 1 says the run has 3 ranks, rank 0 says 2"],
        );
    }

    #[test]
    fn rendezvous_refuses_a_duplicated_rank() {
        let address = free_address();
        all_refused(
            joins(vec![
                config(&address, 0, 3),
                config(&address, 1, 3),
                config(&address, 1, 3),
            ]),
            &["rank 1 joined twice"],
        );
    }

    #[test]
    fn rendezvous_refuses_a_different_fingerprint() {
        let address = free_address();
        let mut other = config(&address, 1, 2);
        other.fingerprint[1].1 = "0".into();
        all_refused(
            joins(vec![config(&address, 0, 2), other]),
            &[
                "`resumed from step`",
                "rank 1 has `0`",
                "rank 0 has `40`",
                &address,
            ],
        );
    }

    #[test]
    fn rank_zero_names_a_busy_address() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap().to_string();
        let error = TcpGroup::join(config(&address, 0, 2)).err().unwrap();
        assert!(error.message.contains(&address), "{error}");
    }

    #[test]
    fn a_missing_rank_zero_is_named_after_the_join_timeout() {
        let address = free_address();
        let mut c = config(&address, 1, 2);
        c.join_timeout = Duration::from_secs(1);
        let start = Instant::now();
        let error = TcpGroup::join(c).err().unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(900)
                && start.elapsed() < Duration::from_secs(5)
        );
        assert!(
            error.message.contains(&address) && error.message.contains("cannot reach rank 0"),
            "{error}"
        );
    }

    #[test]
    fn a_missing_rank_is_named_by_rank_zero() {
        let address = free_address();
        let mut c = config(&address, 0, 3);
        c.join_timeout = Duration::from_secs(1);
        let results = joins(vec![c, config(&address, 1, 3)]);
        all_refused(results, &["rank 2 of 3 did not join within 1 s", &address]);
    }

    /// Runs `body` on 3 ranks that meet at a barrier first and, after `body`, wait for each
    /// other before dropping their groups.
    fn scenario<T: Send>(
        config: impl Fn(usize) -> JoinConfig + Sync,
        body: impl Fn(usize, &TcpGroup) -> T + Sync,
    ) -> Vec<T> {
        let end = Barrier::new(3);
        run(3, config, |rank, g| {
            g.barrier("start").unwrap();
            let result = body(rank, &g);
            end.wait();
            result
        })
    }

    fn timed_reduce(g: &TcpGroup, label: &str) -> (Option<GroupError>, Duration) {
        let start = Instant::now();
        let mut data = vec![1.0; 8];
        (g.all_reduce_sum(label, &mut data).err(), start.elapsed())
    }

    #[test]
    fn a_dead_rank_is_named_quickly() {
        let address = free_address();
        let results = run(
            3,
            |r| config(&address, r, 3),
            |rank, g| {
                g.barrier("start").unwrap();
                if rank == 2 {
                    thread::sleep(Duration::from_millis(200));
                    drop(g);
                    return None;
                }
                Some(timed_reduce(&g, "step"))
            },
        );
        for (error, took) in results.into_iter().flatten() {
            let error = error.expect("the all-reduce must fail");
            assert!(took < Duration::from_secs(5), "{took:?}");
            assert!(error.message.contains("rank 2's process exited"), "{error}");
            assert_eq!(error.rank, Some(2));
        }
    }

    #[test]
    fn a_stalled_rank_is_named_and_the_handler_fires_outside_operations() {
        let address = free_address();
        let results = scenario(
            |r| JoinConfig {
                liveness: Duration::from_secs(1),
                ..config(&address, r, 3)
            },
            |rank, g| {
                let (sender, receiver) = mpsc::channel();
                g.on_failure(Box::new(move |e| {
                    let _ = sender.send(e.clone());
                }));
                let start = Instant::now();
                let in_op = match rank {
                    0 => timed_reduce(g, "step").0,
                    2 => {
                        g.pause_heartbeats();
                        None
                    }
                    _ => None,
                };
                let handled = receiver.recv_timeout(Duration::from_secs(10)).ok();
                (in_op, handled, start.elapsed())
            },
        );
        for (rank, (in_op, handled, took)) in results.into_iter().enumerate() {
            let handled = handled.unwrap_or_else(|| panic!("rank {rank}: handler not called"));
            assert!(
                handled.message.contains("rank 2 stopped answering"),
                "{handled}"
            );
            assert!(took < Duration::from_secs(5), "rank {rank}: {took:?}");
            if rank == 0 {
                assert!(
                    in_op
                        .expect("the all-reduce must fail")
                        .message
                        .contains("rank 2 stopped answering")
                );
            }
        }
    }

    #[test]
    fn a_stalled_rank_zero_is_named_by_the_others() {
        let address = free_address();
        let results = scenario(
            |r| JoinConfig {
                liveness: Duration::from_secs(1),
                ..config(&address, r, 3)
            },
            |rank, g| {
                if rank == 0 {
                    g.pause_heartbeats();
                    thread::sleep(Duration::from_secs(2));
                    return None;
                }
                Some(timed_reduce(g, "step"))
            },
        );
        for (error, took) in results.into_iter().flatten() {
            let error = error.expect("the all-reduce must fail");
            assert!(
                error.message.contains("rank 0 stopped answering"),
                "{error}"
            );
            assert!(took < Duration::from_secs(5), "{took:?}");
        }
    }

    #[test]
    fn a_label_mismatch_is_named_on_every_rank() {
        let address = free_address();
        let results = scenario(
            |r| config(&address, r, 3),
            |rank, g| timed_reduce(g, if rank == 1 { "b" } else { "a" }).0,
        );
        for error in results {
            let error = error.expect("the all-reduce must fail");
            assert!(
                error
                    .message
                    .contains("collective mismatch: rank 1 called all_reduce_sum `b`"),
                "{error}"
            );
            assert!(
                error.message.contains("rank 0 called all_reduce_sum `a`"),
                "{error}"
            );
        }
    }

    #[test]
    fn an_abort_reaches_every_rank() {
        let address = free_address();
        let results = scenario(
            |r| config(&address, r, 3),
            |rank, g| {
                if rank == 2 {
                    g.abort("out of memory");
                    return g.barrier("after").err();
                }
                timed_reduce(g, "step").0
            },
        );
        for error in results {
            let error = error.expect("every rank must fail");
            assert!(
                error.message.contains("rank 2 failed: out of memory"),
                "{error}"
            );
            assert_eq!(error.rank, Some(2));
        }
    }

    #[test]
    fn a_rank_that_never_arrives_is_named_after_the_op_timeout() {
        let address = free_address();
        let results = scenario(
            |r| JoinConfig {
                op_timeout: Duration::from_secs(1),
                liveness: Duration::from_secs(3),
                ..config(&address, r, 3)
            },
            |rank, g| {
                if rank == 2 {
                    let start = Instant::now();
                    while g.failure().is_none() && start.elapsed() < Duration::from_secs(10) {
                        thread::sleep(Duration::from_millis(10));
                    }
                    return (g.failure(), Duration::from_secs(1));
                }
                timed_reduce(g, "step")
            },
        );
        for (error, took) in results {
            let error = error.expect("every rank must fail");
            assert!(
                error
                    .message
                    .contains("rank 2 did not reach all_reduce_sum `step` within 1 s"),
                "{error}"
            );
            assert!(
                took >= Duration::from_millis(900) && took < Duration::from_secs(5),
                "{took:?}"
            );
        }
    }

    #[test]
    fn close_is_not_a_failure() {
        let address = free_address();
        let calls = Arc::new(AtomicUsize::new(0));
        run(
            3,
            |r| config(&address, r, 3),
            |rank, g| {
                let calls = calls.clone();
                g.on_failure(Box::new(move |_| {
                    calls.fetch_add(1, Ordering::SeqCst);
                }));
                g.barrier("last").unwrap();
                if rank == 1 {
                    thread::sleep(Duration::from_millis(100));
                }
                assert!(g.failure().is_none());
                g.close();
            },
        );
        thread::sleep(Duration::from_millis(500));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }
}
