//! `reward.overlong`: DAPO's soft overlong punishment (verl `reward_model.overlong_buffer`,
//! `workers/reward_manager/dapo.py`), applied to the scores of another reward node.
//!
//! With L = `max_response_length`, B = `len` (the buffer) and f = `penalty_factor`, a response of
//! ℓ tokens (its EOS included, as verl's `valid_response_length`) gets
//!
//! ```text
//! overlong_reward = min(−(ℓ − (L − B)) / B · f, 0)
//! ```
//!
//! added to its score: nothing up to L − B tokens, then a penalty growing linearly to −f at L.
//! The components `overlong_reward` and `overlong` (1 when penalised) are added beside the input's
//! (logged as `critic/score/overlong_reward/mean`, `critic/score/overlong/mean`).

use std::sync::Arc;

use anyhow::Result;
use flowrl_engine::{
    BuildContext, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec, Params,
    PortSpec, StepContext, ValidateCtx,
};
use serde::Deserialize;

use crate::kinds::reward::support::{SCORES, log_score_metrics, reward_outputs};
use crate::kinds::validate::rollout_upstream;
use crate::values::ScoreBatch;

/// The `reward.overlong` kind.
pub struct OverlongRewardKind;

#[derive(Debug, Clone, Deserialize, Params)]
struct OverlongParams {
    /// the buffer: tokens before max_response_length where the penalty grows (verl
    /// overlong_buffer.len)
    #[param(required, min = 1)]
    len: usize,
    /// the penalty at max_response_length (verl overlong_buffer.penalty_factor)
    #[param(default = 1.0, min = 0.0)]
    penalty_factor: f64,
    /// the rollout's max_new_tokens (verl data.max_response_length)
    #[param(required, min = 1)]
    max_response_length: usize,
}

impl NodeKind for OverlongRewardKind {
    fn name(&self) -> &str {
        "reward.overlong"
    }

    fn doc(&self) -> &str {
        "DAPO overlong shaping (verl overlong_buffer): adds min(-(len_resp - (max_response_length \
         - len)) / len * penalty_factor, 0) to each score."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            SCORES
                .spec()
                .doc("the scores to shape (a reward node's `scores`)"),
        ]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        reward_outputs()
    }

    fn params(&self) -> Vec<ParamSpec> {
        OverlongParams::param_specs()
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        let p = match ctx.parse::<OverlongParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        let (len, max) = (p.len, p.max_response_length);
        if len > max {
            out.push(ctx.error(
                "len",
                format!("the buffer len {len} is longer than max_response_length {max}"),
            ));
        }
        if let Some((rollout, sampling)) = ctx.node().and_then(|n| rollout_upstream(&n))
            && let Some(generated) = sampling.max_new_tokens
            && generated != max
        {
            out.push(ctx.error(
                "max_response_length",
                format!(
                    "max_response_length {max} differs from `{}.max_new_tokens` {generated}: the \
                     penalty must reach its full value where generation stops",
                    rollout.name()
                ),
            ));
        }
        out
    }

    /// A few numbers per row on the host: nothing the plan counts.
    fn footprint(&self, _: &flowrl_engine::PlanCtx) -> Option<flowrl_engine::Footprint> {
        Some(flowrl_engine::Footprint::default())
    }

    fn build(&self, params: &Params, _ctx: &BuildContext) -> Result<Box<dyn Node>> {
        Ok(Box::new(OverlongNode { p: params.parse()? }))
    }
}

struct OverlongNode {
    p: OverlongParams,
}

/// verl's `overlong_reward` of a response of `length` tokens.
fn overlong_reward(length: usize, p: &OverlongParams) -> f64 {
    let expected = p.max_response_length as f64 - p.len as f64;
    let exceed = length as f64 - expected;
    (-exceed / p.len as f64 * p.penalty_factor).min(0.0)
}

impl Node for OverlongNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let input = inputs.get_arc(SCORES)?;
        let mut batch: ScoreBatch = (*input).clone();
        let penalties: Vec<f64> = input
            .rollouts
            .response_lengths()
            .into_iter()
            .map(|l| overlong_reward(l, &self.p))
            .collect();
        for (s, r) in batch.scores.iter_mut().zip(&penalties) {
            *s = (*s as f64 + r) as f32;
        }
        batch.components.insert(
            "overlong_reward".into(),
            penalties.iter().map(|&r| r as f32).collect(),
        );
        batch.components.insert(
            "overlong".into(),
            penalties.iter().map(|&r| f32::from(r < 0.0)).collect(),
        );
        batch.rollouts = Arc::clone(&input.rollouts);
        batch.check()?;
        log_score_metrics(ctx, &batch);
        Ok(Outputs::new().with(SCORES, batch))
    }
}

flowrl_engine::register_node_kind!(OverlongRewardKind);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_penalty_grows_linearly_over_the_buffer() {
        let p = OverlongParams {
            len: 4,
            penalty_factor: 1.0,
            max_response_length: 16,
        };
        // L − B = 12: no penalty up to 12 tokens, −1/4 per token after, −1 at 16.
        let r: Vec<f64> = [0, 12, 13, 14, 16].map(|l| overlong_reward(l, &p)).to_vec();
        assert_eq!(r, vec![0.0, 0.0, -0.25, -0.5, -1.0]);
        let half = OverlongParams {
            penalty_factor: 0.5,
            ..p
        };
        assert_eq!(overlong_reward(16, &half), -0.5);
    }
}
