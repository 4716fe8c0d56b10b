//! The `model` resource kind: `[models.NAME]` sections of a graph.
//!
//! ```toml
//! [models.policy]
//! path = "assets/tiny-qwen2-vl"   # a Hugging Face model directory
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
//! Checkpoints ([`ResourceKind::save`]) write `model/` in the Hugging Face layout (config.json +
//! safetensors, loadable by transformers and by this kind), `optimizer.safetensors` (AdamW moments)
//! and `state.json` (counters). A frozen copy (`from`) saves nothing: the engine builds every
//! resource from the graph before it restores a checkpoint, so the copy is taken from the source's
//! initial weights again.
//!
//! Load-time checks: the directory exists and holds `config.json`; the tokenizer's vocabulary fits
//! the model's embedding table (a mismatch means tokenizer and weights come from different models).

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{Context, Result, anyhow, bail, ensure};
use burn::module::{AutodiffModule, Module};
use flowrl_engine::{
    BuildContext, DeviceSpec, Diagnostic, ParamSpec, Params, ResourceKind, ResourceValue,
    ValidateCtx,
};
use flowrl_models::Model;
use flowrl_models::weights::Precision;
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::backend::{BackendKind, FlowBackend, on_backend};
use crate::optim::AdamW;

/// Counters of the optimizer steps applied to a model (saved with checkpoints).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateCounters {
    /// Optimizer steps applied.
    pub optimizer_steps: u64,
    /// Optimizer steps skipped because the loss or the gradient norm was not finite.
    pub skipped_steps: u64,
}

/// The mutable part of a model resource, on backend `B`.
pub struct ModelState<B: FlowBackend> {
    /// The weights in f32 (the master weights under mixed precision), or in `precision` for a
    /// frozen copy (it is never updated).
    pub model: Model<B>,
    /// Created by the first update node that trains this model; its moments are f32.
    pub optimizer: Option<AdamW<B>>,
    pub counters: UpdateCounters,
    pub device: B::Device,
    /// The precision of the forward passes' weights and activations.
    pub precision: Precision,
}

impl<B: FlowBackend> ModelState<B> {
    /// A model on `device`, computing in `precision`, with no optimizer state yet.
    pub fn new(model: Model<B>, device: B::Device, precision: Precision) -> Self {
        Self {
            model,
            optimizer: None,
            counters: UpdateCounters::default(),
            device,
            precision,
        }
    }

    /// The model without autodiff in the compute precision (generation, log-probs without
    /// gradients).
    pub fn inference_model(&self) -> Model<B::InnerBackend> {
        compute_view(&self.model.valid(), self.precision)
    }
}

/// The weights a forward pass computes with: `model` itself in f32, else a cast of it (under
/// autodiff a recorded cast, whose gradients reach `model`'s f32 weights). Mixed precision as in
/// verl's FSDP actor: parameters, activations and matmuls in bf16; norms, softmax and logits in
/// f32 (the models compute those in f32 whatever the weights' dtype); master weights, gradients
/// and AdamW moments in f32.
pub fn compute_view<B: burn::prelude::Backend>(model: &Model<B>, precision: Precision) -> Model<B> {
    match precision {
        Precision::F32 => model.clone(),
        other => model.clone().cast(other),
    }
}

/// A built `model` resource.
pub struct ModelResource {
    /// The resource's name in the graph.
    pub name: String,
    /// The Hugging Face directory the weights, tokenizer and processor come from.
    pub dir: PathBuf,
    /// False for frozen copies (`from = ...`): update nodes refuse to train them.
    pub trainable: bool,
    /// `tokenizer.json` of `dir`, when present.
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// The device the weights live on.
    pub device: DeviceSpec,
    backend: BackendKind,
    /// A `Mutex<ModelState<B>>` for the backend `backend` names.
    state: Box<dyn Any + Send + Sync>,
}

impl ModelResource {
    /// Loads a Hugging Face directory onto `device` (see the module doc for the checks), to
    /// compute in `precision` (`None`: the backend's default). With `random_seed`, the weights
    /// are not read: they are drawn from the directory's config.json (`Model::random`), which is
    /// how the tiny default model starts its SFT warm start.
    pub fn load(
        name: &str,
        dir: &Path,
        trainable: bool,
        random_seed: Option<u64>,
        device: DeviceSpec,
        precision: Option<Precision>,
    ) -> Result<Self> {
        ensure!(
            dir.is_dir(),
            "model `{name}`: directory `{}` does not exist",
            dir.display()
        );
        ensure!(
            dir.join("config.json").is_file(),
            "model `{name}`: `{}` has no config.json (not a Hugging Face model directory)",
            dir.display()
        );
        // The tokenizer is checked against config.json before any weight is read.
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("config.json")).with_context(|| {
                format!("model `{name}`: reading {}/config.json", dir.display())
            })?,
        )
        .with_context(|| format!("model `{name}`: parsing {}/config.json", dir.display()))?;
        let model_vocab = config
            .get("text_config")
            .and_then(|t| t.get("vocab_size"))
            .or_else(|| config.get("vocab_size"))
            .and_then(|v| v.as_u64());
        let tokenizer = if dir.join("tokenizer.json").is_file() {
            let t = flowrl_datasets::encoder::load_tokenizer(dir)?;
            let vocab = t.get_vocab_size(true);
            if let Some(model_vocab) = model_vocab {
                ensure!(
                    vocab as u64 <= model_vocab,
                    "model `{name}`: the tokenizer in {} has {vocab} tokens but the model's vocabulary \
                     (config.json vocab_size) has {model_vocab}: tokenizer and weights do not belong together",
                    dir.display()
                );
            }
            Some(Arc::new(t))
        } else {
            None
        };
        on_backend!(BackendKind::of(device)?, B => {
            let burn_device = B::device(device).with_context(|| format!("model `{name}`"))?;
            let precision = precision.unwrap_or_else(B::default_precision);
            let dtype = precision.dtype();
            ensure!(
                <B as burn::prelude::Backend>::supports_dtype(&burn_device, dtype),
                "model `{name}`: {device} does not compute in {dtype:?} (precision = \"{}\"); \
                 use precision = \"f32\"",
                precision_name(precision)
            );
            let model = match random_seed {
                None => Model::<B>::load(dir, &burn_device)
                    .with_context(|| format!("model `{name}`: loading {}", dir.display()))?,
                Some(seed) => {
                    let config = std::fs::read_to_string(dir.join("config.json"))?;
                    Model::<B>::random(&config, &burn_device, seed).with_context(|| {
                        format!("model `{name}`: random init from {}", dir.display())
                    })?
                }
            };
            let state = ModelState::new(model, burn_device, precision);
            Ok(Self::from_state(name, dir, trainable, tokenizer, device, state))
        })
    }

    /// Wraps the state of an already built model on `device`.
    pub fn from_state<B: FlowBackend>(
        name: &str,
        dir: &Path,
        trainable: bool,
        tokenizer: Option<Arc<Tokenizer>>,
        device: DeviceSpec,
        state: ModelState<B>,
    ) -> Self {
        Self {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            trainable,
            tokenizer,
            device,
            backend: B::KIND,
            state: Box::new(Mutex::new(state)),
        }
    }

    /// The backend the weights live on.
    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    /// A frozen copy of this resource's current weights, held in its compute precision (a
    /// frozen model needs no f32 masters).
    pub fn frozen_copy(&self, name: &str) -> Result<Self> {
        on_backend!(self.backend, B => {
            let s = self.lock::<B>()?;
            let precision = s.precision;
            let model = compute_view(&s.model, precision).no_grad();
            #[allow(clippy::clone_on_copy)] // the CPU's device is Copy, the GPUs' are not
            let burn_device = s.device.clone();
            drop(s);
            let state = ModelState::new(model, burn_device, precision);
            Ok(Self::from_state(name, &self.dir, false, self.tokenizer.clone(), self.device, state))
        })
    }

    /// Exclusive access to the model and its optimizer on backend `B` (an error when the model
    /// lives on another backend).
    pub fn lock<B: FlowBackend>(&self) -> Result<MutexGuard<'_, ModelState<B>>> {
        let state = self
            .state
            .downcast_ref::<Mutex<ModelState<B>>>()
            .ok_or_else(|| {
                anyhow!(
                    "model `{}` lives on {} ({:?} backend), not on the {:?} backend",
                    self.name,
                    self.device,
                    self.backend,
                    B::KIND
                )
            })?;
        // A panic while holding the lock leaves a model that is still usable for saving.
        Ok(state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The tokenizer, or an error naming the model directory.
    pub fn tokenizer(&self) -> Result<&Arc<Tokenizer>> {
        self.tokenizer.as_ref().ok_or_else(|| {
            anyhow!(
                "model `{}`: {} has no tokenizer.json (needed to decode responses)",
                self.name,
                self.dir.display()
            )
        })
    }

    /// Writes the checkpoint files into `dir` (see the module doc).
    pub fn save_to(&self, dir: &Path) -> Result<()> {
        if !self.trainable {
            return Ok(());
        }
        on_backend!(self.backend, B => {
            let s = self.lock::<B>()?;
            s.model.save(&dir.join("model"), None)?;
            if let Some(opt) = &s.optimizer {
                opt.save(&dir.join("optimizer.safetensors"))?;
            }
            std::fs::write(
                dir.join("state.json"),
                serde_json::to_string_pretty(&s.counters)?,
            )?;
        });
        for file in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "preprocessor_config.json",
        ] {
            let src = self.dir.join(file);
            if src.is_file() {
                std::fs::copy(&src, dir.join("model").join(file))
                    .with_context(|| format!("copying {}", src.display()))?;
            }
        }
        Ok(())
    }

    /// Restores what [`ModelResource::save_to`] wrote.
    pub fn load_from(&self, dir: &Path) -> Result<()> {
        if !self.trainable {
            return Ok(());
        }
        on_backend!(self.backend, B => {
            let mut s = self.lock::<B>()?;
            #[allow(clippy::clone_on_copy)] // the CPU's device is Copy, the GPUs' are not
            let device = s.device.clone();
            s.model = Model::<B>::load(&dir.join("model"), &device)
                .with_context(|| format!("model `{}`: restoring {}", self.name, dir.display()))?;
            let opt_path = dir.join("optimizer.safetensors");
            if opt_path.is_file() {
                let mut opt = s
                    .optimizer
                    .take()
                    .unwrap_or_else(|| AdamW::new(Default::default()));
                opt.load(&opt_path, &device)?;
                s.optimizer = Some(opt);
            }
            let state = dir.join("state.json");
            if state.is_file() {
                s.counters = serde_json::from_str(&std::fs::read_to_string(&state)?)
                    .with_context(|| format!("parsing {}", state.display()))?;
            }
        });
        Ok(())
    }
}

/// The `model` resource kind (`[models.*]`).
pub struct ModelKind;

#[derive(Deserialize)]
struct ModelParams {
    path: Option<PathBuf>,
    from: Option<String>,
    trainable: Option<bool>,
    precision: Option<String>,
    init: String,
}

/// The name a graph gives `precision`.
fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::F32 => "f32",
        Precision::BF16 => "bf16",
        Precision::F16 => "f16",
    }
}

impl ResourceKind for ModelKind {
    fn name(&self) -> &str {
        "model"
    }

    fn section(&self) -> &str {
        "models"
    }

    fn doc(&self) -> &str {
        "A model loaded from a Hugging Face directory (`path`), or a frozen copy of another model \
         resource's initial weights (`from`). Checkpoints save trainable models in the Hugging Face \
         layout plus their AdamW state."
    }

    fn params(&self) -> Vec<ParamSpec> {
        vec![
            ParamSpec::path("path").doc("Hugging Face model directory (config.json, safetensors, tokenizer)"),
            ParamSpec::resource("from", "model").doc("copy this model resource's initial weights, frozen"),
            ParamSpec::bool("trainable").doc("whether update nodes may train it (default: true for `path`, false for `from`)"),
            ParamSpec::one_of("init", &["pretrained", "random"])
                .default("pretrained")
                .doc("`random`: ignore the weight files and draw weights from config.json (seeded by the run seed)"),
            ParamSpec::one_of("precision", &["f32", "bf16"])
                .doc("precision of the forward passes: bf16 = mixed precision (bf16 weights, activations and matmuls; f32 norms, softmax, log-probs, losses, master weights and AdamW moments); default f32 on CPU and Vulkan, bf16 on CUDA"),
        ]
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let p = ctx.params();
        let mut out = Vec::new();
        match (p.get_str("path"), p.get_str("from")) {
            (Some(_), Some(_)) => out.push(ctx.error(
                "from",
                "give either `path` (a model directory) or `from` (a copy of another model), not both",
            )),
            (None, None) => out.push(ctx.error(
                "path",
                "a model needs `path = \"<Hugging Face directory>\"` or `from = \"<other model>\"`",
            )),
            (Some(path), None) => {
                let dir = Path::new(path);
                if !dir.is_dir() {
                    out.push(ctx.error("path", format!("model directory `{path}` does not exist")));
                } else if !dir.join("config.json").is_file() {
                    out.push(ctx.error(
                        "path",
                        format!("`{path}` has no config.json: not a Hugging Face model directory"),
                    ));
                }
            }
            (None, Some(_)) => {
                if p.get_bool("trainable") == Some(true) {
                    out.push(ctx.error("trainable", "a `from` copy is frozen; load the directory with `path` to train it"));
                }
            }
        }
        out
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<ResourceValue> {
        let p: ModelParams = params.parse()?;
        let resource = match (p.path, p.from) {
            (Some(path), None) => {
                let seed = (p.init == "random").then(|| ctx.init_seed());
                let trainable = p.trainable.unwrap_or(true);
                let precision = p.precision.as_deref().map(Precision::parse).transpose()?;
                ModelResource::load(&ctx.node, &path, trainable, seed, ctx.device, precision)?
            }
            (None, Some(from)) => {
                let source = ctx.resource::<ModelResource>(&from)?;
                source.frozen_copy(&ctx.node)?
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
