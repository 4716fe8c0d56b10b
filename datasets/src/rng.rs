//! A tiny deterministic random source for data order and the synthetic task: its output is fixed
//! by this code alone (no dependence on a library's algorithm choice), so shuffles and generated
//! files stay the same across platforms and dependency upgrades.

/// SplitMix64 (Steele, Lea & Flood 2014): `s += 0x9E3779B97F4A7C15`, then
/// `z = (s ^ s>>30)·0xBF58476D1CE4E5B9`, `z = (z ^ z>>27)·0x94D049BB133111EB`, output `z ^ z>>31`.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`), by multiply-shift (Lemire): `(x · n) >> 64`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + self.below(u64::from(hi - lo) + 1) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_reference_sequence() {
        // Reference values of SplitMix64 seeded with 1234567 (from the published C code).
        let mut r = SplitMix64(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }
}
