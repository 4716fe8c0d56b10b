//! Section 4, the first pass: the model's config cut to a few layers, prompts shaped as the
//! 3B step's, and the timed build, forwards and forward + backward passes under `Autodiff`.

use anyhow::{Context, Result};
use burn::backend::Autodiff;
use burn::module::Module;
use burn::prelude::*;
use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use flowrl_models::weights::Precision;
use flowrl_models::{Model, PaddedBatch, ProcessedImage};
use serde_json::{Value, json};

use super::{Args, Gpu, Report, dtype_name, round, timed};

/// The model's config: the file's, cut to `layers` decoder layers and vision blocks (full
/// attention kept in the last block when the family has `fullatt_block_indexes`), its
/// vocabulary optionally replaced.
fn sliced_config(args: &Args) -> Result<(Value, String)> {
    let text = std::fs::read_to_string(&args.model_config)
        .with_context(|| format!("reading {}", args.model_config.display()))?;
    let mut json: Value = serde_json::from_str(&text)?;
    let l = args.layers.max(1);
    let t = &mut json["text_config"];
    if t["num_hidden_layers"]
        .as_u64()
        .is_some_and(|n| n as usize > l)
    {
        t["num_hidden_layers"] = json!(l);
    }
    if let Some(v) = args.vocab {
        t["vocab_size"] = json!(v);
    }
    let v = &mut json["vision_config"];
    if v["depth"].as_u64().is_some_and(|n| n as usize > l) {
        v["depth"] = json!(l);
        if v.get("fullatt_block_indexes").is_some() {
            v["fullatt_block_indexes"] = json!([l - 1]);
        }
    }
    let name = format!(
        "{} cut to {} layers / {} vision blocks, vocab {}",
        args.model_config.display(),
        json["text_config"]["num_hidden_layers"],
        json["vision_config"]["depth"],
        json["text_config"]["vocab_size"]
    );
    Ok((json, name))
}

/// `rows` prompts as the 3B step's: 8 text tokens, vision start, the 64 tokens of one
/// 224×224 image (16×16 patches), vision end, text up to 109 tokens.
fn prompts(json: &Value, rows: usize) -> Result<(PaddedBatch, Vec<ProcessedImage>)> {
    let id = |key: &str| -> Result<u32> {
        json[key]
            .as_u64()
            .map(|v| v as u32)
            .with_context(|| format!("config.json has no {key}"))
    };
    let (start, image, end) = (
        id("vision_start_token_id")?,
        id("image_token_id")?,
        id("vision_end_token_id")?,
    );
    let vc = &json["vision_config"];
    let patch = vc["patch_size"].as_u64().unwrap_or(14) as usize;
    let temporal = vc["temporal_patch_size"].as_u64().unwrap_or(2) as usize;
    let channels = vc["in_channels"].as_u64().unwrap_or(3) as usize;
    let merge = vc["spatial_merge_size"].as_u64().unwrap_or(2) as usize;
    let (gh, gw) = (16, 16);
    let dim = channels * temporal * patch * patch;
    let n = gh * gw;
    let mut batch_rows = Vec::new();
    let mut images = Vec::new();
    for r in 0..rows {
        let tokens = n / (merge * merge);
        images.push(ProcessedImage {
            pixel_values: (0..n * dim)
                .map(|i| (((i * 7919 + r * 104_729) % 1000) as f32 / 500.0) - 1.0)
                .collect(),
            shape: vec![n, dim],
            grid: vec![1, gh, gw],
            num_tokens: tokens,
            patch_positions: None,
            video: None,
        });
        // Text ids below 400: inside every vocabulary here and below the special ids.
        let text = |i: usize| (1 + (r * 131 + i * 71) % 399) as u32;
        let mut row: Vec<u32> = (0..8).map(text).collect();
        row.push(start);
        row.extend(std::iter::repeat_n(image, tokens));
        row.push(end);
        let mut i = 8;
        while row.len() < 109 {
            row.push(text(i));
            i += 1;
        }
        batch_rows.push(row);
    }
    Ok((PaddedBatch::left_pad(&batch_rows, 0), images))
}

/// Build, forward ×2, forward + backward ×2 of the sliced model under `Autodiff`, one record
/// per phase (a timeout keeps the phases measured); no phase starts after the budget.
pub(super) fn first_pass<R: CubeRuntime>(
    device: &R::Device,
    args: &Args,
    rep: &mut Report,
) -> Result<()> {
    type Ad<R> = Autodiff<Gpu<R>>;
    let (json, name) = sliced_config(args)?;
    let precision = match args.dtype {
        DType::BF16 => Precision::BF16,
        DType::F16 => Precision::F16,
        _ => Precision::F32,
    };
    let (build_s, model) = timed::<Ad<R>, _>(device, || {
        Model::<Ad<R>>::random_with_precision(&json.to_string(), device, 7, precision)
    })?;
    let model = model?;
    let (batch, images) = prompts(&json, args.rows)?;
    rep.emit(json!({
        "bench": "first_pass", "phase": "build", "model": name, "params": model.num_params(),
        "precision": dtype_name(args.dtype), "rows": args.rows,
        "tokens": batch.batch * batch.len, "s": round(build_s, 3),
    }));
    let loss = |model: &Model<Ad<R>>| -> Result<Tensor<Ad<R>, 1>> {
        Ok(model
            .logits(&batch, &images, device)?
            .cast(DType::F32)
            .mean())
    };
    for (phase, backward) in [
        ("forward 1", false),
        ("forward 2", false),
        ("forward+backward 1", true),
        ("forward+backward 2", true),
    ] {
        if rep.over_budget(&format!("first pass, {phase}")) {
            break;
        }
        let (s, done) = timed::<Ad<R>, _>(device, || -> Result<()> {
            let l = loss(&model)?;
            if backward {
                drop(l.backward());
            } else {
                let _ = l.into_data();
            }
            Ok(())
        })?;
        done?;
        rep.emit(json!({"bench": "first_pass", "phase": phase, "s": round(s, 3)}));
    }
    Ok(())
}
