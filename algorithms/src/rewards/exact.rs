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

use std::collections::BTreeMap;

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
    let mut numeric = NumParser { t: &tokens, i: 0 };
    if let Some(v) = numeric.expr().filter(|_| numeric.i == tokens.len()) {
        return match v {
            Num::Exact(q) | Num::Long(q) => q.is_zero(),
            Num::Float(x) => x == 0.0,
        };
    }
    evaluate(&src).is_some_and(|v| v.num.terms.is_empty())
}

/// A number as sympy holds it: an exact rational, a 53-bit float, or a long decimal (a
/// higher-precision float, kept exact here; a 53-bit float it meets joins it exactly).
#[derive(Debug, Clone, Copy)]
enum Num {
    Exact(Rat),
    Float(f64),
    Long(Rat),
}

/// The exact value of a finite double.
fn f64_to_rat(x: f64) -> Option<Rat> {
    if !x.is_finite() {
        return None;
    }
    if x == 0.0 {
        return Some(Rat::ZERO);
    }
    let bits = x.to_bits();
    let sign: i128 = if bits >> 63 == 0 { 1 } else { -1 };
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let frac = (bits & ((1u64 << 52) - 1)) as i128;
    let (mant, e) = if exp == 0 {
        (frac, -1074)
    } else {
        (frac | (1i128 << 52), exp - 1075)
    };
    if e >= 0 {
        if e > 70 {
            return None;
        }
        Some(Rat::int(sign * mant.checked_mul(1i128 << e)?))
    } else {
        let e = -e;
        if e > 120 {
            return None;
        }
        Rat::new(sign * mant, 1i128 << e)
    }
}

impl Num {
    fn to_f64(self) -> f64 {
        match self {
            Num::Exact(q) | Num::Long(q) => q.n as f64 / q.d as f64,
            Num::Float(x) => x,
        }
    }
    fn exact(self) -> Option<Rat> {
        match self {
            Num::Exact(q) | Num::Long(q) => Some(q),
            Num::Float(x) => f64_to_rat(x),
        }
    }
    fn combine(
        self,
        o: Num,
        exact: impl Fn(Rat, Rat) -> Option<Rat>,
        float: impl Fn(f64, f64) -> f64,
    ) -> Option<Num> {
        match (self, o) {
            (Num::Exact(a), Num::Exact(b)) => exact(a, b).map(Num::Exact),
            (Num::Long(_), _) | (_, Num::Long(_)) => {
                exact(self.exact()?, o.exact()?).map(Num::Long)
            }
            _ => Some(Num::Float(float(self.to_f64(), o.to_f64()))),
        }
    }
    fn recip(self) -> Option<Num> {
        match self {
            Num::Exact(q) | Num::Long(q) if q.is_zero() => None,
            Num::Exact(q) => Rat::new(q.d, q.n).map(Num::Exact),
            Num::Long(q) => Rat::new(q.d, q.n).map(Num::Long),
            Num::Float(x) => Some(Num::Float(1.0 / x)),
        }
    }
    fn neg(self) -> Option<Num> {
        match self {
            Num::Exact(q) => q.neg().map(Num::Exact),
            Num::Long(q) => q.neg().map(Num::Long),
            Num::Float(x) => Some(Num::Float(-x)),
        }
    }
    fn pow(self, e: Num) -> Option<Num> {
        match (self, e) {
            (Num::Exact(b), Num::Exact(e)) if e.d == 1 => {
                Val::constant(b).powi(e.n)?.as_rational().map(Num::Exact)
            }
            (Num::Exact(_), Num::Exact(_)) => None, // a symbolic root
            (Num::Long(b), Num::Exact(e)) if e.d == 1 => {
                Val::constant(b).powi(e.n)?.as_rational().map(Num::Long)
            }
            (Num::Long(_), _) | (_, Num::Long(_)) => None,
            _ => {
                let r = self.to_f64().powf(e.to_f64());
                r.is_finite().then_some(Num::Float(r))
            }
        }
    }
    fn sqrt(self) -> Option<Num> {
        match self {
            Num::Exact(q) => {
                let v = sqrt_rational(q, false)?;
                v.as_rational().map(Num::Exact) // an irrational root stays symbolic
            }
            Num::Float(x) if x >= 0.0 => Some(Num::Float(x.sqrt())),
            Num::Float(_) | Num::Long(_) => None,
        }
    }
}

/// The numeric-only twin of [`Parser`] (same grammar; no symbols, no π).
struct NumParser<'a> {
    t: &'a [Tok],
    i: usize,
}

impl NumParser<'_> {
    fn eat(&mut self, tok: &Tok) -> bool {
        if self.t.get(self.i) == Some(tok) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expr(&mut self) -> Option<Num> {
        let mut v = self.term()?;
        loop {
            if self.eat(&Tok::Plus) {
                v = v.combine(self.term()?, Rat::add, |a, b| a + b)?;
            } else if self.eat(&Tok::Minus) {
                let t = self.term()?.neg()?;
                v = v.combine(t, Rat::add, |a, b| a + b)?;
            } else {
                return Some(v);
            }
        }
    }
    fn term(&mut self) -> Option<Num> {
        let mut v = self.unary()?;
        loop {
            if self.eat(&Tok::Star) {
                v = v.combine(self.unary()?, Rat::mul, |a, b| a * b)?;
            } else if self.eat(&Tok::Slash) {
                let d = self.unary()?;
                v = match (v, d) {
                    (Num::Long(_), _) | (_, Num::Long(_)) | (Num::Exact(_), Num::Exact(_)) => {
                        v.combine(d.recip()?, Rat::mul, |a, b| a * b)?
                    }
                    _ => Num::Float(v.to_f64() / d.to_f64()),
                };
            } else if matches!(
                self.t.get(self.i),
                Some(Tok::Num(..) | Tok::Sqrt | Tok::LParen)
            ) {
                v = v.combine(self.unary()?, Rat::mul, |a, b| a * b)?;
            } else {
                return Some(v);
            }
        }
    }
    fn unary(&mut self) -> Option<Num> {
        if self.eat(&Tok::Minus) {
            return self.unary()?.neg();
        }
        if self.eat(&Tok::Plus) {
            return self.unary();
        }
        let base = self.atom()?;
        if self.eat(&Tok::Pow) {
            let e = self.unary()?;
            return base.pow(e);
        }
        Some(base)
    }
    fn atom(&mut self) -> Option<Num> {
        let tok = self.t.get(self.i)?.clone();
        self.i += 1;
        match tok {
            Tok::Num(q, Lit::Float) => Some(Num::Float(q.n as f64 / q.d as f64)),
            Tok::Num(q, Lit::Long) => Some(Num::Long(q)),
            Tok::Num(q, Lit::Int) => Some(Num::Exact(q)),
            Tok::Sqrt => {
                if !self.eat(&Tok::LParen) {
                    return None;
                }
                let v = self.expr()?;
                self.eat(&Tok::RParen).then_some(())?;
                v.sqrt()
            }
            Tok::LParen => {
                let v = self.expr()?;
                self.eat(&Tok::RParen).then_some(v)
            }
            _ => None,
        }
    }
}

/// Evaluates an expression; `None` when it is outside the language.
fn evaluate(src: &str) -> Option<Val> {
    let tokens = tokenize(src)?;
    let mut p = Parser { t: tokens, i: 0 };
    let v = p.expr()?;
    if p.i != p.t.len() {
        return None;
    }
    Some(v)
}

// ---------------------------------------------------------------- rationals

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rat {
    n: i128,
    d: i128,
}

fn gcd(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    // Only gcd(i128::MIN, 0 or i128::MIN) = 2^127 does not fit; 1 keeps the value unreduced.
    i128::try_from(a).unwrap_or(1)
}

impl Rat {
    const ZERO: Rat = Rat { n: 0, d: 1 };
    const ONE: Rat = Rat { n: 1, d: 1 };

    fn new(n: i128, d: i128) -> Option<Rat> {
        if d == 0 {
            return None;
        }
        let g = gcd(n, d).max(1);
        let (mut n, mut d) = (n / g, d / g);
        if d < 0 {
            n = n.checked_neg()?;
            d = d.checked_neg()?;
        }
        Some(Rat { n, d })
    }
    fn int(n: i128) -> Rat {
        Rat { n, d: 1 }
    }
    fn add(self, o: Rat) -> Option<Rat> {
        let g = gcd(self.d, o.d);
        let l = (self.d / g).checked_mul(o.d)?;
        let a = self.n.checked_mul(l / self.d)?;
        let b = o.n.checked_mul(l / o.d)?;
        Rat::new(a.checked_add(b)?, l)
    }
    fn mul(self, o: Rat) -> Option<Rat> {
        let g1 = gcd(self.n, o.d).max(1);
        let g2 = gcd(o.n, self.d).max(1);
        Rat::new(
            (self.n / g1).checked_mul(o.n / g2)?,
            (self.d / g2).checked_mul(o.d / g1)?,
        )
    }
    fn neg(self) -> Option<Rat> {
        Some(Rat {
            n: self.n.checked_neg()?,
            d: self.d,
        })
    }
    fn is_zero(self) -> bool {
        self.n == 0
    }
}

// ---------------------------------------------------------------- polynomials

/// `√sqrt · π^pi · Π sym^e`, `sqrt` square-free.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Mono {
    sqrt: u64,
    pi: u32,
    syms: Vec<(char, u32)>,
}

impl Mono {
    fn unit() -> Mono {
        Mono {
            sqrt: 1,
            pi: 0,
            syms: Vec::new(),
        }
    }
    fn is_unit(&self) -> bool {
        self.sqrt == 1 && self.pi == 0 && self.syms.is_empty()
    }
    /// Product; the rational factor that the square roots release is returned alongside.
    fn mul(&self, o: &Mono) -> Option<(Mono, Rat)> {
        let g = gcd(self.sqrt as i128, o.sqrt as i128) as u64;
        let sqrt = (self.sqrt / g).checked_mul(o.sqrt / g)?;
        let mut syms = self.syms.clone();
        for &(s, e) in &o.syms {
            match syms.iter_mut().find(|(x, _)| *x == s) {
                Some(entry) => entry.1 = entry.1.checked_add(e)?,
                None => syms.push((s, e)),
            }
        }
        syms.sort_unstable();
        Some((
            Mono {
                sqrt,
                pi: self.pi.checked_add(o.pi)?,
                syms,
            },
            Rat::int(g as i128),
        ))
    }
}

const MAX_TERMS: usize = 512;

#[derive(Debug, Clone, PartialEq)]
struct Poly {
    terms: BTreeMap<Mono, Rat>,
}

impl Poly {
    fn constant(q: Rat) -> Poly {
        Poly::mono(Mono::unit(), q)
    }
    fn mono(m: Mono, q: Rat) -> Poly {
        let mut terms = BTreeMap::new();
        if !q.is_zero() {
            terms.insert(m, q);
        }
        Poly { terms }
    }
    fn add_term(&mut self, m: Mono, q: Rat) -> Option<()> {
        let cur = self.terms.get(&m).copied().unwrap_or(Rat::ZERO).add(q)?;
        if cur.is_zero() {
            self.terms.remove(&m);
        } else {
            self.terms.insert(m, cur);
        }
        (self.terms.len() <= MAX_TERMS).then_some(())
    }
    fn add(&self, o: &Poly) -> Option<Poly> {
        let mut r = self.clone();
        for (m, q) in &o.terms {
            r.add_term(m.clone(), *q)?;
        }
        Some(r)
    }
    fn neg(&self) -> Option<Poly> {
        let mut terms = BTreeMap::new();
        for (m, q) in &self.terms {
            terms.insert(m.clone(), q.neg()?);
        }
        Some(Poly { terms })
    }
    fn mul(&self, o: &Poly) -> Option<Poly> {
        let mut r = Poly {
            terms: BTreeMap::new(),
        };
        for (m1, q1) in &self.terms {
            for (m2, q2) in &o.terms {
                let (m, f) = m1.mul(m2)?;
                r.add_term(m, q1.mul(*q2)?.mul(f)?)?;
            }
        }
        Some(r)
    }
    /// The value as a rational constant, if it is one.
    fn as_rational(&self) -> Option<Rat> {
        match self.terms.len() {
            0 => Some(Rat::ZERO),
            1 => {
                let (m, q) = self.terms.iter().next()?;
                m.is_unit().then_some(*q)
            }
            _ => None,
        }
    }
}

// ---------------------------------------------------------------- values

/// num / den. `float` marks a value that a decimal literal took part in (a sympy `Float`).
#[derive(Debug, Clone, PartialEq)]
struct Val {
    num: Poly,
    den: Poly,
    float: bool,
}

impl Val {
    fn new(num: Poly, den: Poly, float: bool) -> Val {
        Val { num, den, float }
    }
    fn constant(q: Rat) -> Val {
        Val::new(Poly::constant(q), Poly::constant(Rat::ONE), false)
    }
    fn mono(m: Mono) -> Val {
        Val::new(Poly::mono(m, Rat::ONE), Poly::constant(Rat::ONE), false)
    }
    fn add(&self, o: &Val) -> Option<Val> {
        let float = self.float || o.float;
        if self.den == o.den {
            return Some(Val::new(self.num.add(&o.num)?, self.den.clone(), float));
        }
        let num = self.num.mul(&o.den)?.add(&o.num.mul(&self.den)?)?;
        Some(Val::new(num, self.den.mul(&o.den)?, float))
    }
    fn neg(&self) -> Option<Val> {
        Some(Val::new(self.num.neg()?, self.den.clone(), self.float))
    }
    fn mul(&self, o: &Val) -> Option<Val> {
        let float = self.float || o.float;
        Some(Val::new(
            self.num.mul(&o.num)?,
            self.den.mul(&o.den)?,
            float,
        ))
    }
    fn recip(&self) -> Option<Val> {
        if self.num.terms.is_empty() {
            return None; // division by zero: sympy gives zoo/nan, never 0
        }
        Some(Val::new(self.den.clone(), self.num.clone(), self.float))
    }
    /// The value as a rational constant, if it is one.
    fn as_rational(&self) -> Option<Rat> {
        let n = self.num.as_rational()?;
        let d = self.den.as_rational()?;
        if d.is_zero() {
            return None;
        }
        n.mul(Rat::new(d.d, d.n)?)
    }
    fn powi(&self, k: i128) -> Option<Val> {
        if k.abs() > 64 {
            return None;
        }
        let base = if k < 0 { self.recip()? } else { self.clone() };
        let mut r = Val::constant(Rat::ONE);
        r.float = self.float;
        for _ in 0..k.abs() {
            r = r.mul(&base)?;
        }
        Some(r)
    }
    fn pow(&self, e: &Val) -> Option<Val> {
        let float = self.float || e.float;
        let q = e.as_rational()?;
        let mut r = match q.d {
            1 => self.powi(q.n)?,
            2 => sqrt_rational(self.as_rational()?, float)?.powi(q.n)?,
            _ => return None,
        };
        r.float = float;
        Some(r)
    }
}

/// Splits `n ≥ 1` into (s, m) with n = s²·m and m square-free; `None` if too large.
fn square_free(n: i128) -> Option<(i128, i128)> {
    if n <= 0 || n > 1_000_000_000_000_000_000 {
        return None;
    }
    let (mut rest, mut s, mut m) = (n, 1i128, 1i128);
    let mut p = 2i128;
    while p <= 1_000_000 && p * p <= rest {
        let mut e = 0;
        while rest % p == 0 {
            rest /= p;
            e += 1;
        }
        s *= p.pow(e / 2);
        if e % 2 == 1 {
            m *= p;
        }
        p += if p == 2 { 1 } else { 2 };
    }
    if rest > 1 {
        // All prime factors of `rest` exceed min(p, sqrt(rest)): it is a prime, a product of
        // two distinct primes, or a prime square.
        let r = (rest as f64).sqrt().round() as i128;
        let r = (r - 2..=r + 2).find(|x| *x > 0 && x * x == rest);
        match r {
            Some(r) => s = s.checked_mul(r)?,
            None => m = m.checked_mul(rest)?,
        }
    }
    Some((s, m))
}

/// √q for a rational q ≥ 0: √(a/b) = √(a·b)/b = s·√m / b. sympy evaluates the root of a
/// `Float` numerically, and such a number never equals a symbolic root: when `float` is set,
/// an irrational result is outside the language.
fn sqrt_rational(q: Rat, float: bool) -> Option<Val> {
    if q.n < 0 {
        return None;
    }
    if q.n == 0 {
        return Some(Val::constant(Rat::ZERO));
    }
    let (s, m) = square_free(q.n.checked_mul(q.d)?)?;
    if float && m != 1 {
        return None;
    }
    let coef = Rat::new(s, q.d)?;
    let mono = Mono {
        sqrt: u64::try_from(m).ok()?,
        pi: 0,
        syms: Vec::new(),
    };
    Some(Val::new(
        Poly::mono(mono, coef),
        Poly::constant(Rat::ONE),
        float,
    ))
}

// ---------------------------------------------------------------- tokens and parser

#[derive(Debug, Clone, PartialEq)]
enum Tok {
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
enum Lit {
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

fn tokenize(src: &str) -> Option<Vec<Tok>> {
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

struct Parser {
    t: Vec<Tok>,
    i: usize,
}

impl Parser {
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
    fn expr(&mut self) -> Option<Val> {
        let mut v = self.term()?;
        loop {
            if self.eat(&Tok::Plus) {
                v = v.add(&self.term()?)?;
            } else if self.eat(&Tok::Minus) {
                v = v.add(&self.term()?.neg()?)?;
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
    fn term(&mut self) -> Option<Val> {
        let mut v = self.unary()?;
        loop {
            if self.eat(&Tok::Star) {
                v = v.mul(&self.unary()?)?;
            } else if self.eat(&Tok::Slash) {
                v = v.mul(&self.unary()?.recip()?)?;
            } else if self.starts_atom() {
                v = v.mul(&self.unary()?)?; // implicit multiplication
            } else {
                return Some(v);
            }
        }
    }
    fn unary(&mut self) -> Option<Val> {
        if self.eat(&Tok::Minus) {
            return self.unary()?.neg();
        }
        if self.eat(&Tok::Plus) {
            return self.unary();
        }
        let base = self.atom()?;
        if self.eat(&Tok::Pow) {
            let e = self.unary()?;
            return base.pow(&e);
        }
        Some(base)
    }
    fn atom(&mut self) -> Option<Val> {
        let tok = self.peek()?.clone();
        self.i += 1;
        match tok {
            Tok::Num(q, lit) => {
                let mut v = Val::constant(q);
                v.float = lit != Lit::Int;
                Some(v)
            }
            Tok::Sym(s) => Some(Val::mono(Mono {
                sqrt: 1,
                pi: 0,
                syms: vec![(s, 1)],
            })),
            Tok::Pi => Some(Val::mono(Mono {
                sqrt: 1,
                pi: 1,
                syms: Vec::new(),
            })),
            Tok::Sqrt => {
                if !self.eat(&Tok::LParen) {
                    return None;
                }
                let arg = self.expr()?;
                if !self.eat(&Tok::RParen) {
                    return None;
                }
                sqrt_rational(arg.as_rational()?, arg.float)
            }
            Tok::LParen => {
                let v = self.expr()?;
                self.eat(&Tok::RParen).then_some(v)
            }
            _ => None,
        }
    }
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
