//! The seam between [`crate::Model`] and a model family: what a family folder implements
//! ([`FamilyConfig`] for its config.json, [`FamilyModel`] for its burn module) and the
//! [`families!`](crate::families) macro that `registry.rs` invokes once, with one line per
//! family, to generate [`crate::Model`], the parsed-config enum and the registry table.
//!
//! A family is one folder under `models/src/` plus its registry line; nothing else names it.
//! [`crate::model`] dispatches through the generated methods, never through a hand-written arm
//! per family.

use anyhow::Result;
use burn::module::ModuleVisitor;
use burn::prelude::*;
use serde_json::Value;

use crate::capabilities::{CausalLm, ImageProcessor, MultimodalPositions, Vision};
use crate::weights::{NormalizedNames, WeightSource, WeightVisitor, Weights};

/// Builds a family's image processor from a Hugging Face directory.
pub type ImageProcessorLoader = fn(&std::path::Path) -> Result<Box<dyn ImageProcessor>>;

/// A family's parsed `config.json`.
pub trait FamilyConfig: Sized {
    /// The family's image processor, if it takes images.
    const IMAGE_PROCESSOR: Option<ImageProcessorLoader>;

    /// Parses and checks a `config.json` (its `model_type` is one the registry maps here).
    fn parse(json: &Value) -> Result<Self>;

    /// Std of the normal random weights ([`crate::Model::random`]): the config's
    /// `initializer_range`, 0.02 when absent.
    fn initializer_range(&self) -> f64;
}

/// A family's model: a burn `Module` with the causal-LM capability, built from its config
/// ([`FamilyModel::new`]) with its weights described once ([`Weights`], from the root prefix
/// `""`): loaded from a [`WeightSource`] and exported through a [`WeightVisitor`] by that one
/// walk.
pub trait FamilyModel<B: Backend>: Module<B> + CausalLm<B> + Weights<B> + Sized {
    type Config: FamilyConfig;

    /// The model of `config` with placeholder weights of the right shapes
    /// ([`crate::weights::shaped`]).
    fn new(device: &B::Device, config: &Self::Config) -> Self;

    /// Builds the model from `config`, taking every weight from `src` (asked for by the
    /// shared loader's normalised names, `NormalizedNames`, so a family may name its tensors
    /// in the transformers-5 layout).
    fn load(src: &mut dyn WeightSource<B>, config: &Self::Config) -> Self {
        let device = src.device();
        Self::new(&device, config).loaded(&mut NormalizedNames(src), "")
    }

    /// Every weight under its checkpoint name.
    fn export<V: WeightVisitor<B>>(&self, sink: &mut V) {
        self.export_to(sink, "");
    }

    /// The config.json text describing this model.
    fn config_json(&self) -> String;

    /// `config.json`'s `model_type`.
    fn model_type(&self) -> &'static str;

    /// The vision capability, for models that take images.
    fn vision(&self) -> Option<&dyn Vision<B>>;

    /// Visits the parameters of the vision tower (the module transformers calls `visual`,
    /// mergers included; see [`crate::Model::visit_vision_tower`]).
    fn visit_vision_tower<V: ModuleVisitor<B>>(&self, visitor: &mut V);

    /// The multimodal position-id capability, for families with multimodal RoPE.
    fn multimodal_positions(&self) -> Option<&dyn MultimodalPositions> {
        None
    }
}

/// Generates, from one line per family — `Variant(ModelType, ConfigType) = ["model_type", …]` —
/// the [`crate::Model`] enum (a burn `Module`), its dispatching methods, the parsed-config enum
/// and the registry's `FAMILIES` table.
#[macro_export]
#[doc(hidden)]
macro_rules! families {
    ($( $(#[$doc:meta])* $variant:ident($model:ident, $config:ty) = [$($model_type:literal),+]; )+) => {
        /// A model of any registered family.
        // One value per loaded model, so the size difference between variants costs nothing.
        #[allow(clippy::large_enum_variant)]
        #[derive(burn::module::Module, Debug)]
        pub enum Model<B: burn::prelude::Backend> {
            $( $(#[$doc])* $variant($model<B>), )+
        }

        /// A parsed config of any registered family.
        pub(crate) enum AnyConfig {
            $( $variant(Box<$config>), )+
        }

        /// Every `model_type` flowrl knows, with its family's image processor.
        pub const FAMILIES: &[Family] = &[
            $( $( Family {
                model_type: $model_type,
                image_processor: <$config as $crate::family::FamilyConfig>::IMAGE_PROCESSOR,
            }, )+ )+
        ];

        impl AnyConfig {
            /// The config of `json`, whose `model_type` is `model_type` (a registered one).
            pub(crate) fn parse(model_type: &str, json: &serde_json::Value) -> anyhow::Result<Self> {
                use $crate::family::FamilyConfig;
                match model_type {
                    $( $($model_type)|+ => Ok(Self::$variant(Box::new(<$config>::parse(json)?))), )+
                    other => anyhow::bail!("model_type `{other}` is not registered"),
                }
            }

            pub(crate) fn initializer_range(&self) -> f64 {
                use $crate::family::FamilyConfig;
                match self {
                    $( Self::$variant(c) => c.initializer_range(), )+
                }
            }

            pub(crate) fn build<B: burn::prelude::Backend>(
                &self,
                src: &mut dyn $crate::weights::WeightSource<B>,
            ) -> Model<B> {
                use $crate::family::FamilyModel;
                match self {
                    $( Self::$variant(c) => Model::$variant($model::load(src, c)), )+
                }
            }
        }

        impl<B: burn::prelude::Backend> Model<B> {
            /// Every weight under its checkpoint name.
            pub fn export<V: $crate::weights::WeightVisitor<B>>(&self, sink: &mut V) {
                use $crate::family::FamilyModel;
                match self {
                    $( Model::$variant(m) => m.export(sink), )+
                }
            }

            /// The config.json text describing this model.
            pub fn config_json(&self) -> String {
                use $crate::family::FamilyModel;
                match self {
                    $( Model::$variant(m) => m.config_json(), )+
                }
            }

            /// `config.json`'s `model_type` (for messages and metadata only; behaviour follows
            /// the capabilities).
            pub fn model_type(&self) -> &'static str {
                use $crate::family::FamilyModel;
                match self {
                    $( Model::$variant(m) => m.model_type(), )+
                }
            }

            /// The causal-LM capability (every family has it).
            pub fn causal_lm(&self) -> &dyn $crate::capabilities::CausalLm<B> {
                match self {
                    $( Model::$variant(m) => m, )+
                }
            }

            /// The vision capability, for families that take images.
            pub fn vision(&self) -> Option<&dyn $crate::capabilities::Vision<B>> {
                use $crate::family::FamilyModel;
                match self {
                    $( Model::$variant(m) => m.vision(), )+
                }
            }

            /// Visits the parameters of the vision tower (none for a model without one), for
            /// optimizers that freeze the tower (verl's `actor.freeze_vision_tower`, which sets
            /// `requires_grad=False` on the module `get_vl_model_vision_tower` returns). Each
            /// family's [`FamilyModel::visit_vision_tower`](crate::family::FamilyModel) says
            /// which modules that is.
            pub fn visit_vision_tower<V: burn::module::ModuleVisitor<B>>(&self, visitor: &mut V) {
                use $crate::family::FamilyModel;
                match self {
                    $( Model::$variant(m) => m.visit_vision_tower(visitor), )+
                }
            }

            /// The multimodal position-id capability, for families with multimodal RoPE.
            pub fn multimodal_positions(
                &self,
            ) -> Option<&dyn $crate::capabilities::MultimodalPositions> {
                use $crate::family::FamilyModel;
                match self {
                    $( Model::$variant(m) => m.multimodal_positions(), )+
                }
            }
        }
    };
}
