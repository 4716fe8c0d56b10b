//! Kinds that consume what is wired to them and produce nothing: `sink.jsonl` writes it to a
//! file, `debug.print` to stderr.

pub mod debug_print;
pub mod jsonl;
