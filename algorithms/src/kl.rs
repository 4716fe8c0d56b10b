//! Per-token KL estimators between the current and the reference policy: verl's
//! `core_algos.kl_penalty` (Schulman's k1/k2/k3 approximations).
//!
//! With X = log π(a|s) (`logprob`) and Y = log π_ref(a|s) (`ref_logprob`):
//!
//! | name | value | d/dX |
//! |---|---|---|
//! | `kl`, `k1` | X − Y | 1 |
//! | `abs` | \|X − Y\| | sign(X − Y) (0 at equality) |
//! | `mse`, `k2` | ½(X − Y)² | X − Y |
//! | `low_var_kl`, `k3` | d = clamp(Y − X, −20, 20); clamp(eᵈ − d − 1, −10, 10) | 1 − eᵈ, 0 where a clamp is active |
//! | `<name>+` | value of `<name>` | X − Y (straight-through k2 gradient) |
//!
//! `full` needs the whole distribution and is not implemented (verl raises
//! `NotImplementedError`; here [`AlgoError::NotImplemented`]). The same function serves as a
//! differentiable loss term (`use_kl_loss`) and, on detached inputs, as a reward penalty
//! (`use_kl_in_reward`, see [`kl_reward_penalty`]).

use std::str::FromStr;

use burn::prelude::*;

use crate::error::{AlgoError, Result};
use crate::tensor_util::check_same_shape;

/// The base estimator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KlKind {
    /// k1: X − Y.
    K1,
    /// |X − Y|.
    Abs,
    /// k2: ½(X − Y)².
    K2,
    /// k3 (low-variance KL) with its clamps.
    K3,
}

/// A KL estimator: a base kind and whether its gradient is the straight-through k2 gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KlEstimator {
    /// The forward value's estimator.
    pub kind: KlKind,
    /// `true` for the `+` variants: forward of `kind`, backward of k2.
    pub straight_through: bool,
}

/// verl's `kl_loss_type` names with their estimators, written once: [`KlEstimator::NAMES`] and
/// [`KlEstimator::from_str`] both come from this list.
macro_rules! kl_names {
    ($(($name:literal, $kind:ident)),* $(,)?) => {
        /// verl's names of the base estimators.
        const BASE_NAMES: &[(&str, KlKind)] = &[$(($name, KlKind::$kind)),*];

        impl KlEstimator {
            /// Every name [`KlEstimator::from_str`] accepts: verl's `kl_loss_type` names, then
            /// their straight-through `+` variants.
            pub const NAMES: [&'static str; 2 * [$($name),*].len()] =
                [$($name),*, $(concat!($name, "+")),*];
        }
    };
}

kl_names![
    ("kl", K1),
    ("k1", K1),
    ("abs", Abs),
    ("mse", K2),
    ("k2", K2),
    ("low_var_kl", K3),
    ("k3", K3),
];

impl FromStr for KlEstimator {
    type Err = AlgoError;

    fn from_str(s: &str) -> Result<Self> {
        let (base, straight_through) = match s.strip_suffix('+') {
            Some(b) => (b, true),
            None => (s, false),
        };
        let known = BASE_NAMES.iter().find(|(name, _)| *name == base);
        let kind = match (known, base) {
            (Some(&(_, kind)), _) => kind,
            (None, "full") => {
                return Err(AlgoError::NotImplemented(format!(
                    "kl_penalty {s:?} needs the full distributions and is not implemented (verl raises NotImplementedError)"
                )));
            }
            (None, _) => {
                return Err(AlgoError::Unknown {
                    kind: "kl_penalty",
                    name: s.to_string(),
                    expected: format!(
                        "{} (each optionally with a '+' suffix)",
                        Self::NAMES[..BASE_NAMES.len()].join(", ")
                    ),
                });
            }
        };
        Ok(Self {
            kind,
            straight_through,
        })
    }
}

fn forward<B: Backend>(x: Tensor<B, 2>, y: Tensor<B, 2>, kind: KlKind) -> Tensor<B, 2> {
    match kind {
        KlKind::K1 => x.sub(y),
        KlKind::Abs => x.sub(y).abs(),
        KlKind::K2 => x.sub(y).square().mul_scalar(0.5),
        KlKind::K3 => {
            let d = y.sub(x).clamp(-20.0, 20.0);
            let v = d.clone().exp().sub(d).sub_scalar(1.0);
            v.clamp(-10.0, 10.0)
        }
    }
}

/// verl `kl_penalty(logprob, ref_logprob, kl_penalty)`: per-token estimates `[B, T]` (no mask
/// applied), differentiable w.r.t. both inputs. See the module docs for the formulas.
pub fn kl_penalty<B: Backend>(
    logprob: Tensor<B, 2>,
    ref_logprob: Tensor<B, 2>,
    estimator: KlEstimator,
) -> Result<Tensor<B, 2>> {
    check_same_shape("ref_logprob vs logprob", logprob.dims(), ref_logprob.dims())?;
    let value = forward(logprob.clone(), ref_logprob.clone(), estimator.kind);
    if !estimator.straight_through {
        return Ok(value);
    }
    // value − k2 + k2 with the first two detached: forward = value, gradient = k2's.
    let k2 = forward(logprob, ref_logprob, KlKind::K2);
    Ok(k2.clone().sub(k2.detach()).add(value.detach()))
}

/// The KL penalty used in the reward (`use_kl_in_reward`): the estimator on detached inputs,
/// masked: `kl[b,t] · mask[b,t]`. The caller subtracts `β · kl` from the token-level reward.
pub fn kl_reward_penalty<B: Backend>(
    logprob: Tensor<B, 2>,
    ref_logprob: Tensor<B, 2>,
    response_mask: Tensor<B, 2>,
    estimator: KlEstimator,
) -> Result<Tensor<B, 2>> {
    check_same_shape(
        "response_mask vs logprob",
        logprob.dims(),
        response_mask.dims(),
    )?;
    let kl = kl_penalty(logprob.detach(), ref_logprob.detach(), estimator)?;
    Ok(kl.mul(response_mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_parses_and_the_unknown_ones_are_told_the_list() {
        for name in KlEstimator::NAMES {
            let e: KlEstimator = name.parse().unwrap();
            assert_eq!(e.straight_through, name.ends_with('+'), "{name}");
        }
        let err = "k4".parse::<KlEstimator>().unwrap_err().to_string();
        assert!(
            err.contains(
                "kl, k1, abs, mse, k2, low_var_kl, k3 (each optionally with a '+' suffix)"
            ),
            "{err}"
        );
    }
}
