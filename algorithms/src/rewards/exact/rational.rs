//! Exact rationals over i128 with checked arithmetic: every operation that would overflow is
//! `None`, which the evaluator reads as "outside the language" (never as a wrong value).

/// `n / d` with `d > 0`, reduced by [`Rat::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rat {
    pub(super) n: i128,
    pub(super) d: i128,
}

pub(super) fn gcd(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    // Only gcd(i128::MIN, 0 or i128::MIN) = 2^127 does not fit; 1 keeps the value unreduced.
    i128::try_from(a).unwrap_or(1)
}

impl Rat {
    pub(super) const ZERO: Rat = Rat { n: 0, d: 1 };
    pub(super) const ONE: Rat = Rat { n: 1, d: 1 };

    pub(super) fn new(n: i128, d: i128) -> Option<Rat> {
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
    pub(super) fn int(n: i128) -> Rat {
        Rat { n, d: 1 }
    }
    pub(super) fn add(self, o: Rat) -> Option<Rat> {
        let g = gcd(self.d, o.d);
        let l = (self.d / g).checked_mul(o.d)?;
        let a = self.n.checked_mul(l / self.d)?;
        let b = o.n.checked_mul(l / o.d)?;
        Rat::new(a.checked_add(b)?, l)
    }
    pub(super) fn mul(self, o: Rat) -> Option<Rat> {
        let g1 = gcd(self.n, o.d).max(1);
        let g2 = gcd(o.n, self.d).max(1);
        Rat::new(
            (self.n / g1).checked_mul(o.n / g2)?,
            (self.d / g2).checked_mul(o.d / g1)?,
        )
    }
    pub(super) fn neg(self) -> Option<Rat> {
        Some(Rat {
            n: self.n.checked_neg()?,
            d: self.d,
        })
    }
    pub(super) fn is_zero(self) -> bool {
        self.n == 0
    }
}
