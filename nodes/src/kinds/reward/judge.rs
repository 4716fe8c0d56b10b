//! `reward.judge`: a vision-language model scores each response by the probability it gives a
//! positive verdict — "VLM as a judge" read from its logits, in one forward pass, no generation.
//!
//! For response `r` the judge sees one user message: the response's prompt pictures (with
//! `images = true`), then `template` with `{prompt}` (the text of the prompt's non-system
//! messages, one per line, `<image>` placeholders left out), `{response}` and `{ground_truth}`
//! filled in; it is rendered by the
//! judge model's chat template with the generation prompt and encoded by its processor, as a
//! dataset row would be. With ℓ₊ and ℓ₋ the judge's log-probabilities of the `positive` and
//! `negative` label tokens as the first token of its answer,
//!
//!   score = p₊ / (p₊ + p₋) = σ(ℓ₊ − ℓ₋)
//!
//! (the normalised probability of the positive label among the two). Components: `p_positive`
//! and `p_negative`, the unnormalised probabilities (their sum says how sure the judge is that
//! it answers with one of the labels at all). Metrics as every reward kind's, plus
//! `judge/seconds`.
//!
//! The judge is any model resource — the policy's base, a frozen copy (`from = "policy"`,
//! `frozen = true`) or another checkpoint — on its own device if its section says so.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use flowrl_datasets::verl::ChatMessage;
use flowrl_datasets::{Prompt, PromptBatch, PromptEncoder};
use flowrl_engine::{
    BuildContext, Diagnostic, Footprint, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec,
    Params, PlanCtx, Port, PortSpec, StepContext, ValidateCtx,
};
use serde::Deserialize;

use crate::kinds::logprob::{Extras, token_log_probs};
use crate::kinds::reward::support::{log_score_metrics, reward_outputs};
use crate::kinds::validate;
use crate::resources::model::ModelResource;
use crate::runtime::data_parallel::Replicas;
use crate::sizing::{Pass, inference_footprint, planned_pass};
use crate::train::micro_batches::{MicroBatchParams, MicroBatching};
use crate::train::sequences::Layout;
use crate::values::{RolloutBatch, ScoreBatch, TokenMatrix, port_types};

/// The `reward.judge` kind.
pub struct JudgeKind;

const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);
const SCORES: Port<ScoreBatch> = Port::new("scores", port_types::SCORES);

#[derive(Debug, Clone, Deserialize, Params)]
struct JudgeParams {
    /// the judge model (any `[models.*]`: the policy's base, a frozen copy, another checkpoint)
    #[param(resource = "model", required)]
    model: String,
    /// the judge's instruction; `{prompt}`, `{response}` and `{ground_truth}` are filled in per
    /// response (`{response}` is required)
    #[param(required)]
    template: String,
    /// the label word of a positive verdict (one token of the judge's tokenizer)
    #[param(default = "Yes")]
    positive: String,
    /// the label word of a negative verdict (one token of the judge's tokenizer)
    #[param(default = "No")]
    negative: String,
    /// show the judge the prompt's pictures (before the instruction)
    #[param(default = true)]
    images: bool,
    /// judge prompts per forward pass
    #[param(default = 16, min = 1.0)]
    micro_batch_size: usize,
}

impl NodeKind for JudgeKind {
    fn name(&self) -> &str {
        "reward.judge"
    }

    fn doc(&self) -> &str {
        "A model judges each response (its prompt's pictures, prompt, response, ground truth in a \
         template): score = p(positive label) / (p(positive) + p(negative)) from its logits."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![ROLLOUTS.spec().doc("the responses to judge")]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        reward_outputs()
    }

    fn params(&self) -> Vec<ParamSpec> {
        JudgeParams::param_specs()
    }

    fn timing_key(&self) -> Option<&str> {
        Some("reward")
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let p = match ctx.parse::<JudgeParams>() {
            Ok(p) => p,
            Err(d) => return d,
        };
        let mut out = Vec::new();
        if !p.template.contains("{response}") {
            out.push(ctx.error(
                "template",
                "the template has no `{response}` slot: the judge would not see the response \
                 (slots: {prompt}, {response}, {ground_truth})",
            ));
        }
        let Some(dir) = ctx.resource_param("model").and_then(validate::model_dir) else {
            return out;
        };
        let Ok(tokenizer) = flowrl_datasets::encoder::load_tokenizer(std::path::Path::new(&dir))
        else {
            return out;
        };
        // The judge's context must hold the longest prompt and response and the template.
        if let (Some((context, of)), Some((prompt, prompt_from)), Some((_, rollout))) = (
            validate::model_context_length(ctx, "model"),
            validate::upstream_prompt_length(ctx),
            ctx.node().and_then(|n| validate::rollout_upstream(&n)),
        ) && let Some(response) = rollout.max_new_tokens
            && let Ok(t) = tokenizer.encode(p.template.as_str(), false)
        {
            let needed = prompt + response + t.len() + 1;
            if needed > context {
                out.push(ctx.error(
                    "model",
                    format!(
                        "the judge's context is {context} tokens ({of}), shorter than a judge \
                         prompt can be: {prompt_from} {prompt} + max_new_tokens {response} + \
                         the template's {} + the label 1 = {needed}",
                        t.len()
                    ),
                ));
            }
        }
        // Label words must be single tokens of the judge's tokenizer.
        for key in ["positive", "negative"] {
            let word = if key == "positive" {
                &p.positive
            } else {
                &p.negative
            };
            match label_token(&tokenizer, word) {
                Ok(_) => {}
                Err(e) => out.push(ctx.error(key, format!("{e:#}"))),
            }
        }
        if p.positive == p.negative {
            out.push(ctx.error("negative", "`negative` is the same word as `positive`"));
        }
        out
    }

    /// A forward pass of the judge over two rows per response (the two labels), each its judge
    /// prompt: the upstream prompt and response plus the template (counted as its bytes, an
    /// upper bound on its tokens), one response position.
    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let p = ctx.parse::<JudgeParams>().ok()?;
        let mut f = Footprint::default();
        let micro = MicroBatchParams {
            micro_batch_size: Some(p.micro_batch_size),
            max_tokens_per_micro_batch: None,
            padding_free: false,
        };
        let Some((m, pass, prompts)) = planned_pass(ctx, &mut f, &micro, None) else {
            return Some(f);
        };
        let pass = Pass {
            rows: 2 * pass.rows,
            replica_rows: 2 * pass.replica_rows,
            mini_rows: 2 * pass.mini_rows,
            len: pass.len + p.template.len() + 1,
            response: 1,
            n: 2,
            ..pass
        };
        inference_footprint(&mut f, &m, ctx, (pass, prompts), None, true);
        Some(f)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: JudgeParams = params.parse()?;
        let model = ctx.resource::<ModelResource>(&p.model)?;
        let encoder = PromptEncoder::from_model_dir(&model.dir).with_context(|| {
            format!(
                "the judge's tokenizer and processor ({})",
                model.dir.display()
            )
        })?;
        let labels = [
            label_token(&encoder.tokenizer, &p.positive)?,
            label_token(&encoder.tokenizer, &p.negative)?,
        ];
        Ok(Box::new(JudgeNode {
            micro: MicroBatching::new(p.micro_batch_size, None)?,
            p,
            model,
            encoder,
            labels,
        }))
    }
}

/// The one token id of `word` in `tokenizer`, or an error naming its tokenisation.
fn label_token(tokenizer: &tokenizers::Tokenizer, word: &str) -> Result<u32> {
    let encoding = tokenizer
        .encode(word, false)
        .map_err(|e| anyhow::anyhow!("tokenizing `{word}`: {e}"))?;
    match encoding.get_ids() {
        [id] => Ok(*id),
        ids => anyhow::bail!(
            "label `{word}` is {} tokens of the judge's tokenizer ({}): a label must be one token \
             (try another word, or the same word without spaces)",
            ids.len(),
            encoding
                .get_tokens()
                .iter()
                .zip(ids)
                .map(|(t, id)| format!("`{t}` = {id}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

struct JudgeNode {
    p: JudgeParams,
    model: Arc<ModelResource>,
    encoder: PromptEncoder,
    /// The positive and the negative label's token ids.
    labels: [u32; 2],
    micro: MicroBatching,
}

impl JudgeNode {
    /// The judge's prompt for response `r`: one user message, its pictures first.
    fn judge_prompt(&self, rollouts: &RolloutBatch, r: usize) -> Result<Prompt> {
        let prompt = &rollouts.prompts.prompts[rollouts.prompt_index[r]];
        let prompt_text: Vec<String> = prompt
            .messages
            .iter()
            .filter(|m| m.role != "system")
            .map(|m| m.content.replace("<image>", "").trim().to_string())
            .collect();
        let text = self
            .p
            .template
            .replace("{prompt}", &prompt_text.join("\n"))
            .replace("{response}", &rollouts.response_text[r])
            .replace("{ground_truth}", &rollouts.ground_truth[r]);
        let pictures: Vec<image::RgbImage> = if self.p.images {
            prompt.pictures.iter().map(|p| (**p).clone()).collect()
        } else {
            Vec::new()
        };
        let messages = vec![ChatMessage {
            role: "user".into(),
            content: "<image>".repeat(pictures.len()) + &text,
        }];
        let encoded = self
            .encoder
            .encode(&messages, &pictures, !pictures.is_empty())
            .with_context(|| format!("encoding the judge's prompt for response {r}"))?;
        Ok(Prompt {
            uid: format!("judge-{r}"),
            input_ids: encoded.input_ids,
            images: encoded.images,
            pictures: pictures.into_iter().map(Arc::new).collect(),
            messages,
            text: encoded.text,
            ground_truth: rollouts.ground_truth[r].clone(),
            data_source: rollouts.data_source[r].clone(),
            ability: None,
            extra_info: serde_json::Value::Null,
            source: prompt.source.clone(),
        })
    }
}

impl Node for JudgeNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let start = Instant::now();
        let rollouts = inputs.get_arc(ROLLOUTS)?;
        let b = rollouts.len();
        let prompts = (0..b)
            .map(|r| self.judge_prompt(&rollouts, r))
            .collect::<Result<Vec<_>>>()?;
        // Two one-token "responses" per judge prompt: the positive label, then the negative.
        let judged = RolloutBatch::for_prompts(
            Arc::new(PromptBatch::encoded_by(&self.encoder, prompts, 0)),
            (0..2 * b).map(|i| i / 2).collect(),
            (0..2 * b).map(|i| vec![self.labels[i % 2]]).collect(),
            TokenMatrix::new(vec![1.0; 2 * b], 2 * b, 1)?,
            TokenMatrix::zeros(2 * b, 1),
            (0..2 * b)
                .map(|i| [&self.p.positive, &self.p.negative][i % 2].clone())
                .collect(),
            vec![false; 2 * b],
        );
        judged.check()?;
        let lp = token_log_probs(
            &self.model,
            &judged,
            1.0,
            self.micro,
            Layout::Padded,
            None,
            Extras::default(),
            &Replicas::single(self.model.device),
        )?;
        let (mut scores, mut p_pos, mut p_neg) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..b {
            let (pos, neg) = (lp.log_probs.row(2 * r)[0], lp.log_probs.row(2 * r + 1)[0]);
            ensure!(
                pos.is_finite() && neg.is_finite(),
                "the judge's log-probabilities of response {r}'s labels are not finite ({pos}, {neg})"
            );
            scores.push(1.0 / (1.0 + (neg - pos).exp()));
            p_pos.push(pos.exp());
            p_neg.push(neg.exp());
        }
        let batch = ScoreBatch {
            rollouts,
            scores,
            components: [
                ("p_positive".to_string(), p_pos),
                ("p_negative".to_string(), p_neg),
            ]
            .into_iter()
            .collect(),
        };
        batch.check()?;
        log_score_metrics(ctx, &batch);
        ctx.metric("judge/seconds", start.elapsed().as_secs_f64());
        Ok(Outputs::new().with(SCORES, batch))
    }
}

flowrl_engine::register_node_kind!(JudgeKind);
