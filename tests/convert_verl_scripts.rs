//! `flowrl convert verl` on launch scripts: a script converts as the shell would run it, what
//! it leaves unknown is refused rather than guessed, and the commands of docs/from-verl.md's
//! walk-through run as written.

use std::process::Command;

mod common;
#[path = "common/verl.rs"]
mod verl;
use common::{BIN, root};
use verl::{int, stderr, string};

/// A launch script in the style of verl's geo3k examples converts as the shell would run it:
/// `${VAR:-default}` takes its default (noted), `--env` wins over the script, `$HOME` and `~/`
/// expand, `$@` is dropped.
#[test]
fn a_launch_script_converts_as_the_shell_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("run_geo3k.sh");
    std::fs::write(
        &script,
        r#"#!/usr/bin/env bash
set -x
ENGINE=${1:-vllm}
MODEL=${MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
BS=${BS:-512}
export N_RESP=5
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/geo3k/train.parquet \
    data.val_files=~/data/geo3k/test.parquet \
    data.train_batch_size=$BS \
    data.max_response_length=2048 \
    actor_rollout_ref.model.path=$MODEL \
    actor_rollout_ref.rollout.name=$ENGINE \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.rollout.n=$N_RESP \
    trainer.test_freq=5 $@
"#,
    )
    .unwrap();
    let graph = dir.path().join("graph.toml");
    let out = Command::new(BIN)
        .current_dir(root())
        .env("HOME", "/home/u")
        .env_remove("MODEL")
        .args([
            "convert",
            "verl",
            script.to_str().unwrap(),
            "--env",
            "BS=64",
            "-o",
        ])
        .arg(&graph)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let t: toml::Table = std::fs::read_to_string(&graph).unwrap().parse().unwrap();
    assert_eq!(int(&t, "nodes.data.batch_size"), 64);
    assert_eq!(int(&t, "nodes.rollout.n"), 5);
    assert_eq!(int(&t, "nodes.rollout.max_new_tokens"), 2048);
    assert_eq!(
        string(&t, "nodes.data.path"),
        "/home/u/data/geo3k/train.parquet"
    );
    assert_eq!(
        string(&t, "nodes.data.val_path"),
        "/home/u/data/geo3k/test.parquet"
    );
    assert_eq!(
        string(&t, "models.policy.path"),
        "Qwen/Qwen2.5-VL-7B-Instruct"
    );
    assert!(
        err.contains("note: `${1:-vllm}`: the script's argument 1 is not given")
            && err.contains("`MODEL` is not set, so its default `Qwen/Qwen2.5-VL-7B-Instruct`"),
        "{err}"
    );
}

/// Never a guess: unexpanded variables, a command under a `case` on the device, bash arrays
/// and command substitutions are refused (exit 78, no graph), each named with its line, and
/// the message says what to convert instead — also without `--strict`.
#[test]
fn what_a_script_leaves_unknown_is_refused_not_guessed() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |name: &str, text: &str, extra: &[&str]| {
        let input = dir.path().join(name);
        std::fs::write(&input, text).unwrap();
        let graph = dir.path().join(format!("{name}.toml"));
        let out = Command::new(BIN)
            .current_dir(root())
            .env_remove("BS")
            .env_remove("KL")
            .env_remove("bar")
            .env_remove("DEVICE")
            .args(["convert", "verl", input.to_str().unwrap(), "-o"])
            .arg(&graph)
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
        assert!(!graph.exists(), "{name}: a graph was written");
        stderr(&out)
    };
    let overrides = "data.train_batch_size=$BS actor_rollout_ref.actor.kl_loss_coef=$KL \\\n                     actor_rollout_ref.actor.optim.lr=${bar}\n";
    for extra in [&[][..], &["--strict"][..]] {
        let e = refused("overrides.txt", overrides, extra);
        assert!(
            e.contains("`data.train_batch_size=$BS`: `$BS` is not set")
                && e.contains("`actor_rollout_ref.actor.kl_loss_coef=$KL`: `$KL` is not set")
                && e.contains("line 2: `actor_rollout_ref.actor.optim.lr=${bar}`")
                && e.contains("--env NAME=VALUE"),
            "{e}"
        );
    }
    let script = "DEVICE=${DEVICE:-cuda}\n\
                  case $DEVICE in\n  cuda) MICRO=8 ;;\n  npu) MICRO=2 ;;\nesac\n\
                  LOGGERS=(console wandb)\n\
                  python3 -m verl.trainer.main_ppo \\\n  algorithm.adv_estimator=grpo \\\n  \
                  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO \\\n  \
                  trainer.logger=\"${LOGGERS[@]}\" \\\n  trainer.experiment_name=$(date +%s)\n";
    let e = refused("run_device.sh", script, &[]);
    assert!(
        e.contains("line 9: `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO`: `$MICRO` is assigned under a branch")
            && e.contains("reads a bash array")
            && e.contains("`trainer.experiment_name=$(date +%s)`: a command substitution")
            && e.contains(".hydra/config.yaml"),
        "{e}"
    );
    let e = refused(
        "in_a_branch.sh",
        "if [ -n \"$X\" ]; then\n  python3 -m verl.trainer.main_ppo a=1\nfi\n",
        &[],
    );
    assert!(e.contains("line 2: the verl command runs inside"), "{e}");
}

/// The commands of docs/from-verl.md's walk-through that need only this repository (the
/// conversion of the recipe's overrides and the 2-step run on the tiny assets) run as written,
/// in a directory that holds the repository's `tests`, `assets` and `datasets`, and the run's
/// answers are not cut off.
#[test]
fn the_walk_through_commands_run_as_written() {
    let docs = std::fs::read_to_string(root().join("docs/from-verl.md")).unwrap();
    let walk = &docs[docs.find("## Walk-through").unwrap()..];
    let walk = &walk[..walk.find("\n## ").unwrap()];
    // Indented command lines, `\` continuations joined.
    let mut commands: Vec<String> = Vec::new();
    let mut open = false;
    for line in walk.lines() {
        let Some(text) = line.strip_prefix("    ") else {
            open = false;
            continue;
        };
        let text = text.trim();
        if open {
            commands.last_mut().unwrap().push(' ');
            commands
                .last_mut()
                .unwrap()
                .push_str(text.trim_end_matches('\\'));
        } else if text.starts_with("flowrl ") {
            commands.push(text.trim_end_matches('\\').to_string());
        } else {
            continue;
        }
        open = text.ends_with('\\');
    }
    let runnable: Vec<&String> = commands
        .iter()
        .filter(|c| c.starts_with("flowrl convert verl tests/") || c.contains("assets/tiny"))
        .collect();
    assert_eq!(runnable.len(), 2, "{commands:#?}");
    let dir = tempfile::tempdir().unwrap();
    for name in ["tests", "assets", "datasets"] {
        std::os::unix::fs::symlink(root().join(name), dir.path().join(name)).unwrap();
    }
    for command in runnable {
        // Words as the shell splits them (the docs quote with '...' only).
        let mut words: Vec<String> = Vec::new();
        let mut quoted = false;
        let mut word = String::new();
        for c in command.chars() {
            match c {
                '\'' => quoted = !quoted,
                ' ' if !quoted => {
                    if !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                }
                c => word.push(c),
            }
        }
        words.push(word);
        let out = Command::new(BIN)
            .current_dir(dir.path())
            .args(&words[1..])
            .output()
            .unwrap();
        assert!(out.status.success(), "`{command}`:\n{}", stderr(&out));
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            !printed.contains("was cut at max_new_tokens"),
            "`{command}`:\n{printed}"
        );
    }
}
