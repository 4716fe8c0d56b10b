//! `freeze_vision_tower` (verl's `actor.freeze_vision_tower`) on `update.sft` and `update.ppo`:
//! with the flag every weight of the vision tower (`visual.*`, merger included) stays
//! bit-identical through optimizer steps while the text weights move; without it the tower moves.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use flowrl_engine::{Registry, Session, compile};
use flowrl_models::weights::WeightVisitor;
use flowrl_nodes::resources::model::ModelResource;
use flowrl_nodes::runtime::backend::CpuBackend;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn session(text: &str) -> Session {
    std::env::set_current_dir(root()).unwrap();
    let (graph, _) = match compile(&Registry::builtin(), "graph.toml", text, &[]) {
        Ok(g) => g,
        Err(f) => panic!("{}", f.render()),
    };
    Session::build(graph, None, None).unwrap()
}

/// Every weight of the policy by checkpoint name.
fn named_weights(s: &Session) -> BTreeMap<String, Vec<f32>> {
    struct Collect(BTreeMap<String, Vec<f32>>);
    impl WeightVisitor<CpuBackend> for Collect {
        fn put<const D: usize>(&mut self, name: &str, t: Tensor<CpuBackend, D>) {
            let v = t.into_data().convert::<f32>().into_vec::<f32>().unwrap();
            self.0.insert(name.to_string(), v);
        }
    }
    let m = s.resources().get::<ModelResource>("policy").unwrap();
    let mut c = Collect(BTreeMap::new());
    m.lock::<CpuBackend>().unwrap().model.export(&mut c);
    c.0
}

/// (vision tensors changed, vision tensors, text tensors changed, text tensors).
fn changes(
    before: &BTreeMap<String, Vec<f32>>,
    after: &BTreeMap<String, Vec<f32>>,
) -> (usize, usize, usize, usize) {
    let (mut vc, mut vn, mut tc, mut tn) = (0, 0, 0, 0);
    for (name, b) in before {
        let a = &after[name];
        let changed = a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits());
        if name.starts_with("visual.") {
            vn += 1;
            vc += changed as usize;
        } else {
            tn += 1;
            tc += changed as usize;
        }
    }
    (vc, vn, tc, tn)
}

fn sft_graph(freeze: bool) -> String {
    format!(
        r#"
[run]
steps = 2
seed = 7

[models.policy]
path = "assets/tiny-qwen2-vl"

[nodes.data]
kind = "dataset.parquet"
model = "policy"
path = "datasets/shapes/test.parquet"
batch_size = 4
max_prompt_length = 128

[nodes.sft]
kind = "update.sft"
model = "policy"
inputs = {{ prompts = "data.prompts" }}
response_template = "<think> </think> \\boxed{{{{answer}}}}"
lr = 1e-3
freeze_vision_tower = {freeze}
"#
    )
}

fn ppo_graph(freeze: bool) -> String {
    format!(
        r#"
[run]
steps = 2
seed = 3

[models.policy]
path = "assets/tiny-qwen2-vl"
[models.reference]
from = "policy"

[nodes.data]
kind = "dataset.parquet"
model = "policy"
path = "datasets/shapes/test.parquet"
batch_size = 4
max_prompt_length = 128

[nodes.rollout]
kind = "rollout"
model = "policy"
inputs = {{ prompts = "data.prompts" }}
n = 4
max_new_tokens = 12

[nodes.old]
kind = "logprob"
model = "policy"
inputs = {{ rollouts = "rollout.rollouts" }}

[nodes.ref]
kind = "logprob"
model = "reference"
timing = "ref"
inputs = {{ rollouts = "rollout.rollouts" }}

[nodes.reward]
kind = "reward.format"
inputs = {{ rollouts = "rollout.rollouts" }}

[nodes.adv]
kind = "advantage.grpo"
inputs = {{ scores = "reward.scores" }}

[nodes.update]
kind = "update.ppo"
model = "policy"
inputs = {{ rollouts = "rollout.rollouts", advantages = "adv.advantages", old_log_probs = "old.log_probs", ref_log_probs = "ref.log_probs" }}
kl = {{ estimator = "low_var_kl", coef = 0.01 }}
lr = 1e-3
freeze_vision_tower = {freeze}
"#
    )
}

fn run(text: &str) -> (usize, usize, usize, usize) {
    let mut s = session(text);
    let before = named_weights(&s);
    for step in 0..2 {
        let out = s.run_step(step, &mut |_| {}).unwrap();
        let skipped = out
            .metrics
            .get("actor/skipped_steps")
            .copied()
            .unwrap_or(0.0);
        assert_eq!(skipped, 0.0, "step {step} skipped");
    }
    changes(&before, &named_weights(&s))
}

#[test]
fn sft_with_freeze_vision_tower_leaves_every_vision_weight_bit_identical() {
    let (vc, vn, tc, tn) = run(&sft_graph(true));
    assert!(vn > 10, "vision tensors: {vn}");
    assert_eq!(vc, 0, "{vc} of {vn} vision tensors changed");
    assert!(tc > tn / 2, "only {tc} of {tn} text tensors changed");
}

#[test]
fn sft_without_the_flag_moves_the_vision_tower() {
    let (vc, vn, tc, tn) = run(&sft_graph(false));
    assert!(vc > vn / 2, "only {vc} of {vn} vision tensors changed");
    assert!(tc > tn / 2, "only {tc} of {tn} text tensors changed");
}

#[test]
fn ppo_with_freeze_vision_tower_leaves_every_vision_weight_bit_identical() {
    let (vc, vn, tc, tn) = run(&ppo_graph(true));
    assert_eq!(vc, 0, "{vc} of {vn} vision tensors changed");
    assert!(tc > 0, "no text tensor of {tn} changed");
    let (vc, vn, _, _) = run(&ppo_graph(false));
    assert!(vc > 0, "no vision tensor of {vn} changed without the flag");
}

#[test]
fn the_vision_tower_is_the_visual_module_with_its_merger() {
    std::env::set_current_dir(root()).unwrap();
    let device = Default::default();
    let model =
        flowrl_models::Model::<CpuBackend>::load(&root().join("assets/tiny-qwen2-vl"), &device)
            .unwrap();
    let ids = model.vision_param_ids();
    let mut names = Vec::new();
    struct Names<'a>(&'a mut Vec<String>);
    impl WeightVisitor<CpuBackend> for Names<'_> {
        fn put<const D: usize>(&mut self, name: &str, _t: Tensor<CpuBackend, D>) {
            self.0.push(name.to_string());
        }
    }
    model.export(&mut Names(&mut names));
    let visual = names.iter().filter(|n| n.starts_with("visual.")).count();
    assert_eq!(ids.len(), visual, "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("visual.merger.")));
}
