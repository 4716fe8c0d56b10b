//! `generate` on batches that repeat prompts (a GRPO rollout asks each prompt n times): the
//! repeated prompts are prefilled once and their KV-cache rows repeated, which must not change
//! what any row samples.

mod common;

use burn::backend::Flex;
use common::model_cases;
use flowrl_models::Model;
use flowrl_models::generate::{GenerationConfig, ModelParts, PromptInput, generate};
use flowrl_models::sampling::SamplingConfig;

#[test]
fn repeated_prompts_sample_what_each_prompt_samples_alone() {
    let device = Default::default();
    for dir in model_cases(&["qwen2_vl", "qwen2_5_vl"]).into_iter().take(1) {
        let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let model = Model::<Flex>::random(&config, &device, 11).unwrap();
        let parts = ModelParts::of(&model);
        let (a, b): (&[u32], &[u32]) = (&[1, 2, 3, 4], &[5, 6]);
        let order = [a, b, a, a, b];
        let prompts: Vec<PromptInput<'_>> = order
            .iter()
            .map(|ids| PromptInput { ids, images: &[] })
            .collect();
        let config = GenerationConfig::new(6, SamplingConfig::default());
        let seeds = |range: std::ops::Range<u64>| -> Vec<u64> { range.collect() };
        let batched = generate(&parts, &prompts, &config, &seeds(0..5), &device).unwrap();
        let mut distinct_rows = std::collections::HashSet::new();
        for (r, prompt) in prompts.iter().enumerate() {
            let alone = generate(
                &parts,
                std::slice::from_ref(prompt),
                &config,
                &seeds(r as u64..r as u64 + 1),
                &device,
            )
            .unwrap();
            assert_eq!(batched.tokens[r], alone.tokens[0], "row {r}: tokens");
            assert_eq!(batched.stopped[r], alone.stopped[0], "row {r}: stopped");
            for (x, y) in batched.log_probs[r].iter().zip(&alone.log_probs[0]) {
                assert!((x - y).abs() < 1e-4, "row {r}: log-prob {x} vs {y}");
            }
            distinct_rows.insert(batched.tokens[r].clone());
        }
        // The copies of one prompt drew with their own seeds, not one shared draw.
        assert!(distinct_rows.len() > 2, "{distinct_rows:?}");
    }
}

/// Rows generated in chunks under a KV-cache budget, with the prompts prefilled in micro-batches,
/// sample what one batch samples (each row draws with its own seed); a budget below one row is an
/// error naming the row's length and the bytes it needs.
#[test]
fn chunks_under_a_cache_budget_and_prefill_micro_batches_sample_what_one_batch_samples() {
    let device = Default::default();
    for dir in model_cases(&["qwen2_vl", "qwen2_5_vl"]).into_iter().take(1) {
        let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let model = Model::<Flex>::random(&config, &device, 12).unwrap();
        let parts = ModelParts::of(&model);
        let (a, b, c): (&[u32], &[u32], &[u32]) = (&[1, 2, 3, 4], &[5, 6], &[7, 8, 9]);
        let order = [a, a, b, b, c, c, a];
        let prompts: Vec<PromptInput<'_>> = order
            .iter()
            .map(|ids| PromptInput { ids, images: &[] })
            .collect();
        let seeds: Vec<u64> = (40..47).collect();
        let one = GenerationConfig::new(8, SamplingConfig::default());
        let whole = generate(&parts, &prompts, &one, &seeds, &device).unwrap();
        let row = flowrl_models::generate::cache_bytes_per_row(parts.lm, 4, one.max_new_tokens);
        assert_eq!(
            row,
            (parts.lm.kv_cache_bytes_per_token() * (4 + 8 - 1)) as u64
        );
        let chunked = GenerationConfig {
            cache_budget: Some(2 * row + row / 2),
            prefill_tokens: Some(4),
            ..one.clone()
        };
        let got = generate(&parts, &prompts, &chunked, &seeds, &device).unwrap();
        assert_eq!(got.tokens, whole.tokens, "tokens");
        assert_eq!(got.stopped, whole.stopped, "stop flags");
        for (r, (x, y)) in got.log_probs.iter().zip(&whole.log_probs).enumerate() {
            for (p, q) in x.iter().zip(y) {
                assert!((p - q).abs() < 1e-4, "row {r}: log-prob {p} vs {q}");
            }
        }

        let tight = GenerationConfig {
            cache_budget: Some(row - 1),
            ..one
        };
        let err = generate(&parts, &prompts, &tight, &seeds, &device)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot hold one row") && err.contains("11 tokens"),
            "{err}"
        );
    }
}

/// KV-cached decoding's one-row `x · Wᵀ` products run on the vendored burn-flex's small-row
/// kernel (vendor/README.md), which reads each weight where it lies, and not on gemm, which
/// packs the whole weight on every call. This fails when a burn upgrade drops the kernel (the
/// counter is the patch's) or when decoding stops reaching it (a layout or size it does not take).
#[test]
fn decoding_runs_on_the_small_row_kernel() {
    #[cfg(target_arch = "x86_64")]
    let kernel = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    let kernel = false;
    if !kernel || std::env::var("FLOWRL_SMALL_M_KERNEL").as_deref() == Ok("gemm") {
        eprintln!("skipped: this CPU or FLOWRL_SMALL_M_KERNEL keeps small-row products on gemm");
        return;
    }
    let device = Default::default();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/tiny-qwen2-vl");
    let model = Model::<Flex>::load(&dir, &device).unwrap();
    let parts = ModelParts::of(&model);
    let prompt = PromptInput {
        ids: &[1, 2, 3, 4],
        images: &[],
    };
    let new_tokens = 6;
    let config = GenerationConfig::new(new_tokens, SamplingConfig::default());
    let products = burn::backend::flex::ops::matmul::small_row_products;
    let before = products();
    let out = generate(&parts, &[prompt], &config, &[7], &device).unwrap();
    let taken = products() - before;
    assert_eq!(out.tokens[0].len(), new_tokens);
    // Each forward pass (the prefill of the prompt's 4 tokens, then one per further token) runs
    // the q, o, gate, up and down projections of both decoder layers and the LM head on at most
    // 4 rows, all of sizes the kernel takes (the k and v projections, 64 → 32, are below its
    // `k · n ≥ 4096` floor and stay on gemm).
    let per_pass = 2 * 5 + 1;
    assert!(
        taken >= (new_tokens * per_pass) as u64,
        "{taken} products took the small-row kernel over {new_tokens} forward passes \
         (expected at least {per_pass} each)"
    );
}
