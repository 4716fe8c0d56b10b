//! Multimodal RoPE of Qwen3-VL: the position ids and the interleaved rotary table.
//!
//! Position ids: transformers 5.24's `Qwen3VLModel.get_rope_index` is Qwen2-VL's algorithm
//! (three streams T/H/W, `rope_deltas` for decoding), with each video frame (temporal patch) a
//! picture of its own between timestamp texts, so the family uses [`MropePositions`] with
//! [`VideoTime::Frames`]. What differs is how the three streams reach the rotary
//! frequencies ([`slot_streams`], [`interleaved_rope_tables`]).

use burn::prelude::*;

pub use crate::qwen2_vl::positions::{MropePositions, VideoTime};

/// Which position stream (0 = T, 1 = H, 2 = W) each of the `half` = head_dim/2 rotary slots reads
/// (transformers `Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope`):
///
/// ```text
/// s(i) = H  if i % 3 == 1 and i < 3·mrope_section[1]
///        W  if i % 3 == 2 and i < 3·mrope_section[2]
///        T  otherwise
/// ```
///
/// so `[24, 20, 20]` over 64 slots gives `T H W T H W … T H W T T T T`; `mrope_section[0]` is not
/// read. (Qwen2-VL's layout gives each stream a contiguous chunk instead.)
pub fn slot_streams(half: usize, mrope_section: [usize; 3]) -> Vec<usize> {
    (0..half)
        .map(|i| match i % 3 {
            1 if i < 3 * mrope_section[1] => 1,
            2 if i < 3 * mrope_section[2] => 2,
            _ => 0,
        })
        .collect()
}

/// cos/sin tables `[batch, len, head_dim]` of the interleaved M-RoPE from position ids
/// `[streams, batch, len]` (3 streams; one stream is used for all slots):
/// `angle_i = pos[s(i)] · inv_freq[i]` with `s` from [`slot_streams`], `cos = [cos(angle),
/// cos(angle)]`, the same for sin (transformers `Qwen3VLTextRotaryEmbedding.forward`, f32).
///
/// Each stream contributes `pos_s · f_s` where `f_s` holds `inv_freq[i]` on its slots and 0
/// elsewhere; every slot gets exactly one non-zero term, so the sum is the single product.
pub fn interleaved_rope_tables<B: Backend>(
    positions: Tensor<B, 3, Int>,
    inv_freq: &[f32],
    mrope_section: [usize; 3],
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let [streams, batch, len] = positions.dims();
    let half = inv_freq.len();
    let device = positions.device();
    let pos = positions.float();
    let streams_of = slot_streams(half, mrope_section);
    let mut angles: Option<Tensor<B, 3>> = None;
    for s in 0..3 {
        let freq: Vec<f32> = (0..half)
            .map(|i| if streams_of[i] == s { inv_freq[i] } else { 0.0 })
            .collect();
        let freq =
            Tensor::<B, 1>::from_data(TensorData::new(freq, [half]), &device).reshape([1, 1, half]);
        let p = pos
            .clone()
            .narrow(0, s.min(streams - 1), 1)
            .reshape([batch, len, 1]);
        let term = p * freq;
        angles = Some(match angles {
            Some(a) => a + term,
            None => term,
        });
    }
    let angles = angles.expect("three streams");
    let emb = Tensor::cat(vec![angles.clone(), angles], 2);
    (emb.clone().cos(), emb.sin())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_interleave_within_the_section_limits() {
        let name = |v: Vec<usize>| v.iter().map(|&s| ['T', 'H', 'W'][s]).collect::<String>();
        assert_eq!(name(slot_streams(8, [4, 2, 2])), "THWTHWTT");
        let real = slot_streams(64, [24, 20, 20]);
        assert_eq!(&name(real.clone())[57..], "THWTTTT");
        assert_eq!(real.iter().filter(|&&s| s == 1).count(), 20);
        assert_eq!(real.iter().filter(|&&s| s == 2).count(), 20);
    }
}
