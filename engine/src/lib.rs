//! flowrl-engine: turns a TOML graph of typed nodes into a checked, scheduled, repeatable training
//! run.
//!
//! The path a graph takes: TOML text → spanned document (`spec`) → checked typed [`Graph`]
//! (`compile`, reporting [`Diagnostic`]s) → built nodes and resources → steps run by the scheduler
//! (`run`), with metrics, checkpoints and progress. Node kinds plug in through the [`NodeKind`] /
//! [`Node`] traits (see [`node`]); the engine never imports a concrete node kind.

// The derives emit `::flowrl_engine::…` paths; this lets the engine derive its own `[run]`.
extern crate self as flowrl_engine;
pub mod cli;
pub mod compile;
pub mod context;
pub mod device;
pub mod diagnostic;
pub mod export;
pub mod graph;
pub mod node;
pub mod params;
pub mod placement;
pub mod plan;
pub mod plot;
pub mod port;
pub mod progress;
pub mod registry;
pub mod repeat;
pub mod resource;
pub mod run;
pub mod rundir;
pub mod scheduler;
pub mod session;
pub mod spec;
pub mod tensorboard;
pub mod value;

pub use compile::{Failure, Override, compile};
pub use context::{BuildContext, Media, StepContext, derive_seed};
pub use device::{DeviceRequest, DeviceSpec};
pub use diagnostic::{Code, Diagnostic, Severity, Span};
pub use flowrl_derive::{ParamChoice, Params};
pub use graph::{Graph, RunConfig, Tracker};
pub use node::{Capability, Node, NodeKind, NodeTable, NodeView, ResourceView, ValidateCtx};
pub use params::{ChoiceError, ParamChoice, ParamField, ParamSchema, ParamSpec, ParamType, Params};
pub use placement::{Cluster, Launch, Placement, on_run_end, on_stop_vote, run_ended, stop_voted};
pub use plan::{Footprint, Item, Place, PlanCtx, ResourcePlan};
pub use port::{Port, PortName, PortSpec, PortType, ValueType};
pub use registry::{NodeKindRegistration, Registry, ResourceKindRegistration};
pub use repeat::Repeat;
pub use resource::{ResourceKind, ResourceValue, Resources};
pub use session::{RunState, Session, StepReport};
pub use value::{Inputs, Outputs, Payload, Value};

#[doc(hidden)]
pub use inventory;
