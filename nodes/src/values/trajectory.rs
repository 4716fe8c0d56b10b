//! A multi-turn response: what the policy sampled, what the chat template and the tools wrote
//! between its turns, and the pictures the tools returned (`rollout.multi_turn`).
//!
//! The response ids of such a row are its [`Segment`]s one after the other. A policy segment is
//! one assistant turn, exactly as sampled (never decoded and re-encoded), with loss mask 1. A
//! template segment is the text the chat template writes between two turns (the end of the
//! assistant turn the policy did not sample, the tool messages, the next generation prompt),
//! tokenized once, its image placeholders expanded for the tools' pictures, with loss mask 0.
//! Tool pictures join the prompt's pictures in the order of their tokens, so the vision tower,
//! the image-token scatter and the position ids (multimodal RoPE included) treat them as they
//! treat prompt pictures.

use std::sync::Arc;

use anyhow::{Result, ensure};
use flowrl_models::ProcessedImage;
use image::RgbImage;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// Who wrote a segment of a multi-turn response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    /// An assistant turn, sampled by the policy (loss mask 1).
    Policy,
    /// Chat-template text and tool answers between turns (loss mask 0).
    Template,
}

/// A run of response tokens of one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub kind: SegmentKind,
    /// Offset of its first token in the response ids.
    pub start: usize,
    /// Number of tokens.
    pub len: usize,
    /// Template segments: the rendered text the ids were tokenized from (before the image
    /// placeholders were expanded); empty for policy segments.
    pub text: String,
    /// Template segments: how many of [`Trajectory::images`] it places (in order).
    pub images: usize,
}

/// Why a multi-turn response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// The last turn ended with an end-of-turn token and no tool call.
    Stop,
    /// The last turn was cut at its token limit (per turn or what was left of the budget).
    Length,
    /// Tool answers and another turn would not fit the length budget: ended at the turn
    /// boundary before them.
    Budget,
    /// `max_turns` assistant turns were taken (the last one's tool calls were not run).
    MaxTurns,
}

/// The multi-turn structure of one response of a [`super::RolloutBatch`].
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory {
    /// The messages after the prompt's, as the chat template saw them: per assistant turn
    /// `{"role": "assistant", "content": text, "tool_calls": [...]}`, per tool answer
    /// `{"role": "tool", "name": ..., "content": [{"type": "image"}..., {"type": "text", ...}]}`.
    pub messages: Vec<Json>,
    /// The response ids' segments, in order, covering them exactly.
    pub segments: Vec<Segment>,
    /// The tools' pictures, processed like the prompt's, in the order of their tokens.
    pub images: Vec<ProcessedImage>,
    /// The same pictures as the tools returned them.
    pub pictures: Vec<Arc<RgbImage>>,
    /// Tool calls made (well-formed or not).
    pub tool_calls: usize,
    /// Tool calls answered with an error (malformed call, unknown tool, bad arguments, a tool
    /// that failed).
    pub tool_errors: usize,
    pub finish: Finish,
}

impl Trajectory {
    /// Assistant turns (policy segments).
    pub fn turns(&self) -> usize {
        self.policy_segments().count()
    }

    /// The policy segments, in order.
    pub fn policy_segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments
            .iter()
            .filter(|s| s.kind == SegmentKind::Policy)
    }

    /// Checks the segments against the response: contiguous from 0, covering its `len` ids, the
    /// template segments' images adding up to [`Trajectory::images`], and one picture per image.
    pub fn check(&self, len: usize) -> Result<()> {
        let mut next = 0;
        for (k, s) in self.segments.iter().enumerate() {
            ensure!(
                s.start == next,
                "segment {k} starts at token {} where the previous one ended at {next}",
                s.start
            );
            ensure!(
                s.kind == SegmentKind::Template || s.images == 0,
                "policy segment {k} claims {} tool images",
                s.images
            );
            next += s.len;
        }
        ensure!(
            next == len,
            "the segments cover {next} tokens of a response of {len}"
        );
        let placed: usize = self.segments.iter().map(|s| s.images).sum();
        ensure!(
            placed == self.images.len() && self.pictures.len() == self.images.len(),
            "the segments place {placed} tool images; the trajectory holds {} processed and {} pictures",
            self.images.len(),
            self.pictures.len()
        );
        Ok(())
    }

    /// The loss mask of the response: 1 on policy segments, 0 on template segments.
    pub fn mask(&self, len: usize) -> Vec<f32> {
        let mut mask = vec![0.0; len];
        for s in self.policy_segments() {
            mask[s.start..s.start + s.len].fill(1.0);
        }
        mask
    }
}
