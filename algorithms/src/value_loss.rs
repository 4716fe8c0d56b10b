//! PPO's clipped value-function loss and the critic's explained variance: verl
//! `core_algos.compute_value_loss` (itself TRL's `PPOTrainer` value loss) and the
//! `critic/vf_explained_var` of verl's `metric_utils.compute_data_metrics`.
//!
//! With predicted values V̂ (`vpreds`, the critic being trained), old values V (`values`, the
//! critic before the update, the baseline of GAE), returns R and the 0/1 response mask m:
//!
//! ```text
//! V̂_clip      = clip_by_value(V̂, V − c, V + c) = max(min(V̂, V + c), V − c)   c = cliprange_value
//! L1          = (V̂ − R)²
//! L2          = (V̂_clip − R)²
//! vf_loss     = ½ · agg_loss(max(L1, L2), m, loss_agg_mode)
//! vf_clipfrac = masked_mean(L2 > L1, m)
//! ```
//!
//! `agg_loss` is [`crate::agg_loss`](fn@crate::agg_loss) with its global normalisation ([`GlobalBatchInfo`]); verl's
//! critic calls it with the micro-batch's own normalisation (`GlobalBatchInfo::default()`).
//!
//! Explained variance, over the valid tokens (torch's unbiased `var`):
//! `1 − var(R − V) / (var(R) + 1e-5)`.

use burn::prelude::*;

use crate::agg_loss::{GlobalBatchInfo, LossAggMode, agg_loss};
use crate::error::{AlgoError, Result};
use crate::tensor_util::{check_same_shape, masked_mean};

/// What [`compute_value_loss`] returns.
pub struct ValueLossOutput<B: Backend> {
    /// `vf_loss` `[1]`, differentiable w.r.t. `vpreds`.
    pub vf_loss: Tensor<B, 1>,
    /// Fraction of valid tokens where the clipped loss is the larger one `[1]` (no gradient).
    pub vf_clipfrac: Tensor<B, 1>,
}

/// verl `core_algos.compute_value_loss(vpreds, returns, values, response_mask, cliprange_value,
/// loss_agg_mode)` (see the module doc); every tensor is `[B, T]`. `info` normalises the
/// aggregation over a mini-batch (verl's critic: the micro-batch, `GlobalBatchInfo::default()`).
pub fn compute_value_loss<B: Backend>(
    vpreds: Tensor<B, 2>,
    returns: Tensor<B, 2>,
    values: Tensor<B, 2>,
    response_mask: Tensor<B, 2>,
    cliprange_value: f64,
    loss_agg_mode: LossAggMode,
    info: &GlobalBatchInfo,
) -> Result<ValueLossOutput<B>> {
    let shape = vpreds.dims();
    check_same_shape("returns vs vpreds", shape, returns.dims())?;
    check_same_shape("values vs vpreds", shape, values.dims())?;
    check_same_shape("response_mask vs vpreds", shape, response_mask.dims())?;
    if cliprange_value.is_nan() || cliprange_value < 0.0 {
        return Err(AlgoError::InvalidParameter(format!(
            "cliprange_value must be >= 0, got {cliprange_value}"
        )));
    }
    let upper = values.clone().add_scalar(cliprange_value);
    let lower = values.sub_scalar(cliprange_value);
    let clipped = vpreds.clone().min_pair(upper).max_pair(lower);
    let losses1 = (vpreds - returns.clone()).powi_scalar(2);
    let losses2 = (clipped - returns).powi_scalar(2);
    let clip_used = losses2.clone().detach().greater(losses1.clone().detach());
    let clipped_losses = losses1.max_pair(losses2);
    let vf_loss =
        agg_loss(clipped_losses, response_mask.clone(), loss_agg_mode, info)?.mul_scalar(0.5);
    let vf_clipfrac = masked_mean(clip_used.float(), response_mask);
    Ok(ValueLossOutput {
        vf_loss,
        vf_clipfrac,
    })
}

/// verl's `critic/vf_explained_var` (`compute_data_metrics`) over the valid tokens:
/// `1 − var(R − V) / (var(R) + 1e-5)`, unbiased variances as `torch.var`. `None` with fewer
/// than two valid tokens (torch's unbiased variance of one value is NaN).
pub fn explained_variance(returns: &[f64], values: &[f64], mask: &[f64]) -> Option<f64> {
    let pairs: Vec<(f64, f64)> = returns
        .iter()
        .zip(values)
        .zip(mask)
        .filter(|(_, m)| **m != 0.0)
        .map(|((&r, &v), _)| (r, v))
        .collect();
    if pairs.len() < 2 {
        return None;
    }
    let var = |x: &mut dyn Iterator<Item = f64>| {
        let x: Vec<f64> = x.collect();
        let mean = x.iter().sum::<f64>() / x.len() as f64;
        x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (x.len() - 1) as f64
    };
    let diff = var(&mut pairs.iter().map(|(r, v)| r - v));
    let ret = var(&mut pairs.iter().map(|(r, _)| *r));
    Some(1.0 - diff / (ret + 1e-5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};

    type Ad = Autodiff<Flex>;

    fn t(v: &[f32], rows: usize) -> Tensor<Ad, 2> {
        let cols = v.len() / rows;
        Tensor::<Ad, 1>::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
            .reshape([rows, cols])
    }

    fn host(x: Tensor<Ad, 1>) -> f64 {
        x.into_scalar().elem::<f64>()
    }

    // Row 0: inside the clip range (clip inactive), above it with the clipped loss larger, and a
    // masked token holding an extreme value; row 1: below the range with the clipped loss larger,
    // above it with the unclipped loss larger.
    const VPREDS: [f32; 6] = [1.0, 2.0, 100.0, -1.0, 3.0, 0.0];
    const VALUES: [f32; 6] = [0.8, 1.0, 0.0, 0.0, 1.0, 0.0];
    const RETURNS: [f32; 6] = [1.5, 2.5, 0.0, -0.8, 0.0, 0.0];
    const MASK: [f32; 6] = [1.0, 1.0, 0.0, 1.0, 1.0, 0.0];
    const C: f64 = 0.5;

    /// Per valid token: (max(L1, L2), d max(L1, L2)/d vpred, L2 > L1), by hand.
    /// t0: V̂ 1 in [0.3, 1.3]: L1 = L2 = 0.25, grad 2(1 − 1.5) = −1.
    /// t1: V̂ 2 → clip 1.5: L1 = 0.25, L2 = 1, clipped larger: grad 0 (the clip is constant).
    /// t3: V̂ −1 → clip −0.5: L1 = 0.04, L2 = 0.09, clipped larger: grad 0.
    /// t4: V̂ 3 → clip 1.5: L1 = 9, L2 = 2.25, unclipped larger: grad 2·3 = 6.
    const HAND: [(f64, f64, bool); 4] = [
        (0.25, -1.0, false),
        (1.0, 0.0, true),
        (0.09, 0.0, true),
        (9.0, 6.0, false),
    ];

    #[test]
    fn token_mean_loss_clipfrac_and_gradient_match_the_hand_computation() {
        let vpreds = t(&VPREDS, 2).require_grad();
        let out = compute_value_loss(
            vpreds.clone(),
            t(&RETURNS, 2),
            t(&VALUES, 2),
            t(&MASK, 2),
            C,
            LossAggMode::TokenMean,
            &GlobalBatchInfo::default(),
        )
        .unwrap();
        let want_loss = 0.5 * HAND.iter().map(|h| h.0).sum::<f64>() / 4.0;
        let loss = host(out.vf_loss.clone());
        assert!((loss - want_loss).abs() < 1e-6, "{loss} vs {want_loss}");
        let frac = host(out.vf_clipfrac);
        assert!((frac - 0.5).abs() < 1e-6, "{frac}");
        let grads = out.vf_loss.backward();
        let g: Vec<f32> = vpreds.grad(&grads).unwrap().into_data().to_vec().unwrap();
        // d vf_loss / d V̂ = ½ · (1/4) · d max / d V̂ at valid tokens, 0 under the mask.
        let want = [
            0.125 * HAND[0].1,
            0.125 * HAND[1].1,
            0.0,
            0.125 * HAND[2].1,
            0.125 * HAND[3].1,
            0.0,
        ];
        for (a, b) in g.iter().zip(want) {
            assert!((*a as f64 - b).abs() < 1e-6, "{g:?} vs {want:?}");
        }
    }

    #[test]
    fn the_gradient_matches_finite_differences_away_from_the_kinks() {
        let base: Vec<f32> = vec![0.9, 1.7, 0.2, -0.6, 2.4, 0.1];
        let loss_at = |v: &[f32]| {
            let out = compute_value_loss(
                t(v, 2),
                t(&RETURNS, 2),
                t(&VALUES, 2),
                t(&MASK, 2),
                C,
                LossAggMode::SeqMeanTokenMean,
                &GlobalBatchInfo::default(),
            )
            .unwrap();
            host(out.vf_loss)
        };
        let vpreds = t(&base, 2).require_grad();
        let out = compute_value_loss(
            vpreds.clone(),
            t(&RETURNS, 2),
            t(&VALUES, 2),
            t(&MASK, 2),
            C,
            LossAggMode::SeqMeanTokenMean,
            &GlobalBatchInfo::default(),
        )
        .unwrap();
        let g: Vec<f32> = vpreds
            .grad(&out.vf_loss.backward())
            .unwrap()
            .into_data()
            .to_vec()
            .unwrap();
        let h = 1e-3f32;
        for i in 0..base.len() {
            let (mut up, mut down) = (base.clone(), base.clone());
            up[i] += h;
            down[i] -= h;
            let fd = (loss_at(&up) - loss_at(&down)) / (2.0 * h as f64);
            assert!(
                (fd - g[i] as f64).abs() < 2e-3,
                "token {i}: fd {fd} vs {}",
                g[i]
            );
        }
    }

    #[test]
    fn global_normalisation_and_bad_inputs() {
        let info = GlobalBatchInfo {
            dp_size: 1,
            batch_num_tokens: Some(8.0),
            global_batch_size: None,
            loss_scale_factor: None,
        };
        let out = compute_value_loss(
            t(&VPREDS, 2),
            t(&RETURNS, 2),
            t(&VALUES, 2),
            t(&MASK, 2),
            C,
            LossAggMode::TokenMean,
            &info,
        )
        .unwrap();
        let want = 0.5 * HAND.iter().map(|h| h.0).sum::<f64>() / 8.0;
        assert!((host(out.vf_loss) - want).abs() < 1e-6);
        let e = compute_value_loss(
            t(&VPREDS, 2),
            t(&RETURNS, 3),
            t(&VALUES, 2),
            t(&MASK, 2),
            C,
            LossAggMode::TokenMean,
            &info,
        );
        assert!(e.is_err());
        let e = compute_value_loss(
            t(&VPREDS, 2),
            t(&RETURNS, 2),
            t(&VALUES, 2),
            t(&MASK, 2),
            -0.1,
            LossAggMode::TokenMean,
            &info,
        );
        assert!(e.is_err());
    }

    #[test]
    fn explained_variance_is_one_for_a_perfect_critic_and_masks_padding() {
        let r = [1.0, 2.0, 99.0, 4.0];
        let m = [1.0, 1.0, 0.0, 1.0];
        let ev = explained_variance(&r, &r, &m).unwrap();
        assert!((ev - (1.0 - 0.0)).abs() < 1e-12);
        // V = 0: 1 − var(R)/(var(R) + 1e-5); var({1, 2, 4}) = 7/3.
        let ev = explained_variance(&r, &[0.0; 4], &m).unwrap();
        let var = 7.0 / 3.0;
        assert!((ev - (1.0 - var / (var + 1e-5))).abs() < 1e-12);
        assert_eq!(explained_variance(&r, &r, &[1.0, 0.0, 0.0, 0.0]), None);
    }
}
