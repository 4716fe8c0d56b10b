//! What the `update.*` kinds share: their ports (`rollouts`, `advantages`, the `done` output), the
//! trainable model they take at build time, the epochs × mini-batches × micro-batches split of
//! `update.ppo` and `update.critic` with its validation, and the step's mean metrics.

use std::sync::Arc;

use anyhow::{Result, ensure};
use flowrl_engine::{BuildContext, Diagnostic, Port, PortSpec, StepContext, ValidateCtx};

use crate::kinds::validate::{upstream_batch_size, upstream_rollout_n};
use crate::resources::model::{ModelResource, UpdateCounters};
use crate::train::micro_batches::{MicroBatchParams, MicroBatching};
use crate::values::{AdvantageBatch, ModelUpdate, RolloutBatch, port_types};

/// The `rollouts` input of `update.ppo` and `update.critic`.
pub(crate) const ROLLOUTS: Port<RolloutBatch> = Port::new("rollouts", port_types::ROLLOUTS);
/// The `advantages` input of `update.ppo` and `update.critic`.
pub(crate) const ADVANTAGES: Port<AdvantageBatch> = Port::new("advantages", port_types::ADVANTAGES);
/// The `done` output: the model's update counters after the step.
pub(crate) const DONE: Port<ModelUpdate> = Port::new("done", port_types::MODEL_UPDATE);

/// The outputs of an update kind: [`DONE`], documented by `doc`.
pub(crate) fn done_output(doc: &str) -> Vec<PortSpec> {
    vec![DONE.spec().doc(doc)]
}

impl From<UpdateCounters> for ModelUpdate {
    fn from(c: UpdateCounters) -> Self {
        ModelUpdate {
            optimizer_steps: c.optimizer_steps,
            skipped_steps: c.skipped_steps,
        }
    }
}

/// The model resource `name` that node `ctx.node` trains; an error when it is a frozen copy.
pub(crate) fn trainable_model(ctx: &BuildContext, name: &str) -> Result<Arc<ModelResource>> {
    let model = ctx.resource::<ModelResource>(name)?;
    ensure!(
        model.trainable,
        "model `{name}` is a frozen copy and cannot be trained by `{}`",
        ctx.node
    );
    Ok(model)
}

/// How `update.ppo` and `update.critic` split a step's batch (their `mini_batch_size` and
/// micro-batch parameters; `ppo_epochs` passes over it): mini-batches of `mini_batch_size`
/// prompts (× the rollout's `n` responses; default: the whole batch), each in micro-batches of
/// `micro_batch_size` responses (default: the mini-batch) or of at most
/// `max_tokens_per_micro_batch` tokens ([`crate::train::micro_batches`]). Returns the rows of one
/// mini-batch of `rollouts` and the micro-batching of a mini-batch; warns on `ctx` about rows
/// longer than the token budget.
pub(crate) fn split_batches(
    mini_batch_size: Option<usize>,
    micro: &MicroBatchParams,
    rollouts: &RolloutBatch,
    ctx: &mut StepContext,
) -> Result<(usize, MicroBatching)> {
    let b = rollouts.len();
    let n = (b / rollouts.prompts.len().max(1)).max(1);
    let mini_rows = mini_batch_size.map(|m| m * n).unwrap_or(b).min(b);
    let micro = MicroBatching::new(
        micro.micro_batch_size.unwrap_or(mini_rows).min(mini_rows),
        micro.max_tokens_per_micro_batch,
    )?;
    micro.warn_oversized(rollouts, ctx);
    Ok((mini_rows, micro))
}

/// The batch arithmetic of an update node with `mini_batch_size` / `micro_batch_size` (prompts
/// per optimizer step, responses per forward/backward): the upstream dataset's `batch_size`
/// must divide into mini-batches, and a mini-batch's responses (× the rollout's `n`) into
/// micro-batches, with the numbers in the message. `mini` and `micro` are the node's
/// `mini_batch_size` and `micro_batch_size`.
pub(crate) fn mini_batch_diagnostics(
    ctx: &ValidateCtx,
    mini: Option<usize>,
    micro: Option<usize>,
) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let batch = upstream_batch_size(ctx);
    let n = upstream_rollout_n(ctx).unwrap_or(1);
    if let (Some((b, data)), Some(m)) = (&batch, mini)
        && b % m != 0
    {
        out.push(ctx.error(
            "mini_batch_size",
            format!("`{data}.batch_size` {b} is not divisible by mini_batch_size {m} (prompts per optimizer step)"),
        ));
    }
    if let Some(micro) = micro {
        let rows = mini.or(batch.as_ref().map(|(b, _)| *b)).map(|m| m * n);
        if let Some(rows) = rows
            && rows % micro != 0
        {
            out.push(ctx.error(
                "micro_batch_size",
                format!(
                    "a mini-batch of {} prompts × n {n} = {rows} responses is not divisible by micro_batch_size {micro}",
                    rows / n
                ),
            ));
        }
    }
    out
}

/// The mean of `v`, `None` when empty.
pub(crate) fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Warns how many of the step's optimizer steps (`what`: "optimizer", "critic optimizer") were
/// skipped, when any was, and records the mean of each non-empty series in `means`.
pub(crate) fn skipped_and_means(
    ctx: &mut StepContext,
    what: &str,
    skipped: u64,
    means: [(&str, &[f64]); 2],
) {
    if skipped > 0 {
        ctx.warn(format!(
            "{skipped} {what} step(s) skipped: non-finite loss or gradient norm"
        ));
    }
    for (name, v) in means {
        if let Some(m) = mean(v) {
            ctx.metric(name, m);
        }
    }
}
