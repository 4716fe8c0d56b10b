//! The family registry: `config.json`'s `model_type` → the family that implements it.
//!
//! This is the only place where a model is chosen by name; afterwards callers use capabilities.
//! A family plugs in with one line of the [`crate::families!`] invocation below; its folder
//! implements [`crate::family::FamilyConfig`] and [`crate::family::FamilyModel`].

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::capabilities::ImageProcessor;
use crate::family::ImageProcessorLoader;
use crate::gemma4::{Gemma4, Gemma4Config};
use crate::qwen2_vl::{QwenVl, QwenVlConfig};
use crate::qwen3_vl::{Qwen3Vl, Qwen3VlConfig};

/// One registered model family.
pub struct Family {
    /// `config.json`'s `model_type`.
    pub model_type: &'static str,
    /// The family's image processor, if it takes images.
    pub image_processor: Option<ImageProcessorLoader>,
}

// The only place that names the families: `Variant(Model, Config) = [model_type, …];`. The line
// generates the `Model` variant (`crate::Model`), the parsed-config variant and the entries of
// `FAMILIES`; the family folder implements `crate::family::{FamilyConfig, FamilyModel}`.
crate::families! {
    /// Qwen2-VL and Qwen2.5-VL.
    QwenVl(QwenVl, QwenVlConfig) = ["qwen2_vl", "qwen2_5_vl"];
    /// Gemma 4.
    Gemma4(Gemma4, Gemma4Config) = ["gemma4"];
    /// Qwen3-VL.
    Qwen3Vl(Qwen3Vl, Qwen3VlConfig) = ["qwen3_vl"];
}

/// The registered family of `model_type`.
pub fn family(model_type: &str) -> Result<&'static Family> {
    match FAMILIES.iter().find(|f| f.model_type == model_type) {
        Some(f) => Ok(f),
        None => bail!(
            "unknown model_type `{model_type}`; known: {}",
            FAMILIES
                .iter()
                .map(|f| f.model_type)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Reads `model_type` from `dir/config.json`.
pub fn read_model_type(dir: &Path) -> Result<String> {
    let path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    match json.get("model_type").and_then(|v| v.as_str()) {
        Some(t) => Ok(t.to_string()),
        None => bail!("{} has no string `model_type`", path.display()),
    }
}

/// Reads `config.json`'s `model_type` and `preprocessor_config.json` of a Hugging Face directory
/// and builds that family's image processor.
pub fn load_image_processor(dir: &Path) -> Result<Box<dyn ImageProcessor>> {
    let model_type = read_model_type(dir)?;
    let family = family(&model_type)?;
    match family.image_processor {
        Some(load) => load(dir),
        None => bail!(
            "model type `{model_type}` ({}) has no image processor",
            dir.display()
        ),
    }
}
