//! LoRA adapters on disk in PEFT's layout: `adapter_config.json` and
//! `adapter_model.safetensors` with keys `base_model.model.<module>.lora_A.weight` /
//! `.lora_B.weight`, `<module>` the transformers module path ([`module_path`]). Writing
//! ([`write_peft_adapter`]) and reading ([`read_peft_adapter`], which refuses what flowrl does
//! not implement); the adapters themselves and how a build attaches them are in [`super`].

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use safetensors::{Dtype, SafeTensors};

use super::config::LoraConfig;
use super::source::StoredAdapter;
use crate::checkpoint::host_f32;
use crate::weights::normalize_name;

/// The transformers module path of a checkpoint prefix (the inverse of [`normalize_name`] for the
/// legacy Qwen-VL names): `model.layers.*` → `model.language_model.layers.*`, `visual.*` →
/// `model.visual.*`; transformers-5 names and `lm_head` are kept.
pub fn module_path(prefix: &str) -> String {
    if prefix.starts_with("model.language_model.")
        || prefix.starts_with("model.visual.")
        || prefix.starts_with("model.vision_tower.")
        || prefix.starts_with("model.embed_vision.")
    {
        prefix.to_string()
    } else if let Some(rest) = prefix.strip_prefix("visual.") {
        format!("model.visual.{rest}")
    } else if let Some(rest) = prefix.strip_prefix("model.") {
        format!("model.language_model.{rest}")
    } else {
        prefix.to_string()
    }
}

/// PEFT's key prefix of a module's adapter weights.
const PEFT_PREFIX: &str = "base_model.model.";

/// One adapter to write: module prefix and host `(shape, values)` of A and B.
pub struct AdapterTensors {
    pub module: String,
    pub a: (Vec<usize>, Vec<f32>),
    pub b: (Vec<usize>, Vec<f32>),
}

/// Writes `dir/adapter_config.json` and `dir/adapter_model.safetensors` (F32) in PEFT's layout;
/// `base_model` goes into `base_model_name_or_path`.
pub fn write_peft_adapter(
    dir: &Path,
    config: &LoraConfig,
    adapters: &[AdapterTensors],
    base_model: &str,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut bytes: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for t in adapters {
        let path = module_path(&t.module);
        for (which, (shape, values)) in [("lora_A", &t.a), ("lora_B", &t.b)] {
            bytes.push((
                format!("{PEFT_PREFIX}{path}.{which}.weight"),
                shape.clone(),
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ));
        }
    }
    let views = bytes
        .iter()
        .map(|(name, shape, data)| {
            Ok((
                name.clone(),
                safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), data)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let file = dir.join("adapter_model.safetensors");
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    safetensors::serialize_to_file(views, Some(meta), &file)
        .with_context(|| format!("writing {}", file.display()))?;
    // The adapted modules' full paths: PEFT matches an entry equal to a module's name exactly,
    // so `from_pretrained` adapts these modules and no others (leaf names would also match the
    // vision tower's `*_proj` modules of some families).
    let targets: Vec<String> = adapters.iter().map(|t| module_path(&t.module)).collect();
    let json = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
        "layers_to_transform": null,
        "layers_pattern": null,
        "lora_bias": false,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": null,
    });
    let path = dir.join("adapter_config.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Reads a PEFT adapter directory: its config ([`read_peft_config`]) and weights.
pub fn read_peft_adapter(dir: &Path) -> Result<(LoraConfig, StoredAdapter)> {
    let config = read_peft_config(dir)?;
    let file = dir.join("adapter_model.safetensors");
    let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("parsing safetensors {}", file.display()))?;
    let mut a_parts = HashMap::new();
    let mut b_parts = HashMap::new();
    for (name, view) in st.tensors() {
        let key = name.strip_prefix(PEFT_PREFIX).unwrap_or(&name);
        let (module, which) = if let Some(m) = key
            .strip_suffix(".lora_A.weight")
            .or_else(|| key.strip_suffix(".lora_A.default.weight"))
        {
            (m, 'A')
        } else if let Some(m) = key
            .strip_suffix(".lora_B.weight")
            .or_else(|| key.strip_suffix(".lora_B.default.weight"))
        {
            (m, 'B')
        } else {
            bail!(
                "{}: tensor `{name}` is not a LoRA weight (lora_A/lora_B); modules_to_save and \
                 trained biases are not supported",
                file.display()
            );
        };
        let values = host_f32(&view).with_context(|| format!("{}: {name}", file.display()))?;
        let entry = (view.shape().to_vec(), values);
        let module = normalize_name(module);
        if which == 'A' {
            a_parts.insert(module, entry);
        } else {
            b_parts.insert(module, entry);
        }
    }
    let mut tensors = HashMap::new();
    for (module, a) in a_parts {
        let b = b_parts
            .remove(&module)
            .with_context(|| format!("{}: {module} has lora_A but no lora_B", file.display()))?;
        tensors.insert(module, (a, b));
    }
    if let Some(module) = b_parts.keys().next() {
        bail!("{}: {module} has lora_B but no lora_A", file.display());
    }
    ensure!(
        !tensors.is_empty(),
        "{} holds no adapter weights",
        file.display()
    );
    Ok((
        config,
        StoredAdapter {
            dir: dir.display().to_string(),
            tensors,
        },
    ))
}

/// The config of a PEFT adapter directory (`adapter_config.json`: rank, alpha, dropout, target
/// modules), without its weights. Refuses what flowrl does not implement (DoRA, rsLoRA,
/// per-module ranks, adapted biases).
pub fn read_peft_config(dir: &Path) -> Result<LoraConfig> {
    let path = dir.join("adapter_config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let field = |k: &str| json.get(k).filter(|v| !v.is_null());
    if let Some(t) = field("peft_type").and_then(|v| v.as_str()) {
        ensure!(
            t == "LORA",
            "{}: peft_type `{t}` is not LORA",
            path.display()
        );
    }
    for flag in ["use_dora", "use_rslora", "fan_in_fan_out", "lora_bias"] {
        ensure!(
            field(flag).and_then(|v| v.as_bool()) != Some(true),
            "{}: `{flag} = true` is not supported",
            path.display()
        );
    }
    for map in ["rank_pattern", "alpha_pattern"] {
        if let Some(m) = field(map).and_then(|v| v.as_object()) {
            ensure!(
                m.is_empty(),
                "{}: per-module `{map}` is not supported",
                path.display()
            );
        }
    }
    if let Some(b) = field("bias").and_then(|v| v.as_str()) {
        ensure!(
            b == "none",
            "{}: bias = \"{b}\" is not supported (only \"none\")",
            path.display()
        );
    }
    let rank = field("r")
        .and_then(|v| v.as_u64())
        .with_context(|| format!("{} has no integer `r`", path.display()))? as usize;
    let alpha = field("lora_alpha")
        .and_then(|v| v.as_f64())
        .with_context(|| format!("{} has no number `lora_alpha`", path.display()))?;
    let dropout = field("lora_dropout")
        .and_then(|v| v.as_f64())
        .unwrap_or(0.0);
    let target_modules = match field("target_modules") {
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .with_context(|| format!("{}: target_modules holds a non-string", path.display()))?,
        _ => bail!("{} has no `target_modules`", path.display()),
    };
    let config = LoraConfig {
        rank,
        alpha,
        dropout,
        target_modules,
    };
    config
        .validate()
        .with_context(|| format!("in {}", path.display()))?;
    Ok(config)
}
