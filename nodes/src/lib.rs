//! flowrl-nodes: the built-in node kinds (one kind per file) and the model/optimizer resources.
//!
//! Values on edges are defined in [`values`]; node kinds register with the engine's registry.
//!
//! The main job's pieces: the `model` resource kind ([`model_resource`]), the node kinds
//! `rollout`, `logprob`, `update.ppo`, `update.sft` and `eval`, and what they share:
//! [`sequences`] (response log-probs in chunks), [`train`] (optimizer parameters and the guarded
//! step), [`optim`] (AdamW, clipping, schedules with PyTorch/verl semantics), [`backend`].

pub mod advantage_gdpo;
pub mod advantage_gpg;
pub mod advantage_grpo;
pub mod advantage_grpo_passk;
pub mod advantage_opo;
pub mod advantage_optimal_token_baseline;
pub mod advantage_reinforce_pp;
pub mod advantage_reinforce_pp_baseline;
pub mod advantage_remax;
pub mod advantage_rloo;
pub mod advantage_support;
pub mod advantage_tir_optimal_token_baseline;
pub mod allocator;
pub mod backend;
pub mod data_parallel;
pub mod dataset_parquet;
pub mod debug_print;
pub mod eval;
pub mod exec;
pub mod logprob;
pub mod model_resource;
pub mod optim;
pub mod reward_combined;
pub mod reward_exact_match;
pub mod reward_format;
pub mod reward_geo3k;
pub mod reward_support;
pub mod rollout;
pub mod sequences;
pub mod sink_jsonl;
pub mod train;
pub mod update_ppo;
pub mod update_sft;
pub mod validate;
pub mod values;

pub use values::{
    AdvantageBatch, PromptBatch, RolloutBatch, ScoreBatch, TokenLogProbs, TokenMatrix,
};
