//! The rendezvous that starts a group: rank 0 listens and admits every other rank whose Hello
//! matches its own settings (or refuses them all), the others connect to it and wait for Welcome.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use super::basics::{GroupError, JoinConfig, POLL, group_error, secs, setup};
use super::wire::{
    Kind, decode_failure, decode_fields, encode_failure, encode_fields, read_frame, send_once,
};

/// The first field of every Hello; ranks speaking another version are refused.
const PROTOCOL: &str = "flowrl-collective/1";
/// How often a non-root rank retries to connect during the rendezvous.
const RETRY: Duration = Duration::from_millis(100);
/// The largest frame accepted during the rendezvous.
const MAX_HELLO: u64 = 1 << 20;

type Fingerprint = Vec<(String, String)>;

/// Rank 0's rendezvous: the connections to ranks 1.., indexed by rank.
pub(super) fn rendezvous_root(config: &JoinConfig) -> Result<Vec<Option<TcpStream>>, GroupError> {
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
pub(super) fn rendezvous_peer(config: &JoinConfig) -> Result<TcpStream, GroupError> {
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
