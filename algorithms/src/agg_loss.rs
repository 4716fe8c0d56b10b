//! Reducing a per-token loss matrix `[B, T]` to a scalar: verl's `core_algos.agg_loss`.
//!
//! Let `m` be the 0/1 mask, `n_b = Σ_t m[b,t]`, `D = dp_size`:
//!
//! | mode | value |
//! |---|---|
//! | `token-mean` | Σ(L·m) / N · D, N = `batch_num_tokens` or Σm |
//! | `token-sum` | Σ(L·m) · D |
//! | `seq-mean-token-sum` | Σ_{b: n_b>0} (Σ_t L·m) / G · D, G = `global_batch_size` or #{b: n_b>0} |
//! | `seq-mean-token-mean` | Σ_{b: n_b>0} (Σ_t L·m)/(n_b + 1e-8) / G · D |
//! | `seq-mean-token-sum-norm` | `seq-mean-token-sum` / S, S = `loss_scale_factor` or T |
//!
//! `token-*` modes *select* valid entries (masked NaN/inf never contribute); `seq-mean-*` modes
//! *multiply* L·m (a masked NaN in a row with valid tokens gives NaN, as in verl); rows with no
//! valid token are selected away as a whole. With `dp_size > 1` the global normaliser is
//! required (verl's `ValueError`s, same messages). With no valid token at all and no global
//! normaliser the result is 0/0 = NaN, exactly as verl (the update node treats a non-finite
//! loss as a skipped step).

use std::fmt;
use std::str::FromStr;

use burn::prelude::*;

use crate::error::{AlgoError, Result};
use crate::tensor_util::{check_same_shape, masked_sum};

/// How a `[B, T]` loss matrix is reduced (verl's `loss_agg_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossAggMode {
    /// Mean over all valid tokens of the (global) batch.
    TokenMean,
    /// Sum over all valid tokens.
    TokenSum,
    /// Per-sequence token sum, averaged over sequences.
    SeqMeanTokenSum,
    /// Per-sequence token mean, averaged over sequences.
    SeqMeanTokenMean,
    /// `SeqMeanTokenSum` divided by a constant (Dr.GRPO's normalisation).
    SeqMeanTokenSumNorm,
}

impl LossAggMode {
    /// All modes with their verl names.
    pub const ALL: [(LossAggMode, &'static str); 5] = [
        (LossAggMode::TokenMean, "token-mean"),
        (LossAggMode::TokenSum, "token-sum"),
        (LossAggMode::SeqMeanTokenSum, "seq-mean-token-sum"),
        (LossAggMode::SeqMeanTokenMean, "seq-mean-token-mean"),
        (LossAggMode::SeqMeanTokenSumNorm, "seq-mean-token-sum-norm"),
    ];

    /// The verl name of the mode.
    pub fn name(self) -> &'static str {
        crate::names::name_of(&Self::ALL, self)
    }
}

impl fmt::Display for LossAggMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LossAggMode {
    type Err = AlgoError;

    /// Parses a verl mode name; anything else is `Invalid loss_agg_mode: <name>`.
    fn from_str(s: &str) -> Result<Self> {
        crate::names::named(&Self::ALL, s)
            .ok_or_else(|| AlgoError::InvalidLossAggMode(s.to_string()))
    }
}

/// The global normalisation inputs of `agg_loss` (verl's `global_batch_info`), so that the
/// scalars of all micro-batches (summed) and data-parallel ranks (averaged) equal the
/// mini-batch value. `Default` is the local normalisation (`dp_size = 1`, all `None`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GlobalBatchInfo {
    /// Data-parallel world size `D`.
    pub dp_size: usize,
    /// Valid tokens of the whole mini-batch summed over ranks (`token-mean`).
    pub batch_num_tokens: Option<f64>,
    /// Mini-batch prompts × samples per prompt (`seq-mean-*`).
    pub global_batch_size: Option<f64>,
    /// Divisor of `seq-mean-token-sum-norm` (default: the padded width T).
    pub loss_scale_factor: Option<f64>,
}

impl Default for GlobalBatchInfo {
    fn default() -> Self {
        Self {
            dp_size: 1,
            batch_num_tokens: None,
            global_batch_size: None,
            loss_scale_factor: None,
        }
    }
}

/// verl `core_algos.agg_loss`: reduces `loss_mat` `[B, T]` under `loss_mask` `[B, T]` (float
/// 0/1) to a scalar tensor `[1]`, differentiable w.r.t. `loss_mat`. See the module docs for the
/// formulas.
pub fn agg_loss<B: Backend>(
    loss_mat: Tensor<B, 2>,
    loss_mask: Tensor<B, 2>,
    mode: LossAggMode,
    info: &GlobalBatchInfo,
) -> Result<Tensor<B, 1>> {
    check_same_shape("loss_mask vs loss_mat", loss_mat.dims(), loss_mask.dims())?;
    let [_, t] = loss_mat.dims();
    let dp = info.dp_size as f64;
    if info.dp_size == 0 {
        return Err(AlgoError::InvalidParameter("dp_size must be >= 1".into()));
    }
    let loss = match mode {
        LossAggMode::TokenMean => {
            let sum = masked_sum(loss_mat, loss_mask.clone());
            match info.batch_num_tokens {
                Some(n) => sum.div_scalar(n).mul_scalar(dp),
                None if info.dp_size > 1 => {
                    return Err(AlgoError::MissingGlobalInfo(
                        "(global) batch_num_tokens is required when dp_size > 1",
                    ));
                }
                None => sum.div(loss_mask.sum()).mul_scalar(dp),
            }
        }
        LossAggMode::TokenSum => masked_sum(loss_mat, loss_mask).mul_scalar(dp),
        LossAggMode::SeqMeanTokenSum
        | LossAggMode::SeqMeanTokenMean
        | LossAggMode::SeqMeanTokenSumNorm => {
            if info.global_batch_size.is_none() && info.dp_size > 1 {
                return Err(AlgoError::MissingGlobalInfo(
                    "global_batch_size is required when dp_size > 1",
                ));
            }
            let tokens = loss_mask.clone().sum_dim(1); // [B, 1]
            let mut seq = loss_mat.mul(loss_mask).sum_dim(1); // [B, 1]
            if mode == LossAggMode::SeqMeanTokenMean {
                seq = seq.div(tokens.clone().add_scalar(1e-8));
            }
            let empty_row = tokens.clone().equal_elem(0.0);
            let seq_sum = seq.mask_fill(empty_row.clone(), 0.0).sum();
            let mut loss = match info.global_batch_size {
                Some(g) => seq_sum.div_scalar(g),
                None => seq_sum.div(tokens.not_equal_elem(0.0).float().sum()),
            }
            .mul_scalar(dp);
            if mode == LossAggMode::SeqMeanTokenSumNorm {
                loss = loss.div_scalar(info.loss_scale_factor.unwrap_or(t as f64));
            }
            loss
        }
    };
    Ok(loss)
}
