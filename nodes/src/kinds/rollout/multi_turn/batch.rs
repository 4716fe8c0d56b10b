//! The rollout batch of the finished rows (padded matrices, texts, trajectories), each response
//! checked ([`check_trajectory`]) before it leaves the node.

use std::sync::Arc;

use anyhow::{Result, anyhow};

use super::MultiTurn;
use super::check::check_trajectory;
use super::row::Row;
use crate::values::trajectory::Finish;
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
