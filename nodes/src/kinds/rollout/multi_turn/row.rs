//! One response as its replica builds it turn by turn ([`Row`]), and the exchange of finished
//! rows between replicas (as bytes of JSON).

use std::sync::Arc;

use anyhow::Result;
use flowrl_models::ProcessedImage;
use image::RgbImage;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::runtime::data_parallel::Replica;
use crate::values::trajectory::{Finish, Segment, SegmentKind};

/// A tool picture as bytes (replicas exchange finished rows).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Picture {
    pub(super) width: u32,
    pub(super) height: u32,
    pub(super) rgb: Vec<u8>,
}

/// One response as its replica finished it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Row {
    /// Global response index (prompt-major).
    pub(super) row: usize,
    pub(super) ids: Vec<u32>,
    pub(super) log_probs: Vec<f32>,
    pub(super) segments: Vec<Segment>,
    pub(super) messages: Vec<Json>,
    pub(super) pictures: Vec<Picture>,
    pub(super) tool_calls: usize,
    pub(super) tool_errors: usize,
    pub(super) finish: Option<Finish>,
    /// The tool pictures processed (not exchanged: processed again where missing).
    #[serde(skip)]
    pub(super) images: Vec<ProcessedImage>,
}

impl Row {
    pub(super) fn new(row: usize) -> Self {
        Row {
            row,
            ids: Vec::new(),
            log_probs: Vec::new(),
            segments: Vec::new(),
            messages: Vec::new(),
            pictures: Vec::new(),
            tool_calls: 0,
            tool_errors: 0,
            finish: None,
            images: Vec::new(),
        }
    }

    pub(super) fn push(
        &mut self,
        kind: SegmentKind,
        ids: &[u32],
        log_probs: Option<&[f32]>,
        text: String,
        images: usize,
    ) {
        self.segments.push(Segment {
            kind,
            start: self.ids.len(),
            len: ids.len(),
            text,
            images,
        });
        self.ids.extend_from_slice(ids);
        match log_probs {
            Some(l) => self.log_probs.extend_from_slice(l),
            None => self.log_probs.extend(std::iter::repeat_n(0.0, ids.len())),
        }
    }

    pub(super) fn pictures(&self) -> Vec<Arc<RgbImage>> {
        self.pictures
            .iter()
            .map(|p| {
                Arc::new(
                    RgbImage::from_raw(p.width, p.height, p.rgb.clone())
                        .expect("a picture's bytes match its size"),
                )
            })
            .collect()
    }
}

/// Sends this replica's rows to every replica and returns all of them (as bytes of JSON in
/// `f32`s, exact: each is below 2^24).
pub(super) fn exchange_rows(r: &Replica<'_>, mine: &[Row]) -> Result<Vec<Row>> {
    let bytes = serde_json::to_vec(mine)?;
    // The length in two 16-bit halves, each exact in an f32.
    let len = bytes.len();
    let halves = vec![(len >> 16) as f32, (len & 0xffff) as f32];
    let lengths = r.all_gather(halves, &vec![2; r.world])?;
    let counts: Vec<usize> = lengths
        .chunks(2)
        .map(|h| ((h[0] as usize) << 16) | h[1] as usize)
        .collect();
    let all = r.all_gather(bytes.iter().map(|&x| f32::from(x)).collect(), &counts)?;
    let mut rows = Vec::new();
    let mut at = 0;
    for &count in &counts {
        let part: Vec<u8> = all[at..at + count].iter().map(|&x| x as u8).collect();
        rows.extend(serde_json::from_slice::<Vec<Row>>(&part)?);
        at += count;
    }
    Ok(rows)
}
