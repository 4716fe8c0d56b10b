//! The forward passes over the rollouts before the advantage: old-policy log-probs
//! (`[nodes.old]`, with Σπ² for the optimal token baseline), reference log-probs for a KL loss
//! (`[nodes.ref]`) and the critic's values for GAE (`[nodes.values]`), each with verl's
//! micro-batch keys of its worker.

use super::mapper::{Mapper, t_str};
use super::{ACTOR, Plan, REF, ROLLOUT, Section};

/// `[nodes.old]`, `[nodes.ref]` and `[nodes.values]` as the plan has them, reading `rollouts`.
pub(super) fn scoring(m: &mut Mapper, p: &Plan, rollouts: &str) {
    let mut old = log_probs(m, p, "old", "policy", ROLLOUT, rollouts);
    if p.otb() || m.flag(&format!("{ACTOR}.calculate_sum_pi_squared")) {
        old.set(
            "sum_pi_squared",
            "true".into(),
            &format!("{ACTOR}.calculate_sum_pi_squared"),
        );
    }
    m.sections.push(old);
    if p.kl {
        let r = log_probs(m, p, "ref", "reference", REF, rollouts);
        m.sections.push(r);
    }
    if p.gae {
        let mut v = Section::node("values", "value", "");
        v.set("model", t_str("critic"), "");
        v.inputs(&[("rollouts", rollouts)]);
        m.micro_batches(
            &mut v,
            "value",
            [
                "critic.forward_micro_batch_size_per_gpu",
                "critic.forward_micro_batch_size",
            ],
            [
                "critic.use_dynamic_bsz",
                "critic.forward_max_token_len_per_gpu",
            ],
        );
        m.padding_free(&mut v, "value", "critic.model.use_remove_padding");
        m.sections.push(v);
    }
}

/// A `logprob` node `name` of `model`, with the micro-batches of verl's worker `prefix`
/// (`<prefix>.log_prob_*`); the reference's is timed as verl's `ref`.
fn log_probs(
    m: &mut Mapper,
    p: &Plan,
    name: &str,
    model: &str,
    prefix: &str,
    rollouts: &str,
) -> Section {
    let mut s = Section::node(name, "logprob", "");
    s.set("model", t_str(model), "");
    if name == "ref" {
        s.set("timing", t_str("ref"), "");
    }
    s.inputs(&[("rollouts", rollouts)]);
    m.micro_batches(
        &mut s,
        "logprob",
        [
            &format!("{prefix}.log_prob_micro_batch_size_per_gpu"),
            &format!("{prefix}.log_prob_micro_batch_size"),
        ],
        [
            &format!("{prefix}.log_prob_use_dynamic_bsz"),
            &format!("{prefix}.log_prob_max_token_len_per_gpu"),
        ],
    );
    // verl computes both log-prob passes with the actor's module settings.
    m.padding_free(
        &mut s,
        "logprob",
        "actor_rollout_ref.actor.use_remove_padding",
    );
    p.logits_temperature(&mut s);
    s
}
