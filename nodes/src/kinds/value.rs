//! The `value` node kind: the critic's value of every response position (verl's
//! `critic.compute_values`), without gradients.
//!
//! The rollouts are laid out as for the log-probs ([`crate::train::sequences`]); the value of response
//! token t is the value head on the final hidden state at sequence position `P − 1 + t` — the
//! position whose logits predict token t, verl's `values[:, -response_length - 1 : -1]` — and
//! the values are multiplied by the response mask (verl: "only action tokens have values").
//! Rows are processed `micro_batch_size` at a time, or in micro-batches of at most
//! `max_tokens_per_micro_batch` tokens, optionally `padding_free`, and split over the run's
//! devices, all like `logprob`'s ([`crate::train::micro_batches`]).
//!
//! The model must be a value model (`value_head = true` on its `[models.*]` section).
//! Metrics (verl's `compute_data_metrics`, over valid tokens): `critic/values/mean|max|min`.
//! Timing key `values`.

use std::sync::Arc;

use anyhow::Result;
use flowrl_engine::{
    BuildContext, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec, Params,
    Port, PortSpec, StepContext, ValidateCtx,
};
use flowrl_engine::{Footprint, PlanCtx};
use serde::Deserialize;

use crate::sizing::{inference_footprint, planned_pass};

use crate::resources::model::{ModelParams, ModelResource};
use crate::runtime::backend::{FlowBackend, on_backend};
use crate::runtime::data_parallel::{Replicas, shard};
use crate::train::micro_batches::{self, MicroBatchParams, MicroBatching};
use crate::train::sequences::{Layout, SequenceBatch, masked_host};
use crate::values::{RolloutBatch, TokenMatrix, TokenValues, port_types};

/// The `value` kind.
pub struct ValueKind;

const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);
const VALUES: Port<TokenValues> = Port::new("values", port_types::VALUES);

#[derive(Debug, Clone, Deserialize, Params)]
struct ValueParams {
    /// the value model (a `[models.*]` with `value_head = true`)
    #[param(resource = "model", required)]
    model: String,
    #[serde(flatten)]
    #[param(specs = micro_batches::param_specs(
        Some(MICRO_BATCH_SIZE),
        "responses per forward pass (verl: critic.forward_micro_batch_size_per_gpu)",
    ))]
    micro: MicroBatchParams,
}

/// Default responses per forward pass.
const MICRO_BATCH_SIZE: usize = 16;

impl NodeKind for ValueKind {
    fn name(&self) -> &str {
        "value"
    }

    fn doc(&self) -> &str {
        "The critic's value of every response position (verl critic.compute_values): the value \
         head of a value model (`value_head = true`) on the hidden state that predicts each \
         response token, masked, without gradients."
    }

    fn inputs(&self) -> Vec<PortSpec> {
        vec![ROLLOUTS.spec()]
    }

    fn outputs(&self) -> Vec<PortSpec> {
        vec![VALUES.spec().doc("[B, T] values, 0 at padding")]
    }

    fn params(&self) -> Vec<ParamSpec> {
        ValueParams::param_specs()
    }

    fn timing_key(&self) -> Option<&str> {
        Some("values")
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let mut out: Vec<Diagnostic> = value_model_diagnostics(ctx, "model").into_iter().collect();
        out.extend(micro_batches::diagnostics(ctx));
        out
    }

    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let p = ctx.parse::<ValueParams>().ok()?;
        let mut f = Footprint::default();
        let Some((m, pass, prompts)) = planned_pass(ctx, &mut f, &p.micro, None) else {
            return Some(f);
        };
        inference_footprint(&mut f, &m, ctx, (pass, prompts), None, false);
        Some(f)
    }

    fn build(&self, params: &Params, ctx: &BuildContext) -> Result<Box<dyn Node>> {
        let p: ValueParams = params.parse()?;
        let model = ctx.resource::<ModelResource>(&p.model)?;
        anyhow::ensure!(
            model.has_value_head(),
            "`{}` needs a value model: model `{}` has no value head (set `value_head = true` on it)",
            ctx.node,
            p.model
        );
        Ok(Box::new(ValueNode {
            pass: ValuePass::new(model, &p.micro, MICRO_BATCH_SIZE, ctx)?,
        }))
    }
}

/// The error of a node whose resource parameter `key` names a model without `value_head = true`.
pub(crate) fn value_model_diagnostics(ctx: &ValidateCtx, key: &str) -> Option<Diagnostic> {
    let view = ctx.resource_param(key)?;
    let value_head = view.params().parse::<ModelParams>().map(|m| m.value_head);
    (!value_head.is_ok_and(|v| v)).then(|| {
        ctx.error(
            key,
            format!(
                "`{}` needs a value model, but model `{}` has no value head",
                ctx.name(),
                view.name()
            ),
        )
        .with_help(format!(
            "declare the critic as a value model: `value_head = true` in `[models.{}]` (or a separate `[models.critic]` with `path` and `value_head = true`)",
            view.name()
        ))
    })
}

/// A value model's forward pass as the `value` and `reward.model` nodes run it: the model, the
/// micro-batches and layout of the node's parameters, and the devices the rows are split over.
pub(crate) struct ValuePass {
    pub(crate) model: Arc<ModelResource>,
    micro: MicroBatching,
    layout: Layout,
    replicas: Replicas,
}

impl ValuePass {
    /// The pass of node `ctx.node` over `model` with its micro-batch parameters (`default`
    /// responses per micro-batch unless they say otherwise).
    pub(crate) fn new(
        model: Arc<ModelResource>,
        micro: &MicroBatchParams,
        default: usize,
        ctx: &BuildContext,
    ) -> Result<ValuePass> {
        Ok(ValuePass {
            replicas: Replicas::new(&ctx.placement, &ctx.node)?,
            micro: micro.micro_batching(default)?,
            layout: micro.layout(),
            model,
        })
    }

    /// Warns when a response of `rollouts` alone is over the micro-batches' token budget.
    pub(crate) fn warn_oversized(&self, rollouts: &RolloutBatch, ctx: &mut StepContext) {
        self.micro.warn_oversized(rollouts, ctx);
    }

    /// [`token_values`] of `rollouts`.
    pub(crate) fn values(&self, rollouts: &RolloutBatch) -> Result<TokenValues> {
        token_values(
            &self.model,
            rollouts,
            self.micro,
            self.layout,
            &self.replicas,
        )
    }
}

struct ValueNode {
    pass: ValuePass,
}

impl Node for ValueNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> Result<Outputs> {
        let rollouts = inputs.get_arc(ROLLOUTS)?;
        self.pass.warn_oversized(&rollouts, ctx);
        let out = self.pass.values(&rollouts)?;
        log_value_metrics(ctx, &out, &rollouts);
        Ok(Outputs::new().with(VALUES, out))
    }
}

/// Records `critic/values/mean|max|min` over the valid tokens.
fn log_value_metrics(ctx: &mut StepContext, values: &TokenValues, rollouts: &RolloutBatch) {
    let valid: Vec<f64> = values
        .values
        .data
        .iter()
        .zip(&rollouts.response_mask.data)
        .filter(|(_, m)| **m != 0.0)
        .map(|(&v, _)| v as f64)
        .collect();
    if valid.is_empty() {
        return;
    }
    ctx.metric(
        "critic/values/mean",
        valid.iter().sum::<f64>() / valid.len() as f64,
    );
    ctx.metric(
        "critic/values/max",
        valid.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    );
    ctx.metric(
        "critic/values/min",
        valid.iter().cloned().fold(f64::INFINITY, f64::min),
    );
}

/// The values of every response position of `rollouts` under the value model `model`, the rows
/// split over `replicas`, each replica's share into micro-batches by `micro` laid out in
/// `layout`, and gathered.
pub fn token_values(
    model: &ModelResource,
    rollouts: &RolloutBatch,
    micro: MicroBatching,
    layout: Layout,
    replicas: &Replicas,
) -> Result<TokenValues> {
    on_backend!(model.backend(), B => {
        values_on::<B>(model, rollouts, micro, layout, replicas)
    })
}

/// [`token_values`] on the model's backend `B`.
fn values_on<B: FlowBackend>(
    model: &ModelResource,
    rollouts: &RolloutBatch,
    micro: MicroBatching,
    layout: Layout,
    replicas: &Replicas,
) -> Result<TokenValues> {
    let (b, t) = (rollouts.len(), rollouts.response_len());
    let gathered = replicas.run(|r| {
        let (infer, head, device) = model.value_model_inference_on::<B>(replicas, r.local_index)?;
        let rows: Vec<usize> = shard(b, r.world, r.index).collect();
        let mut mine = Vec::with_capacity(rows.len());
        for chunk_rows in micro.split(rollouts, &rows) {
            let chunk_rows = chunk_rows.as_slice();
            let seq = SequenceBatch::with_layout(rollouts, chunk_rows, layout)?;
            let (hidden, _) = seq.response_hidden(&infer, &device)?;
            let values = masked_host(head.forward(hidden), &seq.mask)?;
            for (k, &row) in chunk_rows.iter().enumerate() {
                mine.push((row, values[k * t..(k + 1) * t].to_vec()));
            }
        }
        r.gather_rows(b, t, mine)
    })?;
    let values = TokenValues {
        values: TokenMatrix::new(gathered[0].clone(), b, t)?,
    };
    values.check(rollouts)?;
    Ok(values)
}

flowrl_engine::register_node_kind!(ValueKind);
