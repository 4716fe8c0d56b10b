//! The loss of `update.ppo` on one micro-batch (see [`super::ppo`]'s module doc):
//! `pg_loss − entropy_coeff · agg(entropy) + kl.coef · agg(kl(logπ, logπ_ref))`, from the
//! algorithm functions of `flowrl_algorithms`, on tensors of any backend.

use anyhow::Result;
use burn::prelude::{Backend, Tensor};
use flowrl_algorithms::{
    GlobalBatchInfo, KlEstimator, LossAggMode, PolicyLossConfig, PolicyLossInputs,
    PolicyLossOutput, agg_loss, compute_policy_loss, kl_penalty,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

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
