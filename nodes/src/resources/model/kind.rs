//! The `model` resource kind: the `[models.*]` parameters, their validation, the plan of what a
//! model takes, the build, and saving and restoring checkpoints.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail, ensure};
use flowrl_engine::{
    BuildContext, Diagnostic, Item, ParamChoice, ParamSchema, ParamSpec, Params, Place, PlanCtx,
    ResourceKind, ResourcePlan, ResourceValue, ValidateCtx,
};
use flowrl_models::hub::resolve_model_path;
use flowrl_models::lora::{AdapterInit, LoraConfig, read_peft_adapter, read_peft_config};
use flowrl_models::shape::ModelShape;
use flowrl_models::weights::Precision;
use serde::Deserialize;

use crate::runtime::backend::default_precision_of;
use crate::sizing::{PlannedModel, masters_sharded_over, params_text};

use super::resource::ModelResource;

/// The `model` resource kind (`[models.*]`).
pub struct ModelKind;

/// `init = ...`: where the initial weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ParamChoice)]
pub(crate) enum ModelInit {
    Pretrained,
    Random,
}

/// The parameters of a `[models.*]` resource.
#[derive(Deserialize, Params)]
pub(crate) struct ModelParams {
    /// Hugging Face model directory (config.json, safetensors, tokenizer), or a hub id
    /// (`org/name`, `org/name@revision`) found in the local Hugging Face cache
    pub(crate) path: Option<PathBuf>,
    /// copy this model resource's initial weights, frozen (of a LoRA model: its base, the same
    /// weights with the adapters off)
    #[param(resource = "model")]
    pub(crate) from: Option<String>,
    /// whether update nodes may train it (default: true for `path`, false for `from`)
    pub(crate) trainable: Option<bool>,
    /// `random`: ignore the weight files and draw weights from config.json (seeded by the run
    /// seed)
    #[param(default = ModelInit::Pretrained)]
    pub(crate) init: ModelInit,
    /// train LoRA adapters instead of every weight: the base stays frozen in the compute
    /// precision, only the adapters (f32) have gradients and optimizer state; checkpoints hold
    /// the adapter in PEFT's layout
    #[param(switch)]
    pub(crate) lora: Option<LoraParams>,
    /// a value model (PPO's critic, verl critic.model; `reward.model`'s reward model): a linear
    /// value head `score` [1, hidden] on the final hidden states, read from the directory's
    /// value_head.safetensors or its `score.weight` (a `*ForSequenceClassification` checkpoint)
    /// when present, else drawn fresh (N(0, initializer_range²), bias 0, seeded); trained with
    /// the backbone by `update.critic`
    #[param(default = false)]
    pub(crate) value_head: bool,
    /// precision of the forward passes: bf16 = mixed precision (bf16 weights, activations and
    /// matmuls; f32 norms, softmax, log-probs, losses, master weights and AdamW moments); default
    /// f32 on CPU and Vulkan, bf16 on CUDA
    #[param(one_of = &[Precision::F32, Precision::BF16].map(Precision::name))]
    pub(crate) precision: Option<String>,
}

/// The `lora` table (PEFT's names: `r` → `rank`, `lora_alpha` → `alpha`, `lora_dropout` →
/// `dropout`; defaults as verl's `actor_rollout_ref.model.lora_*`).
#[derive(Deserialize, Params)]
pub(crate) struct LoraParams {
    /// the adapters' rank r (PEFT `r`, verl `lora_rank`)
    #[param(min = 1.0)]
    pub(crate) rank: Option<usize>,
    /// scaling alpha / rank (PEFT `lora_alpha`)
    #[param(default = 16.0, gt = 0.0)]
    pub(crate) alpha: f64,
    /// dropout on the adapters' input while training (PEFT `lora_dropout`)
    #[param(default = 0.0, min = 0.0, lt = 1.0)]
    pub(crate) dropout: f64,
    /// linear modules to adapt, matched by name suffix as PEFT does ("q_proj" adapts every
    /// *.q_proj); "all-linear" = every linear but lm_head; the vision tower only when an entry
    /// names it ("visual." / "model.vision_tower." prefixes)
    #[param(default = serde_json::json!([flowrl_models::lora::ALL_LINEAR]))]
    pub(crate) target_modules: Vec<String>,
    /// start from this PEFT adapter directory (adapter_config.json + adapter_model.safetensors);
    /// it sets rank, alpha, dropout and target_modules
    pub(crate) adapter: Option<PathBuf>,
}

impl LoraParams {
    /// The adapters' configuration and how to fill them (`seed` for fresh ones).
    fn resolve(self, seed: u64) -> Result<(LoraConfig, AdapterInit)> {
        match self.adapter {
            Some(dir) => {
                let (config, stored) = read_peft_adapter(&dir)?;
                Ok((config, AdapterInit::Stored(stored)))
            }
            None => {
                let config = LoraConfig {
                    rank: self.rank.context("lora needs `rank` (or `adapter`)")?,
                    alpha: self.alpha,
                    dropout: self.dropout,
                    target_modules: self.target_modules,
                };
                config.validate()?;
                Ok((config, AdapterInit::Fresh(seed)))
            }
        }
    }
}

/// Host bytes a parsed `tokenizer.json` takes per byte of the file (its vocabulary and merges
/// in hash maps, with the strings they hold).
const TOKENIZER_EXPANSION: u64 = 4;

impl ResourceKind for ModelKind {
    fn name(&self) -> &str {
        "model"
    }

    fn section(&self) -> &str {
        "models"
    }

    fn doc(&self) -> &str {
        "A model loaded from a Hugging Face directory (`path`), or a frozen copy of another model \
         resource's initial weights (`from`); `lora` trains adapters on a frozen base. Checkpoints \
         save trainable models in the Hugging Face layout (LoRA models: the adapter in PEFT's \
         layout) plus their AdamW state."
    }

    fn params(&self) -> Vec<ParamSpec> {
        ModelParams::param_specs()
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let p = match ctx.parse::<ModelParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        let mut out = Vec::new();
        match (&p.path, &p.from) {
            (Some(_), Some(_)) => out.push(ctx.error(
                "from",
                "give either `path` (a model directory) or `from` (a copy of another model), not both",
            )),
            (None, None) => out.push(ctx.error(
                "path",
                "a model needs `path = \"<Hugging Face directory>\"` or `from = \"<other model>\"`",
            )),
            (Some(dir), None) => match resolve_model_path(dir) {
                Err(e) => out.push(ctx.error("path", format!("model directory {e:#}"))),
                Ok(dir) if !dir.is_dir() => out.push(ctx.error(
                    "path",
                    format!("model directory `{}` does not exist", dir.display()),
                )),
                Ok(dir) if !dir.join("config.json").is_file() => out.push(ctx.error(
                    "path",
                    format!(
                        "`{}` has no config.json: not a Hugging Face model directory",
                        dir.display()
                    ),
                )),
                Ok(_) => {}
            },
            (None, Some(_)) => {
                if p.trainable == Some(true) {
                    out.push(ctx.error("trainable", "a `from` copy is frozen; load the directory with `path` to train it"));
                }
                if p.lora.is_some() {
                    out.push(ctx.error("lora", "a `from` copy of a LoRA model already is its base (adapters off); give `lora` to the model it copies"));
                }
                if p.value_head {
                    out.push(ctx.error("value_head", "a `from` copy is frozen and has no value head; load the directory with `path` to make a value model"));
                }
            }
        }
        if let Some(me) = ctx.resource(ctx.name())
            && let Some(device) = me.pinned_device()
        {
            let lora_source = me
                .follow("from")
                .filter(|s| s.params().get("lora").is_some() && s.device() != device);
            if p.from.is_none() && p.trainable != Some(false) {
                out.push(
                    ctx.error(
                        "device",
                        format!(
                            "a trained model lives on the run's first device, where its update \
                             runs; `device` places frozen models (a judge, a reward model, a \
                             reference) on {device}"
                        ),
                    )
                    .with_help("set `trainable = false`, or remove `device`"),
                );
            } else if let Some(source) = lora_source {
                out.push(ctx.error(
                    "device",
                    format!(
                        "a copy of the LoRA model `{}` is its base with the adapters off, sharing \
                         its weights on {}: it cannot live on {device}",
                        source.name(),
                        source.device()
                    ),
                ));
            }
        }
        if p.lora.is_some() && p.value_head {
            out.push(ctx.error(
                "value_head",
                "a value model with LoRA adapters is not supported yet: train the critic's full weights (drop `lora`)",
            ));
        }
        if let Some(lora) = &p.lora {
            match (lora.rank, &lora.adapter) {
                (None, None) => out.push(ctx.error(
                    "lora",
                    "lora needs `rank = <r>` (e.g. 16), or `adapter = \"<PEFT adapter directory>\"` to start from one",
                )),
                (Some(_), Some(_)) => out.push(ctx.error(
                    "lora.rank",
                    "give either `rank` (fresh adapters) or `adapter` (whose adapter_config.json sets the rank), not both",
                )),
                (None, Some(dir)) => {
                    if !dir.join("adapter_config.json").is_file() {
                        out.push(ctx.error(
                            "lora.adapter",
                            format!(
                                "`{}` has no adapter_config.json: not a PEFT adapter directory",
                                dir.display()
                            ),
                        ));
                    }
                }
                (Some(_), None) => {}
            }
        }
        out
    }

    /// Weights: a trainable model's f32 masters (a LoRA model's base in the compute precision
    /// and its f32 adapters), a frozen model's weights in the compute precision, nothing for a
    /// `from` copy of a LoRA model (it shares the base); the tokenizer on the host. The shape is
    /// a shape-only build of `config.json` ([`ModelShape`]).
    fn footprint(&self, ctx: &PlanCtx) -> Option<ResourcePlan> {
        let p = ctx.parse::<ModelParams>().ok()?;
        let mut plan = ResourcePlan::default();
        let f = &mut plan.footprint;
        let source = match &p.from {
            Some(from) => {
                let Some(source) = ctx.shape::<PlannedModel>(from) else {
                    f.not_sized(format!("its source `{from}` could not be sized"));
                    return Some(plan);
                };
                let mut copy = (*source).clone();
                copy.trainable = false;
                if source.lora {
                    copy.lora = false;
                    plan.shape = Some(Arc::new(copy));
                    return Some(plan);
                }
                f.resident(Item::new(
                    format!(
                        "frozen copy of `{from}` ({}, {})",
                        params_text(copy.shape.params),
                        copy.precision_name()
                    ),
                    copy.shape.params * copy.element(),
                    Place::Device,
                ));
                plan.shape = Some(Arc::new(copy));
                return Some(plan);
            }
            None => resolve_model_path(p.path.as_ref()?).ok()?,
        };
        let config = match std::fs::read_to_string(source.join("config.json")) {
            Ok(c) => c,
            Err(e) => {
                f.not_sized(format!("{}/config.json: {e}", source.display()));
                return Some(plan);
            }
        };
        let precision = match p.precision.as_deref().map(Precision::parse) {
            Some(Ok(p)) => p,
            _ => default_precision_of(ctx.device()),
        };
        let lora = match &p.lora {
            None => None,
            Some(l) => match (&l.adapter, l.rank) {
                (Some(dir), _) => match read_peft_config(dir) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        f.not_sized(format!("its adapter: {e:#}"));
                        return Some(plan);
                    }
                },
                (None, Some(rank)) => Some(LoraConfig {
                    rank,
                    alpha: l.alpha,
                    dropout: l.dropout,
                    target_modules: l.target_modules.clone(),
                }),
                (None, None) => None,
            },
        };
        let shape = match ModelShape::of_config(&config, precision, lora.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                f.not_sized(format!("{}/config.json: {e:#}", source.display()));
                return Some(plan);
            }
        };
        let trainable = p.trainable.unwrap_or(true);
        let masters_over = trainable
            .then(|| masters_sharded_over(ctx, ctx.name(), precision))
            .flatten();
        let model = PlannedModel {
            precision,
            trainable,
            lora: lora.is_some(),
            masters_over,
            dir: source.display().to_string(),
            shape,
        };
        let weights = model.shape.params;
        if model.lora {
            f.resident(
                Item::new(
                    format!(
                        "frozen base ({}, {})",
                        params_text(weights),
                        model.precision_name()
                    ),
                    weights * model.element(),
                    Place::Device,
                )
                .hint("precision = \"bf16\" on the model"),
            );
            f.resident(Item::new(
                format!(
                    "LoRA adapters ({}, f32)",
                    params_text(model.shape.adapter_params)
                ),
                model.shape.adapter_params * 4,
                Place::Device,
            ));
        } else if trainable {
            let what = match masters_over {
                Some(w) => format!(
                    "weights ({}, {}) and the f32 masters of 1/{w} of them (ZeRO)",
                    params_text(weights),
                    model.precision_name()
                ),
                None => format!("master weights ({}, f32)", params_text(weights)),
            };
            f.resident(
                Item::new(what, model.trained_weight_bytes(), Place::Device)
                    .hint("train LoRA adapters (`lora = { rank = 16 }`) instead of every weight"),
            );
        } else {
            f.resident(
                Item::new(
                    format!(
                        "weights ({}, {})",
                        params_text(weights),
                        model.precision_name()
                    ),
                    weights * model.element(),
                    Place::Device,
                )
                .hint("precision = \"bf16\" on the model"),
            );
        }
        if p.value_head {
            f.resident(Item::new(
                "value head (f32)",
                model.shape.hidden as u64 * 4,
                Place::Device,
            ));
        }
        if let Ok(meta) = std::fs::metadata(source.join("tokenizer.json")) {
            f.resident(Item::new(
                "tokenizer (tokenizer.json, parsed)",
                meta.len() * TOKENIZER_EXPANSION,
                Place::Host,
            ));
        }
        plan.shape = Some(Arc::new(model));
        Some(plan)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<ResourceValue> {
        let p: ModelParams = params.parse()?;
        let resource = match (p.path, p.from) {
            (Some(path), None) => {
                let path = resolve_model_path(&path)
                    .with_context(|| format!("model `{}`: path", ctx.node))?;
                let seed = (p.init == ModelInit::Random).then(|| ctx.init_seed());
                let trainable = p.trainable.unwrap_or(true);
                let precision = p.precision.as_deref().map(Precision::parse).transpose()?;
                let lora = p
                    .lora
                    .map(|l| l.resolve(flowrl_engine::derive_seed(ctx.init_seed(), 0, "lora")))
                    .transpose()
                    .with_context(|| format!("model `{}`: lora", ctx.node))?;
                ensure!(
                    !(p.value_head && lora.is_some()),
                    "model `{}`: a value model with LoRA adapters is not supported yet",
                    ctx.node
                );
                if p.value_head {
                    ModelResource::load_value_model(
                        &ctx.node,
                        &path,
                        trainable,
                        seed,
                        ctx.device,
                        precision,
                        flowrl_engine::derive_seed(ctx.init_seed(), 0, "value_head"),
                    )?
                } else {
                    ModelResource::load_with_lora(
                        &ctx.node, &path, trainable, seed, ctx.device, precision, lora,
                    )?
                }
            }
            (None, Some(from)) => {
                let source = ctx.resource::<ModelResource>(&from)?;
                source.frozen_copy(&ctx.node, ctx.device)?
            }
            _ => bail!(
                "model `{}` needs exactly one of `path` and `from`",
                ctx.node
            ),
        };
        Ok(Arc::new(resource))
    }

    fn save(&self, value: &(dyn Any + Send + Sync), dir: &Path) -> Result<()> {
        downcast(value)?.save_to(dir)
    }

    fn load(&self, value: &(dyn Any + Send + Sync), dir: &Path) -> Result<()> {
        downcast(value)?.load_from(dir)
    }
}

fn downcast(value: &(dyn Any + Send + Sync)) -> Result<&ModelResource> {
    value
        .downcast_ref::<ModelResource>()
        .ok_or_else(|| anyhow!("the `model` resource kind was given a value of another kind"))
}

flowrl_engine::register_resource_kind!(ModelKind);
