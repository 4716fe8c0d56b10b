//! Tests of the shared layers: the KV cache, the attention masks, RoPE tables and `repeat_kv`.

use burn::prelude::*;

use super::kv_cache::{append_kv, reserve_kv};
use super::masked_attention::{MASKED, causal_padding_bias, causal_padding_window_bias, repeat_kv};
use super::rotary::{inv_freq, rope_tables};
use burn::backend::Flex;

fn ints(v: Vec<i64>, shape: [usize; 2]) -> Tensor<Flex, 2, Int> {
    Tensor::<Flex, 1, Int>::from_data(
        TensorData::new(v, [shape[0] * shape[1]]),
        &Default::default(),
    )
    .reshape(shape)
}

/// A cache reserved at its final length gives the keys of the cat-grown one at every step,
/// and its steps write into the one buffer reserved (no copy of the cache per step).
#[test]
fn reserved_kv_cache_writes_in_place_and_matches_cat() {
    let device = Default::default();
    let step = |i: usize, l: usize| {
        let n = 2 * 3 * l * 4;
        let v: Vec<f32> = (0..n).map(|j| (i * 1000 + j) as f32).collect();
        // [b, l, kv_heads, d] moved to [b, kv_heads, l, d], as the projections give them.
        Tensor::<Flex, 1>::from_data(TensorData::new(v, [n]), &device)
            .reshape([2, l, 3, 4])
            .swap_dims(1, 2)
    };
    let ptr = |t: &Tensor<Flex, 4>| t.clone().into_primitive().tensor().bytes().as_ptr();
    let (mut grown, mut reserved) = (None, None);
    let prompt = 5;
    for slot in [&mut grown, &mut reserved] {
        append_kv(slot, step(0, prompt), step(0, prompt), prompt);
    }
    reserve_kv(&mut reserved, prompt + 3);
    let buffer = ptr(&reserved.as_ref().unwrap().0);
    for i in 1..=3 {
        let total = prompt + i;
        let (gk, gv) = append_kv(&mut grown, step(i, 1), step(i, 1), total);
        let (rk, rv) = append_kv(&mut reserved, step(i, 1), step(i, 1), total);
        assert_eq!(rk.dims(), [2, 3, total, 4]);
        assert_eq!(gk.into_data(), rk.into_data(), "keys after step {i}");
        assert_eq!(gv.into_data(), rv.into_data(), "values after step {i}");
        assert_eq!(
            ptr(&reserved.as_ref().unwrap().0),
            buffer,
            "step {i} wrote in place"
        );
    }
    // A buffer someone else also holds is not written through: slice_assign copies it.
    let held = reserved.clone();
    let before = held.as_ref().unwrap().0.clone().into_data();
    reserve_kv(&mut reserved, prompt + 4);
    append_kv(&mut reserved, step(4, 1), step(4, 1), prompt + 4);
    assert_eq!(held.unwrap().0.into_data(), before);
}

#[test]
fn bias_is_causal_and_masks_padding_keys() {
    // Row 0: one pad then two tokens; one cached key + 2 new queries.
    let mask = ints(vec![0, 1, 1], [1, 3]);
    let b = causal_padding_bias(mask, 2)
        .into_data()
        .into_vec::<f32>()
        .unwrap();
    // Query 0 (absolute 1) sees key 1; query 1 (absolute 2) sees keys 1, 2; key 0 is padding.
    assert_eq!(b, vec![MASKED, 0.0, MASKED, MASKED, 0.0, 0.0]);
}

#[test]
fn packed_segments_attend_only_within_themselves() {
    // One row packing two sequences (segments 1: 2 tokens, 2: 2 tokens) and a padding tail.
    let mask = ints(vec![1, 1, 2, 2, 0], [1, 5]);
    let b = causal_padding_bias(mask, 5)
        .into_data()
        .into_vec::<f32>()
        .unwrap();
    let visible: Vec<Vec<usize>> = b
        .chunks(5)
        .map(|row| (0..5).filter(|&j| row[j] == 0.0).collect())
        .collect();
    // The padding query sees every earlier real key, as with a 0/1 mask.
    assert_eq!(
        visible,
        vec![vec![0], vec![0, 1], vec![2], vec![2, 3], vec![0, 1, 2, 3]]
    );
    assert!(b.iter().all(|&x| x == 0.0 || x == MASKED));
    // With a sliding window of 2 the second segment's queries keep their own keys only.
    let w = causal_padding_window_bias(ints(vec![1, 1, 2, 2, 2], [1, 5]), 5, Some(2))
        .into_data()
        .into_vec::<f32>()
        .unwrap();
    let row = |q: usize| -> Vec<usize> { (0..5).filter(|&j| w[q * 5 + j] == 0.0).collect() };
    assert_eq!((row(2), row(3), row(4)), (vec![2], vec![2, 3], vec![3, 4]));
}

#[test]
fn one_stream_rope_equals_three_equal_streams() {
    let device = Default::default();
    let freq = inv_freq(100.0, 16);
    let one = Tensor::<Flex, 1, Int>::from_data(TensorData::new(vec![0i64, 3, 7], [3]), &device)
        .reshape([1, 1, 3]);
    let three = one.clone().repeat_dim(0, 3);
    let (c1, s1) = rope_tables(one, &freq, &[2, 3, 3]);
    let (c3, s3) = rope_tables(three, &freq, &[2, 3, 3]);
    assert_eq!(c1.into_data(), c3.into_data());
    assert_eq!(s1.into_data(), s3.into_data());
}

#[test]
fn repeat_kv_maps_query_head_j_to_kv_head_j_over_group() {
    let device = Default::default();
    let x = Tensor::<Flex, 1>::from_data(TensorData::new(vec![1.0f32, 2.0], [2]), &device)
        .reshape([1, 2, 1, 1]);
    let v = repeat_kv(x, 2).into_data().into_vec::<f32>().unwrap();
    assert_eq!(v, vec![1.0, 1.0, 2.0, 2.0]);
}
