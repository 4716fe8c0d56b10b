//! Tests of the sequence batches: padding-free packing against the padded layout, and the
//! chunked backward against one graph.

use super::*;
use burn::tensor::backend::AutodiffBackend;

type Ad = crate::runtime::backend::CpuBackend;
type Inner = <Ad as AutodiffBackend>::InnerBackend;

fn tiny() -> Model<Ad> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/tiny-qwen2-vl");
    Model::load(&dir, &Default::default()).unwrap()
}

/// A 56×56 image (4×4 patches, 4 image tokens) with pixel values from `seed`.
fn image(seed: usize) -> ProcessedImage {
    let dim = 3 * 2 * 14 * 14;
    ProcessedImage {
        pixel_values: (0..16 * dim)
            .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0 - 1.0)
            .collect(),
        shape: vec![16, dim],
        grid: vec![1, 4, 4],
        num_tokens: 4,
        patch_positions: None,
        video: None,
    }
}

/// Rows answering prompts A, B, A (images A, B, A): rows 0 and 2 share their image.
fn batch(image_token: u32) -> (PaddedBatch, Vec<ProcessedImage>) {
    let rows: Vec<Vec<u32>> = [3u32, 5, 3]
        .iter()
        .map(|&t| {
            let mut row = vec![t, t + 1];
            row.extend([image_token; 4]);
            row.extend([t + 2, t + 3, t + 4]);
            row
        })
        .collect();
    let images = vec![image(0), image(1), image(0)];
    (PaddedBatch::left_pad(&rows, 0), images)
}

fn values<const D: usize>(t: Tensor<Inner, D>) -> Vec<f32> {
    t.into_data().into_vec::<f32>().unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn shared_images_give_the_embeddings_and_vision_gradients_of_one_tower_run_per_row() {
    let model = tiny();
    let device = Default::default();
    let image_token = model.vision().unwrap().image_token_id();
    let (tokens, images) = batch(image_token);
    let shared = model
        .input_embeddings_shared(&tokens, &images, &[0, 1, 0], &device)
        .unwrap();
    let every = model.input_embeddings(&tokens, &images, &device).unwrap();
    let dims = every.dims();
    assert_eq!(shared.dims(), dims);
    // A fixed, position-dependent weighting so every embedding row gets its own gradient.
    let n: usize = dims.iter().product();
    let w = Tensor::<Ad, 1>::from_data(
        TensorData::new((0..n).map(|i| ((i % 13) as f32 - 6.0) / 7.0).collect(), [n]),
        &device,
    )
    .reshape(dims);
    let (sv, ev) = (
        values(shared.clone().inner()),
        values(every.clone().inner()),
    );
    let d = max_abs_diff(&sv, &ev);
    assert!(d <= 1e-6, "embeddings differ by {d}");
    let Model::QwenVl(m) = &model else {
        panic!("tiny-qwen2-vl is a Qwen2-VL model")
    };
    let embed = m.text.embed_tokens.val();
    let vision_w = m.visual.patch_embed.val();
    let g_shared = (shared * w.clone()).sum().backward();
    let g_every = (every * w).sum().backward();
    for (name, a, b) in [
        (
            "visual.patch_embed",
            values(vision_w.grad(&g_shared).unwrap()),
            values(vision_w.grad(&g_every).unwrap()),
        ),
        (
            "model.embed_tokens",
            values(embed.grad(&g_shared).unwrap()),
            values(embed.grad(&g_every).unwrap()),
        ),
    ] {
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let d = max_abs_diff(&a, &b);
        assert!(scale > 0.0, "{name}: zero gradient");
        assert!(
            d <= 1e-5 * scale,
            "{name}: gradients differ by {d} (scale {scale})"
        );
    }
}

#[test]
fn first_occurrence_indices_must_point_backwards_at_first_occurrences() {
    let model = tiny();
    let device = Default::default();
    let (tokens, images) = batch(model.vision().unwrap().image_token_id());
    for bad in [vec![0, 1], vec![0, 2, 0], vec![0, 0, 1]] {
        let e = model
            .input_embeddings_shared(&tokens, &images, &bad, &device)
            .unwrap_err();
        assert!(e.to_string().contains("first-occurrence indices"), "{e}");
    }
}
