//! The columns of a verl file, resolved by name and type-checked before any row is decoded:
//! a missing required column or a column of the wrong Arrow type is one error naming the file
//! and column (and what the file has). Reading values is [`super::values`]' job.

use std::path::Path;

use arrow_schema::{DataType, Field, Schema};

use crate::error::DataError;

pub(super) fn split_path(dotted: &str) -> (&str, Vec<String>) {
    let mut parts = dotted.split('.');
    let root = parts.next().unwrap_or("");
    (root, parts.map(str::to_string).collect())
}

pub(super) fn root_field<'a>(
    path: &Path,
    schema: &'a Schema,
    name: &str,
    required: bool,
) -> Result<Option<&'a Field>, DataError> {
    match schema.field_with_name(name) {
        Ok(f) => Ok(Some(f)),
        Err(_) if !required => Ok(None),
        Err(_) => {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            Err(DataError::column(
                path,
                name,
                format!(
                    "missing column (the file has: {}); set the matching *_key option if it has another name",
                    names.join(", ")
                ),
            ))
        }
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_binary(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    )
}

fn list_item(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) => Some(f.data_type()),
        _ => None,
    }
}

fn struct_child<'a>(t: &'a DataType, name: &str) -> Option<&'a DataType> {
    match t {
        DataType::Struct(fields) => fields
            .iter()
            .find(|f| f.name() == name)
            .map(|f| f.data_type()),
        _ => None,
    }
}

/// `Ok` when the column's type `t` is right, else the error "expected {what}, found {t}".
fn expect_type(
    ok: bool,
    path: &Path,
    col: &str,
    what: &str,
    t: &DataType,
) -> Result<(), DataError> {
    if ok {
        Ok(())
    } else {
        Err(DataError::column(
            path,
            col,
            format!("expected {what}, found {}", type_name(t)),
        ))
    }
}

pub(super) fn check_string_type(path: &Path, col: &str, t: &DataType) -> Result<(), DataError> {
    expect_type(is_string(t), path, col, "a string column", t)
}

pub(super) fn check_messages_type(path: &Path, col: &str, t: &DataType) -> Result<(), DataError> {
    let ok = list_item(t).is_some_and(|item| {
        struct_child(item, "role").is_some_and(is_string)
            && struct_child(item, "content").is_some_and(is_string)
    });
    let what = "a list of chat messages list<struct<role: string, content: string>>";
    expect_type(ok, path, col, what, t)
}

pub(super) fn check_images_type(path: &Path, col: &str, t: &DataType) -> Result<(), DataError> {
    let ok = list_item(t).is_some_and(|item| struct_child(item, "bytes").is_some_and(is_binary));
    let what = "a list of images list<struct<bytes: binary, path: string>>";
    expect_type(ok, path, col, what, t)
}

/// A frame list: `list<binary | string | struct<bytes: binary, path: string>>`.
fn is_frame_list(t: &DataType) -> bool {
    list_item(t).is_some_and(|f| {
        is_binary(f) || is_string(f) || struct_child(f, "bytes").is_some_and(is_binary)
    })
}

/// verl's video entries: per row a list of videos, each a frame list, or a struct whose `video`
/// field is a frame list (or a path string, rejected per row) with optional numeric
/// `sample_fps`, `fps`, `nframes`, `min_frames`, `max_frames`.
pub(super) fn check_videos_type(path: &Path, col: &str, t: &DataType) -> Result<(), DataError> {
    let ok = list_item(t).is_some_and(|item| {
        is_frame_list(item)
            || struct_child(item, "video").is_some_and(|v| is_frame_list(v) || is_string(v))
    });
    let what = "a list of videos, each a list of frames (binary, path string or struct<bytes, path>) \
                or a struct<video: list of frames, sample_fps?, fps?, nframes?, ...>";
    expect_type(ok, path, col, what, t)
}

/// The column `dotted` (`root.a.b`): its fields exist and the leaf is a string or a number.
pub(super) fn check_nested_scalar(
    path: &Path,
    dotted: &str,
    root: &DataType,
    rest: &[String],
) -> Result<(), DataError> {
    let mut t = root;
    for name in rest {
        t = struct_child(t, name).ok_or_else(|| {
            DataError::column(
                path,
                dotted,
                format!(
                    "missing field `{name}` (the column's type is {})",
                    type_name(root)
                ),
            )
        })?;
    }
    let scalar = is_string(t) || t.is_integer() || t.is_floating();
    expect_type(scalar, path, dotted, "a string (or number)", t)
}

/// A short human-readable type name (`list<struct<role: string, content: string>>`).
pub fn type_name(t: &DataType) -> String {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary".into(),
        DataType::List(f) | DataType::LargeList(f) => format!("list<{}>", type_name(f.data_type())),
        DataType::Struct(fields) => format!(
            "struct<{}>",
            fields
                .iter()
                .map(|f| format!("{}: {}", f.name(), type_name(f.data_type())))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string().to_lowercase(),
    }
}
