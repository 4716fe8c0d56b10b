//! Rule-based rewards (pure Rust, no tensors): the geo3k score with a port of its answer
//! grader, exact match, format only, and weighted combinations that report each component.

pub mod combined;
mod exact;
pub mod geo3k;
pub mod grader;
mod latex_text;
pub mod simple;

pub use combined::{BuiltinReward, CombinedReward, RewardFunction, RewardScore};
pub use geo3k::{
    Geo3kScore, acc_reward, extract_boxed_content, format_reward, geo3k_score, last_boxed,
};
pub use grader::grade_answer;
pub use simple::{exact_match_reward, format_only_reward};
