//! LoRA adapters on every family (the tiny assets `assets/tiny-qwen2-vl`, `assets/tiny-gemma4`
//! and the fixture models): fresh adapters give exactly the base's logits; only adapters
//! require gradients; adapter gradients match central finite differences; the merged model
//! equals the adapted one; PEFT files round-trip; bad targets, ranks and foreign adapters are
//! refused with messages that say what exists.

mod common;

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::prelude::*;
use common::{lora_checks, max_abs_diff, model_cases, temp_dir};
use flowrl_models::lora::{AdapterInit, LoraConfig, read_peft_adapter};
use flowrl_models::weights::Precision;
use flowrl_models::{Model, PaddedBatch};

type Ad = Autodiff<Flex>;

/// The tiny assets and one text-only fixture model of each family.
fn model_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut dirs = vec![
        root.join("assets/tiny-qwen2-vl"),
        root.join("assets/tiny-gemma4"),
    ];
    dirs.extend(
        model_cases(&["qwen2_vl", "qwen2_5_vl", "gemma4"])
            .into_iter()
            .take(3),
    );
    dirs
}

fn config(rank: usize, targets: &[&str]) -> LoraConfig {
    LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        dropout: 0.0,
        target_modules: targets.iter().map(|s| s.to_string()).collect(),
    }
}

const ATTN_MLP: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// Two left-padded text rows whose ids fit any of the tiny vocabularies.
fn batch() -> PaddedBatch {
    PaddedBatch::left_pad(&[vec![5, 17, 42, 9, 77, 3], vec![11, 23, 8, 64]], 0)
}

/// Logits `[B, L, V]` of `batch` as host values.
fn logits<B: Backend>(model: &Model<B>, batch: &PaddedBatch) -> Vec<f32> {
    logits_tensor(model, batch)
        .into_data()
        .convert::<f32>()
        .into_vec()
        .unwrap()
}

fn logits_tensor<B: Backend>(model: &Model<B>, batch: &PaddedBatch) -> Tensor<B, 3> {
    model.logits(batch, &[], &Default::default()).unwrap()
}

/// Gives every adapter's `B` seeded non-zero values, so the adapter changes the output.
fn perturb_b<B: Backend>(model: Model<B>, seed: u64) -> Model<B> {
    let ids: std::collections::HashSet<_> =
        model.adapter_ids().into_iter().map(|(_, _, b)| b).collect();
    struct Perturb(std::collections::HashSet<burn::module::ParamId>, u64);
    impl<B: Backend> burn::module::ModuleMapper<B> for Perturb {
        fn map_float<const D: usize>(&mut self, p: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            if !self.0.contains(&p.id) {
                return p;
            }
            self.1 += 1;
            let seed = self.1;
            p.map(|t| {
                let n = t.shape().num_elements();
                let values: Vec<f32> = (0..n)
                    .map(|i| {
                        let x = ((i as u64 + 1) * 2654435761 + seed * 40503) % 1000;
                        (x as f32 / 1000.0 - 0.5) * 0.2
                    })
                    .collect();
                let rg = t.is_require_grad();
                Tensor::<B, D>::from_data(TensorData::new(values, t.shape()), &t.device())
                    .set_require_grad(rg)
            })
        }
    }
    model.map(&mut Perturb(ids, seed))
}

#[test]
fn fresh_adapters_give_exactly_the_base_logits() {
    let device = Default::default();
    for dir in model_dirs() {
        let base = Model::<Flex>::load(&dir, &device).unwrap();
        let (adapted, modules) = Model::<Flex>::load_adapted(
            &dir,
            &device,
            Precision::F32,
            &config(4, ATTN_MLP),
            AdapterInit::Fresh(3),
        )
        .unwrap();
        assert!(!modules.is_empty(), "{}: nothing adapted", dir.display());
        // The vision tower is not adapted unless named.
        assert!(
            modules
                .iter()
                .all(|m| !flowrl_models::lora::in_vision_tower(m)),
            "{}: {modules:?}",
            dir.display()
        );
        let (a, b) = (logits(&base, &batch()), logits(&adapted, &batch()));
        assert_eq!(
            a,
            b,
            "{}: B = 0 must leave the logits unchanged",
            dir.display()
        );
    }
}

#[test]
fn only_adapters_require_gradients() {
    let device = Default::default();
    let dir = &model_dirs()[0];
    let (model, modules) = Model::<Ad>::load_adapted(
        dir,
        &device,
        Precision::F32,
        &config(2, &["all-linear"]),
        AdapterInit::Fresh(1),
    )
    .unwrap();
    struct Count {
        trainable: usize,
        frozen: usize,
    }
    impl<B: Backend> ModuleVisitor<B> for Count {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            if p.val().is_require_grad() {
                self.trainable += 1;
            } else {
                self.frozen += 1;
            }
        }
    }
    let mut c = Count {
        trainable: 0,
        frozen: 0,
    };
    model.visit(&mut c);
    assert_eq!(c.trainable, 2 * modules.len());
    assert!(c.frozen > 0);
    // all-linear adapts no lm_head and no vision linear.
    assert!(modules.iter().all(|m| m != "lm_head"));
    assert!(modules.iter().any(|m| m.ends_with("mlp.down_proj")));
}

/// The loss whose gradient is checked: the logits of the real positions, weighted by a fixed
/// pattern and summed.
fn loss<B: Backend>(model: &Model<B>) -> Tensor<B, 1> {
    let l = logits_tensor(model, &batch());
    let n = l.shape().num_elements();
    let b = batch();
    let [_, len, vocab] = l.dims();
    // Real positions only: a padded query row attends to no key, and its values are no one's.
    let w: Vec<f32> = (0..n)
        .map(|i| {
            let (row, pos) = (i / (len * vocab), (i / vocab) % len);
            let real = b.mask_row(row)[pos] as f32;
            real * (((i * 7919) % 13) as f32 / 13.0 - 0.5)
        })
        .collect();
    let w = Tensor::<B, 3>::from_data(TensorData::new(w, l.shape()), &l.device());
    (l * w).sum()
}

#[test]
fn adapter_gradients_match_finite_differences() {
    let device = Default::default();
    for dir in model_dirs().into_iter().take(2) {
        let (model, _) = Model::<Ad>::load_adapted(
            &dir,
            &device,
            Precision::F32,
            &config(2, &["q_proj", "down_proj"]),
            AdapterInit::Fresh(5),
        )
        .unwrap();
        let model = perturb_b(model, 9);
        let grads = loss(&model).backward();
        let ids = model.adapter_ids();
        let (module, a_id, b_id) = ids[ids.len() / 2].clone();
        let inner = model.valid();
        for (which, id) in [("A", a_id), ("B", b_id)] {
            // The analytic gradient of this parameter.
            struct Grab<'a> {
                id: burn::module::ParamId,
                grads: &'a <Ad as burn::tensor::backend::AutodiffBackend>::Gradients,
                out: Option<Vec<f32>>,
            }
            impl ModuleVisitor<Ad> for Grab<'_> {
                fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<Ad, D>>) {
                    if p.id == self.id {
                        self.out = p
                            .val()
                            .grad(self.grads)
                            .map(|g| g.into_data().convert::<f32>().into_vec().unwrap());
                    }
                }
            }
            let mut grab = Grab {
                id,
                grads: &grads,
                out: None,
            };
            model.visit(&mut grab);
            let analytic = grab.out.expect("the adapter has a gradient");
            // Central differences on a few entries; the f32 loss of a few hundred leaves a
            // noise of ~1e-3 in them at this step.
            let eps = 1e-2f32;
            for k in [0usize, analytic.len() / 2, analytic.len() - 1] {
                let shifted = |delta: f32| {
                    struct Shift(burn::module::ParamId, usize, f32);
                    impl<B: Backend> burn::module::ModuleMapper<B> for Shift {
                        fn map_float<const D: usize>(
                            &mut self,
                            p: Param<Tensor<B, D>>,
                        ) -> Param<Tensor<B, D>> {
                            if p.id != self.0 {
                                return p;
                            }
                            let (k, d) = (self.1, self.2);
                            p.map(|t| {
                                let mut v: Vec<f32> =
                                    t.clone().into_data().convert::<f32>().into_vec().unwrap();
                                v[k] += d;
                                Tensor::from_data(TensorData::new(v, t.shape()), &t.device())
                            })
                        }
                    }
                    let m = inner.clone().map(&mut Shift(id, k, delta));
                    loss(&m).into_scalar() as f64
                };
                let numeric = (shifted(eps) - shifted(-eps)) / (2.0 * eps as f64);
                let a = analytic[k] as f64;
                assert!(
                    (numeric - a).abs() <= 5e-3 * (1.0 + a.abs()),
                    "{}: {module} lora_{which}[{k}]: analytic {a}, finite differences {numeric}",
                    dir.display()
                );
            }
        }
    }
}

#[test]
fn merged_model_equals_the_adapted_one_and_adapters_round_trip() {
    let device = Default::default();
    for dir in model_dirs() {
        let cfg = config(4, ATTN_MLP);
        let (model, _) =
            Model::<Flex>::load_adapted(&dir, &device, Precision::F32, &cfg, AdapterInit::Fresh(2))
                .unwrap();
        let model = perturb_b(model, 4);
        let adapted = logits(&model, &batch());
        let base = logits(&Model::<Flex>::load(&dir, &device).unwrap(), &batch());
        assert!(
            max_abs_diff(&adapted, &base) > 1e-3,
            "{}: the perturbed adapter must change the logits",
            dir.display()
        );

        // The base model's function with the adapters switched off.
        let off = logits(&model.clone().adapters_off(), &batch());
        assert_eq!(off, base, "{}", dir.display());

        // Merged: W + s·B·A folded in, loaded as a plain model.
        let tag = dir.file_name().unwrap().to_string_lossy().to_string();
        let merged_dir = temp_dir(&format!("merged-{tag}"));
        model.save_merged_as(&merged_dir, None, None).unwrap();
        let merged = Model::<Flex>::load(&merged_dir, &device).unwrap();
        assert!(!merged.has_adapters());
        // W + s·B·A rounded once to f32: within 1e-5 relative to the logits' scale.
        let d = max_abs_diff(&logits(&merged, &batch()), &adapted);
        let scale = adapted.iter().fold(1.0f32, |m, x| m.max(x.abs()));
        assert!(
            d <= 1e-5 * scale,
            "{}: merged vs adapter forward {d} (logits up to {scale})",
            dir.display()
        );

        // PEFT layout: written, read back, loaded onto the base again.
        let adapter_dir = temp_dir(&format!("adapter-{tag}"));
        model
            .save_adapter(&adapter_dir, &cfg, &dir.display().to_string())
            .unwrap();
        let (read_cfg, stored) = read_peft_adapter(&adapter_dir).unwrap();
        assert_eq!((read_cfg.rank, read_cfg.alpha), (cfg.rank, cfg.alpha));
        let (again, _) = Model::<Flex>::load_adapted(
            &dir,
            &device,
            Precision::F32,
            &read_cfg,
            AdapterInit::Stored(stored),
        )
        .unwrap();
        assert_eq!(logits(&again, &batch()), adapted, "{}", dir.display());
        // ... and into an existing adapted model (restoring a checkpoint).
        let (_, stored) = read_peft_adapter(&adapter_dir).unwrap();
        let (fresh, _) = Model::<Flex>::load_adapted(
            &dir,
            &device,
            Precision::F32,
            &cfg,
            AdapterInit::Fresh(77),
        )
        .unwrap();
        let restored = fresh.set_adapters(stored).unwrap();
        assert_eq!(logits(&restored, &batch()), adapted, "{}", dir.display());
    }
}

#[test]
fn bf16_base_with_f32_adapters() {
    let device = Default::default();
    let dir = &model_dirs()[0];
    let (model, _) = Model::<Flex>::load_adapted(
        dir,
        &device,
        Precision::BF16,
        &config(4, ATTN_MLP),
        AdapterInit::Fresh(2),
    )
    .unwrap();
    let ids: std::collections::HashSet<_> = model
        .adapter_ids()
        .into_iter()
        .flat_map(|(_, a, b)| [a, b])
        .collect();
    /// Adapter dtypes and base dtypes.
    struct Split(
        std::collections::HashSet<burn::module::ParamId>,
        Vec<burn::tensor::DType>,
        Vec<burn::tensor::DType>,
    );
    impl<B: Backend> ModuleVisitor<B> for Split {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            if self.0.contains(&p.id) {
                self.1.push(p.val().dtype());
            } else {
                self.2.push(p.val().dtype());
            }
        }
    }
    let mut split = Split(ids, Vec::new(), Vec::new());
    model.visit(&mut split);
    assert!(!split.1.is_empty());
    assert!(
        split.1.iter().all(|d| *d == burn::tensor::DType::F32),
        "{:?}",
        split.1
    );
    assert!(
        split.2.iter().all(|d| *d == burn::tensor::DType::BF16),
        "{:?}",
        split.2
    );
}

#[test]
fn bad_lora_settings_are_refused_with_what_exists() {
    let device = Default::default();
    let dirs = model_dirs();
    let qwen = &dirs[0];
    let err = Model::<Flex>::load_adapted(
        qwen,
        &device,
        Precision::F32,
        &config(4, &["q_proj", "query_key_value"]),
        AdapterInit::Fresh(1),
    )
    .expect_err("an unknown target is refused")
    .to_string();
    assert!(
        err.contains("`query_key_value` matches no linear module"),
        "{err}"
    );
    for leaf in ["q_proj", "down_proj", "qkv (vision tower)"] {
        assert!(err.contains(leaf), "{err}");
    }
    let err = Model::<Flex>::load_adapted(
        qwen,
        &device,
        Precision::F32,
        &config(0, &["q_proj"]),
        AdapterInit::Fresh(1),
    )
    .expect_err("rank 0 is refused")
    .to_string();
    assert!(err.contains("rank must be at least 1"), "{err}");

    // An adapter made for another base: Gemma 4's onto Qwen2-VL.
    let gemma = &dirs[1];
    let cfg = config(4, ATTN_MLP);
    let (g, _) =
        Model::<Flex>::load_adapted(gemma, &device, Precision::F32, &cfg, AdapterInit::Fresh(1))
            .unwrap();
    let adapter_dir = temp_dir("foreign-adapter");
    g.save_adapter(&adapter_dir, &cfg, "tiny-gemma4").unwrap();
    let (read_cfg, stored) = read_peft_adapter(&adapter_dir).unwrap();
    let err = Model::<Flex>::load_adapted(
        qwen,
        &device,
        Precision::F32,
        &read_cfg,
        AdapterInit::Stored(stored),
    )
    .expect_err("a foreign adapter is refused")
    .to_string();
    assert!(
        err.contains("does not fit module") || err.contains("has no weights for module"),
        "{err}"
    );
}

/// PEFT's adapters (tests/fixtures/lora) on their bases: logits, token log-probs, loss and the
/// gradient of every lora_A / lora_B match PEFT's (common/lora_checks.rs).
#[test]
fn peft_adapters_match_peft() {
    lora_checks::peft_adapters_match_peft::<Ad>(&Default::default());
}

/// Dropout on the adapters' input: only under autodiff, and its masks come from the thread's
/// `DropoutScope` (the same seed gives the same forward pass; another seed another one).
#[test]
fn lora_dropout_is_seeded_and_only_trains() {
    use flowrl_models::lora::DropoutScope;
    let device = Default::default();
    let dir = &model_dirs()[0];
    let mut cfg = config(4, ATTN_MLP);
    cfg.dropout = 0.5;
    let (model, _) =
        Model::<Ad>::load_adapted(dir, &device, Precision::F32, &cfg, AdapterInit::Fresh(2))
            .unwrap();
    let model = perturb_b(model, 3);
    let run = |seed: u64| {
        let _scope = DropoutScope::enter(seed);
        logits(&model, &batch())
    };
    let (a, b, c) = (run(1), run(1), run(2));
    assert_eq!(a, b);
    assert!(max_abs_diff(&a, &c) > 1e-4);
    // Without autodiff (generation, log-probs) there is no dropout.
    let inner = model.valid();
    let eval = logits(&inner, &batch());
    assert!(max_abs_diff(&eval, &a) > 1e-4);
    assert_eq!(eval, logits(&inner, &batch()));
}
