//! The fused AdamW step (one host pass per parameter on Flex f32 tensors) against the
//! per-tensor burn-op step it replaces (`AdamW::with_fused(false)`): random parameters and
//! gradients, several steps, with and without weight decay, gradients clipped by their global
//! norm before each step (as the update nodes do), parameters of several sizes (the large ones
//! split over threads), a gradient that arrives as a transposed view (the matmul backward of a
//! `Linear` weight), and a parameter without a gradient at some steps. Parameters and both
//! moments must agree bit for bit.

use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::backend::AutodiffBackend;
use flowrl_nodes::runtime::backend::CpuBackend as AB;
use flowrl_nodes::train::optim::{AdamW, AdamWConfig, clip_grad_norm};

type Inner = <AB as AutodiffBackend>::InnerBackend;

#[derive(Module, Debug)]
struct Net<B: Backend> {
    /// `[1500, 700]`: over a million values, split over threads.
    big: Param<Tensor<B, 2>>,
    small: Param<Tensor<B, 1>>,
    odd: Param<Tensor<B, 3>>,
}

fn net(seed: u64) -> Net<AB> {
    let device = Default::default();
    <AB as Backend>::seed(&device, seed);
    let draw = |shape: Vec<usize>| {
        Tensor::<AB, 1>::random(
            [shape.iter().product::<usize>()],
            Distribution::Normal(0.0, 1.0),
            &device,
        )
    };
    Net {
        big: Param::from_tensor(draw(vec![1500, 700]).reshape([1500, 700])),
        small: Param::from_tensor(draw(vec![37])),
        odd: Param::from_tensor(draw(vec![3, 5, 7]).reshape([3, 5, 7])),
    }
}

/// Random gradients for `model` (the big one as a transposed view); `small` has none on
/// `skip_small` steps.
fn grads(model: &Net<AB>, step: usize, skip_small: bool) -> GradientsParams {
    let device = Default::default();
    <AB as Backend>::seed(&device, 1000 + step as u64);
    let scale = [1.0, 30.0, 0.01, 5.0, 0.3, 2.0][step % 6];
    let normal = Distribution::Normal(0.0, scale);
    let mut g = GradientsParams::new();
    let big = Tensor::<Inner, 2>::random([700, 1500], normal, &device).transpose();
    g.register::<Inner, 2>(model.big.id, big);
    if !skip_small {
        g.register::<Inner, 1>(
            model.small.id,
            Tensor::<Inner, 1>::random([37], normal, &device),
        );
    }
    g.register::<Inner, 3>(
        model.odd.id,
        Tensor::<Inner, 3>::random([3, 5, 7], normal, &device),
    );
    g
}

fn values<const D: usize>(p: &Param<Tensor<AB, D>>) -> Vec<u32> {
    p.val()
        .into_data()
        .into_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn run(fused: bool, config: AdamWConfig, clip: Option<f64>) -> (Net<AB>, tempfile::TempDir) {
    let mut model = net(7);
    let mut opt = AdamW::<AB>::new(config).with_fused(fused);
    for step in 0..6 {
        let mut g = grads(&model, step, step == 2);
        if let Some(max) = clip {
            clip_grad_norm(&model, &mut g, max);
        }
        let lr = [1e-3, 3e-4, 1e-2, 1e-6, 5e-3, 1e-4][step];
        model = opt.step(lr, model, g);
    }
    // The moments, through the state file (the values the next step would read).
    let dir = tempfile::tempdir().unwrap();
    opt.save(&dir.path().join("optim.safetensors")).unwrap();
    (model, dir)
}

/// Every tensor of the state file: name → raw bytes.
fn moments(dir: &tempfile::TempDir) -> std::collections::BTreeMap<String, Vec<u8>> {
    let bytes = std::fs::read(dir.path().join("optim.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| (name, view.data().to_vec()))
        .collect()
}

#[test]
fn fused_adamw_matches_the_per_tensor_step_bit_for_bit() {
    let configs = [
        AdamWConfig::default(),
        AdamWConfig {
            weight_decay: 0.0,
            ..AdamWConfig::default()
        },
        AdamWConfig {
            beta1: 0.8,
            beta2: 0.95,
            eps: 1e-6,
            weight_decay: 0.1,
        },
    ];
    for config in configs {
        for clip in [None, Some(1.0)] {
            let (fused, fused_dir) = run(true, config, clip);
            let (plain, plain_dir) = run(false, config, clip);
            let what = format!("{config:?}, clip {clip:?}");
            assert_eq!(values(&fused.big), values(&plain.big), "{what}: big");
            assert_eq!(values(&fused.small), values(&plain.small), "{what}: small");
            assert_eq!(values(&fused.odd), values(&plain.odd), "{what}: odd");
            let (a, b) = (moments(&fused_dir), moments(&plain_dir));
            assert_eq!(a.len(), 6, "{what}: two moments of three parameters");
            assert!(a == b, "{what}: the moments differ");
            // The parameters did move.
            assert_ne!(values(&fused.big), values(&net(7).big), "{what}");
        }
    }
}

/// Time of one optimizer step, fused and per-tensor, over the benchmark model's 61 M
/// parameters (bench/model_config.json's text decoder shapes, Linear gradients as transposed
/// views): `cargo test --release -p flowrl-nodes --test adamw_fused -- --ignored --nocapture`.
#[test]
#[ignore]
fn time_fused_vs_per_tensor_step() {
    #[derive(Module, Debug)]
    struct Big<B: Backend> {
        weights: Vec<Param<Tensor<B, 2>>>,
    }
    let device = Default::default();
    // Embeddings + LM head [32000, 512] each; per layer q, k, v, o and the MLP's three.
    let mut shapes = vec![[32000, 512], [32000, 512]];
    for _ in 0..8 {
        shapes.extend([[512, 512], [256, 512], [256, 512], [512, 512]]);
        shapes.extend([[1408, 512], [1408, 512], [512, 1408]]);
    }
    let make = || Big::<AB> {
        weights: shapes
            .iter()
            .map(|&s| Param::from_tensor(Tensor::zeros(s, &device)))
            .collect(),
    };
    let grads = |m: &Big<AB>| {
        let mut g = GradientsParams::new();
        for (p, s) in m.weights.iter().zip(&shapes) {
            let t = Tensor::<Inner, 2>::ones([s[1], s[0]], &device).transpose();
            g.register::<Inner, 2>(p.id, t);
        }
        g
    };
    let n: usize = shapes.iter().map(|s| s[0] * s[1]).sum();
    for fused in [false, true, false, true] {
        let mut model = make();
        let mut opt = AdamW::<AB>::new(AdamWConfig::default()).with_fused(fused);
        let mut times = Vec::new();
        for _ in 0..4 {
            let g = grads(&model);
            let t = std::time::Instant::now();
            model = opt.step(1e-6, model, g);
            times.push(t.elapsed().as_secs_f64());
        }
        eprintln!(
            "{} parameters, fused {fused}: step seconds {:?} (first step allocates the moments)",
            n,
            times.iter().map(|t| format!("{t:.3}")).collect::<Vec<_>>()
        );
    }
}
