//! Property tests of the prompt-data parsers of outside input: verl parquet rows, the image bytes
//! in them, and `flowrl data inspect` on both (text and `--json`).
//!
//! The property, for every input: [`read_verl_file`] returns `Ok` or a [`DataError`] with a
//! non-empty message (naming the row and column when one value is to blame), and `inspect`
//! returns `Ok` or an error with a message (its `--json` output is one JSON document either
//! way) — never a panic, never an abort, and memory bounded: this binary's allocator refuses any
//! single allocation over 2 GiB (the process aborts), so an image whose header claims
//! 2^31 × 2^31 pixels, or a row that names `/dev/zero` as its image path, must be an error.
//!
//! Inputs: (a) files written here from generated rows — null/empty/odd message lists,
//! `<image>` counts that do or do not match the images, image entries with valid PNG/JPEG bytes,
//! those bytes cut, flipped or with their PNG size field set to huge values, random bytes, null
//! bytes with paths (missing, a directory, `/dev/zero`), null ground truths and data sources;
//! (b) byte-level damage (bytes overwritten, the file cut, bytes inserted) of the shipped
//! `datasets/shapes/test.parquet`; (c) image byte mutations decoded on their own.
//!
//! Cases (fixed seed, no persistence file): 160 generated files, 160 damaged files, 512 image
//! byte strings; about ten seconds on one core.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow_array::builder::{BinaryBuilder, ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields, Schema};
use flowrl_datasets::cli::{InspectArgs, inspect};
use flowrl_datasets::images::decode_rgb;
use flowrl_datasets::verl::{ReadOptions, read_verl_file};
use parquet::arrow::ArrowWriter;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

/// The system allocator, refusing (null → abort) any single allocation over 2 GiB.
struct Capped;
const CAP: usize = 2 << 30;
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(p, l, new) }
    }
}
#[global_allocator]
static ALLOC: Capped = Capped;

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x5eed_0020),
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    }
}

fn png() -> &'static [u8] {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    P.get_or_init(|| encode(image::ImageFormat::Png))
}

fn jpeg() -> &'static [u8] {
    static J: OnceLock<Vec<u8>> = OnceLock::new();
    J.get_or_init(|| encode(image::ImageFormat::Jpeg))
}

fn encode(format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(30, 20, |x, y| {
        image::Rgb([(x * 8) as u8, (y * 12) as u8, 90])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

/// A change of encoded image bytes.
#[derive(Debug, Clone)]
enum ImageEdit {
    Cut(usize),
    Byte(usize, u8),
    Insert(usize, Vec<u8>),
    /// The PNG IHDR width/height (bytes 16..24) set.
    PngSize(u32, u32),
    /// A JPEG SOF0 height/width set (the first FFC0 marker).
    JpegSize(u16, u16),
}

fn image_edit() -> impl Strategy<Value = ImageEdit> {
    let side = prop_oneof![
        Just(0u32),
        Just(1),
        Just(u32::MAX),
        Just(1 << 31),
        Just(65_535),
        Just(100_000),
        1u32..5000
    ];
    prop_oneof![
        2 => any::<usize>().prop_map(ImageEdit::Cut),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(o, b)| ImageEdit::Byte(o, b)),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..32)).prop_map(|(o, b)| ImageEdit::Insert(o, b)),
        2 => (side.clone(), side).prop_map(|(w, h)| ImageEdit::PngSize(w, h)),
        1 => (any::<u16>(), any::<u16>()).prop_map(|(h, w)| ImageEdit::JpegSize(h, w)),
    ]
}

fn edit_image(b: &mut Vec<u8>, e: &ImageEdit) {
    match e {
        ImageEdit::Cut(o) => b.truncate(o % (b.len() + 1)),
        ImageEdit::Byte(o, x) if !b.is_empty() => {
            let n = b.len();
            b[o % n] = *x;
        }
        ImageEdit::Insert(o, x) => {
            let at = o % (b.len() + 1);
            b.splice(at..at, x.iter().copied());
        }
        ImageEdit::PngSize(w, h) if b.len() >= 24 && b.starts_with(b"\x89PNG") => {
            b[16..20].copy_from_slice(&w.to_be_bytes());
            b[20..24].copy_from_slice(&h.to_be_bytes());
        }
        ImageEdit::JpegSize(h, w) => {
            if let Some(i) = b.windows(2).position(|m| m == [0xFF, 0xC0])
                && i + 9 <= b.len()
            {
                b[i + 5..i + 7].copy_from_slice(&h.to_be_bytes());
                b[i + 7..i + 9].copy_from_slice(&w.to_be_bytes());
            }
        }
        _ => {}
    }
}

fn image_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => (prop::bool::ANY, prop::collection::vec(image_edit(), 0..3)).prop_map(|(is_png, edits)| {
            let mut b = if is_png { png().to_vec() } else { jpeg().to_vec() };
            for e in &edits {
                edit_image(&mut b, e);
            }
            b
        }),
        1 => prop::collection::vec(any::<u8>(), 0..64),
        1 => Just(Vec::new()),
    ]
}

#[derive(Debug, Clone)]
enum Img {
    Bytes(Vec<u8>),
    /// Null bytes with this path.
    Path(String),
    /// Both null (or the whole entry null).
    Null,
}

fn img() -> impl Strategy<Value = Img> {
    prop_oneof![
        6 => image_bytes().prop_map(Img::Bytes),
        1 => prop_oneof![
            Just("missing.png".to_string()),
            Just(".".to_string()),
            Just("/dev/zero".to_string()),
            Just("/".to_string()),
            Just("".to_string()),
            "[a-z/.]{1,12}",
        ].prop_map(Img::Path),
        1 => Just(Img::Null),
    ]
}

#[derive(Debug, Clone)]
struct Row {
    /// None: a null message list; messages with None role/content are nulls.
    messages: Option<Vec<(Option<String>, Option<String>)>>,
    images: Option<Vec<Img>>,
    ground_truth: Option<String>,
    data_source: Option<String>,
}

fn content() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("<image>What shape is this?".to_string()),
        Just("".to_string()),
        Just("<image><image>".to_string()),
        Just("<image".to_string()),
        "\\PC{0,24}",
        (0usize..4, "[a-z ]{0,8}").prop_map(|(n, t)| format!("{}{t}", "<image>".repeat(n))),
    ]
}

fn row() -> impl Strategy<Value = Row> {
    let message = (
        prop_oneof![8 => Just(Some("user".to_string())), 1 => Just(Some("system".to_string())), 1 => Just(None)],
        prop_oneof![9 => content().prop_map(Some), 1 => Just(None)],
    );
    (
        prop_oneof![8 => prop::collection::vec(message, 0..3).prop_map(Some), 1 => Just(None)],
        prop_oneof![8 => prop::collection::vec(img(), 0..3).prop_map(Some), 1 => Just(None)],
        prop_oneof![8 => "[0-9a-z]{0,6}".prop_map(Some), 1 => Just(None)],
        prop_oneof![8 => Just(Some("shapes".to_string())), 1 => Just(None)],
    )
        .prop_map(|(messages, images, ground_truth, data_source)| Row {
            messages,
            images,
            ground_truth,
            data_source,
        })
}

fn write_rows(path: &Path, rows: &[Row]) {
    let msg_fields = Fields::from(vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
    ]);
    let mut prompt = ListBuilder::new(StructBuilder::from_fields(msg_fields, 0));
    let img_fields = Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        Field::new("path", DataType::Utf8, true),
    ]);
    let mut images = ListBuilder::new(StructBuilder::from_fields(img_fields, 0));
    let rm_fields = Fields::from(vec![
        Field::new("style", DataType::Utf8, true),
        Field::new("ground_truth", DataType::Utf8, true),
    ]);
    let mut reward = StructBuilder::from_fields(rm_fields, 0);
    for r in rows {
        match &r.messages {
            None => prompt.append(false),
            Some(ms) => {
                for (role, content) in ms {
                    let s = prompt.values();
                    s.field_builder::<StringBuilder>(0)
                        .unwrap()
                        .append_option(role.as_deref());
                    s.field_builder::<StringBuilder>(1)
                        .unwrap()
                        .append_option(content.as_deref());
                    s.append(true);
                }
                prompt.append(true);
            }
        }
        match &r.images {
            None => images.append(false),
            Some(list) => {
                for i in list {
                    let s = images.values();
                    let (bytes, path, valid): (Option<&[u8]>, Option<&str>, bool) = match i {
                        Img::Bytes(b) => (Some(b), None, true),
                        Img::Path(p) => (None, Some(p), true),
                        Img::Null => (None, None, false),
                    };
                    s.field_builder::<BinaryBuilder>(0)
                        .unwrap()
                        .append_option(bytes);
                    s.field_builder::<StringBuilder>(1)
                        .unwrap()
                        .append_option(path);
                    s.append(valid);
                }
                images.append(true);
            }
        }
        reward
            .field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value("rule");
        reward
            .field_builder::<StringBuilder>(1)
            .unwrap()
            .append_option(r.ground_truth.as_deref());
        reward.append(true);
    }
    let sources: Vec<Option<&str>> = rows.iter().map(|r| r.data_source.as_deref()).collect();
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("data_source", Arc::new(StringArray::from(sources))),
        ("prompt", Arc::new(prompt.finish())),
        ("images", Arc::new(images.finish())),
        ("reward_model", Arc::new(reward.finish())),
    ];
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch =
        RecordBatch::try_new(schema.clone(), columns.into_iter().map(|c| c.1).collect()).unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn args(file: PathBuf, json: bool) -> InspectArgs {
    InspectArgs {
        file,
        model: None,
        rows: 2,
        prompt_key: "prompt".into(),
        image_key: "images".into(),
        max_errors: 3,
        json,
    }
}

/// The property on one file: reading, and inspecting as text and as JSON.
fn check_file(path: &Path) -> Result<(), TestCaseError> {
    for options in [
        ReadOptions::default(),
        ReadOptions {
            skip_mismatched_rows: true,
            ..ReadOptions::default()
        },
    ] {
        if let Err(e) = read_verl_file(path, &options) {
            prop_assert!(
                !e.message.trim().is_empty(),
                "an error without a message: {e:?}"
            );
        }
    }
    let mut out = Vec::new();
    if let Err(e) = inspect(&args(path.to_path_buf(), false), &mut out) {
        prop_assert!(
            !format!("{e:#}").trim().is_empty(),
            "an error without a message"
        );
    }
    let mut out = Vec::new();
    let result = inspect(&args(path.to_path_buf(), true), &mut out);
    let doc: serde_json::Value = serde_json::from_slice(&out)
        .map_err(|e| TestCaseError::fail(format!("--json did not print one JSON document: {e}")))?;
    prop_assert_eq!(doc["ok"].as_bool(), Some(result.is_ok()), "{}", doc);
    if let Err(e) = result {
        prop_assert!(
            !format!("{e:#}").trim().is_empty(),
            "an error without a message"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(160))]

    #[test]
    fn generated_rows_load_or_name_the_row(rows in prop::collection::vec(row(), 1..5)) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("rows.parquet");
        write_rows(&path, &rows);
        check_file(&path)?;
    }

    #[test]
    fn damaged_parquet_files_err(
        edits in prop::collection::vec((0u8..3, any::<usize>(), prop::collection::vec(any::<u8>(), 1..8)), 1..4),
    ) {
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("shapes/test.parquet");
        let mut bytes = std::fs::read(shipped).unwrap();
        for (kind, at, data) in &edits {
            let at = at % (bytes.len() + 1);
            match kind {
                0 => {
                    for (k, b) in data.iter().enumerate() {
                        if at + k < bytes.len() {
                            bytes[at + k] = *b;
                        }
                    }
                }
                1 => bytes.truncate(at),
                _ => {
                    bytes.splice(at..at, data.iter().copied());
                }
            }
        }
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("damaged.parquet");
        std::fs::write(&path, &bytes).unwrap();
        check_file(&path)?;
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn image_bytes_decode_or_err(bytes in image_bytes()) {
        if let Err(m) = decode_rgb(&bytes) {
            prop_assert!(!m.trim().is_empty());
        }
    }
}

/// Hand-made: images whose headers claim 2^31 × 2^31 (PNG) and 65535 × 65535 (JPEG) pixels.
#[test]
fn images_claiming_huge_sizes_are_errors() {
    let mut b = png().to_vec();
    edit_image(&mut b, &ImageEdit::PngSize(1 << 31, 1 << 31));
    assert!(decode_rgb(&b).is_err());
    let mut b = png().to_vec();
    edit_image(&mut b, &ImageEdit::PngSize(100_000, 100_000));
    assert!(decode_rgb(&b).is_err());
    let mut b = jpeg().to_vec();
    edit_image(&mut b, &ImageEdit::JpegSize(65_535, 65_535));
    assert!(decode_rgb(&b).is_err());
}

/// Regression: a row whose image bytes are null and whose path is `/dev/zero` was read without
/// end (the process ran out of memory); a directory or FIFO was read or blocked. Now an error
/// naming the row and column.
#[test]
fn regression_image_path_to_a_device_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("dev.parquet");
    let row = |p: &str| Row {
        messages: Some(vec![(Some("user".into()), Some("<image>hi".into()))]),
        images: Some(vec![Img::Path(p.into())]),
        ground_truth: Some("1".into()),
        data_source: Some("t".into()),
    };
    write_rows(&path, &[row("/dev/zero"), row(".")]);
    let e = read_verl_file(&path, &ReadOptions::default()).unwrap_err();
    assert_eq!(
        (e.row, e.column.as_deref()),
        (Some(0), Some("images")),
        "{e}"
    );
    assert!(
        e.message
            .contains("/dev/zero cannot be read: not a regular file"),
        "{e}"
    );
}
