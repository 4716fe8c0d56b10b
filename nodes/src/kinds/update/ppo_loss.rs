//! The loss of `update.ppo` on one micro-batch (see [`super::ppo`]'s module doc):
//! `pg_loss − entropy_coeff · agg(entropy) + kl.coef · agg(kl(logπ, logπ_ref))`, from the
//! algorithm functions of `flowrl_algorithms`, on tensors of any backend; and the parameters of
//! its policy loss ([`PolicyLossParams`]).

use anyhow::Result;
use burn::prelude::{Backend, Tensor};
use flowrl_algorithms::{
    ClipConfig, ClipCovConfig, GlobalBatchInfo, KlCovConfig, KlEstimator, LossAggMode,
    PolicyLossConfig, PolicyLossInputs, PolicyLossMode, PolicyLossOutput, agg_loss,
    compute_policy_loss, kl_penalty,
};
use flowrl_engine::Params;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Deserialize;

/// The loss of `update.ppo` on one micro-batch (see the module doc):
/// `pg_loss − entropy_coeff · agg(entropy) + kl.coef · agg(kl(logπ, logπ_ref))`, every `agg`
/// normalised by the mini-batch's [`GlobalBatchInfo`].
#[derive(Debug, Clone, Copy)]
pub struct PpoLoss {
    /// The policy loss and its options (`policy_loss`, `clip_ratio*`, ...).
    pub policy: PolicyLossConfig,
    /// `loss_agg_mode`: of the policy loss where it honours it, and of the KL and entropy terms.
    pub mode: LossAggMode,
    pub entropy_coeff: f64,
    /// The KL estimator and its coefficient (`None`: no KL term).
    pub kl: Option<(KlEstimator, f64)>,
}

/// [`PpoLoss::terms`]: the loss and its parts.
pub struct PpoLossTerms<B: Backend> {
    /// The micro-batch's loss (differentiable w.r.t. the log-probs and entropies).
    pub loss: Tensor<B, 1>,
    /// The policy loss and its metrics.
    pub policy: PolicyLossOutput<B>,
    /// The aggregated KL term, before its coefficient (when the loss has one).
    pub kl_loss: Option<Tensor<B, 1>>,
}

impl PpoLoss {
    /// The loss of one micro-batch from its log-probs and entropies `[b, T]`, the old and
    /// (with a KL term) the reference log-probs, the advantages and the response mask, with
    /// the algorithm functions (`compute_policy_loss`, `agg_loss`, `kl_penalty`). The KL term
    /// is added when both `kl` and `ref_log_probs` are present. `seed` seeds the policy loss's
    /// random draws (clip_cov's `randperm`); the other losses draw none.
    #[allow(clippy::too_many_arguments)]
    pub fn terms<B: Backend>(
        &self,
        log_probs: Tensor<B, 2>,
        entropy: Tensor<B, 2>,
        old_log_probs: Tensor<B, 2>,
        advantages: Tensor<B, 2>,
        mask: Tensor<B, 2>,
        ref_log_probs: Option<Tensor<B, 2>>,
        info: &GlobalBatchInfo,
        seed: u64,
    ) -> Result<PpoLossTerms<B>> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut randperm = |k: usize| {
            let mut perm: Vec<usize> = (0..k).collect();
            perm.shuffle(&mut rng);
            perm
        };
        let inputs = PolicyLossInputs {
            old_log_prob: old_log_probs,
            log_prob: log_probs.clone(),
            advantages,
            response_mask: mask.clone(),
            rollout_is_weights: None,
        };
        let policy = compute_policy_loss(&self.policy, inputs, self.mode, info, &mut randperm)?;
        let mut loss = policy.pg_loss.clone();
        if self.entropy_coeff != 0.0 {
            let ent = agg_loss(entropy, mask.clone(), self.mode, info)?;
            loss = loss - ent.mul_scalar(self.entropy_coeff);
        }
        let mut kl_loss = None;
        if let (Some((est, coef)), Some(ref_lp)) = (self.kl, ref_log_probs) {
            let kl = kl_penalty(log_probs, ref_lp, est)?;
            let term = agg_loss(kl, mask, self.mode, info)?;
            loss = loss + term.clone().mul_scalar(coef);
            kl_loss = Some(term);
        }
        Ok(PpoLossTerms {
            loss,
            policy,
            kl_loss,
        })
    }
}

/// The policy loss's parameters of `update.ppo`, flat as a graph writes them (verl's names,
/// defaults from [`PolicyLossConfig::DEFAULT`]); [`PolicyLossParams::config`] nests them as
/// the algorithms take them.
#[derive(Debug, Clone, Deserialize, Params)]
pub struct PolicyLossParams {
    /// policy loss by verl's name (actor.policy_loss.loss_mode; vanilla = PPO-clip with dual
    /// clip); the options below say which losses read them, and `flowrl validate` warns about a
    /// set option the loss ignores
    #[serde(deserialize_with = "flowrl_engine::params::by_name")]
    #[param(one_of = &PolicyLossMode::ALL.map(|(_, n)| n), default = "vanilla")]
    pub policy_loss: PolicyLossMode,
    /// ε: bounds the ratio (vanilla, gspo, clip_cov, cispo), the probability difference or
    /// binary KL (dppo_*), the log-ratio (geo_mean)
    #[param(default = ClipConfig::DEFAULT.clip_ratio, min = 0.0)]
    pub clip_ratio: f64,
    /// lower ε (default clip_ratio)
    #[param(min = 0.0)]
    pub clip_ratio_low: Option<f64>,
    /// upper ε (default clip_ratio; > low is clip-higher)
    #[param(min = 0.0)]
    pub clip_ratio_high: Option<f64>,
    /// dual-clip constant (vanilla); importance-ratio truncation (dppo_*)
    #[param(default = ClipConfig::DEFAULT.clip_ratio_c, gt = 1.0)]
    pub clip_ratio_c: f64,
    /// sapo: gate temperature where A > 0
    #[param(default = PolicyLossConfig::DEFAULT.tau_pos, gt = 0.0)]
    pub tau_pos: f64,
    /// sapo: gate temperature where A <= 0
    #[param(default = PolicyLossConfig::DEFAULT.tau_neg, gt = 0.0)]
    pub tau_neg: f64,
    /// clip_cov: at most this fraction of the tokens is detached
    #[param(default = ClipCovConfig::DEFAULT.ratio, gt = 0.0)]
    pub clip_cov_ratio: f64,
    /// clip_cov: a detached token's covariance is above this
    #[param(default = ClipCovConfig::DEFAULT.lb)]
    pub clip_cov_lb: f64,
    /// clip_cov: a detached token's covariance is below this
    #[param(default = ClipCovConfig::DEFAULT.ub)]
    pub clip_cov_ub: f64,
    /// kl_cov: fraction of the tokens (largest covariance) that get the KL penalty
    #[param(default = KlCovConfig::DEFAULT.ratio, gt = 0.0, max = 1.0)]
    pub kl_cov_ratio: f64,
    /// kl_cov: coefficient of the |log-ratio| penalty
    #[param(default = KlCovConfig::DEFAULT.coef)]
    pub ppo_kl_coef: f64,
    /// dro: β of the ½·β·δ² penalty (required by dro)
    #[param(gt = 0.0)]
    pub dro_beta: Option<f64>,
}

impl PolicyLossParams {
    /// The options as [`compute_policy_loss`] takes them.
    pub fn config(&self) -> PolicyLossConfig {
        PolicyLossConfig {
            loss_mode: self.policy_loss,
            clip: ClipConfig {
                clip_ratio: self.clip_ratio,
                clip_ratio_low: self.clip_ratio_low,
                clip_ratio_high: self.clip_ratio_high,
                clip_ratio_c: self.clip_ratio_c,
            },
            tau_pos: self.tau_pos,
            tau_neg: self.tau_neg,
            clip_cov: ClipCovConfig {
                ratio: self.clip_cov_ratio,
                lb: self.clip_cov_lb,
                ub: self.clip_cov_ub,
            },
            kl_cov: KlCovConfig {
                ratio: self.kl_cov_ratio,
                coef: self.ppo_kl_coef,
            },
            dro_beta: self.dro_beta,
        }
    }
}

#[cfg(test)]
mod tests {
    use flowrl_engine::ParamSchema;

    use super::*;

    /// Every option a policy loss reads ([`PolicyLossMode::reads`], verl's names) is one of
    /// these parameters under that name, and every parameter but `policy_loss` is read by some
    /// loss: a field renamed or added on one side only fails here, where it would otherwise
    /// silently drop update.ppo's "has no effect" warning.
    #[test]
    fn the_loss_parameters_are_the_options_the_losses_read() {
        let keys: Vec<String> = PolicyLossParams::param_specs()
            .into_iter()
            .map(|s| s.name)
            .collect();
        let mut read = std::collections::BTreeSet::new();
        for (mode, name) in PolicyLossMode::ALL {
            for key in mode.reads() {
                assert!(
                    keys.iter().any(|k| k == key),
                    "policy_loss = \"{name}\" reads `{key}`, which is not a loss parameter"
                );
                read.insert(key.to_string());
            }
        }
        for key in keys.iter().filter(|k| *k != "policy_loss") {
            assert!(read.contains(key), "no policy loss reads `{key}`");
        }
    }
}
