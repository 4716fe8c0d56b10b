//! Bad input gets a clear error (or verl's documented behaviour), never a panic.

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;

use flowrl_algorithms::*;

type Cpu = Flex;

fn t(rows: usize, cols: usize, v: Vec<f32>) -> Tensor<Cpu, 2> {
    Tensor::from_data(TensorData::new(v, [rows, cols]), &Default::default())
}

fn host<const D: usize>(x: Tensor<Cpu, D>) -> Vec<f32> {
    x.into_data().iter::<f32>().collect()
}

#[test]
fn advantage_errors() {
    let r = t(2, 2, vec![0.0, 1.0, 0.0, 0.0]);
    let m = t(2, 2, vec![1.0; 4]);
    // index shorter than the batch
    let e = compute_advantages(r.clone(), m.clone(), &["a"], AdvantageEstimator::GRPO).unwrap_err();
    assert!(matches!(e, AlgoError::ShapeMismatch { .. }), "{e}");
    // mask of another shape
    let e = compute_advantages(
        r.clone(),
        t(2, 3, vec![1.0; 6]),
        &["a", "a"],
        AdvantageEstimator::GRPO,
    )
    .unwrap_err();
    assert!(e.to_string().contains("response_mask"), "{e}");
    // empty batch
    let e =
        compute_advantages_host::<&str>(&[], &[], 0, 3, &[], AdvantageEstimator::Rloo).unwrap_err();
    assert!(matches!(e, AlgoError::Empty(_)), "{e}");
    // NaN reward: flowrl refuses it (verl would spread the NaN over the whole group)
    let bad = t(2, 2, vec![0.0, f32::NAN, 0.0, 1.0]);
    for est in [
        AdvantageEstimator::GRPO,
        AdvantageEstimator::DR_GRPO,
        AdvantageEstimator::Rloo,
        AdvantageEstimator::ReinforcePlusPlusBaseline,
        AdvantageEstimator::ReinforcePlusPlus { gamma: 1.0 },
    ] {
        let e = compute_advantages(bad.clone(), m.clone(), &["a", "a"], est).unwrap_err();
        assert!(
            matches!(&e, AlgoError::NonFiniteScore { row: 0, uid, value } if uid == "a" && value.is_nan()),
            "{e}"
        );
        assert!(e.to_string().contains("response 0"), "{e}");
    }
    // REINFORCE++ needs two valid tokens (verl's masked_whiten raises)
    let e = compute_advantages(
        r,
        t(2, 2, vec![1.0, 0.0, 0.0, 0.0]),
        &["a", "b"],
        AdvantageEstimator::ReinforcePlusPlusBaseline,
    )
    .unwrap_err();
    assert_eq!(e, AlgoError::TooFewTokens(1));
    assert!("gae".parse::<AdvantageEstimator>().is_err());
}

#[test]
fn grouping_is_by_uid_not_position() {
    // Interleaved groups: a = {1, 0}, b = {0, 0, 1}.
    let scores = [1.0, 0.0, 0.0, 0.0, 0.0];
    let idx = ["a", "b", "a", "b", "b"];
    let scores = [scores[0], scores[1], scores[2], scores[3], 1.0];
    let adv = group_scalar_advantages(&scores, &idx, AdvantageEstimator::DR_GRPO).unwrap();
    let want = [0.5, -1.0 / 3.0, -0.5, -1.0 / 3.0, 2.0 / 3.0];
    for (a, w) in adv.iter().zip(want) {
        assert!((a - w).abs() < 1e-12, "{adv:?}");
    }
    // Singleton: GRPO gives s / (1 + 1e-6), RLOO s, vectorised RLOO 0.
    let one = group_scalar_advantages(&[2.0], &["x"], AdvantageEstimator::GRPO).unwrap();
    assert!((one[0] - 2.0 / (1.0 + 1e-6)).abs() < 1e-12);
    assert_eq!(
        group_scalar_advantages(&[2.0], &["x"], AdvantageEstimator::Rloo).unwrap(),
        vec![2.0]
    );
    assert_eq!(
        group_scalar_advantages(&[2.0], &["x"], AdvantageEstimator::RlooVectorized).unwrap(),
        vec![0.0]
    );
}

#[test]
fn agg_loss_errors_and_empty_mask() {
    let l = t(2, 2, vec![1.0, 2.0, 3.0, 4.0]);
    let e = agg_loss(
        l.clone(),
        t(1, 2, vec![1.0, 1.0]),
        LossAggMode::TokenMean,
        &GlobalBatchInfo::default(),
    )
    .unwrap_err();
    assert!(matches!(e, AlgoError::ShapeMismatch { .. }));
    assert_eq!(
        "nope".parse::<LossAggMode>().unwrap_err().to_string(),
        "Invalid loss_agg_mode: nope"
    );
    let dp2 = GlobalBatchInfo {
        dp_size: 2,
        ..Default::default()
    };
    assert_eq!(
        agg_loss(
            l.clone(),
            t(2, 2, vec![1.0; 4]),
            LossAggMode::TokenMean,
            &dp2
        )
        .unwrap_err()
        .to_string(),
        "(global) batch_num_tokens is required when dp_size > 1"
    );
    // verl's behaviour for an all-masked batch with local normalisation: 0/0 = NaN.
    let zero = t(2, 2, vec![0.0; 4]);
    for mode in [
        LossAggMode::TokenMean,
        LossAggMode::SeqMeanTokenSum,
        LossAggMode::SeqMeanTokenMean,
    ] {
        let v = host(agg_loss(l.clone(), zero.clone(), mode, &GlobalBatchInfo::default()).unwrap());
        assert!(v[0].is_nan(), "{mode}: {v:?}");
    }
    // ... and 0 for token-sum or with a global denominator.
    let g = GlobalBatchInfo {
        global_batch_size: Some(4.0),
        batch_num_tokens: Some(8.0),
        ..Default::default()
    };
    for mode in [
        LossAggMode::TokenSum,
        LossAggMode::TokenMean,
        LossAggMode::SeqMeanTokenSum,
    ] {
        assert_eq!(
            host(agg_loss(l.clone(), zero.clone(), mode, &g).unwrap()),
            vec![0.0]
        );
    }
    // NaN under the mask never leaks into token-* modes.
    let nan = t(1, 2, vec![1.0, f32::NAN]);
    let m = t(1, 2, vec![1.0, 0.0]);
    assert_eq!(
        host(agg_loss(nan, m, LossAggMode::TokenMean, &GlobalBatchInfo::default()).unwrap()),
        vec![1.0]
    );
}

#[test]
fn loss_and_kl_errors() {
    let a = t(1, 2, vec![0.0, 0.0]);
    let c = ClipConfig {
        clip_ratio_c: 1.0,
        ..Default::default()
    };
    let e = policy_loss_vanilla(
        a.clone(),
        a.clone(),
        a.clone(),
        a.clone(),
        None,
        &c,
        LossAggMode::TokenMean,
        &GlobalBatchInfo::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("clip_ratio_c"), "{e}");
    let e = policy_loss_vanilla(
        a.clone(),
        t(1, 3, vec![0.0; 3]),
        a.clone(),
        a.clone(),
        None,
        &ClipConfig::default(),
        LossAggMode::TokenMean,
        &GlobalBatchInfo::default(),
    )
    .unwrap_err();
    assert!(matches!(e, AlgoError::ShapeMismatch { .. }));
    assert!(matches!(
        "full".parse::<KlEstimator>(),
        Err(AlgoError::NotImplemented(_))
    ));
    assert!(matches!(
        "k4".parse::<KlEstimator>(),
        Err(AlgoError::Unknown { .. })
    ));
    let k3 = "k3".parse().unwrap();
    assert!(kl_penalty(a.clone(), t(2, 1, vec![0.0; 2]), k3).is_err());
    // As a reward penalty: masked and detached.
    let pen = kl_reward_penalty(
        t(1, 2, vec![0.0, 0.0]),
        t(1, 2, vec![1.0, 1.0]),
        t(1, 2, vec![1.0, 0.0]),
        "kl".parse().unwrap(),
    )
    .unwrap();
    assert_eq!(host(pen), vec![-1.0, 0.0]);
}

#[test]
fn entropy_errors_and_hidden_variant() {
    let dev = Default::default();
    let logits = Tensor::<Cpu, 3>::from_data(
        TensorData::new(
            (0..2 * 3 * 4)
                .map(|i| (i as f32 * 0.37).sin())
                .collect::<Vec<f32>>(),
            [2, 3, 4],
        ),
        &dev,
    );
    let labels =
        Tensor::<Cpu, 2, Int>::from_data(TensorData::new(vec![0i32, 1, 2, 3, 0, 1], [2, 3]), &dev);
    assert!(entropy_and_logprobs_chunked(logits.clone(), labels.clone(), 0).is_err());
    let bad_labels = Tensor::<Cpu, 2, Int>::from_data(TensorData::new(vec![0i32, 1], [1, 2]), &dev);
    assert!(logprobs_from_logits(logits.clone(), bad_labels).is_err());
    // Hidden states through a linear head, with temperature 0.7, equal the logits route.
    let w = Tensor::<Cpu, 2>::from_data(
        TensorData::new(
            (0..4 * 5)
                .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1)
                .collect::<Vec<f32>>(),
            [4, 5],
        ),
        &dev,
    );
    let head = |h: Tensor<Cpu, 3>| h.matmul(w.clone().unsqueeze_dim(0));
    let (e1, l1) =
        entropy_and_logprobs_from_hidden(logits.clone(), labels.clone(), head, 0.7, 2).unwrap();
    let full = head(logits.clone()).div_scalar(0.7);
    let e2 = entropy_from_logits(full.clone()).unwrap();
    let l2 = logprobs_from_logits(full, labels.clone()).unwrap();
    for (a, b) in host(e1)
        .iter()
        .zip(host(e2))
        .chain(host(l1).iter().zip(host(l2)))
    {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    assert!(entropy_and_logprobs_from_hidden(logits, labels, |h| h, 0.0, 2).is_err());
}

#[test]
fn entropy_is_differentiable() {
    type Ad = Autodiff<Flex>;
    let dev = Default::default();
    let z = Tensor::<Ad, 3>::from_data(TensorData::new(vec![1.0f32, 2.0, 3.0], [1, 1, 3]), &dev)
        .require_grad();
    let h = entropy_from_logits(z.clone()).unwrap();
    let g = z.grad(&h.sum().backward()).unwrap();
    // dH/dz_i = -p_i (z_i - Σ p z): finite difference check on the analytic form.
    let p: Vec<f32> = {
        let e: Vec<f32> = [1.0f32, 2.0, 3.0].iter().map(|x| x.exp()).collect();
        let s: f32 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    };
    let mean: f32 = p.iter().zip([1.0f32, 2.0, 3.0]).map(|(p, z)| p * z).sum();
    let want: Vec<f32> = p
        .iter()
        .zip([1.0f32, 2.0, 3.0])
        .map(|(p, z)| -p * (z - mean))
        .collect();
    for (a, b) in g.into_data().iter::<f32>().zip(want) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

#[test]
fn labels_outside_the_vocabulary_are_errors() {
    let dev = Default::default();
    let logits = Tensor::<Cpu, 3>::zeros([1, 2, 3], &dev);
    let labels = Tensor::<Cpu, 2, Int>::from_data(TensorData::new(vec![0i32, 3], [1, 2]), &dev);
    let e = logprobs_from_logits(logits.clone(), labels.clone()).unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary 0..3"), "{e}");
    assert!(entropy_and_logprobs_chunked(logits.clone(), labels.clone(), 1).is_err());
    assert!(entropy_and_logprobs_from_hidden(logits.clone(), labels, |h| h, 1.0, 1).is_err());
    let neg = Tensor::<Cpu, 2, Int>::from_data(TensorData::new(vec![-1i32, 0], [1, 2]), &dev);
    assert!(logprobs_from_logits(logits.clone(), neg).is_err());
    // An lm_head that returns the wrong shape is an error, not a panic.
    let ok = Tensor::<Cpu, 2, Int>::from_data(TensorData::new(vec![0i32, 1], [1, 2]), &dev);
    let e =
        entropy_and_logprobs_from_hidden(logits, ok, |h| h.narrow(1, 0, 1), 1.0, 2).unwrap_err();
    assert!(e.to_string().contains("lm_head output"), "{e}");
}

/// The registry losses: unknown names, verl's parameter checks, a bad injected permutation, and
/// DPPO-KL's NaN divergence (p > 1) that must not reach any output.
#[test]
fn policy_loss_registry_errors() {
    let e = "gpso".parse::<PolicyLossMode>().unwrap_err();
    assert!(e.to_string().contains("gspo"), "{e}");
    for (mode, name) in PolicyLossMode::ALL {
        assert_eq!(name.parse::<PolicyLossMode>().unwrap(), mode);
        assert_eq!(mode.to_string(), name);
    }
    let inputs = |lp: Vec<f32>| PolicyLossInputs {
        old_log_prob: t(1, 3, vec![-0.5, 0.2, -1.0]),
        log_prob: t(1, 3, lp),
        advantages: t(1, 3, vec![1.0, -1.0, 1.0]),
        response_mask: t(1, 3, vec![1.0, 1.0, 0.0]),
        rollout_is_weights: None,
    };
    let lp = vec![-0.4f32, 0.3, 5.0];
    let run = |config: PolicyLossConfig, randperm: &mut dyn FnMut(usize) -> Vec<usize>| {
        compute_policy_loss(
            &config,
            inputs(lp.clone()),
            LossAggMode::TokenMean,
            &GlobalBatchInfo::default(),
            randperm,
        )
    };
    let none = &mut |_: usize| -> Vec<usize> { panic!("no draw expected") };
    let with = |loss_mode| PolicyLossConfig {
        loss_mode,
        ..PolicyLossConfig::default()
    };
    // DRO needs a positive beta (verl's message).
    let e = run(with(PolicyLossMode::Dro), none).unwrap_err();
    assert!(
        e.to_string()
            .contains("policy_loss.dro_beta must be a positive value when using DRO"),
        "{e}"
    );
    // kl_cov_ratio must be in (0, 1], clip_cov_ratio > 0, taus non-zero.
    let mut c = with(PolicyLossMode::KlCov);
    c.kl_cov.ratio = 1.5;
    assert!(run(c, none).is_err());
    let mut c = with(PolicyLossMode::ClipCov);
    c.clip_cov.ratio = 0.0;
    assert!(run(c, none).is_err());
    let mut c = with(PolicyLossMode::Sapo);
    c.tau_neg = 0.0;
    assert!(run(c, none).is_err());
    // clip_cov refuses an injected "permutation" that is not one.
    let mut c = with(PolicyLossMode::ClipCov);
    c.clip_cov = ClipCovConfig {
        ratio: 1.0,
        lb: f64::NEG_INFINITY,
        ub: f64::INFINITY,
    };
    let e = run(c, &mut |k| vec![0; k]).unwrap_err();
    assert!(e.to_string().contains("permutation"), "{e}");
    // Two candidates, clip_num = ⌊0.5·2⌋ = 1: the first of the permutation is detached.
    c.clip_cov.ratio = 0.5;
    let out = run(c, &mut |k| (0..k).rev().collect()).unwrap();
    assert_eq!(out.selected.unwrap(), vec![false, true, false]);
    // DPPO-KL with p > 1 (log_prob > 0): the binary KL is NaN, only p vs p_old decides.
    let out = run(with(PolicyLossMode::DppoKl), none).unwrap();
    for m in out.metrics() {
        assert!(host(m.1)[0].is_finite(), "{}", m.0);
    }
    assert!(host(out.pg_loss)[0].is_finite());
}
