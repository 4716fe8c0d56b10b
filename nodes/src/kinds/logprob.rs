//! The `logprob` node kind: per-token log-probs of the response tokens under a model (the old
//! policy before the update, or the frozen reference), without gradients.
//!
//! Rows are processed `micro_batch_size` at a time, or packed by their prompt + response lengths
//! into micro-batches of at most `max_tokens_per_micro_batch` tokens (verl `use_dynamic_bsz` +
//! `log_prob_max_token_len_per_gpu`; [`crate::train::micro_batches`]), which gives the same log-probs;
//! within a micro-batch only the response positions go through the LM head, `chunk` positions at
//! a time (see [`crate::train::sequences`]).
//! Logits are divided by `temperature` first, as verl's actor does (set it to the rollout's).
//! Timing key `old_log_prob`; a reference node sets `timing = "ref"` in the graph (verl's
//! `timing_s/ref`). `sum_pi_squared = true` also outputs Σ_v π_v² per response position (verl
//! `actor.calculate_sum_pi_squared`), which the optimal-token-baseline advantage kinds read.

use std::sync::Arc;

use anyhow::Result;
use flowrl_engine::{
    BuildContext, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec, Params,
    Port, PortSpec, StepContext, ValidateCtx,
};
use flowrl_engine::{Footprint, PlanCtx};
use serde::Deserialize;

use crate::sizing::{inference_footprint, planned_pass};

use crate::resources::model::ModelResource;
use crate::runtime::backend::{FlowBackend, on_backend};
use crate::runtime::data_parallel::{Replicas, shard};
use crate::train::micro_batches::{self, MicroBatchParams, MicroBatching};
use crate::train::sequences::{Layout, SequenceBatch, masked_host};
use crate::values::{RolloutBatch, TokenLogProbs, TokenMatrix, port_types};

/// The `logprob` kind.
pub struct LogProbKind;

const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);
const LOG_PROBS: Port<TokenLogProbs> = Port::new("log_probs", port_types::TOKEN_LOG_PROBS);

/// `micro_batch_size`'s default.
const MICRO_BATCH_SIZE: usize = 16;

#[derive(Debug, Clone, Deserialize, Params)]
struct LogProbParams {
    /// the model to score with
    #[param(resource = "model", required)]
    model: String,
    /// logits are divided by it (use the rollout temperature)
    #[param(default = 1.0, gt = 0.0)]
    temperature: f64,
    #[serde(flatten)]
    #[param(specs = micro_batches::param_specs(
        Some(MICRO_BATCH_SIZE),
        "responses per forward pass (verl: log_prob_micro_batch_size_per_gpu)",
    ))]
    micro: MicroBatchParams,
    /// response positions per LM-head block; default: 16 on the CPU, 128 on a GPU
    #[param(min = 1.0)]
    chunk: Option<usize>,
    /// also output the per-token entropy
    #[param(default = false)]
    entropy: bool,
    /// also output Σ_v π_v² per position (verl actor.calculate_sum_pi_squared; read by
    /// advantage.optimal_token_baseline)
    #[param(default = false)]
    sum_pi_squared: bool,
}

impl NodeKind for LogProbKind {
    fn name(&self) -> &str {
        "logprob"
    }

    fn doc(&self) -> &str {
        "Per-token log-probs of the response tokens under a model (old policy or reference), in \
         micro-batches and chunks over the response positions, without gradients."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![ROLLOUTS.spec()]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        vec![LOG_PROBS.spec().doc("[B, T] log-probs, 0 at padding")]
    }

    fn params(&self) -> Vec<ParamSpec> {
        LogProbParams::param_specs()
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        micro_batches::diagnostics(ctx)
    }

    fn timing_key(&self) -> Option<&str> {
        Some("old_log_prob")
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let p = ctx.parse::<LogProbParams>().ok()?;
        let mut f = Footprint::default();
        let Some((m, pass, prompts)) = planned_pass(ctx, &mut f, &p.micro, None) else {
            return Some(f);
        };
        inference_footprint(&mut f, &m, ctx, (pass, prompts), p.chunk, true);
        Some(f)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: LogProbParams = params.parse()?;
        let model = ctx.resource::<ModelResource>(&p.model)?;
        Ok(Box::new(LogProbNode {
            replicas: Replicas::new(&ctx.placement, &ctx.node)?,
            micro: p.micro.micro_batching(MICRO_BATCH_SIZE)?,
            p,
            model,
        }))
    }
}

struct LogProbNode {
    replicas: Replicas,
    micro: MicroBatching,
    p: LogProbParams,
    model: Arc<ModelResource>,
}

impl Node for LogProbNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let rollouts = inputs.get_arc(ROLLOUTS)?;
        self.micro.warn_oversized(&rollouts, ctx);
        let out = token_log_probs(
            &self.model,
            &rollouts,
            self.p.temperature,
            self.micro,
            self.p.micro.layout(),
            self.p.chunk,
            Extras {
                entropy: self.p.entropy,
                sum_pi_squared: self.p.sum_pi_squared,
            },
            &self.replicas,
        )?;
        Ok(Outputs::new().with(LOG_PROBS, out))
    }
}

/// What [`token_log_probs`] computes besides the log-probs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Extras {
    /// The per-token entropy.
    pub entropy: bool,
    /// Σ_v π_v² per position.
    pub sum_pi_squared: bool,
}

/// Log-probs (and optionally entropies and Σπ²) of every response token of `rollouts` under
/// `model`, the rows split over `replicas` ([`crate::runtime::data_parallel`]), each replica's share into
/// micro-batches by `micro` laid out in `layout`, and gathered.
#[allow(clippy::too_many_arguments)]
pub fn token_log_probs(
    model: &ModelResource,
    rollouts: &RolloutBatch,
    temperature: f64,
    micro: MicroBatching,
    layout: Layout,
    chunk: Option<usize>,
    extras: Extras,
    replicas: &Replicas,
) -> Result<TokenLogProbs> {
    on_backend!(model.backend(), B => {
        log_probs_on::<B>(model, rollouts, temperature, micro, layout, chunk, extras, replicas)
    })
}

/// [`token_log_probs`] on the model's backend `B`.
#[allow(clippy::too_many_arguments)]
fn log_probs_on<B: FlowBackend>(
    model: &ModelResource,
    rollouts: &RolloutBatch,
    temperature: f64,
    micro: MicroBatching,
    layout: Layout,
    chunk: Option<usize>,
    extras: Extras,
    replicas: &Replicas,
) -> Result<TokenLogProbs> {
    let chunk = chunk.unwrap_or(B::LM_HEAD_CHUNK);
    let (b, t) = (rollouts.len(), rollouts.response_len());
    // A gathered row: [log-probs (t) | entropies (t) when asked | Σπ² (t) when asked].
    let width = t * (1 + extras.entropy as usize + extras.sum_pi_squared as usize);
    let gathered = replicas.run(|r| {
        let (infer, device) = model.inference_model_on::<B>(replicas, r.local_index)?;
        let rows: Vec<usize> = shard(b, r.world, r.index).collect();
        let mut mine = Vec::with_capacity(rows.len());
        for chunk_rows in micro.split(rollouts, &rows) {
            let chunk_rows = chunk_rows.as_slice();
            let seq = SequenceBatch::with_layout(rollouts, chunk_rows, layout)?;
            let (out, sq) = if extras.sum_pi_squared {
                let (out, sq) =
                    seq.log_probs_and_sum_pi_squared(&infer, temperature, chunk, &device)?;
                (out, Some(masked_host(sq, &seq.mask)?))
            } else {
                (seq.log_probs(&infer, temperature, chunk, &device)?, None)
            };
            let lp = masked_host(out.log_probs, &seq.mask)?;
            let h = if extras.entropy {
                Some(masked_host(out.entropy, &seq.mask)?)
            } else {
                None
            };
            for (k, &row) in chunk_rows.iter().enumerate() {
                let mut v = Vec::with_capacity(width);
                for part in std::iter::once(&lp).chain(h.as_ref()).chain(sq.as_ref()) {
                    v.extend_from_slice(&part[k * t..(k + 1) * t]);
                }
                mine.push((row, v));
            }
        }
        r.gather_rows(b, width, mine)
    })?;
    let all = &gathered[0];
    let mut log_probs = TokenMatrix::zeros(b, t);
    let mut entropy = extras.entropy.then(|| TokenMatrix::zeros(b, t));
    let mut sum_pi_squared = extras.sum_pi_squared.then(|| TokenMatrix::zeros(b, t));
    for r in 0..b {
        let row = &all[r * width..(r + 1) * width];
        let outputs = std::iter::once(&mut log_probs)
            .chain(entropy.as_mut())
            .chain(sum_pi_squared.as_mut());
        for (k, m) in outputs.enumerate() {
            m.row_mut(r).copy_from_slice(&row[k * t..(k + 1) * t]);
        }
    }
    Ok(TokenLogProbs {
        log_probs,
        entropy,
        sum_pi_squared,
    })
}

flowrl_engine::register_node_kind!(LogProbKind);
