//! Parity of Qwen2-VL / Qwen2.5-VL with Hugging Face transformers on the golden fixtures
//! (tests/fixtures/models/<model_type>/<case>/, format in the fixtures README): position ids,
//! vision intermediates, image embeddings, decoder layers, logits, token log-probs, KV-cached
//! greedy decoding and gradients. Every case found under `FLOWRL_MODEL_FIXTURES` is run. The
//! checks live in common/qwen_checks.rs (shared with the GPU backends' vulkan.rs); here they run
//! on the CPU backend `Flex`, plus the CPU-only reduced-precision forward.

mod common;

use burn::backend::{Autodiff, Flex};
use common::qwen_checks::{
    FAMILIES, GRAD_TOL, TOL, forward_matches_transformers, gradients_match_transformers, host,
    kv_cached_decoding_matches_transformers, read_case, real_rows,
};
use common::{max_dev, model_cases};
use flowrl_models::Model;

/// Reduced precision: bf16 keeps 8 mantissa bits (relative step 2⁻⁸ ≈ 4e-3 per rounding).
const BF16_TOL: f64 = 0.1;
/// f16 keeps 11 mantissa bits.
const F16_TOL: f64 = 0.02;

#[test]
fn qwen_vl_fixture_cases_match_transformers() {
    let device = Default::default();
    forward_matches_transformers::<Flex>(&device, TOL);
    kv_cached_decoding_matches_transformers::<Flex>(&device, TOL);
}

#[test]
fn qwen_vl_fixture_gradients_match_transformers() {
    gradients_match_transformers::<Autodiff<Flex>>(&Default::default(), GRAD_TOL);
}

/// bf16 / f16 weights on the CPU backend: the same forward runs with every weight in the reduced
/// precision (norms, softmax and logits in f32) and stays close to the f32 reference.
#[test]
fn reduced_precision_forward_stays_close() {
    use flowrl_models::weights::Precision;
    let device = Default::default();
    for dir in model_cases(FAMILIES) {
        let case = read_case(&dir);
        let batch = &case.batch;
        for (precision, tol) in [(Precision::BF16, BF16_TOL), (Precision::F16, F16_TOL)] {
            let model = Model::<Flex>::load_with_precision(&dir, &device, precision).unwrap();
            let lm = model.causal_lm();
            let embeds = model
                .input_embeddings(batch, &case.images, &device)
                .unwrap();
            assert_eq!(embeds.dtype(), precision.dtype());
            let pos = model.position_ids(batch, &case.images).unwrap();
            let hidden = lm.forward_hidden(
                batch.ids_tensor(&device),
                embeds,
                pos.tensor(&device),
                batch.mask_tensor(&device),
                None,
            );
            let logits = lm.lm_head(hidden);
            let vocab = lm.vocab_size();
            let e = &case.expected["logits"];
            let (dev, scale) = max_dev(&host(logits), &e.values, real_rows(batch, vocab));
            let rel = dev / scale.max(1.0);
            eprintln!("{} {precision:?}: logits rel {rel:.2e}", case.name);
            assert!(
                rel <= tol,
                "{}: {precision:?} logits deviate by {rel:e}",
                case.name
            );
        }
    }
}
