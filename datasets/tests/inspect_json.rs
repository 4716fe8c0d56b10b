//! `flowrl data inspect --json`: one JSON document for scripts, with the counts, columns, image
//! stats and every row that would fail to load (row, column, message), at most `--max-errors`
//! of them plus a count of the rest; the command fails exactly when a row would fail.

use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields, Schema};
use flowrl_datasets::cli::{InspectArgs, inspect};
use parquet::arrow::ArrowWriter;
use serde_json::Value;

fn png() -> Vec<u8> {
    let img = image::RgbImage::from_pixel(28, 20, image::Rgb([200, 10, 10]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// Rows of (prompt content, image bytes, ground truth).
/// One row: prompt text, image bytes, optional data source.
type Row<'a> = (&'a str, Vec<Vec<u8>>, Option<&'a str>);

fn write(path: &Path, rows: &[Row<'_>]) {
    let mf = Fields::from(vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
    ]);
    let mut prompt = ListBuilder::new(StructBuilder::from_fields(mf, 0));
    let imf = Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        Field::new("path", DataType::Utf8, true),
    ]);
    let mut images = ListBuilder::new(StructBuilder::from_fields(imf, 0));
    let rf = Fields::from(vec![Field::new("ground_truth", DataType::Utf8, true)]);
    let mut reward = StructBuilder::from_fields(rf, 0);
    for (content, imgs, gt) in rows {
        let s = prompt.values();
        s.field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value("user");
        s.field_builder::<StringBuilder>(1)
            .unwrap()
            .append_value(content);
        s.append(true);
        prompt.append(true);
        for b in imgs {
            let s = images.values();
            s.field_builder::<BinaryBuilder>(0).unwrap().append_value(b);
            s.field_builder::<StringBuilder>(1).unwrap().append_null();
            s.append(true);
        }
        images.append(true);
        reward
            .field_builder::<StringBuilder>(0)
            .unwrap()
            .append_option(*gt);
        reward.append(true);
    }
    let sources: ArrayRef = Arc::new(StringArray::from(vec![Some("shapes"); rows.len()]));
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("data_source", sources),
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

fn run(path: &Path, max_errors: usize) -> (Value, anyhow::Result<()>) {
    let args = InspectArgs {
        file: path.to_path_buf(),
        model: None,
        rows: 1,
        prompt_key: "prompt".into(),
        image_key: "images".into(),
        max_errors,
        json: true,
    };
    let mut out = Vec::new();
    let result = inspect(&args, &mut out);
    let doc = serde_json::from_slice(&out).expect("one JSON document");
    (doc, result)
}

#[test]
fn json_lists_every_bad_row_with_row_column_and_message() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("mixed.parquet");
    write(
        &path,
        &[
            ("<image>good", vec![png()], Some("1")),
            ("<image><image>two placeholders", vec![png()], Some("2")),
            (
                "<image>corrupt image",
                vec![b"not an image".to_vec()],
                Some("3"),
            ),
            ("<image>null ground truth", vec![png()], None),
            ("<image>good too", vec![png()], Some("5")),
        ],
    );
    let (doc, result) = run(&path, 2);
    let err = result.expect_err("bad rows make inspect fail");
    assert!(err.to_string().contains("3 row(s) fail to load"), "{err}");
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["rows"], 5);
    assert_eq!(doc["row_groups"], 1);
    assert_eq!(doc["loaded_rows"], 2);
    assert_eq!(doc["images"]["count"], 2);
    assert_eq!(doc["images"]["formats"]["PNG"], 2);
    assert_eq!(doc["data_source"]["shapes"], 2);
    assert!(doc["prompt_tokens"].is_null(), "no --model: no token stats");
    let names: Vec<&str> = doc["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["data_source", "prompt", "images", "reward_model"]);
    let bad = &doc["bad_rows"];
    assert_eq!(bad["count"], 3);
    assert_eq!(bad["placeholder_mismatches"], 1);
    assert_eq!(bad["more"], 1);
    let listed = bad["listed"].as_array().unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["row"], 1);
    assert!(listed[0]["column"].is_null());
    assert!(
        listed[0]["message"]
            .as_str()
            .unwrap()
            .contains("2 `<image>` placeholder(s) in `prompt` but 1 image(s)"),
        "{doc}"
    );
    assert_eq!(listed[1]["row"], 2);
    assert_eq!(listed[1]["column"], "images");
    assert!(
        listed[1]["message"].as_str().unwrap().contains("image 0:"),
        "{doc}"
    );
    let sample = doc["sample"].as_array().unwrap();
    assert_eq!(sample.len(), 1);
    assert_eq!(sample[0]["row"], 0);
    assert_eq!(sample[0]["images"][0]["width"], 28);
    assert_eq!(sample[0]["ground_truth"], "1");

    // All of them with a larger --max-errors; the fourth names the ground-truth column.
    let (doc, _) = run(&path, 20);
    let listed = doc["bad_rows"]["listed"].as_array().unwrap();
    assert_eq!(listed.len(), 3);
    assert_eq!(doc["bad_rows"]["more"], 0);
    assert_eq!(listed[2]["row"], 3);
    assert_eq!(listed[2]["column"], "reward_model.ground_truth");
}

#[test]
fn json_of_a_good_file_is_ok_and_of_an_unreadable_one_names_the_error() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("good.parquet");
    write(&path, &[("<image>a", vec![png()], Some("1"))]);
    let (doc, result) = run(&path, 20);
    result.unwrap();
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["bad_rows"]["count"], 0);
    assert_eq!(doc["loaded_rows"], 1);

    let junk = tmp.path().join("junk.parquet");
    std::fs::write(&junk, b"not parquet").unwrap();
    let (doc, result) = run(&junk, 20);
    assert!(result.is_err());
    assert_eq!(doc["ok"], false);
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a readable parquet file"),
        "{doc}"
    );
}
