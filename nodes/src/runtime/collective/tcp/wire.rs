//! The wire format of the collective protocol: frames (a length, a kind byte, a label and an `f32`
//! payload) and the `<length>:<text>` fields packed into labels (Hello, Refuse and Abort texts).

use std::io::{self, BufWriter, Read, Write};
use std::net::TcpStream;

use super::basics::{GroupError, group_error};

/// Payloads are converted to and from bytes in pieces of this size.
const CHUNK_BYTES: usize = 1 << 20;
/// The longest label of a frame.
const MAX_LABEL: usize = 1 << 20;
/// The most values reserved up front for an incoming payload.
const MAX_PREALLOC: usize = 1 << 26;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
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

pub(super) struct Frame {
    pub(super) kind: Kind,
    pub(super) label: String,
    pub(super) payload: Vec<f32>,
}

/// Writes one frame, converting the payload through `scratch` piece by piece, and flushes.
pub(super) fn write_frame(
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
pub(super) fn read_frame(
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
pub(super) fn send_once(stream: &TcpStream, kind: Kind, label: &str) -> io::Result<()> {
    write_frame(
        &mut BufWriter::new(stream),
        &mut Vec::new(),
        kind,
        label,
        &[],
    )
}

/// Packs strings as `<byte length>:<text>` one after the other.
pub(super) fn encode_fields(fields: &[&str]) -> String {
    let mut out = String::new();
    for field in fields {
        out.push_str(&field.len().to_string());
        out.push(':');
        out.push_str(field);
    }
    out
}

pub(super) fn decode_fields(mut text: &str) -> Option<Vec<String>> {
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

pub(super) fn encode_failure(error: &GroupError) -> String {
    let rank = error.rank.map(|r| r.to_string()).unwrap_or_default();
    encode_fields(&[&rank, &error.message])
}

pub(super) fn decode_failure(text: &str, from: usize) -> GroupError {
    match decode_fields(text).as_deref() {
        Some([rank, message]) => group_error(message.clone(), rank.parse().ok()),
        _ => group_error(format!("rank {from} aborted: {text}"), Some(from)),
    }
}
