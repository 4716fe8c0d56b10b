//! The `reward.*` kinds: rollouts → per-response scores. What they share is in [`support`].

pub mod combined;
pub mod exact_match;
pub mod format;
pub mod geo3k;
pub mod judge;
pub mod model;
pub mod overlong;
pub mod support;
