//! Samples written as a parquet file in verl's geo3k schema: the Arrow schema (with
//! `extra_info.turns` when some sample has reference turns) and the writer.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow_array::builder::{
    BinaryBuilder, Int64Builder, ListBuilder, StringBuilder, StructBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Fields, Schema};
use image::RgbImage;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use super::task::ShapeSample;

fn png_bytes(img: &RgbImage) -> Result<Vec<u8>> {
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)?;
    Ok(out.into_inner())
}

/// The Arrow schema verl's geo3k preprocessing writes (column order included).
pub fn verl_schema() -> Schema {
    schema_with_turns(false)
}

/// [`verl_schema`], with `extra_info.turns` (a list of strings) when `turns`.
fn schema_with_turns(turns: bool) -> Schema {
    let string = |n: &str| Field::new(n, DataType::Utf8, true);
    let image_item = Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        string("path"),
    ]);
    let message = Fields::from(vec![string("role"), string("content")]);
    Schema::new(vec![
        Field::new(
            "images",
            DataType::List(Arc::new(Field::new(
                "element",
                DataType::Struct(image_item),
                true,
            ))),
            true,
        ),
        string("data_source"),
        Field::new(
            "prompt",
            DataType::List(Arc::new(Field::new(
                "element",
                DataType::Struct(message),
                true,
            ))),
            true,
        ),
        string("ability"),
        Field::new(
            "reward_model",
            DataType::Struct(Fields::from(vec![string("style"), string("ground_truth")])),
            true,
        ),
        Field::new(
            "extra_info",
            DataType::Struct(Fields::from(
                [
                    string("split"),
                    Field::new("index", DataType::Int64, true),
                    string("answer"),
                    string("question"),
                ]
                .into_iter()
                .chain(turns.then(|| {
                    Field::new(
                        "turns",
                        DataType::List(Arc::new(Field::new("element", DataType::Utf8, true))),
                        true,
                    )
                }))
                .collect::<Vec<_>>(),
            )),
            true,
        ),
    ])
}

/// Writes samples as a verl parquet file (Snappy, one row group); `extra_info.turns` when some
/// sample has reference turns.
pub fn write_split(path: &Path, split: &str, samples: &[ShapeSample]) -> Result<()> {
    let with_turns = samples.iter().any(|s| !s.turns.is_empty());
    let schema = Arc::new(schema_with_turns(with_turns));
    let field_of = |name: &str| -> Fields {
        match schema.field_with_name(name).unwrap().data_type() {
            DataType::List(f) => match f.data_type() {
                DataType::Struct(fs) => fs.clone(),
                _ => unreachable!(),
            },
            DataType::Struct(fs) => fs.clone(),
            _ => unreachable!(),
        }
    };
    let item_field = |name: &str| -> Arc<Field> {
        match schema.field_with_name(name).unwrap().data_type() {
            DataType::List(f) => f.clone(),
            _ => unreachable!(),
        }
    };
    let mut images = ListBuilder::new(StructBuilder::from_fields(field_of("images"), 0))
        .with_field(item_field("images"));
    let mut prompt = ListBuilder::new(StructBuilder::from_fields(field_of("prompt"), 0))
        .with_field(item_field("prompt"));
    let mut data_source = StringBuilder::new();
    let mut ability = StringBuilder::new();
    let mut reward = StructBuilder::from_fields(field_of("reward_model"), 0);
    let mut extra = StructBuilder::from_fields(field_of("extra_info"), 0);
    for (i, s) in samples.iter().enumerate() {
        let item = images.values();
        item.field_builder::<BinaryBuilder>(0)
            .unwrap()
            .append_value(png_bytes(&s.image)?);
        item.field_builder::<StringBuilder>(1)
            .unwrap()
            .append_null();
        item.append(true);
        images.append(true);

        let msg = prompt.values();
        msg.field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value("user");
        msg.field_builder::<StringBuilder>(1)
            .unwrap()
            .append_value(&s.prompt);
        msg.append(true);
        prompt.append(true);

        data_source.append_value(s.data_source);
        ability.append_value("vision");
        reward
            .field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value("rule");
        reward
            .field_builder::<StringBuilder>(1)
            .unwrap()
            .append_value(&s.answer);
        reward.append(true);
        extra
            .field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value(split);
        extra
            .field_builder::<Int64Builder>(1)
            .unwrap()
            .append_value(i as i64);
        extra
            .field_builder::<StringBuilder>(2)
            .unwrap()
            .append_value(&s.answer);
        extra
            .field_builder::<StringBuilder>(3)
            .unwrap()
            .append_value(&s.question);
        if with_turns {
            let turns = extra
                .field_builder::<ListBuilder<Box<dyn arrow_array::builder::ArrayBuilder>>>(4)
                .unwrap();
            for t in &s.turns {
                turns
                    .values()
                    .as_any_mut()
                    .downcast_mut::<StringBuilder>()
                    .unwrap()
                    .append_value(t);
            }
            turns.append(true);
        }
        extra.append(true);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(images.finish()),
        Arc::new(data_source.finish()),
        Arc::new(prompt.finish()),
        Arc::new(ability.finish()),
        Arc::new(reward.finish()),
        Arc::new(extra.finish()),
    ];
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_created_by("flowrl data synth".into())
        .build();
    let mut writer = ArrowWriter::try_new(file, schema, Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}
