//! Multimodal RoPE position ids of Qwen2-VL / Qwen2.5-VL (HF `get_rope_index`, images only).
//!
//! Per row, over the real tokens only, with a running counter `cur = 0`: a text token gets
//! `(cur, cur, cur)` and `cur += 1`; a run of `t·(gh/m)·(gw/m)` image tokens of grid
//! `(t, gh, gw)` (grids consumed in order across the batch) gets `(cur + tt, cur + hh, cur + ww)`
//! row-major, then `cur += max(gh, gw)/m`. Padding gets `(0, 0, 0)`.
//! `rope_delta = max position of the row + 1 − real tokens`, so decoding continues at
//! `real tokens so far + rope_delta` on all three streams.

use anyhow::{Result, bail, ensure};

use crate::capabilities::{MultimodalPositions, PaddedBatch, PositionIds, ProcessedImage};

/// The position-id capability of the Qwen VL families.
#[derive(Debug, Clone)]
pub struct MropePositions {
    pub image_token_id: u32,
    pub spatial_merge_size: usize,
}

impl MropePositions {
    /// Positions from grids `[t, gh, gw]` (in patches) of the images in prompt order.
    pub fn compute(&self, batch: &PaddedBatch, grids: &[[usize; 3]]) -> Result<PositionIds> {
        batch.validate()?;
        let (bsz, len) = (batch.batch, batch.len);
        let m = self.spatial_merge_size;
        let mut ids = vec![0i64; 3 * bsz * len];
        let mut deltas = Vec::with_capacity(bsz);
        let mut next_image = 0usize;
        for b in 0..bsz {
            let row = batch.row(b);
            let mask = batch.mask_row(b);
            let real: Vec<usize> = (0..len).filter(|&l| mask[l] != 0).collect();
            let mut cur = 0i64;
            let mut max_pos = -1i64;
            let mut i = 0;
            while i < real.len() {
                let l = real[i];
                if row[l] == self.image_token_id {
                    let Some(&[t, gh, gw]) = grids.get(next_image) else {
                        bail!(
                            "row {b}: image token at column {l} but only {} images were given",
                            grids.len()
                        );
                    };
                    next_image += 1;
                    let (lh, lw) = (gh / m, gw / m);
                    let n = t * lh * lw;
                    ensure!(
                        i + n <= real.len()
                            && real[i..i + n]
                                .iter()
                                .all(|&c| row[c] == self.image_token_id),
                        "row {b}: image {} needs {n} consecutive image tokens from column {l}",
                        next_image - 1
                    );
                    for (k, &c) in real[i..i + n].iter().enumerate() {
                        let tt = k / (lh * lw);
                        let hh = (k / lw) % lh;
                        let ww = k % lw;
                        let p = [cur + tt as i64, cur + hh as i64, cur + ww as i64];
                        for (s, &v) in p.iter().enumerate() {
                            ids[(s * bsz + b) * len + c] = v;
                            max_pos = max_pos.max(v);
                        }
                    }
                    cur += (gh.max(gw) / m) as i64;
                    i += n;
                } else {
                    for s in 0..3 {
                        ids[(s * bsz + b) * len + l] = cur;
                    }
                    max_pos = max_pos.max(cur);
                    cur += 1;
                    i += 1;
                }
            }
            deltas.push(max_pos + 1 - real.len() as i64);
        }
        ensure!(
            next_image == grids.len(),
            "{} images were given but the prompts hold image tokens for {next_image}",
            grids.len()
        );
        Ok(PositionIds {
            streams: 3,
            batch: bsz,
            len,
            ids,
            rope_deltas: deltas,
        })
    }
}

impl MultimodalPositions for MropePositions {
    fn position_ids(&self, batch: &PaddedBatch, images: &[ProcessedImage]) -> Result<PositionIds> {
        let mut grids = Vec::with_capacity(images.len());
        for (k, img) in images.iter().enumerate() {
            ensure!(
                img.grid.len() == 3,
                "image {k}: grid {:?} is not [t, h, w]",
                img.grid
            );
            grids.push([img.grid[0], img.grid[1], img.grid[2]]);
        }
        self.compute(batch, &grids)
    }
}
