//! Values on edges: what a node's `run` receives ([`Inputs`]) and returns ([`Outputs`]).
//!
//! A value is plain Rust data behind `Arc<dyn Any + Send + Sync>`, tagged by the engine with the
//! [`PortType`] of the port that produced it. Values built with [`Outputs::with`] also carry a JSON
//! view (from `serde::Serialize`) so generic nodes (JSONL sink, debug print) can record them;
//! [`Outputs::with_opaque`] is for data that cannot be serialized.
//!
//! A port is named by a [`crate::Port<T>`] constant (the value is a `T`, checked when the node
//! compiles: `inputs.get_arc(ROLLOUTS)?`, `Outputs::new().with(MEAN, m)`) or by its name as a
//! string (the caller gives the type, checked at run time: `inputs.get::<f64>("x")?`).

use crate::port::{PortName, PortType};
use anyhow::{Context as _, anyhow};
use serde::Serialize;
use serde_json::Value as Json;
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

type ToJson = fn(&(dyn Any + Send + Sync)) -> Option<Json>;

/// The data of one output before the engine tags it with its port type.
#[derive(Clone)]
pub struct Payload {
    data: Arc<dyn Any + Send + Sync>,
    type_name: &'static str,
    to_json: Option<ToJson>,
}

impl Payload {
    pub fn new<T: Any + Send + Sync + Serialize>(value: T) -> Self {
        Self::shared(Arc::new(value))
    }

    /// A value already shared (no copy).
    pub fn shared<T: Any + Send + Sync + Serialize>(value: Arc<T>) -> Self {
        Payload {
            data: value,
            type_name: std::any::type_name::<T>(),
            to_json: Some(|any| {
                any.downcast_ref::<T>()
                    .and_then(|v| serde_json::to_value(v).ok())
            }),
        }
    }

    pub fn opaque<T: Any + Send + Sync>(value: T) -> Self {
        Self::opaque_arc(Arc::new(value))
    }

    /// A value already shared (no copy), that cannot be serialized.
    pub fn opaque_arc<T: Any + Send + Sync>(value: Arc<T>) -> Self {
        Payload {
            data: value,
            type_name: std::any::type_name::<T>(),
            to_json: None,
        }
    }
}

/// A value travelling on an edge.
#[derive(Clone)]
pub struct Value {
    pub ty: PortType,
    payload: Payload,
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Value<{}: {}>", self.ty, self.payload.type_name)
    }
}

impl Value {
    pub fn new(ty: PortType, payload: Payload) -> Self {
        Value { ty, payload }
    }

    /// The Rust type name of the data (for messages).
    pub fn type_name(&self) -> &'static str {
        self.payload.type_name
    }

    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.payload.data.downcast_ref::<T>()
    }

    pub fn downcast_arc<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.payload.data.clone().downcast::<T>().ok()
    }

    /// The JSON view of the value; `None` for opaque values.
    pub fn to_json(&self) -> Option<Json> {
        self.payload
            .to_json
            .and_then(|f| f(self.payload.data.as_ref()))
    }
}

/// The values wired to a node's input ports for one step.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    node: String,
    values: BTreeMap<String, Value>,
}

impl Inputs {
    pub fn new(node: impl Into<String>) -> Self {
        Inputs {
            node: node.into(),
            values: BTreeMap::new(),
        }
    }

    pub fn insert(&mut self, port: impl Into<String>, value: Value) {
        self.values.insert(port.into(), value);
    }

    /// The value on `port`; an error names the node and the port.
    fn wired(&self, port: &str) -> anyhow::Result<&Value> {
        self.values
            .get(port)
            .with_context(|| format!("node `{}` has no value on input `{port}`", self.node))
    }

    /// The value on `port` as `&T`; an error names the node, the port and both types.
    pub fn get<T: Any>(&self, port: impl PortName<T>) -> anyhow::Result<&T> {
        let port = port.port_name();
        let v = self.wired(port)?;
        v.downcast_ref::<T>().ok_or_else(|| {
            anyhow!(
                "input `{port}` of node `{}` holds `{}` (port type {}), not `{}`",
                self.node,
                v.type_name(),
                v.ty,
                std::any::type_name::<T>()
            )
        })
    }

    /// Like [`Inputs::get`] for an optional port: `Ok(None)` when the port is not wired.
    pub fn get_opt<T: Any>(&self, port: impl PortName<T>) -> anyhow::Result<Option<&T>> {
        let port = port.port_name();
        if self.values.contains_key(port) {
            self.get::<T>(port).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The value on `port` as a shared `Arc<T>` (no copy).
    pub fn get_arc<T: Any + Send + Sync>(&self, port: impl PortName<T>) -> anyhow::Result<Arc<T>> {
        let port = port.port_name();
        let v = self.wired(port)?;
        v.downcast_arc::<T>().ok_or_else(|| {
            anyhow!(
                "input `{port}` of node `{}` holds `{}`, not `{}`",
                self.node,
                v.type_name(),
                std::any::type_name::<T>()
            )
        })
    }

    pub fn value(&self, port: &str) -> Option<&Value> {
        self.values.get(port)
    }

    /// All wired inputs, by port name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn contains(&self, port: &str) -> bool {
        self.values.contains_key(port)
    }
}

/// What a node's `run` returns: values by output port name, or "skipped this step".
#[derive(Clone, Default)]
pub struct Outputs {
    pub(crate) values: BTreeMap<String, Payload>,
    pub(crate) skipped: bool,
}

impl Outputs {
    pub fn new() -> Self {
        Outputs::default()
    }

    /// Adds the value of an output port. `T: Serialize` lets sinks record it.
    pub fn with<T: Any + Send + Sync + Serialize>(
        mut self,
        port: impl PortName<T>,
        value: T,
    ) -> Self {
        self.values
            .insert(port.port_name().to_string(), Payload::new(value));
        self
    }

    /// [`Outputs::with`] of a value already shared (no copy).
    pub fn with_arc<T: Any + Send + Sync + Serialize>(
        mut self,
        port: impl PortName<T>,
        value: Arc<T>,
    ) -> Self {
        self.values
            .insert(port.port_name().to_string(), Payload::shared(value));
        self
    }

    /// Adds a value that cannot be serialized.
    pub fn with_opaque<T: Any + Send + Sync>(mut self, port: impl PortName<T>, value: T) -> Self {
        self.values
            .insert(port.port_name().to_string(), Payload::opaque(value));
        self
    }

    /// Forwards an input value unchanged (no copy).
    pub fn with_value(mut self, port: impl Into<String>, value: &Value) -> Self {
        self.values.insert(port.into(), value.payload.clone());
        self
    }

    /// The value of output `port` as a `T` (tools and tests that run nodes by hand).
    pub fn get_arc<T: Any + Send + Sync>(&self, port: impl PortName<T>) -> Option<Arc<T>> {
        self.values
            .get(port.port_name())
            .and_then(|p| p.data.clone().downcast::<T>().ok())
    }

    /// The node did nothing this step (e.g. evaluation between its intervals). Nodes downstream
    /// of a skipped node's outputs are skipped too, unless those inputs are optional.
    pub fn skipped() -> Self {
        Outputs {
            values: BTreeMap::new(),
            skipped: true,
        }
    }

    pub fn is_skipped(&self) -> bool {
        self.skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_access_and_mismatch_message() {
        const SCORES: PortType = PortType::new("Scores");
        let out = Outputs::new().with("scores", vec![1.0f32, 2.0]);
        let mut inputs = Inputs::new("adv");
        inputs.insert("scores", Value::new(SCORES, out.values["scores"].clone()));
        assert_eq!(inputs.get::<Vec<f32>>("scores").unwrap(), &vec![1.0, 2.0]);
        let err = inputs.get::<String>("scores").unwrap_err().to_string();
        assert!(err.contains("input `scores` of node `adv` holds `alloc::vec::Vec<f32>` (port type Scores), not `alloc::string::String`"), "{err}");
        assert!(inputs.get::<String>("missing").is_err());
        assert_eq!(
            inputs.value("scores").unwrap().to_json(),
            Some(serde_json::json!([1.0, 2.0]))
        );
    }
}
