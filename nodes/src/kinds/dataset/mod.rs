//! The `dataset.*` kinds: prompt sources.

pub mod parquet;
