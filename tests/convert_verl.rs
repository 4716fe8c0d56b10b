//! `flowrl convert verl` on verl's own recipes (tests/fixtures/verl_configs/, made by running
//! Hydra on verl's configuration with the recipes' overrides): they convert into graphs that
//! `flowrl validate` accepts, with the key values checked; the batch-size rule with numbers.
//! Unknown keys: convert_verl_keys.rs; launch scripts: convert_verl_scripts.rs.

mod common;
#[path = "common/verl.rs"]
mod verl;
use common::root;
use verl::{
    TINY, body, convert, fixture, float, float_or, flowrl, get, int, stderr, string, validate,
};

#[test]
fn geo3k_grpo_recipe_converts_validates_and_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (text, g, err) = convert(
        &fixture("geo3k_grpo/overrides.txt"),
        tmp.path(),
        &["--strict"],
    );

    // The header: input, version, the engine choices of the script, what is not carried over.
    assert!(text.contains("geo3k_grpo/overrides.txt"), "{text}");
    assert!(text.contains(&format!("(flowrl {})", env!("CARGO_PKG_VERSION"))));
    assert!(
        text.contains("actor_rollout_ref.rollout.name = vllm"),
        "{text}"
    );
    assert!(text.contains("actor_rollout_ref.rollout.gpu_memory_utilization = 0.6"));
    assert!(text.contains("actor_rollout_ref.actor.fsdp_config.param_offload = false"));
    // trainer.logger = [console, wandb]: TensorBoard files, which W&B imports.
    assert_eq!(
        get(&g, "run.tracking").as_array().map(|a| a.len()),
        Some(2),
        "{text}"
    );
    assert!(text.contains("wandb sync --sync-tensorboard"), "{text}");
    // verl's val_before_train (default true) is carried over: no warning, step 0 evaluated.
    assert!(!err.contains("trainer.val_before_train"), "{err}");
    assert_eq!(get(&g, "nodes.eval.before_train").as_bool(), Some(true));

    // The values of verl's examples/grpo_trainer/run_qwen2_5_vl-7b.sh.
    assert_eq!(
        string(&g, "models.policy.path"),
        "Qwen/Qwen2.5-VL-7B-Instruct"
    );
    assert_eq!(string(&g, "models.reference.from"), "policy");
    assert_eq!(
        string(&g, "nodes.data.path"),
        "/home/user/data/geo3k/train.parquet"
    );
    assert_eq!(
        string(&g, "nodes.data.val_path"),
        "/home/user/data/geo3k/test.parquet"
    );
    assert_eq!(int(&g, "nodes.data.batch_size"), 512);
    assert_eq!(int(&g, "nodes.data.max_prompt_length"), 1024);
    assert_eq!(
        get(&g, "nodes.data.filter_overlong_prompts").as_bool(),
        Some(true)
    );
    assert_eq!(string(&g, "nodes.data.truncation"), "error");
    assert_eq!(int(&g, "nodes.data.verl_image_patch_size"), 14);
    assert_eq!(int(&g, "nodes.rollout.n"), 5);
    assert_eq!(int(&g, "nodes.rollout.max_new_tokens"), 2048);
    assert_eq!(float(&g, "nodes.rollout.temperature"), 1.0);
    assert_eq!(string(&g, "nodes.reward.kind"), "reward.geo3k");
    assert_eq!(string(&g, "nodes.advantage.kind"), "advantage.grpo");
    assert_eq!(int(&g, "nodes.old.micro_batch_size"), 20);
    assert_eq!(int(&g, "nodes.ref.micro_batch_size"), 20);
    assert_eq!(int(&g, "nodes.update.mini_batch_size"), 128);
    assert_eq!(int(&g, "nodes.update.micro_batch_size"), 10);
    assert_eq!(float(&g, "nodes.update.lr"), 1e-6);
    assert_eq!(float(&g, "nodes.update.clip_ratio"), 0.2);
    assert_eq!(string(&g, "nodes.update.kl.estimator"), "low_var_kl");
    assert_eq!(float(&g, "nodes.update.kl.coef"), 0.01);
    assert_eq!(float_or(&g, "nodes.update.entropy_coeff", 0.0), 0.0);
    // verl's default loss_agg_mode is flowrl's: not repeated in the graph.
    assert!(get(&g, "nodes.update").get("loss_agg_mode").is_none());
    assert_eq!(int(&g, "nodes.eval.every"), 5);
    assert_eq!(int(&g, "nodes.eval.max_new_tokens"), 2048);
    assert_eq!(int(&g, "run.checkpoint_every"), 20);
    assert_eq!(get(&g, "run.devices").as_array().unwrap().len(), 8);
    // The data files are another machine's: steps = total_epochs, with a warning.
    assert_eq!(int(&g, "run.steps"), 15);
    assert!(err.contains("--steps"), "{err}");
    let graph = tmp.path().join("graph.toml");
    validate(&graph, &[]);

    // The three forms verl leaves behind give the same graph.
    for form in ["geo3k_grpo/config.yaml", "geo3k_grpo/overrides.yaml"] {
        let dir = tempfile::tempdir().unwrap();
        let (other, _, _) = convert(&fixture(form), dir.path(), &["--strict"]);
        assert_eq!(
            body(&other),
            body(&text),
            "{form} differs from overrides.txt"
        );
    }

    // With the model and data paths on the tiny assets, two steps run.
    let out_dir = tmp.path().join("run");
    let mut args = vec![
        "run",
        graph.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
        "--steps",
        "2",
    ];
    args.extend_from_slice(TINY);
    args.extend_from_slice(&[
        "--set",
        "nodes.data.batch_size=4",
        "--set",
        "nodes.update.mini_batch_size=2",
        "--set",
        "nodes.update.micro_batch_size=5",
        "--set",
        "nodes.rollout.max_new_tokens=8",
        "--set",
        "nodes.eval.max_new_tokens=8",
        "--set",
        "nodes.data.max_prompt_length=128",
        "--set",
        "run.checkpoint_every=0",
    ]);
    let out = flowrl(&args);
    assert!(out.status.success(), "run failed:\n{}", stderr(&out));
    let metrics = std::fs::read_to_string(out_dir.join("metrics.jsonl")).unwrap();
    // val_before_train: step 0, then the two steps.
    assert_eq!(metrics.lines().count(), 3, "{metrics}");
    assert!(metrics.starts_with("{\"step\":0,"), "{metrics}");
    assert!(metrics.contains("actor/kl_loss"), "{metrics}");
}

#[test]
fn geo3k_lora_recipe_maps_the_adapter() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, g, err) = convert(
        &fixture("geo3k_grpo_lora/overrides.txt"),
        tmp.path(),
        &["--strict"],
    );
    let lora = get(&g, "models.policy.lora");
    assert_eq!(lora.get("rank").and_then(|v| v.as_integer()), Some(64));
    assert_eq!(lora.get("alpha").and_then(|v| v.as_float()), Some(32.0));
    assert_eq!(
        lora.get("target_modules")
            .and_then(|v| v.as_array())
            .map(|a| a.len()),
        Some(1)
    );
    // exclude_modules='.*visual.*' is what flowrl does anyway.
    assert!(!err.contains("exclude_modules"), "{err}");
    assert_eq!(float(&g, "nodes.update.lr"), 3e-6);
    validate(&tmp.path().join("graph.toml"), &[]);
}

#[test]
fn dapo_recipe_converts_to_filter_groups_and_overlong() {
    let tmp = tempfile::tempdir().unwrap();
    let (text, g, err) = convert(&fixture("dapo/overrides.txt"), tmp.path(), &["--strict"]);
    // recipe/dapo/run_dapo_qwen2.5_32b.sh
    assert_eq!(string(&g, "nodes.filter.kind"), "filter.groups");
    let repeat: Vec<&str> = get(&g, "nodes.filter.repeat")
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(repeat, ["data", "rollout", "reward", "overlong"]);
    assert_eq!(string(&g, "nodes.filter.metric"), "acc");
    assert_eq!(int(&g, "nodes.filter.max_num_gen_batches"), 10);
    // Prompts: 512 per training batch, generated 1536 at a time.
    assert_eq!(int(&g, "nodes.filter.batch_size"), 512);
    assert_eq!(int(&g, "nodes.data.batch_size"), 1536);
    assert_eq!(string(&g, "nodes.overlong.kind"), "reward.overlong");
    assert_eq!(int(&g, "nodes.overlong.len"), 4096);
    assert_eq!(float(&g, "nodes.overlong.penalty_factor"), 1.0);
    assert_eq!(int(&g, "nodes.overlong.max_response_length"), 20480);
    assert_eq!(int(&g, "nodes.rollout.n"), 16);
    assert_eq!(int(&g, "nodes.rollout.max_new_tokens"), 20480);
    assert_eq!(string(&g, "nodes.data.truncation"), "left");
    assert_eq!(int(&g, "nodes.update.mini_batch_size"), 32);
    assert_eq!(float(&g, "nodes.update.clip_ratio_low"), 0.2);
    assert_eq!(float(&g, "nodes.update.clip_ratio_high"), 0.28);
    assert_eq!(float(&g, "nodes.update.clip_ratio_c"), 10.0);
    assert_eq!(float(&g, "nodes.update.weight_decay"), 0.1);
    assert_eq!(int(&g, "nodes.update.warmup_steps"), 10);
    assert_eq!(
        string(&g, "nodes.update.inputs.rollouts"),
        "filter.rollouts"
    );
    assert_eq!(string(&g, "nodes.advantage.inputs.scores"), "filter.scores");
    // No KL loss: no reference model.
    assert!(g.get("models").unwrap().get("reference").is_none());
    assert!(get(&g, "nodes").get("ref").is_none());
    // Sampled validation and 16 machines are reported.
    assert!(err.contains("val_kwargs.do_sample"), "{err}");
    assert!(text.contains("--world 16"), "{text}");
    // Dynamic micro-batches: a token budget where the kind has one, else a warning.
    let update_has_budget = get(&g, "nodes.update")
        .get("max_tokens_per_micro_batch")
        .is_some();
    assert!(
        update_has_budget || err.contains("use_dynamic_bsz"),
        "{err}"
    );
    validate(
        &tmp.path().join("graph.toml"),
        &[
            "--set",
            "nodes.data.batch_size=48",
            "--set",
            "nodes.filter.batch_size=16",
            "--set",
            "nodes.update.mini_batch_size=8",
            "--set",
            "nodes.overlong.max_response_length=16",
            "--set",
            "nodes.overlong.len=4",
        ],
    );
    // The composed configuration gives the same graph.
    let dir = tempfile::tempdir().unwrap();
    let (composed, _, _) = convert(&fixture("dapo/config.yaml"), dir.path(), &["--strict"]);
    assert_eq!(body(&composed), body(&text));
}

#[test]
fn gae_config_converts_to_a_critic_graph() {
    let tmp = tempfile::tempdir().unwrap();
    // examples/ppo_trainer/run_deepseek7b_llm.sh, composed by Hydra.
    let (_, g, err) = convert(&fixture("gsm8k_gae/config.yaml"), tmp.path(), &["--strict"]);
    assert_eq!(
        string(&g, "models.critic.path"),
        "deepseek-ai/deepseek-llm-7b-chat"
    );
    assert_eq!(get(&g, "models.critic.value_head").as_bool(), Some(true));
    assert_eq!(string(&g, "nodes.values.kind"), "value");
    assert_eq!(string(&g, "nodes.values.model"), "critic");
    assert_eq!(int(&g, "nodes.values.micro_batch_size"), 32);
    assert_eq!(string(&g, "nodes.advantage.kind"), "advantage.gae");
    assert_eq!(string(&g, "nodes.advantage.inputs.values"), "values.values");
    assert_eq!(float(&g, "nodes.advantage.gamma"), 1.0);
    assert_eq!(float(&g, "nodes.advantage.lam"), 1.0);
    assert_eq!(string(&g, "nodes.critic.kind"), "update.critic");
    assert_eq!(int(&g, "nodes.critic.mini_batch_size"), 256);
    assert_eq!(int(&g, "nodes.critic.micro_batch_size"), 32);
    assert_eq!(float(&g, "nodes.critic.lr"), 1e-5);
    assert_eq!(float_or(&g, "nodes.critic.cliprange_value", 0.5), 0.5);
    assert_eq!(int(&g, "nodes.update.micro_batch_size"), 16);
    assert_eq!(int(&g, "nodes.old.micro_batch_size"), 32);
    // model.enable_gradient_checkpointing (actor and critic): the layers are recomputed.
    for node in ["update", "critic"] {
        let key = format!("nodes.{node}.gradient_checkpointing");
        assert_eq!(get(&g, &key).as_bool(), Some(true), "{key}");
    }
    assert_eq!(int(&g, "nodes.eval.every"), 1);
    // use_kl_loss=False: no reference.
    assert!(g.get("models").unwrap().get("reference").is_none());
    // gsm8k's scorer is not built in: reported.
    assert!(err.contains("data_source"), "{err}");
    validate(
        &tmp.path().join("graph.toml"),
        &[
            "--set",
            "models.critic.path=assets/tiny-qwen2-vl",
            "--set",
            "nodes.data.batch_size=256",
        ],
    );
}

/// verl counts prompts in train_batch_size and ppo_mini_batch_size, responses per GPU in the
/// micro-batch sizes; the deprecated global micro-batch sizes are divided by verl's
/// data-parallel size; steps are epochs × ⌊rows ÷ train_batch_size⌋.
#[test]
fn batch_sizes_follow_verls_rule() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("overrides.txt");
    std::fs::write(
        &input,
        "algorithm.adv_estimator=grpo data.train_files=datasets/shapes/train.parquet \
         data.train_batch_size=64 actor_rollout_ref.rollout.n=4 \
         actor_rollout_ref.actor.ppo_mini_batch_size=16 \
         actor_rollout_ref.actor.ppo_micro_batch_size=32 \
         actor_rollout_ref.rollout.log_prob_micro_batch_size=64 \
         actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=12 \
         actor_rollout_ref.actor.use_kl_loss=True trainer.n_gpus_per_node=4 \
         trainer.total_epochs=3 trainer.save_freq=5 data.val_files=null",
    )
    .unwrap();
    let (text, g, _) = convert(&input, tmp.path(), &["--strict"]);
    assert_eq!(int(&g, "nodes.data.batch_size"), 64); // prompts
    assert_eq!(int(&g, "nodes.update.mini_batch_size"), 16); // prompts
    assert_eq!(int(&g, "nodes.update.micro_batch_size"), 8); // 32 responses ÷ 4 GPUs
    assert_eq!(int(&g, "nodes.old.micro_batch_size"), 16); // 64 ÷ 4
    assert_eq!(int(&g, "nodes.ref.micro_batch_size"), 12); // already per GPU
    assert_eq!(get(&g, "run.devices").as_array().unwrap().len(), 4);
    // The shapes task's 2000 training rows: 3 epochs × ⌊2000 ÷ 64⌋ = 3 × 31 steps; a checkpoint
    // every 5 steps, every one kept (verl's null), whatever `--steps` the run is given.
    assert_eq!(int(&g, "run.steps"), 93, "{text}");
    assert_eq!(int(&g, "run.keep_checkpoints"), 0);
    assert!(g.get("nodes").unwrap().get("eval").is_none());
    validate(&tmp.path().join("graph.toml"), &[]);
}

/// verl's multi-turn rollout with its tool configuration: the zoom-in tool becomes a crop tool
/// on the rollout and eval nodes, a tool flowrl does not have is named, and the graph validates.
#[test]
fn multi_turn_tools_convert_to_a_multi_turn_rollout() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = tmp.path().join("tools.yaml");
    std::fs::write(
        &tools,
        "tools:\n  - class_name: verl.tools.image_zoom_in_tool.ImageZoomInTool\n    config: {type: native}\n    tool_schema:\n      type: function\n      function: {name: image_zoom_in_tool, description: zoom}\n  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n    config: {type: native}\n    tool_schema:\n      type: function\n      function: {name: calc_gsm8k_reward}\n",
    )
    .unwrap();
    let input = tmp.path().join("overrides.txt");
    std::fs::write(
        &input,
        format!(
            "algorithm.adv_estimator=grpo data.train_files=datasets/shapes/train.parquet \
             data.val_files=datasets/shapes/test.parquet data.image_key=images trainer.test_freq=5 \
             actor_rollout_ref.rollout.multi_turn.enable=true \
             actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3 \
             actor_rollout_ref.rollout.multi_turn.tool_config_path={}\n",
            tools.display()
        ),
    )
    .unwrap();
    let (_, table, err) = convert(&input, tmp.path(), &[]);
    assert_eq!(string(&table, "nodes.rollout.kind"), "rollout.multi_turn");
    assert_eq!(int(&table, "nodes.rollout.max_turns"), 3);
    assert_eq!(string(&table, "nodes.rollout.format"), "hermes");
    for node in ["rollout", "eval"] {
        let tool = format!("nodes.{node}.tools.image_zoom_in_tool");
        assert_eq!(string(&table, &format!("{tool}.kind")), "crop");
        assert_eq!(string(&table, &format!("{tool}.coordinates")), "norm1000");
    }
    assert!(
        err.contains(
            "tool `calc_gsm8k_reward` (verl.tools.gsm8k_tool.Gsm8kTool) has no flowrl counterpart"
        ),
        "{err}"
    );
    assert!(
        get(&table, "nodes.rollout.tools")
            .as_table()
            .unwrap()
            .get("calc_gsm8k_reward")
            .is_none()
    );
    validate(&tmp.path().join("graph.toml"), &[]);

    // Without a tool configuration there is nothing to call: single-turn, with a warning.
    std::fs::write(
        &input,
        "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.multi_turn.enable=true\n",
    )
    .unwrap();
    let (_, table, err) = convert(&input, tmp.path(), &[]);
    assert_eq!(string(&table, "nodes.rollout.kind"), "rollout");
    assert!(err.contains("without a tool_config_path"), "{err}");
}

/// verl ignores the micro-batch sizes under `use_dynamic_bsz`: the graph gets the token budget
/// alone (both forms at once are a validation error), and the ignored sizes are listed.
#[test]
fn dynamic_batches_write_the_token_budget_alone() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("overrides.txt");
    std::fs::write(
        &input,
        "algorithm.adv_estimator=grpo data.train_batch_size=4 actor_rollout_ref.rollout.n=2 \
         actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.use_dynamic_bsz=True \
         actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096 \
         actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
         actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
         actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=8192 \
         actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8\n",
    )
    .unwrap();
    let (text, t, _) = convert(&input, dir.path(), &[]);
    assert_eq!(int(&t, "nodes.update.max_tokens_per_micro_batch"), 4096);
    assert_eq!(int(&t, "nodes.old.max_tokens_per_micro_batch"), 8192);
    assert!(
        get(&t, "nodes.update").get("micro_batch_size").is_none(),
        "{text}"
    );
    assert!(
        get(&t, "nodes.old").get("micro_batch_size").is_none(),
        "{text}"
    );
    assert!(
        text.contains("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
            && text.contains("use_dynamic_bsz is on"),
        "{text}"
    );
    validate(&dir.path().join("graph.toml"), &[]);
}

/// A reward model whose directory holds a score head becomes `reward.model` on a
/// `[models.reward_model]` value model (verl's rm_scores replace the rule reward); one without
/// a head is a generative reward model: not carried over, with the advice to write a judge.
#[test]
fn a_reward_model_with_a_score_head_converts_to_reward_model() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("overrides.txt");
    let head = root().join("tests/fixtures/reward_model/model");
    std::fs::write(
        &input,
        format!(
            "algorithm.adv_estimator=grpo reward.reward_model.enable=True \
             reward.reward_model.model_path={}\n",
            head.display()
        ),
    )
    .unwrap();
    let (text, t, _) = convert(&input, dir.path(), &[]);
    assert_eq!(string(&t, "nodes.reward.kind"), "reward.model", "{text}");
    assert_eq!(string(&t, "nodes.reward.model"), "reward_model");
    assert_eq!(
        string(&t, "models.reward_model.path"),
        head.display().to_string()
    );
    assert_eq!(
        get(&t, "models.reward_model.value_head").as_bool(),
        Some(true)
    );
    validate(&dir.path().join("graph.toml"), &[]);

    std::fs::write(
        &input,
        "algorithm.adv_estimator=grpo reward_model.enable=True \
         reward_model.model.path=assets/tiny-qwen2-vl\n",
    )
    .unwrap();
    let (text, t, err) = convert(&input, dir.path(), &[]);
    assert_eq!(string(&t, "nodes.reward.kind"), "reward.geo3k", "{text}");
    assert!(
        err.contains("has no score head") && err.contains("reward.judge"),
        "{err}"
    );
}
