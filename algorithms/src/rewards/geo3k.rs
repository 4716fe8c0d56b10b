//! The geo3k reward: verl's `utils/reward_score/geo3k.py` (`compute_score`, `format_reward`,
//! `acc_reward`) with mathruler's `extract_boxed_content` and `grade_answer`.
//!
//! score = (1 − 0.1)·acc + 0.1·format, i.e. one of 0.0, 0.1, 0.9, 1.0, where
//!
//! * format = 1 iff the whole response matches `<think>.*</think>.*\boxed\{.*\}.*` with `.`
//!   matching newlines (Python `re.fullmatch(..., re.DOTALL)`; case-sensitive, no leading
//!   text; braces need not balance);
//! * acc = 1 iff [`grade_answer`] accepts the content of the
//!   **last** `\boxed{` (brace-matched, whitespace-stripped; the string `None` when there is no
//!   box or it never closes) against the ground truth.

use std::sync::OnceLock;

use regex::Regex;

use super::grader::grade_answer;

/// verl's geo3k `format_score` (weight of the format term).
pub const GEO3K_FORMAT_SCORE: f64 = 0.1;

/// The three parts of a geo3k verdict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geo3kScore {
    /// 0.9·acc + 0.1·format.
    pub score: f64,
    /// Answer correctness, 0 or 1.
    pub acc: f64,
    /// Format compliance, 0 or 1.
    pub format: f64,
}

fn format_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"(?s)\A<think>.*</think>.*\\boxed\{.*\}.*\z").expect("static regex")
    })
}

/// verl geo3k `format_reward`: 1.0 when the response is a think block followed by a boxed
/// answer (see the module docs), else 0.0.
pub fn format_reward(response: &str) -> f64 {
    if format_regex().is_match(response) {
        1.0
    } else {
        0.0
    }
}

/// mathruler `extract_boxed_content`: the stripped content of the last `\boxed{...}` with
/// brace matching, or the literal string `"None"` if there is none or it never closes.
pub fn extract_boxed_content(text: &str) -> String {
    last_boxed(text).unwrap_or("None").to_string()
}

/// The stripped content of the last `\boxed{...}` of `text`, braces matched; `None` if there is
/// none or it never closes.
pub fn last_boxed(text: &str) -> Option<&str> {
    const OPEN: &str = "\\boxed{";
    let content = &text[text.rfind(OPEN)? + OPEN.len()..];
    let mut depth = 0usize;
    for (i, c) in content.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return Some(content[..i].trim()),
            '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// verl geo3k `acc_reward` (with `use_boxed=True`): 1.0 when the extracted answer is graded
/// correct against `ground_truth`.
pub fn acc_reward(response: &str, ground_truth: &str) -> f64 {
    if grade_answer(&extract_boxed_content(response), ground_truth) {
        1.0
    } else {
        0.0
    }
}

/// verl geo3k `compute_score`: (1 − 0.1)·acc + 0.1·format, with both parts returned.
pub fn geo3k_score(response: &str, ground_truth: &str) -> Geo3kScore {
    let acc = acc_reward(response, ground_truth);
    let format = format_reward(response);
    Geo3kScore {
        score: (1.0 - GEO3K_FORMAT_SCORE) * acc + GEO3K_FORMAT_SCORE * format,
        acc,
        format,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random strings over the characters the grader treats specially: it must never panic.
    #[test]
    fn grader_never_panics_on_arbitrary_text() {
        const PIECES: &[&str] = &[
            "\\boxed{",
            "{",
            "}",
            "\\frac",
            "\\sqrt",
            "\\text{",
            "\\text{ ",
            "^",
            "^{",
            "(",
            ")",
            "[",
            "]",
            ",",
            ".",
            "-",
            "+",
            "*",
            "/",
            "=",
            " ",
            "\n",
            "0",
            "1",
            "2",
            "9",
            "x",
            "y",
            "pi",
            "\\pi",
            "sqrt",
            "e",
            "E",
            "j",
            "_",
            "$",
            "%",
            "\\%",
            "\\",
            "\\!",
            "degree",
            "1,000",
            "0.5",
            "1e400",
            "99999999999999999999999999999999999999999",
            "<think>",
            "</think>",
            "é",
            "√",
            "π",
            "inf",
            "nan",
            "\\left",
            "\\circ",
            "\\dfrac",
            "[3]",
        ];
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut accepted = 0;
        for _ in 0..20_000 {
            let mut pieces = [String::new(), String::new()];
            for p in &mut pieces {
                for _ in 0..next() % 8 {
                    p.push_str(PIECES[(next() % PIECES.len() as u64) as usize]);
                }
            }
            let [a, b] = pieces;
            let r = geo3k_score(&format!("<think>t</think> \\boxed{{{a}}}"), &b);
            assert!([0.0, 0.1, 0.9, 1.0].contains(&r.score));
            accepted += r.acc as usize;
            let _ = grade_answer(&a, &a);
        }
        assert!(accepted > 0);
    }
}
