//! flowrl's GPU kernels (flowrl_models::kernels) against the composites they replace, computed
//! on the CPU (Flex): flash attention forward and backward, RMSNorm, SwiGLU, RoPE, and the
//! device sampler against the host sampler's rule (greedy tokens, the top-k/top-p threshold,
//! a chi-square test of the drawn frequencies). Generic over the GPU backend: tests/vulkan.rs
//! runs them on lavapipe, tests/cuda.rs on a GPU.

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use flowrl_models::kernels::sampling::sample_on_device;
use flowrl_models::layers::{AttentionMask, RmsNorm, Rotary, grouped_query_attention, silu};
use flowrl_models::sampling::{SamplingConfig, device_error, sample, threshold, uniform};

/// Deterministic values in [−scale, scale).
pub fn values(seed: u64, len: usize, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((s >> 40) as f32) / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn tensor<B: Backend, const D: usize>(
    v: &[f32],
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::<B, 1>::from_data(TensorData::new(v.to_vec(), [v.len()]), device).reshape(shape)
}

fn ints<B: Backend>(v: &[i64], shape: [usize; 2], device: &B::Device) -> Tensor<B, 2, Int> {
    Tensor::<B, 1, Int>::from_data(TensorData::new(v.to_vec(), [v.len()]), device).reshape(shape)
}

fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// An attention case: sizes, per batch row the keys' segments, the window.
struct AttentionCase {
    name: &'static str,
    heads: usize,
    kv_heads: usize,
    queries: usize,
    d: usize,
    segments: Vec<Vec<i64>>,
    window: Option<usize>,
}

fn attention_cases() -> Vec<AttentionCase> {
    let left_padded =
        |pad: usize, len: usize| -> Vec<i64> { (0..len).map(|j| i64::from(j >= pad)).collect() };
    vec![
        // Left padding (the first queries see no key), grouped heads, a prefill.
        AttentionCase {
            name: "prefill, left padding, 4 heads over 2",
            heads: 4,
            kv_heads: 2,
            queries: 37,
            d: 16,
            segments: vec![left_padded(5, 37), left_padded(0, 37)],
            window: None,
        },
        // Two packed sequences and a padding tail (padding-free training rows).
        AttentionCase {
            name: "packed segments, 2 heads over 1",
            heads: 2,
            kv_heads: 1,
            queries: 45,
            d: 8,
            segments: vec![
                (0..45)
                    .map(|j| {
                        if j < 20 {
                            1
                        } else if j < 41 {
                            2
                        } else {
                            0
                        }
                    })
                    .collect(),
            ],
            window: None,
        },
        // A decode step: one query over a cache of 70 keys, some padding.
        AttentionCase {
            name: "decode step over 70 keys",
            heads: 8,
            kv_heads: 2,
            queries: 1,
            d: 32,
            segments: vec![left_padded(3, 70), left_padded(0, 70), left_padded(69, 70)],
            window: None,
        },
        // Three queries over a cache with a sliding window of 9.
        AttentionCase {
            name: "sliding window 9, 3 queries over 50 keys",
            heads: 2,
            kv_heads: 2,
            queries: 3,
            d: 16,
            segments: vec![left_padded(4, 50)],
            window: Some(9),
        },
    ]
}

/// Whether query i of row `segs` (the last `queries` of the keys) sees no key: the rows the
/// kernel gives no gradient (their output is padding, which no loss reads).
fn sees_nothing(segs: &[i64], queries: usize, i: usize, window: Option<usize>) -> bool {
    let p = segs.len() - queries + i;
    let s_q = segs[p];
    !(0..=p)
        .any(|j| segs[j] != 0 && (s_q == 0 || s_q == segs[j]) && window.is_none_or(|w| j + w > p))
}

/// The flash forward on `G` against the composite on the CPU, for every case.
pub fn flash_attention_matches_the_composite<G: Backend>(device: &G::Device) {
    let cpu = Default::default();
    for (c, case) in attention_cases().iter().enumerate() {
        let b = case.segments.len();
        let keys = case.segments[0].len();
        let q = values(10 + c as u64, b * case.heads * case.queries * case.d, 1.5);
        let k = values(20 + c as u64, b * case.kv_heads * keys * case.d, 1.5);
        let v = values(30 + c as u64, b * case.kv_heads * keys * case.d, 1.0);
        let segs: Vec<i64> = case.segments.concat();
        let scale = 1.0 / (case.d as f64).sqrt();
        let run = |dev: &burn::backend::flex::FlexDevice| -> Vec<f32> {
            let mask = AttentionMask::causal(
                ints::<Flex>(&segs, [b, keys], dev),
                case.queries,
                case.window,
            );
            host(grouped_query_attention(
                tensor::<Flex, 4>(&q, [b, case.heads, case.queries, case.d], dev),
                tensor::<Flex, 4>(&k, [b, case.kv_heads, keys, case.d], dev),
                tensor::<Flex, 4>(&v, [b, case.kv_heads, keys, case.d], dev),
                &mask,
                scale,
            ))
        };
        let want = run(&cpu);
        let mask = AttentionMask::causal(
            ints::<G>(&segs, [b, keys], device),
            case.queries,
            case.window,
        );
        let got = host(grouped_query_attention(
            tensor::<G, 4>(&q, [b, case.heads, case.queries, case.d], device),
            tensor::<G, 4>(&k, [b, case.kv_heads, keys, case.d], device),
            tensor::<G, 4>(&v, [b, case.kv_heads, keys, case.d], device),
            &mask,
            scale,
        ));
        let diff = worst(&got, &want);
        eprintln!("flash forward, {}: max |diff| {diff:.2e}", case.name);
        assert!(
            diff < 2e-5,
            "{}: flash attention deviates by {diff:e}",
            case.name
        );
    }
}

/// The gradients of q, k and v through the flash backward on `GA` against the composite's on
/// the CPU, for a loss `Σ out ⊙ w` whose weights are 0 on the queries that see no key.
pub fn flash_gradients_match_the_composite<GA: AutodiffBackend>(device: &GA::Device) {
    type Cpu = Autodiff<Flex>;
    let cpu = Default::default();
    for (c, case) in attention_cases().iter().enumerate() {
        let b = case.segments.len();
        let keys = case.segments[0].len();
        if keys != case.queries {
            continue; // training attends to its own keys only
        }
        let (h, kvh, l, d) = (case.heads, case.kv_heads, case.queries, case.d);
        let q = values(40 + c as u64, b * h * l * d, 1.5);
        let k = values(50 + c as u64, b * kvh * keys * d, 1.5);
        let v = values(60 + c as u64, b * kvh * keys * d, 1.0);
        let mut w = values(70 + c as u64, b * h * l * d, 1.0);
        for (row, segs) in case.segments.iter().enumerate() {
            for i in (0..l).filter(|&i| sees_nothing(segs, l, i, case.window)) {
                for head in 0..h {
                    let at = ((row * h + head) * l + i) * d;
                    w[at..at + d].fill(0.0);
                }
            }
        }
        let segs: Vec<i64> = case.segments.concat();
        let scale = 1.0 / (d as f64).sqrt();
        /// q, k, v, the output's weights, the segment ids.
        type Inputs<'a> = (&'a [f32], &'a [f32], &'a [f32], &'a [f32], &'a [i64]);
        fn grads<A: AutodiffBackend>(
            dev: &A::Device,
            (q, k, v, w, segs): Inputs<'_>,
            [b, h, kvh, l, keys, d]: [usize; 6],
            window: Option<usize>,
            scale: f64,
        ) -> [Vec<f32>; 3] {
            let q = tensor::<A, 4>(q, [b, h, l, d], dev).require_grad();
            let k = tensor::<A, 4>(k, [b, kvh, keys, d], dev).require_grad();
            let v = tensor::<A, 4>(v, [b, kvh, keys, d], dev).require_grad();
            let mask = AttentionMask::causal(ints::<A>(segs, [b, keys], dev), l, window);
            let out = grouped_query_attention(q.clone(), k.clone(), v.clone(), &mask, scale);
            let loss = (out * tensor::<A, 4>(w, [b, h, l, d], dev)).sum();
            let g = loss.backward();
            [
                host(q.grad(&g).unwrap()),
                host(k.grad(&g).unwrap()),
                host(v.grad(&g).unwrap()),
            ]
        }
        let inputs = (&q[..], &k[..], &v[..], &w[..], &segs[..]);
        let sizes = [b, h, kvh, l, keys, d];
        let want = grads::<Cpu>(&cpu, inputs, sizes, case.window, scale);
        let got = grads::<GA>(device, inputs, sizes, case.window, scale);
        for (name, (g, e)) in ["q", "k", "v"].iter().zip(got.iter().zip(&want)) {
            let scale = e.iter().fold(0f32, |m, x| m.max(x.abs()));
            let diff = worst(g, e);
            eprintln!(
                "flash backward, {}: d{name} max |diff| {diff:.2e} (max |grad| {scale:.2e})",
                case.name
            );
            assert!(
                diff <= 1e-4 * scale.max(1.0),
                "{}: d{name} deviates by {diff:e}",
                case.name
            );
        }
    }
}

/// RMSNorm, SwiGLU's gate and RoPE through the kernels on `G` against their composites on the
/// CPU.
pub fn fused_elementwise_matches_the_composites<G: Backend>(device: &G::Device) {
    let cpu = Default::default();
    let (rows, dim) = (37, 96);
    let x = values(1, rows * dim, 3.0);
    let weight = values(2, dim, 1.0);
    let norm = |dev: &burn::backend::flex::FlexDevice| {
        let mut n = RmsNorm::<Flex>::new(dev, dim, 1e-6);
        n.weight = burn::module::Param::from_tensor(tensor::<Flex, 1>(&weight, [dim], dev));
        host(n.forward(tensor::<Flex, 2>(&x, [rows, dim], dev)))
    };
    let mut n = RmsNorm::<G>::new(device, dim, 1e-6);
    n.weight = burn::module::Param::from_tensor(tensor::<G, 1>(&weight, [dim], device));
    let got = host(n.forward(tensor::<G, 2>(&x, [rows, dim], device)));
    let diff = worst(&got, &norm(&cpu));
    assert!(diff < 1e-5, "RMSNorm deviates by {diff:e}");

    let up = values(3, rows * dim, 2.0);
    let want = host(
        silu(tensor::<Flex, 2>(&x, [rows, dim], &cpu)) * tensor::<Flex, 2>(&up, [rows, dim], &cpu),
    );
    let got = flowrl_models::kernels::elementwise::swiglu(
        &tensor::<G, 2>(&x, [rows, dim], device),
        &tensor::<G, 2>(&up, [rows, dim], device),
    )
    .map(host)
    .expect("a kernel on this backend");
    let diff = worst(&got, &want);
    assert!(diff < 1e-5, "SwiGLU deviates by {diff:e}");

    let (a, c, heads, d) = (2, 5, 3, 16);
    let angles = values(4, a * c * d, 6.0);
    let xr = values(5, a * c * heads * d, 1.0);
    let rope = |cos: Vec<f32>, sin: Vec<f32>| (cos, sin);
    let (cos, sin) = rope(
        angles.iter().map(|t| t.cos()).collect(),
        angles.iter().map(|t| t.sin()).collect(),
    );
    let rotate = |dev: &burn::backend::flex::FlexDevice| {
        let r = Rotary::<Flex>::new(
            tensor::<Flex, 3>(&cos, [a, c, d], dev),
            tensor::<Flex, 3>(&sin, [a, c, d], dev),
            heads,
            burn::tensor::DType::F32,
        );
        host(r.apply(tensor::<Flex, 4>(&xr, [a, c, heads, d], dev)))
    };
    let r = Rotary::<G>::new(
        tensor::<G, 3>(&cos, [a, c, d], device),
        tensor::<G, 3>(&sin, [a, c, d], device),
        heads,
        burn::tensor::DType::F32,
    );
    let got = host(r.apply(tensor::<G, 4>(&xr, [a, c, heads, d], device)));
    let diff = worst(&got, &rotate(&cpu));
    assert!(diff < 1e-5, "RoPE deviates by {diff:e}");
}

/// `rows` copies of one logits row with seeds 0..rows, sampled on `G` at position 7: per row
/// (id, log-prob, keep threshold).
fn device_draws<G: Backend>(
    logits: &[f32],
    rows: usize,
    config: &SamplingConfig,
    suppress: &[i64],
    device: &G::Device,
) -> Vec<[f32; 3]> {
    let vocab = logits.len();
    let all: Vec<f32> = (0..rows).flat_map(|_| logits.iter().copied()).collect();
    let seeds: Vec<i64> = (0..rows as u64)
        .flat_map(|s| (0..4).map(move |k| ((s >> (16 * k)) & 0xffff) as i64))
        .collect();
    let suppressed = suppress.len();
    let suppress = if suppress.is_empty() {
        vec![-1]
    } else {
        suppress.to_vec()
    };
    let sampled = sample_on_device(
        &tensor::<G, 2>(&all, [rows, vocab], device),
        &ints::<G>(&seeds, [rows, 4], device),
        7,
        config,
        &Tensor::<G, 1, Int>::from_data(
            TensorData::new(suppress.clone(), [suppress.len()]),
            device,
        ),
        suppressed,
    )
    .expect("a sampling kernel on this backend");
    host(sampled.picked)
        .chunks(3)
        .map(|r| [r[0], r[1], r[2]])
        .collect()
}

/// The χ² critical value of `df` degrees of freedom at p = 1e-6 (Wilson–Hilferty).
fn chi_square_critical(df: usize) -> f64 {
    let df = df as f64;
    let z = 4.753; // the standard normal's 1 − 1e-6 quantile
    df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3)
}

/// The device sampler against the host rule: greedy tokens and log-probs; per configuration
/// the keep threshold, the log-prob of every drawn token, and a χ² test of 10 000 draws against
/// the exact distribution over the kept tokens; NaN and fully masked rows as errors.
pub fn device_sampler_matches_the_host_rule<G: Backend>(device: &G::Device) {
    let vocab = 300;
    let logits = values(8, vocab, 4.0);
    // Greedy: a tie at the maximum goes to the lower id.
    let mut tied = logits.clone();
    let max_at = (0..vocab)
        .max_by(|&a, &b| tied[a].total_cmp(&tied[b]))
        .unwrap();
    tied[max_at / 2] = tied[max_at];
    let greedy = SamplingConfig::greedy();
    let host_pick = sample(&tied, &greedy, 0.5).unwrap();
    for row in device_draws::<G>(&tied, 4, &greedy, &[], device) {
        assert_eq!(row[0] as u32, host_pick.token, "greedy token");
        assert!(
            (row[1] - host_pick.log_prob).abs() < 1e-5,
            "greedy log-prob {} vs {}",
            row[1],
            host_pick.log_prob
        );
    }

    let configs = [
        SamplingConfig {
            temperature: 0.7,
            ..SamplingConfig::default()
        },
        SamplingConfig {
            top_k: 12,
            ..SamplingConfig::default()
        },
        SamplingConfig {
            top_p: 0.8,
            temperature: 1.3,
            ..SamplingConfig::default()
        },
        SamplingConfig {
            top_k: 40,
            top_p: 0.9,
            temperature: 0.9,
            greedy: false,
        },
    ];
    let suppress = [3i64, 150];
    let rows = 10_000;
    for config in &configs {
        let inv_t = config.inverse_temperature();
        let mut masked = logits.clone();
        for &t in &suppress {
            masked[t as usize] = f32::NEG_INFINITY;
        }
        let scaled: Vec<f32> = masked.iter().map(|&x| x * inv_t).collect();
        let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f32> = scaled.iter().map(|&y| (y - max).exp()).collect();
        let keep = threshold(&scaled, &weights, config);
        let kept: Vec<usize> = (0..vocab)
            .filter(|&i| scaled[i] >= keep && scaled[i] > f32::NEG_INFINITY)
            .collect();
        let mass: f64 = kept.iter().map(|&i| weights[i] as f64).sum();
        let z: f64 = weights.iter().map(|&w| w as f64).sum();
        let draws = device_draws::<G>(&logits, rows, config, &suppress, device);
        let mut counts = vec![0usize; vocab];
        let mut host_disagrees = 0;
        for (r, row) in draws.iter().enumerate() {
            let token = row[0] as usize;
            assert!(
                row[0] >= 0.0 && kept.contains(&token),
                "{config:?}: drew token {} outside the kept set",
                row[0]
            );
            counts[token] += 1;
            let want = (scaled[token] - max) as f64 - z.ln();
            assert!(
                (row[1] as f64 - want).abs() < 1e-4,
                "{config:?}: log-prob {} vs {want}",
                row[1]
            );
            let device_keep = if row[2] <= -3.0e38 {
                f32::NEG_INFINITY
            } else {
                row[2]
            };
            assert_eq!(device_keep, keep, "{config:?}: keep threshold");
            // The host rule with the same uniform draws the same token, unless the draw falls
            // within the f32 (device) against f64 (host) rounding of the cumulative sum.
            if r < 500 {
                let host_token = sample(&masked, config, uniform(r as u64, 7)).unwrap().token;
                host_disagrees += usize::from(host_token as usize != token);
            }
        }
        assert!(
            host_disagrees <= 2,
            "{config:?}: {host_disagrees} of 500 draws differ from the host's"
        );
        // χ² over the kept tokens, those of expected count < 5 pooled.
        let (mut chi, mut df, mut pooled_o, mut pooled_e) = (0.0, 0usize, 0.0, 0.0);
        for &i in &kept {
            let e = rows as f64 * weights[i] as f64 / mass;
            let o = counts[i] as f64;
            if e < 5.0 {
                pooled_o += o;
                pooled_e += e;
            } else {
                chi += (o - e).powi(2) / e;
                df += 1;
            }
        }
        if pooled_e > 0.0 {
            chi += (pooled_o - pooled_e).powi(2) / pooled_e.max(1e-9);
            df += 1;
        }
        let critical = chi_square_critical(df.saturating_sub(1).max(1));
        eprintln!(
            "sampler {config:?}: {} kept, chi-square {chi:.1} (df {}, critical {critical:.1})",
            kept.len(),
            df.saturating_sub(1)
        );
        assert!(chi < critical, "{config:?}: chi-square {chi} ≥ {critical}");
    }

    // NaN and fully masked rows are errors, not tokens.
    let mut nan = logits.clone();
    nan[17] = f32::NAN;
    let row = device_draws::<G>(&nan, 1, &SamplingConfig::default(), &[], device)[0];
    let err = device_error(row[0]).unwrap_err().to_string();
    assert!(err.contains("NaN"), "{err}");
    let all: Vec<i64> = (0..vocab as i64).collect();
    let row = device_draws::<G>(&logits, 1, &SamplingConfig::default(), &all, device)[0];
    let err = device_error(row[0]).unwrap_err().to_string();
    assert!(err.contains("probability 0"), "{err}");
}

/// The gradients through the fused RMSNorm (x and the weight; without a weight, x), SwiGLU
/// gate (both inputs) and RoPE (x) on `GA` against the composites' on the CPU, for a loss
/// `Σ y ⊙ w` with fixed random weights.
pub fn fused_elementwise_gradients_match_the_composites<GA: AutodiffBackend>(device: &GA::Device) {
    type Cpu = Autodiff<Flex>;
    let cpu = Default::default();
    let (rows, dim) = (19, 72);
    let x = values(11, rows * dim, 3.0);
    let weight = values(12, dim, 1.0);
    let up = values(13, rows * dim, 2.0);
    let loss_weights = values(14, rows * dim, 1.0);

    fn norm_grads<A: AutodiffBackend>(
        dev: &A::Device,
        (x, weight, w): (&[f32], &[f32], &[f32]),
        [rows, dim]: [usize; 2],
        scaled: bool,
    ) -> Vec<Vec<f32>> {
        let xt = tensor::<A, 2>(x, [rows, dim], dev).require_grad();
        let y = if scaled {
            let mut n = RmsNorm::<A>::new(dev, dim, 1e-6);
            n.weight = burn::module::Param::from_tensor(tensor::<A, 1>(weight, [dim], dev));
            let y = n.forward(xt.clone());
            let g = (y * tensor::<A, 2>(w, [rows, dim], dev)).sum().backward();
            return vec![
                host(xt.grad(&g).unwrap()),
                host(n.weight.val().grad(&g).unwrap()),
            ];
        } else {
            flowrl_models::layers::rms_normalize(xt.clone(), 1e-6)
        };
        let g = (y * tensor::<A, 2>(w, [rows, dim], dev)).sum().backward();
        vec![host(xt.grad(&g).unwrap())]
    }
    for scaled in [true, false] {
        let inputs = (&x[..], &weight[..], &loss_weights[..]);
        let want = norm_grads::<Cpu>(&cpu, inputs, [rows, dim], scaled);
        let got = norm_grads::<GA>(device, inputs, [rows, dim], scaled);
        for (k, (g, e)) in got.iter().zip(&want).enumerate() {
            let diff = worst(g, e);
            let scale = e.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(
                diff <= 1e-4 * scale.max(1.0),
                "RMSNorm (weight: {scaled}) gradient {k} deviates by {diff:e}"
            );
        }
    }

    fn gate_grads<A: AutodiffBackend>(
        dev: &A::Device,
        (gate, up, w): (&[f32], &[f32], &[f32]),
        shape: [usize; 2],
    ) -> Vec<Vec<f32>> {
        let g = tensor::<A, 2>(gate, shape, dev).require_grad();
        let u = tensor::<A, 2>(up, shape, dev).require_grad();
        let y = flowrl_models::kernels::elementwise::swiglu(&g, &u)
            .unwrap_or_else(|| silu(g.clone()) * u.clone());
        let grads = (y * tensor::<A, 2>(w, shape, dev)).sum().backward();
        vec![host(g.grad(&grads).unwrap()), host(u.grad(&grads).unwrap())]
    }
    let inputs = (&x[..], &up[..], &loss_weights[..]);
    let want = gate_grads::<Cpu>(&cpu, inputs, [rows, dim]);
    let got = gate_grads::<GA>(device, inputs, [rows, dim]);
    for (k, (g, e)) in got.iter().zip(&want).enumerate() {
        let diff = worst(g, e);
        assert!(diff < 1e-4, "SwiGLU gradient {k} deviates by {diff:e}");
    }

    let (a, c, heads, d) = (2, 5, 3, 16);
    let angles = values(15, a * c * d, 6.0);
    let xr = values(16, a * c * heads * d, 1.0);
    let wr = values(17, a * c * heads * d, 1.0);
    let cos: Vec<f32> = angles.iter().map(|t| t.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|t| t.sin()).collect();
    fn rope_grad<A: AutodiffBackend>(
        dev: &A::Device,
        (x, w, cos, sin): (&[f32], &[f32], &[f32], &[f32]),
        [a, c, heads, d]: [usize; 4],
    ) -> Vec<f32> {
        let r = Rotary::<A>::new(
            tensor::<A, 3>(cos, [a, c, d], dev),
            tensor::<A, 3>(sin, [a, c, d], dev),
            heads,
            burn::tensor::DType::F32,
        );
        let x = tensor::<A, 4>(x, [a, c, heads, d], dev).require_grad();
        let g = (r.apply(x.clone()) * tensor::<A, 4>(w, [a, c, heads, d], dev))
            .sum()
            .backward();
        host(x.grad(&g).unwrap())
    }
    let inputs = (&xr[..], &wr[..], &cos[..], &sin[..]);
    let diff = worst(
        &rope_grad::<GA>(device, inputs, [a, c, heads, d]),
        &rope_grad::<Cpu>(&cpu, inputs, [a, c, heads, d]),
    );
    assert!(diff < 1e-5, "RoPE gradient deviates by {diff:e}");
}
