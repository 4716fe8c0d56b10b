//! The `model` resource kind: `[models.NAME]` sections of a graph.
//!
//! ```toml
//! [models.policy]
//! path = "assets/tiny-qwen2-vl"   # a Hugging Face model directory, or a hub id in the local
//!                                 # cache ("Qwen/Qwen2.5-VL-3B-Instruct", "org/name@revision")
//! [models.reference]
//! from = "policy"                 # a frozen copy of another model resource (its initial weights)
//! ```
//!
//! A model resource holds the loaded [`Model`] (on the training backend, so update nodes can
//! differentiate it; other nodes use its non-autodiff view, `AutodiffModule::valid`), the
//! tokenizer of its directory (to decode responses), its optimizer state once an update node
//! created one, and update counters. Nodes share it through the engine's resources and lock it for
//! the time of their work.
//!
//! LoRA (`lora = { rank = 16, alpha = 32, target_modules = ["q_proj", ...] }`, see
//! [`flowrl_models::lora`] for the semantics): the base weights are loaded frozen in the compute
//! precision and only the adapters (f32) are trained; a `from` copy of a LoRA model is the same
//! weights with the adapters switched off (no second copy), verl's reference for LoRA actors.
//!
//! Checkpoints ([`ResourceKind::save`]) write `model/` in the Hugging Face layout (config.json +
//! safetensors, loadable by transformers and by this kind) — for a LoRA model `adapter/` in PEFT's
//! layout instead —, `optimizer.safetensors` (AdamW moments) and `state.json` (counters). A frozen
//! copy (`from`) saves nothing: the engine builds every resource from the graph before it restores
//! a checkpoint, so the copy is taken from the source's initial weights again. A restore checks
//! `optimizer.safetensors` against the parameters it will update (names, shapes, finite values:
//! [`AdamW::load`]) and refuses another model's state naming the file and the parameter.
//!
//! Load-time checks: the directory exists and holds `config.json`; the tokenizer's vocabulary fits
//! the model's embedding table (a mismatch means tokenizer and weights come from different models).
//!
//! A value model (`value_head = true`, the critic of PPO, verl's `critic.model.path`): the same
//! model with a [`ValueHead`] on its final hidden states ([`flowrl_models::value_head`]), read
//! from the directory's `value_head.safetensors` when it has one (a flowrl checkpoint's `model/`),
//! else from `score.weight` (+ `score.bias`) among its Hugging Face weights (the layout of
//! transformers' `*ForSequenceClassification` / `*ForTokenClassification`, num_labels 1, whose
//! backbone is read without those tensors: [`flowrl_models::value_head::load_backbone`]), and
//! drawn fresh otherwise (transformers' init of `score`, seeded by the run seed). The head is
//! trained with the backbone by `update.critic`, one AdamW over both; checkpoints add
//! `model/value_head.safetensors`.
//!
//! The files: [`resource`] (the built resource and its training state), [`kind`] (the
//! `[models.*]` parameters, their checks, the plan and the build).

mod kind;
mod resource;

pub use crate::train::model_state::{ModelState, UpdateCounters};
pub use kind::ModelKind;
pub(crate) use kind::ModelParams;
pub use resource::ModelResource;
