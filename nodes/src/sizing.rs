//! The sizes the node kinds declare to the plan ([`flowrl_engine::plan`]): the model a node
//! computes with ([`PlannedModel`], declared by the `model` resource) and the bytes and FLOPs
//! per token of its passes. Each kind's `footprint` (next to the code that allocates) combines
//! these with its own parameters; the rollout's KV-cache chunks and prefill forwards come from
//! the very functions `flowrl_models::generate` divides its budgets with.
//!
//! Widths: `H` hidden (or the attention's `heads · head_dim` when wider), `I` intermediate, `V`
//! vocabulary, `L` a sequence's length, `h` attention heads, `e` bytes per element of the
//! compute precision (4 for f32, 2 for bf16). Live buffers per token of one decoder layer's
//! forward, burn's ops unfused:
//!
//! - inference (nothing kept for a backward; one layer alive at a time):
//!   `e · (FORWARD_H · H + FORWARD_I · I)`;
//! - training, kept for the backward per layer (burn-autodiff's balanced checkpointing keeps
//!   the outputs of matmuls and reductions): `e · (KEPT_H · H + KEPT_I · I)`, every layer, or
//!   with `gradient_checkpointing` one layer's plus the `H`-wide stream at every layer;
//! - attention: on a CPU (burn's composite) the `[h, L]` f32 scores of each query position,
//!   `SCORE_COPIES` of them alive at once, `SCORE_COPIES_TRAINING` per layer kept for the
//!   backward; on a GPU the flash kernels keep none (the vision tower's attention likewise,
//!   over a prompt's patches);
//! - the LM head: `[rows, chunk, V]` f32 logits per block of `chunk` response positions,
//!   `LOGIT_COPIES` (inference) or `LOGIT_COPIES_TRAINING` of them alive at once.
//!
//! The coefficients count the buffers of the code paths (`models/src/layers/`,
//! `nodes/src/train/sequences/`, `nodes/src/train/chunked_backward.rs`); `bench/results/plan.md`
//! holds the measurements they are checked against (the tiny models' un-checkpointed training keeps more than they count).

use std::sync::Arc;

use flowrl_engine::{DeviceSpec, Footprint, Item, Place, PlanCtx};
use flowrl_models::shape::ModelShape;
use flowrl_models::weights::Precision;

/// `H`-wide buffers of an inference forward's layer alive at once (residual, norm, q, k, v,
/// attention output, projection).
pub const FORWARD_H: u64 = 8;
/// `I`-wide ones (gate, up, activation, product).
pub const FORWARD_I: u64 = 4;
/// `H`-wide buffers a training forward keeps per layer for the backward: the outputs of its
/// matmuls and reductions (q, k and v ≈ 2, the attention's projection 1, the down projection 1,
/// the two norms 2); balanced checkpointing recomputes the elementwise chains.
pub const KEPT_H: u64 = 6;
/// `I`-wide ones (gate and up projections, the gated product).
pub const KEPT_I: u64 = 3;
/// `[h, L]` f32 score rows per query position alive at once on a CPU (scores, softmax, mask).
pub const SCORE_COPIES: u64 = 3;
/// Per layer in a training pass: kept for the backward, the scores and the softmax; while the
/// backward runs, their gradients.
pub const SCORE_COPIES_TRAINING: u64 = 4;
/// Vision-tower widths a training pass keeps per patch and layer: the outputs of its matmuls
/// (qkv 3, attention 1, projection 1, MLP 4 + 1) and its two norms; balanced checkpointing
/// recomputes the activation function's elementwise chain.
pub const KEPT_VISION: u64 = 12;
/// Score rows a vision layer keeps for the backward on a CPU (the scores and the softmax).
pub const VISION_SCORE_COPIES_TRAINING: u64 = 2;
/// `[rows, chunk, V]` f32 logit blocks alive at once in a log-prob pass (logits, shifted,
/// exponentials).
pub const LOGIT_COPIES: u64 = 3;
/// In a training pass (the forward's, the recomputed leaf copy's, the gradient's and the
/// softmax's).
pub const LOGIT_COPIES_TRAINING: u64 = 6;

/// The model a node computes with, as its resource declared it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedModel {
    /// Sizes, with the KV cache in the compute precision.
    pub shape: ModelShape,
    /// The forward passes' precision.
    pub precision: Precision,
    /// Update nodes may train it (f32 masters, gradients, AdamW moments).
    pub trainable: bool,
    /// Only the adapters train.
    pub lora: bool,
    /// The replicas an update node shards the f32 master weights over ([`masters_sharded_over`]);
    /// `None`: whoever holds the trained weights holds every master.
    pub masters_over: Option<u64>,
    /// `config.json`'s directory, for messages.
    pub dir: String,
}

/// Over how many replicas an update node shards the f32 masters of model resource `name`
/// computing in `precision` (`crate::train::replicated`: a node of kind `update.*` training it
/// at `zero_stage` ≥ 1 on several replicas, in a 16-bit precision, as the step decides).
pub fn masters_sharded_over(ctx: &PlanCtx, name: &str, precision: Precision) -> Option<u64> {
    if precision == Precision::F32 {
        return None;
    }
    ctx.nodes()
        .into_iter()
        .filter(|n| {
            n.kind().starts_with("update.")
                && n.params().get_str("model") == Some(name)
                && n.params().get_i64("zero_stage").unwrap_or(0) >= 1
        })
        .map(|n| n.replicas() as u64)
        .filter(|&w| w > 1)
        .max()
}

impl PlannedModel {
    /// The model resource named by parameter `key` of the node being planned (`None` when it
    /// could not be sized: the resource says why).
    pub fn of(ctx: &PlanCtx, key: &str) -> Option<Arc<PlannedModel>> {
        let name = ctx.params().get_str(key)?;
        ctx.shape::<PlannedModel>(name)
    }

    /// Bytes per element of the compute precision.
    pub fn element(&self) -> u64 {
        self.precision.dtype().size() as u64
    }

    /// Bytes of a trained model's weights as one replica holds them: f32 masters, or, with the
    /// masters sharded over W replicas, every weight in the compute precision plus the f32
    /// masters of its 1/W (a LoRA model: its base in the compute precision and its f32 adapters).
    pub fn trained_weight_bytes(&self) -> u64 {
        if self.lora {
            return self.shape.params * self.element() + self.shape.adapter_params * 4;
        }
        match self.masters_over {
            Some(w) => self.shape.params * self.element() + (self.shape.params * 4).div_ceil(w),
            None => self.shape.params * 4,
        }
    }

    /// Parameters an optimizer updates (the adapters of a LoRA model).
    pub fn trained_params(&self) -> u64 {
        if self.lora {
            self.shape.adapter_params
        } else {
            self.shape.params
        }
    }

    /// Live bytes per token of an inference forward through the decoder, sequences of `len`.
    pub fn forward_bytes_per_token(&self, len: usize, device: DeviceSpec) -> u64 {
        let s = &self.shape;
        self.element() * (FORWARD_H * width(s) + FORWARD_I * s.intermediate as u64)
            + scores_per_token(s, len, device)
    }

    /// Bytes per token a training forward keeps for its backward, sequences of `len`.
    pub fn training_bytes_per_token(
        &self,
        len: usize,
        device: DeviceSpec,
        checkpointing: bool,
    ) -> u64 {
        let s = &self.shape;
        let layer = self.element() * (KEPT_H * width(s) + KEPT_I * s.intermediate as u64)
            + scores_per_token(s, len, device) / SCORE_COPIES * SCORE_COPIES_TRAINING;
        if checkpointing {
            layer + self.element() * s.hidden as u64 * s.layers as u64
        } else {
            layer * s.layers as u64
        }
    }

    /// Bytes of the vision tower's pass over `prompts` distinct prompts of `p` (the `n` rows of a
    /// prompt share its pass): their f32 pixel values and per patch, at the tower's width, one
    /// layer's buffers of an inference pass (its MLP `4·width`), or every layer's
    /// [`KEPT_VISION`] widths of a training pass; on a CPU the attention scores over the
    /// prompt's patches too.
    pub fn vision_bytes(
        &self,
        prompts: usize,
        p: &Prompts,
        device: DeviceSpec,
        training: bool,
    ) -> u64 {
        let s = &self.shape;
        if s.vision_params == 0 {
            return 0;
        }
        let per_prompt = (p.image_tokens * s.patches_per_token) as u64;
        let scores = |copies: u64| match device {
            DeviceSpec::Cpu(_) => copies * 4 * s.vision_heads as u64 * per_prompt,
            _ => 0,
        };
        let width = s.vision_hidden as u64;
        let per_patch = if training {
            s.vision_layers as u64
                * (self.element() * KEPT_VISION * width + scores(VISION_SCORE_COPIES_TRAINING))
        } else {
            self.element() * (FORWARD_H + 4 * FORWARD_I) * width + scores(SCORE_COPIES)
        };
        4 * (prompts * p.pixel_values) as u64 + prompts as u64 * per_prompt * per_patch
    }

    /// FLOPs of a forward over `tokens` tokens of sequences of `len` whose logits are taken at
    /// `logit_positions` positions: `2 · decoder weights · tokens` for the matmuls, `2 · H · V`
    /// per logit position, and attention's `QKᵀ` and `PV`, `4 · layers · H · len/2` per token
    /// (causal).
    pub fn forward_flops(&self, tokens: u64, len: usize, logit_positions: u64) -> f64 {
        let s = &self.shape;
        2.0 * s.decoder_matmul_params() as f64 * tokens as f64
            + 2.0 * s.lm_head_params() as f64 * logit_positions as f64
            + 2.0 * (s.layers * s.hidden) as f64 * len as f64 * tokens as f64
    }

    /// FLOPs of the vision tower over `prompts` prompts of `p`: `2 · vision weights` per patch.
    pub fn vision_flops(&self, prompts: usize, p: &Prompts) -> f64 {
        2.0 * self.shape.vision_params as f64
            * (prompts * p.image_tokens * self.shape.patches_per_token) as f64
    }

    /// The name of the compute precision, for the device's throughput.
    pub fn precision_name(&self) -> &'static str {
        self.precision.name()
    }
}

/// A replica's view of the weights on its device (the model lives on the first), in the compute
/// precision, kept between calls (`ModelState::inference_on`): a frozen model's copy, or the
/// cast of a trained model's f32 masters. A trained model's LoRA base, or its masters computing
/// in f32, are their own view: the update's replica copy already counts them.
pub fn replica_weights(m: &PlannedModel) -> Option<Item> {
    if m.trainable && (m.lora || m.precision == Precision::F32) {
        return None;
    }
    Some(Item::new(
        format!("the replica's copy of the weights ({})", m.precision_name()),
        view_bytes(m),
        Place::Replicas,
    ))
}

/// Bytes of a view of `m`'s weights in the compute precision: every weight, or, of a trained
/// model whose masters are sharded over W replicas, the cast of the replica's own 1/W (it holds
/// the others in the compute precision already).
pub fn view_bytes(m: &PlannedModel) -> u64 {
    match m.masters_over.filter(|_| m.trainable && !m.lora) {
        Some(w) => (m.shape.params * m.element()).div_ceil(w),
        None => m.shape.params * m.element(),
    }
}

/// The width of a layer's `H`-wide buffers: the hidden size, or the attention's when wider
/// (Qwen3-VL's tiny config: 4 heads of 24 on a hidden size of 64).
fn width(s: &ModelShape) -> u64 {
    s.hidden.max(s.attention_width) as u64
}

/// The attention scores per query position that a device materialises (none with the GPU
/// kernels).
fn scores_per_token(s: &ModelShape, len: usize, device: DeviceSpec) -> u64 {
    match device {
        DeviceSpec::Cpu(_) => SCORE_COPIES * 4 * s.heads as u64 * len as u64,
        _ => 0,
    }
}

/// Bytes of `[rows, positions, vocab]` f32 logits, `copies` of them.
pub fn logit_bytes(rows: usize, positions: usize, vocab: usize, copies: u64) -> u64 {
    copies * 4 * (rows * positions * vocab) as u64
}

/// Response positions per LM-head block of a node with `chunk` on `device`.
pub fn chunk_of(chunk: Option<usize>, device: DeviceSpec) -> usize {
    chunk.unwrap_or_else(|| crate::runtime::backend::lm_head_chunk_of(device))
}

/// `⌈a / b⌉`.
pub fn div_ceil(a: usize, b: usize) -> usize {
    a.div_ceil(b.max(1))
}

/// The prompts upstream of a node: how many a step draws and how long they are. Read from the
/// node declaring [`crate::kinds::validate::PROMPT_SOURCE`]: its `batch_size` and
/// `max_prompt_length`, and for a `dataset.parquet` node the first rows of its data, encoded
/// (the longest prompt, image tokens, pixel values); without such a sample, the prompts are
/// `max_prompt_length` long and every token an image token (the bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prompts {
    /// Prompts per generation batch.
    pub per_step: usize,
    /// Tokens of the longest prompt.
    pub len: usize,
    /// Image tokens of a prompt.
    pub image_tokens: usize,
    /// f32 pixel values of a prompt's pictures.
    pub pixel_values: usize,
    /// Rows the sizes come from (0: the bound).
    pub sampled: usize,
}

impl Prompts {
    /// The prompts upstream of the node `ctx` plans, sized for model `m` (`None` without a
    /// prompt source upstream).
    pub fn upstream(ctx: &PlanCtx, m: &PlannedModel) -> Option<Prompts> {
        let (node, p) = crate::kinds::validate::prompt_source_upstream(&ctx.node()?)?;
        let per_step = p.batch_size?;
        let max = p.max_prompt_length?;
        Some(
            match crate::kinds::dataset::prompt_sizes::prompt_sizes(&node) {
                Some(s) => Prompts {
                    per_step,
                    len: s.longest.max(1),
                    image_tokens: s.image_tokens,
                    pixel_values: s.pixel_values,
                    sampled: s.rows,
                },
                None => {
                    let vision = m.shape.vision_params > 0;
                    let image_tokens = if vision { max } else { 0 };
                    Prompts {
                        per_step,
                        len: max,
                        image_tokens,
                        pixel_values: image_tokens
                            * m.shape.patches_per_token
                            * m.shape.patch_values,
                        sampled: 0,
                    }
                }
            },
        )
    }

    /// How the sizes were found, for the items' descriptions.
    pub fn source(&self) -> String {
        if self.sampled > 0 {
            format!("the largest of the first {} rows", self.sampled)
        } else {
            "bound: max_prompt_length, all image tokens".into()
        }
    }
}

/// The model a node names with `model` and the prompts upstream; records in `f` what cannot be
/// sized.
pub fn planned_prompts(ctx: &PlanCtx, f: &mut Footprint) -> Option<(Arc<PlannedModel>, Prompts)> {
    let found = PlannedModel::of(ctx, "model").and_then(|m| {
        let prompts = Prompts::upstream(ctx, &m)?;
        Some((m, prompts))
    });
    if found.is_none() {
        f.not_sized("the model, or the prompts upstream");
    }
    found
}

/// The model a node names with `model` and its pass over the rollouts upstream, in
/// micro-batches of `micro` and mini-batches of `mini_batch_size` prompts (an update's); records
/// in `f` what cannot be sized.
pub fn planned_pass(
    ctx: &PlanCtx,
    f: &mut Footprint,
    micro: &crate::train::micro_batches::MicroBatchParams,
    mini_batch_size: Option<usize>,
) -> Option<(Arc<PlannedModel>, Pass, Prompts)> {
    let n = crate::kinds::validate::upstream_rollout_n(ctx).unwrap_or(1);
    let found = PlannedModel::of(ctx, "model").and_then(|m| {
        let (pass, prompts) = Pass::of(ctx, &m, micro, mini_batch_size.map(|b| b * n))?;
        Some((m, pass, prompts))
    });
    if found.is_none() {
        f.not_sized("the model, or the rollouts upstream");
    }
    found
}

/// The rows a pass over a rollout batch takes per replica and per micro-batch, from the
/// upstream batch (all replicas: `rows`, each of `len` tokens, `response` of them response
/// positions) and the node's micro-batching: `micro_rows` rows, or as many rows of `len` as a
/// token budget holds.
#[derive(Debug, Clone, Copy)]
pub struct Pass {
    /// Rows of the step, all replicas together.
    pub rows: usize,
    /// This replica's rows.
    pub replica_rows: usize,
    /// Rows per micro-batch.
    pub micro_rows: usize,
    /// Tokens per row (prompt + response, padded).
    pub len: usize,
    /// Response positions per row.
    pub response: usize,
    /// Rows per optimizer step on this replica (a training node's mini-batch; else its rows).
    pub mini_rows: usize,
    /// Rows per prompt (the rollout's `n`): a micro-batch's rows share their prompts' images.
    pub n: usize,
}

impl Pass {
    /// The pass of a node reading the rollouts upstream of `ctx`, micro-batched by
    /// `micro_batch_size` (default: all of a replica's rows, or `mini_rows` when given) or
    /// `max_tokens_per_micro_batch`. `None` when the upstream batch cannot be sized.
    pub fn of(
        ctx: &PlanCtx,
        m: &PlannedModel,
        micro: &crate::train::micro_batches::MicroBatchParams,
        mini_rows: Option<usize>,
    ) -> Option<(Pass, Prompts)> {
        use crate::kinds::validate::{rollout_upstream, upstream_batch_size, upstream_rollout_n};
        let prompts = Prompts::upstream(ctx, m)?;
        let batch = upstream_batch_size(ctx).map_or(prompts.per_step, |b| b.0);
        let n = upstream_rollout_n(ctx).unwrap_or(1);
        let response = rollout_upstream(&ctx.node()?)?.1.max_new_tokens?;
        let rows = batch * n;
        let len = prompts.len + response;
        let replica_rows = rows.div_ceil(ctx.replicas().max(1));
        // Each replica takes its share of every mini-batch.
        let cap = mini_rows.map_or(replica_rows, |m| {
            m.div_ceil(ctx.replicas().max(1)).min(replica_rows)
        });
        let micro_rows = match micro.max_tokens_per_micro_batch {
            Some(t) => (t / len.max(1)).max(1),
            None => micro.micro_batch_size.unwrap_or(cap),
        }
        .min(cap)
        .max(1);
        Some((
            Pass {
                rows,
                replica_rows,
                micro_rows,
                len,
                response,
                mini_rows: cap,
                n,
            },
            prompts,
        ))
    }

    /// Distinct prompts of one micro-batch (rows are prompt-major; one more when a micro-batch
    /// starts inside a prompt's rows).
    pub fn micro_prompts(&self) -> usize {
        let n = self.n.max(1);
        (self.micro_rows.div_ceil(n) + usize::from(!self.micro_rows.is_multiple_of(n)))
            .min(self.micro_rows)
    }

    /// Tokens of one micro-batch.
    pub fn micro_tokens(&self) -> u64 {
        (self.micro_rows * self.len) as u64
    }
}

/// An inference pass (`logprob`, `value`): phase `forward` holds one micro-batch's activations,
/// its vision pass, its LM-head block (`lm_head`: false for a value head) and the
/// compute-precision view of the weights; the output, `[rows, response]` f32, is on the host.
pub fn inference_footprint(
    f: &mut Footprint,
    m: &PlannedModel,
    ctx: &PlanCtx,
    (pass, prompts): (Pass, Prompts),
    chunk: Option<usize>,
    lm_head: bool,
) {
    let device = ctx.device();
    let chunk = chunk_of(chunk, device).min(pass.response);
    let mut items = vec![
        Item::new(
            format!(
                "activations ({} rows × {} tokens)",
                pass.micro_rows, pass.len
            ),
            pass.micro_tokens() * m.forward_bytes_per_token(pass.len, device),
            Place::Device,
        )
        .hint("lower micro_batch_size (or max_tokens_per_micro_batch)"),
        Item::new(
            "vision tower pass",
            m.vision_bytes(pass.micro_prompts(), &prompts, device, false),
            Place::Device,
        ),
    ];
    if lm_head {
        items.push(
            Item::new(
                format!(
                    "LM-head block ({} rows × {chunk} positions × {} vocabulary, f32)",
                    pass.micro_rows, m.shape.vocab
                ),
                logit_bytes(pass.micro_rows, chunk, m.shape.vocab, LOGIT_COPIES),
                Place::Device,
            )
            .hint("lower chunk"),
        );
    }
    items.extend(compute_view_item(m));
    items.extend(replica_weights(m));
    items.push(Item::new(
        "output",
        (pass.replica_rows * pass.response * 4) as u64,
        Place::Host,
    ));
    f.phase("forward", items);
    let rows = pass.rows as u64;
    f.flops = m.forward_flops(
        rows * pass.len as u64,
        pass.len,
        if lm_head {
            rows * pass.response as u64
        } else {
            0
        },
    ) + m.vision_flops(pass.rows, &prompts);
    f.flops_precision = Some(m.precision_name().into());
}

/// What a training node asks of [`training_footprint`].
pub struct Training {
    pub pass: Pass,
    pub prompts: Prompts,
    pub chunk: Option<usize>,
    /// The loss reads the LM head (false: a value head).
    pub lm_head: bool,
    pub checkpointing: bool,
    /// Passes over the batch per step (`ppo_epochs`).
    pub epochs: usize,
    /// The vision tower is trained too.
    pub vision: bool,
    /// How the optimizer state is sharded over the replicas (`zero_stage`).
    pub zero_stage: u8,
}

/// A training node: the AdamW moments stay resident from its first step (all of them on every
/// replica, or `1/W` with `zero_stage` ≥ 1), and every replica but the first keeps its own copy
/// of the model; phase `forward+backward` holds one micro-batch's kept activations, its LM-head
/// block, its gradients (and the accumulated ones when a mini-batch has several micro-batches),
/// and the compute-precision view; phase `optimizer` the accumulated gradients and the flat
/// buffers of the collective. FLOPs: forward + backward `= 3 ×` a forward, one more forward with
/// `gradient_checkpointing`.
pub fn training_footprint(f: &mut Footprint, m: &PlannedModel, ctx: &PlanCtx, t: Training) {
    let device = ctx.device();
    let pass = t.pass;
    let trained = m.trained_params()
        - if t.vision || m.lora {
            0
        } else {
            m.shape.vision_params
        };
    let world = ctx.replicas().max(1) as u64;
    let sharded = world > 1 && t.zero_stage > 0;
    let held = if sharded {
        trained.div_ceil(world)
    } else {
        trained
    };
    f.resident(
        Item::new(
            format!(
                "AdamW moments ({}{}, f32)",
                params_text(trained),
                if sharded { format!(" / {world} replicas, ZeRO stage {}", t.zero_stage) } else { String::new() }
            ),
            8 * held,
            Place::Device,
        )
        .hint(if world > 1 && t.zero_stage == 0 {
            "zero_stage = 1 (or 2) shards the moments over the replicas; or train LoRA adapters (`lora = { rank = 16 }` on the model)"
        } else {
            "train LoRA adapters (`lora = { rank = 16 }` on the model), or spread the run over more devices"
        }),
    );
    if world > 1 {
        // Each replica but the first keeps its own copy of the model as it is stored: f32
        // masters (or the compute precision and its own masters, when they are sharded), or a
        // LoRA model's base in the compute precision with its f32 adapters.
        f.resident(Item::new(
            format!(
                "the replica's copy of the model ({}{})",
                params_text(m.shape.params),
                match m.masters_over {
                    Some(w) if !m.lora => format!(", f32 masters of 1/{w}"),
                    _ => String::new(),
                }
            ),
            m.trained_weight_bytes(),
            Place::Replicas,
        ));
    }
    let chunk = chunk_of(t.chunk, device).min(pass.response.max(1));
    // One replica sums its micro-batches' gradients where they are: the first micro-batch's
    // and the next one's are alive together. Several replicas sum them on the host as the
    // backward hands them over (`crate::train::grad_sum`): the device holds one backward's
    // gradients, in their weights' dtype (bounded here by a whole micro-batch's; a checkpointed
    // trunk hands them over segment by segment).
    let accumulating = world == 1 && pass.mini_rows > pass.micro_rows;
    let gradient_bytes = match m.masters_over {
        Some(w) if world > 1 && !m.lora => trained * m.element() + (trained * 4).div_ceil(w),
        _ => trained * 4,
    };
    let mut items = vec![
        Item::new(
            format!(
                "activations kept for the backward ({} rows × {} tokens{})",
                pass.micro_rows,
                pass.len,
                if t.checkpointing { ", checkpointed" } else { "" }
            ),
            pass.micro_tokens() * m.training_bytes_per_token(pass.len, device, t.checkpointing),
            Place::Device,
        )
        .hint(if t.checkpointing {
            "lower micro_batch_size (or max_tokens_per_micro_batch)"
        } else {
            "gradient_checkpointing = true, or lower micro_batch_size (or max_tokens_per_micro_batch)"
        }),
        Item::new(
            "vision tower pass, kept for the backward",
            m.vision_bytes(pass.micro_prompts(), &t.prompts, device, true),
            Place::Device,
        ),
        Item::new(
            format!(
                "gradients{} ({}, {})",
                if accumulating { ": accumulated and this micro-batch's" } else { "" },
                params_text(trained),
                if gradient_bytes == trained * 4 { "f32" } else { "in their weights' dtypes" }
            ),
            if accumulating { 2 } else { 1 } * gradient_bytes,
            Place::Device,
        )
        .hint("train LoRA adapters (`lora = { rank = 16 }` on the model)"),
    ];
    if world > 1 {
        let local = ctx.local_replicas() as u64;
        items.push(Item::new(
            format!(
                "gradient sums on the host ({local} replicas × {}, f32)",
                params_text(trained)
            ),
            local * 4 * trained,
            Place::Host,
        ));
    }
    if t.lm_head {
        items.push(
            Item::new(
                format!("LM-head block ({} rows × {chunk} positions × {} vocabulary, f32, with gradients)", pass.micro_rows, m.shape.vocab),
                logit_bytes(pass.micro_rows, chunk, m.shape.vocab, LOGIT_COPIES_TRAINING),
                Place::Device,
            )
            .hint("lower chunk"),
        );
    }
    items.extend(compute_view_item(m));
    f.phase("forward+backward", items);
    // One replica steps its summed gradients on the device; several unflatten the reduced ones
    // there (stage 2: only the replica's own).
    let stepped = match (world, t.zero_stage) {
        (1, _) => trained,
        (_, 2) => held,
        _ => trained,
    };
    let mut optimizer = vec![Item::new(
        "summed gradients the optimizer steps (f32)",
        4 * stepped,
        Place::Device,
    )];
    if world > 1 {
        // Each of this process's replicas hands its host sum to the collective; the all-reduce
        // returns one of the same size, the reduce-scatter (stage 2) the replica's share
        // (nodes/src/train/replicated/).
        let local = ctx.local_replicas() as u64;
        let back = if t.zero_stage >= 2 { held } else { trained };
        optimizer.push(
            Item::new(
                format!("gradients flattened for the collective ({local} replicas × {}, f32)", params_text(trained + back)),
                local * 4 * (trained + back),
                Place::Host,
            )
            .hint("train LoRA adapters (`lora = { rank = 16 }` on the model): the collective then moves only theirs"),
        );
    }
    f.phase("optimizer", optimizer);
    let rows = pass.rows as u64;
    let forward = m.forward_flops(
        rows * pass.len as u64,
        pass.len,
        if t.lm_head {
            rows * pass.response as u64
        } else {
            0
        },
    ) + m.vision_flops(pass.rows, &t.prompts);
    f.flops = forward * if t.checkpointing { 4.0 } else { 3.0 } * t.epochs as f64;
    f.flops_precision = Some(m.precision_name().into());
}

/// `1.23 B parameters`, `45.6 M parameters`.
pub fn params_text(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B parameters", n as f64 / 1e9)
    } else {
        format!("{:.2} M parameters", n as f64 / 1e6)
    }
}

/// The compute-precision copy of a model stored in f32 (trainable weights under mixed
/// precision) that a pass makes (`Model::compute_view`).
pub(crate) fn compute_view_item(m: &PlannedModel) -> Option<Item> {
    (m.trainable && !m.lora && m.precision != flowrl_models::weights::Precision::F32).then(|| {
        Item::new(
            format!("{} view of the weights", m.precision_name()),
            view_bytes(m),
            Place::Device,
        )
    })
}
