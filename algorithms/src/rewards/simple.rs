//! Simple rule-based rewards: exact match of the boxed answer and format only.

use super::geo3k::{extract_boxed_content, format_reward};

/// 1.0 when the last `\boxed{}` content (brace-matched, stripped; the whole stripped response
/// if there is no box) equals the stripped ground truth exactly, else 0.0. Unlike
/// [`grade_answer`](super::grader::grade_answer), no normalisation at all.
pub fn exact_match_reward(response: &str, ground_truth: &str) -> f64 {
    let answer = if response.contains("\\boxed{") {
        extract_boxed_content(response)
    } else {
        response.trim().to_string()
    };
    if answer == ground_truth.trim() {
        1.0
    } else {
        0.0
    }
}

/// The geo3k format term alone: 1.0 for `<think>…</think>…\boxed{…}…`, else 0.0.
pub fn format_only_reward(response: &str) -> f64 {
    format_reward(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_match_uses_last_box_or_whole_text() {
        assert_eq!(exact_match_reward("so \\boxed{42}", "42"), 1.0);
        assert_eq!(
            exact_match_reward("\\boxed{1} then \\boxed{ 42 }", " 42"),
            1.0
        );
        assert_eq!(exact_match_reward("\\boxed{42.0}", "42"), 0.0);
        assert_eq!(exact_match_reward("  42 \n", "42"), 1.0);
        assert_eq!(exact_match_reward("\\boxed{42", "42"), 0.0);
    }

    #[test]
    fn format_only_matches_geo3k_format() {
        assert_eq!(format_only_reward("<think>a</think> \\boxed{1}"), 1.0);
        assert_eq!(format_only_reward("\\boxed{1}"), 0.0);
    }
}
