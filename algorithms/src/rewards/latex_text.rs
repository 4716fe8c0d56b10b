//! A small port of pylatexenc's `LatexNodes2Text().latex_to_text` (2.x, default settings),
//! limited to what answer strings use. The grader only needs the text that the reference's
//! expression parser then reads.
//!
//! * `{…}` groups render their content; `\frac{a}{b}` → `a/b`; `\sqrt{x}` → `√(x)`
//!   (the degree of `\sqrt[n]{x}` is dropped, as pylatexenc 2.11 does); arguments are a braced group or a single token, after
//!   optional spaces (so `\frac12` works);
//! * `\text`, `\mathrm`, `\mathbf`, `\textbf`, `\operatorname`, … render their argument;
//! * `\pi` → `π`, `\infty` → `∞`, `\cdot` → `·`, `\times` → `×`, `\cup` → `∪`, Greek letters
//!   → their Unicode letters, `\%` `\$` `\{` `\}` `\_` `\&` `\#` → the character,
//!   spacing macros (`\,` `\;` `\:` `\ ` `\quad`) → a space, `\!` → nothing, `\\` → newline;
//! * function names (`\sin`, `\log`, …) render as their name; spaces after a macro name
//!   are dropped (`\sin 30` → `sin30`);
//! * `\left`, `\right`, sizing macros and unknown macros render as nothing (pylatexenc drops
//!   unknown macros; their braced arguments then render as plain groups);
//! * `~` → a no-break space; other characters are kept as they are.

/// Renders LaTeX as plain text (see the module docs).
pub fn latex_to_text(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut pos = 0;
    let mut out = String::new();
    render_seq(&chars, &mut pos, false, &mut out);
    out
}

/// Renders until the end, or until the closing `}` of the current group when `in_group`.
fn render_seq(c: &[char], pos: &mut usize, in_group: bool, out: &mut String) {
    while *pos < c.len() {
        match c[*pos] {
            '}' if in_group => {
                *pos += 1;
                return;
            }
            '{' => {
                *pos += 1;
                render_seq(c, pos, true, out);
            }
            '\\' => render_macro(c, pos, out),
            '~' => {
                out.push('\u{a0}');
                *pos += 1;
            }
            ch => {
                out.push(ch);
                *pos += 1;
            }
        }
    }
}

/// Reads one macro argument (braced group or single token) and renders it.
fn render_arg(c: &[char], pos: &mut usize) -> String {
    while *pos < c.len() && c[*pos].is_whitespace() {
        *pos += 1;
    }
    let mut out = String::new();
    if *pos >= c.len() {
        return out;
    }
    match c[*pos] {
        '{' => {
            *pos += 1;
            render_seq(c, pos, true, &mut out);
        }
        '\\' => render_macro(c, pos, &mut out),
        ch => {
            out.push(ch);
            *pos += 1;
        }
    }
    out
}

/// Reads an optional `[...]` argument.
fn optional_arg(c: &[char], pos: &mut usize) -> Option<String> {
    let mut p = *pos;
    while p < c.len() && c[p].is_whitespace() {
        p += 1;
    }
    if p < c.len() && c[p] == '[' {
        let end = c[p..].iter().position(|&x| x == ']')? + p;
        *pos = end + 1;
        Some(latex_to_text(&c[p + 1..end].iter().collect::<String>()))
    } else {
        None
    }
}

/// Function-name macros, rendered as their name (`\sin 30` → `sin30`).
const OPERATOR_NAMES: [&str; 27] = [
    "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
    "coth", "ln", "lg", "log", "exp", "max", "min", "sup", "inf", "lim", "arg", "deg", "det",
    "dim", "gcd",
];

fn symbol(name: &str) -> Option<&'static str> {
    Some(match name {
        "pi" => "π",
        "infty" => "∞",
        "cdot" => "·",
        "times" => "×",
        "cup" => "∪",
        "cap" => "∩",
        "pm" => "±",
        "mp" => "∓",
        "div" => "÷",
        "circ" => "∘",
        "degree" => "°",
        "angle" => "∠",
        "triangle" => "△",
        "perp" => "⊥",
        "parallel" => "∥",
        "le" | "leq" => "≤",
        "ge" | "geq" => "≥",
        "neq" | "ne" => "≠",
        "approx" => "≈",
        "alpha" => "α",
        "beta" => "β",
        "gamma" => "γ",
        "delta" => "δ",
        "epsilon" => "ϵ",
        "varepsilon" => "ε",
        "zeta" => "ζ",
        "eta" => "η",
        "theta" => "θ",
        "vartheta" => "ϑ",
        "iota" => "ι",
        "kappa" => "κ",
        "lambda" => "λ",
        "mu" => "μ",
        "nu" => "ν",
        "xi" => "ξ",
        "rho" => "ρ",
        "sigma" => "σ",
        "tau" => "τ",
        "upsilon" => "υ",
        "phi" => "ϕ",
        "varphi" => "φ",
        "chi" => "χ",
        "psi" => "ψ",
        "omega" => "ω",
        "Gamma" => "Γ",
        "Delta" => "Δ",
        "Theta" => "Θ",
        "Lambda" => "Λ",
        "Sigma" => "Σ",
        "Phi" => "Φ",
        "Pi" => "Π",
        "Omega" => "Ω",
        "emptyset" => "∅",
        "dots" | "ldots" => "…",
        "cdots" => "⋯",
        "quad" | "qquad" => " ",
        _ => return None,
    })
}

fn render_macro(c: &[char], pos: &mut usize, out: &mut String) {
    *pos += 1; // the backslash
    if *pos >= c.len() {
        return;
    }
    let first = c[*pos];
    if !first.is_ascii_alphabetic() {
        *pos += 1;
        match first {
            '%' | '$' | '{' | '}' | '_' | '&' | '#' => out.push(first),
            ',' | ';' | ':' | ' ' | '>' => out.push(' '),
            '\\' => out.push('\n'),
            _ => {} // \! and unknown one-character macros
        }
        return;
    }
    let start = *pos;
    while *pos < c.len() && c[*pos].is_ascii_alphabetic() {
        *pos += 1;
    }
    let name: String = c[start..*pos].iter().collect();
    match name.as_str() {
        "frac" | "dfrac" | "tfrac" | "nicefrac" => {
            let a = render_arg(c, pos);
            let b = render_arg(c, pos);
            out.push_str(&format!("{a}/{b}"));
        }
        "sqrt" => {
            // pylatexenc 2.11 drops the degree of `\sqrt[n]{x}`.
            let _degree = optional_arg(c, pos);
            let x = render_arg(c, pos);
            out.push_str(&format!("√({x})"));
        }
        "text" | "textrm" | "textbf" | "textit" | "textsf" | "texttt" | "textup" | "textmd"
        | "textsl" | "emph" | "mbox" | "mathrm" | "mathbf" | "mathit" | "mathsf" | "mathtt"
        | "mathbb" | "mathcal" | "operatorname" | "overline" | "underline" | "widehat"
        | "overrightarrow" | "vec" | "hat" | "bar" => {
            let a = render_arg(c, pos);
            out.push_str(&a);
        }
        _ => {
            if let Some(s) = symbol(&name) {
                out.push_str(s);
            } else if OPERATOR_NAMES.contains(&name.as_str()) {
                out.push_str(&name);
            }
            // Unknown macros (and \left, \right, \big, ...) render as nothing. The spaces
            // after a macro name are not part of the output.
            while *pos < c.len() && c[*pos].is_whitespace() {
                *pos += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::latex_to_text;

    #[test]
    fn renders_answer_latex() {
        assert_eq!(latex_to_text("\\frac{1}{2}"), "1/2");
        assert_eq!(latex_to_text("\\frac12"), "1/2");
        assert_eq!(latex_to_text("2\\sqrt{3}"), "2√(3)");
        assert_eq!(latex_to_text("4 \\sqrt { 2 }"), "4 √( 2 )");
        assert_eq!(latex_to_text("\\frac{16\\sqrt{3}}{3}"), "16√(3)/3");
        assert_eq!(latex_to_text("2\\pi"), "2π");
        assert_eq!(latex_to_text("\\text{cm}^2"), "cm^2");
        assert_eq!(latex_to_text("\\left(1,2\\right)"), "(1,2)");
        assert_eq!(latex_to_text("\\sqrt[3]{2}"), "√(2)");
        assert_eq!(latex_to_text("\\sin 30"), "sin30");
        assert_eq!(latex_to_text("\\unknownmacro{5}"), "5");
    }
}
