//! The check every response passes before it leaves the node ([`check_trajectory`]): its vision
//! tokens against its pictures, its template segments against their text.

use anyhow::{Result, ensure};
use flowrl_datasets::PromptEncoder;

use crate::values::RolloutBatch;
use crate::values::trajectory::SegmentKind;

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
