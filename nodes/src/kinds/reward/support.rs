//! What the `reward.*` kinds share: scoring a [`RolloutBatch`] with a rule-based
//! [`RewardFunction`] into a [`ScoreBatch`], and verl's reward metrics.
//!
//! Ports of every reward kind: `rollouts: Rollouts` → `scores: Scores`. Metrics per step
//! (verl's names): `critic/score/mean|max|min`, `critic/rewards/mean|max|min` (equal to the
//! score: no KL is folded into rule-based rewards), and `critic/score/<component>/mean` for each
//! named component (geo3k: `acc`, `format`; combined: each part and its sub-components).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use flowrl_algorithms::rewards::RewardFunction;
use flowrl_engine::{Inputs, Node, Outputs, Port, PortSpec, StepContext};

use crate::values::{RolloutBatch, ScoreBatch, port_types};

/// The input of every reward kind but `reward.overlong`.
pub const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);
/// The output of every reward kind.
pub const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);

/// `rollouts: Rollouts`.
pub(crate) fn reward_inputs() -> Vec<PortSpec> {
    vec![
        ROLLOUTS
            .spec()
            .doc("responses to score (text, ground truth)"),
    ]
}

/// `scores: Scores`.
pub(crate) fn reward_outputs() -> Vec<PortSpec> {
    vec![
        SCORES
            .spec()
            .doc("one scalar per response, with named components"),
    ]
}

/// Scores every response of `rollouts` against its ground truth.
pub fn score_rollouts(f: &dyn RewardFunction, rollouts: Arc<RolloutBatch>) -> Result<ScoreBatch> {
    let rule = ScoreColumns::of_rule(f, &rollouts)?;
    let narrow = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect();
    let batch = ScoreBatch {
        rollouts,
        scores: narrow(rule.scores),
        components: rule
            .components
            .into_iter()
            .map(|(name, v)| (name, narrow(v)))
            .collect(),
    };
    batch.check()?;
    Ok(batch)
}

/// Scores of a batch of responses and their components, in f64: as a rule computes them (a
/// combination weighs them, and `eval` averages them, before anything is rounded to f32), or
/// widened from a [`ScoreBatch`].
pub(crate) struct ScoreColumns {
    /// One per response.
    pub scores: Vec<f64>,
    /// Each component, one value per response (0 where a rule reports none for a response).
    pub components: BTreeMap<String, Vec<f64>>,
}

impl ScoreColumns {
    /// `f`'s score of every response of `rollouts` against its ground truth.
    pub fn of_rule(f: &dyn RewardFunction, rollouts: &RolloutBatch) -> Result<ScoreColumns> {
        rollouts.check()?;
        let mut scores = Vec::with_capacity(rollouts.len());
        let mut components: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for (i, (text, truth)) in rollouts
            .response_text
            .iter()
            .zip(&rollouts.ground_truth)
            .enumerate()
        {
            let s = f.score(text, truth);
            scores.push(s.score);
            for (name, v) in s.components {
                components
                    .entry(name)
                    .or_insert_with(|| vec![0.0; rollouts.len()])[i] = v;
            }
        }
        Ok(ScoreColumns { scores, components })
    }

    /// The scores and components of `batch`, widened.
    pub fn of_batch(batch: &ScoreBatch) -> ScoreColumns {
        let widen = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect();
        ScoreColumns {
            scores: widen(&batch.scores),
            components: batch
                .components
                .iter()
                .map(|(k, v)| (k.clone(), widen(v)))
                .collect(),
        }
    }

    /// Response `r`'s components, by name.
    pub fn row(&self, r: usize) -> Vec<(String, f64)> {
        self.components
            .iter()
            .map(|(k, v)| (k.clone(), v[r]))
            .collect()
    }
}

fn mean_max_min(v: &[f32]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    let max = v.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x as f64));
    let min = v.iter().fold(f64::INFINITY, |a, &x| a.min(x as f64));
    Some((mean, max, min))
}

/// Records `critic/score/*`, `critic/rewards/*` and `critic/score/<component>/mean`.
pub fn log_score_metrics(ctx: &mut StepContext, batch: &ScoreBatch) {
    if let Some((mean, max, min)) = mean_max_min(&batch.scores) {
        for prefix in ["critic/score", "critic/rewards"] {
            ctx.metric(format!("{prefix}/mean"), mean);
            ctx.metric(format!("{prefix}/max"), max);
            ctx.metric(format!("{prefix}/min"), min);
        }
    }
    for (name, v) in &batch.components {
        if let Some((mean, _, _)) = mean_max_min(v) {
            ctx.metric(format!("critic/score/{name}/mean"), mean);
        }
    }
}

/// A node that scores its rollouts with one reward function.
pub(crate) struct RewardNode {
    pub(crate) reward: Box<dyn RewardFunction>,
}

impl Node for RewardNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let rollouts = inputs.get_arc(ROLLOUTS)?;
        let batch = score_rollouts(self.reward.as_ref(), rollouts)?;
        log_score_metrics(ctx, &batch);
        Ok(Outputs::new().with(SCORES, batch))
    }
}

/// Declares a parameterless `reward.*` kind backed by one [`BuiltinReward`] variant, so each
/// kind file states only its name, doc and reward:
/// `builtin_reward_kind!(FormatRewardKind, "reward.format", "doc…", BuiltinReward::Format);`.
///
/// [`BuiltinReward`]: flowrl_algorithms::rewards::BuiltinReward
macro_rules! builtin_reward_kind {
    ($(#[$meta:meta])* $kind:ident, $name:literal, $doc:expr, $reward:expr) => {
        $(#[$meta])*
        pub struct $kind;

        impl flowrl_engine::NodeKind for $kind {
            fn name(&self) -> &str {
                $name
            }
            fn doc(&self) -> &str {
                $doc
            }
            fn inputs(&self) -> Vec<flowrl_engine::PortSpec> {
                $crate::kinds::reward::support::reward_inputs()
            }
            fn outputs(&self) -> Vec<flowrl_engine::PortSpec> {
                $crate::kinds::reward::support::reward_outputs()
            }
            fn params(&self) -> Vec<flowrl_engine::ParamSpec> {
                Vec::new()
            }
            fn timing_key(&self) -> Option<&str> {
                Some("reward")
            }
            /// A few numbers per row on the host: nothing the plan counts.
            fn footprint(
                &self,
                _: &flowrl_engine::PlanCtx,
            ) -> Option<flowrl_engine::Footprint> {
                Some(flowrl_engine::Footprint::default())
            }
            fn build(
                &self,
                _params: &flowrl_engine::Params,
                _ctx: &flowrl_engine::BuildContext,
            ) -> anyhow::Result<Box<dyn flowrl_engine::Node>> {
                Ok(Box::new($crate::kinds::reward::support::RewardNode {
                    reward: Box::new($reward),
                }))
            }
        }

        flowrl_engine::register_node_kind!($kind);
    };
}
pub(crate) use builtin_reward_kind;

#[cfg(test)]
pub(crate) mod test_support {
    //! A small rollout batch for the reward and advantage kinds' tests.

    use std::sync::Arc;

    use flowrl_engine::{DeviceSpec, Inputs, Payload, Port, Resources, StepContext, Value};

    pub use super::{ROLLOUTS, SCORES};
    use crate::values::{PromptBatch, RolloutBatch, TokenMatrix};

    /// Responses with the given texts, ground truths and uids; response `i` has `lens[i]` tokens.
    pub fn rollouts(
        texts: &[&str],
        truths: &[&str],
        uids: &[&str],
        lens: &[usize],
    ) -> Arc<RolloutBatch> {
        let b = texts.len();
        let t = lens.iter().copied().max().unwrap_or(0).max(1);
        let mut mask = TokenMatrix::zeros(b, t);
        for (i, &n) in lens.iter().enumerate() {
            mask.row_mut(i)[..n].fill(1.0);
        }
        let batch = RolloutBatch {
            prompts: Arc::new(PromptBatch {
                prompts: Vec::new(),
                pad_token_id: 0,
                image_token_id: None,
                epoch: 0,
            }),
            prompt_index: vec![0; b],
            uid: uids.iter().map(|s| s.to_string()).collect(),
            prompt_ids: vec![Vec::new(); b],
            response_ids: lens.iter().map(|&n| vec![1; n]).collect(),
            response_mask: mask,
            sampling_log_probs: TokenMatrix::zeros(b, t),
            ground_truth: truths.iter().map(|s| s.to_string()).collect(),
            data_source: vec!["hiyouga/geometry3k".into(); b],
            response_text: texts.iter().map(|s| s.to_string()).collect(),
            truncated: vec![false; b],
            trajectories: Vec::new(),
        };
        batch.check().unwrap();
        Arc::new(batch)
    }

    /// Inputs with one opaque value on `port`.
    pub fn inputs<T: std::any::Any + Send + Sync>(node: &str, port: Port<T>, v: T) -> Inputs {
        let mut i = Inputs::new(node);
        i.insert(
            port.name(),
            Value::new(port.port_type(), Payload::opaque(v)),
        );
        i
    }

    /// A build context outside the engine.
    pub fn build_ctx(node: &str) -> flowrl_engine::BuildContext {
        flowrl_engine::BuildContext {
            node: node.into(),
            device: DeviceSpec::Cpu(0),
            placement: flowrl_engine::Placement::single(DeviceSpec::Cpu(0)),
            seed: 7,
            total_steps: 1,
            resources: Arc::new(Resources::default()),
            run_dir: None,
            graph: None,
        }
    }

    /// A step context outside the engine.
    pub fn ctx(node: &str) -> StepContext {
        StepContext::new(
            node,
            0,
            1,
            7,
            DeviceSpec::Cpu(0),
            Arc::new(Resources::default()),
        )
    }

    /// The metric `name` recorded in `ctx`.
    pub fn metric(ctx: &StepContext, name: &str) -> f64 {
        ctx.metrics()
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no metric {name}: {:?}", ctx.metrics()))
            .1
    }

    /// Params from a JSON object.
    pub fn params(v: serde_json::Value) -> flowrl_engine::Params {
        flowrl_engine::Params::from_map(v.as_object().unwrap().clone())
    }
}
