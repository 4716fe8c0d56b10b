//! Typed ports: the names and types of what a node kind consumes and produces.
//!
//! A [`PortType`] is a name ("Prompts", "Rollouts", "Scores", ...). The crate that produces a value
//! defines the constant and the Rust type behind it (see docs/ARCHITECTURE.md); the engine only
//! compares names when it checks edges, and [`PortType::ANY`] accepts every type (sinks, debug).
//!
//! The producing crate binds the name to its Rust type once, as a [`ValueType`]; a kind declares
//! each of its ports once, as a [`Port`] of that value type, and uses the constant everywhere: in
//! `inputs()`/`outputs()` ([`Port::spec`]) and when it reads and writes values
//! ([`crate::Inputs::get`], [`crate::Outputs::with`]), so reading a port as another Rust type than
//! its producers write does not compile:
//!
//! ```
//! use flowrl_engine::{Port, ValueType};
//!
//! /// A scalar per step.
//! pub const SCALAR: ValueType<f64> = ValueType::new("Scalar");
//! const X: Port<f64> = Port::new("x", SCALAR);
//!
//! assert_eq!(X.name(), "x");
//! assert_eq!(X.spec().ty, SCALAR.port_type());
//! ```
//!
//! Reading it as another type is a compile error in the node, not a run-time one:
//!
//! ```compile_fail
//! # use flowrl_engine::{Inputs, Port, ValueType};
//! # const X: Port<f64> = Port::new("x", ValueType::new("Scalar"));
//! fn read(inputs: &Inputs) -> anyhow::Result<&String> {
//!     inputs.get(X) // `X` carries `f64`
//! }
//! ```
//!
//! The graph-level check stays by name: an edge is accepted when the port types' names match.

use std::fmt;
use std::marker::PhantomData;

/// The type of a port, compared by name when edges are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortType(&'static str);

impl PortType {
    /// A port type that accepts values of every type (only meaningful on input ports).
    pub const ANY: PortType = PortType("Any");

    pub const fn new(name: &'static str) -> Self {
        PortType(name)
    }

    pub const fn name(self) -> &'static str {
        self.0
    }

    /// Whether a value of type `produced` may flow into a port of this type.
    pub fn accepts(self, produced: PortType) -> bool {
        self == PortType::ANY || self == produced
    }
}

impl fmt::Display for PortType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A [`PortType`] bound to the Rust type `T` of the values it carries; the crate that produces the
/// values defines it once (`pub const ROLLOUTS: ValueType<RolloutBatch> =
/// ValueType::new("Rollouts")`).
pub struct ValueType<T> {
    ty: PortType,
    value: PhantomData<fn() -> T>,
}

impl<T> ValueType<T> {
    pub const fn new(name: &'static str) -> Self {
        ValueType {
            ty: PortType::new(name),
            value: PhantomData,
        }
    }

    /// The port type, as compared on edges.
    pub const fn port_type(&self) -> PortType {
        self.ty
    }

    pub const fn name(&self) -> &'static str {
        self.ty.name()
    }
}

impl<T> Clone for ValueType<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ValueType<T> {}

impl<T> fmt::Debug for ValueType<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ValueType<{}>({})", std::any::type_name::<T>(), self.ty)
    }
}

impl<T> From<ValueType<T>> for PortType {
    fn from(v: ValueType<T>) -> Self {
        v.ty
    }
}

/// One port of a node kind: its name, its [`PortType`] and the Rust type `T` of its values.
/// Declared once as a constant (`const SCORES: Port<ScoreBatch> = Port::new("scores",
/// values::SCORES)`), it gives the port's [`PortSpec`] and reads or writes its value as a `T`.
pub struct Port<T> {
    name: &'static str,
    ty: PortType,
    value: PhantomData<fn() -> T>,
}

impl<T> Port<T> {
    pub const fn new(name: &'static str, ty: ValueType<T>) -> Self {
        Port {
            name,
            ty: ty.port_type(),
            value: PhantomData,
        }
    }

    pub const fn name(&self) -> &'static str {
        self.name
    }

    pub const fn port_type(&self) -> PortType {
        self.ty
    }

    /// The port's declaration, to which `.doc(..)`, `.optional()`, ... apply as usual.
    pub fn spec(&self) -> PortSpec {
        PortSpec::new(self.name, self.ty)
    }
}

impl<T> Clone for Port<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Port<T> {}

impl<T> fmt::Debug for Port<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Port<{}>({}: {})",
            std::any::type_name::<T>(),
            self.name,
            self.ty
        )
    }
}

/// What names a port when a node reads or writes a value: a [`Port<T>`] (the value is a `T`, checked
/// when the node compiles) or a port name as a string (the Rust type is given by the caller and
/// checked at run time).
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not carry values of type `{T}`",
    label = "this port's values are of another Rust type",
    note = "a `Port<X>` reads and writes values of type `X` only (its `ValueType<X>`)"
)]
pub trait PortName<T> {
    fn port_name(&self) -> &str;
}

impl<T> PortName<T> for Port<T> {
    fn port_name(&self) -> &str {
        self.name
    }
}

impl<T, S: AsRef<str>> PortName<T> for S {
    fn port_name(&self) -> &str {
        self.as_ref()
    }
}

/// One input or output port of a node kind.
#[derive(Clone, Debug)]
pub struct PortSpec {
    pub name: String,
    pub ty: PortType,
    pub doc: String,
    /// Inputs only: a graph may leave an optional input unwired.
    pub optional: bool,
    /// Inputs only: this spec matches any port name not declared otherwise (e.g. a sink that
    /// records whatever it is given: `inputs = { scores = "reward.scores", adv = "adv.advantages" }`).
    pub variadic: bool,
    /// Inputs only: the value comes from the nodes this node repeats (its `repeat` list), anew at
    /// each [`crate::Repeat::run`] the node makes within one step (see [`crate::Repeat`]).
    pub repeated: bool,
    /// Outputs only: handed to the nodes this node repeats at each [`crate::Repeat::run`] (a call
    /// argument), never emitted at the end of the step; only those nodes may take it.
    pub argument: bool,
}

impl PortSpec {
    pub fn new(name: impl Into<String>, ty: impl Into<PortType>) -> Self {
        PortSpec {
            name: name.into(),
            ty: ty.into(),
            doc: String::new(),
            optional: false,
            variadic: false,
            repeated: false,
            argument: false,
        }
    }

    /// Any number of inputs with names chosen by the graph, each of type `ty`.
    pub fn variadic(ty: impl Into<PortType>) -> Self {
        PortSpec {
            name: "*".into(),
            ty: ty.into(),
            doc: String::new(),
            optional: true,
            variadic: true,
            repeated: false,
            argument: false,
        }
    }

    pub fn doc(mut self, doc: impl Into<String>) -> Self {
        self.doc = doc.into();
        self
    }

    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// See [`PortSpec::repeated`] (an input whose producer this node runs on demand).
    pub fn repeated(mut self) -> Self {
        self.repeated = true;
        self
    }

    /// See [`PortSpec::argument`] (an output handed to the nodes this node repeats).
    pub fn argument(mut self) -> Self {
        self.argument = true;
        self
    }
}
