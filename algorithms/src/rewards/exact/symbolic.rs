//! The exact value of an expression: a quotient of two polynomials in π and the symbols with
//! coefficients in ℚ(√2, √3, √5, …). Each monomial is `q · √m · π^k · Π xᵢ^eᵢ` with `m`
//! square-free; those monomials are linearly independent over ℚ, so an empty numerator is an
//! exact test for 0. Size bounds (terms, powers, radicands) keep every operation small; past
//! them an operation is `None`.

use std::collections::BTreeMap;

use super::parse::{Arith, Lit, Tok};
use super::rational::{Rat, gcd};

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

/// num / den. `float` marks a value that a decimal literal took part in (a sympy `Float`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Val {
    num: Poly,
    den: Poly,
    float: bool,
}

impl Val {
    fn new(num: Poly, den: Poly, float: bool) -> Val {
        Val { num, den, float }
    }
    pub(super) fn constant(q: Rat) -> Val {
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
    pub(super) fn as_rational(&self) -> Option<Rat> {
        let n = self.num.as_rational()?;
        let d = self.den.as_rational()?;
        if d.is_zero() {
            return None;
        }
        n.mul(Rat::new(d.d, d.n)?)
    }
    pub(super) fn powi(&self, k: i128) -> Option<Val> {
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
pub(super) fn sqrt_rational(q: Rat, float: bool) -> Option<Val> {
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

impl Val {
    /// The value is exactly 0.
    pub(super) fn is_zero(&self) -> bool {
        self.num.terms.is_empty()
    }
}

/// The symbolic twin of [`super::float::Num`]: same grammar, with symbols and π.
impl Arith for Val {
    fn leaf(tok: &Tok) -> Option<Val> {
        match *tok {
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
            _ => None,
        }
    }
    fn add(&self, o: &Val) -> Option<Val> {
        Val::add(self, o)
    }
    fn neg(&self) -> Option<Val> {
        Val::neg(self)
    }
    fn mul(&self, o: &Val) -> Option<Val> {
        Val::mul(self, o)
    }
    fn div(&self, o: &Val) -> Option<Val> {
        Val::mul(self, &o.recip()?)
    }
    fn pow(&self, e: &Val) -> Option<Val> {
        Val::pow(self, e)
    }
    fn sqrt(&self) -> Option<Val> {
        sqrt_rational(self.as_rational()?, self.float)
    }
}
