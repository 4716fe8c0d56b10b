//! `reward.model`: a discriminative reward model scores each response — a model of any family
//! with a linear head `score` `[1, hidden]` (+ bias) on its final (normed) hidden states, read at
//! the response's last token:
//!
//!   score(r) = w · h_last(r) + b,   h_last(r) = the final hidden state at the last non-padding
//!   position of prompt + response (the last prompt token for an empty response).
//!
//! This is verl's reward-model worker (`AutoModelForTokenClassification` with `num_labels = 1`,
//! read at the last valid token of the attention mask) and transformers'
//! `*ForSequenceClassification` pooling (the logits at the last non-padding token). The model is a
//! value model (`value_head = true` on its `[models.*]` section: the critic's head code,
//! [`flowrl_models::value_head`]) whose head is stored: `value_head.safetensors`, or `score.weight`
//! (+ optional `score.bias`) among the directory's Hugging Face weights, as a
//! `*ForSequenceClassification` / `*ForTokenClassification` checkpoint stores it. A directory with
//! neither is refused at validation and at build (a critic may start from a fresh head, a reward
//! model may not).
//!
//! The forward pass is the `value` kind's ([`crate::kinds::value::ValuePass`], same
//! micro-batching, layout and data parallelism) over the responses with one token appended: the
//! value at that extra position is the head on the hidden state of the last real token (the
//! appended token is never attended to by earlier positions). Multi-turn rollouts (tool turns in
//! the responses) are not supported yet. Metrics as every reward kind's; timing key `reward`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use flowrl_engine::{
    BuildContext, Diagnostic, Footprint, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec,
    Params, PlanCtx, PortSpec, StepContext, ValidateCtx,
};
use flowrl_models::value_head::{VALUE_HEAD_FILE, stored_head};
use serde::Deserialize;

use crate::kinds::reward::support::{ROLLOUTS, SCORES, log_score_metrics, reward_outputs};
use crate::kinds::validate;
use crate::kinds::value::{ValuePass, value_model_diagnostics};
use crate::resources::model::ModelResource;
use crate::sizing::{inference_footprint, planned_pass};
use crate::train::micro_batches::{self, MicroBatchParams};
use crate::values::{RolloutBatch, ScoreBatch, TokenMatrix};

/// The `reward.model` kind.
pub struct RewardModelKind;

#[derive(Debug, Clone, Deserialize, Params)]
struct RewardModelParams {
    /// the reward model (a `[models.*]` with `value_head = true` whose directory stores the head:
    /// value_head.safetensors, or `score.weight` of a `*ForSequenceClassification` checkpoint)
    #[param(resource = "model", required)]
    model: String,
    #[serde(flatten)]
    #[param(specs = micro_batches::param_specs(
        Some(MICRO_BATCH_SIZE),
        "responses per forward pass (verl: reward_model.micro_batch_size_per_gpu)",
    ))]
    micro: MicroBatchParams,
}

/// Default responses per forward pass.
const MICRO_BATCH_SIZE: usize = 16;

/// The error of a reward-model directory without a stored head (`None` when it has one).
fn missing_head(dir: &Path) -> Option<String> {
    match stored_head(dir) {
        Ok(Some(_)) => None,
        Ok(None) => Some(format!(
            "the reward model's directory `{}` has no `score` head: a reward model needs a \
             stored one, either {VALUE_HEAD_FILE} (tensors score.weight [1, hidden] and \
             score.bias [1]) or a `score.weight` [1, hidden] tensor (+ optional score.bias) \
             among its Hugging Face weights, as a `*ForSequenceClassification` / \
             `*ForTokenClassification` checkpoint with num_labels = 1 has",
            dir.display()
        )),
        Err(e) => Some(format!(
            "reading the reward model's head in `{}`: {e:#}",
            dir.display()
        )),
    }
}

impl NodeKind for RewardModelKind {
    fn name(&self) -> &str {
        "reward.model"
    }

    fn doc(&self) -> &str {
        "A discriminative reward model scores each response (verl's reward model worker): the \
         linear `score` head of a value model (`value_head = true`, head stored in its directory, \
         Hugging Face's `*ForSequenceClassification` layout accepted) on the final hidden state \
         of the response's last token."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![
            ROLLOUTS
                .spec()
                .doc("the responses to score (their token ids)"),
        ]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        reward_outputs()
    }

    fn params(&self) -> Vec<ParamSpec> {
        RewardModelParams::param_specs()
    }

    fn timing_key(&self) -> Option<&str> {
        Some("reward")
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let mut out: Vec<Diagnostic> = value_model_diagnostics(ctx, "model").into_iter().collect();
        out.extend(micro_batches::diagnostics(ctx));
        if out.is_empty()
            && let Some(dir) = ctx.resource_param("model").and_then(validate::model_dir)
            && Path::new(&dir).join("config.json").is_file()
            && let Some(e) = missing_head(Path::new(&dir))
        {
            out.push(ctx.error("model", e));
        }
        out
    }

    /// The `value` kind's forward pass, each response one token longer.
    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let p = ctx.parse::<RewardModelParams>().ok()?;
        let mut f = Footprint::default();
        let Some((m, pass, prompts)) = planned_pass(ctx, &mut f, &p.micro, None) else {
            return Some(f);
        };
        let pass = one_token_longer(pass);
        inference_footprint(&mut f, &m, ctx, (pass, prompts), None, false);
        Some(f)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: RewardModelParams = params.parse()?;
        let model = ctx.resource::<ModelResource>(&p.model)?;
        ensure!(
            model.has_value_head(),
            "`{}` needs a reward model: model `{}` has no value head (set `value_head = true` on \
             it; its directory must store the `score` head)",
            ctx.node,
            p.model
        );
        if let Some(e) = missing_head(&model.dir) {
            bail!("`{}`: model `{}`: {e}", ctx.node, p.model);
        }
        Ok(Box::new(RewardModelNode {
            pass: ValuePass::new(model, &p.micro, MICRO_BATCH_SIZE, ctx)?,
        }))
    }
}

/// A planned pass with one more response token per row.
fn one_token_longer(pass: crate::sizing::Pass) -> crate::sizing::Pass {
    crate::sizing::Pass {
        len: pass.len + 1,
        response: pass.response + 1,
        ..pass
    }
}

struct RewardModelNode {
    pass: ValuePass,
}

impl Node for RewardModelNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let rollouts = inputs.get_arc(ROLLOUTS)?;
        self.pass.warn_oversized(&rollouts, ctx);
        let scores = last_token_scores(&self.pass, &rollouts)?;
        let batch = ScoreBatch {
            rollouts,
            scores,
            components: BTreeMap::new(),
        };
        batch.check()?;
        log_score_metrics(ctx, &batch);
        Ok(Outputs::new().with(SCORES, batch))
    }
}

/// The value head of `pass`'s model on the final hidden state of each response's last token
/// (the last prompt token for an empty response), computed as [`ValuePass::values`] of the
/// responses with one token appended (see the module doc).
fn last_token_scores(pass: &ValuePass, rollouts: &RolloutBatch) -> Result<Vec<f32>> {
    rollouts.check()?;
    ensure!(
        rollouts.trajectories.is_empty(),
        "a reward model does not score multi-turn rollouts (tool turns in the responses) yet"
    );
    let b = rollouts.len();
    let t = rollouts.response_len() + 1;
    let mut response_ids = Vec::with_capacity(b);
    let mut mask = TokenMatrix::zeros(b, t);
    for r in 0..b {
        let ids = &rollouts.response_ids[r];
        let last = ids
            .last()
            .or_else(|| rollouts.prompt_ids[r].last())
            .copied()
            .with_context(|| format!("response {r} and its prompt have no tokens to score"))?;
        let mut extended = ids.clone();
        extended.push(last);
        mask.row_mut(r)[..extended.len()].fill(1.0);
        response_ids.push(extended);
    }
    let extended = RolloutBatch {
        response_ids,
        response_mask: mask,
        sampling_log_probs: TokenMatrix::zeros(b, t),
        ..rollouts.clone()
    };
    let values = pass
        .values(&extended)
        .with_context(|| format!("the reward model `{}`", pass.model.name))?;
    (0..b)
        .map(|r| {
            let v = values.values.row(r)[rollouts.response_ids[r].len()];
            ensure!(
                v.is_finite(),
                "the reward model's score of response {r} is {v}"
            );
            Ok(v)
        })
        .collect()
}

flowrl_engine::register_node_kind!(RewardModelKind);
