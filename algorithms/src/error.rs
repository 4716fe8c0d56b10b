//! The one error type of the algorithm library.
//!
//! Every fallible function returns [`AlgoError`]; nothing in this crate panics on bad input
//! (mismatched shapes, empty batches, non-finite rewards, unknown names). Where verl raises,
//! the message reproduces verl's text so that users recognise it.

use thiserror::Error;

/// Errors of the algorithm library.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum AlgoError {
    /// Two inputs that must have the same shape do not.
    #[error("shape mismatch: {what}: expected {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// Which input.
        what: String,
        /// The shape it must have.
        expected: Vec<usize>,
        /// The shape it has.
        got: Vec<usize>,
    },
    /// The batch has no responses (or no columns where some are needed).
    #[error("empty input: {0}")]
    Empty(String),
    /// A reward/score is NaN or infinite (verl would propagate it through the whole group).
    #[error("non-finite score {value} for response {row} (uid {uid:?}); rewards must be finite")]
    NonFiniteScore {
        /// Response (row) index.
        row: usize,
        /// Its prompt uid.
        uid: String,
        /// The offending value.
        value: f64,
    },
    /// verl: `ValueError("Invalid loss_agg_mode: ...")`.
    #[error("Invalid loss_agg_mode: {0}")]
    InvalidLossAggMode(String),
    /// verl: `ValueError` when `dp_size > 1` and a global normaliser is missing.
    #[error("{0}")]
    MissingGlobalInfo(&'static str),
    /// verl: `NotImplementedError` (KL estimator `full`).
    #[error("not implemented: {0}")]
    NotImplemented(String),
    /// An unknown name (KL estimator, advantage estimator, ...).
    #[error("unknown {kind} {name:?}; expected one of: {expected}")]
    Unknown {
        /// What kind of name.
        kind: &'static str,
        /// The name given.
        name: String,
        /// The accepted names.
        expected: String,
    },
    /// A parameter outside its valid range (e.g. `clip_ratio_c <= 1`).
    #[error("invalid parameter: {0}")]
    InvalidParameter(String),
    /// A NaN or infinite value in an input other than the scores (values, baselines,
    /// log-probs, ...).
    #[error("non-finite {what} {value} at flat position {index}; inputs must be finite")]
    NonFiniteInput {
        /// Which input.
        what: String,
        /// Its flat (row-major) position.
        index: usize,
        /// The offending value.
        value: f64,
    },
    /// verl's pass@k GRPO: `ValueError` for a group with fewer than 2 responses.
    #[error("Pass@k requires at least 2 samples per group. Got {n} for group {group}.")]
    PassKGroupTooSmall {
        /// The group's uid.
        group: String,
        /// Its number of responses.
        n: usize,
    },
    /// verl's `masked_whiten` needs at least two valid tokens (unbiased variance).
    #[error("batch whitening needs at least 2 valid tokens, the mask has {0}")]
    TooFewTokens(usize),
}

/// Shorthand result type of this crate.
pub type Result<T> = std::result::Result<T, AlgoError>;
