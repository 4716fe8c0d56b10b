//! verl configuration → flowrl graph: the sections and nodes a verl run becomes, and a note for
//! every key that does not carry over.
//!
//! The shape follows verl's trainer (`ray_trainer.fit`): dataset → rollout → (reward →
//! overlong shaping → group filter, repeated until the batch is full, with DAPO's
//! filter_groups) → old-policy log-probs, reference log-probs with a KL loss, critic values with
//! GAE → advantage estimator → critic update → actor update → validation every test_freq steps.
//!
//! Batch arithmetic (docs/from-verl.md): verl counts prompts in `data.train_batch_size` and
//! `ppo_mini_batch_size` and responses per GPU in `*_micro_batch_size_per_gpu`; flowrl counts
//! prompts in `batch_size` / `mini_batch_size` and responses per device in `micro_batch_size`,
//! so those carry over unchanged. The deprecated global `*_micro_batch_size` keys are divided by
//! verl's data-parallel size (GPUs ÷ ulysses_sequence_parallel_size), as verl's workers do.

use flowrl_algorithms::policy_loss::PolicyLossMode;
use flowrl_engine::registry::Registry;
use serde_json::Value as Json;

use super::input::{Value, VerlConfig};
use super::keys::{Class, classify, is_allowed};

const ACTOR: &str = "actor_rollout_ref.actor";
const ROLLOUT: &str = "actor_rollout_ref.rollout";
const MODEL: &str = "actor_rollout_ref.model";
const REF: &str = "actor_rollout_ref.ref";

/// One `[section]` of the graph.
#[derive(Debug)]
pub struct Section {
    pub name: String,
    pub comment: Vec<String>,
    pub entries: Vec<Entry>,
}

/// `key = value`, with the verl key it came from (shown as a trailing comment).
#[derive(Debug)]
pub struct Entry {
    pub key: String,
    /// TOML text of the value.
    pub value: String,
    pub from: String,
}

/// What the converter says about one verl key.
#[derive(Debug)]
pub struct Note {
    pub key: String,
    pub value: String,
    pub kind: NoteKind,
}

#[derive(Debug, PartialEq)]
pub enum NoteKind {
    /// Known, and of no meaning for the graph (listed in the graph's header).
    NoEffect(&'static str),
    /// The value asks for something flowrl does not do (a warning).
    NotCarried(String),
    /// Not a verl key this converter knows (a warning; an error with `--strict`).
    Unknown,
}

/// The converted graph and the notes.
#[derive(Debug)]
pub struct Conversion {
    pub sections: Vec<Section>,
    pub notes: Vec<Note>,
    /// Counts of the keys of the configuration by what became of them.
    pub mapped: usize,
}

/// TOML text of values.
fn t_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}
fn t_f64(x: f64) -> String {
    let s = format!("{x:?}");
    if s.contains(['.', 'e', 'E']) || s.contains("inf") || s.contains("NaN") {
        s
    } else {
        format!("{s}.0")
    }
}
fn t_strs(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| t_str(s)).collect();
    format!("[{}]", quoted.join(", "))
}

impl Section {
    fn new(name: &str) -> Self {
        Section {
            name: name.to_string(),
            comment: Vec::new(),
            entries: Vec::new(),
        }
    }

    fn set(&mut self, key: &str, value: String, from: &str) {
        self.entries.push(Entry {
            key: key.to_string(),
            value,
            from: from.to_string(),
        });
    }
}

struct Mapper<'a> {
    cfg: &'a VerlConfig,
    registry: &'a Registry,
    notes: Vec<Note>,
    sections: Vec<Section>,
    /// Data-parallel size of verl's workers: GPUs ÷ ulysses_sequence_parallel_size.
    dp: i64,
}

impl<'a> Mapper<'a> {
    fn v(&self, key: &str) -> &Value {
        static NULL: Value = Value::Null;
        self.cfg.get(key).unwrap_or(&NULL)
    }
    fn int(&self, key: &str) -> Option<i64> {
        self.v(key).as_i64()
    }
    fn float(&self, key: &str) -> Option<f64> {
        self.v(key).as_f64()
    }
    fn flag(&self, key: &str) -> bool {
        self.v(key).as_bool().unwrap_or(false)
    }
    fn text(&self, key: &str) -> Option<String> {
        match self.v(key) {
            Value::Null => None,
            v => Some(v.to_string()),
        }
    }

    fn not_carried(&mut self, key: &str, reason: impl Into<String>) {
        let value = self.v(key).to_string();
        self.notes.push(Note {
            key: key.to_string(),
            value,
            kind: NoteKind::NotCarried(reason.into()),
        });
    }

    /// The default of a node kind's parameter, as JSON.
    fn default_of(&self, kind: &str, param: &str) -> Option<Json> {
        let spec = self.registry.kind(kind)?.params();
        spec.into_iter()
            .find(|p| p.name == param)
            .and_then(|p| p.default)
    }

    fn kind_has(&self, kind: &str, param: &str) -> bool {
        self.registry
            .kind(kind)
            .is_some_and(|k| k.params().iter().any(|p| p.name == param))
    }

    /// Writes a float parameter when it differs from flowrl's default (so that every form of the
    /// input gives the same graph).
    fn float_param(&self, s: &mut Section, kind: &str, param: &str, from: &str) {
        let Some(x) = self.float(from) else { return };
        let default = self.default_of(kind, param).and_then(|d| d.as_f64());
        if default != Some(x) {
            s.set(param, t_f64(x), from);
        }
    }

    fn int_param(&self, s: &mut Section, kind: &str, param: &str, from: &str) {
        let Some(x) = self.int(from) else { return };
        let default = self.default_of(kind, param).and_then(|d| d.as_i64());
        if default != Some(x) {
            s.set(param, x.to_string(), from);
        }
    }

    fn str_param(&self, s: &mut Section, kind: &str, param: &str, from: &str) {
        let Some(x) = self.v(from).as_str().map(str::to_string) else {
            return;
        };
        let default = self.default_of(kind, param);
        if default.as_ref().and_then(|d| d.as_str()) != Some(x.as_str()) {
            s.set(param, t_str(&x), from);
        }
    }

    /// A per-device micro-batch: `<prefix>_per_gpu`, else the global `<prefix>` ÷ dp.
    fn micro(&mut self, per_gpu: &str, global: &str) -> Option<(i64, String)> {
        if let Some(m) = self.int(per_gpu) {
            return Some((m, per_gpu.to_string()));
        }
        let g = self.int(global)?;
        let m = (g / self.dp).max(1);
        if g % self.dp != 0 {
            self.not_carried(
                global,
                format!(
                    "{g} is not divisible by the {} data-parallel GPUs; {m} per device",
                    self.dp
                ),
            );
        }
        Some((m, format!("{global} ÷ {} GPUs", self.dp)))
    }

    /// verl's dynamic micro-batches (`use_dynamic_bsz` + a token budget) → the kind's
    /// `max_tokens_per_micro_batch` when it has one.
    fn dynamic(&mut self, s: &mut Section, kind: &str, use_key: &str, len_key: &str) {
        if !self.flag(use_key) {
            return;
        }
        let Some(tokens) = self.int(len_key) else {
            return;
        };
        if self.kind_has(kind, "max_tokens_per_micro_batch") {
            s.set("max_tokens_per_micro_batch", tokens.to_string(), len_key);
        } else {
            self.not_carried(
                use_key,
                format!(
                    "`{kind}` has no token-budget micro-batches yet: micro-batches are counted in responses ({len_key} = {tokens} not used); the gradient is the same, only memory differs"
                ),
            );
        }
    }

    /// An optimizer's settings (`<prefix>.optim.*`, `<prefix>.grad_clip`) on an update node.
    fn optimizer(&mut self, s: &mut Section, kind: &str, prefix: &str) {
        let optim = format!("{prefix}.optim");
        if let Some(lr) = self.float(&format!("{optim}.lr")) {
            s.set("lr", t_f64(lr), &format!("{optim}.lr"));
        }
        self.float_param(s, kind, "weight_decay", &format!("{optim}.weight_decay"));
        if let Value::List(b) = self.v(&format!("{optim}.betas")).clone() {
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
        let (ga, gb) = (self.float(&a), self.float(&b));
        let clip = match (ga, gb) {
            (Some(x), Some(y)) if x != y && x == 1.0 => Some((y, b.clone())),
            (Some(x), Some(y)) if x != y && y != 1.0 => {
                self.not_carried(&b, format!("differs from {a} = {x}; {a} is used"));
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
        match self.int(&steps_key) {
            Some(n) if n > 0 => s.set("warmup_steps", n.to_string(), &steps_key),
            _ => self.float_param(
                s,
                kind,
                "warmup_ratio",
                &format!("{optim}.lr_warmup_steps_ratio"),
            ),
        }
        let style = self
            .text(&format!("{optim}.warmup_style"))
            .map(|x| (x, format!("{optim}.warmup_style")))
            .or_else(|| {
                self.text(&format!("{optim}.lr_scheduler_type"))
                    .map(|x| (x, format!("{optim}.lr_scheduler_type")))
            });
        if let Some((style, from)) = style {
            match style.as_str() {
                "constant" => {}
                "cosine" => s.set("lr_schedule", t_str("cosine"), &from),
                other => self.not_carried(
                    &from,
                    format!(
                        "schedule `{other}` is not supported (constant or cosine); constant used"
                    ),
                ),
            }
            if style == "cosine" {
                self.float_param(s, kind, "min_lr_ratio", &format!("{optim}.min_lr_ratio"));
            }
        }
    }
}

/// verl's estimator names → flowrl's advantage kinds.
fn estimator_kind(name: &str) -> Option<&'static str> {
    Some(match name {
        "gae" => "advantage.gae",
        "grpo" | "grpo_vectorized" => "advantage.grpo",
        "reinforce_plus_plus" => "advantage.reinforce_pp",
        "reinforce_plus_plus_baseline" => "advantage.reinforce_pp_baseline",
        "remax" => "advantage.remax",
        "rloo" | "rloo_vectorized" => "advantage.rloo",
        "opo" => "advantage.opo",
        "grpo_passk" => "advantage.grpo_passk",
        "gpg" => "advantage.gpg",
        "gdpo" => "advantage.gdpo",
        "optimal_token_baseline" => "advantage.optimal_token_baseline",
        "tir_optimal_token_baseline" => "advantage.tir_optimal_token_baseline",
        _ => return None,
    })
}

/// The reward kind for verl's default scorer of the data, judged from the training files'
/// names (verl picks the scorer per row by `data_source`).
fn reward_kind(files: &[String]) -> Option<&'static str> {
    let all = files.join(" ").to_ascii_lowercase();
    (all.contains("geo3k") || all.contains("geometry3k") || all.contains("shapes"))
        .then_some("reward.geo3k")
}

fn string_list(v: &Value) -> Vec<String> {
    match v {
        Value::List(items) => items.iter().map(|i| i.to_string()).collect(),
        Value::Null => Vec::new(),
        v => vec![v.to_string()],
    }
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

/// Converts `cfg` into a graph for the kinds `registry` holds.
pub fn convert(cfg: &VerlConfig, registry: &Registry) -> Conversion {
    let world = cfg
        .get("trainer.n_gpus_per_node")
        .and_then(Value::as_i64)
        .unwrap_or(1)
        .max(1)
        * cfg
            .get("trainer.nnodes")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .max(1);
    let sp = cfg
        .get(&format!("{ACTOR}.ulysses_sequence_parallel_size"))
        .and_then(Value::as_i64)
        .unwrap_or(1)
        .max(1);
    let mut m = Mapper {
        cfg,
        registry,
        notes: Vec::new(),
        sections: Vec::new(),
        dp: (world / sp).max(1),
    };
    let mapped = key_notes(&mut m);
    build(&mut m);
    Conversion {
        sections: m.sections,
        notes: m.notes,
        mapped,
    }
}

/// The notes that follow from each key's class alone; returns the number of mapped keys the
/// input chose.
fn key_notes(m: &mut Mapper) -> usize {
    let mut mapped = 0;
    let cfg = m.cfg;
    for (key, value) in &cfg.values {
        let chosen = cfg.set.contains(key);
        match classify(key).map(|r| r.class) {
            None => {
                if chosen || !cfg.defaults.contains_key(key) {
                    m.notes.push(Note {
                        key: key.clone(),
                        value: value.to_string(),
                        kind: NoteKind::Unknown,
                    });
                }
            }
            Some(Class::NoEffect(why)) => {
                if chosen {
                    m.notes.push(Note {
                        key: key.clone(),
                        value: value.to_string(),
                        kind: NoteKind::NoEffect(why),
                    });
                }
            }
            Some(Class::Only(allowed, why)) => {
                if !is_allowed(allowed, value) {
                    m.not_carried(key, why);
                } else if chosen {
                    m.notes.push(Note {
                        key: key.clone(),
                        value: value.to_string(),
                        kind: NoteKind::NoEffect("the value flowrl follows anyway"),
                    });
                }
            }
            Some(Class::Mapped(_)) => mapped += usize::from(chosen),
        }
    }
    for word in &cfg.stray_words {
        m.notes.push(Note {
            key: word.clone(),
            value: String::new(),
            kind: NoteKind::Unknown,
        });
    }
    mapped
}

fn build(m: &mut Mapper) {
    let estimator = m
        .text("algorithm.adv_estimator")
        .unwrap_or_else(|| "gae".into());
    let adv_kind = match estimator_kind(&estimator) {
        Some(k) if m.registry.kind(k).is_some() => k,
        _ => {
            m.not_carried(
                "algorithm.adv_estimator",
                format!("no flowrl advantage kind for `{estimator}`; advantage.grpo written in its place"),
            );
            "advantage.grpo"
        }
    };
    let gae = adv_kind == "advantage.gae";
    let kl = m.flag(&format!("{ACTOR}.use_kl_loss"));
    let filter = m.flag("algorithm.filter_groups.enable");
    let manager = m
        .text("reward.reward_manager.name")
        .or_else(|| m.text("reward_manager.name"))
        .or_else(|| m.text("reward_model.reward_manager"))
        .unwrap_or_else(|| "naive".into());
    let overlong_on = m.flag("reward_model.overlong_buffer.enable")
        || m.flag("reward.reward_kwargs.overlong_buffer_cfg.enable");
    let overlong_prefix = if m.flag("reward.reward_kwargs.overlong_buffer_cfg.enable") {
        "reward.reward_kwargs.overlong_buffer_cfg"
    } else {
        "reward_model.overlong_buffer"
    };
    if !matches!(manager.as_str(), "naive" | "dapo" | "batch" | "prime") {
        m.not_carried(
            "reward_model.reward_manager",
            format!("reward manager `{manager}` is not supported: the data source's rule-based scorer is used"),
        );
    }
    let overlong = overlong_on && manager == "dapo";
    if overlong_on && !overlong {
        m.not_carried(
            &format!("{overlong_prefix}.enable"),
            format!("verl applies the overlong buffer in its dapo reward manager only; with `{manager}` it is off here too"),
        );
    }
    let temperature = m.float(&format!("{ROLLOUT}.temperature")).unwrap_or(1.0);
    let train_files = string_list(m.v("data.train_files"));
    let val_files = string_list(m.v("data.val_files"));
    let train_batch = m.int("data.train_batch_size").unwrap_or(1);
    let gen_batch = if filter {
        m.int("data.gen_batch_size").unwrap_or(train_batch)
    } else {
        train_batch
    };

    // [run]
    let mut run = Section::new("run");
    let (steps, steps_from, steps_comment) = steps(m, &train_files, gen_batch);
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
            "  flowrl orchestrator --port P; flowrl run GRAPH --rank R --world {nnodes} --orchestrator ws://HOST:P --node-address ws://HOST_R:PORT"
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
            _ => {
                let all = ((steps + save - 1) / save).max(1);
                run.set(
                    "keep_checkpoints",
                    all.to_string(),
                    "trainer.max_actor_ckpt_to_keep (null: keep every checkpoint)",
                );
            }
        }
    } else {
        run.set("checkpoint_every", "0".into(), "trainer.save_freq");
    }
    m.sections.push(run);

    // [models.*]
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
    } else if m.int(&format!("{MODEL}.lora_rank")).unwrap_or(0) > 0 {
        let rank = m.int(&format!("{MODEL}.lora_rank")).unwrap();
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
    if kl {
        let mut reference = Section::new("models.reference");
        reference.set("from", t_str("policy"), &format!("{ACTOR}.use_kl_loss"));
        m.sections.push(reference);
    }
    if gae {
        let mut critic = Section::new("models.critic");
        let cpath = m.text("critic.model.path").unwrap_or_else(|| path.clone());
        critic.set("path", t_str(&cpath), "critic.model.path");
        critic.set("value_head", "true".into(), "critic (adv_estimator = gae)");
        m.sections.push(critic);
    }

    // [nodes.data]
    let mut data = Section::new("nodes.data");
    let dk = "dataset.parquet";
    data.set("kind", t_str(dk), "");
    data.set("model", t_str("policy"), "");
    match train_files.as_slice() {
        [one] => data.set("path", t_str(one), "data.train_files"),
        many => data.set("paths", t_strs(many), "data.train_files"),
    }
    if let Some(first) = val_files.first() {
        data.set("val_path", t_str(first), "data.val_files");
        if val_files.len() > 1 {
            m.not_carried(
                "data.val_files",
                format!("one validation file only: {first} is used"),
            );
        }
    }
    data.set(
        "batch_size",
        gen_batch.to_string(),
        if filter && m.int("data.gen_batch_size").is_some() {
            "data.gen_batch_size"
        } else {
            "data.train_batch_size"
        },
    );
    if let Some(len) = m.int("data.max_prompt_length") {
        data.set(
            "max_prompt_length",
            len.to_string(),
            "data.max_prompt_length",
        );
    }
    if let Some(f) = m.v("data.filter_overlong_prompts").as_bool() {
        data.set(
            "filter_overlong_prompts",
            f.to_string(),
            "data.filter_overlong_prompts",
        );
    }
    match m.text("data.truncation").as_deref() {
        Some(t @ ("error" | "left" | "right")) => {
            data.set("truncation", t_str(t), "data.truncation")
        }
        Some(other) => m.not_carried(
            "data.truncation",
            format!("truncation `{other}` is not supported (error, left or right); error used"),
        ),
        None => {}
    }
    m.str_param(&mut data, dk, "prompt_key", "data.prompt_key");
    let image_key = m.text("data.image_key").unwrap_or_default();
    m.str_param(&mut data, dk, "image_key", "data.image_key");
    m.str_param(&mut data, dk, "data_source_key", "data.reward_fn_key");
    if let Some(b) = m.v("data.shuffle").as_bool()
        && !b
    {
        data.set("shuffle", "false".into(), "data.shuffle");
    }
    if !image_key.is_empty()
        && let Some(p) = m.int("data.image_patch_size")
    {
        data.set(
            "verl_image_patch_size",
            p.to_string(),
            "data.image_patch_size",
        );
    }
    m.sections.push(data);

    // [nodes.rollout]
    let mut rollout = Section::new("nodes.rollout");
    let rk = "rollout";
    rollout.set("kind", t_str(rk), "");
    rollout.set("model", t_str("policy"), "");
    rollout.set("inputs", "{ prompts = \"data.prompts\" }".into(), "");
    let n = m.int(&format!("{ROLLOUT}.n")).unwrap_or(1);
    rollout.set("n", n.to_string(), &format!("{ROLLOUT}.n"));
    let response_length = m
        .int(&format!("{ROLLOUT}.response_length"))
        .or_else(|| m.int("data.max_response_length"))
        .unwrap_or(512);
    rollout.set(
        "max_new_tokens",
        response_length.to_string(),
        &format!("{ROLLOUT}.response_length"),
    );
    if m.v(&format!("{ROLLOUT}.do_sample")).as_bool() == Some(false) {
        rollout.set(
            "greedy",
            "true".into(),
            &format!("{ROLLOUT}.do_sample = false"),
        );
    } else {
        rollout.set(
            "temperature",
            t_f64(temperature),
            &format!("{ROLLOUT}.temperature"),
        );
        m.float_param(&mut rollout, rk, "top_p", &format!("{ROLLOUT}.top_p"));
        m.int_param(&mut rollout, rk, "top_k", &format!("{ROLLOUT}.top_k"));
    }
    m.sections.push(rollout);

    // Reward, overlong shaping and the group filter.
    let reward_kind = match reward_kind(&train_files) {
        Some(k) => k,
        None => {
            m.not_carried(
                "data.train_files",
                "verl scores each row with the default scorer of its data_source; flowrl has built-in geo3k, exact_match and format rewards only: reward.geo3k is written, replace it (or use an `exec` node) if the data is not geo3k-style",
            );
            "reward.geo3k"
        }
    };
    let mut reward = Section::new("nodes.reward");
    reward.set("kind", t_str(reward_kind), "data source's default scorer");
    reward.set("inputs", "{ rollouts = \"rollout.rollouts\" }".into(), "");
    m.sections.push(reward);
    let mut scores = "reward.scores".to_string();
    let mut repeat = vec!["data", "rollout", "reward"];
    if overlong {
        let mut s = Section::new("nodes.overlong");
        s.set(
            "kind",
            t_str("reward.overlong"),
            &format!("{overlong_prefix}.enable"),
        );
        s.set("inputs", format!("{{ scores = \"{scores}\" }}"), "");
        let len = m.int(&format!("{overlong_prefix}.len")).unwrap_or(1).max(1);
        s.set("len", len.to_string(), &format!("{overlong_prefix}.len"));
        let pf = m
            .float(&format!("{overlong_prefix}.penalty_factor"))
            .unwrap_or(1.0);
        s.set(
            "penalty_factor",
            t_f64(pf),
            &format!("{overlong_prefix}.penalty_factor"),
        );
        let max_len = m
            .int("reward.reward_kwargs.max_resp_len")
            .unwrap_or(response_length);
        s.set(
            "max_response_length",
            max_len.to_string(),
            "data.max_response_length",
        );
        m.sections.push(s);
        scores = "overlong.scores".into();
        repeat.push("overlong");
    }
    let mut rollouts = "rollout.rollouts".to_string();
    if filter {
        let mut s = Section::new("nodes.filter");
        s.set(
            "kind",
            t_str("filter.groups"),
            "algorithm.filter_groups.enable",
        );
        let list: Vec<String> = repeat.iter().map(|r| r.to_string()).collect();
        s.set("repeat", t_strs(&list), "");
        s.set("inputs", format!("{{ scores = \"{scores}\" }}"), "");
        match m.text("algorithm.filter_groups.metric") {
            Some(metric) => s.set("metric", t_str(&metric), "algorithm.filter_groups.metric"),
            None => m.not_carried(
                "algorithm.filter_groups.metric",
                "null: verl needs a metric; flowrl's default `acc` is used",
            ),
        }
        s.set(
            "batch_size",
            train_batch.to_string(),
            "data.train_batch_size",
        );
        let max = m
            .int("algorithm.filter_groups.max_num_gen_batches")
            .unwrap_or(0)
            .max(0);
        s.set(
            "max_num_gen_batches",
            max.to_string(),
            "algorithm.filter_groups.max_num_gen_batches",
        );
        m.sections.push(s);
        scores = "filter.scores".into();
        rollouts = "filter.rollouts".into();
    }

    // Log-probs and values.
    let otb = matches!(
        adv_kind,
        "advantage.optimal_token_baseline" | "advantage.tir_optimal_token_baseline"
    );
    let mut old = Section::new("nodes.old");
    old.set("kind", t_str("logprob"), "");
    old.set("model", t_str("policy"), "");
    old.set("inputs", format!("{{ rollouts = \"{rollouts}\" }}"), "");
    if let Some((micro, from)) = m.micro(
        &format!("{ROLLOUT}.log_prob_micro_batch_size_per_gpu"),
        &format!("{ROLLOUT}.log_prob_micro_batch_size"),
    ) {
        old.set("micro_batch_size", micro.to_string(), &from);
    }
    m.dynamic(
        &mut old,
        "logprob",
        &format!("{ROLLOUT}.log_prob_use_dynamic_bsz"),
        &format!("{ROLLOUT}.log_prob_max_token_len_per_gpu"),
    );
    if temperature != 1.0 {
        old.set(
            "temperature",
            t_f64(temperature),
            &format!("{ROLLOUT}.temperature"),
        );
    }
    if otb || m.flag(&format!("{ACTOR}.calculate_sum_pi_squared")) {
        old.set(
            "sum_pi_squared",
            "true".into(),
            &format!("{ACTOR}.calculate_sum_pi_squared"),
        );
    }
    m.sections.push(old);
    if kl {
        let mut r = Section::new("nodes.ref");
        r.set("kind", t_str("logprob"), "");
        r.set("model", t_str("reference"), "");
        r.set("timing", t_str("ref"), "");
        r.set("inputs", format!("{{ rollouts = \"{rollouts}\" }}"), "");
        if let Some((micro, from)) = m.micro(
            &format!("{REF}.log_prob_micro_batch_size_per_gpu"),
            &format!("{REF}.log_prob_micro_batch_size"),
        ) {
            r.set("micro_batch_size", micro.to_string(), &from);
        }
        m.dynamic(
            &mut r,
            "logprob",
            &format!("{REF}.log_prob_use_dynamic_bsz"),
            &format!("{REF}.log_prob_max_token_len_per_gpu"),
        );
        if temperature != 1.0 {
            r.set(
                "temperature",
                t_f64(temperature),
                &format!("{ROLLOUT}.temperature"),
            );
        }
        m.sections.push(r);
    }
    if gae {
        let mut v = Section::new("nodes.values");
        v.set("kind", t_str("value"), "");
        v.set("model", t_str("critic"), "");
        v.set("inputs", format!("{{ rollouts = \"{rollouts}\" }}"), "");
        if let Some((micro, from)) = m.micro(
            "critic.forward_micro_batch_size_per_gpu",
            "critic.forward_micro_batch_size",
        ) {
            v.set("micro_batch_size", micro.to_string(), &from);
        }
        m.dynamic(
            &mut v,
            "value",
            "critic.use_dynamic_bsz",
            "critic.forward_max_token_len_per_gpu",
        );
        m.sections.push(v);
    }

    // ReMax's greedy baseline: one greedy response per prompt, scored by the same reward.
    let remax = adv_kind == "advantage.remax";
    if remax {
        if filter {
            m.not_carried(
                "algorithm.filter_groups.enable",
                "remax with filter_groups: the greedy baseline is not repeated with the groups; convert without filter_groups",
            );
        }
        let mut b = Section::new("nodes.baseline");
        b.set("kind", t_str("rollout"), "algorithm.adv_estimator = remax");
        b.set("model", t_str("policy"), "");
        b.set("inputs", "{ prompts = \"data.prompts\" }".into(), "");
        b.set("greedy", "true".into(), "");
        b.set(
            "max_new_tokens",
            response_length.to_string(),
            &format!("{ROLLOUT}.response_length"),
        );
        m.sections.push(b);
        let mut br = Section::new("nodes.baseline_reward");
        br.set("kind", t_str(reward_kind), "");
        br.set("inputs", "{ rollouts = \"baseline.rollouts\" }".into(), "");
        m.sections.push(br);
    }

    // [nodes.advantage]
    let mut adv = Section::new("nodes.advantage");
    adv.set("kind", t_str(adv_kind), "algorithm.adv_estimator");
    let mut inputs = vec![format!("scores = \"{scores}\"")];
    if gae {
        inputs.push("values = \"values.values\"".into());
    }
    if otb {
        inputs.push("old_log_probs = \"old.log_probs\"".into());
    }
    if remax {
        inputs.push("baseline_scores = \"baseline_reward.scores\"".into());
    }
    adv.set("inputs", format!("{{ {} }}", inputs.join(", ")), "");
    match adv_kind {
        "advantage.gae" => {
            adv.set(
                "gamma",
                t_f64(m.float("algorithm.gamma").unwrap_or(1.0)),
                "algorithm.gamma",
            );
            adv.set(
                "lam",
                t_f64(m.float("algorithm.lam").unwrap_or(1.0)),
                "algorithm.lam",
            );
        }
        "advantage.reinforce_pp" => {
            m.float_param(&mut adv, adv_kind, "gamma", "algorithm.gamma");
        }
        "advantage.grpo" | "advantage.grpo_passk"
            if m.v("algorithm.norm_adv_by_std_in_grpo").as_bool() == Some(false) =>
        {
            // advantage.grpo names it norm_by_std, advantage.grpo_passk as verl does.
            let name = if adv_kind == "advantage.grpo" {
                "norm_by_std"
            } else {
                "norm_adv_by_std_in_grpo"
            };
            adv.set(name, "false".into(), "algorithm.norm_adv_by_std_in_grpo");
        }
        "advantage.rloo" if estimator == "rloo_vectorized" => {
            adv.set(
                "vectorized",
                "true".into(),
                "algorithm.adv_estimator = rloo_vectorized",
            );
        }
        "advantage.gdpo" => {
            let keys = string_list(m.v("algorithm.gdpo_reward_keys"));
            if keys.is_empty() {
                m.not_carried(
                    "algorithm.adv_estimator",
                    "gdpo needs algorithm.gdpo_reward_keys (the score components, e.g. [acc, format])",
                );
            } else {
                adv.set(
                    "gdpo_reward_keys",
                    t_strs(&keys),
                    "algorithm.gdpo_reward_keys",
                );
            }
            if let Value::List(w) = m.v("algorithm.gdpo_reward_weights").clone() {
                let w: Vec<String> = w.iter().filter_map(Value::as_f64).map(t_f64).collect();
                adv.set(
                    "gdpo_reward_weights",
                    format!("[{}]", w.join(", ")),
                    "algorithm.gdpo_reward_weights",
                );
            }
        }
        _ => {}
    }
    m.sections.push(adv);

    // [nodes.critic]
    if gae {
        let ck = "update.critic";
        let mut c = Section::new("nodes.critic");
        c.set("kind", t_str(ck), "");
        c.set("model", t_str("critic"), "");
        c.set(
            "inputs",
            format!(
                "{{ rollouts = \"{rollouts}\", values = \"values.values\", advantages = \"advantage.advantages\" }}"
            ),
            "",
        );
        if let Some(mini) = m.int("critic.ppo_mini_batch_size") {
            c.set(
                "mini_batch_size",
                mini.to_string(),
                "critic.ppo_mini_batch_size",
            );
        }
        if let Some((micro, from)) = m.micro(
            "critic.ppo_micro_batch_size_per_gpu",
            "critic.ppo_micro_batch_size",
        ) {
            c.set("micro_batch_size", micro.to_string(), &from);
        }
        m.dynamic(
            &mut c,
            ck,
            "critic.use_dynamic_bsz",
            "critic.ppo_max_token_len_per_gpu",
        );
        m.int_param(&mut c, ck, "ppo_epochs", "critic.ppo_epochs");
        m.float_param(&mut c, ck, "cliprange_value", "critic.cliprange_value");
        m.str_param(&mut c, ck, "loss_agg_mode", "critic.loss_agg_mode");
        m.optimizer(&mut c, ck, "critic");
        m.sections.push(c);
    }

    // [nodes.update]
    let uk = "update.ppo";
    let mut u = Section::new("nodes.update");
    u.set("kind", t_str(uk), "");
    u.set("model", t_str("policy"), "");
    let mut inputs = vec![
        format!("rollouts = \"{rollouts}\""),
        "advantages = \"advantage.advantages\"".to_string(),
        "old_log_probs = \"old.log_probs\"".to_string(),
    ];
    if kl {
        inputs.push("ref_log_probs = \"ref.log_probs\"".into());
    }
    u.set("inputs", format!("{{ {} }}", inputs.join(", ")), "");
    if let Some(w) = m.int("trainer.critic_warmup")
        && w > 0
    {
        u.set("critic_warmup", w.to_string(), "trainer.critic_warmup");
    }
    if let Some(mini) = m.int(&format!("{ACTOR}.ppo_mini_batch_size")) {
        u.set(
            "mini_batch_size",
            mini.to_string(),
            &format!("{ACTOR}.ppo_mini_batch_size"),
        );
    }
    if let Some((micro, from)) = m.micro(
        &format!("{ACTOR}.ppo_micro_batch_size_per_gpu"),
        &format!("{ACTOR}.ppo_micro_batch_size"),
    ) {
        u.set("micro_batch_size", micro.to_string(), &from);
    }
    m.dynamic(
        &mut u,
        uk,
        &format!("{ACTOR}.use_dynamic_bsz"),
        &format!("{ACTOR}.ppo_max_token_len_per_gpu"),
    );
    m.int_param(&mut u, uk, "ppo_epochs", &format!("{ACTOR}.ppo_epochs"));
    policy_loss(m, &mut u);
    m.str_param(
        &mut u,
        uk,
        "loss_agg_mode",
        &format!("{ACTOR}.loss_agg_mode"),
    );
    if kl {
        let estimator = m
            .text(&format!("{ACTOR}.kl_loss_type"))
            .unwrap_or_else(|| "low_var_kl".into());
        // update.ppo's `kl.estimator` names (verl's kl_loss_type, "+" = straight-through).
        const KL: &[&str] = &["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"];
        let supported = KL.contains(&estimator.trim_end_matches('+'));
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
    m.float_param(
        &mut u,
        uk,
        "entropy_coeff",
        &format!("{ACTOR}.entropy_coeff"),
    );
    m.optimizer(&mut u, uk, ACTOR);
    if temperature != 1.0 {
        u.set(
            "temperature",
            t_f64(temperature),
            &format!("{ROLLOUT}.temperature"),
        );
    }
    if m.flag(&format!("{ACTOR}.freeze_vision_tower")) {
        u.set(
            "freeze_vision_tower",
            "true".into(),
            &format!("{ACTOR}.freeze_vision_tower"),
        );
    }
    m.sections.push(u);

    // [nodes.eval]
    let test_freq = m.int("trainer.test_freq").unwrap_or(-1);
    if test_freq > 0 && !val_files.is_empty() {
        let mut e = Section::new("nodes.eval");
        e.set("kind", t_str("eval"), "");
        e.set("model", t_str("policy"), "");
        e.set(
            "inputs",
            "{ prompts = \"data.val_prompts\", after = \"update.done\" }".into(),
            "",
        );
        e.set("every", test_freq.to_string(), "trainer.test_freq");
        e.set(
            "max_new_tokens",
            response_length.to_string(),
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
        m.sections.push(e);
    } else if test_freq > 0 {
        m.not_carried("trainer.test_freq", "no data.val_files: no eval node");
    }
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
