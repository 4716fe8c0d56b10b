//! An exact evaluator for the answer expressions the grader compares (the port's stand-in for
//! `sympy.simplify(a - b) == 0`).
//!
//! Language (Python syntax after `^` → `**`, as the reference parses it with sympy's standard
//! transformations plus implicit multiplication): numbers (integers and decimals, read as
//! exact rationals, optional exponent), `+ - * /`, `**` with integer or half-integer constant
//! exponents, parentheses, `sqrt(...)` of a non-negative rational, `pi`, and single-letter
//! symbols (multi-letter names split into letters, as sympy's `split_symbols` does).
//! Juxtaposition multiplies (`2sqrt(3)`, `16/3sqrt(3)` = (16/3)·√3, `2x`).
//!
//! Values are kept as a quotient of two polynomials in π and the symbols with coefficients in
//! ℚ(√2, √3, √5, …): each monomial is `q · √m · π^k · Π xᵢ^eᵢ` with `m` square-free. Those
//! monomials are linearly independent over ℚ, so "the numerator is the zero polynomial" is an
//! exact test for "the value is 0". Anything else (other functions, nested radicals, square
//! roots of negative numbers or of symbols, irrational roots of decimals (sympy evaluates
//! those numerically, so they never equal a symbolic root), division by zero, overflow of the i128 rationals,
//! expressions that grow past a size bound) makes the comparison answer "not equal".
//!
//! The parts: [`parse`](mod@parse) tokenizes the text as sympy's parser reads it and holds the
//! one grammar; [`float`] evaluates a purely numeric expression as sympy's numbers do;
//! [`symbolic`] is the exact value (polynomials over square roots, π and the symbols);
//! [`rational`] the i128 rationals both build on.

mod float;
mod parse;
mod rational;
mod symbolic;

use float::Num;
use parse::{parse, tokenize};
use symbolic::Val;

/// `true` when `(a) - (b)` parses and evaluates to exactly 0.
///
/// A purely numeric expression that contains a decimal literal is evaluated the way sympy
/// evaluates `Float`s: exact rationals until they meet a float, then IEEE double arithmetic
/// (sympy's 15-digit `Float`s are 53-bit mpmath numbers with correct rounding), and the result
/// must be exactly 0.0 (so `0.1+0.2` ≠ `0.3`, as in the reference). Decimals of more than 15
/// significant digits get more precision in sympy; they are kept exact here (so
/// `0.3333333333333333` ≠ `1/3`). Everything else goes through the exact symbolic evaluator.
pub fn expressions_equal(a: &str, b: &str) -> bool {
    let src = format!("({a})-({b})").replace('^', "**");
    let Some(tokens) = tokenize(&src) else {
        return false;
    };
    if let Some(v) = parse::<Num>(&tokens) {
        return v.is_zero();
    }
    parse::<Val>(&tokens).is_some_and(|v| v.is_zero())
}

#[cfg(test)]
mod tests {
    use super::expressions_equal as eq;

    #[test]
    fn exact_equalities() {
        assert!(eq("sqrt(12)", "2sqrt(3)"));
        assert!(eq("16sqrt(3)/3", "16/3sqrt(3)"));
        assert!(eq("0.25", "1/4"));
        assert!(eq("8.5", "17/2"));
        assert!(eq("0.5", "2**-1"));
        assert!(eq("7.75", "7+3/4"));
        assert!(eq("x+1", "1+x"));
        assert!(eq("1/(sqrt(2))", "sqrt(2)/2"));
        assert!(eq("(x**2-1)/(x-1)", "x+1"));
    }

    #[test]
    fn exact_inequalities() {
        assert!(!eq("2sqrt(3)", "3.46"));
        assert!(!eq("2pi", "6.28"));
        assert!(!eq("x", "y"));
        assert!(!eq("1/0", "1/0"));
        assert!(!eq("sin(x)", "sin(x)"));
        assert!(!eq("sqrt(-1)", "sqrt(-1)"));
        assert!(!eq("1,2", "1,2"));
        // sympy evaluates the root of a Float numerically: never equal to a symbolic root.
        assert!(!eq("sqrt(0.5)", "sqrt(2)/2"));
        assert!(eq("sqrt(0.25)", "1/2"));
        assert!(eq("0.5sqrt(2)", "sqrt(2)/2"));
        // Decimal arithmetic follows sympy's Floats.
        assert!(!eq("0.1+0.2", "0.3"));
        assert!(eq("7.75", "7+3/4"));
        assert!(!eq("0.3333333333333333", "1/3"));
        assert!(!eq("sqrt(2)", "1.4142135623730951"));
        assert!(eq("0.25+0.25", "1/2"));
    }
}
