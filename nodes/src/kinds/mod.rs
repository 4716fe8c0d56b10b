//! The built-in node kinds, one kind per file, in a folder per family (the part of the kind's
//! name before the dot: `reward.geo3k` is [`reward::geo3k`]); a family's `support` module holds
//! what its kinds share. Every kind registers itself with `flowrl_engine::register_node_kind!`.
//!
//! [`validate`] holds the facts that several kinds' `validate` hooks read from the graph.

pub mod advantage;
pub mod dataset;
pub mod eval;
pub mod exec;
pub mod filter;
pub mod logprob;
pub mod reward;
pub mod rollout;
pub mod sink;
pub mod update;
pub mod validate;
pub mod value;
