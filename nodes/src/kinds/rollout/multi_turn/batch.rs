//! The rollout batch of the finished rows (padded matrices, texts, trajectories) and the check
//! every response passes before it leaves the node ([`check_trajectory`]).

use std::sync::Arc;

use anyhow::{Result, anyhow, ensure};
use flowrl_datasets::PromptEncoder;

use super::MultiTurn;
use super::row::Row;
use crate::values::trajectory::{Finish, SegmentKind};
use crate::values::{PromptBatch, RolloutBatch, TokenMatrix, Trajectory};

impl MultiTurn {
    /// The batch of `rows` (in row order): padded matrices, texts, trajectories; checked.
    pub(super) fn batch(
        &self,
        prompts: &Arc<PromptBatch>,
        mut rows: Vec<Row>,
    ) -> Result<RolloutBatch> {
        let n = self.rollout.n;
        let b = rows.len();
        let t = rows.iter().map(|r| r.ids.len()).max().unwrap_or(0).max(1);
        let mut mask = TokenMatrix::zeros(b, t);
        let mut logps = TokenMatrix::zeros(b, t);
        let mut texts = Vec::with_capacity(b);
        let mut trajectories = Vec::with_capacity(b);
        let tokenizer = &self.template.encoder().tokenizer;
        let processor = self.template.encoder().processor.clone();
        for (i, row) in rows.iter_mut().enumerate() {
            let pictures = row.pictures();
            // Rows from other replicas arrive without their processed pictures.
            if row.images.len() != pictures.len() {
                let processor = processor.as_ref().ok_or_else(|| {
                    anyhow!("tool pictures for a model without an image processor")
                })?;
                row.images = pictures
                    .iter()
                    .map(|p| processor.process(p))
                    .collect::<Result<_>>()?;
            }
            let trajectory = Trajectory {
                messages: std::mem::take(&mut row.messages),
                segments: std::mem::take(&mut row.segments),
                images: std::mem::take(&mut row.images),
                pictures,
                tool_calls: row.tool_calls,
                tool_errors: row.tool_errors,
                finish: row.finish.unwrap_or(Finish::Stop),
            };
            mask.row_mut(i)[..row.ids.len()].copy_from_slice(&trajectory.mask(row.ids.len()));
            logps.row_mut(i)[..row.ids.len()].copy_from_slice(&row.log_probs);
            texts.push(
                tokenizer
                    .decode(&row.ids, true)
                    .map_err(|e| anyhow!("decoding response {i}: {e}"))?,
            );
            trajectories.push(Arc::new(trajectory));
        }
        let truncated = trajectories
            .iter()
            .map(|t| matches!(t.finish, Finish::Length | Finish::Budget))
            .collect();
        let rollouts = RolloutBatch::for_prompts(
            prompts.clone(),
            (0..b).map(|r| r / n).collect(),
            rows.into_iter().map(|r| r.ids).collect(),
            mask,
            logps,
            texts,
            truncated,
        )
        .with_trajectories(trajectories);
        rollouts.check()?;
        for r in 0..rollouts.len() {
            check_trajectory(&rollouts, r, self.template.encoder())?;
        }
        Ok(rollouts)
    }
}

/// The check of the module doc for response `r`: its vision tokens against its pictures, and
/// its template segments against their text. The error names the response and the segment.
pub fn check_trajectory(rollouts: &RolloutBatch, r: usize, encoder: &PromptEncoder) -> Result<()> {
    let Some(t) = rollouts.trajectories.get(r) else {
        return Ok(());
    };
    let prompt = &rollouts.prompts.prompts[rollouts.prompt_index[r]];
    let name = || format!("response {r} (prompt {})", rollouts.uid[r]);
    let vision: Vec<u32> = [encoder.image_token_id(), encoder.video_token_id()]
        .into_iter()
        .flatten()
        .collect();
    let count = |ids: &[u32]| ids.iter().filter(|t| vision.contains(t)).count();
    let ids = &rollouts.response_ids[r];
    let tokens = count(&prompt.input_ids) + count(ids);
    let features: usize = prompt
        .images
        .iter()
        .chain(&t.images)
        .map(|i| i.num_tokens)
        .sum();
    ensure!(
        tokens == features,
        "{}: its prompt and response hold {tokens} image tokens, its {} picture(s) become {features}",
        name(),
        prompt.images.len() + t.images.len()
    );
    let mut image = 0;
    for (k, s) in t.segments.iter().enumerate() {
        let seg = &ids[s.start..s.start + s.len];
        let images = &t.images[image..image + s.images];
        image += s.images;
        let expected: usize = images.iter().map(|i| i.num_tokens).sum();
        ensure!(
            count(seg) == expected,
            "{}, segment {k} ({:?}): {} image tokens for {} picture(s) of {expected} tokens",
            name(),
            s.kind,
            count(seg),
            images.len()
        );
        if s.kind == SegmentKind::Template {
            let mut again = encoder.tokenize(&s.text)?;
            if !images.is_empty() {
                let processor = encoder.processor.as_ref().expect("pictures were processed");
                again = processor.expand_placeholders(&again, images)?;
            }
            ensure!(
                again == seg,
                "{}, segment {k}: its ids are not its text as the chat template renders and the \
                 tokenizer encodes it ({:?})",
                name(),
                s.text
            );
        }
    }
    Ok(())
}
