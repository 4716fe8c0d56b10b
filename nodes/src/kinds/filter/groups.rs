//! `filter.groups`: DAPO's dynamic sampling (verl `algorithm.filter_groups`, recipe/dapo's
//! `RayDAPOTrainer.fit`).
//!
//! A group (the `n` responses of one prompt) whose responses all have the same `metric` value
//! carries no GRPO signal (every advantage is 0), so it is dropped: a group is kept when the
//! population standard deviation of its metric values is > 0, or when it has a single response.
//! While fewer than `batch_size` groups are kept, the node runs the nodes of its `repeat` list
//! again — the dataset node, the rollout and the reward — for a further generation batch. With
//! `batch_size` groups it keeps the first `batch_size` (verl: `batch[:train_batch_size * n]`) and
//! the step goes on. After `max_num_gen_batches` generation batches without enough groups it
//! fails, as verl does (0: no limit).
//!
//! `metric`: `acc` (or any component of the reward, e.g. `format`) reads that component; `score`,
//! `seq_reward` and `seq_final_reward` read the scalar score (flowrl's score is the response's
//! summed token-level reward, which verl's three names compute in its trainer).
//!
//! Metrics: `train/num_gen_batches` (verl's name: generation batches this step), and the reward
//! metrics (`critic/score/*`, `critic/rewards/*`) of the kept batch, which the update trains on.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Result, bail};
use flowrl_engine::{
    BuildContext, Capability, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec,
    Params, Port, PortSpec, StepContext, ValidateCtx,
};
use serde::Deserialize;

use crate::kinds::reward::support::log_score_metrics;
use crate::kinds::validate::DYNAMIC_SAMPLING;
use crate::values::{RolloutBatch, ScoreBatch, port_types};

/// The `filter.groups` kind.
pub struct FilterGroupsKind;

/// The scores of one generation batch (from the repeated nodes), and the kept ones.
const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);
/// The kept responses.
const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);

#[derive(Debug, Clone, Deserialize, Params)]
struct FilterGroupsParams {
    /// what must vary within a kept group: a reward component (acc, format, ...) or score |
    /// seq_reward | seq_final_reward (verl filter_groups.metric; DAPO uses acc)
    #[param(default = "acc")]
    metric: String,
    /// groups (prompts) per training batch (verl data.train_batch_size); default: the prompts of
    /// one generation batch
    #[param(min = 1)]
    batch_size: Option<usize>,
    /// generation batches per step before giving up with an error; 0: no limit (verl
    /// filter_groups.max_num_gen_batches)
    #[param(default = 0, min = 0)]
    max_num_gen_batches: u64,
}

impl NodeKind for FilterGroupsKind {
    fn name(&self) -> &str {
        "filter.groups"
    }

    fn doc(&self) -> &str {
        "DAPO dynamic sampling (verl algorithm.filter_groups): drops groups whose responses all \
         have the same metric value and runs its `repeat` list (data, rollout, reward) again \
         until `batch_size` groups are kept; metric train/num_gen_batches."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            SCORES
                .spec()
                .repeated()
                .doc("the scored responses of one generation batch"),
        ]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        vec![
            ROLLOUTS
                .spec()
                .doc("the kept responses (batch_size groups)"),
            SCORES.spec().doc("their scores"),
        ]
    }

    fn params(&self) -> Vec<ParamSpec> {
        FilterGroupsParams::param_specs()
    }

    fn capabilities(&self) -> Vec<Capability> {
        vec![DYNAMIC_SAMPLING]
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        let Some(node) = ctx.node() else {
            return out;
        };
        let p = match ctx.parse::<FilterGroupsParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        if !node
            .repeats()
            .iter()
            .any(|r| r.produces(port_types::PROMPTS))
        {
            out.push(ctx.error(
                "repeat",
                format!(
                    "`{}` generates further batches of new prompts, but no node in its `repeat` \
                     list produces Prompts: it would sample the same prompts again; list the \
                     dataset node, the rollout and the reward, e.g. `repeat = [\"data\", \
                     \"rollout\", \"reward\"]`",
                    ctx.name()
                ),
            ));
        }
        if let (Some(b), Some((per_batch, data))) = (
            p.batch_size,
            crate::kinds::validate::dataset_batch_size(ctx),
        ) && b > per_batch
            && p.max_num_gen_batches == 1
        {
            out.push(ctx.error(
                "batch_size",
                format!(
                    "batch_size {b} groups cannot come from one generation batch of \
                     `{data}.batch_size` {per_batch} prompts (max_num_gen_batches = 1)"
                ),
            ));
        }
        out
    }

    /// The kept groups' rows on the host, a few batches' worth: nothing the plan counts.
    fn footprint(&self, _: &flowrl_engine::PlanCtx) -> Option<flowrl_engine::Footprint> {
        Some(flowrl_engine::Footprint::default())
    }

    fn build(&self, params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        Ok(Box::new(FilterGroupsNode { p: params.parse()? }))
    }
}

struct FilterGroupsNode {
    p: FilterGroupsParams,
}

/// Whether `metric` reads the scalar score rather than a component.
fn reads_score(metric: &str) -> bool {
    matches!(metric, "score" | "seq_reward" | "seq_final_reward")
}

/// The rows of the groups of `batch` to keep, group by group in first-appearance order: a group
/// is kept when its metric values have a population standard deviation > 0 (numpy's `np.std`) or
/// it has one response.
fn kept_groups(batch: &ScoreBatch, metric: &str) -> Result<Vec<Vec<usize>>> {
    let values: &[f32] = if reads_score(metric) {
        &batch.scores
    } else {
        match batch.components.get(metric) {
            Some(v) => v,
            None => bail!(
                "the reward has no component `{metric}` to filter groups by; it has: {}",
                batch
                    .components
                    .keys()
                    .map(String::as_str)
                    .chain(["score"])
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    };
    let mut order: Vec<&str> = Vec::new();
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, uid) in batch.rollouts.uid.iter().enumerate() {
        groups
            .entry(uid)
            .or_insert_with(|| {
                order.push(uid);
                Vec::new()
            })
            .push(i);
    }
    Ok(order
        .into_iter()
        .map(|uid| groups.remove(uid).expect("grouped"))
        .filter(|rows| {
            let n = rows.len() as f64;
            let mean = rows.iter().map(|&i| values[i] as f64).sum::<f64>() / n;
            let var = rows
                .iter()
                .map(|&i| (values[i] as f64 - mean).powi(2))
                .sum::<f64>()
                / n;
            rows.len() == 1 || var.sqrt() > 0.0
        })
        .collect())
}

impl Node for FilterGroupsNode {
    fn run(&mut self, _inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let mut kept: Vec<(Arc<ScoreBatch>, Vec<Vec<usize>>)> = Vec::new();
        let mut num_groups = 0usize;
        let mut target = self.p.batch_size;
        let mut num_gen_batches = 0u64;
        loop {
            let got = ctx.repeat()?.run(Outputs::new())?;
            num_gen_batches += 1;
            let scores = got.get_arc(SCORES)?;
            let prompts_in_batch = scores
                .rollouts
                .uid
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            let target = *target.get_or_insert(prompts_in_batch);
            let groups = kept_groups(&scores, &self.p.metric)?;
            num_groups += groups.len();
            kept.push((scores, groups));
            if num_groups >= target {
                break;
            }
            let max = self.p.max_num_gen_batches;
            if max > 0 && num_gen_batches >= max {
                bail!(
                    "{num_gen_batches} generation batches gave {num_groups} groups whose `{}` \
                     varies, fewer than the batch's {target} (max_num_gen_batches = {max}); the \
                     prompts may be too hard or too easy for the policy: raise \
                     max_num_gen_batches (0: no limit) or filter on another metric",
                    self.p.metric
                );
            }
        }
        let target = target.expect("set by the first batch");
        let mut left = target;
        let parts: Vec<(Arc<ScoreBatch>, Vec<usize>)> = kept
            .into_iter()
            .map(|(s, groups)| {
                let take = groups.len().min(left);
                left -= take;
                (s, groups.into_iter().take(take).flatten().collect())
            })
            .collect();
        let batch = ScoreBatch::gather(&parts)?;
        ctx.metric("train/num_gen_batches", num_gen_batches as f64);
        log_score_metrics(ctx, &batch);
        Ok(Outputs::new()
            .with_arc(ROLLOUTS, batch.rollouts.clone())
            .with(SCORES, batch))
    }
}

flowrl_engine::register_node_kind!(FilterGroupsKind);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::TokenMatrix;
    use flowrl_datasets::{Prompt, PromptBatch, RowRef};

    /// `groups` groups of `n` responses, component `acc` per response.
    fn batch(acc: &[f32], n: usize) -> ScoreBatch {
        let groups = acc.len() / n;
        let prompts = PromptBatch {
            prompts: (0..groups)
                .map(|g| Prompt {
                    uid: format!("e0-{g}"),
                    input_ids: vec![1, 2],
                    images: Vec::new(),
                    pictures: Vec::new(),
                    messages: Vec::new(),
                    text: String::new(),
                    ground_truth: "1".into(),
                    data_source: "test".into(),
                    ability: None,
                    extra_info: serde_json::Value::Null,
                    source: RowRef {
                        file: "test.parquet".into(),
                        row: g,
                    },
                })
                .collect(),
            pad_token_id: 0,
            image_token_id: None,
            epoch: 0,
        };
        let b = acc.len();
        let rollouts = RolloutBatch::for_prompts(
            Arc::new(prompts),
            (0..b).map(|i| i / n).collect(),
            vec![vec![1]; b],
            TokenMatrix::new(vec![1.0; b], b, 1).unwrap(),
            TokenMatrix::zeros(b, 1),
            vec![String::new(); b],
            vec![false; b],
        );
        ScoreBatch {
            rollouts: Arc::new(rollouts),
            scores: acc.iter().map(|a| 0.9 * a).collect(),
            components: BTreeMap::from([("acc".to_string(), acc.to_vec())]),
        }
    }

    #[test]
    fn uniform_groups_are_dropped_and_single_responses_kept() {
        let b = batch(&[1.0, 1.0, 0.0, 1.0, 0.0, 0.0], 2);
        assert_eq!(kept_groups(&b, "acc").unwrap(), vec![vec![2, 3]]);
        assert_eq!(kept_groups(&b, "score").unwrap(), vec![vec![2, 3]]);
        let single = batch(&[1.0, 0.0], 1);
        assert_eq!(kept_groups(&single, "acc").unwrap().len(), 2);
    }

    #[test]
    fn an_unknown_metric_names_the_components() {
        let e = kept_groups(&batch(&[1.0, 0.0], 2), "accuracy")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no component `accuracy`") && e.contains("acc, score"),
            "{e}"
        );
    }

    #[test]
    fn gathering_keeps_the_rows_and_their_prompts() {
        let a = Arc::new(batch(&[1.0, 0.0, 1.0, 1.0], 2));
        let b = Arc::new(batch(&[0.0, 1.0], 2));
        let g = ScoreBatch::gather(&[(a, vec![0, 1]), (b, vec![0, 1])]).unwrap();
        assert_eq!(g.rollouts.len(), 4);
        assert_eq!(g.rollouts.prompts.prompts.len(), 2);
        assert_eq!(g.rollouts.prompt_index, vec![0, 0, 1, 1]);
        assert_eq!(g.components["acc"], vec![1.0, 0.0, 0.0, 1.0]);
    }
}
