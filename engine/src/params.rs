//! Parameter schemas of node and resource kinds, and the validated parameter values.
//!
//! A kind declares its parameters as [`ParamSpec`]s (name, [`ParamType`], default, range, doc,
//! required). The compiler checks a node's table against them (unknown keys with did-you-mean,
//! types, ranges, enum variants, resource references) and fills in defaults; the kind then gets a
//! [`Params`] and deserializes it with serde into its own typed struct ([`Params::parse`]).
//! `flowrl nodes` prints the same schema as documentation.

use serde::de::DeserializeOwned;
use serde_json::Value as Json;
use std::fmt;

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
        self.min = Some(Bound {
            value: v.into(),
            inclusive: true,
        });
        self
    }
    /// Inclusive upper bound.
    pub fn max(mut self, v: impl Into<f64>) -> Self {
        self.max = Some(Bound {
            value: v.into(),
            inclusive: true,
        });
        self
    }
    /// Exclusive lower bound (`gt(0)`: strictly positive).
    pub fn gt(mut self, v: impl Into<f64>) -> Self {
        self.min = Some(Bound {
            value: v.into(),
            inclusive: false,
        });
        self
    }
    /// Exclusive upper bound.
    pub fn lt(mut self, v: impl Into<f64>) -> Self {
        self.max = Some(Bound {
            value: v.into(),
            inclusive: false,
        });
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
