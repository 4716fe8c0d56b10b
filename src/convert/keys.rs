//! What each verl configuration key is to flowrl: mapped onto a graph key, of no meaning here
//! (an engine choice, a logging option, a setting that only matters with another one on), or
//! faithful only at one value (anything else is not carried over). A key no rule matches is
//! unknown. docs/from-verl.md is this table in prose; a test checks that every key of verl's
//! default configuration has a rule and a row there.

/// What a verl key is to flowrl.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Read by the converter; the graph key(s) it becomes.
    Mapped(&'static str),
    /// Means nothing for a flowrl graph; why.
    NoEffect(&'static str),
    /// flowrl does what verl does only at these values (`|`-separated); any other value is not
    /// carried over, for the reason given.
    Only(&'static str, &'static str),
}

/// One rule: a dotted pattern (`*` one segment, `**` any number of segments, `a|b` either
/// segment; a pattern has `|` or `**`, not both, so that docs/from-verl.md can list it) and its
/// class. The first matching rule applies.
pub struct Rule {
    pub pattern: &'static str,
    pub class: Class,
}

const ENGINE: &str = "engine choice (verl's FSDP / vLLM / Ray machinery): flowrl runs its own";
const PROFILER: &str = "profiling";
const MEMORY: &str = "memory / speed choice of verl's workers; results do not depend on it";
const QAT: &str =
    "quantization-aware training (NVFP4 fake-quantized weights in the forward) is not supported";

macro_rules! rules {
    ($($pattern:literal => $class:expr,)*) => {
        pub const RULES: &[Rule] = &[$(Rule { pattern: $pattern, class: $class },)*];
    };
}

use Class::{Mapped, NoEffect, Only};

rules! {
    "**._target_" => NoEffect("the Python class Hydra instantiates"),
    "hydra.**" => NoEffect("Hydra's own settings"),

    // data
    "data.train_files" => Mapped("nodes.data.path (one file) / paths (a list)"),
    "data.val_files" => Mapped("nodes.data.val_path (the first file)"),
    "data.prompt_key" => Mapped("nodes.data.prompt_key"),
    "data.image_key" => Mapped("nodes.data.image_key"),
    "data.video_key" => NoEffect("flowrl reads images only; the video column is not read"),
    "data.audio_key" => NoEffect("flowrl reads images only; the audio column is not read"),
    "data.max_prompt_length" => Mapped("nodes.data.max_prompt_length"),
    "data.max_response_length" => Mapped("nodes.rollout.max_new_tokens, nodes.eval.max_new_tokens"),
    "data.train_batch_size" => Mapped("nodes.data.batch_size (prompts; with filter_groups nodes.filter.batch_size)"),
    "data.gen_batch_size" => Mapped("nodes.data.batch_size with filter_groups (prompts per generation batch)"),
    "data.val_batch_size" => Mapped("nodes.eval.batch_size"),
    "data.filter_overlong_prompts" => Mapped("nodes.data.filter_overlong_prompts"),
    "data.filter_overlong_prompts_workers" => NoEffect(ENGINE),
    "data.truncation" => Mapped("nodes.data.truncation"),
    "data.shuffle" => Mapped("nodes.data.shuffle"),
    "data.seed" => Mapped("run.seed"),
    "data.reward_fn_key" => Mapped("nodes.data.data_source_key"),
    "data.image_patch_size" => Mapped("nodes.data.verl_image_patch_size (with an image_key)"),
    "data.train_max_samples" => Only("-1", "every row of the training files is used"),
    "data.val_max_samples" => Only("-1", "every row of the validation file is used"),
    "data.tokenizer" => Only("null", "the prompts are encoded with the policy's own tokenizer"),
    "data.use_shm" => NoEffect(ENGINE),
    "data.tool_config_path" => NoEffect("the dataset's copy of rollout.multi_turn.tool_config_path, which the rollout node's tools come from"),
    "data.function_tool_path" => NoEffect("the dataset's copy of rollout.multi_turn.function_tool_path"),
    "data.return_raw_input_ids|return_raw_chat|return_full_prompt|return_multi_modal_inputs" => NoEffect("what verl's dataset hands its workers"),
    "data.dataloader_num_workers" => NoEffect(ENGINE),
    "data.validation_shuffle" => NoEffect("the order of the validation prompts does not change their scores"),
    "data.trust_remote_code" => NoEffect("flowrl runs no Python code from a model repository"),
    "data.custom_cls.path" => Only("null", "a custom dataset class (Python) is not supported"),
    "data.custom_cls.name" => NoEffect("only read with data.custom_cls.path"),
    "data.sampler.class_path" => Only("null", "a custom sampler (Python) is not supported"),
    "data.sampler.class_name" => NoEffect("only read with data.sampler.class_path"),
    "data.datagen.path" => Only("null", "a data generator (Python) is not supported"),
    "data.datagen.name" => NoEffect("only read with data.datagen.path"),
    "data.apply_chat_template_kwargs" => Only("{}", "the chat template is rendered with its defaults"),
    "data.mm_processor_kwargs.**" => Only("{}", "the image processor runs with its defaults"),
    "data.continuous_token.**" => NoEffect("how verl's agent loop tokenizes multi-turn conversations (verl 0.9; its only way since): flowrl keeps the policy's tokens as sampled"),

    // rollout
    "actor_rollout_ref.rollout.n" => Mapped("nodes.rollout.n"),
    "actor_rollout_ref.rollout.temperature" => Mapped("nodes.rollout.temperature (and the log-prob and update nodes' temperature)"),
    "actor_rollout_ref.rollout.top_p" => Mapped("nodes.rollout.top_p"),
    "actor_rollout_ref.rollout.top_k" => Mapped("nodes.rollout.top_k"),
    "actor_rollout_ref.rollout.do_sample" => Mapped("nodes.rollout.greedy (= not do_sample)"),
    "actor_rollout_ref.rollout.response_length" => Mapped("nodes.rollout.max_new_tokens"),
    "actor_rollout_ref.rollout.max_num_batched_tokens" => Mapped("nodes.rollout.max_num_batched_tokens (tokens per prefill pass)"),
    "actor_rollout_ref.rollout.prompt_length" => NoEffect("vLLM's prompt budget; prompts are bounded by data.max_prompt_length"),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu" => Mapped("nodes.old.micro_batch_size"),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size" => Mapped("nodes.old.micro_batch_size (÷ data-parallel GPUs)"),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz" => Mapped("nodes.old.max_tokens_per_micro_batch"),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu" => Mapped("nodes.old.max_tokens_per_micro_batch"),
    "actor_rollout_ref.rollout.val_kwargs.do_sample|temperature|top_p|top_k|n" => Mapped("nodes.eval (greedy: do_sample = false, n = 1)"),
    "actor_rollout_ref.rollout.ignore_eos" => Only("false", "responses end at the model's EOS"),
    "actor_rollout_ref.rollout.over_sample_rate" => Only("0", "every sampled response is kept"),
    "actor_rollout_ref.rollout.skip_rollout" => Only("false", "responses are always sampled"),
    "actor_rollout_ref.rollout.skip_dump_dir" => NoEffect("only read with rollout.skip_rollout"),
    "actor_rollout_ref.rollout.skip.enable" => Only("false", "responses are always sampled (verl's rollout skip reuses dumped rollouts)"),
    "actor_rollout_ref.rollout.skip.**" => NoEffect("only read with rollout.skip.enable"),
    "actor_rollout_ref.rollout.multi_turn.enable" => Mapped("nodes.rollout.kind = \"rollout.multi_turn\" (and the eval node's turns and tools)"),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns" => Mapped("nodes.rollout.max_turns (null: flowrl's default, 4)"),
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls" => Mapped("nodes.rollout.max_parallel_calls"),
    "actor_rollout_ref.rollout.multi_turn.format" => Mapped("nodes.rollout.format (hermes; other syntaxes are not carried over)"),
    "actor_rollout_ref.rollout.multi_turn.tool_config_path" => Mapped("[nodes.rollout.tools.NAME] (verl's image zoom-in tool → crop/zoom_in; other tools are named as not carried over)"),
    "actor_rollout_ref.rollout.multi_turn.max_user_turns" => Only("null", "tool answers are bounded by max_turns and max_tool_calls, not counted apart"),
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length|tool_response_truncate_side" => NoEffect("tool answers are kept whole; the response budget (max_new_tokens) bounds them"),
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path" => Only("null", "interactions (a simulated user between turns) are not supported"),
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template" => Only("false", "the conversation is rendered by the model's chat template as it is"),
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode" => NoEffect("flowrl keeps the policy's tokens as sampled and checks every trajectory against the chat template at every step"),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts" => Only("null", "interactions are not supported"),
    "actor_rollout_ref.rollout.multi_turn.function_tool_path" => Only("null", "Python function tools (`@function_tool`) are not supported"),
    "actor_rollout_ref.rollout.multi_turn.**" => NoEffect("only read with rollout.multi_turn.enable"),
    "actor_rollout_ref.rollout.calculate_log_probs" => NoEffect("the rollout's own log-probs are always kept; verl only logs them"),
    "actor_rollout_ref.rollout.quantization" => Only("null", "quantized rollouts are not supported"),
    "actor_rollout_ref.rollout.quantization_config_file" => NoEffect("only read with rollout.quantization"),
    "actor_rollout_ref.rollout.agent.**" => NoEffect("verl's agent loop (single-turn by default) drives its rollout server; flowrl's rollout node samples directly"),
    "actor_rollout_ref.rollout.profiler.**" => NoEffect(PROFILER),
    "actor_rollout_ref.rollout.name|mode|dtype|gpu_memory_utilization|enforce_eager|cudagraph_capture_sizes|free_cache_engine|tensor_model_parallel_size|data_parallel_size|expert_parallel_size|pipeline_model_parallel_size|max_model_len|max_num_seqs|enable_chunked_prefill|enable_prefix_caching|scheduling_policy|load_format|disable_log_stats|multi_stage_wake_up|logprobs_mode|skip_tokenizer_init|enable_rollout_routing_replay|mtp|layered_summon" => NoEffect(ENGINE),
    "actor_rollout_ref.rollout.engine_kwargs.**" => NoEffect(ENGINE),
    "actor_rollout_ref.rollout.checkpoint_engine.**" => NoEffect(ENGINE),
    "actor_rollout_ref.rollout.trace.**" => NoEffect(ENGINE),
    "actor_rollout_ref.rollout.prometheus.**" => NoEffect(ENGINE),
    "actor_rollout_ref.rollout.nnodes|n_gpus_per_node|full_determinism" => NoEffect(ENGINE),
    "actor_rollout_ref.rollout.disaggregation.**" => NoEffect(ENGINE),
    "actor_rollout_ref.rollout.seed" => NoEffect("vLLM's sampling seed: another seed draws other samples, not another run (flowrl's seed is run.seed)"),
    "actor_rollout_ref.rollout.moe_load_balance_metrics_interval" => NoEffect("logging of MoE load-balance metrics"),
    "actor_rollout_ref.rollout.mtp.**" => NoEffect("verl's copy of model.mtp for its rollout server"),
    "actor_rollout_ref.rollout.qat.**" => NoEffect("verl's copy of actor.fsdp_config.qat for its rollout server"),

    // reference policy
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu" => Mapped("nodes.ref.micro_batch_size"),
    "actor_rollout_ref.ref.log_prob_micro_batch_size" => Mapped("nodes.ref.micro_batch_size (÷ data-parallel GPUs)"),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz|log_prob_max_token_len_per_gpu" => Mapped("nodes.ref.max_tokens_per_micro_batch"),
    "actor_rollout_ref.ref.rollout_n" => NoEffect("a copy of rollout.n"),
    "actor_rollout_ref.ref.profiler.**" => NoEffect(PROFILER),
    "actor_rollout_ref.ref.**" => NoEffect(ENGINE),

    // actor: optimizer
    "actor_rollout_ref.actor.optim.lr" => Mapped("nodes.update.lr"),
    "actor_rollout_ref.actor.optim.lr_warmup_steps" => Mapped("nodes.update.warmup_steps (when > 0)"),
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio" => Mapped("nodes.update.warmup_ratio (when lr_warmup_steps <= 0)"),
    "actor_rollout_ref.actor.optim.weight_decay" => Mapped("nodes.update.weight_decay"),
    "actor_rollout_ref.actor.optim.betas" => Mapped("nodes.update.betas"),
    "actor_rollout_ref.actor.optim.clip_grad" => Mapped("nodes.update.grad_clip"),
    "actor_rollout_ref.actor.optim.min_lr_ratio" => Mapped("nodes.update.min_lr_ratio"),
    "actor_rollout_ref.actor.optim.lr_scheduler_type" => Mapped("nodes.update.lr_schedule"),
    "actor_rollout_ref.actor.optim.warmup_style" => Mapped("nodes.update.lr_schedule (verl's older name)"),
    "actor_rollout_ref.actor.optim.num_cycles" => Only("0.5", "the cosine schedule is half a cosine cycle"),
    "actor_rollout_ref.actor.optim.optimizer" => Only("AdamW", "flowrl's optimizer is AdamW"),
    "actor_rollout_ref.actor.optim.optimizer_impl" => Only("torch.optim", "flowrl's AdamW is torch's algorithm"),
    "actor_rollout_ref.actor.optim.override_optimizer_config" => Only("null", "extra optimizer arguments are not supported"),
    "actor_rollout_ref.actor.optim.total_training_steps" => NoEffect("filled in by verl's trainer from the run's steps"),
    "actor_rollout_ref.actor.optim.zero_indexed_step" => Only("true", "the learning-rate schedule counts steps from 0"),
    "actor_rollout_ref.actor.fsdp_config.qat.enable" => Only("false", QAT),
    "actor_rollout_ref.actor.fsdp_config.qat.**" => NoEffect("only read with actor.fsdp_config.qat.enable"),
    "actor_rollout_ref.actor.fsdp_config.**" => NoEffect(ENGINE),
    "actor_rollout_ref.actor.profiler.**" => NoEffect(PROFILER),
    "actor_rollout_ref.actor.checkpoint.**" => NoEffect("checkpoints always hold the model, its optimizer state and the run state"),

    // actor: batches
    "actor_rollout_ref.actor.rollout_n" => NoEffect("a copy of rollout.n"),
    "actor_rollout_ref.actor.strategy" => NoEffect(ENGINE),
    "actor_rollout_ref.actor.ppo_mini_batch_size" => Mapped("nodes.update.mini_batch_size (prompts)"),
    "actor_rollout_ref.actor.ppo_micro_batch_size" => Mapped("nodes.update.micro_batch_size (÷ data-parallel GPUs)"),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" => Mapped("nodes.update.micro_batch_size (responses per device)"),
    "actor_rollout_ref.actor.use_dynamic_bsz" => Mapped("nodes.update.max_tokens_per_micro_batch"),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu" => Mapped("nodes.update.max_tokens_per_micro_batch"),
    "actor_rollout_ref.actor.ppo_epochs" => Mapped("nodes.update.ppo_epochs"),
    "actor_rollout_ref.actor.shuffle" => Only("false", "mini-batches are taken in order"),
    "actor_rollout_ref.actor.data_loader_seed" => NoEffect("only read with actor.shuffle"),

    // actor: loss
    "actor_rollout_ref.actor.clip_ratio|clip_ratio_low|clip_ratio_high|clip_ratio_c|tau_pos|tau_neg" => Mapped("nodes.update.<same name> (the options the policy loss reads)"),
    "actor_rollout_ref.actor.policy_loss.loss_mode" => Mapped("nodes.update.policy_loss"),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio|clip_cov_lb|clip_cov_ub|kl_cov_ratio|ppo_kl_coef|dro_beta" => Mapped("nodes.update.<same name> (the options the policy loss reads)"),
    "actor_rollout_ref.actor.loss_agg_mode" => Mapped("nodes.update.loss_agg_mode"),
    "actor_rollout_ref.actor.loss_scale_factor" => Only("null", "the loss is normalised by the mini-batch as verl does by default"),
    "actor_rollout_ref.actor.entropy_coeff" => Mapped("nodes.update.entropy_coeff"),
    "actor_rollout_ref.actor.calculate_entropy" => NoEffect("the entropy is always computed and logged (actor/entropy)"),
    "actor_rollout_ref.actor.use_kl_loss" => Mapped("nodes.update.kl, [models.reference], nodes.ref"),
    "actor_rollout_ref.actor.kl_loss_coef" => Mapped("nodes.update.kl.coef"),
    "actor_rollout_ref.actor.kl_loss_type" => Mapped("nodes.update.kl.estimator"),
    "actor_rollout_ref.actor.grad_clip" => Mapped("nodes.update.grad_clip"),
    "actor_rollout_ref.actor.freeze_vision_tower" => Mapped("nodes.update.freeze_vision_tower"),
    "actor_rollout_ref.actor.calculate_sum_pi_squared" => Mapped("nodes.old.sum_pi_squared (set for the optimal-token-baseline estimators)"),
    "actor_rollout_ref.actor.router_replay.mode" => Only("disabled", "MoE router replay is not supported"),
    "actor_rollout_ref.actor.router_replay.**" => NoEffect("only read with router_replay.mode"),
    "actor_rollout_ref.actor.use_prefix_grouper|use_torch_compile|use_fused_kernels|ulysses_sequence_parallel_size|entropy_from_logits_with_chunking|entropy_checkpointing|sum_pi_squared_checkpointing" => NoEffect(MEMORY),
    "actor_rollout_ref.actor.use_remove_padding" => Mapped("nodes.update.padding_free, nodes.old.padding_free, nodes.ref.padding_free"),
    "actor_rollout_ref.actor.entropy_from_logits_chunk_size|pad_to_length" => NoEffect(MEMORY),
    "actor_rollout_ref.actor.qat.**" => NoEffect("the actor's own QAT block, which verl's workers do not read: QAT is actor.fsdp_config.qat.enable"),

    // model
    "actor_rollout_ref.model.path" => Mapped("models.policy.path"),
    "actor_rollout_ref.model.lora_rank" => Mapped("models.policy.lora.rank (when > 0)"),
    "actor_rollout_ref.model.lora_alpha" => Mapped("models.policy.lora.alpha"),
    "actor_rollout_ref.model.target_modules" => Mapped("models.policy.lora.target_modules"),
    "actor_rollout_ref.model.lora_adapter_path" => Mapped("models.policy.lora.adapter"),
    "actor_rollout_ref.model.exclude_modules" => Mapped("none: flowrl leaves the vision tower out unless a target names it (null or a pattern of the vision tower only)"),
    "actor_rollout_ref.model.hf_config_path" => Only("null", "config.json is read from the model directory"),
    "actor_rollout_ref.model.tokenizer_path" => Only("null", "the tokenizer is read from the model directory"),
    "actor_rollout_ref.model.custom_chat_template" => Only("null", "the model directory's chat template is used"),
    "actor_rollout_ref.model.override_config" => Only("{}", "config.json is used as it is"),
    "actor_rollout_ref.model.external_lib" => Only("null", "model code from a Python package is not supported"),
    "actor_rollout_ref.model.mtp.enable" => Only("false", "multi-token prediction is not supported"),
    "actor_rollout_ref.model.mtp.**" => NoEffect("only read with model.mtp.enable"),
    "actor_rollout_ref.model.use_shm|trust_remote_code|enable_activation_offload|use_liger|use_fused_kernels" => NoEffect(MEMORY),
    "actor_rollout_ref.model.enable_gradient_checkpointing" => Mapped("nodes.update.gradient_checkpointing"),
    "actor_rollout_ref.model.use_remove_padding" => Mapped("through actor.use_remove_padding (its default)"),
    "actor_rollout_ref.model.fused_kernel_options.**" => NoEffect(MEMORY),
    "actor_rollout_ref.model.tiled_mlp.**" => NoEffect(MEMORY),
    "actor_rollout_ref.model.lora.rank" => Only("0", "verl's Megatron LoRA block (model.lora) is not carried over; a LoRA policy comes from model.lora_rank"),
    "actor_rollout_ref.model.lora.merge" => NoEffect(ENGINE),
    "actor_rollout_ref.model.lora.**" => NoEffect("only read with model.lora.rank > 0 (verl's Megatron LoRA)"),
    "actor_rollout_ref.hybrid_engine|nccl_timeout" => NoEffect(ENGINE),

    // critic
    "critic.optim.lr" => Mapped("nodes.critic.lr"),
    "critic.optim.lr_warmup_steps" => Mapped("nodes.critic.warmup_steps (when > 0)"),
    "critic.optim.lr_warmup_steps_ratio" => Mapped("nodes.critic.warmup_ratio (when lr_warmup_steps <= 0)"),
    "critic.optim.weight_decay" => Mapped("nodes.critic.weight_decay"),
    "critic.optim.betas" => Mapped("nodes.critic.betas"),
    "critic.optim.clip_grad" => Mapped("nodes.critic.grad_clip"),
    "critic.optim.min_lr_ratio" => Mapped("nodes.critic.min_lr_ratio"),
    "critic.optim.lr_scheduler_type|warmup_style" => Mapped("nodes.critic.lr_schedule"),
    "critic.optim.num_cycles" => Only("0.5", "the cosine schedule is half a cosine cycle"),
    "critic.optim.optimizer" => Only("AdamW", "flowrl's optimizer is AdamW"),
    "critic.optim.optimizer_impl" => Only("torch.optim", "flowrl's AdamW is torch's algorithm"),
    "critic.optim.override_optimizer_config" => Only("null", "extra optimizer arguments are not supported"),
    "critic.optim.total_training_steps" => NoEffect("filled in by verl's trainer from the run's steps"),
    "critic.optim.zero_indexed_step" => Only("true", "the learning-rate schedule counts steps from 0"),
    "critic.model.path" => Mapped("models.critic.path (with value_head = true)"),
    "critic.model.lora_rank" => Only("0", "a LoRA critic is not supported yet"),
    "critic.model.lora_alpha|target_modules" => NoEffect("only read with critic.model.lora_rank > 0"),
    "critic.model.override_config" => Only("{}", "config.json is used as it is"),
    "critic.model.external_lib" => Only("null", "model code from a Python package is not supported"),
    "critic.model.tokenizer_path" => NoEffect("the critic scores the policy's tokens"),
    "critic.model.fsdp_config.**" => NoEffect(ENGINE),
    "critic.model.use_shm|trust_remote_code|enable_activation_offload" => NoEffect(MEMORY),
    "critic.model.enable_gradient_checkpointing" => Mapped("nodes.critic.gradient_checkpointing"),
    "critic.model.use_remove_padding" => Mapped("nodes.critic.padding_free, nodes.values.padding_free"),
    "critic.model.tiled_mlp.**" => NoEffect(MEMORY),
    "critic.model.hf_config_path" => Only("null", "config.json is read from the model directory"),
    "critic.model.custom_chat_template" => NoEffect("the critic scores the policy's tokens"),
    "critic.model.exclude_modules|lora_adapter_path" => NoEffect("only read with critic.model.lora_rank > 0"),
    "critic.model.use_liger|use_fused_kernels" => NoEffect(MEMORY),
    "critic.model.fused_kernel_options.**" => NoEffect(MEMORY),
    "critic.model.lora.rank" => Only("0", "a LoRA critic is not supported yet"),
    "critic.model.lora.**" => NoEffect("only read with critic.model.lora.rank > 0 (verl's Megatron LoRA)"),
    "critic.model.mtp.enable" => Only("false", "multi-token prediction is not supported"),
    "critic.model.mtp.**" => NoEffect("only read with critic.model.mtp.enable"),
    "critic.fsdp.qat.enable" => Only("false", QAT),
    "critic.fsdp.**" => NoEffect(ENGINE),
    "critic.rollout_n" => NoEffect("a copy of rollout.n"),
    "critic.strategy|ulysses_sequence_parallel_size" => NoEffect(ENGINE),
    "critic.enable" => NoEffect("the critic is used when adv_estimator = gae, as verl decides with enable = null"),
    "critic.ppo_mini_batch_size" => Mapped("nodes.critic.mini_batch_size (prompts)"),
    "critic.ppo_micro_batch_size" => Mapped("nodes.critic.micro_batch_size (÷ data-parallel GPUs)"),
    "critic.ppo_micro_batch_size_per_gpu" => Mapped("nodes.critic.micro_batch_size (responses per device)"),
    "critic.forward_micro_batch_size" => Mapped("nodes.values.micro_batch_size (÷ data-parallel GPUs)"),
    "critic.forward_micro_batch_size_per_gpu" => Mapped("nodes.values.micro_batch_size"),
    "critic.use_dynamic_bsz|ppo_max_token_len_per_gpu|forward_max_token_len_per_gpu" => Mapped("nodes.critic / nodes.values max_tokens_per_micro_batch"),
    "critic.ppo_epochs" => Mapped("nodes.critic.ppo_epochs"),
    "critic.shuffle" => Only("false", "mini-batches are taken in order"),
    "critic.data_loader_seed" => NoEffect("only read with critic.shuffle"),
    "critic.cliprange_value" => Mapped("nodes.critic.cliprange_value"),
    "critic.loss_agg_mode" => Mapped("nodes.critic.loss_agg_mode"),
    "critic.loss_scale_factor" => Only("null", "the loss is normalised by the mini-batch as verl does by default"),
    "critic.grad_clip" => Mapped("nodes.critic.grad_clip"),
    "critic.checkpoint.**" => NoEffect("checkpoints always hold the model, its optimizer state and the run state"),
    "critic.profiler.**" => NoEffect(PROFILER),

    // reward
    "reward_model.enable" => Mapped("nodes.reward = reward.model when reward_model.model.path holds a score head (else not carried over: a generative reward model needs a reward.judge)"),
    "reward_model.model.path" => Mapped("models.reward_model.path (with reward_model.enable)"),
    "reward_model.reward_manager" => Mapped("the reward nodes: naive → the data source's scorer; dapo → the same plus reward.overlong"),
    "reward_model.overlong_buffer.enable" => Mapped("nodes.overlong (reward.overlong)"),
    "reward_model.overlong_buffer.len" => Mapped("nodes.overlong.len"),
    "reward_model.overlong_buffer.penalty_factor" => Mapped("nodes.overlong.penalty_factor"),
    "reward_model.overlong_buffer.log" => NoEffect("logging of the penalty"),
    "reward_model.sandbox_fusion.url" => Only("null", "sandboxed code-execution rewards are not supported"),
    "reward_model.sandbox_fusion.**" => NoEffect("only read with sandbox_fusion.url"),
    "reward_model.reward_loop_module_path" => Only("null", "a custom reward loop (Python) is not supported"),
    "reward_model.launch_reward_fn_async|use_reward_loop|num_workers|reward_loop_source|reward_loop_class_name" => NoEffect(ENGINE),
    "reward_model.profiler.**" => NoEffect(PROFILER),
    "reward_model.**" => NoEffect("only read with reward_model.enable"),
    "reward_manager.name" => Mapped("the reward nodes (as reward_model.reward_manager)"),
    "reward_manager.source" => NoEffect(ENGINE),
    "reward_manager.module.path" => Only("null", "a custom reward manager (Python) is not supported"),
    "reward_manager.module.name" => NoEffect("only read with reward_manager.module.path"),
    "custom_reward_function.path" => Only("null", "a Python reward function: run it as an `exec` node (docs/exec-protocol.md)"),
    "custom_reward_function.name" => NoEffect("only read with custom_reward_function.path"),
    "sandbox_fusion.url" => Only("null", "sandboxed code-execution rewards are not supported"),
    "sandbox_fusion.**" => NoEffect("only read with sandbox_fusion.url"),
    // verl's newer layout of the same reward settings
    "reward.reward_manager.name" => Mapped("the reward nodes (as reward_model.reward_manager)"),
    "reward.reward_kwargs.overlong_buffer_cfg.enable" => Mapped("nodes.overlong (reward.overlong)"),
    "reward.reward_kwargs.overlong_buffer_cfg.len" => Mapped("nodes.overlong.len"),
    "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor" => Mapped("nodes.overlong.penalty_factor"),
    "reward.reward_kwargs.overlong_buffer_cfg.log" => NoEffect("logging of the penalty"),
    "reward.reward_kwargs.max_resp_len" => Mapped("nodes.overlong.max_response_length"),
    "reward.reward_manager.source" => NoEffect(ENGINE),
    "reward.reward_manager.module.path" => Only("null", "a custom reward manager (Python) is not supported"),
    "reward.reward_manager.module.name" => NoEffect("only read with reward.reward_manager.module.path"),
    "reward.custom_reward_function.path" => Only("null", "a Python reward function: run it as an `exec` node (docs/exec-protocol.md)"),
    "reward.custom_reward_function.name" => NoEffect("only read with reward.custom_reward_function.path"),
    "reward.reward_model.enable" => Mapped("nodes.reward = reward.model when reward.reward_model.model_path holds a score head (else not carried over: a generative reward model needs a reward.judge)"),
    "reward.reward_model.model_path" => Mapped("models.reward_model.path (with reward.reward_model.enable)"),
    "reward.reward_model.**" => NoEffect("only read with reward.reward_model.enable"),
    "reward.sandbox_fusion.url" => Only("null", "sandboxed code-execution rewards are not supported"),
    "reward.sandbox_fusion.**" => NoEffect("only read with reward.sandbox_fusion.url"),
    "reward.num_workers" => NoEffect(ENGINE),

    // algorithm
    "algorithm.adv_estimator" => Mapped("nodes.advantage.kind (advantage.<estimator>)"),
    "algorithm.gamma" => Mapped("nodes.advantage.gamma (gae, reinforce_plus_plus)"),
    "algorithm.lam" => Mapped("nodes.advantage.lam (gae)"),
    "algorithm.norm_adv_by_std_in_grpo" => Mapped("nodes.advantage.norm_by_std (grpo) / norm_adv_by_std_in_grpo (grpo_passk)"),
    "algorithm.use_kl_in_reward" => Only("false", "a KL penalty inside the reward is not supported yet (actor.use_kl_loss is)"),
    "algorithm.kl_penalty" => NoEffect("only read with algorithm.use_kl_in_reward"),
    "algorithm.kl_ctrl.**" => NoEffect("only read with algorithm.use_kl_in_reward"),
    "algorithm.use_pf_ppo" => Only("false", "preference-feedback PPO reweighting is not supported"),
    "algorithm.pf_ppo.**" => NoEffect("only read with algorithm.use_pf_ppo"),
    "algorithm.rollout_correction.rollout_is|rollout_rs" => Only("null", "importance weighting / rejection against the rollout policy is not supported yet"),
    "algorithm.rollout_correction.bypass_mode" => Only("false", "the old log-probs are always recomputed"),
    "algorithm.rollout_correction.**" => NoEffect("only read with rollout_correction.rollout_is / rollout_rs"),
    "algorithm.filter_groups.enable" => Mapped("nodes.filter (filter.groups, repeat = data, rollout, reward)"),
    "algorithm.filter_groups.metric" => Mapped("nodes.filter.metric"),
    "algorithm.filter_groups.max_num_gen_batches" => Mapped("nodes.filter.max_num_gen_batches"),
    "algorithm.filter_groups.max_inflight_gen_batches" => NoEffect("how many generation batches verl's V1 trainer keeps in flight while it filters groups (scheduling)"),
    "algorithm.gdpo_reward_keys|gdpo_reward_weights" => Mapped("nodes.advantage.<same name> (gdpo)"),

    // distillation
    "distillation.enabled" => Only("false", "on-policy distillation from teacher models is not supported"),
    "distillation.**" => NoEffect("only read with distillation.enabled"),

    // trainer
    "trainer.total_epochs" => Mapped("run.steps (epochs × training rows ÷ prompts per batch)"),
    "trainer.total_training_steps" => Mapped("run.steps"),
    "trainer.project_name|experiment_name" => NoEffect("names for the experiment logger (they reach run.out through default_local_dir)"),
    "trainer.default_local_dir" => Mapped("run.out"),
    "trainer.logger" => Mapped("run.tracking: tensorboard for tensorboard, wandb and the other trackers (which import its files); metrics.jsonl always"),
    "trainer.log_val_generations" => Mapped("nodes.eval.log_generations"),
    "trainer.rollout_data_dir|validation_data_dir" => Only("null", "dumping generations to files: wire a sink.jsonl node"),
    "trainer.nnodes" => Mapped("processes of the run (flowrl run --world), each with run.devices"),
    "trainer.n_gpus_per_node" => Mapped("run.devices"),
    "trainer.device" => Mapped("run.devices (cuda)"),
    "trainer.save_freq" => Mapped("run.checkpoint_every"),
    "trainer.max_actor_ckpt_to_keep" => Mapped("run.keep_checkpoints"),
    "trainer.max_critic_ckpt_to_keep" => NoEffect("the critic is checkpointed with the actor"),
    "trainer.test_freq" => Mapped("nodes.eval.every (no eval node when <= 0)"),
    "trainer.critic_warmup" => Mapped("nodes.update.critic_warmup"),
    "trainer.val_before_train" => Mapped("nodes.eval.before_train"),
    "trainer.val_only" => Only("false", "a graph trains; evaluate a checkpoint with a graph of data and eval nodes"),
    "trainer.resume_mode|resume_from_path|del_local_ckpt_after_load" => NoEffect("resuming is `flowrl run --resume DIR`"),
    "trainer.balance_batch" => NoEffect("balances sequence lengths across verl's GPUs; the gradient is the same"),
    "trainer.esi_redundant_time|default_hdfs_dir|ray_wait_register_center_timeout|use_legacy_worker_impl" => NoEffect(ENGINE),
    "trainer.use_v1" => NoEffect("which of verl's trainers runs the loop (V1 or the legacy ray_trainer)"),
    "trainer.v1.trainer_mode" => Only("sync", "flowrl trains on-policy, one step after the other: verl's async modes train on rollouts of older policies"),
    "trainer.v1.sync.**" => Only("{}", "verl's sync trainer with its defaults (it has no options)"),
    "trainer.v1.colocate_async.**" => NoEffect("only read with trainer.v1.trainer_mode = colocate_async"),
    "trainer.v1.separate_async.**" => NoEffect("only read with trainer.v1.trainer_mode = separate_async"),
    "trainer.v1.sampler.max_off_policy_threshold|max_off_policy_strategy" => NoEffect("only read by verl's async trainers (sync sampling is on-policy)"),
    "trainer.v1.sampler.sync_refill_failed_groups" => NoEffect("refills groups whose rollouts failed in verl's agent loop (an engine error, not a result)"),
    "trainer.v1.sampler.custom_sampler.path" => Only("null", "a custom replay-buffer sampler (Python) is not supported"),
    "trainer.v1.sampler.custom_sampler.name" => NoEffect("only read with custom_sampler.path"),
    "trainer.v1.sampler.sampler_kwargs.**" => NoEffect("only read by a custom sampler (custom_sampler.path)"),
    "skip.rollout|rollout_tq|async_rollout.enable" => Only("false", "responses are always sampled (verl's rollout skip dumps rollouts and replays them in later runs)"),
    "skip.**" => NoEffect("only read with skip.rollout / rollout_tq / async_rollout.enable"),
    "global_profiler.**" => NoEffect(PROFILER),
    "transfer_queue.**" => NoEffect(ENGINE),
    "ray_kwargs.**" => NoEffect(ENGINE),
}

/// The rule for `key`, or `None` for a key this table does not know.
pub fn classify(key: &str) -> Option<&'static Rule> {
    let segs: Vec<&str> = key.split('.').collect();
    RULES.iter().find(|r| {
        let pat: Vec<&str> = r.pattern.split('.').collect();
        matches(&pat, &segs)
    })
}

fn matches(pat: &[&str], segs: &[&str]) -> bool {
    match (pat.first(), segs.first()) {
        (None, None) => true,
        (Some(&"**"), _) => (0..=segs.len()).any(|i| matches(&pat[1..], &segs[i..])),
        (Some(p), Some(s)) => {
            (*p == "*" || p.split('|').any(|alt| alt == *s)) && matches(&pat[1..], &segs[1..])
        }
        _ => false,
    }
}

/// Whether `value` (as text) is one of an `Only` rule's values.
pub fn is_allowed(allowed: &str, value: &super::input::Value) -> bool {
    allowed.split('|').any(|a| {
        let a = super::input::parse_override_value(a);
        a.same(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let class = |key: &str| classify(key).unwrap().class;
        assert!(matches!(
            class("actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params"),
            Class::NoEffect(_)
        ));
        assert!(matches!(
            class("actor_rollout_ref.rollout.val_kwargs._target_"),
            Class::NoEffect(_)
        ));
        assert!(matches!(
            class("actor_rollout_ref.actor.clip_ratio_high"),
            Class::Mapped(_)
        ));
        assert!(matches!(
            class("actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache"),
            Class::NoEffect(_)
        ));
        assert!(classify("actor_rollout_ref.actor.no_such_key").is_none());
        assert!(classify("trainer.typo").is_none());
    }
}
