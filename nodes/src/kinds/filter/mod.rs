//! The `filter.*` kinds: they drop rows of a batch.

pub mod groups;
