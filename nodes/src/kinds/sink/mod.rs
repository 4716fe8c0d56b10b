//! Kinds that consume what is wired to them and produce nothing: `sink.jsonl` writes it to a
//! file, `sink.trajectories` the responses as JSONL with their pictures, `debug.print` to stderr.

pub mod debug_print;
pub mod jsonl;
pub mod trajectories;
