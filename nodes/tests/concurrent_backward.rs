//! Backward passes on several threads at once keep every gradient.
//!
//! A step runs independent nodes concurrently (update.critic beside update.ppo in the PPO graph)
//! and data-parallel replicas each in their own thread, so backward passes of different models
//! overlap in one process. burn-autodiff keeps one process-wide map of graphs, and every
//! `backward()` ends by freeing the graphs it finds unused. Its release 0.21 let that sweep free
//! an input of a `cat` in flight on another thread. That happened when the input was the only
//! node of its graph: an op on a parameter reused after an earlier backward, such as the token
//! embeddings that `scatter_image_embeddings` concatenates with the image rows. The parameter's
//! gradient was then silently missing (tracel-ai/burn#5573; vendor/README.md has the patch).

use burn::prelude::*;
use burn::tensor::module::embedding;
use flowrl_models::scatter_image_embeddings;
use flowrl_nodes::runtime::backend::CpuBackend as B;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

type Inner = <B as burn::tensor::backend::AutodiffBackend>::InnerBackend;

const VOCAB: usize = 32;
const HIDDEN: usize = 64;
/// Sequence length: long enough that the concatenation's copy takes a while (the window).
const LEN: usize = 1 << 14;
const IMAGE_TOKEN: u32 = 7;
const ROUNDS: usize = 40;

/// A prompt of [`LEN`] tokens, every second one an image token, the others 1..=5.
fn ids() -> Vec<u32> {
    (0..LEN as u32)
        .map(|i| if i % 2 == 0 { IMAGE_TOKEN } else { 1 + i % 5 })
        .collect()
}

/// `scale · (0, 1, 2, …)` in `shape`, row-major.
fn ramp<const D: usize>(shape: [usize; D], scale: f64) -> Tensor<Inner, D> {
    let n = shape.iter().product::<usize>() as i64;
    Tensor::<Inner, 1, Int>::arange(0..n, &Default::default())
        .float()
        .reshape(shape)
        .mul_scalar(scale)
}

/// The gradient of `Σ c ⊙ merge(embed(weight, ids), images)` for the embedding weight, as the
/// first part of a VLM forward computes it, or `None` where the backward lost it.
fn embedding_gradient(weight: &Tensor<B, 2>, images: &Tensor<B, 2>) -> Option<Vec<f32>> {
    let device = weight.device();
    let ids = ids();
    let index = Tensor::<B, 2, Int>::from_data(
        TensorData::new(ids.iter().map(|&t| t as i64).collect::<Vec<_>>(), [1, LEN]),
        &device,
    );
    let text = embedding(weight.clone(), index);
    let merged = scatter_image_embeddings(text, &ids, &[IMAGE_TOKEN], images.clone()).unwrap();
    let c = Tensor::<B, 3>::from_inner(ramp([1, LEN, HIDDEN], 1e-6));
    let grads = (merged * c).sum().backward();
    weight
        .grad(&grads)
        .map(|g| g.into_data().to_vec::<f32>().unwrap())
}

#[test]
fn a_backward_on_another_thread_does_not_lose_an_embedding_gradient() {
    let device = Default::default();
    let weight = Tensor::<B, 2>::from_inner(ramp([VOCAB, HIDDEN], 1e-4)).require_grad();
    let images = Tensor::<B, 2>::from_inner(Tensor::<Inner, 2>::ones([LEN / 2, HIDDEN], &device));
    // The first backward also makes `weight` a reused leaf, as after a first micro-batch.
    let want = embedding_gradient(&weight, &images).expect("no other thread yet");
    assert!(want.iter().any(|&g| g != 0.0));

    let stop = Arc::new(AtomicBool::new(false));
    let sweepers: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let device = Default::default();
                let mut passes = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let x = Tensor::<B, 1>::from_inner(Tensor::<Inner, 1>::ones([4], &device))
                        .require_grad();
                    let _ = (x * 2.0).sum().backward();
                    passes += 1;
                }
                passes
            })
        })
        .collect();
    let (mut lost, mut wrong) = (0, 0);
    for _ in 0..ROUNDS {
        match embedding_gradient(&weight, &images) {
            None => lost += 1,
            Some(g) if g != want => wrong += 1,
            Some(_) => {}
        }
    }
    stop.store(true, Ordering::Relaxed);
    let passes: u64 = sweepers.into_iter().map(|s| s.join().unwrap()).sum();
    assert!(passes > 0, "the other threads ran no backward pass");
    assert_eq!(
        (lost, wrong),
        (0, 0),
        "of {ROUNDS} backward passes beside {passes} on other threads: (lost, wrong) gradients"
    );
}

/// Data-parallel replicas differentiate at once (no lock serialises them): each of three threads
/// differentiates its own copy of the weights, round after round, and no gradient goes missing
/// or comes out different.
#[test]
fn replicas_differentiating_at_once_lose_no_gradient() {
    const REPLICAS: usize = 3;
    const REPETITIONS: usize = 300;
    let device = Default::default();
    let weight = Tensor::<B, 2>::from_inner(ramp([VOCAB, HIDDEN], 1e-4)).require_grad();
    let images = Tensor::<B, 2>::from_inner(Tensor::<Inner, 2>::ones([LEN / 2, HIDDEN], &device));
    let want = embedding_gradient(&weight, &images).expect("one thread");
    let barrier = std::sync::Barrier::new(REPLICAS);
    let outcomes: Vec<(usize, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..REPLICAS)
            .map(|_| {
                let (weight, images, want, barrier) = (&weight, &images, &want, &barrier);
                s.spawn(move || {
                    // Each replica's own leaf, as a replica's own copy of the model.
                    let mine = Tensor::<B, 2>::from_inner(weight.clone().inner()).require_grad();
                    let (mut lost, mut wrong) = (0, 0);
                    for _ in 0..REPETITIONS {
                        barrier.wait();
                        match embedding_gradient(&mine, images) {
                            None => lost += 1,
                            Some(g) if g != *want => wrong += 1,
                            Some(_) => {}
                        }
                    }
                    (lost, wrong)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        outcomes,
        vec![(0, 0); REPLICAS],
        "(lost, wrong) gradients per replica over {REPETITIONS} concurrent backward passes"
    );
}
