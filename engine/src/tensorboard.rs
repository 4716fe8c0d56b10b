//! TensorBoard event files: the format TensorBoard reads and `wandb sync --sync-tensorboard`
//! imports, written without a protobuf library.
//!
//! A file is a sequence of records, framed as in TensorFlow's
//! `tensorflow/core/lib/io/record_writer.cc`:
//!
//! ```text
//! u64 LE   length of data
//! u32 LE   masked CRC-32C of the 8 length bytes
//! [u8]     data: one serialized `Event`
//! u32 LE   masked CRC-32C of data
//! ```
//!
//! CRC-32C is the Castagnoli CRC (reflected polynomial `0x82F63B78`), not the zlib CRC-32; a
//! stored CRC is masked as `((crc >> 15) | (crc << 17)) + 0xa282ead8` (TensorFlow's
//! `crc32c::Mask`).
//!
//! Each record's data is a protobuf `Event`. The fields written here, from TensorFlow's
//! `event.proto`, `summary.proto` and `tensor.proto` (copied in TensorBoard as
//! `tensorboard/compat/proto/*.proto`):
//!
//! ```text
//! Event          { double wall_time = 1; int64 step = 2; string file_version = 3;
//!                  Summary summary = 5; }
//! Summary        { repeated Value value = 1; }
//! Summary.Value  { string tag = 1; float simple_value = 2; Image image = 4;
//!                  TensorProto tensor = 8; SummaryMetadata metadata = 9; }
//! Summary.Image  { int32 height = 1; int32 width = 2; int32 colorspace = 3;
//!                  bytes encoded_image_string = 4; }
//! SummaryMetadata { PluginData plugin_data = 1; }
//! PluginData     { string plugin_name = 1; bytes content = 2; }
//! TensorProto    { DataType dtype = 1; TensorShapeProto tensor_shape = 2;
//!                  repeated bytes string_val = 8; }
//! ```
//!
//! The first record of a file is an `Event` with `file_version = "brain.Event:2"`. Scalars are
//! `simple_value`s; text is the text plugin's form (`plugin_data.plugin_name = "text"`, a scalar
//! `DT_STRING` tensor holding the markdown); images are `Summary.Image`s.

use anyhow::{Context as _, bail};
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Writes one TensorBoard event file. Every write method sends its event to the operating
/// system before it returns, so a killed run keeps everything it logged.
pub struct EventWriter {
    path: PathBuf,
    file: File,
}

/// `Event.file_version` of the first record; TensorBoard accepts versions starting with
/// `brain.Event:`.
const FILE_VERSION: &str = "brain.Event:2";

/// `DataType.DT_STRING` from TensorFlow's `types.proto`.
const DT_STRING: u64 = 7;

/// `SummaryMetadata.PluginData.plugin_name` of the text plugin (`tensorboard/plugins/text`).
/// Its `content` (a `TextPluginData { version = 0 }`) serializes to no bytes, so it is omitted.
const TEXT_PLUGIN_NAME: &str = "text";

impl EventWriter {
    /// Creates `dir` if needed and a new file
    /// `events.out.tfevents.<unix seconds>.<hostname>.<pid>.flowrl` in it, and writes the
    /// file-version event. Fails if that file already exists.
    pub fn create(dir: &Path) -> anyhow::Result<EventWriter> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating TensorBoard log directory {}", dir.display()))?;
        let wall_time = now_seconds();
        let file_name = format!(
            "events.out.tfevents.{}.{}.{}.flowrl",
            wall_time as u64,
            hostname(),
            std::process::id()
        );
        let path = dir.join(file_name);
        let file = File::create_new(&path)
            .with_context(|| format!("creating TensorBoard event file {}", path.display()))?;
        let mut writer = EventWriter { path, file };
        let mut event = ProtoMessage::default();
        event.double(1, wall_time);
        event.bytes(3, FILE_VERSION.as_bytes());
        writer.write_record(&event.0)?;
        Ok(writer)
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Logs one scalar (stored as a 32-bit float, TensorBoard's `simple_value`; NaN and ±inf are
    /// written as they are).
    pub fn scalar(&mut self, tag: &str, step: u64, value: f64) -> anyhow::Result<()> {
        self.write_summary(step, &[scalar_value(tag, value)])
    }

    /// Logs several scalars of one step as a single event (one `Summary` with one value per
    /// pair). Writes nothing when `values` is empty.
    pub fn scalars(
        &mut self,
        step: u64,
        values: impl IntoIterator<Item = (impl AsRef<str>, f64)>,
    ) -> anyhow::Result<()> {
        let values: Vec<ProtoMessage> = values
            .into_iter()
            .map(|(tag, value)| scalar_value(tag.as_ref(), value))
            .collect();
        if values.is_empty() {
            return Ok(());
        }
        self.write_summary(step, &values)
    }

    /// Logs a markdown text, shown by TensorBoard's text plugin.
    pub fn text(&mut self, tag: &str, step: u64, markdown: &str) -> anyhow::Result<()> {
        self.write_summary(step, &[text_value(tag, markdown)])
    }

    /// Logs an encoded image (PNG) of `width` × `height` pixels with `channels` channels
    /// (1 gray, 2 gray + alpha, 3 RGB, 4 RGBA: `Summary.Image.colorspace` uses the same numbers).
    pub fn image(
        &mut self,
        tag: &str,
        step: u64,
        png: &[u8],
        width: u32,
        height: u32,
        channels: u32,
    ) -> anyhow::Result<()> {
        if !(1..=4).contains(&channels) {
            bail!(
                "image {tag:?} for {}: {channels} channels; TensorBoard images have 1 to 4",
                self.path.display()
            );
        }
        self.write_summary(step, &[image_value(tag, png, width, height, channels)])
    }

    /// Writes one `Event { wall_time, step, summary = Summary { value = values } }`.
    fn write_summary(&mut self, step: u64, values: &[ProtoMessage]) -> anyhow::Result<()> {
        let mut summary = ProtoMessage::default();
        for value in values {
            summary.message(1, value);
        }
        let mut event = ProtoMessage::default();
        event.double(1, now_seconds());
        event.varint(2, step);
        event.message(5, &summary);
        self.write_record(&event.0)
    }

    /// Frames `data` as one record and writes it with a single `write_all`.
    fn write_record(&mut self, data: &[u8]) -> anyhow::Result<()> {
        self.file
            .write_all(&frame_record(data))
            .with_context(|| format!("writing TensorBoard event file {}", self.path.display()))
    }
}

/// `Summary.Value { tag, simple_value }`.
fn scalar_value(tag: &str, value: f64) -> ProtoMessage {
    let mut message = ProtoMessage::default();
    message.bytes(1, tag.as_bytes());
    message.float(2, value as f32);
    message
}

/// `Summary.Value { tag, metadata = { plugin_data = { plugin_name = "text" } },
/// tensor = { dtype = DT_STRING, tensor_shape = {} (a scalar), string_val = [markdown] } }`.
fn text_value(tag: &str, markdown: &str) -> ProtoMessage {
    let mut plugin_data = ProtoMessage::default();
    plugin_data.bytes(1, TEXT_PLUGIN_NAME.as_bytes());
    let mut metadata = ProtoMessage::default();
    metadata.message(1, &plugin_data);
    let mut tensor = ProtoMessage::default();
    tensor.varint(1, DT_STRING);
    tensor.message(2, &ProtoMessage::default());
    tensor.bytes(8, markdown.as_bytes());
    let mut message = ProtoMessage::default();
    message.bytes(1, tag.as_bytes());
    message.message(8, &tensor);
    message.message(9, &metadata);
    message
}

/// `Summary.Value { tag, image = { height, width, colorspace, encoded_image_string } }`.
fn image_value(
    tag: &str,
    encoded: &[u8],
    width: u32,
    height: u32,
    colorspace: u32,
) -> ProtoMessage {
    let mut image = ProtoMessage::default();
    image.varint(1, height.into());
    image.varint(2, width.into());
    image.varint(3, colorspace.into());
    image.bytes(4, encoded);
    let mut message = ProtoMessage::default();
    message.bytes(1, tag.as_bytes());
    message.message(4, &image);
    message
}

/// Seconds since the Unix epoch (`Event.wall_time`).
fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// The host's name for event file names: `/proc/sys/kernel/hostname`, else `$HOSTNAME`, else
/// `localhost`.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// One record as `record_writer.cc` frames it: length, masked CRC of the length, data, masked
/// CRC of the data.
fn frame_record(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut record = Vec::with_capacity(data.len() + 16);
    record.extend_from_slice(&length);
    record.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
    record.extend_from_slice(data);
    record.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    record
}

/// Table of CRC-32C (Castagnoli, reflected polynomial `0x82F63B78`) for each byte value.
const CRC32C_TABLE: [u32; 256] = crc32c_table();

const fn crc32c_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = byte as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
}

/// CRC-32C of `data` (initial value and final xor `0xFFFFFFFF`).
fn crc32c(data: &[u8]) -> u32 {
    let crc = data.iter().fold(!0u32, |crc, &byte| {
        CRC32C_TABLE[((crc ^ u32::from(byte)) & 0xFF) as usize] ^ (crc >> 8)
    });
    !crc
}

/// CRC-32C of `data`, masked as TensorFlow's `crc32c::Mask` does before storing it.
fn masked_crc32c(data: &[u8]) -> u32 {
    crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// A protobuf message being serialized: fields are appended in call order, each as its key
/// (`field_number << 3 | wire_type`, a varint) followed by its value.
#[derive(Default)]
struct ProtoMessage(Vec<u8>);

impl ProtoMessage {
    const WIRE_VARINT: u64 = 0;
    const WIRE_FIXED64: u64 = 1;
    const WIRE_LENGTH_DELIMITED: u64 = 2;
    const WIRE_FIXED32: u64 = 5;

    /// An integer or enum field (`int32`/`int64`/enum of non-negative values, `uint64`).
    fn varint(&mut self, field: u32, value: u64) {
        self.key(field, Self::WIRE_VARINT);
        self.put_varint(value);
    }

    /// A `double` field.
    fn double(&mut self, field: u32, value: f64) {
        self.key(field, Self::WIRE_FIXED64);
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    /// A `float` field.
    fn float(&mut self, field: u32, value: f32) {
        self.key(field, Self::WIRE_FIXED32);
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    /// A `string` or `bytes` field.
    fn bytes(&mut self, field: u32, value: &[u8]) {
        self.key(field, Self::WIRE_LENGTH_DELIMITED);
        self.put_varint(value.len() as u64);
        self.0.extend_from_slice(value);
    }

    /// An embedded message field.
    fn message(&mut self, field: u32, value: &ProtoMessage) {
        self.bytes(field, &value.0);
    }

    fn key(&mut self, field: u32, wire_type: u64) {
        self.put_varint((u64::from(field) << 3) | wire_type);
    }

    /// Base-128 varint: seven bits per byte, least significant first, high bit set on all but
    /// the last byte.
    fn put_varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.0.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoded protobuf field value, by wire type.
    #[derive(Debug, Clone, PartialEq)]
    enum Field {
        Varint(u64),
        Fixed64(u64),
        Bytes(Vec<u8>),
        Fixed32(u32),
    }

    /// Decodes a protobuf message into `(field number, value)` pairs in file order.
    fn decode_message(mut data: &[u8]) -> Vec<(u32, Field)> {
        fn varint(data: &mut &[u8]) -> u64 {
            let mut value = 0u64;
            let mut shift = 0;
            loop {
                let (&byte, rest) = data.split_first().expect("truncated varint");
                *data = rest;
                value |= u64::from(byte & 0x7F) << shift;
                if byte & 0x80 == 0 {
                    return value;
                }
                shift += 7;
            }
        }
        fn take<'a>(data: &mut &'a [u8], count: usize) -> &'a [u8] {
            let (head, rest) = data.split_at(count);
            *data = rest;
            head
        }
        let mut fields = Vec::new();
        while !data.is_empty() {
            let key = varint(&mut data);
            let field = (key >> 3) as u32;
            let value = match key & 7 {
                0 => Field::Varint(varint(&mut data)),
                1 => Field::Fixed64(u64::from_le_bytes(take(&mut data, 8).try_into().unwrap())),
                2 => {
                    let length = varint(&mut data) as usize;
                    Field::Bytes(take(&mut data, length).to_vec())
                }
                5 => Field::Fixed32(u32::from_le_bytes(take(&mut data, 4).try_into().unwrap())),
                other => panic!("unexpected wire type {other}"),
            };
            fields.push((field, value));
        }
        fields
    }

    fn fields_numbered(fields: &[(u32, Field)], number: u32) -> Vec<Field> {
        fields
            .iter()
            .filter(|(field, _)| *field == number)
            .map(|(_, value)| value.clone())
            .collect()
    }

    fn only_field(fields: &[(u32, Field)], number: u32) -> Field {
        let found = fields_numbered(fields, number);
        assert_eq!(found.len(), 1, "field {number} in {fields:?}");
        found[0].clone()
    }

    fn only_bytes(fields: &[(u32, Field)], number: u32) -> Vec<u8> {
        match only_field(fields, number) {
            Field::Bytes(bytes) => bytes,
            other => panic!("field {number} is {other:?}, expected bytes"),
        }
    }

    fn only_varint(fields: &[(u32, Field)], number: u32) -> u64 {
        match only_field(fields, number) {
            Field::Varint(value) => value,
            other => panic!("field {number} is {other:?}, expected a varint"),
        }
    }

    /// Splits an event file into its records' data, checking both CRCs of each record.
    fn read_records(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut records = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let length_bytes = &rest[..8];
            let length = u64::from_le_bytes(length_bytes.try_into().unwrap()) as usize;
            let length_crc = u32::from_le_bytes(rest[8..12].try_into().unwrap());
            assert_eq!(length_crc, masked_crc32c(length_bytes), "length CRC");
            let data = &rest[12..12 + length];
            let data_crc = u32::from_le_bytes(rest[12 + length..16 + length].try_into().unwrap());
            assert_eq!(data_crc, masked_crc32c(data), "data CRC");
            records.push(data.to_vec());
            rest = &rest[16 + length..];
        }
        records
    }

    /// An event's wall time, step (0 when absent) and `Summary.Value`s, decoded.
    fn decode_summary_event(data: &[u8]) -> (f64, u64, Vec<Vec<(u32, Field)>>) {
        let event = decode_message(data);
        let wall_time = match only_field(&event, 1) {
            Field::Fixed64(bits) => f64::from_bits(bits),
            other => panic!("wall_time is {other:?}"),
        };
        let step = fields_numbered(&event, 2)
            .first()
            .map_or(0, |field| match field {
                Field::Varint(step) => *step,
                other => panic!("step is {other:?}"),
            });
        let summary = decode_message(&only_bytes(&event, 5));
        let values = fields_numbered(&summary, 1)
            .into_iter()
            .map(|field| match field {
                Field::Bytes(value) => decode_message(&value),
                other => panic!("Summary.value is {other:?}"),
            })
            .collect();
        (wall_time, step, values)
    }

    fn simple_value(value: &[(u32, Field)]) -> f32 {
        match only_field(value, 2) {
            Field::Fixed32(bits) => f32::from_bits(bits),
            other => panic!("simple_value is {other:?}"),
        }
    }

    fn read_single_event_file(dir: &Path) -> Vec<Vec<u8>> {
        let files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        read_records(&std::fs::read(&files[0]).unwrap())
    }

    #[test]
    fn crc32c_matches_the_castagnoli_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn masked_crc32c_matches_tensorboard() {
        // Values from tensorboard's `compat/tensorflow_stub/pywrap_tensorflow.masked_crc32c`.
        assert_eq!(masked_crc32c(b"123456789"), 0xC78A_B0E5);
        assert_eq!(masked_crc32c(b""), 0xA282_EAD8);
        assert_eq!(masked_crc32c(&24u64.to_le_bytes()), 0x224B_7FA3);
    }

    #[test]
    fn varints_use_seven_bits_per_byte() {
        let mut message = ProtoMessage::default();
        message.put_varint(1);
        message.put_varint(300);
        message.put_varint(u64::MAX);
        let mut expected = vec![0x01, 0xAC, 0x02];
        expected.extend([0xFF; 9]);
        expected.push(0x01);
        assert_eq!(message.0, expected);
    }

    #[test]
    fn file_is_named_like_tensorflow_event_files_and_starts_with_the_file_version() {
        let dir = tempfile::tempdir().unwrap();
        let log_dir = dir.path().join("nested").join("tb");
        let writer = EventWriter::create(&log_dir).unwrap();
        let name = writer.path().file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        assert!(
            name.ends_with(&format!(".{}.flowrl", std::process::id())),
            "{name}"
        );
        assert_eq!(writer.path().parent().unwrap(), log_dir);

        let records = read_single_event_file(&log_dir);
        assert_eq!(records.len(), 1);
        let event = decode_message(&records[0]);
        assert_eq!(only_bytes(&event, 3), b"brain.Event:2");
        let Field::Fixed64(bits) = only_field(&event, 1) else {
            panic!("wall_time is not a double: {event:?}");
        };
        assert!(f64::from_bits(bits) > 1.5e9);
        assert!(fields_numbered(&event, 5).is_empty());
    }

    #[test]
    fn scalars_text_and_image_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = EventWriter::create(dir.path()).unwrap();
        writer.scalar("loss", 1, 0.25).unwrap();
        writer
            .scalars(
                2,
                [
                    ("a/nan", f64::NAN),
                    ("a/inf", f64::INFINITY),
                    ("a/neg_inf", f64::NEG_INFINITY),
                    ("a/tenth", 0.1),
                ],
            )
            .unwrap();
        writer.scalars(3, Vec::<(String, f64)>::new()).unwrap();
        writer.text("notes", 4, "# Title\n\n*ünïcode*").unwrap();
        let png = [0x89, b'P', b'N', b'G', 0, 1, 2, 3];
        writer.image("samples/frame", 5, &png, 64, 32, 3).unwrap();

        let records = read_single_event_file(dir.path());
        assert_eq!(
            records.len(),
            5,
            "file version + 4 events (no empty scalars)"
        );
        assert_eq!(
            only_bytes(&decode_message(&records[0]), 3),
            b"brain.Event:2"
        );

        let (wall_time, step, values) = decode_summary_event(&records[1]);
        assert!(wall_time > 1.5e9);
        assert_eq!(step, 1);
        assert_eq!(values.len(), 1);
        assert_eq!(only_bytes(&values[0], 1), b"loss");
        assert_eq!(simple_value(&values[0]), 0.25);

        let (_, step, values) = decode_summary_event(&records[2]);
        assert_eq!(step, 2);
        let tags: Vec<Vec<u8>> = values.iter().map(|value| only_bytes(value, 1)).collect();
        assert_eq!(
            tags,
            [&b"a/nan"[..], b"a/inf", b"a/neg_inf", b"a/tenth"].map(<[u8]>::to_vec)
        );
        assert!(simple_value(&values[0]).is_nan());
        assert_eq!(simple_value(&values[1]), f32::INFINITY);
        assert_eq!(simple_value(&values[2]), f32::NEG_INFINITY);
        assert_eq!(simple_value(&values[3]), 0.1f32);

        let (_, step, values) = decode_summary_event(&records[3]);
        assert_eq!(step, 4);
        assert_eq!(values.len(), 1);
        let text = &values[0];
        assert_eq!(only_bytes(text, 1), b"notes");
        let metadata = decode_message(&only_bytes(text, 9));
        let plugin_data = decode_message(&only_bytes(&metadata, 1));
        assert_eq!(only_bytes(&plugin_data, 1), b"text");
        let tensor = decode_message(&only_bytes(text, 8));
        assert_eq!(only_varint(&tensor, 1), 7);
        assert_eq!(only_bytes(&tensor, 2), b"", "scalar shape: no dims");
        assert_eq!(only_bytes(&tensor, 8), "# Title\n\n*ünïcode*".as_bytes());

        let (_, step, values) = decode_summary_event(&records[4]);
        assert_eq!(step, 5);
        let image_value = &values[0];
        assert_eq!(only_bytes(image_value, 1), b"samples/frame");
        let image = decode_message(&only_bytes(image_value, 4));
        assert_eq!(only_varint(&image, 1), 32, "height");
        assert_eq!(only_varint(&image, 2), 64, "width");
        assert_eq!(only_varint(&image, 3), 3, "colorspace");
        assert_eq!(only_bytes(&image, 4), png);
    }

    #[test]
    fn every_write_reaches_the_file_before_returning() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = EventWriter::create(dir.path()).unwrap();
        writer.scalar("x", 7, 1.0).unwrap();
        let records = read_single_event_file(dir.path());
        assert_eq!(records.len(), 2);
        drop(writer);
    }

    #[test]
    fn image_with_unknown_channel_count_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = EventWriter::create(dir.path()).unwrap();
        let error = writer.image("img", 0, b"png", 1, 1, 5).unwrap_err();
        assert!(error.to_string().contains("5 channels"), "{error}");
    }

    #[test]
    fn errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("not_a_dir");
        std::fs::write(&blocker, b"").unwrap();
        let error = EventWriter::create(&blocker.join("tb")).err().unwrap();
        assert!(
            format!("{error:#}").contains(&blocker.display().to_string()),
            "{error:#}"
        );
    }
}
