//! The size checks every family's config parser runs: zero sizes and implausibly large ones,
//! each error naming its key, so that a mistyped config.json is an error rather than a build
//! that divides by zero or allocates (or loops over) what it claims.

use anyhow::{Result, ensure};

/// Largest accepted width of a tensor dimension (vocabulary, hidden, MLP and head sizes): 2^26.
pub const MAX_WIDTH: usize = 1 << 26;
/// Largest accepted count of layers or heads.
pub const MAX_COUNT: usize = 1 << 12;
/// Largest accepted patch side, temporal patch, merge size, pooling window or channel count.
pub const MAX_PATCH: usize = 1 << 10;

/// Every `(key, value)` is at least 1; the message starts with `prefix` (e.g. `"config.json: "`).
pub fn ensure_positive(prefix: &str, sizes: &[(&str, usize)]) -> Result<()> {
    for &(key, value) in sizes {
        ensure!(value > 0, "{prefix}{key} must be at least 1 (got 0)");
    }
    Ok(())
}

/// Every `(key, value, max)` has `value <= max`.
pub fn ensure_at_most(prefix: &str, sizes: &[(&str, usize, usize)]) -> Result<()> {
    for &(key, value, max) in sizes {
        ensure!(
            value <= max,
            "{prefix}{key} = {value} is implausibly large (at most {max})"
        );
    }
    Ok(())
}
