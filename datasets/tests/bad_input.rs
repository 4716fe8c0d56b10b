//! Broken verl files (written here with the arrow writer) give clear errors that name file, row
//! and column, or the documented skip; never a panic.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields, Schema};
use flowrl_datasets::dataset::{DatasetOptions, PromptDataset, Truncation};
use flowrl_datasets::encoder::PromptEncoder;
use flowrl_datasets::template::ChatTemplate;
use flowrl_datasets::verl::{ReadOptions, VerlColumns, read_verl_file};
use parquet::arrow::ArrowWriter;

fn write(path: &Path, columns: Vec<(&str, ArrayRef)>) {
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

fn strings(values: &[Option<&str>]) -> ArrayRef {
    Arc::new(StringArray::from(values.to_vec()))
}

/// `list<struct<role, content>>` with one user message per row.
fn prompts(contents: &[&str]) -> ArrayRef {
    let fields = Fields::from(vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
    ]);
    let mut b = ListBuilder::new(StructBuilder::from_fields(fields, 0));
    for c in contents {
        let s = b.values();
        s.field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value("user");
        s.field_builder::<StringBuilder>(1).unwrap().append_value(c);
        s.append(true);
        b.append(true);
    }
    Arc::new(b.finish())
}

/// `list<struct<bytes, path>>`; `None` is a null list.
fn images(rows: &[Option<Vec<Vec<u8>>>]) -> ArrayRef {
    let fields = Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        Field::new("path", DataType::Utf8, true),
    ]);
    let mut b = ListBuilder::new(StructBuilder::from_fields(fields, 0));
    for r in rows {
        match r {
            None => b.append(false),
            Some(list) => {
                for bytes in list {
                    let s = b.values();
                    s.field_builder::<BinaryBuilder>(0)
                        .unwrap()
                        .append_value(bytes);
                    s.field_builder::<StringBuilder>(1).unwrap().append_null();
                    s.append(true);
                }
                b.append(true);
            }
        }
    }
    Arc::new(b.finish())
}

fn reward(gts: &[Option<&str>]) -> ArrayRef {
    let fields = Fields::from(vec![
        Field::new("style", DataType::Utf8, true),
        Field::new("ground_truth", DataType::Utf8, true),
    ]);
    let mut b = StructBuilder::from_fields(fields, 0);
    for g in gts {
        b.field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value("rule");
        b.field_builder::<StringBuilder>(1)
            .unwrap()
            .append_option(*g);
        b.append(true);
    }
    Arc::new(b.finish())
}

fn png() -> Vec<u8> {
    let img = image::RgbImage::from_pixel(28, 28, image::Rgb([200, 10, 10]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// A valid 3-row file, with `change` applied to the columns first.
fn file_with(
    dir: &Path,
    name: &str,
    change: impl FnOnce(&mut Vec<(&'static str, ArrayRef)>),
) -> PathBuf {
    let mut cols: Vec<(&'static str, ArrayRef)> = vec![
        (
            "images",
            images(&[Some(vec![png()]), Some(vec![png()]), Some(vec![png()])]),
        ),
        ("data_source", strings(&[Some("t"), Some("t"), Some("t")])),
        ("prompt", prompts(&["<image>a", "<image>b", "<image>c"])),
        ("reward_model", reward(&[Some("1"), Some("2"), Some("3")])),
        ("unknown_extra", strings(&[Some("x"), None, Some("z")])),
    ];
    change(&mut cols);
    let path = dir.join(name);
    write(&path, cols);
    path
}

fn set(cols: &mut [(&'static str, ArrayRef)], name: &str, value: ArrayRef) {
    cols.iter_mut().find(|c| c.0 == name).unwrap().1 = value;
}

fn read_err(path: &Path, options: &ReadOptions) -> String {
    read_verl_file(path, options).unwrap_err().to_string()
}

#[test]
fn valid_file_with_unknown_column_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(dir.path(), "ok.parquet", |_| {});
    let f = read_verl_file(&path, &ReadOptions::default()).unwrap();
    assert_eq!(f.rows.len(), 3);
    assert_eq!(f.rows[2].ground_truth, "3");
    assert_eq!(f.rows[1].messages[0].content, "<image>b");
    assert_eq!(f.rows[0].extra_info, serde_json::Value::Null);
}

#[test]
fn image_referenced_by_path_only_is_read_relative_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pic.png"), png()).unwrap();
    let fields = Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        Field::new("path", DataType::Utf8, true),
    ]);
    let mut b = ListBuilder::new(StructBuilder::from_fields(fields, 0));
    for path in ["pic.png", "absent.png"] {
        let s = b.values();
        s.field_builder::<BinaryBuilder>(0).unwrap().append_null();
        s.field_builder::<StringBuilder>(1)
            .unwrap()
            .append_value(path);
        s.append(true);
        b.append(true);
    }
    let path = dir.path().join("by_path.parquet");
    write(
        &path,
        vec![
            ("images", Arc::new(b.finish()) as ArrayRef),
            ("data_source", strings(&[Some("t"), Some("t")])),
            ("prompt", prompts(&["<image>a", "<image>b"])),
            ("reward_model", reward(&[Some("1"), Some("2")])),
        ],
    );
    let e = read_err(&path, &ReadOptions::default());
    assert!(
        e.contains("row 1, column `images`: image 0: bytes are null and path"),
        "{e}"
    );
    assert!(e.contains("absent.png cannot be read"), "{e}");
}

#[test]
fn missing_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(dir.path(), "missing.parquet", |c| {
        c.retain(|c| c.0 != "prompt")
    });
    let e = read_err(&path, &ReadOptions::default());
    assert!(e.starts_with(&path.display().to_string()), "{e}");
    assert!(e.contains("column `prompt`: missing column"), "{e}");
    assert!(
        e.contains("images, data_source, reward_model, unknown_extra"),
        "{e}"
    );
}

#[test]
fn prompt_as_plain_string() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(dir.path(), "string_prompt.parquet", |c| {
        set(
            c,
            "prompt",
            strings(&[Some("<image>a"), Some("<image>b"), Some("<image>c")]),
        )
    });
    let e = read_err(&path, &ReadOptions::default());
    assert!(e.contains("column `prompt`"), "{e}");
    assert!(
        e.contains("expected a list of chat messages list<struct<role: string, content: string>>, found string"),
        "{e}"
    );
}

#[test]
fn corrupt_image_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut truncated = png();
    truncated.truncate(40);
    let path = file_with(dir.path(), "corrupt.parquet", |c| {
        set(
            c,
            "images",
            images(&[Some(vec![png()]), Some(vec![truncated]), Some(vec![png()])]),
        )
    });
    let e = read_err(&path, &ReadOptions::default());
    assert!(
        e.contains("row 1, column `images`: image 0: cannot decode PNG image"),
        "{e}"
    );

    let path = file_with(dir.path(), "garbage.parquet", |c| {
        set(
            c,
            "images",
            images(&[
                Some(vec![png()]),
                Some(vec![png()]),
                Some(vec![b"hello".to_vec()]),
            ]),
        )
    });
    let e = read_err(&path, &ReadOptions::default());
    assert!(
        e.contains("row 2, column `images`: image 0: image bytes are neither PNG nor JPEG (they start with 68 65 6C 6C 6F)"),
        "{e}"
    );
}

#[test]
fn placeholder_image_count_mismatch_errors_or_is_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(dir.path(), "mismatch.parquet", |c| {
        set(
            c,
            "prompt",
            prompts(&["<image>a", "<image><image>b", "<image>c"]),
        )
    });
    let e = read_err(&path, &ReadOptions::default());
    assert!(e.starts_with(&path.display().to_string()), "{e}");
    assert!(
        e.contains("row 1: 2 `<image>` placeholder(s) in `prompt` but 1 image(s) in `images`"),
        "{e}"
    );
    assert!(e.contains("skip_mismatched_rows"), "{e}");

    let options = ReadOptions {
        skip_mismatched_rows: true,
        ..ReadOptions::default()
    };
    let f = read_verl_file(&path, &options).unwrap();
    assert_eq!(f.rows.len(), 2);
    assert_eq!(f.skipped.len(), 1);
    assert_eq!(f.skipped[0].source.row, 1);
    assert_eq!(f.rows[1].source.row, 2);
}

/// `flowrl data inspect` is a check: it lists the rows that would fail (at most `max_errors`,
/// counting the rest) and fails.
#[test]
fn inspect_lists_failing_rows_and_fails() {
    use flowrl_datasets::cli::{InspectArgs, inspect};
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(dir.path(), "mismatch.parquet", |c| {
        set(
            c,
            "prompt",
            prompts(&["<image><image>a", "<image><image>b", "<image>c"]),
        )
    });
    let mut out = Vec::new();
    let args = InspectArgs {
        file: path.clone(),
        model: None,
        rows: 0,
        prompt_key: "prompt".into(),
        image_key: "images".into(),
        max_errors: 1,
        json: false,
    };
    let err = inspect(&args, &mut out).expect_err("mismatched rows make inspect fail");
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("placeholder/image count mismatches: 2"),
        "{text}"
    );
    assert!(
        text.contains("  row 0: 2 `<image>` placeholder(s) in `prompt` but 1 image(s)"),
        "{text}"
    );
    assert!(!text.contains("  row 1:"), "{text}");
    assert!(text.contains("... and 1 more"), "{text}");
    assert!(err.to_string().contains("2 row(s) fail to load"), "{err}");
}

#[test]
fn empty_or_null_image_list_with_a_placeholder() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(dir.path(), "empty.parquet", |c| {
        set(
            c,
            "images",
            images(&[Some(vec![png()]), Some(vec![]), None]),
        )
    });
    let e = read_err(&path, &ReadOptions::default());
    assert!(
        e.contains("row 1: 1 `<image>` placeholder(s) in `prompt` but 0 image(s) in `images`"),
        "{e}"
    );
}

#[test]
fn null_ground_truth() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(dir.path(), "null_gt.parquet", |c| {
        set(c, "reward_model", reward(&[Some("1"), Some("2"), None]))
    });
    let e = read_err(&path, &ReadOptions::default());
    assert!(
        e.contains("row 2, column `reward_model.ground_truth`: the ground truth is null"),
        "{e}"
    );
}

#[test]
fn not_a_parquet_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.parquet");
    std::fs::write(&path, b"not parquet at all").unwrap();
    let e = read_err(&path, &ReadOptions::default());
    assert!(e.contains("not a readable parquet file"), "{e}");
    let e = read_err(&dir.path().join("absent.parquet"), &ReadOptions::default());
    assert!(e.contains("cannot open"), "{e}");
}

/// A text-only encoder over the tiny models' tokenizer: each prompt is its text plus a marker.
fn text_encoder() -> Arc<PromptEncoder> {
    let template = ChatTemplate::new(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
            .into(),
    )
    .unwrap();
    let tokenizer = flowrl_datasets::synth::train_tokenizer().unwrap();
    Arc::new(PromptEncoder::new(template, tokenizer, None))
}

fn text_only_file(dir: &Path) -> PathBuf {
    let long = "How many shapes are there? ".repeat(12);
    let path = dir.join("long.parquet");
    write(
        &path,
        vec![
            ("data_source", strings(&[Some("t"), Some("t"), Some("t")])),
            ("prompt", prompts(&["red", &long, "blue"])),
            ("reward_model", reward(&[Some("1"), Some("2"), Some("3")])),
        ],
    );
    path
}

fn text_options(max: usize, truncation: Truncation, filter: bool) -> DatasetOptions {
    DatasetOptions {
        read: ReadOptions {
            columns: VerlColumns {
                image_key: None,
                ..VerlColumns::default()
            },
            ..ReadOptions::default()
        },
        max_prompt_length: max,
        truncation,
        filter_overlong_prompts: filter,
        batch_size: 1,
        shuffle: false,
        seed: 0,
    }
}

#[test]
fn overlong_row_under_each_truncation_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = text_only_file(dir.path());
    let enc = text_encoder();
    let long = "How many shapes are there? ".repeat(12);
    let full = enc
        .encode::<image::RgbImage>(
            &[flowrl_datasets::ChatMessage {
                role: "user".into(),
                content: long,
            }],
            &[],
            false,
        )
        .unwrap()
        .input_ids;
    let max = 20;
    assert!(full.len() > max);

    let e = PromptDataset::load(
        std::slice::from_ref(&path),
        enc.clone(),
        text_options(max, Truncation::Error, false),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains(&format!(
            "row 1, column `prompt`: the prompt is {} tokens, longer than max_prompt_length {max}",
            full.len()
        )),
        "{e}"
    );

    let mut left = PromptDataset::load(
        std::slice::from_ref(&path),
        enc.clone(),
        text_options(max, Truncation::Left, false),
    )
    .unwrap();
    assert_eq!(left.report().truncated, 1);
    left.next_batch().unwrap();
    let b = left.next_batch().unwrap();
    assert_eq!(b.prompts[0].input_ids, full[full.len() - max..]);

    let mut right = PromptDataset::load(
        std::slice::from_ref(&path),
        enc.clone(),
        text_options(max, Truncation::Right, false),
    )
    .unwrap();
    right.next_batch().unwrap();
    let b = right.next_batch().unwrap();
    assert_eq!(b.prompts[0].input_ids, full[..max]);

    // filter_overlong_prompts drops the row (whatever the truncation) and counts it.
    let filtered =
        PromptDataset::load(&[path], enc, text_options(max, Truncation::Error, true)).unwrap();
    assert_eq!(filtered.len(), 2);
    assert_eq!(filtered.report().filtered_overlong, 1);
}

#[test]
fn several_row_groups_are_read_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let n = 10;
    let contents: Vec<String> = (0..n).map(|i| format!("<image>q{i}")).collect();
    let refs: Vec<&str> = contents.iter().map(String::as_str).collect();
    let gts: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let gt_refs: Vec<Option<&str>> = gts.iter().map(|s| Some(s.as_str())).collect();
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("images", images(&vec![Some(vec![png()]); n])),
        ("data_source", strings(&vec![Some("t"); n])),
        ("prompt", prompts(&refs)),
        ("reward_model", reward(&gt_refs)),
    ];
    let fields: Vec<Field> = cols
        .iter()
        .map(|(name, a)| Field::new(*name, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch =
        RecordBatch::try_new(schema.clone(), cols.into_iter().map(|c| c.1).collect()).unwrap();
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(3))
        .build();
    let path = dir.path().join("groups.parquet");
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let f = read_verl_file(&path, &ReadOptions::default()).unwrap();
    assert_eq!(f.num_row_groups, 4);
    assert_eq!(f.rows.len(), n);
    for (i, r) in f.rows.iter().enumerate() {
        assert_eq!(r.source.row, i);
        assert_eq!(r.ground_truth, i.to_string());
        assert_eq!(r.messages[0].content, format!("<image>q{i}"));
    }
}

#[test]
fn large_string_and_large_list_layouts_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let fields = Fields::from(vec![
        Field::new("role", DataType::LargeUtf8, true),
        Field::new("content", DataType::LargeUtf8, true),
    ]);
    let mut b = arrow_array::builder::LargeListBuilder::new(StructBuilder::from_fields(fields, 0));
    for c in ["hello", "world"] {
        let s = b.values();
        s.field_builder::<arrow_array::builder::LargeStringBuilder>(0)
            .unwrap()
            .append_value("user");
        s.field_builder::<arrow_array::builder::LargeStringBuilder>(1)
            .unwrap()
            .append_value(c);
        s.append(true);
        b.append(true);
    }
    let path = dir.path().join("large.parquet");
    write(
        &path,
        vec![
            ("prompt", Arc::new(b.finish()) as ArrayRef),
            (
                "data_source",
                Arc::new(arrow_array::LargeStringArray::from(vec!["a", "b"])) as ArrayRef,
            ),
            (
                "reward_model",
                // A numeric ground truth is read as its text.
                Arc::new(arrow_array::StructArray::from(vec![(
                    Arc::new(Field::new("ground_truth", DataType::Int64, true)),
                    Arc::new(arrow_array::Int64Array::from(vec![7, 8])) as ArrayRef,
                )])) as ArrayRef,
            ),
        ],
    );
    let options = ReadOptions {
        columns: VerlColumns {
            image_key: None,
            ..VerlColumns::default()
        },
        ..ReadOptions::default()
    };
    let f = read_verl_file(&path, &options).unwrap();
    assert_eq!(f.rows[1].messages[0].content, "world");
    assert_eq!(f.rows[1].data_source, "b");
    assert_eq!(f.rows[0].ground_truth, "7");
}

/// A load error names the file's other bad rows too (the first three and a count), and says how
/// to see them all and how to go on; `skip_bad_rows` leaves out rows whose images do not decode,
/// counted with their reasons.
#[test]
fn bad_rows_are_listed_and_can_be_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(dir.path(), "two_bad.parquet", |c| {
        set(
            c,
            "images",
            images(&[
                Some(vec![b"hello".to_vec()]),
                Some(vec![png()]),
                Some(vec![b"world".to_vec()]),
            ]),
        )
    });
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let encoder =
        Arc::new(PromptEncoder::from_model_dir(&root.join("assets/tiny-qwen2-vl")).unwrap());
    let options = |skip: bool| DatasetOptions {
        read: ReadOptions {
            skip_bad_rows: skip,
            ..ReadOptions::default()
        },
        max_prompt_length: 512,
        truncation: Truncation::Error,
        filter_overlong_prompts: false,
        batch_size: 1,
        shuffle: false,
        seed: 0,
    };
    let e = PromptDataset::load(std::slice::from_ref(&path), encoder.clone(), options(false))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("row 0, column `images`: image 0: image bytes are neither PNG nor JPEG")
            && e.contains("2 row(s) of")
            && e.contains(
                "  row 2: column `images`: image 0: image bytes are neither PNG nor JPEG"
            )
            && e.contains(&format!(
                "`flowrl data inspect {}` lists them all",
                path.display()
            ))
            && e.contains("skip_bad_rows = true"),
        "{e}"
    );
    let ds = PromptDataset::load(std::slice::from_ref(&path), encoder, options(true)).unwrap();
    assert_eq!(ds.len(), 1);
    let skipped: Vec<usize> = ds
        .report()
        .skipped_bad
        .iter()
        .map(|s| s.source.row)
        .collect();
    assert_eq!(skipped, [0, 2]);
    assert!(
        ds.report().skipped_bad[0]
            .reason
            .contains("column `images`")
    );
}
