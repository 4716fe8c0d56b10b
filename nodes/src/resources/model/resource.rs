//! A built `model` resource: the loaded weights with their tokenizer, and the training state
//! update nodes keep in it (see the module doc of [`super`]).

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{Context, Result, anyhow, ensure};
use burn::module::{AutodiffModule, Module};
use flowrl_engine::DeviceSpec;
use flowrl_models::Model;
use flowrl_models::lora::{AdapterInit, LoraConfig, read_peft_adapter};
use flowrl_models::value_head::{
    VALUE_HEAD_FILE, ValueHead, ValueModel, initializer_range, load_backbone,
};
use flowrl_models::weights::Precision;
use tokenizers::Tokenizer;

use crate::runtime::backend::{BackendKind, FlowBackend, on_backend};
use crate::runtime::data_parallel::Replicas;
use crate::train::model_state::ModelState;
use crate::train::optim::AdamW;
use crate::train::replicated::{checkpoint_optimizer, checkpoint_weights};

/// What a loaded model computes on top of its backbone.
enum Top {
    /// Its language-model head.
    LmHead,
    /// The LM head with LoRA adapters (the base weights frozen).
    Lora(LoraConfig, AdapterInit),
    /// A value head, attached after loading: the backbone is read without the head's tensors.
    ValueHead,
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
    /// The adapters' configuration of a LoRA model.
    pub lora: Option<LoraConfig>,
    /// A `from` copy of a LoRA model: the shared weights with the adapters switched off.
    adapters_off: bool,
    /// A value model: its state holds a value head.
    value_head: bool,
    backend: BackendKind,
    /// A `Mutex<ModelState<B>>` for the backend `backend` names (shared by a LoRA model and its
    /// adapter-off copies).
    state: Arc<dyn Any + Send + Sync>,
}

impl ModelResource {
    /// Loads a Hugging Face directory onto `device` (see the module doc for the checks), to
    /// compute in `precision` (`None`: the backend's default). With `random_seed`, the weights
    /// are not read: they are drawn from the directory's config.json (`Model::random`), which is
    /// how the tiny default model starts its SFT warm start.
    /// A trainable model keeps f32 master weights; a frozen one is held in the compute
    /// precision.
    pub fn load(
        name: &str,
        dir: &Path,
        trainable: bool,
        random_seed: Option<u64>,
        device: DeviceSpec,
        precision: Option<Precision>,
    ) -> Result<Self> {
        Self::load_with_lora(name, dir, trainable, random_seed, device, precision, None)
    }

    /// [`ModelResource::load`], with LoRA adapters when `lora` is given: the base weights are
    /// then frozen in the compute precision, and the adapters (f32) filled as `AdapterInit` says.
    pub fn load_with_lora(
        name: &str,
        dir: &Path,
        trainable: bool,
        random_seed: Option<u64>,
        device: DeviceSpec,
        precision: Option<Precision>,
        lora: Option<(LoraConfig, AdapterInit)>,
    ) -> Result<Self> {
        let top = match lora {
            Some((config, init)) => Top::Lora(config, init),
            None => Top::LmHead,
        };
        Self::load_inner(name, dir, trainable, random_seed, device, precision, top)
    }

    /// [`ModelResource::load`] of a value model: the backbone read without the head's tensors of
    /// a Hugging Face classification checkpoint, then [`ModelResource::attach_value_head`] with
    /// `head_seed`.
    pub fn load_value_model(
        name: &str,
        dir: &Path,
        trainable: bool,
        random_seed: Option<u64>,
        device: DeviceSpec,
        precision: Option<Precision>,
        head_seed: u64,
    ) -> Result<Self> {
        let top = Top::ValueHead;
        let mut model =
            Self::load_inner(name, dir, trainable, random_seed, device, precision, top)?;
        model.attach_value_head(head_seed)?;
        Ok(model)
    }

    fn load_inner(
        name: &str,
        dir: &Path,
        trainable: bool,
        random_seed: Option<u64>,
        device: DeviceSpec,
        precision: Option<Precision>,
        top: Top,
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
                precision.name()
            );
            let config_json = || std::fs::read_to_string(dir.join("config.json"));
            let context = || match random_seed {
                None => format!("model `{name}`: loading {}", dir.display()),
                Some(_) => format!("model `{name}`: random init from {}", dir.display()),
            };
            let (model, lora) = match top {
                Top::Lora(config, init) => {
                    let (model, _) = match random_seed {
                        None => Model::<B>::load_adapted(dir, &burn_device, precision, &config, init),
                        Some(seed) => Model::<B>::random_adapted(
                            &config_json()?, &burn_device, seed, precision, &config, init,
                        ),
                    }
                    .with_context(context)?;
                    (model, Some(config))
                }
                Top::LmHead | Top::ValueHead => {
                    let weights = if trainable { Precision::F32 } else { precision };
                    let model = match random_seed {
                        None if matches!(top, Top::ValueHead) => {
                            load_backbone::<B>(dir, &burn_device, weights)
                        }
                        None => Model::<B>::load_with_precision(dir, &burn_device, weights),
                        Some(seed) => Model::<B>::random_with_precision(
                            &config_json()?, &burn_device, seed, weights,
                        ),
                    }
                    .with_context(context)?;
                    (model, None)
                }
            };
            let state = ModelState::new(model, burn_device, precision);
            let mut resource = Self::from_state(name, dir, trainable, tokenizer, device, state);
            resource.lora = lora;
            Ok(resource)
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
            lora: None,
            adapters_off: false,
            value_head: state.value_head.is_some(),
            backend: B::KIND,
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// The backend the weights live on.
    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    /// True for a value model (`value_head = true`).
    pub fn has_value_head(&self) -> bool {
        self.value_head
    }

    /// Gives this model a value head: the one stored in its directory
    /// (`value_head.safetensors`, or `score.*` among its Hugging Face weights), else a fresh one
    /// drawn with `seed` (see the module doc).
    pub fn attach_value_head(&mut self, seed: u64) -> Result<()> {
        let std = initializer_range(&std::fs::read_to_string(self.dir.join("config.json"))?);
        on_backend!(self.backend, B => {
            let mut s = self.lock::<B>()?;
            let hidden = s.model.causal_lm().hidden_size();
            #[allow(clippy::clone_on_copy)] // the CPU's device is Copy, the GPUs' are not
            let device = s.device.clone();
            let stored = ValueHead::load_stored(&self.dir, hidden, &device)
                .with_context(|| format!("model `{}`: value head", self.name))?;
            s.value_head = Some(match stored {
                Some(head) => head,
                None => ValueHead::random(hidden, std, seed, &device),
            });
        });
        self.value_head = true;
        Ok(())
    }

    /// [`ModelResource::inference_model`] on local replica `local` of `replicas` (see
    /// [`ModelState::inference_on`]), with the replica's burn device.
    pub fn inference_model_on<B: FlowBackend>(
        &self,
        replicas: &Replicas,
        local: usize,
    ) -> Result<(Model<B::InnerBackend>, B::Device)> {
        let (model, _, device) = self.lock::<B>()?.inference_on(replicas, local)?;
        Ok((
            if self.adapters_off {
                model.adapters_off()
            } else {
                model
            },
            device,
        ))
    }

    /// [`ModelResource::value_model_inference`] on local replica `local` of `replicas`.
    #[allow(clippy::type_complexity)]
    pub fn value_model_inference_on<B: FlowBackend>(
        &self,
        replicas: &Replicas,
        local: usize,
    ) -> Result<(
        Model<B::InnerBackend>,
        ValueHead<B::InnerBackend>,
        B::Device,
    )> {
        let (model, head, device) = self.lock::<B>()?.inference_on(replicas, local)?;
        let head = head.ok_or_else(|| {
            anyhow!(
                "model `{}` has no value head: declare it with `value_head = true`",
                self.name
            )
        })?;
        Ok((model, head, device))
    }

    /// The backbone and the value head without autodiff, the backbone in the compute precision
    /// (values without gradients); an error for a model without a value head.
    #[allow(clippy::type_complexity)]
    pub fn value_model_inference<B: FlowBackend>(
        &self,
    ) -> Result<(Model<B::InnerBackend>, ValueHead<B::InnerBackend>)> {
        let s = self.lock::<B>()?;
        let head = s.value_head.as_ref().ok_or_else(|| {
            anyhow!(
                "model `{}` has no value head: declare it with `value_head = true`",
                self.name
            )
        })?;
        Ok((s.inference_model(), head.valid()))
    }

    /// A frozen copy of this resource's current weights on `device`, held in its compute
    /// precision (a frozen model needs no f32 masters). Of a LoRA model: its own weights,
    /// shared, with the adapters switched off (the base model), not a copy; it lives on its
    /// source's device.
    pub fn frozen_copy(&self, name: &str, device: DeviceSpec) -> Result<Self> {
        if self.lora.is_some() {
            ensure!(
                device == self.device,
                "model `{name}`: a copy of the LoRA model `{}` is its base with the adapters off, \
                 sharing its weights on {}: it cannot live on {device}",
                self.name,
                self.device
            );
            return Ok(Self {
                name: name.to_string(),
                dir: self.dir.clone(),
                trainable: false,
                tokenizer: self.tokenizer.clone(),
                device: self.device,
                lora: None,
                adapters_off: true,
                value_head: false,
                backend: self.backend,
                state: self.state.clone(),
            });
        }
        on_backend!(self.backend, B => {
            let s = self.lock::<B>()?;
            let precision = s.precision;
            let burn_device = B::device(device).with_context(|| format!("model `{name}`"))?;
            let model = s.model.compute_view(precision).no_grad();
            let model = if burn_device == s.device { model } else { model.to_device(&burn_device) };
            drop(s);
            let state = ModelState::new(model, burn_device, precision);
            Ok(Self::from_state(name, &self.dir, false, self.tokenizer.clone(), device, state))
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

    /// The model without autodiff in the compute precision, as this resource computes it (the
    /// base alone for an adapter-off copy): generation, log-probs without gradients.
    pub fn inference_model<B: FlowBackend>(&self) -> Result<Model<B::InnerBackend>> {
        let model = self.lock::<B>()?.inference_model();
        Ok(if self.adapters_off {
            model.adapters_off()
        } else {
            model
        })
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
            let label = format!("model `{}`", self.name);
            // Sharded masters are put together first; else the model's weights are the masters.
            let whole = checkpoint_weights(&s, &label)?;
            let (model, head) = match &whole {
                Some((m, h)) => (m, h.as_ref()),
                None => (&s.model, s.value_head.as_ref()),
            };
            match &self.lora {
                Some(config) => {
                    let base = std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
                    model.save_adapter(&dir.join("adapter"), config, &base.display().to_string())?
                }
                None => model.save(&dir.join("model"), None)?,
            }
            if let Some(head) = head {
                head.save(&dir.join("model").join(VALUE_HEAD_FILE))?;
            }
            drop(whole);
            if let Some(opt) = checkpoint_optimizer(&s, &label)? {
                opt.save(&dir.join("optimizer.safetensors"))?;
            }
            std::fs::write(
                dir.join("state.json"),
                serde_json::to_string_pretty(&s.counters)?,
            )?;
        });
        if self.lora.is_none() {
            flowrl_models::model::copy_side_files(&self.dir, &dir.join("model"))?;
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
            let restoring = || format!("model `{}`: restoring {}", self.name, dir.display());
            s.model = match &self.lora {
                Some(config) => {
                    let (stored_config, stored) =
                        read_peft_adapter(&dir.join("adapter")).with_context(restoring)?;
                    ensure!(
                        stored_config.rank == config.rank && stored_config.alpha == config.alpha,
                        "model `{}`: the checkpoint's adapter has rank {} and alpha {}, the graph says rank {} and alpha {}",
                        self.name, stored_config.rank, stored_config.alpha, config.rank, config.alpha
                    );
                    s.model.clone().set_adapters(stored).with_context(restoring)?
                }
                None => Model::<B>::load(&dir.join("model"), &device).with_context(restoring)?,
            };
            if s.value_head.is_some() {
                let hidden = s.model.causal_lm().hidden_size();
                let path = dir.join("model").join(VALUE_HEAD_FILE);
                s.value_head = Some(ValueHead::load(&path, hidden, &device).with_context(restoring)?);
            }
            let opt_path = dir.join("optimizer.safetensors");
            if opt_path.is_file() {
                let mut opt = s
                    .optimizer
                    .take()
                    .unwrap_or_else(|| AdamW::new(Default::default()));
                // Checked against the module the optimizer updates (of a value model: backbone
                // and head, as `update.critic` steps them).
                match &s.value_head {
                    Some(head) => {
                        let critic = ValueModel { model: s.model.clone(), head: head.clone() };
                        opt.load(&opt_path, &critic, &device)
                    }
                    None => opt.load(&opt_path, &s.model, &device),
                }
                .with_context(|| format!("model `{}`", self.name))?;
                s.optimizer = Some(opt);
            }
            // The replicas' copies are made again from the restored weights, and the restored
            // moments handed out anew at the next step.
            s.version += 1;
            for c in s.copies.iter_mut().flatten() {
                c.optimizer = None;
            }
            s.sharding = None;
            let state = dir.join("state.json");
            if state.is_file() {
                s.counters = serde_json::from_str(&std::fs::read_to_string(&state)?)
                    .with_context(|| format!("parsing {}", state.display()))?;
            }
        });
        Ok(())
    }
}
