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
//!
//! This module holds the result types, the notes that follow from each key's class, and the
//! order in which the sections are written; one submodule per part of the graph:
//!
//! - [`mapper`]: reading verl values and writing parameters that differ from flowrl's defaults;
//! - [`trainer`]: `[run]` (steps, seed, devices, checkpoints), `[models.*]` and the eval node;
//! - [`data`]: the dataset and rollout nodes;
//! - [`tools`]: a multi-turn rollout's turn parameters and tools;
//! - [`reward`]: the reward, DAPO's overlong shaping and the group filter;
//! - [`scoring`]: old-policy and reference log-probs, critic values;
//! - [`advantage`]: the estimator (and ReMax's greedy baseline);
//! - [`update`]: the critic and actor updates, their optimizer, policy loss and KL loss.
//!
//! [`build`] calls the parts in the graph's order, so the sections and the notes come out in
//! that order. Nothing here checks the graph (`flowrl validate` does).

mod advantage;
mod data;
mod mapper;
mod reward;
mod scoring;
mod tools;
mod trainer;
mod update;

use flowrl_engine::registry::Registry;

use super::input::{Value, VerlConfig};
use super::keys::{Class, classify, is_allowed};
use mapper::{Mapper, string_list, t_f64};

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

impl Section {
    fn new(name: &str) -> Self {
        Section {
            name: name.to_string(),
            comment: Vec::new(),
            entries: Vec::new(),
        }
    }

    /// `[nodes.<name>]` with its `kind` (and the verl key that chose it, if any).
    fn node(name: &str, kind: &str, from: &str) -> Self {
        let mut s = Section::new(&format!("nodes.{name}"));
        s.set("kind", mapper::t_str(kind), from);
        s
    }

    fn set(&mut self, key: &str, value: String, from: &str) {
        self.entries.push(Entry {
            key: key.to_string(),
            value,
            from: from.to_string(),
        });
    }

    /// `inputs = { port = "node.port", ... }`.
    fn inputs(&mut self, wires: &[(&str, &str)]) {
        let wires: Vec<String> = wires
            .iter()
            .map(|(p, w)| format!("{p} = \"{w}\""))
            .collect();
        self.set("inputs", format!("{{ {} }}", wires.join(", ")), "");
    }
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
        let note = |kind| Note {
            key: key.clone(),
            value: value.to_string(),
            kind,
        };
        match classify(key).map(|r| r.class) {
            None => {
                if chosen || !cfg.defaults.contains_key(key) {
                    m.notes.push(note(NoteKind::Unknown));
                }
            }
            Some(Class::NoEffect(why)) => {
                if chosen {
                    m.notes.push(note(NoteKind::NoEffect(why)));
                }
            }
            Some(Class::Only(allowed, why)) => {
                if !is_allowed(allowed, value) {
                    m.not_carried(key, why);
                } else if chosen {
                    m.notes
                        .push(note(NoteKind::NoEffect("the value flowrl follows anyway")));
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

/// The choices several sections depend on, read (with their notes) before any is written.
struct Plan {
    /// `algorithm.adv_estimator` as verl names it.
    estimator: String,
    /// The advantage kind it becomes.
    adv_kind: &'static str,
    /// GAE: a critic model, a values node and a critic update.
    gae: bool,
    /// A KL loss: a reference model and its log-probs.
    kl: bool,
    /// DAPO's group filter (`algorithm.filter_groups.enable`).
    filter: bool,
    /// The overlong buffer's key prefix, when the shaping node is written.
    overlong: Option<&'static str>,
    temperature: f64,
    train_files: Vec<String>,
    val_files: Vec<String>,
    train_batch: i64,
    /// Prompts per generation batch (`data.gen_batch_size` with the group filter).
    gen_batch: i64,
    /// Tokens per response.
    response_length: i64,
    /// A multi-turn rollout with tools (`rollout.multi_turn.enable`).
    turns: Option<tools::Turns>,
}

impl Plan {
    fn read(m: &mut Mapper) -> Plan {
        let estimator = m
            .text("algorithm.adv_estimator")
            .unwrap_or_else(|| "gae".into());
        let adv_kind = advantage::kind(m, &estimator);
        let filter = m.flag("algorithm.filter_groups.enable");
        let overlong = reward::overlong_prefix(m);
        let train_batch = m.int("data.train_batch_size").unwrap_or(1);
        let turns = tools::read(m);
        let gen_batch = if filter {
            m.int("data.gen_batch_size").unwrap_or(train_batch)
        } else {
            train_batch
        };
        Plan {
            adv_kind,
            gae: adv_kind == "advantage.gae",
            kl: m.flag(&format!("{ACTOR}.use_kl_loss")),
            filter,
            overlong,
            temperature: m.float(&format!("{ROLLOUT}.temperature")).unwrap_or(1.0),
            train_files: string_list(m.v("data.train_files")),
            val_files: string_list(m.v("data.val_files")),
            train_batch,
            gen_batch,
            response_length: m
                .int(&format!("{ROLLOUT}.response_length"))
                .or_else(|| m.int("data.max_response_length"))
                .unwrap_or(512),
            estimator,
            turns,
        }
    }

    /// The optimal token baseline (plain or multi-turn), which reads Σπ² from the old policy.
    fn otb(&self) -> bool {
        matches!(
            self.adv_kind,
            "advantage.optimal_token_baseline" | "advantage.tir_optimal_token_baseline"
        )
    }

    /// `temperature` on a node that scores or trains on the rollouts' logits, when verl's
    /// rollout temperature is not 1.
    fn logits_temperature(&self, s: &mut Section) {
        if self.temperature != 1.0 {
            s.set(
                "temperature",
                t_f64(self.temperature),
                &format!("{ROLLOUT}.temperature"),
            );
        }
    }
}

/// Where the reward stage's outputs are read from (after shaping and filtering).
struct Wiring {
    scores: String,
    rollouts: String,
}

/// The sections in the graph's order.
fn build(m: &mut Mapper) {
    let plan = Plan::read(m);
    trainer::run(m, &plan);
    trainer::models(m, &plan);
    data::data(m, &plan);
    data::rollout(m, &plan);
    let wiring = reward::reward(m, &plan);
    scoring::scoring(m, &plan, &wiring.rollouts);
    advantage::remax_baseline(m, &plan);
    advantage::advantage(m, &plan, &wiring.scores);
    update::critic(m, &plan, &wiring.rollouts);
    update::actor(m, &plan, &wiring.rollouts);
    trainer::eval(m, &plan);
}
