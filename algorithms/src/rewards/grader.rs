//! A port of the answer checker geo3k uses: mathruler's `grade_answer`, itself the PRM800K
//! grader (Hendrycks' MATH normalisation, then a sympy-based comparison).
//!
//! `grade_answer(given, truth)` accepts when
//!
//! 1. the two strings are equal after the MATH normalisation ([`mathd_normalize_answer`]:
//!    strips `\text{..}` wrappers, `\!`, `\left`/`\right`, `^\circ`, `\$`, `\%`, right units
//!    `\text{ ..}`, short `x=` prefixes, spaces; `dfrac`/`tfrac` → `frac`; `\frac12` →
//!    `\frac{1}{2}`; `\sqrt3` → `\sqrt{3}`; `0.5` → `\frac{1}{2}`; `a/b` → `\frac{a}{b}`), or
//! 2. they are equal after the second normalisation ([`normalize_answer`]: removes `$`, `%`,
//!    unit words, `^\circ`; integer-valued floats → integers; LaTeX → plain text (a small port
//!    of pylatexenc's `latex2text` for the macros answers use, see `latex_text`); mixed
//!    numbers `7 3/4` → `7+3/4`; removes spaces and braces; lower-cases; strips thousands
//!    separators of integers), or
//! 3. element by element over tuples/intervals (brackets must match): two plain `a/b`
//!    fractions must be identical (no reduction); if exactly one side is an integer the answer
//!    is rejected; otherwise the difference is simplified and must be 0.
//!
//! Step 3's "simplification" is where the reference uses sympy. Here an exact evaluator
//! (private `exact`) decides it: rationals, `sqrt` of rationals, integer and half-integer
//! powers, π, and up to two free letters as polynomial variables, with + − × ÷ and implicit
//! multiplication; purely numeric expressions with decimals follow sympy's `Float` arithmetic
//! (53-bit, so `0.1+0.2` ≠ `0.3`; roots of decimals are numeric and never equal a symbolic
//! root). The reference's guards are kept (more than two distinct letters, `^{`, `^(`, or
//! multi-digit exponents skip the step). Anything outside that language (other functions,
//! nested radicals, `=`, commas) is "not equal", where sympy may occasionally prove equality.
//! Besides the fixture `geo3k_reward.json`, `tests/data/geo3k_grader_crosscheck.json` holds
//! 1,460 verdicts of the real mathruler grader that this port reproduces (13,800 were compared
//! when it was generated, all equal).

use super::exact::expressions_equal;
use super::latex_text::latex_to_text;

/// mathruler / PRM800K `grade_answer(given_answer, ground_truth)`: see the module docs.
pub fn grade_answer(given: &str, ground_truth: &str) -> bool {
    if mathd_normalize_answer(ground_truth) == mathd_normalize_answer(given) {
        return true;
    }
    let truth = normalize_answer(ground_truth);
    let given = normalize_answer(given);
    if truth == given {
        return true;
    }
    if given.is_empty() {
        return false;
    }
    let truth_elems = split_tuple(&truth);
    let given_elems = split_tuple(&given);
    if truth_elems.len() > 1
        && (truth.chars().next() != given.chars().next()
            || truth.chars().last() != given.chars().last())
    {
        return false;
    }
    if truth_elems.len() != given_elems.len() {
        return false;
    }
    for (t, g) in truth_elems.iter().zip(&given_elems) {
        let ok = if is_frac(t) && is_frac(g) {
            t == g
        } else if str_is_int(t) != str_is_int(g) {
            false
        } else {
            are_equal_under_sympy(t, g)
        };
        if !ok {
            return false;
        }
    }
    // An empty tuple on both sides leaves the reference's verdict unset (it raises); treat
    // it as not equal.
    !truth_elems.is_empty()
}

/// Python `str.strip()` (whitespace).
fn py_strip(s: &str) -> &str {
    s.trim()
}

/// The content of `^\\text\{(?P<text>.+?)\}$` (Python `re.search`, no DOTALL), if it matches.
fn text_wrapper(s: &str) -> Option<&str> {
    let body = s.strip_prefix("\\text{")?;
    let inner = if let Some(b) = body.strip_suffix("}\n") {
        b
    } else {
        body.strip_suffix('}')?
    };
    if inner.is_empty() || inner.contains('\n') {
        None
    } else {
        Some(inner)
    }
}

/// Hendrycks' MATH `normalize_answer` (mathd): strip, unwrap `\text{}`, `_strip_string`;
/// where the reference's `_strip_string` raises, the stripped input is returned (as there).
pub fn mathd_normalize_answer(answer: &str) -> String {
    let answer = py_strip(answer);
    let answer = match text_wrapper(answer) {
        Some(t) => py_strip(t),
        None => answer,
    };
    strip_string(answer).unwrap_or_else(|| answer.to_string())
}

/// `_strip_string`; `None` where the reference raises.
fn strip_string(s: &str) -> Option<String> {
    let mut s = s.replace('\n', "");
    s = s.replace("\\!", "");
    s = s.replace("\\\\", "\\");
    s = s.replace("tfrac", "frac").replace("dfrac", "frac");
    s = s.replace("\\left", "").replace("\\right", "");
    s = s.replace("^{\\circ}", "").replace("^\\circ", "");
    s = s.replace("\\$", "");
    // _remove_right_units: split on "\text{ " and keep the left part (asserts 2 parts).
    if s.contains("\\text{ ") {
        let parts: Vec<&str> = s.split("\\text{ ").collect();
        if parts.len() != 2 {
            return None;
        }
        s = parts[0].to_string();
    }
    s = s.replace("\\%", "");
    s = s.replace(" .", " 0.").replace("{.", "{0.");
    if s.is_empty() {
        return Some(s);
    }
    if s.starts_with('.') {
        s.insert(0, '0');
    }
    {
        let parts: Vec<&str> = s.split('=').collect();
        if parts.len() == 2 && parts[0].chars().count() <= 2 {
            s = parts[1].to_string();
        }
    }
    s = fix_sqrt(&s)?;
    s = s.replace(' ', "");
    s = fix_fracs(&s)?;
    if s == "0.5" {
        s = "\\frac{1}{2}".to_string();
    }
    Some(fix_a_slash_b(&s))
}

/// `_fix_sqrt`: `\sqrt3` → `\sqrt{3}`; raises (None) on a trailing `\sqrt`.
fn fix_sqrt(s: &str) -> Option<String> {
    if !s.contains("\\sqrt") {
        return Some(s.to_string());
    }
    let mut parts = s.split("\\sqrt");
    let mut out = parts.next().unwrap_or("").to_string();
    for part in parts {
        let mut chars = part.chars();
        let first = chars.next()?;
        if first != '{' {
            out.push_str("\\sqrt{");
            out.push(first);
            out.push('}');
            out.push_str(chars.as_str());
        } else {
            out.push_str("\\sqrt");
            out.push_str(part);
        }
    }
    Some(out)
}

/// `_fix_fracs`: `\frac12` → `\frac{1}{2}`, `\frac1{72}` → `\frac{1}{72}`.
fn fix_fracs(s: &str) -> Option<String> {
    let mut parts = s.split("\\frac");
    let mut out = parts.next().unwrap_or("").to_string();
    for part in parts {
        out.push_str("\\frac");
        let chars: Vec<char> = part.chars().collect();
        let first = *chars.first()?;
        if first == '{' {
            out.push_str(part);
            continue;
        }
        if chars.len() < 2 {
            return Some(s.to_string());
        }
        let (a, b) = (chars[0], chars[1]);
        let rest: String = chars[2..].iter().collect();
        if b != '{' {
            out.push_str(&format!("{{{a}}}{{{b}}}{rest}"));
        } else {
            out.push_str(&format!("{{{a}}}{b}{rest}"));
        }
    }
    Some(out)
}

/// A canonical Python `str(int(x))` rendering: `0` or `-?[1-9][0-9]*`.
fn is_canonical_int(s: &str) -> bool {
    let d = s.strip_prefix('-').unwrap_or(s);
    !d.is_empty()
        && d.bytes().all(|c| c.is_ascii_digit())
        && (d == "0" && !s.starts_with('-') || !d.starts_with('0'))
}

/// `_fix_a_slash_b`: `a/b` with canonical integers → `\frac{a}{b}`.
fn fix_a_slash_b(s: &str) -> String {
    let parts: Vec<&str> = s.split('/').collect();
    if parts.len() == 2 && is_canonical_int(parts[0]) && is_canonical_int(parts[1]) {
        format!("\\frac{{{}}}{{{}}}", parts[0], parts[1])
    } else {
        s.to_string()
    }
}

/// Python `float(s)`: surrounding whitespace, `_` between digits, inf/nan, exponents.
fn py_float(s: &str) -> Option<f64> {
    let t = s.trim();
    if t.is_empty() {
        return None;
    }
    let bytes: Vec<char> = t.chars().collect();
    for (i, &c) in bytes.iter().enumerate() {
        if c == '_' {
            let ok = i > 0
                && i + 1 < bytes.len()
                && bytes[i - 1].is_ascii_digit()
                && bytes[i + 1].is_ascii_digit();
            if !ok {
                return None;
            }
        } else if !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) {
            return None;
        }
    }
    let cleaned: String = t.chars().filter(|&c| c != '_').collect();
    let lower = cleaned.to_ascii_lowercase();
    let unsigned = lower.trim_start_matches(['+', '-']);
    if lower.len() - unsigned.len() > 1 {
        return None;
    }
    if matches!(unsigned, "inf" | "infinity" | "nan") {
        return lower.parse::<f64>().ok();
    }
    // Reject what Rust accepts but Python does not (none known) and vice versa: both take
    // digits[.digits][e[+-]digits] and .digits forms.
    if unsigned
        .chars()
        .any(|c| c.is_ascii_alphabetic() && c != 'e')
    {
        return None;
    }
    cleaned.parse::<f64>().ok()
}

/// `_is_int(float)`: |x − round(x)| ≤ 1e-7 (false for inf/nan, which raise there).
fn float_is_int(x: f64) -> bool {
    x.is_finite() && (x - x.round()).abs() <= 1e-7
}

/// Python `str(int(x))` of a finite float (exact decimal of the integer part).
fn int_string(x: f64) -> String {
    if x == 0.0 {
        return "0".to_string();
    }
    format!("{x:.0}")
}

/// `_strip_properly_formatted_commas`: `(\d)(,)(\d\d\d)($|\D)` → `\1\3\4`, repeated.
fn strip_properly_formatted_commas(s: &str) -> String {
    let mut cur: Vec<char> = s.chars().collect();
    loop {
        let mut out = Vec::with_capacity(cur.len());
        let mut i = 0;
        let mut changed = false;
        while i < cur.len() {
            let m = i + 4 < cur.len()
                && cur[i].is_ascii_digit()
                && cur[i + 1] == ','
                && cur.get(i + 2).is_some_and(|c| c.is_ascii_digit())
                && cur.get(i + 3).is_some_and(|c| c.is_ascii_digit())
                && cur.get(i + 4).is_some_and(|c| c.is_ascii_digit())
                && cur.get(i + 5).is_none_or(|c| !c.is_ascii_digit());
            if m {
                out.push(cur[i]);
                out.extend_from_slice(&cur[i + 2..i + 5]);
                // The ($|\D) char is consumed by the match: copy it and continue after it.
                if let Some(&c) = cur.get(i + 5) {
                    out.push(c);
                    i += 6;
                } else {
                    i += 5;
                }
                changed = true;
            } else {
                out.push(cur[i]);
                i += 1;
            }
        }
        if !changed {
            return out.into_iter().collect();
        }
        cur = out;
    }
}

/// `_str_is_int`.
fn str_is_int(s: &str) -> bool {
    py_float(&strip_properly_formatted_commas(s)).is_some_and(float_is_int)
}

/// `_str_to_int`: remove commas, `int(float(x))` (truncation).
fn str_to_int(s: &str) -> Option<String> {
    py_float(&s.replace(',', ""))
        .filter(|x| x.is_finite())
        .map(|x| int_string(x.trunc()))
}

/// `_is_frac`: `^-?[0-9]+.?/0*[1-9][0-9]*.?$`.
fn is_frac(s: &str) -> bool {
    use std::sync::OnceLock;
    static RE: OnceLock<regex::Regex> = OnceLock::new();
    RE.get_or_init(|| {
        regex::Regex::new(r"\A-?[0-9]+.?/0*[1-9][0-9]*.?\n?\z").expect("static regex")
    })
    .is_match(s)
}

const UNITS: [&str; 16] = [
    "degree",
    "cm",
    "centimeter",
    "meter",
    "mile",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "foot",
    "feet",
    "inch",
    "yard",
];

/// `re.sub(rf"{unit}(es)?(s)? *(\^[0-9]+)?", "", expr)`.
fn remove_unit(s: &str, unit: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find(unit) {
        out.push_str(&rest[..pos]);
        let mut r = &rest[pos + unit.len()..];
        if let Some(x) = r.strip_prefix("es") {
            r = x;
        }
        if let Some(x) = r.strip_prefix('s') {
            r = x;
        }
        r = r.trim_start_matches(' ');
        if let Some(x) = r.strip_prefix('^') {
            let digits = x.len() - x.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits > 0 {
                r = &x[digits..];
            }
        }
        rest = r;
    }
    out.push_str(rest);
    out
}

/// `re.sub(r"\^ *\\circ", "", expr)`.
fn remove_circ(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(pos) = rest.find('^') {
        let after = rest[pos + 1..].trim_start_matches(' ');
        if let Some(r) = after.strip_prefix("\\circ") {
            out.push_str(&rest[..pos]);
            rest = r;
        } else {
            out.push_str(&rest[..=pos]);
            rest = &rest[pos + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// `re.sub(",\\\\! *", "", expr)`.
fn remove_thin_space_commas(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(pos) = rest.find(",\\!") {
        out.push_str(&rest[..pos]);
        rest = rest[pos + 3..].trim_start_matches(' ');
    }
    out.push_str(rest);
    out
}

/// `re.sub("- *", "-", expr)`.
fn tighten_minus(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(pos) = rest.find('-') {
        out.push_str(&rest[..=pos]);
        rest = rest[pos + 1..].trim_start_matches(' ');
    }
    out.push_str(rest);
    out
}

/// `_inject_implicit_mixed_number`: `([0-9]) +([0-9])` → `\1+\2` (non-overlapping).
fn inject_mixed_numbers(s: &str) -> String {
    let c: Vec<char> = s.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < c.len() {
        if c[i].is_ascii_digit() {
            let mut j = i + 1;
            while j < c.len() && c[j] == ' ' {
                j += 1;
            }
            if j > i + 1 && j < c.len() && c[j].is_ascii_digit() {
                out.push(c[i]);
                out.push('+');
                out.push(c[j]);
                i = j + 1;
                continue;
            }
        }
        out.push(c[i]);
        i += 1;
    }
    out
}

/// `_parse_latex`: LaTeX → text that the expression parser reads.
fn parse_latex(s: &str) -> String {
    let s = s.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac");
    let s = s.replace("\\frac", " \\frac");
    let t = latex_to_text(&s);
    t.replace('√', "sqrt")
        .replace('π', "pi")
        .replace('∞', "inf")
        .replace('∪', "U")
        .replace(['·', '×'], "*")
        .trim()
        .to_string()
}

/// PRM800K `_normalize` (the second normalisation): see the module docs.
pub fn normalize_answer(expr: &str) -> String {
    let mut e = match text_wrapper(expr) {
        Some(t) => t.to_string(),
        None => expr.to_string(),
    };
    e = e
        .replace("\\%", "%")
        .replace("\\$", "$")
        .replace(['$', '%'], "");
    e = e.replace(" or ", " , ").replace(" and ", " , ");
    e = e
        .replace("million", "*10^6")
        .replace("billion", "*10^9")
        .replace("trillion", "*10^12");
    for unit in UNITS {
        e = remove_unit(&e, unit);
    }
    e = remove_circ(&e);
    if e.starts_with('{') && e.ends_with('}') {
        e = e[1..e.len() - 1].to_string();
    }
    e = remove_thin_space_commas(&e);
    if let Some(x) = py_float(&e).filter(|&x| float_is_int(x)) {
        e = int_string(x.round());
    }
    if e.contains('\\') {
        e = parse_latex(&e);
    }
    e = tighten_minus(&e);
    e = inject_mixed_numbers(&e);
    e = e.replace([' ', '{', '}'], "");
    e = e.to_lowercase();
    if let Some(i) = str_is_int(&e).then(|| str_to_int(&e)).flatten() {
        e = i;
    }
    e
}

/// `split_tuple`: `(a,b)` / `[a,b)` … → elements; anything else → one element.
fn split_tuple(expr: &str) -> Vec<String> {
    let e = strip_properly_formatted_commas(expr);
    if e.is_empty() {
        return Vec::new();
    }
    let c: Vec<char> = e.chars().collect();
    const TUPLE: [char; 4] = ['(', ')', '[', ']'];
    if c.len() > 2
        && TUPLE.contains(&c[0])
        && TUPLE.contains(&c[c.len() - 1])
        && c[1..c.len() - 1].iter().all(|ch| !TUPLE.contains(ch))
    {
        let inner: String = c[1..c.len() - 1].iter().collect();
        inner.split(',').map(|x| x.trim().to_string()).collect()
    } else {
        vec![e]
    }
}

/// `count_unknown_letters_in_expr`.
fn count_unknown_letters(expr: &str) -> usize {
    let e = expr.replace("sqrt", "").replace("frac", "");
    let mut letters: Vec<char> = e.chars().filter(|c| c.is_alphabetic()).collect();
    letters.sort_unstable();
    letters.dedup();
    letters.len()
}

/// `should_allow_eval`: ≤ 2 letters, no `^{` / `^(`, no `^d^` or multi-digit exponents.
fn should_allow_eval(expr: &str) -> bool {
    if count_unknown_letters(expr) > 2 || expr.contains("^{") || expr.contains("^(") {
        return false;
    }
    let c: Vec<char> = expr.chars().collect();
    for i in 0..c.len() {
        if c[i] != '^' {
            continue;
        }
        let mut j = i + 1;
        while j < c.len() && c[j].is_ascii_digit() {
            j += 1;
        }
        let digits = j - i - 1;
        if digits >= 2 || (digits >= 1 && j < c.len() && c[j] == '^') {
            return false;
        }
    }
    true
}

/// `are_equal_under_sympy`: (truth) − (given) simplifies to 0 (exact evaluator).
fn are_equal_under_sympy(truth: &str, given: &str) -> bool {
    let expr = format!("({truth})-({given})");
    should_allow_eval(&expr) && expressions_equal(truth, given)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mathd_normalisation_examples() {
        assert_eq!(mathd_normalize_answer("\\dfrac{3}{4}"), "\\frac{3}{4}");
        assert_eq!(mathd_normalize_answer("\\frac12"), "\\frac{1}{2}");
        assert_eq!(mathd_normalize_answer("\\sqrt3"), "\\sqrt{3}");
        assert_eq!(mathd_normalize_answer("x = 5"), "5");
        assert_eq!(mathd_normalize_answer("3/4"), "\\frac{3}{4}");
        assert_eq!(mathd_normalize_answer(".5"), "\\frac{1}{2}");
        // A trailing \sqrt makes the reference raise: the stripped input comes back.
        assert_eq!(mathd_normalize_answer(" 2\\sqrt "), "2\\sqrt");
    }

    #[test]
    fn second_normalisation_examples() {
        assert_eq!(normalize_answer("1,000"), "1000");
        assert_eq!(normalize_answer("5.0"), "5");
        assert_eq!(normalize_answer("30 degrees"), "30");
        assert_eq!(normalize_answer("7 3/4"), "7+3/4");
        assert_eq!(normalize_answer("\\frac{\\sqrt{3}}{2}"), "sqrt(3)/2");
        assert_eq!(normalize_answer("B"), "b");
        assert_eq!(normalize_answer("2^{-1}"), "2^-1");
    }

    #[test]
    fn guards_and_tuples() {
        assert!(!should_allow_eval("(x^{2})-(y)"));
        assert!(!should_allow_eval("(2^10)-(1024)"));
        assert!(!should_allow_eval("(abc)-(1)"));
        assert!(should_allow_eval("(2pi)-(6.28)"));
        assert_eq!(split_tuple("(1,2)"), vec!["1", "2"]);
        assert_eq!(split_tuple("(1,000)"), vec!["1000"]);
        assert!(grade_answer("(1, 2)", "(1,2)"));
        assert!(!grade_answer("[1,2]", "(1,2)"));
        assert!(is_frac("3/4") && !is_frac("0.75"));
    }
}
