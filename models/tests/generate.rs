//! `generate` on batches that repeat prompts (a GRPO rollout asks each prompt n times): the
//! repeated prompts are prefilled once and their KV-cache rows repeated, which must not change
//! what any row samples.

mod common;

use burn::backend::Flex;
use common::model_cases;
use flowrl_models::Model;
use flowrl_models::generate::{GenerationConfig, ModelParts, PromptInput, generate};
use flowrl_models::sampling::SamplingConfig;
use rand::SeedableRng;
use rand::rngs::StdRng;

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
        let config = GenerationConfig {
            max_new_tokens: 6,
            sampling: SamplingConfig::default(),
            stop_token_ids: vec![],
            pad_token_id: 0,
            suppress_token_ids: vec![],
        };
        let seeds = |range: std::ops::Range<u64>| -> Vec<StdRng> {
            range.map(StdRng::seed_from_u64).collect()
        };
        let batched = generate(&parts, &prompts, &config, &mut seeds(0..5), &device).unwrap();
        let mut distinct_rows = std::collections::HashSet::new();
        for (r, prompt) in prompts.iter().enumerate() {
            let alone = generate(
                &parts,
                std::slice::from_ref(prompt),
                &config,
                &mut seeds(r as u64..r as u64 + 1),
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
        // The copies of one prompt drew from their own RNGs, not one shared draw.
        assert!(distinct_rows.len() > 2, "{distinct_rows:?}");
    }
}
