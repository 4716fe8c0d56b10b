//! The messages of the exec-node protocol (docs/exec-protocol.md) and the checks on them.
//!
//! One JSON object per line. The program speaks first, with a handshake:
//! `{"hello": {"protocol": 2, "name", "version", "doc", "inputs": [{"name", "type", "doc",
//! "optional"}], "outputs": [...], "params": [{"name", "type", "default", "doc", "required", "min",
//! "max", "choices"}]}}`. Then, per step, flowrl writes one [`Request`] line and the program
//! answers one line: `{"step": <the request's step>, "outputs": {port: value}, "metrics": {name:
//! number}, "warnings": [..]}` or `{"step": .., "error": "message"}`.
//!
//! Versions: protocol 2 answers echo the request's `step`, so that a stale answer (a second line
//! written for an earlier request) is caught instead of being taken for the current one. Protocol 1
//! answers carry no `step`; such programs still run, with a warning ([`OLDEST_PROTOCOL_VERSION`]).
//!
//! This module turns the handshake into the engine's [`PortSpec`]s and [`ParamSpec`]s, reporting
//! every problem at once; the JSON forms of the port values are in `wire`.

use super::wire;
use flowrl_engine::{ParamSpec, ParamType, PortSpec};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use std::collections::BTreeMap;

/// The protocol version this build speaks (and documents).
pub const PROTOCOL_VERSION: u64 = 2;
/// The oldest version still accepted: protocol 1, whose answers carry no `step`.
pub const OLDEST_PROTOCOL_VERSION: u64 = 1;

/// The first line a program prints.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HelloLine {
    hello: Hello,
}

/// What a program declares about itself.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    pub protocol: u64,
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub doc: String,
    #[serde(default)]
    pub inputs: Vec<PortDecl>,
    #[serde(default)]
    pub outputs: Vec<PortDecl>,
    #[serde(default)]
    pub params: Vec<ParamDecl>,
}

/// One declared port.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PortDecl {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
    #[serde(default)]
    pub doc: String,
    /// Inputs only: the graph may leave it unwired.
    #[serde(default)]
    pub optional: bool,
}

/// One declared parameter.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ParamDecl {
    pub name: String,
    /// `int`, `float`, `bool`, `string`, `path`, `enum` (with `choices`), `list` or `any`.
    #[serde(rename = "type")]
    pub ty: String,
    #[serde(default)]
    pub default: Option<Json>,
    #[serde(default)]
    pub required: bool,
    #[serde(default)]
    pub doc: String,
    #[serde(default)]
    pub min: Option<f64>,
    #[serde(default)]
    pub max: Option<f64>,
    #[serde(default)]
    pub choices: Option<Vec<String>>,
}

/// The parameter types a program may declare.
pub const PARAM_TYPES: &[&str] = &[
    "int", "float", "bool", "string", "path", "enum", "list", "any",
];

/// One step's request (flowrl → program).
#[derive(Debug, Serialize)]
pub struct Request<'a> {
    /// 0-based step number.
    pub step: u64,
    /// The node's `params` table, defaults filled in.
    pub params: &'a Json,
    /// Each wired input port's value in its JSON form.
    pub inputs: BTreeMap<String, Json>,
}

/// One step's answer (program → flowrl).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    /// The `step` of the request answered (protocol 2; optional in an `error` answer).
    #[serde(default)]
    pub step: Option<u64>,
    #[serde(default)]
    pub outputs: Option<BTreeMap<String, Json>>,
    #[serde(default)]
    pub metrics: BTreeMap<String, Json>,
    #[serde(default)]
    pub warnings: Vec<String>,
    #[serde(default)]
    pub error: Option<String>,
}

/// A line shortened for an error message.
pub fn excerpt(line: &str) -> String {
    const MAX: usize = 200;
    if line.chars().count() <= MAX {
        line.to_string()
    } else {
        let cut: String = line.chars().take(MAX).collect();
        format!("{cut}… ({} bytes in all)", line.len())
    }
}

/// The first bare `NaN`, `Infinity` or `-Infinity` of a line that is not JSON (what Python's
/// `json.dumps` writes for non-finite floats), with its path in the message:
/// `("NaN", "outputs.scores.scores[2]")`. `None` when there is none, or when the line is not JSON
/// for another reason too.
pub fn non_finite_number(line: &str) -> Option<(String, String)> {
    const MARK: &str = "\u{1}flowrl-non-finite:";
    const TOKENS: [&str; 3] = ["-Infinity", "Infinity", "NaN"];
    let (mut out, mut found) = (String::with_capacity(line.len()), false);
    let (mut in_string, mut escaped) = (false, false);
    let mut i = 0;
    while let Some(c) = line[i..].chars().next() {
        if in_string {
            (in_string, escaped) = match c {
                _ if escaped => (true, false),
                '\\' => (true, true),
                '"' => (false, false),
                _ => (true, false),
            };
        } else if c == '"' {
            in_string = true;
        } else if let Some(t) = TOKENS.iter().find(|t| line[i..].starts_with(**t)) {
            out.push_str(&Json::from(format!("{MARK}{t}")).to_string());
            (i, found) = (i + t.len(), true);
            continue;
        }
        out.push(c);
        i += c.len_utf8();
    }
    fn find(v: &Json, path: String) -> Option<(String, String)> {
        match v {
            Json::String(s) => s.strip_prefix(MARK).map(|t| (t.to_string(), path.clone())),
            Json::Array(a) => a
                .iter()
                .enumerate()
                .find_map(|(i, x)| find(x, format!("{path}[{i}]"))),
            Json::Object(o) => o.iter().find_map(|(k, x)| {
                find(
                    x,
                    if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    },
                )
            }),
            _ => None,
        }
    }
    if !found {
        return None;
    }
    find(&serde_json::from_str(&out).ok()?, String::new())
}

/// Parses the handshake line. The error says what was wrong and quotes the line.
pub fn parse_hello(line: &str) -> Result<Hello, String> {
    let json: Json = serde_json::from_str(line).map_err(|e| {
        format!(
            "printed something that is not a JSON handshake ({e}): `{}`; a program must print \
             `{{\"hello\": {{...}}}}` first and write its own logs to stderr, not stdout",
            excerpt(line)
        )
    })?;
    let hello: HelloLine = serde_json::from_value(json).map_err(|e| {
        format!(
            "printed an invalid handshake ({e}): `{}`; expected `{{\"hello\": {{\"protocol\": \
             {PROTOCOL_VERSION}, \"name\": .., \"version\": .., \"inputs\": [..], \"outputs\": [..], \
             \"params\": [..]}}}}`",
            excerpt(line)
        )
    })?;
    Ok(hello.hello)
}

/// The checked declarations of a program, as the engine's specs.
#[derive(Debug, Clone)]
pub struct Declared {
    pub inputs: Vec<PortSpec>,
    pub outputs: Vec<PortSpec>,
    pub params: Vec<ParamSpec>,
}

/// Checks a handshake; every problem is reported (one message each).
pub fn check_hello(hello: &Hello) -> Result<Declared, Vec<String>> {
    let mut errors = Vec::new();
    if !(OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&hello.protocol) {
        errors.push(format!(
            "speaks protocol version {}, this flowrl speaks versions \
             {OLDEST_PROTOCOL_VERSION} to {PROTOCOL_VERSION}",
            hello.protocol
        ));
    }
    let ports = |decls: &[PortDecl], dir: &str, errors: &mut Vec<String>| {
        let mut out = Vec::new();
        let mut seen = Vec::new();
        for d in decls {
            if !valid_name(&d.name) {
                errors.push(format!(
                    "declares {dir} port `{}`: a port name is letters, digits and `_`, starting \
                     with a letter",
                    d.name
                ));
            }
            if seen.contains(&&d.name) {
                errors.push(format!("declares {dir} port `{}` twice", d.name));
            }
            seen.push(&d.name);
            let Some(ty) = wire::port_type(&d.ty) else {
                errors.push(format!(
                    "declares {dir} port `{}` of unknown port type `{}` (known port types: {})",
                    d.name,
                    d.ty,
                    wire::KNOWN_TYPES.join(", ")
                ));
                continue;
            };
            if dir == "output" && !wire::can_output(ty) {
                errors.push(format!(
                    "declares output port `{}` of type {ty}, which a program cannot produce \
                     (outputs may be: {})",
                    d.name,
                    wire::OUTPUT_TYPES.join(", ")
                ));
                continue;
            }
            if dir == "output" && d.optional {
                errors.push(format!(
                    "declares output port `{}` optional; only inputs can be",
                    d.name
                ));
            }
            let mut spec = PortSpec::new(d.name.clone(), ty).doc(d.doc.clone());
            if d.optional {
                spec = spec.optional();
            }
            out.push(spec);
        }
        out
    };
    let inputs = ports(&hello.inputs, "input", &mut errors);
    let outputs = ports(&hello.outputs, "output", &mut errors);
    let carrier = inputs
        .iter()
        .find(|p| !p.optional && wire::carries_rollouts(p.ty));
    if carrier.is_none()
        && let Some(o) = outputs.iter().find(|o| wire::needs_rollouts(o.ty))
    {
        errors.push(format!(
            "declares output `{}` ({}), which belongs to a batch of responses, but no required \
             input of type Rollouts, Scores or Advantages to take that batch from",
            o.name, o.ty
        ));
    }
    let mut params = Vec::new();
    let mut seen = Vec::new();
    for d in &hello.params {
        if seen.contains(&&d.name) {
            errors.push(format!("declares parameter `{}` twice", d.name));
        }
        seen.push(&d.name);
        match param_spec(d) {
            Ok(p) => params.push(p),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(Declared {
            inputs,
            outputs,
            params,
        })
    } else {
        Err(errors)
    }
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A declared parameter as an engine [`ParamSpec`] (its default checked against its type).
fn param_spec(d: &ParamDecl) -> Result<ParamSpec, String> {
    let ty = match d.ty.as_str() {
        "int" => ParamType::Int,
        "float" => ParamType::Float,
        "bool" => ParamType::Bool,
        "string" => ParamType::String,
        "path" => ParamType::Path,
        "list" => ParamType::Array(Box::new(ParamType::Any)),
        "any" => ParamType::Any,
        "enum" => match &d.choices {
            Some(c) if !c.is_empty() => ParamType::Enum(c.clone()),
            _ => {
                return Err(format!(
                    "declares enum parameter `{}` without `choices`",
                    d.name
                ));
            }
        },
        other => {
            return Err(format!(
                "declares parameter `{}` of unknown type `{other}` (parameter types: {})",
                d.name,
                PARAM_TYPES.join(", ")
            ));
        }
    };
    if d.choices.is_some() && !matches!(ty, ParamType::Enum(_)) {
        return Err(format!(
            "declares `choices` for parameter `{}`, which is not an enum",
            d.name
        ));
    }
    if let Some(def) = &d.default {
        let ok = match &ty {
            ParamType::Int => def.is_i64() || def.is_u64(),
            ParamType::Float => def.is_number(),
            ParamType::Bool => def.is_boolean(),
            ParamType::String | ParamType::Path => def.is_string(),
            ParamType::Enum(c) => def.as_str().is_some_and(|s| c.iter().any(|x| x == s)),
            ParamType::Array(_) => def.is_array(),
            _ => true,
        };
        if !ok {
            return Err(format!(
                "declares parameter `{}` ({ty}) with default {def}, which is not {ty}",
                d.name
            ));
        }
    }
    let mut spec = ParamSpec::new(d.name.clone(), ty).doc(d.doc.clone());
    if let Some(def) = &d.default {
        spec = spec.default(def.clone());
    }
    if d.required {
        spec = spec.required();
    }
    if let Some(m) = d.min {
        spec = spec.min(m);
    }
    if let Some(m) = d.max {
        spec = spec.max(m);
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(json: &str) -> Hello {
        parse_hello(json).unwrap()
    }

    #[test]
    fn a_valid_handshake_becomes_specs() {
        let h = hello(
            r#"{"hello": {"protocol": 1, "name": "r", "version": "1",
                "inputs": [{"name": "rollouts", "type": "Rollouts"}],
                "outputs": [{"name": "scores", "type": "Scores"}],
                "params": [{"name": "w", "type": "float", "default": 0.1, "min": 0, "max": 1},
                           {"name": "mode", "type": "enum", "choices": ["a", "b"], "default": "a"}]}}"#,
        );
        let d = check_hello(&h).unwrap();
        assert_eq!(d.inputs[0].ty.name(), "Rollouts");
        assert_eq!(d.outputs[0].ty.name(), "Scores");
        assert_eq!(d.params[0].default, Some(serde_json::json!(0.1)));
        assert!(!d.params[0].in_range(1.5));
        assert_eq!(
            d.params[1].ty,
            ParamType::Enum(vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn every_problem_of_a_handshake_is_reported() {
        let h = hello(
            r#"{"hello": {"protocol": 3, "name": "r", "version": "1",
                "inputs": [{"name": "x", "type": "Tensor"}],
                "outputs": [{"name": "scores", "type": "Scores"}, {"name": "p", "type": "Prompts"}],
                "params": [{"name": "w", "type": "float", "default": "high"},
                           {"name": "k", "type": "complex"}]}}"#,
        );
        let errs = check_hello(&h).unwrap_err();
        let all = errs.join("\n");
        assert!(
            all.contains("protocol version 3, this flowrl speaks versions 1 to 2"),
            "{all}"
        );
        assert!(
            all.contains("input port `x` of unknown port type `Tensor` (known port types: Prompts, Rollouts, Scores, TokenLogProbs, Advantages)"),
            "{all}"
        );
        assert!(
            all.contains("output port `p` of type Prompts, which a program cannot produce"),
            "{all}"
        );
        assert!(
            all.contains("no required input of type Rollouts, Scores or Advantages"),
            "{all}"
        );
        assert!(
            all.contains("parameter `w` (float) with default \"high\""),
            "{all}"
        );
        assert!(
            all.contains("parameter `k` of unknown type `complex`"),
            "{all}"
        );
        assert_eq!(errs.len(), 6, "{all}");
    }

    #[test]
    fn non_finite_numbers_are_found_outside_strings() {
        let line = r#"{"step": 0, "note": "NaN \" Infinity", "outputs": {"scores": {"scores": [1.0, NaN]}}}"#;
        assert_eq!(
            non_finite_number(line),
            Some(("NaN".into(), "outputs.scores.scores[1]".into()))
        );
        assert_eq!(
            non_finite_number(r#"{"metrics": {"m": -Infinity}}"#),
            Some(("-Infinity".into(), "metrics.m".into()))
        );
        assert_eq!(non_finite_number(r#"{"x": "NaN"}"#), None);
        assert_eq!(non_finite_number("debug: NaN"), None, "not JSON anyway");
    }

    #[test]
    fn garbage_and_misspelled_handshakes_are_explained() {
        let e = parse_hello("Loading model...").unwrap_err();
        assert!(e.contains("not a JSON handshake"), "{e}");
        assert!(e.contains("`Loading model...`"), "{e}");
        assert!(e.contains("logs to stderr"), "{e}");
        let e =
            parse_hello(r#"{"hello": {"protocol": 1, "name": "r", "version": "1", "ouputs": []}}"#)
                .unwrap_err();
        assert!(e.contains("unknown field `ouputs`"), "{e}");
    }
}
