//! Data parallelism at the node level: the data-parallel node kinds (`rollout`, `logprob`,
//! `update.ppo`, `update.sft`) built with several CPU replicas in one process give what one
//! replica gives — the same responses, the same log-probs, and the same update within float
//! tolerance — with the optimizer whole on every replica (ZeRO stage 0) or sharded over them
//! (stages 1 and 2); every replica keeps its own copy of the weights, equal to the policy's.

mod common;

use common::{GRAPH, assert_same_steps, build, build_graph, close, max_abs_diff, root, step};
use flowrl_engine::DeviceSpec;
use flowrl_models::weights::Precision;

/// The nodes of the test graph on `replicas` CPU replicas, the updates at `zero_stage`.
fn build_zero(replicas: usize, zero_stage: u8) -> common::Built {
    build_zero_in(replicas, zero_stage, None)
}

/// [`build_zero`] with the policy computing in `precision`.
fn build_zero_in(replicas: usize, zero_stage: u8, precision: Option<Precision>) -> common::Built {
    let graph = GRAPH.replace(
        "lr = 1e-3\n",
        &format!("lr = 1e-3\nzero_stage = {zero_stage}\n"),
    );
    assert_eq!(graph.matches("zero_stage").count(), 2, "both update nodes");
    build_graph(
        &graph,
        &root().join("assets/tiny-qwen2-vl"),
        (0..replicas).map(DeviceSpec::Cpu).collect(),
        precision,
    )
}

/// Every replica's copy holds the policy's weights, bit for bit.
fn assert_copies_in_step(b: &common::Built, replicas: usize, what: &str) {
    let own = b.model_values();
    let copies = b.copies_values();
    assert_eq!(
        copies.len(),
        replicas - 1,
        "{what}: one kept copy per other replica"
    );
    for (i, c) in copies.iter().enumerate() {
        assert!(
            c == &own,
            "{what}: replica {}'s copy differs from the policy",
            i + 1
        );
    }
}

#[test]
fn replicas_in_one_process_match_one_device() {
    // Adam's steps are ≈ lr = 1e-3 per weight; reduction-order noise stays far below that.
    let mut three = build(3);
    assert_same_steps(
        &mut build(1),
        &mut three,
        "3 replicas vs 1",
        1e-4,
        1e-3,
        1e-4,
    );
    assert_copies_in_step(&three, 3, "stage 0");
}

#[test]
fn sharded_optimizers_match_one_device() {
    for (replicas, stage) in [(2, 1), (3, 2)] {
        let what = format!("{replicas} replicas at ZeRO stage {stage} vs 1 device");
        let mut sharded = build_zero(replicas, stage);
        assert_same_steps(&mut build(1), &mut sharded, &what, 1e-4, 1e-3, 1e-4);
        assert_copies_in_step(&sharded, replicas, &what);
    }
}

/// Stages 1 and 2 compute stage 0's update: stage 1 bit for bit; stage 2 with the gradient
/// norm summed in another order (weights within 1e-6 of the largest); each replica holds about a
/// third of the moments.
#[test]
fn sharding_changes_the_memory_not_the_update() {
    let mut whole = build_zero(3, 0);
    let mut stage1 = build_zero(3, 1);
    let mut stage2 = build_zero(3, 2);
    for s in 0..2 {
        let x = step(&mut whole, s);
        let y = step(&mut stage1, s);
        let z = step(&mut stage2, s);
        assert_eq!(x.rollouts.response_ids, z.rollouts.response_ids);
        assert_eq!(x.update_metrics, y.update_metrics, "stage 1, step {s}");
        assert_eq!(x.sft_metrics, y.sft_metrics, "stage 1, step {s}");
        for (ma, mb) in [
            (&x.update_metrics, &z.update_metrics),
            (&x.sft_metrics, &z.sft_metrics),
        ] {
            for ((ka, va), (kb, vb)) in ma.iter().zip(mb) {
                assert_eq!(ka, kb);
                assert!(close(*va, *vb, 1e-4), "stage 2 step {s}: {ka} {va} vs {vb}");
            }
        }
    }
    let w = whole.model_values();
    assert!(
        w == stage1.model_values(),
        "stage 1's weights differ from stage 0's"
    );
    let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = max_abs_diff(&w, &stage2.model_values());
    assert!(
        worst <= 1e-6 * scale,
        "stage 2: weights differ by {worst} (largest weight {scale})"
    );
    let full: usize = whole.optimizer_values()[0];
    // Stage 0: every replica holds all the moments; stages 1 and 2 about a third each.
    assert_eq!(whole.optimizer_values(), vec![full; 3]);
    eprintln!(
        "moment values per replica: stage 0 {:?}",
        whole.optimizer_values()
    );
    for (stage, b) in [(1, &stage1), (2, &stage2)] {
        let held = b.optimizer_values();
        eprintln!("moment values per replica: stage {stage} {held:?}");
        assert_eq!(held.iter().sum::<usize>(), full, "stage {stage}: {held:?}");
        for h in &held {
            assert!(
                (*h as f64) < 0.5 * full as f64,
                "stage {stage}: a replica holds {h} of {full} moment values ({held:?})"
            );
        }
    }
}

/// A policy computing in bf16 at stages 1 and 2 shards its f32 master weights too: each replica
/// keeps the masters of the parameters it owns and the others' weights in bf16. The update is
/// stage 0's (stage 1 bit for bit; stage 2 within a quarter of one AdamW step), and a checkpoint
/// holds every master, whole.
#[test]
fn sharded_masters_change_the_memory_not_the_update() {
    let bf16 = Some(Precision::BF16);
    let mut whole = build_zero_in(3, 0, bf16);
    let mut stage1 = build_zero_in(3, 1, bf16);
    let mut stage2 = build_zero_in(3, 2, bf16);
    for s in 0..2 {
        let x = step(&mut whole, s);
        let y = step(&mut stage1, s);
        let z = step(&mut stage2, s);
        assert_eq!(x.rollouts.response_ids, y.rollouts.response_ids, "step {s}");
        assert_eq!(x.update_metrics, y.update_metrics, "stage 1, step {s}");
        assert_eq!(x.sft_metrics, y.sft_metrics, "stage 1, step {s}");
        for ((ka, va), (kb, vb)) in x.update_metrics.iter().zip(&z.update_metrics) {
            assert_eq!(ka, kb);
            // Stage 2's masters differ from stage 0's in the last bits (the norm's summation
            // order), which can round a weight's bf16 view the other way: 1e-3 here.
            assert!(close(*va, *vb, 1e-3), "stage 2 step {s}: {ka} {va} vs {vb}");
        }
    }
    let w = whole.weights();
    assert!(
        w == stage1.weights(),
        "stage 1's masters differ from stage 0's"
    );
    // The bf16 views of stage 2's masters round a few weights the other way (see above): its
    // masters stay within a quarter of one AdamW step (≈ lr = 1e-3) of stage 0's.
    let worst = max_abs_diff(&w, &stage2.weights());
    assert!(worst <= 2.5e-4, "stage 2: masters differ by {worst}");
    let full = whole.master_values()[0];
    assert_eq!(
        whole.master_values(),
        vec![full; 3],
        "stage 0 keeps every master"
    );
    for (stage, b) in [(1, &stage1), (2, &stage2)] {
        let held = b.master_values();
        eprintln!("f32 master values per replica: stage {stage} {held:?} of {full}");
        assert_eq!(held.iter().sum::<usize>(), full, "stage {stage}: {held:?}");
        assert!(
            held.iter().all(|&h| (h as f64) < 0.5 * full as f64),
            "stage {stage}: {held:?} of {full}"
        );
    }
}
