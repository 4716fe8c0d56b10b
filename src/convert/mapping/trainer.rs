//! The trainer's settings: `[run]` (steps from verl's epochs or total steps, seed, devices and
//! nodes, checkpoints), `[models.*]` (policy with LoRA, frozen reference, critic) and the
//! validation node (`trainer.test_freq`).

use super::mapper::{Mapper, string_list, t_f64, t_str, t_strs};
use super::{ACTOR, MODEL, Plan, ROLLOUT, Section};

/// `[run]`.
pub(super) fn run(m: &mut Mapper, p: &Plan) {
    let mut run = Section::new("run");
    let (steps, steps_from, steps_comment) = steps(m, &p.train_files, p.gen_batch);
    run.comment = steps_comment;
    run.set("steps", steps.to_string(), &steps_from);
    match m.int("data.seed") {
        Some(seed) => run.set("seed", seed.to_string(), "data.seed"),
        None => run.set(
            "seed",
            "1".into(),
            "data.seed (null: verl's sampler seed 1)",
        ),
    }
    let device_type = m.text("trainer.device").unwrap_or_else(|| "cuda".into());
    if device_type != "cuda" {
        m.not_carried(
            "trainer.device",
            format!("device `{device_type}` is not supported; CUDA devices written"),
        );
    }
    let per_node = m.int("trainer.n_gpus_per_node").unwrap_or(1).max(1);
    if per_node == 1 {
        run.set("device", t_str("cuda"), "trainer.n_gpus_per_node");
    } else {
        let devices: Vec<String> = (0..per_node).map(|i| format!("cuda:{i}")).collect();
        run.set("devices", t_strs(&devices), "trainer.n_gpus_per_node");
    }
    let nnodes = m.int("trainer.nnodes").unwrap_or(1).max(1);
    if nnodes > 1 {
        run.comment.push(format!(
            "verl's trainer.nnodes = {nnodes}: run one process per machine, each with these devices:"
        ));
        run.comment.push(format!(
            "  flowrl run GRAPH --rank R --world {nnodes} --master HOST0:29500 (or srun / torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
        ));
    }
    if let Some(out) = m.text("trainer.default_local_dir") {
        run.set("out", t_str(&out), "trainer.default_local_dir");
    }
    let save = m.int("trainer.save_freq").unwrap_or(-1);
    if save > 0 {
        run.set("checkpoint_every", save.to_string(), "trainer.save_freq");
        match m.int("trainer.max_actor_ckpt_to_keep") {
            Some(k) if k > 0 => run.set(
                "keep_checkpoints",
                k.to_string(),
                "trainer.max_actor_ckpt_to_keep",
            ),
            _ => run.set(
                "keep_checkpoints",
                "0".into(),
                "trainer.max_actor_ckpt_to_keep (null: keep every checkpoint)",
            ),
        }
    } else {
        run.set("checkpoint_every", "0".into(), "trainer.save_freq");
    }
    tracking(m, &mut run);
    m.sections.push(run);
}

/// verl's trackers that a TensorBoard event file stands in for: TensorBoard itself, and the
/// services that import its files (W&B: `wandb sync --sync-tensorboard`).
const TENSORBOARD_LIKE: &[&str] = &[
    "tensorboard",
    "wandb",
    "vemlp_wandb",
    "mlflow",
    "swanlab",
    "clearml",
    "trackio",
];

/// `[run] tracking` from `trainer.logger`: TensorBoard files when it names a tracker
/// (`console` and `file` are metrics.jsonl and the console, always written).
fn tracking(m: &mut Mapper, run: &mut Section) {
    let loggers = string_list(m.v("trainer.logger"));
    let services: Vec<&String> = loggers
        .iter()
        .filter(|l| TENSORBOARD_LIKE.contains(&l.as_str()))
        .collect();
    if services.is_empty() {
        return;
    }
    let imported: Vec<&str> = services
        .iter()
        .map(|s| s.as_str())
        .filter(|s| *s != "tensorboard")
        .collect();
    let from = if imported.is_empty() {
        "trainer.logger".to_string()
    } else {
        format!(
            "trainer.logger ({}: import RUN_DIR/tensorboard, e.g. wandb sync --sync-tensorboard)",
            imported.join(", ")
        )
    };
    run.set(
        "tracking",
        t_strs(&["jsonl".into(), "tensorboard".into()]),
        &from,
    );
}

/// The number of training steps: `trainer.total_training_steps`, else
/// `total_epochs × ⌊rows ÷ prompts per generation batch⌋` (verl's dataloader drops the last
/// partial batch), counting the rows of the training files when they can be read.
fn steps(m: &mut Mapper, files: &[String], batch: i64) -> (i64, String, Vec<String>) {
    if let Some(n) = m.int("trainer.total_training_steps") {
        return (n.max(1), "trainer.total_training_steps".into(), Vec::new());
    }
    let epochs = m.int("trainer.total_epochs").unwrap_or(1).max(1);
    let mut rows = 0usize;
    for f in files {
        match flowrl_datasets::verl::summarize_file(std::path::Path::new(f)) {
            Ok(s) => rows += s.num_rows,
            Err(e) => {
                m.not_carried(
                    "trainer.total_epochs",
                    format!(
                        "the training file {f} cannot be read to count its rows ({e}); steps = total_epochs = {epochs}: set the run's length with `--steps N` (N = {epochs} × rows ÷ {batch})"
                    ),
                );
                return (
                    epochs,
                    "trainer.total_epochs (rows unknown)".into(),
                    Vec::new(),
                );
            }
        }
    }
    let per_epoch = (rows as i64 / batch.max(1)).max(1);
    let mut comment = vec![format!(
        "steps: verl's total_epochs {epochs} × ⌊{rows} rows ÷ {batch} prompts⌋ = {epochs} × {per_epoch}"
    )];
    if m.flag("data.filter_overlong_prompts") {
        comment.push(
            "  (rows counted before filter_overlong_prompts drops the long ones; verl counts after)"
                .into(),
        );
    }
    (epochs * per_epoch, "trainer.total_epochs".into(), comment)
}

/// `[models.policy]` (with its LoRA adapter or rank), `[models.reference]` for a KL loss,
/// `[models.critic]` for GAE.
pub(super) fn models(m: &mut Mapper, p: &Plan) {
    let mut policy = Section::new("models.policy");
    let path = m
        .text(&format!("{MODEL}.path"))
        .unwrap_or_else(|| "MODEL".into());
    policy.set("path", t_str(&path), &format!("{MODEL}.path"));
    if let Some(adapter) = m.text(&format!("{MODEL}.lora_adapter_path")) {
        policy.set(
            "lora",
            format!("{{ adapter = {} }}", t_str(&adapter)),
            &format!("{MODEL}.lora_adapter_path"),
        );
    } else if let Some(rank) = m.int(&format!("{MODEL}.lora_rank")).filter(|r| *r > 0) {
        let alpha = m.float(&format!("{MODEL}.lora_alpha")).unwrap_or(16.0);
        let targets = string_list(m.v(&format!("{MODEL}.target_modules")));
        let targets = if targets.is_empty() {
            vec!["all-linear".to_string()]
        } else {
            targets
        };
        policy.set(
            "lora",
            format!(
                "{{ rank = {rank}, alpha = {}, target_modules = {} }}",
                t_f64(alpha),
                t_strs(&targets)
            ),
            &format!("{MODEL}.lora_rank, lora_alpha, target_modules"),
        );
    }
    let exclude = m.text(&format!("{MODEL}.exclude_modules"));
    if let Some(ex) = exclude
        && !(ex.contains("visual") || ex.contains("vision"))
    {
        m.not_carried(
            &format!("{MODEL}.exclude_modules"),
            "flowrl excludes the vision tower only (unless a target names it); other exclusions are not supported",
        );
    }
    m.sections.push(policy);
    if p.kl {
        let mut reference = Section::new("models.reference");
        reference.set("from", t_str("policy"), &format!("{ACTOR}.use_kl_loss"));
        m.sections.push(reference);
    }
    if p.gae {
        let mut critic = Section::new("models.critic");
        let cpath = m.text("critic.model.path").unwrap_or_else(|| path.clone());
        critic.set("path", t_str(&cpath), "critic.model.path");
        critic.set("value_head", "true".into(), "critic (adv_estimator = gae)");
        m.sections.push(critic);
    }
}

/// `[nodes.eval]`: greedy validation after every `trainer.test_freq`-th step (and before the
/// first with `trainer.val_before_train`) on the first val file.
pub(super) fn eval(m: &mut Mapper, p: &Plan) {
    let test_freq = m.int("trainer.test_freq").unwrap_or(-1);
    if test_freq > 0 && !p.val_files.is_empty() {
        let mut e = Section::node("eval", "eval", "");
        e.set("model", t_str("policy"), "");
        e.inputs(&[("prompts", "data.val_prompts"), ("after", "update.done")]);
        e.set("every", test_freq.to_string(), "trainer.test_freq");
        e.set(
            "before_train",
            m.flag("trainer.val_before_train").to_string(),
            "trainer.val_before_train",
        );
        e.set(
            "log_generations",
            m.int("trainer.log_val_generations")
                .unwrap_or(0)
                .max(0)
                .to_string(),
            "trainer.log_val_generations",
        );
        e.set(
            "max_new_tokens",
            p.response_length.to_string(),
            &format!("{ROLLOUT}.response_length"),
        );
        if let Some(b) = m.int("data.val_batch_size") {
            e.set("batch_size", b.to_string(), "data.val_batch_size");
        }
        let vk = format!("{ROLLOUT}.val_kwargs");
        if m.flag(&format!("{vk}.do_sample")) {
            m.not_carried(
                &format!("{vk}.do_sample"),
                "sampled validation is not supported: the eval node decodes greedily (verl's do_sample = false)",
            );
        }
        if m.int(&format!("{vk}.n")).unwrap_or(1) > 1 {
            m.not_carried(&format!("{vk}.n"), "the eval node answers each prompt once");
        }
        match &p.turns {
            Some(turns) => {
                turns.write(&mut e);
                m.sections.push(e);
                m.sections.extend(turns.tool_sections("eval"));
            }
            None => m.sections.push(e),
        }
    } else if test_freq > 0 {
        m.not_carried("trainer.test_freq", "no data.val_files: no eval node");
    }
}
