//! Parameter schemas of node and resource kinds, and the validated parameter values.
//!
//! A kind declares its parameters as [`ParamSpec`]s (name, [`ParamType`], default, range, doc,
//! required). The compiler checks a node's table against them (unknown keys with did-you-mean,
//! types, ranges, enum variants, resource references) and fills in defaults; the kind then gets a
//! [`Params`] and deserializes it with serde into its own typed struct ([`Params::parse`]).
//! `flowrl nodes` prints the same schema as documentation.
//!
//! The struct is the schema: `#[derive(Deserialize, Params)]` (crate `flowrl-derive`, re-exported
//! as `flowrl_engine::Params`) implements [`ParamSchema`] for it, one spec per field, typed by
//! [`ParamField`]; a `#[derive(ParamChoice)]` enum is an enum parameter ([`ParamChoice`]):
//!
//! ```
//! use flowrl_engine::{ParamChoice, ParamSchema, ParamSpec, Params};
//!
//! #[derive(Clone, Copy, Debug, PartialEq, ParamChoice)]
//! enum Mode { Uniform, Normal }
//!
//! #[derive(serde::Deserialize, Params)]
//! struct SourceParams {
//!     /// numbers per step
//!     #[param(default = 3, min = 1)]
//!     count: usize,
//!     #[param(default = Mode::Uniform)]
//!     mode: Mode,
//! }
//!
//! assert_eq!(
//!     SourceParams::param_specs(),
//!     vec![
//!         ParamSpec::int("count").default(3).min(1).doc("numbers per step"),
//!         ParamSpec::one_of("mode", &["uniform", "normal"]).default("uniform"),
//!     ]
//! );
//! ```
//!
//! A field that would be absent when not written, and so would not deserialize, does not compile:
//! it needs a `default`, `required`, or an `Option` type.
//!
//! ```compile_fail
//! #[derive(serde::Deserialize, flowrl_engine::Params)]
//! struct P {
//!     count: usize,
//! }
//! ```

use serde::de::DeserializeOwned;
use serde_json::Value as Json;
use std::fmt;
use std::path::PathBuf;

/// The type of one parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamType {
    Int,
    /// Accepts integer literals too (`coef = 1`).
    Float,
    Bool,
    String,
    /// A file or directory path (a string; relative paths are resolved against the working directory).
    Path,
    /// One of a fixed set of strings.
    Enum(Vec<String>),
    /// An array whose elements all have this type.
    Array(Box<ParamType>),
    /// An inline table with its own schema (`kl = { estimator = "low_var_kl", coef = 0.01 }`).
    Table(Vec<ParamSpec>),
    /// The name of a declared resource of this resource kind (e.g. `"model"` for `[models.*]`).
    Resource(String),
    /// Any TOML value, not checked.
    Any,
}

impl fmt::Display for ParamType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamType::Int => f.write_str("integer"),
            ParamType::Float => f.write_str("float"),
            ParamType::Bool => f.write_str("boolean"),
            ParamType::String => f.write_str("string"),
            ParamType::Path => f.write_str("path"),
            ParamType::Enum(v) => {
                let q: Vec<String> = v.iter().map(|s| format!("\"{s}\"")).collect();
                write!(f, "one of {}", q.join(" | "))
            }
            ParamType::Array(t) => write!(f, "array of {t}"),
            ParamType::Table(_) => f.write_str("table"),
            ParamType::Resource(k) => write!(f, "{k} resource name"),
            ParamType::Any => f.write_str("any value"),
        }
    }
}

/// A bound of a numeric range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bound {
    pub value: f64,
    pub inclusive: bool,
}

/// The bound `v`, inclusive or not (for [`ParamSpec::min`] and the like).
fn bound(v: impl Into<f64>, inclusive: bool) -> Option<Bound> {
    Some(Bound {
        value: v.into(),
        inclusive,
    })
}

/// The declaration of one parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    pub name: String,
    pub ty: ParamType,
    /// Filled in when the key is absent. A parameter with neither default nor `required` is
    /// simply absent (deserialize it into an `Option`).
    pub default: Option<Json>,
    pub required: bool,
    pub min: Option<Bound>,
    pub max: Option<Bound>,
    pub doc: String,
    /// For a table: when absent it stays absent instead of being filled from its fields'
    /// defaults (a feature that writing the table switches on, such as `kl = { ... }`).
    pub switch: bool,
}

impl ParamSpec {
    pub fn new(name: impl Into<String>, ty: ParamType) -> Self {
        ParamSpec {
            name: name.into(),
            ty,
            default: None,
            required: false,
            min: None,
            max: None,
            doc: String::new(),
            switch: false,
        }
    }
    pub fn int(name: impl Into<String>) -> Self {
        Self::new(name, ParamType::Int)
    }
    pub fn float(name: impl Into<String>) -> Self {
        Self::new(name, ParamType::Float)
    }
    pub fn bool(name: impl Into<String>) -> Self {
        Self::new(name, ParamType::Bool)
    }
    pub fn string(name: impl Into<String>) -> Self {
        Self::new(name, ParamType::String)
    }
    pub fn path(name: impl Into<String>) -> Self {
        Self::new(name, ParamType::Path)
    }
    pub fn one_of(name: impl Into<String>, variants: &[&str]) -> Self {
        Self::new(
            name,
            ParamType::Enum(variants.iter().map(|s| s.to_string()).collect()),
        )
    }
    pub fn array(name: impl Into<String>, elem: ParamType) -> Self {
        Self::new(name, ParamType::Array(Box::new(elem)))
    }
    pub fn table(name: impl Into<String>, fields: Vec<ParamSpec>) -> Self {
        Self::new(name, ParamType::Table(fields))
    }
    /// A reference to a declared resource of `resource_kind` (e.g. `ParamSpec::resource("model", "model")`).
    pub fn resource(name: impl Into<String>, resource_kind: impl Into<String>) -> Self {
        Self::new(name, ParamType::Resource(resource_kind.into()))
    }
    pub fn any(name: impl Into<String>) -> Self {
        Self::new(name, ParamType::Any)
    }

    pub fn default(mut self, value: impl Into<Json>) -> Self {
        self.default = Some(value.into());
        self
    }
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }
    /// A table that switches a feature on when written: absent, it stays absent (its fields'
    /// defaults apply only once the table is there).
    pub fn switch(mut self) -> Self {
        self.switch = true;
        self
    }
    /// Inclusive lower bound. Bounds are numbers of any kind that converts to `f64`, for int
    /// and float parameters alike: `.min(1)`, `.min(0.5)`.
    pub fn min(mut self, v: impl Into<f64>) -> Self {
        self.min = bound(v, true);
        self
    }
    /// Inclusive upper bound.
    pub fn max(mut self, v: impl Into<f64>) -> Self {
        self.max = bound(v, true);
        self
    }
    /// Exclusive lower bound (`gt(0)`: strictly positive).
    pub fn gt(mut self, v: impl Into<f64>) -> Self {
        self.min = bound(v, false);
        self
    }
    /// Exclusive upper bound.
    pub fn lt(mut self, v: impl Into<f64>) -> Self {
        self.max = bound(v, false);
        self
    }
    pub fn doc(mut self, doc: impl Into<String>) -> Self {
        self.doc = doc.into();
        self
    }

    /// The range as text, e.g. `>= 1`, `(0, 1]`; `None` when unbounded.
    pub fn range_text(&self) -> Option<String> {
        let num = |v: f64| {
            if v.fract() == 0.0 && v.abs() < 1e15 {
                format!("{}", v as i64)
            } else {
                format!("{v}")
            }
        };
        match (self.min, self.max) {
            (None, None) => None,
            (Some(lo), None) => Some(format!(
                "{} {}",
                if lo.inclusive { ">=" } else { ">" },
                num(lo.value)
            )),
            (None, Some(hi)) => Some(format!(
                "{} {}",
                if hi.inclusive { "<=" } else { "<" },
                num(hi.value)
            )),
            (Some(lo), Some(hi)) => Some(format!(
                "{}{}, {}{}",
                if lo.inclusive { "[" } else { "(" },
                num(lo.value),
                num(hi.value),
                if hi.inclusive { "]" } else { ")" }
            )),
        }
    }

    /// Whether `v` lies within the declared range.
    pub fn in_range(&self, v: f64) -> bool {
        let lo_ok = self.min.is_none_or(|b| {
            if b.inclusive {
                v >= b.value
            } else {
                v > b.value
            }
        });
        let hi_ok = self.max.is_none_or(|b| {
            if b.inclusive {
                v <= b.value
            } else {
                v < b.value
            }
        });
        lo_ok && hi_ok
    }
}

/// The validated parameters of one node or resource: the keys of its table (engine keys such as
/// `kind`, `inputs`, `device` removed) with defaults filled in, as JSON.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Params {
    map: serde_json::Map<String, Json>,
}

impl Params {
    pub fn from_map(map: serde_json::Map<String, Json>) -> Self {
        Params { map }
    }

    /// Deserializes into the kind's own parameter struct.
    pub fn parse<T: DeserializeOwned>(&self) -> anyhow::Result<T> {
        serde_json::from_value(Json::Object(self.map.clone()))
            .map_err(|e| anyhow::anyhow!("invalid parameters: {e}"))
    }

    pub fn get(&self, key: &str) -> Option<&Json> {
        self.map.get(key)
    }

    /// A dotted path into nested tables (`"kl.coef"`).
    pub fn get_path(&self, path: &str) -> Option<&Json> {
        let mut parts = path.split('.');
        let mut cur = self.map.get(parts.next()?)?;
        for p in parts {
            cur = cur.get(p)?;
        }
        Some(cur)
    }

    pub fn get_i64(&self, path: &str) -> Option<i64> {
        self.get_path(path)?.as_i64()
    }
    pub fn get_f64(&self, path: &str) -> Option<f64> {
        self.get_path(path)?.as_f64()
    }
    pub fn get_str(&self, path: &str) -> Option<&str> {
        self.get_path(path)?.as_str()
    }
    pub fn get_bool(&self, path: &str) -> Option<bool> {
        self.get_path(path)?.as_bool()
    }

    pub fn as_map(&self) -> &serde_json::Map<String, Json> {
        &self.map
    }
}

/// A parameter struct that is its own schema: `#[derive(Params)]` implements it (or write it by
/// hand). A kind's `params()` is then `MyParams::param_specs()`.
pub trait ParamSchema {
    /// One spec per key, in the struct's field order (the order `flowrl nodes` shows and the
    /// "known keys" help lists).
    fn param_specs() -> Vec<ParamSpec>;
}

/// The [`ParamType`] of a field's Rust type, for `#[derive(Params)]`: integers → `Int`, `f32`/`f64`
/// → `Float`, `bool`, `String`, `PathBuf` → `Path`, `Vec<T>` → `Array`, `serde_json::Value` →
/// `Any`, `Option<T>` → `T`'s type (the key may be absent), a `#[derive(Params)]` struct → `Table`,
/// a `#[derive(ParamChoice)]` enum → `Enum`.
pub trait ParamField {
    fn param_type() -> ParamType;
    /// A `#[param(default = ..)]` value as the compiler stores a written one: an integer default of
    /// a float parameter is a float (`default = 1` on an `f64` is `1.0`).
    fn default_value(value: Json) -> Json {
        value
    }
    /// `Option<T>`: absent is `None`.
    const OPTIONAL: bool = false;
    /// Whether an absent key fails to deserialize unless it gets a default or is required: every
    /// type but an `Option` and a table whose fields have defaults (the compiler fills those in).
    const NEEDS_VALUE: bool = true;
}

macro_rules! param_field {
    ($ty:expr => $($t:ty),*) => {
        $(impl ParamField for $t {
            fn param_type() -> ParamType {
                $ty
            }
        })*
    };
}
param_field!(ParamType::Int => i8, i16, i32, i64, isize, u8, u16, u32, u64, usize);

impl ParamField for f64 {
    fn param_type() -> ParamType {
        ParamType::Float
    }
    fn default_value(value: Json) -> Json {
        match value.as_number() {
            Some(n) if !n.is_f64() => n.as_f64().map_or(value, Json::from),
            _ => value,
        }
    }
}

impl ParamField for f32 {
    fn param_type() -> ParamType {
        ParamType::Float
    }
    fn default_value(value: Json) -> Json {
        f64::default_value(value)
    }
}
param_field!(ParamType::Bool => bool);
param_field!(ParamType::String => String);
param_field!(ParamType::Path => PathBuf);
param_field!(ParamType::Any => Json);

impl<T: ParamField> ParamField for Option<T> {
    fn param_type() -> ParamType {
        T::param_type()
    }
    fn default_value(value: Json) -> Json {
        T::default_value(value)
    }
    const OPTIONAL: bool = true;
    const NEEDS_VALUE: bool = false;
}

impl<T: ParamField> ParamField for Vec<T> {
    fn param_type() -> ParamType {
        ParamType::Array(Box::new(T::param_type()))
    }
    fn default_value(value: Json) -> Json {
        match value {
            Json::Array(items) => Json::Array(items.into_iter().map(T::default_value).collect()),
            other => other,
        }
    }
}

/// A plain enum whose variants are the string values of a parameter (`loss_agg_mode =
/// "token-mean"`): `#[derive(ParamChoice)]` implements it with `Display`, `FromStr`, serde both
/// ways and [`ParamField`].
pub trait ParamChoice: Sized + 'static {
    /// Every variant with its name, in declaration order.
    const ALL: &'static [(Self, &'static str)];
    /// The names alone, in the same order.
    const NAMES: &'static [&'static str];
    /// The name of this variant, as written in a graph.
    fn name(&self) -> &'static str;
    /// The names as the [`ParamType::Enum`] of a parameter.
    fn choices() -> Vec<String> {
        Self::NAMES.iter().map(|s| s.to_string()).collect()
    }
}

/// A string that names no variant of a [`ParamChoice`] enum (its `FromStr` error).
#[derive(Clone, Debug, PartialEq)]
pub struct ChoiceError {
    pub value: String,
    pub choices: &'static [&'static str],
}

impl ChoiceError {
    pub fn new<E: ParamChoice>(value: &str) -> Self {
        ChoiceError {
            value: value.to_string(),
            choices: E::NAMES,
        }
    }
}

impl fmt::Display for ChoiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q: Vec<String> = self.choices.iter().map(|s| format!("\"{s}\"")).collect();
        write!(f, "\"{}\" is not one of {}", self.value, q.join(" | "))
    }
}

impl std::error::Error for ChoiceError {}

/// For `#[serde(deserialize_with = "flowrl_engine::params::by_name")]`: a field whose type names
/// its values with `FromStr` but is not a [`ParamChoice`] (an enum of a crate that does not depend
/// on the engine, such as `flowrl_algorithms::LossAggMode`), read from its name. Its parameter
/// then declares the names with `#[param(one_of = ...)]`.
pub fn by_name<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    let s = <String as serde::Deserialize>::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}

/// What the code generated by `flowrl-derive` refers to (not an API).
#[doc(hidden)]
pub mod __derive {
    pub use serde;
    pub use serde_json;

    /// A [`super::ParamChoice`] enum from its name.
    pub fn deserialize_choice<'de, D, E>(d: D) -> Result<E, D::Error>
    where
        D: serde::Deserializer<'de>,
        E: super::ParamChoice + std::str::FromStr,
    {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        s.parse()
            .map_err(|_| serde::de::Error::unknown_variant(&s, E::NAMES))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_render_and_check() {
        let p = ParamSpec::float("clip").gt(0.0).max(1.0);
        assert_eq!(p.range_text().as_deref(), Some("(0, 1]"));
        assert!(!p.in_range(0.0));
        assert!(p.in_range(1.0));
        assert!(!p.in_range(1.5));
        assert_eq!(
            ParamSpec::int("n").min(1.0).range_text().as_deref(),
            Some(">= 1")
        );
    }

    #[test]
    fn params_parse_into_typed_struct() {
        #[derive(serde::Deserialize)]
        struct P {
            n: u32,
            kl: Kl,
        }
        #[derive(serde::Deserialize)]
        struct Kl {
            coef: f64,
        }
        let Json::Object(map) = serde_json::json!({"n": 8, "kl": {"coef": 0.01}}) else {
            unreachable!()
        };
        let params = Params::from_map(map);
        let p: P = params.parse().unwrap();
        assert_eq!(p.n, 8);
        assert_eq!(p.kl.coef, 0.01);
        assert_eq!(params.get_f64("kl.coef"), Some(0.01));
    }
}
