//! The updates: `[nodes.critic]` (`update.critic`, GAE only) and `[nodes.update]`
//! (`update.ppo`): PPO's mini-/micro-batches and epochs, the optimizer (`<worker>.optim.*`,
//! grad clipping, warm-up, schedule), the policy loss and the options it reads, the KL loss,
//! entropy bonus and vision-tower freezing.

use flowrl_algorithms::kl::KlEstimator;
use flowrl_algorithms::policy_loss::PolicyLossMode;

use super::mapper::{Mapper, t_f64, t_str};
use super::{ACTOR, Plan, Section};
use crate::convert::input::Value;

/// `[nodes.critic]`, when the plan has a critic.
pub(super) fn critic(m: &mut Mapper, p: &Plan, rollouts: &str) {
    if !p.gae {
        return;
    }
    let ck = "update.critic";
    let mut c = Section::node("critic", ck, "");
    c.set("model", t_str("critic"), "");
    c.inputs(&[
        ("rollouts", rollouts),
        ("values", "values.values"),
        ("advantages", "advantage.advantages"),
    ]);
    ppo_batches(m, &mut c, ck, "critic");
    m.float_param(&mut c, ck, "cliprange_value", "critic.cliprange_value");
    m.str_param(&mut c, ck, "loss_agg_mode", "critic.loss_agg_mode");
    optimizer(m, &mut c, ck, "critic");
    m.sections.push(c);
}

/// `[nodes.update]`: the actor's PPO update.
pub(super) fn actor(m: &mut Mapper, p: &Plan, rollouts: &str) {
    let uk = "update.ppo";
    let mut u = Section::node("update", uk, "");
    u.set("model", t_str("policy"), "");
    let mut inputs = vec![
        ("rollouts", rollouts),
        ("advantages", "advantage.advantages"),
        ("old_log_probs", "old.log_probs"),
    ];
    if p.kl {
        inputs.push(("ref_log_probs", "ref.log_probs"));
    }
    u.inputs(&inputs);
    if let Some(w) = m.int("trainer.critic_warmup")
        && w > 0
    {
        u.set("critic_warmup", w.to_string(), "trainer.critic_warmup");
    }
    ppo_batches(m, &mut u, uk, ACTOR);
    policy_loss(m, &mut u);
    m.str_param(
        &mut u,
        uk,
        "loss_agg_mode",
        &format!("{ACTOR}.loss_agg_mode"),
    );
    if p.kl {
        kl_loss(m, &mut u);
    }
    m.float_param(
        &mut u,
        uk,
        "entropy_coeff",
        &format!("{ACTOR}.entropy_coeff"),
    );
    optimizer(m, &mut u, uk, ACTOR);
    p.logits_temperature(&mut u);
    if m.flag(&format!("{ACTOR}.freeze_vision_tower")) {
        u.set(
            "freeze_vision_tower",
            "true".into(),
            &format!("{ACTOR}.freeze_vision_tower"),
        );
    }
    m.sections.push(u);
}

/// PPO's batching of worker `prefix` (`actor_rollout_ref.actor` or `critic`): mini-batch,
/// micro-batches (or a token budget) and epochs.
fn ppo_batches(m: &mut Mapper, s: &mut Section, kind: &str, prefix: &str) {
    let mini_key = format!("{prefix}.ppo_mini_batch_size");
    if let Some(mini) = m.int(&mini_key) {
        s.set("mini_batch_size", mini.to_string(), &mini_key);
    }
    m.micro_batches(
        s,
        kind,
        [
            &format!("{prefix}.ppo_micro_batch_size_per_gpu"),
            &format!("{prefix}.ppo_micro_batch_size"),
        ],
        [
            &format!("{prefix}.use_dynamic_bsz"),
            &format!("{prefix}.ppo_max_token_len_per_gpu"),
        ],
    );
    let (remove_padding, checkpointing) = if prefix == "critic" {
        (
            "critic.model.use_remove_padding".to_string(),
            "critic.model.enable_gradient_checkpointing",
        )
    } else {
        (
            format!("{prefix}.use_remove_padding"),
            "actor_rollout_ref.model.enable_gradient_checkpointing",
        )
    };
    m.padding_free(s, kind, &remove_padding);
    m.gradient_checkpointing(s, kind, checkpointing);
    m.int_param(s, kind, "ppo_epochs", &format!("{prefix}.ppo_epochs"));
}

/// `kl = { estimator, coef }` from `kl_loss_type` and `kl_loss_coef`.
fn kl_loss(m: &mut Mapper, u: &mut Section) {
    let estimator = m
        .text(&format!("{ACTOR}.kl_loss_type"))
        .unwrap_or_else(|| "low_var_kl".into());
    let supported = KlEstimator::NAMES.contains(&estimator.as_str());
    if !supported {
        m.not_carried(
            &format!("{ACTOR}.kl_loss_type"),
            format!("KL estimator `{estimator}` is not supported; low_var_kl used"),
        );
    }
    let estimator = if supported {
        estimator
    } else {
        "low_var_kl".into()
    };
    let coef = m.float(&format!("{ACTOR}.kl_loss_coef")).unwrap_or(0.001);
    u.set(
        "kl",
        format!(
            "{{ estimator = {}, coef = {} }}",
            t_str(&estimator),
            t_f64(coef)
        ),
        &format!("{ACTOR}.kl_loss_type, kl_loss_coef"),
    );
}

/// `policy_loss` and the options the chosen loss reads, from `actor.*` and
/// `actor.policy_loss.*`.
fn policy_loss(m: &mut Mapper, u: &mut Section) {
    let uk = "update.ppo";
    let key = format!("{ACTOR}.policy_loss.loss_mode");
    let name = m.text(&key).unwrap_or_else(|| "vanilla".into());
    let mode = match name.parse::<PolicyLossMode>() {
        Ok(mode) => mode,
        Err(_) => {
            m.not_carried(
                &key,
                format!("no flowrl policy loss `{name}`; vanilla used"),
            );
            PolicyLossMode::Vanilla
        }
    };
    if mode != PolicyLossMode::Vanilla {
        u.set("policy_loss", t_str(mode.name()), &key);
    }
    let reads = mode.reads();
    let (low, high) = (
        m.float(&format!("{ACTOR}.clip_ratio_low")),
        m.float(&format!("{ACTOR}.clip_ratio_high")),
    );
    for &option in reads {
        let from = if m.cfg.values.contains_key(&format!("{ACTOR}.{option}")) {
            format!("{ACTOR}.{option}")
        } else {
            format!("{ACTOR}.policy_loss.{option}")
        };
        match option {
            // verl's losses take clip_ratio_low / _high when set (they always are in verl's
            // defaults) and clip_ratio only in their place: one ε when they agree.
            "clip_ratio" if reads.contains(&"clip_ratio_low") && low.is_some() && low == high => {
                u.set(
                    "clip_ratio",
                    t_f64(low.unwrap()),
                    &format!("{ACTOR}.clip_ratio_low, clip_ratio_high"),
                );
            }
            "clip_ratio" if reads.contains(&"clip_ratio_low") && low.is_some() => {}
            "clip_ratio_low" | "clip_ratio_high" if low == high && low.is_some() => {}
            "dro_beta" => match m.float(&from) {
                Some(b) => u.set("dro_beta", t_f64(b), &from),
                None => m.not_carried(&key, "dro needs actor.policy_loss.dro_beta"),
            },
            _ => m.float_param(u, uk, option, &from),
        }
    }
}

/// An optimizer's settings (`<prefix>.optim.*`, `<prefix>.grad_clip`) on an update node.
fn optimizer(m: &mut Mapper, s: &mut Section, kind: &str, prefix: &str) {
    let optim = format!("{prefix}.optim");
    if let Some(lr) = m.float(&format!("{optim}.lr")) {
        s.set("lr", t_f64(lr), &format!("{optim}.lr"));
    }
    m.float_param(s, kind, "weight_decay", &format!("{optim}.weight_decay"));
    if let Value::List(b) = m.v(&format!("{optim}.betas")).clone() {
        let betas: Vec<f64> = b.iter().filter_map(Value::as_f64).collect();
        if betas.len() == 2 && betas != [0.9, 0.999] {
            s.set(
                "betas",
                format!("[{}, {}]", t_f64(betas[0]), t_f64(betas[1])),
                &format!("{optim}.betas"),
            );
        }
    }
    // The legacy workers read `<prefix>.grad_clip`, the new ones `optim.clip_grad`: take the
    // one that differs from verl's default 1.0.
    let (a, b) = (format!("{prefix}.grad_clip"), format!("{optim}.clip_grad"));
    let (ga, gb) = (m.float(&a), m.float(&b));
    let clip = match (ga, gb) {
        (Some(x), Some(y)) if x != y && x == 1.0 => Some((y, b.clone())),
        (Some(x), Some(y)) if x != y && y != 1.0 => {
            m.not_carried(&b, format!("differs from {a} = {x}; {a} is used"));
            Some((x, a.clone()))
        }
        (Some(x), _) => Some((x, a.clone())),
        (None, Some(y)) => Some((y, b.clone())),
        (None, None) => None,
    };
    if let Some((x, from)) = clip {
        s.set("grad_clip", t_f64(x), &from);
    }
    // Warm-up: verl uses lr_warmup_steps when > 0, else the ratio of the run's steps.
    let steps_key = format!("{optim}.lr_warmup_steps");
    match m.int(&steps_key) {
        Some(n) if n > 0 => s.set("warmup_steps", n.to_string(), &steps_key),
        _ => m.float_param(
            s,
            kind,
            "warmup_ratio",
            &format!("{optim}.lr_warmup_steps_ratio"),
        ),
    }
    let style = m
        .text(&format!("{optim}.warmup_style"))
        .map(|x| (x, format!("{optim}.warmup_style")))
        .or_else(|| {
            m.text(&format!("{optim}.lr_scheduler_type"))
                .map(|x| (x, format!("{optim}.lr_scheduler_type")))
        });
    if let Some((style, from)) = style {
        match style.as_str() {
            "constant" => {}
            "cosine" => s.set("lr_schedule", t_str("cosine"), &from),
            other => m.not_carried(
                &from,
                format!("schedule `{other}` is not supported (constant or cosine); constant used"),
            ),
        }
        if style == "cosine" {
            m.float_param(s, kind, "min_lr_ratio", &format!("{optim}.min_lr_ratio"));
        }
    }
}
