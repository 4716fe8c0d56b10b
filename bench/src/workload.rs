//! The benchmark's workload, shared by `bench-profile` and `bench-gpu-proxy`: the rows of the
//! reduced comparison (a prompt of 8 text tokens, `<vision_start>`, the 64 tokens of one 224×224
//! image, `<vision_end>` and text up to 109 tokens, then the response), in groups answering one
//! prompt as the rollout node lays them out, and the trunk's inputs.

use anyhow::Result;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use flowrl_algorithms::{ClipConfig, GlobalBatchInfo, LossAggMode, policy_loss_vanilla};
use flowrl_models::{Model, PaddedBatch, ProcessedImage};

/// Prompt length of the reduced comparison (shapes task prompt with one 224×224 image).
pub const PROMPT: usize = 109;
/// A 224×224 image as the processor gives it: 16×16 patches, 64 image tokens.
pub fn image(seed: usize) -> ProcessedImage {
    let (gh, gw) = (16, 16);
    let dim = 3 * 2 * 14 * 14;
    let n = gh * gw;
    let pixel_values = (0..n * dim)
        .map(|i| (((i * 7919 + seed * 104729) % 1000) as f32 / 500.0) - 1.0)
        .collect();
    ProcessedImage {
        pixel_values,
        shape: vec![n, dim],
        grid: vec![1, gh, gw],
        num_tokens: n / 4,
        patch_positions: None,
        video: None,
    }
}

/// The rows (prompt + response, no padding) and their response labels.
pub struct Batch {
    pub tokens: PaddedBatch,
    pub images: Vec<ProcessedImage>,
    /// Per image, the index of its first occurrence (rows of one prompt share its image).
    pub image_first: Vec<usize>,
    pub labels: Vec<i64>,
    pub image_token: u32,
    pub batch: usize,
    pub new: usize,
}

/// `special` = (vision start, image, vision end) token ids; text ids are drawn from 1000..20000.
/// Rows come in groups of `n` answering one prompt (same prompt tokens and image, different
/// responses), as the rollout node lays them out.
pub fn batch(batch: usize, n: usize, new: usize, special: [u32; 3]) -> Batch {
    let images: Vec<ProcessedImage> = (0..batch).map(|b| image(b / n)).collect();
    let image_first: Vec<usize> = (0..batch).map(|b| b / n * n).collect();
    let mut rows = Vec::new();
    let mut labels = Vec::new();
    for (b, image) in images.iter().enumerate() {
        let p = b / n;
        let mut row: Vec<u32> = (0..8)
            .map(|i| (1000 + (p * 31 + i * 17) % 1000) as u32)
            .collect();
        row.push(special[0]);
        row.extend(std::iter::repeat_n(special[1], image.num_tokens));
        row.push(special[2]);
        let mut i = 0;
        while row.len() < PROMPT {
            row.push((1000 + (p * 131 + i * 71) % 19000) as u32);
            i += 1;
        }
        while row.len() < PROMPT + new {
            row.push((1000 + (b * 137 + i * 73) % 19000) as u32);
            i += 1;
        }
        labels.extend(row[PROMPT..].iter().map(|&x| x as i64));
        rows.push(row);
    }
    Batch {
        tokens: PaddedBatch::left_pad(&rows, 0),
        images,
        image_first,
        labels,
        image_token: special[1],
        batch,
        new,
    }
}

impl Batch {
    pub fn labels<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2, Int> {
        Tensor::<B, 1, Int>::from_data(
            TensorData::new(self.labels.clone(), [self.labels.len()]),
            device,
        )
        .reshape([self.batch, self.new])
    }
}

/// Token ids, input embeddings (the vision tower), position ids and the attention mask.
#[allow(clippy::type_complexity)]
pub fn trunk_inputs<B: Backend>(
    model: &Model<B>,
    x: &Batch,
    device: &B::Device,
) -> Result<(
    Tensor<B, 2, Int>,
    Tensor<B, 3>,
    Tensor<B, 3, Int>,
    Tensor<B, 2, Int>,
)> {
    let embeds = model.input_embeddings_shared(&x.tokens, &x.images, &x.image_first, device)?;
    let positions = model.position_ids(&x.tokens, &x.images)?;
    Ok((
        x.tokens.ids_tensor::<B>(device),
        embeds,
        positions.tensor::<B>(device),
        x.tokens.mask_tensor::<B>(device),
    ))
}

/// The update's PPO-clip loss (token-mean, default clipping) of the log-probs `lp` `[rows, new]`
/// against `old`, every response token counted, half the rows with advantage 1 and half with −1.
pub fn ppo_loss<B: AutodiffBackend>(
    old: Tensor<B, 2>,
    lp: Tensor<B, 2>,
    device: &B::Device,
) -> Result<Tensor<B, 1>> {
    let [rows, new] = lp.dims();
    let mask = Tensor::<B, 2>::ones([rows, new], device);
    let signs: Vec<f32> = (0..rows * new)
        .map(|i| {
            if (i / new).is_multiple_of(2) {
                1.0
            } else {
                -1.0
            }
        })
        .collect();
    let adv = Tensor::<B, 1>::from_data(TensorData::new(signs, [rows * new]), device)
        .reshape([rows, new]);
    let info = GlobalBatchInfo {
        batch_num_tokens: Some((rows * new) as f64),
        global_batch_size: Some(rows as f64),
        ..GlobalBatchInfo::default()
    };
    let pl = policy_loss_vanilla(
        old,
        lp,
        adv,
        mask,
        None,
        &ClipConfig::default(),
        LossAggMode::TokenMean,
        &info,
    )?;
    Ok(pl.pg_loss)
}
