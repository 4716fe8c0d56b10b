//! The `dataset.*` kinds: prompt sources.

pub(crate) mod params;
pub mod parquet;
pub(crate) mod prompt_sizes;
