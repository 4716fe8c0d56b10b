//! Choosing the next token from one row of logits: greedy, or temperature + top-k + top-p sampling.
//!
//! The rule, the same on the host ([`sample`]) and on a GPU ([`crate::kernels::sampling`]):
//! with `y = x · (1/T)` (f32; greedy decoding uses T = 1), `w = exp(y − max y)`,
//! 1. top-k keeps the tokens whose `y` is at least the k-th largest (ties with it kept, as
//!    Hugging Face's `TopKLogitsWarper`, which masks only values *below* the k-th);
//! 2. top-p then keeps, among those, the tokens whose `y` is at least the largest value τ for
//!    which the tokens at or above τ hold `top_p` of the kept weight (the token that crosses
//!    the mass is kept, as `TopPLogitsWarper`; so are its ties);
//! 3. one uniform `u` in [0, 1) picks, in token-id order, the first kept token whose cumulative
//!    weight exceeds `u · Σ kept w` (inverting the cumulative distribution in id order draws
//!    from the same distribution as the sorted order, without sorting the vocabulary).
//!
//! The uniform is counter-based ([`uniform`]): a hash of the row's seed and the token's position
//! in the response, so a row's draws depend on its seed only, not on the batch it is generated
//! in, the order rows run in, or the device; 24 bits, exact in f32 and f64 alike.
//!
//! The returned log-prob is `log_softmax(logits / temperature)[token]` over the **whole**
//! vocabulary, i.e. the quantity verl's actor recomputes as the old log-prob (`logits.div_(temperature)`
//! then `logprobs_from_logits`, without the top-k/top-p truncation), so that the sampling log-probs
//! and a recomputed old log-prob agree. Greedy decoding takes the argmax (the lowest id among
//! ties) and reports its log-prob at temperature 1.

use anyhow::{Result, bail, ensure};

/// How to pick the next token.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingConfig {
    /// Argmax instead of sampling (evaluation). Temperature, top-k and top-p are ignored.
    pub greedy: bool,
    /// Softmax temperature (> 0); verl's rollout default is 1.0.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 (or ≥ vocab) disables it (verl: -1 = off).
    pub top_k: usize,
    /// Nucleus mass in (0, 1]; 1.0 disables it.
    pub top_p: f32,
}

impl Default for SamplingConfig {
    /// Plain sampling at temperature 1 (verl's rollout defaults).
    fn default() -> Self {
        Self {
            greedy: false,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        }
    }
}

impl SamplingConfig {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self {
            greedy: true,
            ..Self::default()
        }
    }

    /// Checks the ranges: temperature > 0 and finite, top_p in (0, 1].
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.temperature.is_finite() && self.temperature > 0.0,
            "temperature must be > 0, got {}",
            self.temperature
        );
        ensure!(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "top_p must be in (0, 1], got {}",
            self.top_p
        );
        Ok(())
    }

    /// `1/T` as the rule applies it (1 for greedy decoding).
    pub fn inverse_temperature(&self) -> f32 {
        if self.greedy {
            1.0
        } else {
            1.0 / self.temperature
        }
    }
}

/// Wellons' `lowbias32` integer hash (a bijection of u32 with near-ideal avalanche).
fn mix(x: u32) -> u32 {
    let mut h = x;
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846c_a68b);
    h ^= h >> 16;
    h
}

/// The uniform in [0, 1) that token `position` of the row with seed `seed` draws:
/// `mix(lo ⊕ mix(hi ⊕ mix(position ⊕ 0x9e3779b9))) >> 8`, over 2²⁴ (`lo`, `hi` the seed's
/// halves). The device kernel computes the same bits.
pub fn uniform(seed: u64, position: usize) -> f64 {
    let (lo, hi) = (seed as u32, (seed >> 32) as u32);
    let h = mix(lo ^ mix(hi ^ mix(position as u32 ^ 0x9e37_79b9)));
    (h >> 8) as f64 / 16_777_216.0
}

/// What the device kernel writes in place of a token id when the row's logits hold NaN.
pub(crate) const ERROR_NAN: f32 = -1.0;
/// ... when every token is masked (all logits −∞ or suppressed).
pub(crate) const ERROR_ALL_MASKED: f32 = -2.0;

/// The token a device-sampled id stands for, or the error it codes.
pub fn device_error(id: f32) -> Result<u32> {
    if id == ERROR_NAN {
        bail!("the logits hold NaN: the model produced non-finite values");
    }
    if id == ERROR_ALL_MASKED {
        bail!("every token has probability 0 (all logits are -inf)");
    }
    ensure!(id >= 0.0, "the device sampler returned {id}");
    Ok(id as u32)
}

/// One chosen token and its log-prob (see the module doc for which distribution).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub log_prob: f32,
}

/// Picks the next token from `logits` (one row, `vocab` values) with the uniform `u` (see the
/// module doc; `u` is ignored by greedy decoding).
///
/// Errors on an empty row or a NaN logit (a diverged model must stop the run, not sample garbage).
pub fn sample(logits: &[f32], config: &SamplingConfig, u: f64) -> Result<Sampled> {
    ensure!(!logits.is_empty(), "cannot sample from an empty logits row");
    if logits.iter().any(|x| x.is_nan()) {
        bail!("the logits hold NaN: the model produced non-finite values");
    }
    let inv_t = config.inverse_temperature();
    let scaled: Vec<f32> = logits.iter().map(|&x| x * inv_t).collect();
    let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    ensure!(
        max > f32::NEG_INFINITY,
        "every token has probability 0 (all logits are -inf)"
    );
    let weights: Vec<f32> = scaled.iter().map(|&y| (y - max).exp()).collect();
    let total: f64 = weights.iter().map(|&w| w as f64).sum();
    let token = if config.greedy {
        argmax(&scaled)
    } else {
        let keep = threshold(&scaled, &weights, config);
        draw(&scaled, &weights, keep, u)
    };
    Ok(Sampled {
        token: token as u32,
        log_prob: ((scaled[token] - max) as f64 - total.ln()) as f32,
    })
}

/// The smallest scaled logit a token may have to be kept by top-k and top-p (−∞: all).
pub fn threshold(scaled: &[f32], weights: &[f32], config: &SamplingConfig) -> f32 {
    let mut keep = f32::NEG_INFINITY;
    if config.top_k == 0 && config.top_p >= 1.0 {
        return keep;
    }
    let finite: Vec<usize> = (0..scaled.len())
        .filter(|&i| scaled[i] > f32::NEG_INFINITY)
        .collect();
    if config.top_k > 0 && config.top_k < finite.len() {
        let mut values: Vec<f32> = finite.iter().map(|&i| scaled[i]).collect();
        let k = config.top_k;
        values.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        keep = values[k - 1];
    }
    if config.top_p < 1.0 {
        let mut kept: Vec<usize> = finite.into_iter().filter(|&i| scaled[i] >= keep).collect();
        kept.sort_unstable_by(|&a, &b| scaled[b].total_cmp(&scaled[a]));
        let mass: f64 = kept.iter().map(|&i| weights[i] as f64).sum();
        let target = mass * config.top_p as f64;
        let mut cum = 0.0;
        for &i in &kept {
            cum += weights[i] as f64;
            if cum >= target {
                keep = scaled[i];
                break;
            }
        }
    }
    keep
}

/// The first token in id order whose cumulative kept weight exceeds `u · Σ kept`.
fn draw(scaled: &[f32], weights: &[f32], keep: f32, u: f64) -> usize {
    let kept = |i: usize| scaled[i] >= keep && scaled[i] > f32::NEG_INFINITY;
    let mass: f64 = (0..scaled.len())
        .filter(|&i| kept(i))
        .map(|i| weights[i] as f64)
        .sum();
    let target = u * mass;
    let mut cum = 0.0;
    let mut last = 0;
    for i in (0..scaled.len()).filter(|&i| kept(i)) {
        last = i;
        cum += weights[i] as f64;
        if target < cum {
            return i;
        }
    }
    // Rounding at the very end of the cumulative sum: the last kept token.
    last
}

/// Index of the largest value, the lowest index among ties.
fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token counts of `draws` draws of one row (seed 3, positions 0..draws).
    fn counts(logits: &[f32], config: &SamplingConfig, draws: usize) -> Vec<usize> {
        let mut c = vec![0; logits.len()];
        for position in 0..draws {
            c[sample(logits, config, uniform(3, position)).unwrap().token as usize] += 1;
        }
        c
    }

    fn log_sum_exp(x: &[f64]) -> f64 {
        let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        max + x.iter().map(|&v| (v - max).exp()).sum::<f64>().ln()
    }

    #[test]
    fn uniforms_are_uniform_and_keyed_by_seed_and_position() {
        let n = 100_000;
        let u: Vec<f64> = (0..n).map(|p| uniform(0x1234_5678_9abc_def0, p)).collect();
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        // Ten bins, chi-square with 9 degrees of freedom (critical value 33.7 at p = 1e-4).
        let mut bins = [0usize; 10];
        for &x in &u {
            bins[(x * 10.0) as usize] += 1;
        }
        let e = n as f64 / 10.0;
        let chi: f64 = bins.iter().map(|&o| (o as f64 - e).powi(2) / e).sum();
        assert!(chi < 33.7, "{bins:?}: chi-square {chi}");
        // Both seed halves and the position matter; the same key gives the same bits.
        assert_ne!(uniform(1, 0), uniform(1 << 32, 0));
        assert_ne!(uniform(1, 0), uniform(1, 1));
        assert_eq!(uniform(77, 5), uniform(77, 5));
        // Exactly representable in f32: the device computes the same value.
        assert!(u.iter().all(|&x| x as f32 as f64 == x));
    }

    #[test]
    fn greedy_takes_the_argmax_and_its_log_softmax() {
        let logits = [0.5f32, 2.0, 2.0, -1.0];
        let s = sample(&logits, &SamplingConfig::greedy(), 0.9).unwrap();
        assert_eq!(s.token, 1, "ties go to the lower id");
        let lse = logits.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        assert!((s.log_prob as f64 - (2.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn sampling_frequencies_follow_the_tempered_softmax() {
        let logits = [1.0f32, 0.0, -1.0];
        let config = SamplingConfig {
            temperature: 2.0,
            ..SamplingConfig::default()
        };
        let n = 40_000;
        let c = counts(&logits, &config, n);
        let z: f64 = logits.iter().map(|&x| (x as f64 / 2.0).exp()).sum();
        for (i, &x) in logits.iter().enumerate() {
            let p = (x as f64 / 2.0).exp() / z;
            let f = c[i] as f64 / n as f64;
            assert!((f - p).abs() < 0.01, "token {i}: freq {f} vs p {p}");
        }
    }

    #[test]
    fn log_prob_is_over_the_full_tempered_distribution() {
        let logits = [3.0f32, 1.0, 0.0, -2.0];
        let config = SamplingConfig {
            temperature: 0.5,
            top_k: 2,
            top_p: 0.9,
            greedy: false,
        };
        let s = sample(&logits, &config, 0.7).unwrap();
        let scaled: Vec<f64> = logits.iter().map(|&x| x as f64 / 0.5).collect();
        let lse = log_sum_exp(&scaled);
        assert!((s.log_prob as f64 - (scaled[s.token as usize] - lse)).abs() < 1e-6);
    }

    #[test]
    fn untruncated_log_prob_is_the_tempered_log_softmax_and_masked_tokens_never_come() {
        let logits: Vec<f32> = (0..300)
            .map(|i| match i % 7 {
                3 => f32::NEG_INFINITY,
                k => (k as f32 * 1.3).sin() * 4.0 + (i as f32) * 0.01,
            })
            .collect();
        let config = SamplingConfig {
            temperature: 0.7,
            ..SamplingConfig::default()
        };
        let scaled: Vec<f64> = logits.iter().map(|&x| x as f64 / 0.7).collect();
        let lse = log_sum_exp(&scaled);
        for position in 0..2000 {
            let s = sample(&logits, &config, uniform(5, position)).unwrap();
            let t = s.token as usize;
            assert_ne!(t % 7, 3, "drew a token whose logit is -inf");
            assert!(
                (s.log_prob as f64 - (scaled[t] - lse)).abs() < 2e-6,
                "token {t}: {} vs {}",
                s.log_prob,
                scaled[t] - lse
            );
        }
        let all_masked = [f32::NEG_INFINITY; 4];
        let err = sample(&all_masked, &config, 0.5).unwrap_err();
        assert!(err.to_string().contains("probability 0"), "{err}");
    }

    #[test]
    fn top_k_keeps_the_k_best_and_their_ties() {
        let logits = [0.0f32, 0.1, 0.2, 0.3, 0.4];
        let config = SamplingConfig {
            top_k: 2,
            ..SamplingConfig::default()
        };
        let c = counts(&logits, &config, 4000);
        assert_eq!(c[0] + c[1] + c[2], 0);
        assert!(c[3] > 1000 && c[4] > 1000);
        // A tie with the k-th largest is kept (Hugging Face masks only values below it).
        let tied = [0.3f32, 0.1, 0.3, 0.4];
        let c = counts(&tied, &config, 4000);
        assert_eq!(c[1], 0);
        assert!(c[0] > 500 && c[2] > 500 && c[3] > 500, "{c:?}");
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        // probs ≈ [0.6, 0.3, 0.1]: top_p 0.7 keeps the first two (0.6 < 0.7 ≤ 0.9).
        let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
        let config = SamplingConfig {
            top_p: 0.7,
            ..SamplingConfig::default()
        };
        let c = counts(&logits, &config, 9000);
        assert_eq!(c[2], 0);
        let f0 = c[0] as f64 / 9000.0;
        assert!((f0 - 2.0 / 3.0).abs() < 0.02, "renormalised: {f0}");
        // top_p 0.5 keeps only the first (its mass reaches it alone).
        let config = SamplingConfig {
            top_p: 0.5,
            ..SamplingConfig::default()
        };
        let c = counts(&logits, &config, 100);
        assert_eq!(c[0], 100);
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 7) % 13) as f32 * 0.3).collect();
        let config = SamplingConfig {
            top_p: 0.95,
            top_k: 20,
            temperature: 0.8,
            greedy: false,
        };
        let run = |seed: u64| {
            (0..100)
                .map(|p| sample(&logits, &config, uniform(seed, p)).unwrap().token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn nan_logits_and_bad_configs_are_errors() {
        let err = sample(&[0.0, f32::NAN], &SamplingConfig::default(), 0.5).unwrap_err();
        assert!(err.to_string().contains("NaN"));
        assert!(sample(&[], &SamplingConfig::default(), 0.5).is_err());
        let bad = SamplingConfig {
            temperature: 0.0,
            ..SamplingConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("temperature")
        );
        let bad = SamplingConfig {
            top_p: 1.5,
            ..SamplingConfig::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("top_p"));
        assert!(
            device_error(ERROR_NAN)
                .unwrap_err()
                .to_string()
                .contains("NaN")
        );
        assert!(
            device_error(ERROR_ALL_MASKED)
                .unwrap_err()
                .to_string()
                .contains("probability 0")
        );
        assert_eq!(device_error(17.0).unwrap(), 17);
    }
}
