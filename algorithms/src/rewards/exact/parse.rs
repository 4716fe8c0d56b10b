//! The text as sympy's `parse_expr` reads it (standard transformations, implicit
//! multiplication, `split_symbols`): tokens, then one recursive-descent grammar that computes
//! with any [`Arith`] value: [`super::float::Num`] for sympy's numbers,
//! [`super::symbolic::Val`] for exact symbolic values.

use super::rational::Rat;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    /// A number and how sympy holds it.
    Num(Rat, Lit),
    Sym(char),
    Pi,
    Sqrt,
    Plus,
    Minus,
    Star,
    Slash,
    Pow,
    LParen,
    RParen,
}

/// Names that sympy's namespace resolves to functions or constants other than `pi`/`sqrt`:
/// outside the language.
const SYMPY_NAMES: &[&str] = &[
    "sin",
    "cos",
    "tan",
    "cot",
    "sec",
    "csc",
    "asin",
    "acos",
    "atan",
    "acot",
    "sinh",
    "cosh",
    "tanh",
    "coth",
    "asinh",
    "acosh",
    "atanh",
    "log",
    "ln",
    "exp",
    "cbrt",
    "root",
    "re",
    "im",
    "arg",
    "sign",
    "abs",
    "floor",
    "ceiling",
    "frac",
    "gamma",
    "beta",
    "zeta",
    "factorial",
    "binomial",
    "oo",
    "nan",
    "zoo",
    "prod",
    "lambda",
    "li",
    "ff",
    "rf",
    "det",
    "diff",
    "limit",
    "integrate",
    "series",
    "solve",
    "simplify",
    "expand",
    "factor",
    "var",
    "symbols",
    "and",
    "or",
    "not",
    "in",
    "is",
    "if",
    "else",
    "for",
    "lambda",
    "none",
    "true",
    "false",
];

const GREEK: &[&str] = &[
    "alpha", "delta", "epsilon", "eta", "theta", "iota", "kappa", "mu", "nu", "xi", "omicron",
    "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega",
];

/// How sympy holds a number literal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lit {
    /// An integer literal: an exact `Integer`.
    Int,
    /// A decimal with at most 15 significant digits: a 53-bit `Float`.
    Float,
    /// A decimal with more than 15 significant digits: a `Float` whose precision follows its
    /// digits, treated here as its exact decimal value.
    Long,
}

fn parse_number(c: &[char], i: &mut usize) -> Option<(Rat, Lit)> {
    let begin = *i;
    let mut mant: i128 = 0;
    let mut scale: i32 = 0;
    let mut digits = 0;
    while *i < c.len() && c[*i].is_ascii_digit() {
        mant = mant
            .checked_mul(10)?
            .checked_add(c[*i].to_digit(10)? as i128)?;
        digits += 1;
        *i += 1;
    }
    if *i < c.len() && c[*i] == '.' {
        *i += 1;
        while *i < c.len() && c[*i].is_ascii_digit() {
            mant = mant
                .checked_mul(10)?
                .checked_add(c[*i].to_digit(10)? as i128)?;
            scale -= 1;
            digits += 1;
            *i += 1;
        }
    }
    if digits == 0 {
        return None;
    }
    if *i < c.len() && (c[*i] == 'e' || c[*i] == 'E') {
        let mut j = *i + 1;
        let mut sign = 1;
        if j < c.len() && (c[j] == '+' || c[j] == '-') {
            sign = if c[j] == '-' { -1 } else { 1 };
            j += 1;
        }
        let start = j;
        let mut e: i32 = 0;
        while j < c.len() && c[j].is_ascii_digit() {
            e = e.checked_mul(10)?.checked_add(c[j].to_digit(10)? as i32)?;
            j += 1;
        }
        if j > start {
            scale = scale.checked_add(sign * e)?;
            *i = j;
        }
    }
    if *i < c.len() && (c[*i] == 'j' || c[*i] == 'J') {
        return None; // a Python imaginary literal
    }
    if scale.abs() > 30 {
        return None;
    }
    let is_float = c[begin..*i]
        .iter()
        .any(|&ch| ch == '.' || ch == 'e' || ch == 'E');
    let significant = if mant == 0 { 1 } else { mant.to_string().len() };
    let lit = match (is_float, significant > 15) {
        (false, _) => Lit::Int,
        (true, false) => Lit::Float,
        (true, true) => Lit::Long,
    };
    let p = 10i128.pow(scale.unsigned_abs());
    let q = if scale >= 0 {
        Rat::int(mant.checked_mul(p)?)
    } else {
        Rat::new(mant, p)?
    };
    Some((q, lit))
}

pub(super) fn tokenize(src: &str) -> Option<Vec<Tok>> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch.is_ascii_digit()
            || (ch == '.' && c.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let (q, lit) = parse_number(&c, &mut i)?;
            out.push(Tok::Num(q, lit));
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let name: String = c[start..i].iter().collect();
            name_tokens(&name, &mut out)?;
        } else {
            let tok = match ch {
                '+' => Tok::Plus,
                '-' => Tok::Minus,
                '*' if c.get(i + 1) == Some(&'*') => {
                    i += 1;
                    Tok::Pow
                }
                '*' => Tok::Star,
                '/' if c.get(i + 1) == Some(&'/') => return None,
                '/' => Tok::Slash,
                '(' => Tok::LParen,
                ')' => Tok::RParen,
                _ => return None,
            };
            out.push(tok);
            i += 1;
        }
    }
    Some(out)
}

/// sympy's `auto_symbol` + `split_symbols` for one Python name.
fn name_tokens(name: &str, out: &mut Vec<Tok>) -> Option<()> {
    match name {
        "sqrt" => out.push(Tok::Sqrt),
        "pi" => out.push(Tok::Pi),
        _ if SYMPY_NAMES.contains(&name) || name.contains('_') => return None,
        _ if GREEK.contains(&name) => return None, // one multi-letter symbol: unsupported
        _ => {
            let chars: Vec<char> = name.chars().collect();
            let mut i = 0;
            while i < chars.len() {
                if chars[i].is_ascii_digit() {
                    let mut n: i128 = 0;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        n = n
                            .checked_mul(10)?
                            .checked_add(chars[i].to_digit(10)? as i128)?;
                        i += 1;
                    }
                    out.push(Tok::Num(Rat::int(n), Lit::Int));
                } else if chars[i].is_alphabetic() {
                    out.push(Tok::Sym(chars[i]));
                    i += 1;
                } else {
                    return None;
                }
            }
        }
    }
    Some(())
}

/// What the grammar computes with. Every operation is `None` outside the value's language.
pub(super) trait Arith: Sized {
    /// The value of a number, symbol or `pi` token.
    fn leaf(tok: &Tok) -> Option<Self>;
    fn add(&self, o: &Self) -> Option<Self>;
    fn neg(&self) -> Option<Self>;
    fn mul(&self, o: &Self) -> Option<Self>;
    fn div(&self, o: &Self) -> Option<Self>;
    fn pow(&self, e: &Self) -> Option<Self>;
    fn sqrt(&self) -> Option<Self>;
}

/// The value of all of `tokens`; `None` when they are not one expression of the language.
pub(super) fn parse<V: Arith>(tokens: &[Tok]) -> Option<V> {
    let mut p = Parser { t: tokens, i: 0 };
    let v = p.expr::<V>()?;
    (p.i == tokens.len()).then_some(v)
}

struct Parser<'a> {
    t: &'a [Tok],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.t.get(self.i)
    }
    fn eat(&mut self, tok: &Tok) -> bool {
        if self.peek() == Some(tok) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expr<V: Arith>(&mut self) -> Option<V> {
        let mut v = self.term::<V>()?;
        loop {
            if self.eat(&Tok::Plus) {
                v = v.add(&self.term()?)?;
            } else if self.eat(&Tok::Minus) {
                v = v.add(&self.term::<V>()?.neg()?)?;
            } else {
                return Some(v);
            }
        }
    }
    fn starts_atom(&self) -> bool {
        matches!(
            self.peek(),
            Some(Tok::Num(..) | Tok::Sym(_) | Tok::Pi | Tok::Sqrt | Tok::LParen)
        )
    }
    fn term<V: Arith>(&mut self) -> Option<V> {
        let mut v = self.unary::<V>()?;
        loop {
            if self.eat(&Tok::Star) {
                v = v.mul(&self.unary()?)?;
            } else if self.eat(&Tok::Slash) {
                v = v.div(&self.unary()?)?;
            } else if self.starts_atom() {
                v = v.mul(&self.unary()?)?; // implicit multiplication
            } else {
                return Some(v);
            }
        }
    }
    fn unary<V: Arith>(&mut self) -> Option<V> {
        if self.eat(&Tok::Minus) {
            return self.unary::<V>()?.neg();
        }
        if self.eat(&Tok::Plus) {
            return self.unary();
        }
        let base = self.atom::<V>()?;
        if self.eat(&Tok::Pow) {
            let e = self.unary()?;
            return base.pow(&e);
        }
        Some(base)
    }
    fn atom<V: Arith>(&mut self) -> Option<V> {
        let tok = self.peek()?.clone();
        self.i += 1;
        match tok {
            Tok::Num(..) | Tok::Sym(_) | Tok::Pi => V::leaf(&tok),
            Tok::Sqrt => {
                if !self.eat(&Tok::LParen) {
                    return None;
                }
                let arg = self.expr::<V>()?;
                if !self.eat(&Tok::RParen) {
                    return None;
                }
                arg.sqrt()
            }
            Tok::LParen => {
                let v = self.expr()?;
                self.eat(&Tok::RParen).then_some(v)
            }
            _ => None,
        }
    }
}
