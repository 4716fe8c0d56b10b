//! Outcome advantage estimators: verl's `core_algos.compute_*_outcome_advantage`.
//!
//! Every estimator starts from the response score s_b = Σ_t r\[b,t\] over **all** T positions
//! (the mask is not applied to this sum, as in verl). Group estimators group responses by
//! their prompt uid string (equal strings form a group wherever they sit in the batch).
//!
//! | estimator | A_b (per response, then `advantages[b,t] = A_b · mask[b,t]`) | verl function |
//! |---|---|---|
//! | `grpo` | (s − mean_g) / (std_g + ε), std unbiased (n−1); singleton: mean 0, std 1 | `compute_grpo_outcome_advantage` |
//! | `grpo`, no std (Dr.GRPO) | s − mean_g; singleton: s | same, `norm_adv_by_std_in_grpo=False` |
//! | `rloo` | s·n/(n−1) − mean_g·n/(n−1) (s minus the mean of the others); singleton: s | `compute_rloo_outcome_advantage` |
//! | `rloo_vectorized` | as `rloo`, but a singleton gets 0 | `compute_rloo_vectorized_outcome_advantage` |
//! | `reinforce_plus_plus_baseline` | whiten((s − mean_g)·mask)·mask; singleton mean 0 | `compute_reinforce_plus_plus_baseline_outcome_advantage` |
//! | `reinforce_plus_plus` | whiten(G)·mask with discounted returns G (below); uid unused | `compute_reinforce_plus_plus_outcome_advantage` |
//!
//! `returns` equals `advantages` except for REINFORCE++, whose `returns` are the discounted
//! returns before whitening: right to left, at a valid token G_t = r_t + γ·R and R ← G_t; at a
//! masked token G_t = 0 and R passes through unchanged.
//!
//! Batch whitening (verl `masked_whiten`): μ = Σ(x·m)/(Σm + 1e-8),
//! var = Σ((x−μ)²·m)/(Σm + 1e-8) · N/(N−1) with N = Σm, result (x − μ)/sqrt(var + 1e-8);
//! N < 2 is an error, as in verl.
//!
//! **Precision.** All statistics (group means and stds, whitening) are computed on the host in
//! f64 from the scores, then rounded once to the tensor dtype. verl's float32 run forms them
//! in float32; the two agree to float32 rounding, except that an all-equal group gives exactly
//! 0 here (verl's float32 run can leave a residue of one rounding step divided by
//! std + 1e-6 ≈ 1e-6; its float64 run gives 0). Because the statistics are exact, verl's
//! `compute_grpo_vectorized_outcome_advantage` (same mathematics, float32 scatter-adds) is
//! the same function as `grpo` here.
//!
//! **Bad input.** A non-finite score is an error ([`AlgoError::NonFiniteScore`]; verl would
//! spread the NaN over the whole group), as are an empty batch and an `index` whose length
//! differs from the batch. Groups cannot be empty (they are formed from the uids present).
//!
//! **The other registered estimators** live in one submodule each, named after verl's registry
//! entry, and take their inputs as a [`TokenRewards`] batch (plus what else they read):
//!
//! | estimator | module | verl function |
//! |---|---|---|
//! | `gae` | [`gae`] | `compute_gae_advantage_return` |
//! | `gdpo` | [`gdpo`] | `compute_gdpo_outcome_advantage` |
//! | `grpo_passk` | [`grpo_passk`] | `compute_grpo_passk_outcome_advantage` |
//! | `opo` | [`opo`] | `compute_opo_outcome_advantage` |
//! | `remax` | [`remax`] | `compute_remax_outcome_advantage` |
//! | `gpg` | [`gpg`] | `compute_gpg_outcome_advantage` |
//! | `optimal_token_baseline`, `tir_optimal_token_baseline` | [`optimal_token_baseline`] | `compute_optimal_token_baseline_advantage`, `compute_multi_turn_optimal_token_baseline_advantage` |
//!
//! They compute on the host in f64 like the estimators above.

use std::collections::HashMap;
use std::str::FromStr;

use burn::prelude::*;

use crate::error::{AlgoError, Result};
use crate::tensor_util::{check_same_shape, from_host_2d, to_host_f64};

pub mod gae;
pub mod gdpo;
pub mod gpg;
pub mod grpo_passk;
pub mod opo;
pub mod optimal_token_baseline;
pub mod remax;

/// verl's GRPO epsilon.
pub const GRPO_EPSILON: f64 = 1e-6;

/// An advantage estimator and its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AdvantageEstimator {
    /// GRPO; `norm_by_std = false` is Dr.GRPO. `epsilon` is added to the std (verl: 1e-6).
    Grpo {
        /// Divide by the group std (`norm_adv_by_std_in_grpo`).
        norm_by_std: bool,
        /// Added to the std.
        epsilon: f64,
    },
    /// RLOO (leave-one-out baseline); singleton → s.
    Rloo,
    /// verl's vectorised RLOO: singleton → 0.
    RlooVectorized,
    /// REINFORCE++ with discount `gamma`.
    ReinforcePlusPlus {
        /// Discount factor γ.
        gamma: f64,
    },
    /// REINFORCE++ with a group-mean baseline.
    ReinforcePlusPlusBaseline,
}

impl AdvantageEstimator {
    /// Plain GRPO (std-normalised, ε = 1e-6).
    pub const GRPO: Self = Self::Grpo {
        norm_by_std: true,
        epsilon: GRPO_EPSILON,
    };
    /// Dr.GRPO (no std normalisation).
    pub const DR_GRPO: Self = Self::Grpo {
        norm_by_std: false,
        epsilon: GRPO_EPSILON,
    };
}

/// Parses verl's registry names with default parameters (`grpo`, `grpo_vectorized`,
/// `rloo`, `rloo_vectorized`, `reinforce_plus_plus` (γ = 1), `reinforce_plus_plus_baseline`).
impl FromStr for AdvantageEstimator {
    type Err = AlgoError;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "grpo" | "grpo_vectorized" => Self::GRPO,
            "rloo" => Self::Rloo,
            "rloo_vectorized" => Self::RlooVectorized,
            "reinforce_plus_plus" => Self::ReinforcePlusPlus { gamma: 1.0 },
            "reinforce_plus_plus_baseline" => Self::ReinforcePlusPlusBaseline,
            _ => {
                return Err(AlgoError::Unknown {
                    kind: "advantage estimator",
                    name: s.to_string(),
                    expected: "grpo, grpo_vectorized, rloo, rloo_vectorized, reinforce_plus_plus, reinforce_plus_plus_baseline".into(),
                });
            }
        })
    }
}

/// Per-token advantages and returns, row-major `[rows, cols]` f64 (host form).
#[derive(Debug, Clone, PartialEq)]
pub struct HostAdvantages {
    /// Number of responses B.
    pub rows: usize,
    /// Padded response length T.
    pub cols: usize,
    /// `advantages[b * cols + t]`.
    pub advantages: Vec<f64>,
    /// `returns[b * cols + t]`.
    pub returns: Vec<f64>,
}

/// Tensor form of the advantages.
#[derive(Debug, Clone)]
pub struct AdvantageOutput<B: Backend> {
    /// `[B, T]` advantages.
    pub advantages: Tensor<B, 2>,
    /// `[B, T]` returns.
    pub returns: Tensor<B, 2>,
}

/// Statistics of one uid group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupStats {
    /// Number of responses.
    pub n: usize,
    /// Arithmetic mean of the scores.
    pub mean: f64,
    /// Unbiased sample std (n − 1); 0 for a singleton.
    pub std: f64,
}

/// Groups scores by uid, in order of first appearance: (uid, member rows, stats).
pub fn group_by_uid<S: AsRef<str>>(
    scores: &[f64],
    index: &[S],
) -> Result<Vec<(String, Vec<usize>, GroupStats)>> {
    check_scores(scores, index)?;
    let mut order: Vec<(String, Vec<usize>)> = Vec::new();
    let mut pos: HashMap<&str, usize> = HashMap::new();
    for (row, uid) in index.iter().enumerate() {
        let uid = uid.as_ref();
        match pos.get(uid) {
            Some(&g) => order[g].1.push(row),
            None => {
                pos.insert(uid, order.len());
                order.push((uid.to_string(), vec![row]));
            }
        }
    }
    Ok(order
        .into_iter()
        .map(|(uid, rows)| {
            let n = rows.len();
            let mean = rows.iter().map(|&r| scores[r]).sum::<f64>() / n as f64;
            let std = if n > 1 {
                let ss: f64 = rows.iter().map(|&r| (scores[r] - mean).powi(2)).sum();
                (ss / (n - 1) as f64).sqrt()
            } else {
                0.0
            };
            let stats = GroupStats { n, mean, std };
            (uid, rows, stats)
        })
        .collect())
}

fn check_scores<S: AsRef<str>>(scores: &[f64], index: &[S]) -> Result<()> {
    if scores.is_empty() {
        return Err(AlgoError::Empty("the batch has no responses".into()));
    }
    if scores.len() != index.len() {
        return Err(AlgoError::ShapeMismatch {
            what: "index (uids) vs batch".into(),
            expected: vec![scores.len()],
            got: vec![index.len()],
        });
    }
    for (row, &s) in scores.iter().enumerate() {
        if !s.is_finite() {
            return Err(AlgoError::NonFiniteScore {
                row,
                uid: index[row].as_ref().to_string(),
                value: s,
            });
        }
    }
    Ok(())
}

/// Per-response scalar advantages of the group estimators (GRPO / Dr.GRPO / RLOO and the
/// group-mean centring of REINFORCE++-baseline, before whitening). See the module table.
pub fn group_scalar_advantages<S: AsRef<str>>(
    scores: &[f64],
    index: &[S],
    estimator: AdvantageEstimator,
) -> Result<Vec<f64>> {
    let groups = group_by_uid(scores, index)?;
    let mut out = vec![0.0; scores.len()];
    for (_, rows, g) in groups {
        let n = g.n as f64;
        for r in rows {
            let s = scores[r];
            out[r] = match estimator {
                AdvantageEstimator::Grpo {
                    norm_by_std,
                    epsilon,
                } => {
                    let (mean, std) = if g.n > 1 { (g.mean, g.std) } else { (0.0, 1.0) };
                    if norm_by_std {
                        (s - mean) / (std + epsilon)
                    } else {
                        s - mean
                    }
                }
                AdvantageEstimator::Rloo if g.n == 1 => s,
                AdvantageEstimator::RlooVectorized if g.n == 1 => 0.0,
                AdvantageEstimator::Rloo | AdvantageEstimator::RlooVectorized => {
                    s * n / (n - 1.0) - g.mean * n / (n - 1.0)
                }
                AdvantageEstimator::ReinforcePlusPlusBaseline => {
                    if g.n > 1 {
                        s - g.mean
                    } else {
                        s
                    }
                }
                AdvantageEstimator::ReinforcePlusPlus { .. } => s,
            };
        }
    }
    Ok(out)
}

/// verl `masked_whiten` on host values: (x − μ)/sqrt(var + 1e-8), see the module docs.
pub fn masked_whiten(values: &[f64], mask: &[f64]) -> Result<Vec<f64>> {
    let n: f64 = mask.iter().sum();
    if n < 2.0 {
        return Err(AlgoError::TooFewTokens(n as usize));
    }
    let mean = values.iter().zip(mask).map(|(x, m)| x * m).sum::<f64>() / (n + 1e-8);
    let var = values
        .iter()
        .zip(mask)
        .map(|(x, m)| (x - mean).powi(2) * m)
        .sum::<f64>()
        / (n + 1e-8)
        * (n / (n - 1.0));
    let inv = 1.0 / (var + 1e-8).sqrt();
    Ok(values.iter().map(|x| (x - mean) * inv).collect())
}

/// Discounted returns of REINFORCE++ (right to left; masked tokens get 0 and pass R on).
pub fn discounted_returns(
    rewards: &[f64],
    mask: &[f64],
    rows: usize,
    cols: usize,
    gamma: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for b in 0..rows {
        let mut running = 0.0;
        for t in (0..cols).rev() {
            let i = b * cols + t;
            if mask[i] != 0.0 {
                running = rewards[i] + gamma * running;
                out[i] = running;
            }
        }
    }
    out
}

/// Computes advantages and returns on host data: `token_level_rewards` and `response_mask`
/// row-major `[rows, cols]`, `index` the prompt uid of each row.
pub fn compute_advantages_host<S: AsRef<str>>(
    token_level_rewards: &[f64],
    response_mask: &[f64],
    rows: usize,
    cols: usize,
    index: &[S],
    estimator: AdvantageEstimator,
) -> Result<HostAdvantages> {
    for (what, len) in [
        ("token_level_rewards", token_level_rewards.len()),
        ("response_mask", response_mask.len()),
    ] {
        if len != rows * cols {
            return Err(AlgoError::ShapeMismatch {
                what: what.into(),
                expected: vec![rows, cols],
                got: vec![len],
            });
        }
    }
    let scores: Vec<f64> = (0..rows)
        .map(|b| token_level_rewards[b * cols..(b + 1) * cols].iter().sum())
        .collect();
    if let AdvantageEstimator::ReinforcePlusPlus { gamma } = estimator {
        // uid is not used, but the scores are still checked for finiteness.
        check_scores(&scores, index)?;
        let returns = discounted_returns(token_level_rewards, response_mask, rows, cols, gamma);
        let white = masked_whiten(&returns, response_mask)?;
        let advantages = white
            .iter()
            .zip(response_mask)
            .map(|(a, m)| a * m)
            .collect();
        return Ok(HostAdvantages {
            rows,
            cols,
            advantages,
            returns,
        });
    }
    let scalar = group_scalar_advantages(&scores, index, estimator)?;
    let mut adv: Vec<f64> = (0..rows * cols)
        .map(|i| scalar[i / cols.max(1)] * response_mask[i])
        .collect();
    if estimator == AdvantageEstimator::ReinforcePlusPlusBaseline {
        adv = masked_whiten(&adv, response_mask)?
            .iter()
            .zip(response_mask)
            .map(|(a, m)| a * m)
            .collect();
    }
    Ok(HostAdvantages {
        rows,
        cols,
        returns: adv.clone(),
        advantages: adv,
    })
}

/// Tensor front end of [`compute_advantages_host`]: `token_level_rewards` and
/// `response_mask` `[B, T]`, `index` B uid strings; outputs on the same device.
pub fn compute_advantages<B: Backend, S: AsRef<str>>(
    token_level_rewards: Tensor<B, 2>,
    response_mask: Tensor<B, 2>,
    index: &[S],
    estimator: AdvantageEstimator,
) -> Result<AdvantageOutput<B>> {
    let [rows, cols] = token_level_rewards.dims();
    check_same_shape(
        "response_mask vs token_level_rewards",
        [rows, cols],
        response_mask.dims(),
    )?;
    let device = token_level_rewards.device();
    let host = compute_advantages_host(
        &to_host_f64(token_level_rewards),
        &to_host_f64(response_mask),
        rows,
        cols,
        index,
        estimator,
    )?;
    Ok(AdvantageOutput {
        advantages: from_host_2d(host.advantages, rows, cols, &device),
        returns: from_host_2d(host.returns, rows, cols, &device),
    })
}

/// The `[rows, cols]` token-level rewards and response mask of a batch (host form, row-major
/// f64), as every estimator reads them; built by [`TokenRewards::new`], which checks the sizes.
#[derive(Debug, Clone, Copy)]
pub struct TokenRewards<'a> {
    /// Number of responses B.
    pub rows: usize,
    /// Padded response length T.
    pub cols: usize,
    /// `token_level_rewards[b * cols + t]`.
    pub token_level_rewards: &'a [f64],
    /// `response_mask[b * cols + t]`: 1 for a valid token, 0 for padding.
    pub response_mask: &'a [f64],
}

impl<'a> TokenRewards<'a> {
    /// Checks that both matrices hold `rows × cols` values and that the batch is not empty.
    pub fn new(
        token_level_rewards: &'a [f64],
        response_mask: &'a [f64],
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        if rows == 0 {
            return Err(AlgoError::Empty("the batch has no responses".into()));
        }
        let batch = Self {
            rows,
            cols,
            token_level_rewards,
            response_mask,
        };
        batch.check_matrix("token_level_rewards", token_level_rewards)?;
        batch.check_matrix("response_mask", response_mask)?;
        Ok(batch)
    }

    /// Checks that another `[rows, cols]` input has the batch's size.
    pub fn check_matrix(&self, what: &str, values: &[f64]) -> Result<()> {
        if values.len() == self.rows * self.cols {
            Ok(())
        } else {
            Err(AlgoError::ShapeMismatch {
                what: what.into(),
                expected: vec![self.rows, self.cols],
                got: vec![values.len()],
            })
        }
    }

    /// Row `b` of a `[rows, cols]` matrix.
    fn row<'x>(&self, values: &'x [f64], b: usize) -> &'x [f64] {
        &values[b * self.cols..(b + 1) * self.cols]
    }

    /// The response scores s_b = Σ_t r\[b,t\] over **all** positions (verl
    /// `token_level_rewards.sum(dim=-1)`; the mask is not applied).
    pub fn scores(&self) -> Vec<f64> {
        (0..self.rows)
            .map(|b| self.row(self.token_level_rewards, b).iter().sum())
            .collect()
    }

    /// The response lengths n_b = Σ_t m\[b,t\].
    pub fn lengths(&self) -> Vec<f64> {
        (0..self.rows)
            .map(|b| self.row(self.response_mask, b).iter().sum())
            .collect()
    }

    /// An outcome estimator's result: `advantages[b,t] = a_b · m\[b,t\]`, `returns` the same
    /// (verl `scores.unsqueeze(-1) * response_mask`, returned twice).
    pub fn broadcast(&self, per_response: &[f64]) -> HostAdvantages {
        let advantages: Vec<f64> = (0..self.rows * self.cols)
            .map(|i| per_response[i / self.cols] * self.response_mask[i])
            .collect();
        HostAdvantages {
            rows: self.rows,
            cols: self.cols,
            returns: advantages.clone(),
            advantages,
        }
    }

    /// The reward-to-go of the masked rewards, G_t = Σ_{t' ≥ t} r_{t'}·m_{t'}, at every
    /// position, masked ones included (verl `(r * m).flip(-1).cumsum(-1).flip(-1)`).
    pub fn reward_to_go(&self) -> Vec<f64> {
        let mut out = vec![0.0; self.rows * self.cols];
        for b in 0..self.rows {
            let mut running = 0.0;
            for t in (0..self.cols).rev() {
                let i = b * self.cols + t;
                running += self.token_level_rewards[i] * self.response_mask[i];
                out[i] = running;
            }
        }
        out
    }
}

/// Refuses a NaN or infinite value of an input (`what`), naming its flat position.
pub(crate) fn check_finite(what: &str, values: &[f64]) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(AlgoError::NonFiniteInput {
            what: what.into(),
            index: i,
            value: values[i],
        }),
    }
}
