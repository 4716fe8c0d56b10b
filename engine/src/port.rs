//! Typed ports: the names and types of what a node kind consumes and produces.
//!
//! A [`PortType`] is a name ("Prompts", "Rollouts", "Scores", ...). The crate that produces a value
//! defines the constant and the Rust type behind it (see docs/ARCHITECTURE.md); the engine only
//! compares names when it checks edges, and [`PortType::ANY`] accepts every type (sinks, debug).

use std::fmt;

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
    pub fn new(name: impl Into<String>, ty: PortType) -> Self {
        PortSpec {
            name: name.into(),
            ty,
            doc: String::new(),
            optional: false,
            variadic: false,
            repeated: false,
            argument: false,
        }
    }

    /// Any number of inputs with names chosen by the graph, each of type `ty`.
    pub fn variadic(ty: PortType) -> Self {
        PortSpec {
            name: "*".into(),
            ty,
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
