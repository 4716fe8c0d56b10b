//! Multimodal RoPE position ids of the Qwen VL families (transformers 5.24 `get_rope_index` of
//! Qwen2-VL, Qwen2.5-VL and Qwen3-VL), for pictures and videos.
//!
//! Per row, over the real tokens only, with a running counter `cur = 0`: a text token gets
//! `(cur, cur, cur)` and `cur += 1`; a run of `t·(gh/m)·(gw/m)` vision tokens of grid
//! `(t, gh, gw)` (grids consumed in order across the batch) gets
//! `(cur + ⌊tt·τ⌋, cur + hh, cur + ww)` row-major, then `cur += max(gh, gw)/m` (the temporal
//! extent does not move `cur`). Padding gets `(0, 0, 0)`. `τ` is 1 for pictures; for videos it
//! depends on the family ([`VideoTime`]). A run of image tokens takes a picture, a run of video
//! tokens a video.
//! `rope_delta = max position of the row + 1 − real tokens`, so decoding continues at
//! `real tokens so far + rope_delta` on all three streams.

use anyhow::{Result, bail, ensure};

use super::vision::grid_thw;
use crate::capabilities::{MultimodalPositions, PaddedBatch, PositionIds, ProcessedImage};

/// How a family spaces the temporal positions of a video's temporal patches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VideoTime {
    /// Qwen2-VL: `τ = 1`, temporal patch `tt` at `cur + tt`.
    Index,
    /// Qwen2.5-VL: `τ = tokens_per_second · second_per_grid_t` (f32, then truncated as
    /// `(arange(t) * τ).long()`), `vision_config.tokens_per_second` in `config.json`.
    Seconds { tokens_per_second: f32 },
    /// Qwen3-VL: every temporal patch is its own run of `(gh/m)·(gw/m)` tokens (grid
    /// `(1, gh, gw)`), the frames being separated by timestamp text in the prompt.
    Frames,
}

/// The position-id capability of the Qwen VL families.
#[derive(Debug, Clone)]
pub struct MropePositions {
    pub image_token_id: u32,
    /// The video token (`config.json`'s `video_token_id`).
    pub video_token_id: u32,
    pub spatial_merge_size: usize,
    pub video_time: VideoTime,
}

/// One run of vision tokens the positions expect: grid `[t, gh, gw]`, the token its positions
/// hold and the temporal spacing `τ`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VisionRun {
    pub grid: [usize; 3],
    pub token_id: u32,
    pub time_interval: f32,
}

impl MropePositions {
    /// The runs of vision tokens `images` (pictures and videos, in prompt order) stand for.
    pub fn runs(&self, images: &[ProcessedImage]) -> Result<Vec<VisionRun>> {
        let mut runs = Vec::with_capacity(images.len());
        for (k, img) in images.iter().enumerate() {
            let grid = grid_thw(k, img)?;
            let Some(video) = &img.video else {
                runs.push(VisionRun {
                    grid,
                    token_id: self.image_token_id,
                    time_interval: 1.0,
                });
                continue;
            };
            let token_id = self.video_token_id;
            match self.video_time {
                VideoTime::Index => runs.push(VisionRun {
                    grid,
                    token_id,
                    time_interval: 1.0,
                }),
                VideoTime::Seconds { tokens_per_second } => runs.push(VisionRun {
                    grid,
                    token_id,
                    time_interval: tokens_per_second * video.second_per_grid_t,
                }),
                VideoTime::Frames => runs.extend((0..grid[0]).map(|_| VisionRun {
                    grid: [1, grid[1], grid[2]],
                    token_id,
                    time_interval: 1.0,
                })),
            }
        }
        Ok(runs)
    }

    /// Positions of `batch` whose vision tokens form `runs`, in order (see the module doc).
    pub fn compute(&self, batch: &PaddedBatch, runs: &[VisionRun]) -> Result<PositionIds> {
        batch.validate()?;
        let (bsz, len) = (batch.batch, batch.len);
        let m = self.spatial_merge_size;
        let vision = |t: u32| t == self.image_token_id || t == self.video_token_id;
        let mut ids = vec![0i64; 3 * bsz * len];
        let mut deltas = Vec::with_capacity(bsz);
        let mut next_run = 0usize;
        for b in 0..bsz {
            let row = batch.row(b);
            let mask = batch.mask_row(b);
            let real: Vec<usize> = (0..len).filter(|&l| mask[l] != 0).collect();
            let mut cur = 0i64;
            let mut max_pos = -1i64;
            let mut i = 0;
            while i < real.len() {
                let l = real[i];
                if vision(row[l]) {
                    let Some(run) = runs.get(next_run) else {
                        bail!(
                            "row {b}: vision token at column {l} but only {} images/video frames were given",
                            runs.len()
                        );
                    };
                    next_run += 1;
                    let [t, gh, gw] = run.grid;
                    let (lh, lw) = (gh / m, gw / m);
                    let n = t * lh * lw;
                    let kind = if run.token_id == self.image_token_id {
                        "image"
                    } else {
                        "video"
                    };
                    ensure!(
                        i + n <= real.len()
                            && real[i..i + n].iter().all(|&c| row[c] == run.token_id),
                        "row {b}: vision input {} ({kind}) needs {n} consecutive {kind} tokens from column {l}",
                        next_run - 1
                    );
                    for (k, &c) in real[i..i + n].iter().enumerate() {
                        let tt = (k / (lh * lw)) as f32 * run.time_interval;
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
            next_run == runs.len(),
            "{} images/video frames were given but the prompts hold vision tokens for {next_run}",
            runs.len()
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
        self.compute(batch, &self.runs(images)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::VideoTiming;

    fn item(grid: [usize; 3], video: Option<f32>) -> ProcessedImage {
        ProcessedImage {
            pixel_values: vec![],
            shape: vec![0, 0],
            grid: grid.to_vec(),
            num_tokens: grid[0] * grid[1] * grid[2] / 4,
            patch_positions: None,
            video: video.map(|s| VideoTiming {
                second_per_grid_t: s,
                patch_seconds: vec![],
            }),
        }
    }

    fn positions(video_time: VideoTime) -> MropePositions {
        MropePositions {
            image_token_id: 9,
            video_token_id: 8,
            spatial_merge_size: 2,
            video_time,
        }
    }

    #[test]
    fn video_temporal_positions_follow_the_family() {
        // text, a video of 3 temporal patches of 1×1 merged tokens, text.
        let row = vec![1, 8, 8, 8, 2];
        let batch = PaddedBatch::left_pad(&[row], 0);
        let video = [item([3, 2, 2], Some(1.0))];
        let t_stream = |p: &PositionIds| p.ids[..5].to_vec();
        let p = positions(VideoTime::Index)
            .position_ids(&batch, &video)
            .unwrap();
        assert_eq!(t_stream(&p), vec![0, 1, 2, 3, 2]);
        // Qwen2.5-VL: τ = 2 tokens/s · 1.0 s.
        let p = positions(VideoTime::Seconds {
            tokens_per_second: 2.0,
        })
        .position_ids(&batch, &video)
        .unwrap();
        assert_eq!(t_stream(&p), vec![0, 1, 3, 5, 2]);
        assert_eq!(p.rope_deltas, vec![6 - 5]);
        // An image token where the video's tokens should be is an error.
        let wrong = PaddedBatch::left_pad(&[vec![1, 9, 9, 9, 2]], 0);
        let err = positions(VideoTime::Index)
            .position_ids(&wrong, &video)
            .unwrap_err();
        assert!(err.to_string().contains("video tokens"), "{err}");
    }

    #[test]
    fn qwen3_frames_are_runs_of_their_own() {
        // <t0> frame <t1> frame: each frame one merged token, text between.
        let batch = PaddedBatch::left_pad(&[vec![1, 8, 3, 8, 2]], 0);
        let p = positions(VideoTime::Frames)
            .position_ids(&batch, &[item([2, 2, 2], Some(1.0))])
            .unwrap();
        assert_eq!(p.ids[..5].to_vec(), vec![0, 1, 2, 3, 4]);
    }
}
