//! The family registry: `config.json`'s `model_type` → the family that implements it.
//!
//! This is the only place where a model is chosen by name; afterwards callers use capabilities.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::capabilities::ImageProcessor;

/// Builds a family's image processor from a Hugging Face directory.
pub type ImageProcessorLoader = fn(&Path) -> Result<Box<dyn ImageProcessor>>;

/// One registered model family.
pub struct Family {
    /// `config.json`'s `model_type`.
    pub model_type: &'static str,
    /// The family's image processor, if it takes images.
    pub image_processor: Option<ImageProcessorLoader>,
}

fn qwen_vl_processor(dir: &Path) -> Result<Box<dyn ImageProcessor>> {
    Ok(Box::new(
        crate::qwen2_vl::processor::Qwen2VlImageProcessor::from_dir(dir)?,
    ))
}

fn gemma4_processor(dir: &Path) -> Result<Box<dyn ImageProcessor>> {
    Ok(Box::new(
        crate::gemma4::processor::Gemma4ImageProcessor::from_dir(dir)?,
    ))
}

/// Every family flowrl knows. Qwen2.5-VL and Qwen3-VL use Qwen2-VL's image processor.
pub const FAMILIES: &[Family] = &[
    Family {
        model_type: "qwen2_vl",
        image_processor: Some(qwen_vl_processor),
    },
    Family {
        model_type: "qwen2_5_vl",
        image_processor: Some(qwen_vl_processor),
    },
    Family {
        model_type: "gemma4",
        image_processor: Some(gemma4_processor),
    },
    Family {
        model_type: "qwen3_vl",
        image_processor: Some(qwen_vl_processor),
    },
];

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
