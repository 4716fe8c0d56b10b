//! `flowrl convert verl INPUT [-o graph.toml] [--strict]`: a verl run's configuration as a
//! flowrl graph.
//!
//! INPUT is a composed verl configuration (Hydra's `.hydra/config.yaml`), Hydra's
//! `.hydra/overrides.yaml`, or a launch script or text of the `key=value` overrides of a
//! `python3 -m verl.trainer.main_ppo` command line. The stages, one module each:
//!
//! 1. [`input`]: the input → one flat map of verl keys over verl's defaults, interpolations
//!    resolved, with the keys the input chose; a script's words as the shell would expand them,
//!    or a refusal where that cannot be known ([`shell`]);
//! 2. [`keys`]: what each key is to flowrl (mapped, of no meaning here, faithful at one value
//!    only, or unknown);
//! 3. [`mapping`]: the graph's sections and a note for every key that does not carry over;
//! 4. [`writer`]: the TOML text, with a header naming the input, flowrl's version and every
//!    key left out and why.
//!
//! Nothing is dropped silently: a key of no meaning is listed in the header, a value flowrl
//! cannot follow and an unknown key are warnings (unknown keys are errors with `--strict`,
//! exit code 78 like a configuration error). It does not check the graph: `flowrl validate`
//! does (paths, devices, batch divisibility).

mod input;
mod keys;
mod mapping;
mod shell;
mod writer;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use input::VerlConfig;
use mapping::NoteKind;
use shell::ShellEnv;

/// `--env NAME=VALUE`.
fn parse_env_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("`{s}` is not NAME=VALUE")),
    }
}

/// `flowrl convert SOURCE ...`.
#[derive(Debug, Subcommand)]
pub enum ConvertCommand {
    /// A verl configuration (Hydra config.yaml, overrides.yaml, or command-line overrides).
    Verl(VerlArgs),
}

/// Arguments of `flowrl convert verl`.
#[derive(Debug, Args)]
pub struct VerlArgs {
    /// Hydra's config.yaml or overrides.yaml of a verl run, its launch script, or a text file of
    /// `key=value` overrides (one per line or space-separated).
    pub input: PathBuf,
    /// A shell variable the script or overrides use (`$NAME`, `${NAME}`), as NAME=VALUE;
    /// repeatable. Wins over the script's own assignments and the environment.
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_env_pair)]
    pub env: Vec<(String, String)>,
    /// The graph file to write (default: standard output).
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// Fail (exit code 78) on a key the converter does not know, instead of warning.
    #[arg(long)]
    pub strict: bool,
    /// Each key not carried over with its value and why, each unknown key with its value
    /// (default: counted and named by section).
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// EX_CONFIG, as for a graph's configuration errors.
const EXIT_CONFIG: u8 = 78;

pub fn run(cmd: &ConvertCommand) -> ExitCode {
    match cmd {
        ConvertCommand::Verl(args) => verl(args),
    }
}

fn verl(args: &VerlArgs) -> ExitCode {
    let env = ShellEnv::from_process(args.env.iter().cloned().collect::<BTreeMap<_, _>>());
    let cfg = match VerlConfig::read(&args.input, &env) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("error: {}: {e:#}", args.input.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    for note in &cfg.notes {
        eprintln!("note: {note}");
    }
    let registry = flowrl_nodes::builtin_registry();
    let conv = mapping::convert(&cfg, &registry);
    let level = if args.strict { "error" } else { "warning" };
    let mut no_effect = 0;
    let (mut not_carried, mut unknown) = (Vec::new(), Vec::new());
    for note in &conv.notes {
        match &note.kind {
            NoteKind::NoEffect(_) => no_effect += 1,
            NoteKind::NotCarried(why) => not_carried.push((note, why.as_str())),
            // A word that is no override at all is named on its own line.
            NoteKind::Unknown if note.value.is_empty() => eprintln!(
                "{level}: `{}` is not a verl override (key=value){}",
                note.key,
                hint(did_you_mean(&note.key, &cfg))
            ),
            NoteKind::Unknown => unknown.push(note),
        }
    }
    if args.verbose {
        for (note, why) in &not_carried {
            eprintln!(
                "warning: verl key `{}` = {} is not carried over: {why}",
                note.key, note.value
            );
        }
        for note in &unknown {
            eprintln!(
                "{level}: unknown verl key `{}` = {}: not converted{}",
                note.key,
                note.value,
                hint(did_you_mean(&note.key, &cfg))
            );
        }
    } else {
        let keys: Vec<(&str, String)> = not_carried
            .iter()
            .map(|(n, _)| (n.key.as_str(), String::new()))
            .collect();
        if !keys.is_empty() {
            eprintln!(
                "warning: {} verl key(s) not carried over (why: --verbose, or the graph's \
                 header):\n{}",
                keys.len(),
                by_section(&keys)
            );
        }
        let keys: Vec<(&str, String)> = unknown
            .iter()
            .map(|n| (n.key.as_str(), hint(did_you_mean(&n.key, &cfg))))
            .collect();
        if !keys.is_empty() {
            eprintln!(
                "{level}: {} unknown verl key(s), not converted (values: --verbose):\n{}",
                keys.len(),
                by_section(&keys)
            );
        }
    }
    let unknown = unknown.len();
    let not_carried = not_carried.len();
    if args.strict && unknown > 0 {
        eprintln!("error: {unknown} unknown verl key(s) with --strict: no graph written");
        return ExitCode::from(EXIT_CONFIG);
    }
    let text = writer::render(&conv, &cfg, &args.input);
    match &args.out {
        Some(path) => {
            if let Err(e) = std::fs::write(path, &text) {
                eprintln!("error: cannot write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            eprintln!(
                "wrote {}: {} verl keys set by the input mapped, {no_effect} of no meaning here, {not_carried} not carried over, {unknown} unknown",
                path.display(),
                conv.mapped
            );
        }
        None => print!("{text}"),
    }
    ExitCode::SUCCESS
}

/// ` (did you mean `k`?)`, or nothing.
fn hint(known: Option<String>) -> String {
    known
        .map(|k| format!(" (did you mean `{k}`?)"))
        .unwrap_or_default()
}

/// The section of a verl key: `actor_rollout_ref.<role>` for the actor/rollout/ref tree, its
/// first segment otherwise.
fn section(key: &str) -> &str {
    let depth = if key.starts_with("actor_rollout_ref.") {
        2
    } else {
        1
    };
    match key.match_indices('.').nth(depth - 1) {
        Some((i, _)) => &key[..i],
        None => key,
    }
}

/// `  <section>: <count> (<key within it><suffix>, ...)`, a line per section, both sorted.
fn by_section(keys: &[(&str, String)]) -> String {
    let mut sections: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (key, suffix) in keys {
        let s = section(key);
        let rest = key.strip_prefix(s).and_then(|r| r.strip_prefix('.'));
        sections
            .entry(s)
            .or_default()
            .push(format!("{}{suffix}", rest.unwrap_or(key)));
    }
    sections
        .iter_mut()
        .map(|(s, keys)| {
            keys.sort();
            format!("  {s}: {} ({})", keys.len(), keys.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The known key closest to an unknown one (edit distance at most 3).
fn did_you_mean(key: &str, cfg: &VerlConfig) -> Option<String> {
    cfg.defaults
        .keys()
        .map(|k| (edit_distance(key, k), k))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k.clone())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of verl's default configuration has a rule, and docs/from-verl.md has a row
    /// for each key or for the pattern that covers it.
    #[test]
    fn every_default_key_is_classified_and_documented() {
        let cfg = VerlConfig::parse("").unwrap();
        let docs = include_str!("../../docs/from-verl.md");
        let mut missing = Vec::new();
        let mut undocumented = Vec::new();
        for key in cfg.defaults.keys() {
            match keys::classify(key) {
                None => missing.push(key.clone()),
                Some(rule) => {
                    if !docs.contains(&format!("`{key}`"))
                        && !docs.contains(&format!("`{}`", rule.pattern))
                    {
                        undocumented.push(format!("{key} ({})", rule.pattern));
                    }
                }
            }
        }
        assert!(missing.is_empty(), "verl keys without a rule: {missing:#?}");
        assert!(
            undocumented.is_empty(),
            "verl keys missing from docs/from-verl.md: {undocumented:#?}"
        );
    }

    #[test]
    fn did_you_mean_finds_a_typo() {
        let cfg = VerlConfig::parse("").unwrap();
        assert_eq!(
            did_you_mean("actor_rollout_ref.rollout.temprature", &cfg).as_deref(),
            Some("actor_rollout_ref.rollout.temperature")
        );
    }
}
