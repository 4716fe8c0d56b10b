//! The built-in resource kinds: what the `[models.*]` sections of a graph load once and the nodes
//! share.

pub mod model;
