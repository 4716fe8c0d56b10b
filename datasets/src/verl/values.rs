//! Value access over the few physical layouts a column may have (string, binary and list
//! arrays of either offset width, views, structs), and any value as JSON. `None` means null or
//! another layout; the column types were checked by [`super::schema`].

use std::ops::Range;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, StructArray};
use serde_json::Value as Json;

use super::schema::type_name;

/// Value `i` of a string array (any offset width), `None` when null or not a string array.
pub(super) fn str_at(a: &dyn Array, i: usize) -> Option<&str> {
    if a.is_null(i) {
        return None;
    }
    if let Some(s) = a.as_string_opt::<i32>() {
        Some(s.value(i))
    } else if let Some(s) = a.as_string_opt::<i64>() {
        Some(s.value(i))
    } else {
        a.as_string_view_opt().map(|s| s.value(i))
    }
}

pub(super) fn bytes_at(a: &dyn Array, i: usize) -> Option<&[u8]> {
    if a.is_null(i) {
        return None;
    }
    if let Some(s) = a.as_binary_opt::<i32>() {
        Some(s.value(i))
    } else if let Some(s) = a.as_binary_opt::<i64>() {
        Some(s.value(i))
    } else {
        a.as_binary_view_opt().map(|s| s.value(i))
    }
}

/// Child range and values of list `i`; `None` when null.
pub(super) fn list_at(a: &dyn Array, i: usize) -> Option<(Range<usize>, &ArrayRef)> {
    if a.is_null(i) {
        return None;
    }
    if let Some(l) = a.as_list_opt::<i32>() {
        let o = l.value_offsets();
        Some((o[i] as usize..o[i + 1] as usize, l.values()))
    } else {
        a.as_list_opt::<i64>().map(|l| {
            let o = l.value_offsets();
            (o[i] as usize..o[i + 1] as usize, l.values())
        })
    }
}

pub(super) fn child<'a>(s: &'a StructArray, name: &str) -> Option<&'a ArrayRef> {
    s.column_by_name(name)
}

/// Converts value `i` of any common Arrow array to JSON (binary becomes `"<N bytes>"`).
pub fn to_json(a: &dyn Array, i: usize) -> Json {
    if a.is_null(i) {
        return Json::Null;
    }
    macro_rules! prim {
        ($t:ty) => {
            if let Some(p) = a.as_primitive_opt::<$t>() {
                return serde_json::json!(p.value(i));
            }
        };
    }
    prim!(Int64Type);
    prim!(Int32Type);
    prim!(Int16Type);
    prim!(Int8Type);
    prim!(UInt64Type);
    prim!(UInt32Type);
    prim!(UInt16Type);
    prim!(UInt8Type);
    prim!(Float64Type);
    prim!(Float32Type);
    if let Some(s) = str_at(a, i) {
        return Json::String(s.to_string());
    }
    if let Some(b) = a.as_boolean_opt() {
        return Json::Bool(b.value(i));
    }
    if let Some(b) = bytes_at(a, i) {
        return Json::String(format!("<{} bytes>", b.len()));
    }
    if let Some(s) = a.as_struct_opt() {
        let mut map = serde_json::Map::new();
        for (f, c) in s.fields().iter().zip(s.columns()) {
            map.insert(f.name().clone(), to_json(c.as_ref(), i));
        }
        return Json::Object(map);
    }
    if let Some((range, values)) = list_at(a, i) {
        return Json::Array(range.map(|j| to_json(values.as_ref(), j)).collect());
    }
    Json::String(format!("<{}>", type_name(a.data_type())))
}
