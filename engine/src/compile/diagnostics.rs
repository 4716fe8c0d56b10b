//! Named constructors for the diagnostics that the compiler's stages emit in several places, so
//! that one kind of problem is worded one way. Diagnostics emitted in one place only are built
//! where they are found.

use crate::device::{DeviceRequest, Unavailable};
use crate::diagnostic::{Code, Diagnostic, Span};
use crate::params::ParamType;
use crate::spec::{SValue, with_article};

impl Diagnostic {
    /// E0104: `key` holds a value of another type than `expected`.
    pub(super) fn wrong_type(value: &SValue, expected: &ParamType, key: &str) -> Self {
        Diagnostic::error(
            Code::WrongType,
            format!(
                "`{key}` must be {}, found {}",
                expected_text(expected),
                with_article(value.kind.type_name())
            ),
        )
        .at(value.span)
    }

    /// E0104: `what` (a section, a resource, a node, `inputs`) must be a table.
    pub(super) fn not_a_table(what: &str, value: &SValue, help: &str) -> Self {
        Diagnostic::error(
            Code::WrongType,
            format!(
                "{what} must be a table, found {}",
                with_article(value.kind.type_name())
            ),
        )
        .at(value.span)
        .with_help(help.to_string())
    }

    /// E0102: a key at `path` that the schema of `what` does not declare.
    pub(super) fn unknown_key(path: &str, what: &str, at: Span, help: String) -> Self {
        Diagnostic::error(Code::UnknownKey, format!("unknown key `{path}` in {what}"))
            .at(at)
            .with_help(help)
    }

    /// E0103: the required parameter at `path` is absent from `what` (pointing at its header).
    pub(super) fn missing_param(what: &str, path: &str, at: Span, help: String) -> Self {
        Diagnostic::error(
            Code::MissingParam,
            format!("{what} is missing required parameter `{path}`"),
        )
        .at(at)
        .with_help(help)
    }

    /// E0106: a value of the right type that is not allowed (a non-finite number, a device string
    /// that names no device, ...).
    pub(super) fn invalid_value(message: impl Into<String>, at: Span) -> Self {
        Diagnostic::error(Code::InvalidValue, message).at(at)
    }

    /// E0701: `subject` ("the run", "node `x`") is placed on `req`, which the target lacks.
    pub(super) fn device_unavailable(
        subject: &str,
        req: DeviceRequest,
        why: Unavailable,
        at: Span,
    ) -> Self {
        Diagnostic::error(
            Code::DeviceUnavailable,
            format!("{subject} is placed on {req}, but {why}"),
        )
        .at(at)
        .with_help(why.help())
    }

    /// E0703: a problem with the list `[run] devices`.
    pub(super) fn bad_device_list(message: impl Into<String>, at: Span) -> Self {
        Diagnostic::error(Code::BadDeviceList, message).at(at)
    }

    /// E0402: a `repeat` list that does not fit the graph.
    pub(super) fn bad_repeat(message: String, at: Span) -> Self {
        Diagnostic::error(Code::BadRepeat, message).at(at)
    }
}

/// How a value of type `t` is described in "must be ..." messages.
pub(super) fn expected_text(t: &ParamType) -> String {
    match t {
        ParamType::Int => "an integer".into(),
        ParamType::Float => "a number".into(),
        ParamType::Bool => "a boolean (true or false)".into(),
        ParamType::String | ParamType::Enum(_) => "a string".into(),
        ParamType::Path => "a path (string)".into(),
        ParamType::Array(e) => format!("an array of {e}"),
        ParamType::Table(_) => "a table".into(),
        ParamType::Resource(k) => format!("the name of a {k} resource (string)"),
        ParamType::Any => "a value".into(),
    }
}
