//! A purely numeric expression evaluated the way sympy evaluates numbers: exact rationals
//! until they meet a decimal literal, then IEEE doubles (sympy's 15-digit `Float`s), with
//! decimals of more than 15 significant digits kept exact (sympy gives them more precision).

use super::parse::{Arith, Lit, Tok};
use super::rational::Rat;
use super::symbolic::{Val, sqrt_rational};

/// A number as sympy holds it: an exact rational, a 53-bit float, or a long decimal (a
/// higher-precision float, kept exact here; a 53-bit float it meets joins it exactly).
#[derive(Debug, Clone, Copy)]
pub(super) enum Num {
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
    /// The value is exactly 0 (0.0 for a float).
    pub(super) fn is_zero(self) -> bool {
        match self {
            Num::Exact(q) | Num::Long(q) => q.is_zero(),
            Num::Float(x) => x == 0.0,
        }
    }
}

/// The numeric-only twin of [`Val`] (same grammar; no symbols, no π).
impl Arith for Num {
    fn leaf(tok: &Tok) -> Option<Num> {
        match *tok {
            Tok::Num(q, Lit::Float) => Some(Num::Float(q.n as f64 / q.d as f64)),
            Tok::Num(q, Lit::Long) => Some(Num::Long(q)),
            Tok::Num(q, Lit::Int) => Some(Num::Exact(q)),
            _ => None,
        }
    }
    fn add(&self, o: &Num) -> Option<Num> {
        self.combine(*o, Rat::add, |a, b| a + b)
    }
    fn neg(&self) -> Option<Num> {
        match *self {
            Num::Exact(q) => q.neg().map(Num::Exact),
            Num::Long(q) => q.neg().map(Num::Long),
            Num::Float(x) => Some(Num::Float(-x)),
        }
    }
    fn mul(&self, o: &Num) -> Option<Num> {
        self.combine(*o, Rat::mul, |a, b| a * b)
    }
    fn div(&self, d: &Num) -> Option<Num> {
        match (*self, *d) {
            (Num::Long(_), _) | (_, Num::Long(_)) | (Num::Exact(_), Num::Exact(_)) => {
                self.mul(&d.recip()?)
            }
            _ => Some(Num::Float(self.to_f64() / d.to_f64())),
        }
    }
    fn pow(&self, e: &Num) -> Option<Num> {
        match (*self, *e) {
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
    fn sqrt(&self) -> Option<Num> {
        match *self {
            Num::Exact(q) => {
                let v = sqrt_rational(q, false)?;
                v.as_rational().map(Num::Exact) // an irrational root stays symbolic
            }
            Num::Float(x) if x >= 0.0 => Some(Num::Float(x.sqrt())),
            Num::Float(_) | Num::Long(_) => None,
        }
    }
}
