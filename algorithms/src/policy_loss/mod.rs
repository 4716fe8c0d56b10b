//! Policy losses: every loss of verl's registry (`core_algos.POLICY_LOSS_REGISTRY`), selected by
//! verl's name (`actor.policy_loss.loss_mode`).
//!
//! One file per loss family, each documenting its formula and the verl function it follows:
//!
//! | name | file | verl function |
//! |---|---|---|
//! | `vanilla` | [`vanilla`] | `compute_policy_loss_vanilla` (PPO-clip, dual clip) |
//! | `dppo_tv`, `dppo_kl` | [`dppo`] | `compute_policy_loss_dppo_tv` / `_dppo_kl` |
//! | `gspo` | [`gspo`] | `compute_policy_loss_gspo` (sequence-level ratio) |
//! | `sapo` | [`sapo`] | `compute_policy_loss_sapo` (soft gate) |
//! | `gpg` | [`gpg`] | `compute_policy_loss_gpg` (plain policy gradient) |
//! | `clip_cov` | [`clip_cov`] | `compute_policy_loss_clip_cov` |
//! | `kl_cov` | [`kl_cov`] | `compute_policy_loss_kl_cov` |
//! | `geo_mean` | [`geo_mean`] | `compute_policy_loss_geo_mean` (GMPO) |
//! | `dro` | [`dro`] | `compute_policy_loss_dro` |
//! | `cispo` | [`cispo`] | `compute_policy_loss_cispo` |
//!
//! verl's `bypass_mode` is not a loss but a dispatcher (rollout-correction weights, then
//! `vanilla` or REINFORCE) and is not part of the registry here.
//!
//! Common notation: δ = log_prob − old_log_prob, m = the 0/1 response mask, A = the advantage,
//! W = `rollout_is_weights` (a constant: no gradient flows through it), MM(x) = Σ(x·m)/(Σm + 1e-8)
//! (the one [`masked_mean`](crate::masked_mean)). Unless a loss says otherwise its per-token
//! loss L is multiplied by W and reduced with [`agg_loss`](fn@crate::agg_loss)`(L·W, m, mode,
//! global info)`. Where verl quietly ignores a setting (gspo and sapo always aggregate
//! `seq-mean-token-mean`; geo_mean ignores the mode and the global normalisation), so does the
//! implementation: [`PolicyLossMode::reads`] and [`PolicyLossMode::aggregation`] say what each
//! loss reads, so that a caller can tell a user which settings have no effect.

pub mod cispo;
pub mod clip_cov;
pub mod dppo;
pub mod dro;
pub mod geo_mean;
pub mod gpg;
pub mod gspo;
pub mod kl_cov;
pub mod sapo;
pub mod vanilla;

use std::fmt;
use std::str::FromStr;

use burn::prelude::*;

use crate::agg_loss::{GlobalBatchInfo, LossAggMode};
use crate::error::{AlgoError, Result};
use crate::tensor_util::check_same_shape;

pub use clip_cov::ClipCovConfig;
pub use dppo::DppoDivergence;
pub use kl_cov::KlCovConfig;

/// A registered policy loss, by verl's name (`actor.policy_loss.loss_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyLossMode {
    /// PPO-clip with clip-higher and dual clip (the default).
    Vanilla,
    /// DPPO-Binary-TV: trust region on the probability difference.
    DppoTv,
    /// DPPO-Binary-KL: trust region on the binary KL divergence.
    DppoKl,
    /// GSPO: sequence-level importance ratio.
    Gspo,
    /// SAPO: soft sigmoid gate instead of a hard clip.
    Sapo,
    /// GPG: plain policy gradient, −log_prob·A.
    Gpg,
    /// Clip-Cov: PPO-clip with a few high-covariance tokens detached.
    ClipCov,
    /// KL-Cov: a KL penalty on the highest-covariance tokens.
    KlCov,
    /// GMPO: geometric mean of the clipped token ratios per sequence.
    GeoMean,
    /// DRO: log-prob objective with a quadratic penalty on δ.
    Dro,
    /// CISPO: clipped, detached ratio as a weight of the log-prob.
    Cispo,
}

/// How a loss reduces its per-token loss to `pg_loss`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossAggregation {
    /// `agg_loss` with the configured `loss_agg_mode` and the global info.
    Configured,
    /// `agg_loss` with this mode whatever `loss_agg_mode` says, and the global info.
    Fixed(LossAggMode),
    /// A plain mean over the micro-batch's rows: neither the mode nor the global info is used.
    RowMean,
}

impl PolicyLossMode {
    /// Every loss with its verl name.
    pub const ALL: [(PolicyLossMode, &'static str); 11] = [
        (PolicyLossMode::Vanilla, "vanilla"),
        (PolicyLossMode::DppoTv, "dppo_tv"),
        (PolicyLossMode::DppoKl, "dppo_kl"),
        (PolicyLossMode::Gspo, "gspo"),
        (PolicyLossMode::Sapo, "sapo"),
        (PolicyLossMode::Gpg, "gpg"),
        (PolicyLossMode::ClipCov, "clip_cov"),
        (PolicyLossMode::KlCov, "kl_cov"),
        (PolicyLossMode::GeoMean, "geo_mean"),
        (PolicyLossMode::Dro, "dro"),
        (PolicyLossMode::Cispo, "cispo"),
    ];

    /// The verl name of the loss.
    pub fn name(self) -> &'static str {
        crate::names::name_of(&Self::ALL, self)
    }

    /// The configuration fields the loss reads (verl's names; `loss_agg_mode` and the global
    /// normalisation are described by [`Self::aggregation`] instead).
    pub fn reads(self) -> &'static [&'static str] {
        const CLIP: &[&str] = &["clip_ratio", "clip_ratio_low", "clip_ratio_high"];
        const CLIP_C: &[&str] = &[
            "clip_ratio",
            "clip_ratio_low",
            "clip_ratio_high",
            "clip_ratio_c",
        ];
        match self {
            Self::Vanilla | Self::DppoTv | Self::DppoKl => CLIP_C,
            Self::Gspo | Self::GeoMean | Self::Cispo => CLIP,
            Self::Sapo => &["tau_pos", "tau_neg"],
            Self::Gpg => &[],
            Self::ClipCov => &[
                "clip_ratio",
                "clip_ratio_low",
                "clip_ratio_high",
                "clip_cov_ratio",
                "clip_cov_lb",
                "clip_cov_ub",
            ],
            Self::KlCov => &["kl_cov_ratio", "ppo_kl_coef"],
            Self::Dro => &["dro_beta"],
        }
    }

    /// How the loss reduces its per-token loss (verl's behaviour, including what it ignores).
    pub fn aggregation(self) -> LossAggregation {
        match self {
            Self::Gspo | Self::Sapo => LossAggregation::Fixed(LossAggMode::SeqMeanTokenMean),
            Self::GeoMean => LossAggregation::RowMean,
            _ => LossAggregation::Configured,
        }
    }

    /// The metric keys the loss reports (verl's keys; a subset of `actor/pg_clipfrac`,
    /// `actor/ppo_kl`, `actor/pg_clipfrac_lower`).
    pub fn metric_keys(self) -> &'static [&'static str] {
        match self {
            Self::Gpg => &[],
            Self::ClipCov => &["actor/pg_clipfrac", "actor/ppo_kl"],
            Self::KlCov | Self::Dro => &["actor/ppo_kl"],
            _ => &[
                "actor/pg_clipfrac",
                "actor/ppo_kl",
                "actor/pg_clipfrac_lower",
            ],
        }
    }

    /// Whether the loss draws random numbers (clip_cov's subset of candidate tokens).
    pub fn draws_random_numbers(self) -> bool {
        self == Self::ClipCov
    }
}

impl fmt::Display for PolicyLossMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyLossMode {
    type Err = AlgoError;

    /// Parses a verl loss name; anything else is an [`AlgoError::Unknown`] listing the names.
    fn from_str(s: &str) -> Result<Self> {
        crate::names::named(&Self::ALL, s).ok_or_else(|| AlgoError::Unknown {
            kind: "policy loss",
            name: s.to_string(),
            expected: Self::ALL.map(|(_, n)| n).join(", "),
        })
    }
}

/// Clip parameters (verl's actor config fields of the same names). What they bound depends on
/// the loss: the ratio (vanilla, gspo, clip_cov, cispo), the probability difference or binary
/// KL (dppo), the log-ratio (geo_mean).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipConfig {
    /// Symmetric clip ratio ε, the fallback of the two below.
    pub clip_ratio: f64,
    /// Lower clip ratio ε_lo (`None` → `clip_ratio`).
    pub clip_ratio_low: Option<f64>,
    /// Upper clip ratio ε_hi (`None` → `clip_ratio`; > ε_lo is DAPO's clip-higher).
    pub clip_ratio_high: Option<f64>,
    /// Dual-clip constant c for negative advantages (vanilla; must be > 1), the truncation
    /// threshold of the importance ratio (dppo).
    pub clip_ratio_c: f64,
}

impl Default for ClipConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl ClipConfig {
    /// verl's defaults: ε = 0.2, c = 3 (also the defaults of `update.ppo`'s parameters).
    pub const DEFAULT: ClipConfig = ClipConfig {
        clip_ratio: 0.2,
        clip_ratio_low: None,
        clip_ratio_high: None,
        clip_ratio_c: 3.0,
    };

    /// (ε_lo, ε_hi) after the fallback to `clip_ratio`.
    pub fn low_high(&self) -> (f64, f64) {
        (
            self.clip_ratio_low.unwrap_or(self.clip_ratio),
            self.clip_ratio_high.unwrap_or(self.clip_ratio),
        )
    }

    /// Checks the ranges verl asserts for the dual clip (`clip_ratio_c > 1`) plus the bounds.
    pub fn validate(&self) -> Result<()> {
        if self.clip_ratio_c.is_nan() || self.clip_ratio_c <= 1.0 {
            return Err(AlgoError::InvalidParameter(format!(
                "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0, but get the value: {}",
                self.clip_ratio_c
            )));
        }
        self.validate_bounds()
    }

    /// Checks that ε_lo and ε_hi are finite and ≥ 0 (every loss that reads them).
    pub fn validate_bounds(&self) -> Result<()> {
        let (lo, hi) = self.low_high();
        for (name, v) in [("clip_ratio_low", lo), ("clip_ratio_high", hi)] {
            if !v.is_finite() || v < 0.0 {
                return Err(AlgoError::InvalidParameter(format!(
                    "{name} must be finite and >= 0, got {v}"
                )));
            }
        }
        Ok(())
    }
}

/// The whole policy-loss configuration: the loss and every option any loss reads, with verl's
/// names and defaults (actor: `clip_ratio*`, `tau_pos`, `tau_neg`; `actor.policy_loss`:
/// `clip_cov_*`, `kl_cov_ratio`, `ppo_kl_coef`, `dro_beta`). Each loss reads only the fields
/// [`PolicyLossMode::reads`] lists.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyLossConfig {
    /// The loss (verl `policy_loss.loss_mode`).
    pub loss_mode: PolicyLossMode,
    /// Clip parameters.
    pub clip: ClipConfig,
    /// SAPO's gate temperature for A > 0 (verl default 1.0).
    pub tau_pos: f64,
    /// SAPO's gate temperature for A ≤ 0 (verl default 1.05).
    pub tau_neg: f64,
    /// Clip-Cov's options.
    pub clip_cov: ClipCovConfig,
    /// KL-Cov's options.
    pub kl_cov: KlCovConfig,
    /// DRO's β (verl default null, which DRO rejects).
    pub dro_beta: Option<f64>,
}

impl Default for PolicyLossConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl PolicyLossConfig {
    /// `vanilla` with verl's defaults for every option (also the defaults of `update.ppo`'s
    /// parameters).
    pub const DEFAULT: PolicyLossConfig = PolicyLossConfig {
        loss_mode: PolicyLossMode::Vanilla,
        clip: ClipConfig::DEFAULT,
        tau_pos: 1.0,
        tau_neg: 1.05,
        clip_cov: ClipCovConfig::DEFAULT,
        kl_cov: KlCovConfig::DEFAULT,
        dro_beta: None,
    };

    /// Checks the options the chosen loss reads (verl's assertions and errors, same messages).
    pub fn validate(&self) -> Result<()> {
        match self.loss_mode {
            PolicyLossMode::Vanilla => self.clip.validate(),
            PolicyLossMode::DppoTv | PolicyLossMode::DppoKl => {
                dppo::validate_threshold(self.clip.clip_ratio_c)?;
                self.clip.validate_bounds()
            }
            PolicyLossMode::Gspo | PolicyLossMode::GeoMean | PolicyLossMode::Cispo => {
                self.clip.validate_bounds()
            }
            PolicyLossMode::Sapo => sapo::validate_taus(self.tau_pos, self.tau_neg),
            PolicyLossMode::Gpg => Ok(()),
            PolicyLossMode::ClipCov => {
                self.clip.validate_bounds()?;
                self.clip_cov.validate()
            }
            PolicyLossMode::KlCov => self.kl_cov.validate(),
            PolicyLossMode::Dro => dro::validate_beta(self.dro_beta).map(|_| ()),
        }
    }
}

/// The tensors every policy loss takes, all `[B, T]`; `response_mask` float 0/1.
#[derive(Debug, Clone)]
pub struct PolicyLossInputs<B: Backend> {
    /// Log-probs of the policy that generated the data (constant).
    pub old_log_prob: Tensor<B, 2>,
    /// Log-probs of the current policy (what the loss is differentiated against).
    pub log_prob: Tensor<B, 2>,
    /// Per-token advantages.
    pub advantages: Tensor<B, 2>,
    /// 1 for a valid token, 0 for padding.
    pub response_mask: Tensor<B, 2>,
    /// Rollout-correction importance weights (constant), when used.
    pub rollout_is_weights: Option<Tensor<B, 2>>,
}

impl<B: Backend> PolicyLossInputs<B> {
    /// Checks that every tensor has the shape of `log_prob`.
    pub fn check(&self) -> Result<()> {
        check_shapes(
            &self.old_log_prob,
            &self.log_prob,
            &self.advantages,
            &self.response_mask,
            self.rollout_is_weights.as_ref(),
        )
    }

    /// `per_token · W` (when weights are given).
    pub(crate) fn weighted(&self, per_token: Tensor<B, 2>) -> Tensor<B, 2> {
        match &self.rollout_is_weights {
            Some(w) => per_token.mul(w.clone().detach()),
            None => per_token,
        }
    }

    /// The mask, detached.
    pub(crate) fn mask(&self) -> Tensor<B, 2> {
        self.response_mask.clone().detach()
    }
}

/// Checks that every input has the shape of `log_prob`.
pub(crate) fn check_shapes<B: Backend>(
    old_log_prob: &Tensor<B, 2>,
    log_prob: &Tensor<B, 2>,
    advantages: &Tensor<B, 2>,
    response_mask: &Tensor<B, 2>,
    rollout_is_weights: Option<&Tensor<B, 2>>,
) -> Result<()> {
    let dims = log_prob.dims();
    check_same_shape("old_log_prob vs log_prob", dims, old_log_prob.dims())?;
    check_same_shape("advantages vs log_prob", dims, advantages.dims())?;
    check_same_shape("response_mask vs log_prob", dims, response_mask.dims())?;
    if let Some(w) = rollout_is_weights {
        check_same_shape("rollout_is_weights vs log_prob", dims, w.dims())?;
    }
    Ok(())
}

/// What a policy loss returns. All tensors are scalars `[1]` except `per_token_loss`; a metric
/// is `None` when the loss does not report it (verl's metrics dict has no such key).
#[derive(Debug, Clone)]
pub struct PolicyLossOutput<B: Backend> {
    /// The aggregated loss (differentiable w.r.t. `log_prob`).
    pub pg_loss: Tensor<B, 1>,
    /// Unreduced per-token loss `[B, T]` after IS weights (masked positions hold whatever the
    /// formula gives there); `None` for a loss without one (geo_mean is per sequence).
    pub per_token_loss: Option<Tensor<B, 2>>,
    /// `actor/pg_clipfrac` (detached).
    pub pg_clipfrac: Option<Tensor<B, 1>>,
    /// `actor/ppo_kl` (detached).
    pub ppo_kl: Option<Tensor<B, 1>>,
    /// `actor/pg_clipfrac_lower` (detached).
    pub pg_clipfrac_lower: Option<Tensor<B, 1>>,
    /// The tokens a covariance loss selected (clip_cov, kl_cov), row-major `[B·T]`.
    pub selected: Option<Vec<bool>>,
}

impl<B: Backend> PolicyLossOutput<B> {
    /// An output with the three usual metrics and no selection.
    pub(crate) fn new(
        pg_loss: Tensor<B, 1>,
        per_token_loss: Option<Tensor<B, 2>>,
        pg_clipfrac: Option<Tensor<B, 1>>,
        ppo_kl: Option<Tensor<B, 1>>,
        pg_clipfrac_lower: Option<Tensor<B, 1>>,
    ) -> Self {
        Self {
            pg_loss,
            per_token_loss,
            pg_clipfrac,
            ppo_kl,
            pg_clipfrac_lower,
            selected: None,
        }
    }

    /// The reported metrics with verl's keys, in [`PolicyLossMode::metric_keys`] order.
    pub fn metrics(&self) -> Vec<(&'static str, Tensor<B, 1>)> {
        [
            ("actor/pg_clipfrac", &self.pg_clipfrac),
            ("actor/ppo_kl", &self.ppo_kl),
            ("actor/pg_clipfrac_lower", &self.pg_clipfrac_lower),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
        .collect()
    }
}

/// A zero metric `[1]` on the device of `like` (verl's `torch.tensor(0.0)` placeholders).
pub(crate) fn zero_metric<B: Backend>(like: &Tensor<B, 2>) -> Tensor<B, 1> {
    Tensor::zeros([1], &like.device())
}

/// The policy loss chosen by `config.loss_mode` (verl `get_policy_loss_fn(loss_mode)(...)`).
///
/// `mode` and `info` are the configured aggregation (ignored where verl ignores them, see
/// [`PolicyLossMode::aggregation`]). `randperm(k)` must return a permutation of `0..k`; only
/// clip_cov calls it (verl draws `torch.randperm(k)` from its global RNG to pick a random
/// subset of its candidate tokens), so a caller chooses the random stream, or replays one.
pub fn compute_policy_loss<B: Backend>(
    config: &PolicyLossConfig,
    inputs: PolicyLossInputs<B>,
    mode: LossAggMode,
    info: &GlobalBatchInfo,
    randperm: &mut dyn FnMut(usize) -> Vec<usize>,
) -> Result<PolicyLossOutput<B>> {
    config.validate()?;
    inputs.check()?;
    let clip = &config.clip;
    match config.loss_mode {
        PolicyLossMode::Vanilla => vanilla::policy_loss_vanilla(
            inputs.old_log_prob,
            inputs.log_prob,
            inputs.advantages,
            inputs.response_mask,
            inputs.rollout_is_weights,
            clip,
            mode,
            info,
        ),
        PolicyLossMode::DppoTv => {
            dppo::policy_loss_dppo(inputs, clip, DppoDivergence::Tv, mode, info)
        }
        PolicyLossMode::DppoKl => {
            dppo::policy_loss_dppo(inputs, clip, DppoDivergence::Kl, mode, info)
        }
        PolicyLossMode::Gspo => gspo::policy_loss_gspo(inputs, clip, info),
        PolicyLossMode::Sapo => {
            sapo::policy_loss_sapo(inputs, config.tau_pos, config.tau_neg, info)
        }
        PolicyLossMode::Gpg => gpg::policy_loss_gpg(inputs, mode, info),
        PolicyLossMode::ClipCov => {
            clip_cov::policy_loss_clip_cov(inputs, clip, &config.clip_cov, mode, info, randperm)
        }
        PolicyLossMode::KlCov => kl_cov::policy_loss_kl_cov(inputs, &config.kl_cov, mode, info),
        PolicyLossMode::GeoMean => geo_mean::policy_loss_geo_mean(inputs, clip),
        PolicyLossMode::Dro => dro::policy_loss_dro(inputs, config.dro_beta, mode, info),
        PolicyLossMode::Cispo => cispo::policy_loss_cispo(inputs, clip, mode, info),
    }
}
