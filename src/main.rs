//! `flowrl`: the command-line front end. It parses arguments and delegates: the engine's commands
//! (`run`, `validate`, `graph`, `nodes`, `plot`) run with every built-in node kind registered;
//! `flowrl data` belongs to the datasets crate; `flowrl generate` (one response from a checkpoint,
//! through the rollout node's code) is [`generate`]; `flowrl export` (a checkpoint's model as a
//! Hugging Face directory, a LoRA model as a PEFT adapter plus the merged model) is [`export`];
//! `flowrl convert verl` (a verl run's configuration as a graph) is [`convert`].

use clap::{Parser, Subcommand};
use flowrl_engine::cli::{Command, execute};
use std::process::ExitCode;

mod convert;
mod export;
mod generate;

/// flowrl: reinforcement-learning post-training of vision-language models, described as graphs of
/// typed nodes in TOML.
///
/// Start with `flowrl run graphs/grpo_vlm.toml`; check a graph without running it with
/// `flowrl validate FILE`; see what node kinds exist with `flowrl nodes`.
#[derive(Debug, Parser)]
#[command(name = "flowrl", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Top,
}

#[derive(Debug, Subcommand)]
enum Top {
    #[command(flatten)]
    Engine(Command),
    /// Look at prompt files and regenerate the embedded task (`flowrl data --help`).
    #[command(subcommand)]
    Data(flowrl_datasets::cli::DataCommand),
    /// Generate one response from a checkpoint for a prompt (and images), without a graph.
    Generate(generate::GenerateArgs),
    /// Write a trained model of a run's checkpoint as a Hugging Face directory (for a LoRA
    /// model: the PEFT adapter and the merged model).
    Export(export::ExportArgs),
    /// Convert another framework's run configuration into a graph (`flowrl convert verl FILE`).
    #[command(subcommand)]
    Convert(convert::ConvertCommand),
}

// mimalloc keeping freed memory, so that a step does not fault freed pages in again: see
// `flowrl_nodes::runtime::allocator`.
flowrl_nodes::global_allocator!();

fn main() -> ExitCode {
    flowrl_nodes::runtime::allocator::keep_freed_memory();
    let cli = Cli::parse();
    match &cli.command {
        Top::Engine(cmd) => execute(cmd, &flowrl_nodes::builtin_registry()),
        Top::Data(cmd) => match flowrl_datasets::cli::run(cmd) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Top::Generate(args) => generate::run(args),
        Top::Export(args) => export::run(args),
        Top::Convert(cmd) => convert::run(cmd),
    }
}
