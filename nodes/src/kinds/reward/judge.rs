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
//! `mode = "generate"`: the judge writes a verdict instead (greedy, at most
//! `max_verdict_tokens`, with the rollout's KV cache and sampler), and `verdict` reads it: the
//! number in its last `\boxed{}` (`boxed`), its last number (`number`), or the first capture
//! group of a regular expression. A number x scores clamp((x − lo) / (hi − lo), 0, 1) with
//! `range = [lo, hi]`; a captured `positive` or `negative` label scores 1 or 0. A verdict that
//! does not parse scores `unparsable_score` and is counted: component `parsed` (1 or 0), metric
//! `judge/parse_failures`.
//!
//! The judge is any model resource — the policy's base, a frozen copy (`from = "policy"`) or
//! another checkpoint — and runs where that model lives: on its own device when its section
//! says so (`device = "cuda:1"` in `[models.judge]`, the judge node pinned there too, which
//! validation asks for), while the policy trains on the others.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use flowrl_algorithms::rewards::last_boxed;
use flowrl_datasets::verl::ChatMessage;
use flowrl_datasets::{Prompt, PromptBatch, PromptEncoder};
use flowrl_engine::{
    BuildContext, Diagnostic, Footprint, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec,
    Params, PlanCtx, PortSpec, StepContext, ValidateCtx,
};
use serde::Deserialize;

use crate::kinds::logprob::{Extras, token_log_probs};
use crate::kinds::reward::support::{ROLLOUTS, SCORES, log_score_metrics, reward_outputs};
use crate::kinds::rollout::{Generation, RolloutParams, generation_footprint, sample_rollouts};
use crate::kinds::validate;
use crate::resources::model::ModelResource;
use crate::runtime::data_parallel::Replicas;
use crate::sizing::{Pass, Prompts, inference_footprint, planned_pass};
use crate::train::micro_batches::{MicroBatchParams, MicroBatching};
use crate::train::sequences::Layout;
use crate::values::{RolloutBatch, ScoreBatch, TokenMatrix};

/// The `reward.judge` kind.
pub struct JudgeKind;

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
    /// `logits`: the probability of `positive` against `negative` at the answer's first token;
    /// `generate`: a written verdict, read by `verdict`
    #[param(one_of = &["logits", "generate"], default = "logits")]
    mode: String,
    /// with `generate`: `boxed` (the number in the verdict's last \boxed{}), `number` (its last
    /// number), or a regular expression whose first capture group is read
    #[param(default = "boxed")]
    verdict: String,
    /// with `generate`: the numbers a verdict gives, [lo, hi], mapped to scores 0 and 1
    #[serde(default = "unit_range")]
    #[param(default = serde_json::json!([0.0, 1.0]))]
    range: Vec<f64>,
    /// with `generate`: the score of a verdict that does not parse (counted)
    #[param(default = 0.0)]
    unparsable_score: f64,
    /// with `generate`: the longest verdict, in tokens
    #[param(default = 64, min = 1.0)]
    max_verdict_tokens: usize,
}

fn unit_range() -> Vec<f64> {
    vec![0.0, 1.0]
}

/// How a written verdict is read.
#[derive(Debug, Clone)]
enum Verdict {
    /// The content of its last `\boxed{...}` (braces matched).
    Boxed,
    /// Its last number.
    Number,
    /// The first capture group of this expression's first match.
    Pattern(regex::Regex),
}

impl Verdict {
    fn parse(spec: &str) -> Result<Verdict> {
        Ok(match spec {
            "boxed" => Verdict::Boxed,
            "number" => Verdict::Number,
            pattern => {
                let re = regex::Regex::new(pattern)
                    .map_err(|e| anyhow::anyhow!("`verdict` is not a regular expression: {e}"))?;
                ensure!(
                    re.captures_len() > 1,
                    "`verdict` = {pattern:?} has no capture group: put the part to read in \
                     parentheses, e.g. \"Score: (\\d+)\""
                );
                Verdict::Pattern(re)
            }
        })
    }

    /// The part of `text` the verdict is in, if any.
    fn read<'t>(&self, text: &'t str) -> Option<&'t str> {
        match self {
            Verdict::Boxed => last_boxed(text),
            Verdict::Number => NUMBER.with(|re| re.find_iter(text).last().map(|m| m.as_str())),
            Verdict::Pattern(re) => re.captures(text)?.get(1).map(|m| m.as_str()),
        }
    }
}

thread_local! {
    static NUMBER: regex::Regex = regex::Regex::new(r"-?\d+(?:\.\d+)?").expect("a valid regex");
}

/// The score of the part `read` of a verdict: a label 1 or 0, a number mapped from
/// `[lo, hi]` to [0, 1] (clamped); `None` when it is neither.
fn verdict_score(read: &str, positive: &str, negative: &str, [lo, hi]: [f64; 2]) -> Option<f64> {
    let read = read.trim();
    if read == positive {
        return Some(1.0);
    }
    if read == negative {
        return Some(0.0);
    }
    let x: f64 = read.parse().ok()?;
    x.is_finite()
        .then(|| ((x - lo) / (hi - lo)).clamp(0.0, 1.0))
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
        if let Some(model) = ctx.resource_param("model")
            && let Some(id) = ctx.graph().node_id(ctx.name())
            && let node = ctx.graph().node_devices(id)[0]
            && node != model.device()
        {
            let d = model.device();
            out.push(ctx.warning(
                "model",
                format!(
                    "the judge runs where its model `{}` lives, on {d}, but the node is placed on \
                     {node}: the plan counts its pass on {node}; pin the node with `device = \
                     \"{d}\"`",
                    model.name()
                ),
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
            let answer = if p.mode == "generate" {
                p.max_verdict_tokens
            } else {
                1
            };
            let needed = prompt + response + t.len() + answer;
            if needed > context {
                out.push(ctx.error(
                    "model",
                    format!(
                        "the judge's context is {context} tokens ({of}), shorter than a judge \
                         prompt can be: {prompt_from} {prompt} + max_new_tokens {response} + \
                         the template's {} + the answer's {answer} = {needed}",
                        t.len()
                    ),
                ));
            }
        }
        let generate = p.mode == "generate";
        if generate {
            if let Err(e) = Verdict::parse(&p.verdict) {
                out.push(ctx.error("verdict", format!("{e:#}")));
            }
            if !matches!(p.range[..], [lo, hi] if hi > lo) {
                out.push(ctx.error(
                    "range",
                    format!("`range` must be [lo, hi] with hi > lo, got {:?}", p.range),
                ));
            }
            return out;
        }
        // Label words must be single tokens of the judge's tokenizer.
        for (key, word) in [("positive", &p.positive), ("negative", &p.negative)] {
            if let Err(e) = label_token(&tokenizer, word) {
                out.push(ctx.error(key, format!("{e:#}")));
            }
        }
        if p.positive == p.negative {
            out.push(ctx.error("negative", "`negative` is the same word as `positive`"));
        }
        out
    }

    /// Each judge prompt is the upstream prompt and response plus the template (counted as its
    /// bytes, an upper bound on its tokens). `logits`: a forward pass over two rows per response
    /// (the two labels), one response position. `generate`: a greedy rollout of the judge
    /// prompts, `max_verdict_tokens` each, with the rollout's KV-cache and prefill budgets.
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
        if p.mode == "generate" {
            let judge_prompts = Prompts {
                per_step: pass.rows,
                len: pass.len + p.template.len(),
                ..prompts
            };
            let generation = Generation::of(
                &RolloutParams::greedy(&p.model, p.max_verdict_tokens),
                judge_prompts,
            );
            generation_footprint(&mut f, &m, ctx, generation);
            return Some(f);
        }
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
        let answer = match p.mode.as_str() {
            "generate" => {
                ensure!(
                    matches!(p.range[..], [lo, hi] if hi > lo),
                    "`range` must be [lo, hi] with hi > lo"
                );
                Answer::Verdict(Verdict::parse(&p.verdict)?)
            }
            _ => Answer::Labels([
                label_token(&encoder.tokenizer, &p.positive)?,
                label_token(&encoder.tokenizer, &p.negative)?,
            ]),
        };
        Ok(Box::new(JudgeNode {
            micro: MicroBatching::new(p.micro_batch_size, None)?,
            p,
            model,
            encoder,
            answer,
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

/// Scores per response, with their named components.
type Judged = (Vec<f32>, BTreeMap<String, Vec<f32>>);

/// How the judge answers.
enum Answer {
    /// From the logits: the positive and the negative label's token ids.
    Labels([u32; 2]),
    /// A written verdict, read so.
    Verdict(Verdict),
}

struct JudgeNode {
    p: JudgeParams,
    model: Arc<ModelResource>,
    encoder: PromptEncoder,
    answer: Answer,
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
        let pictures = if self.p.images {
            prompt.pictures.clone()
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
            pictures,
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

impl JudgeNode {
    /// Scores from the logits: σ(ℓ₊ − ℓ₋) per judge prompt, with p₊ and p₋.
    fn score_by_logits(
        &self,
        prompts: Arc<PromptBatch>,
        [pos_id, neg_id]: [u32; 2],
    ) -> Result<Judged> {
        let b = prompts.prompts.len();
        // Two one-token "responses" per judge prompt: the positive label, then the negative.
        let judged = RolloutBatch::for_prompts(
            prompts,
            (0..2 * b).map(|i| i / 2).collect(),
            (0..2 * b)
                .map(|i| vec![if i % 2 == 0 { pos_id } else { neg_id }])
                .collect(),
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
        let components = [
            ("p_positive".to_string(), p_pos),
            ("p_negative".to_string(), p_neg),
        ]
        .into_iter()
        .collect();
        Ok((scores, components))
    }

    /// Scores from written verdicts (greedy, at most `max_verdict_tokens`), read by `verdict`.
    fn score_by_verdicts(
        &self,
        prompts: Arc<PromptBatch>,
        verdict: &Verdict,
        ctx: &mut StepContext,
    ) -> Result<Judged> {
        let verdicts = sample_rollouts(
            &self.model,
            &prompts,
            &RolloutParams::greedy(&self.p.model, self.p.max_verdict_tokens),
            &[],
            &Replicas::single(self.model.device),
            ctx,
        )?;
        let range = [self.p.range[0], self.p.range[1]];
        let (mut scores, mut parsed) = (Vec::new(), Vec::new());
        for text in &verdicts.response_text {
            let score = verdict
                .read(text)
                .and_then(|v| verdict_score(v, &self.p.positive, &self.p.negative, range));
            parsed.push(if score.is_some() { 1.0 } else { 0.0 });
            scores.push(score.unwrap_or(self.p.unparsable_score) as f32);
        }
        let failures = parsed.iter().filter(|&&p| p == 0.0).count();
        ctx.metric("judge/parse_failures", failures as f64);
        Ok((
            scores,
            [("parsed".to_string(), parsed)].into_iter().collect(),
        ))
    }
}

impl Node for JudgeNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let start = Instant::now();
        let rollouts = inputs.get_arc(ROLLOUTS)?;
        let prompts = (0..rollouts.len())
            .map(|r| self.judge_prompt(&rollouts, r))
            .collect::<Result<Vec<_>>>()?;
        let prompts = Arc::new(PromptBatch::encoded_by(&self.encoder, prompts, 0));
        let (scores, components) = match &self.answer {
            Answer::Labels(labels) => self.score_by_logits(prompts, *labels)?,
            Answer::Verdict(verdict) => self.score_by_verdicts(prompts, verdict, ctx)?,
        };
        let batch = ScoreBatch {
            rollouts,
            scores,
            components,
        };
        batch.check()?;
        log_score_metrics(ctx, &batch);
        ctx.metric("judge/seconds", start.elapsed().as_secs_f64());
        Ok(Outputs::new().with(SCORES, batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_read_as_their_spec_says() {
        let unit = [0.0, 1.0];
        let ten = [0.0, 10.0];
        let boxed = Verdict::parse("boxed").unwrap();
        let read = |v: &Verdict, t: &str, r: [f64; 2]| {
            v.read(t).and_then(|x| verdict_score(x, "Yes", "No", r))
        };
        assert_eq!(
            read(&boxed, "so \\boxed{7} and \\boxed{ 8 }", ten),
            Some(0.8)
        );
        assert_eq!(read(&boxed, "\\boxed{Yes}", unit), Some(1.0));
        assert_eq!(read(&boxed, "\\boxed{No}", unit), Some(0.0));
        assert_eq!(read(&boxed, "\\boxed{maybe}", unit), None);
        assert_eq!(read(&boxed, "no box, 5", unit), None);
        assert_eq!(read(&boxed, "\\boxed{12}", ten), Some(1.0), "clamped");
        let number = Verdict::parse("number").unwrap();
        assert_eq!(read(&number, "3 of 10, final: 2.5", ten), Some(0.25));
        assert_eq!(read(&number, "none", ten), None);
        let pattern = Verdict::parse(r"Score: (\d+)").unwrap();
        assert_eq!(read(&pattern, "Score: 4 (Score: 9)", ten), Some(0.4));
        assert_eq!(read(&pattern, "score 4", ten), None);
        let err = Verdict::parse(r"Score: \d+").unwrap_err().to_string();
        assert!(err.contains("has no capture group"), "{err}");
        assert!(Verdict::parse("(").is_err());
    }
}

flowrl_engine::register_node_kind!(JudgeKind);
