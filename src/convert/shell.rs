//! A verl launch script, or a text of overrides, read as the shell would hand the overrides to
//! `python3 -m verl.trainer.main_ppo` — or refused where that cannot be known for sure.
//!
//! The text is split into commands as bash splits it (quotes, `\` continuations, comments, `;`
//! and newlines). When one command runs `python… -m MODULE`, its words after the module are the
//! overrides; otherwise every word of the text is. The words are expanded as bash expands them:
//! `$VAR` and `${VAR}` (unquoted or in double quotes; not in single quotes), `${VAR:-default}` and
//! `${VAR-default}` (a note says the default was taken), a leading `~/` of a word or of an
//! override's value, `$@` and `$*` to nothing (the script's own arguments). A variable's value
//! comes from `--env NAME=VALUE` first, then from the script's simple assignments above the
//! command (`NAME=value`, `export NAME=value`, evaluated in order), then from the environment.
//!
//! Never a guess: a variable that none of these sets, one assigned inside an `if`, `case`, loop
//! or function (its value depends on a branch), a bash array, a command substitution, or a
//! command that itself runs inside such a block is an error naming the line and the word, with
//! what to pass instead.

use std::collections::BTreeMap;

use anyhow::{Result, bail};

/// Where variables come from, besides the script's own assignments.
#[derive(Debug, Clone, Default)]
pub struct ShellEnv {
    /// `--env NAME=VALUE`: wins over the script and the environment.
    pub given: BTreeMap<String, String>,
    /// The process environment.
    pub process: BTreeMap<String, String>,
}

impl ShellEnv {
    /// The process environment and the `--env` pairs.
    pub fn from_process(given: BTreeMap<String, String>) -> Self {
        Self {
            given,
            process: std::env::vars().collect(),
        }
    }
}

/// The override words and the notes the expansion made.
#[derive(Debug, Default)]
pub struct Words {
    pub words: Vec<String>,
    pub notes: Vec<String>,
}

/// How a piece of a word was quoted.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Quote {
    None,
    Single,
    Double,
}

/// One word: its pieces (expanded by their quoting) and its text as written.
#[derive(Debug, Clone, Default)]
struct Word {
    parts: Vec<(Quote, String)>,
    raw: String,
    /// The line it starts on.
    line: usize,
    /// `NAME=(...)`: a bash array.
    array: bool,
    /// `$(...)` or backquotes.
    substitution: bool,
}

/// One simple command: its words and the line it starts on.
#[derive(Debug)]
struct Command {
    line: usize,
    words: Vec<Word>,
}

/// The override words of `text` (see the module doc).
pub fn override_words(text: &str, env: &ShellEnv) -> Result<Words> {
    let commands = split_commands(text)?;
    let mut state = Scan {
        env,
        vars: BTreeMap::new(),
        depth: 0,
        errors: Vec::new(),
        notes: Vec::new(),
    };
    let mut found: Vec<(usize, usize, usize)> = Vec::new(); // (command, first override word, depth)
    for (i, c) in commands.iter().enumerate() {
        state.track_blocks(c);
        if let Some(first) = module_words(c) {
            found.push((i, first, state.depth));
            continue;
        }
        state.assignments(c);
    }
    let words: Vec<&Word> = match found.as_slice() {
        [] => commands.iter().flat_map(|c| &c.words).collect(),
        [(i, first, depth)] => {
            let c = &commands[*i];
            if *depth > 0 {
                bail!(
                    "line {}: the verl command runs inside an `if`, `case`, loop or function, \
                     which flowrl cannot follow; {}",
                    c.line,
                    INSTEAD
                );
            }
            c.words[*first..].iter().collect()
        }
        many => {
            let lines: Vec<String> = many
                .iter()
                .map(|(i, _, _)| commands[*i].line.to_string())
                .collect();
            bail!(
                "the script runs {} python commands (lines {}): which one is the run cannot be \
                 known; {}",
                many.len(),
                lines.join(", "),
                INSTEAD
            );
        }
    };
    let mut out = Vec::new();
    for w in words {
        if let Some(text) = state.expand_word(w, w.line, true) {
            // `$@` alone expands to no word at all.
            if !(text.is_empty() && w.parts.iter().all(|(q, _)| *q == Quote::None)) {
                out.push(text);
            }
        }
    }
    if !state.errors.is_empty() {
        bail!(
            "the overrides cannot be read without guessing:\n  {}\n{}",
            state.errors.join("\n  "),
            "pass the values with `--env NAME=VALUE` (or export them), or convert the run's \
             resolved `.hydra/config.yaml` (or its expanded overrides) instead"
        );
    }
    Ok(Words {
        words: out,
        notes: state.notes,
    })
}

/// What to give instead of a script the converter cannot follow.
const INSTEAD: &str = "convert the run's resolved `.hydra/config.yaml` (in its output directory) \
                       or the command's overrides as the shell expands them (`set -x` prints them)";

/// A script variable's value as far as the converter can know it.
#[derive(Debug, Clone)]
enum Var {
    Known(String),
    /// Assigned under a branch or loop (line), or in a function.
    Conditional(usize),
    /// A bash array (line).
    Array(usize),
    /// Its own value could not be known (why).
    Unknown(String),
}

struct Scan<'a> {
    env: &'a ShellEnv,
    vars: BTreeMap<String, Var>,
    depth: usize,
    errors: Vec<String>,
    notes: Vec<String>,
}

impl Scan<'_> {
    /// Blocks opened and closed by the command's leading keywords.
    fn track_blocks(&mut self, c: &Command) {
        let Some(first) = c.words.first().map(|w| w.raw.as_str()) else {
            return;
        };
        match first {
            "if" | "case" | "for" | "while" | "until" | "select" | "{" | "function" => {
                self.depth += 1
            }
            "fi" | "esac" | "done" | "}" => self.depth = self.depth.saturating_sub(1),
            w if w.strip_suffix("()").is_some_and(is_name)
                || c.words.get(1).is_some_and(|w| w.raw == "()") =>
            {
                self.depth += 1
            }
            _ => {}
        }
    }

    /// The variables a command assigns.
    fn assignments(&mut self, c: &Command) {
        let mut words = c.words.iter().peekable();
        // Keywords and case patterns before an assignment (`then X=1`, `cuda) X=1`).
        while let Some(w) = words.peek() {
            let raw = w.raw.as_str();
            if matches!(
                raw,
                "then" | "else" | "do" | "!" | "export" | "declare" | "readonly" | "local"
            ) || raw.starts_with('-') && raw.len() > 1 && !raw.contains('=')
                || raw.ends_with(')') && !raw.contains('=')
            {
                words.next();
            } else {
                break;
            }
        }
        for w in words {
            let Some((name, _)) = w.raw.split_once('=') else {
                break;
            };
            if !is_name(name) {
                break;
            }
            let var = if w.array {
                Var::Array(c.line)
            } else if self.depth > 0 {
                Var::Conditional(c.line)
            } else {
                let mut value = w.clone();
                strip_name(&mut value, name.len() + 1);
                let errors = self.errors.len();
                match self.expand_word(&value, c.line, false) {
                    Some(v) if self.errors.len() == errors => Var::Known(v),
                    _ => Var::Unknown(self.errors.split_off(errors).join("; ")),
                }
            };
            self.vars.insert(name.to_string(), var);
        }
    }

    /// The word expanded; `None` (with an error recorded) when it cannot be. `override_word`:
    /// a `~/` after its first `=` is the home directory too.
    fn expand_word(&mut self, w: &Word, line: usize, override_word: bool) -> Option<String> {
        let at = |what: String| format!("line {line}: `{}`: {what}", w.raw);
        if w.array {
            self.errors
                .push(at("a bash array cannot be an override".into()));
            return None;
        }
        if w.substitution {
            self.errors.push(at(
                "a command substitution (`$(...)` or backquotes) cannot be run".into(),
            ));
            return None;
        }
        let mut out = String::new();
        let mut ok = true;
        for (k, (quote, text)) in w.parts.iter().enumerate() {
            match quote {
                Quote::Single => out.push_str(text),
                Quote::None | Quote::Double => {
                    let mut piece = text.clone();
                    if *quote == Quote::None && k == 0 {
                        piece = self.tilde(&piece, override_word);
                    }
                    match self.expand_text(&piece) {
                        Ok(s) => out.push_str(&s),
                        Err(e) => {
                            self.errors.push(at(e));
                            ok = false;
                        }
                    }
                }
            }
        }
        ok.then_some(out)
    }

    /// A leading `~/` (or `~` alone), and for an override one after its first `=`.
    fn tilde(&self, s: &str, override_word: bool) -> String {
        let Some(home) = self.lookup_env("HOME") else {
            return s.to_string();
        };
        let expand = |v: &str| match v.strip_prefix('~') {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{home}{rest}"),
            _ => v.to_string(),
        };
        if s.starts_with('~') {
            return expand(s);
        }
        match s.split_once('=') {
            Some((key, value)) if override_word => format!("{key}={}", expand(value)),
            _ => s.to_string(),
        }
    }

    /// `$...` expansions of unquoted or double-quoted text.
    fn expand_text(&mut self, s: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut rest = s;
        while let Some(i) = rest.find('$') {
            out.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            let (expr, len) = if let Some(inner) = after.strip_prefix('{') {
                let end =
                    matching_brace(inner).ok_or_else(|| "an unterminated `${`".to_string())?;
                (&inner[..end], end + 2)
            } else {
                match after.chars().next() {
                    Some(c) if c.is_ascii_digit() || "@*#?!$-".contains(c) => (&after[..1], 1),
                    Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                        let n = after
                            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                            .unwrap_or(after.len());
                        (&after[..n], n)
                    }
                    // A lone `$` is itself.
                    _ => {
                        out.push('$');
                        rest = after;
                        continue;
                    }
                }
            };
            out.push_str(&self.parameter(expr)?);
            rest = &after[len..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// One parameter expansion: `NAME`, `NAME:-word`, `NAME-word`, `@`, `*`, a positional one.
    fn parameter(&mut self, expr: &str) -> Result<String, String> {
        if expr == "@" || expr == "*" {
            return Ok(String::new());
        }
        if matches!(expr, "#" | "?" | "!" | "$" | "-") || expr.starts_with('#') {
            return Err(format!(
                "`${expr}` is the shell's own and cannot be known here"
            ));
        }
        let name_len = expr
            .char_indices()
            .take_while(|&(_, c)| c.is_ascii_alphanumeric() || c == '_')
            .last()
            .map_or(0, |(k, c)| k + c.len_utf8());
        let (name, op) = expr.split_at(name_len);
        if name.is_empty() {
            return Err(format!("`${{{expr}}}` is not an expansion flowrl reads"));
        }
        let (default, colon) = if let Some(d) = op.strip_prefix(":-") {
            (Some(d), true)
        } else if let Some(d) = op.strip_prefix(":=") {
            (Some(d), true)
        } else if let Some(d) = op.strip_prefix('-') {
            (Some(d), false)
        } else if op.is_empty() {
            (None, false)
        } else if op.starts_with('[') {
            return Err(format!("`${{{expr}}}` reads a bash array"));
        } else {
            return Err(format!(
                "`${{{expr}}}` ({op}) is not an expansion flowrl reads: give the value"
            ));
        };
        let value = match self.value(name)? {
            Some(v) if !(colon && v.is_empty()) => return Ok(v),
            other => other,
        };
        match default {
            Some(d) => {
                let d = self.expand_text(d)?;
                let what = match (name.parse::<u32>(), value.is_some()) {
                    (Ok(k), _) => format!("the script's argument {k} is not given"),
                    (Err(_), true) => format!("`{name}` is empty"),
                    (Err(_), false) => format!("`{name}` is not set"),
                };
                self.notes.push(format!(
                    "`${{{expr}}}`: {what}, so its default `{d}` is taken"
                ));
                Ok(d)
            }
            None => Err(match name.parse::<u32>() {
                Ok(k) => format!(
                    "`${name}` is the script's argument {k}, which is not known here: pass \
                     `--env {name}=VALUE`"
                ),
                Err(_) => {
                    format!("`${name}` is not set: pass `--env {name}=VALUE` or export it")
                }
            }),
        }
    }

    /// A variable's value: `--env`, the script, the environment; `None` when unset.
    fn value(&self, name: &str) -> Result<Option<String>, String> {
        if let Some(v) = self.env.given.get(name) {
            return Ok(Some(v.clone()));
        }
        match self.vars.get(name) {
            Some(Var::Known(v)) => Ok(Some(v.clone())),
            Some(Var::Conditional(line)) => Err(format!(
                "`${name}` is assigned under a branch, loop or function (line {line}), so its \
                 value depends on how the script runs: pass `--env {name}=VALUE`"
            )),
            Some(Var::Array(line)) => Err(format!(
                "`${name}` is a bash array (line {line}), which flowrl does not expand"
            )),
            Some(Var::Unknown(why)) => Err(format!("`${name}` cannot be known: {why}")),
            None => Ok(self.env.process.get(name).cloned()),
        }
    }

    fn lookup_env(&self, name: &str) -> Option<String> {
        self.value(name).ok().flatten()
    }
}

/// The text up to the `close` that balances an `open` just read (newlines counted into
/// `line`); `None` when the text ends first.
fn balanced(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    open: char,
    close: char,
    line: &mut usize,
) -> Option<String> {
    let mut depth = 0;
    let mut text = String::new();
    loop {
        let ch = chars.next()?;
        if ch == close && depth == 0 {
            return Some(text);
        }
        if ch == open {
            depth += 1;
        } else if ch == close {
            depth -= 1;
        } else if ch == '\n' {
            *line += 1;
        }
        text.push(ch);
    }
}

/// The index of the `}` that closes a `${` whose text starts `s`.
fn matching_brace(s: &str) -> Option<usize> {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return Some(i),
            '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The word without its first `n` bytes of text (an assignment's `NAME=`).
fn strip_name(w: &mut Word, mut n: usize) {
    while n > 0 && !w.parts.is_empty() {
        let len = w.parts[0].1.len();
        if len <= n {
            n -= len;
            w.parts.remove(0);
        } else {
            w.parts[0].1.drain(..n);
            n = 0;
        }
    }
    w.raw = w
        .raw
        .split_once('=')
        .map_or(String::new(), |(_, v)| v.to_string());
}

/// The index of the first override word when `c` runs `python… -m MODULE` (leading `NAME=value`
/// environment words allowed).
fn module_words(c: &Command) -> Option<usize> {
    let raw: Vec<&str> = c.words.iter().map(|w| w.raw.as_str()).collect();
    let start = raw
        .iter()
        .position(|w| !(w.contains('=') && is_name(w.split('=').next().unwrap_or(""))))?;
    let program = raw[start].rsplit('/').next().unwrap_or("");
    if !program.starts_with("python") {
        return None;
    }
    let m = raw[start..].iter().position(|w| *w == "-m")? + start;
    (m + 1 < raw.len()).then_some(m + 2)
}

/// The text's simple commands (see the module doc).
fn split_commands(text: &str) -> Result<Vec<Command>> {
    let mut commands = Vec::new();
    let mut words: Vec<Word> = Vec::new();
    let mut cur = Word::default();
    let mut in_word = false;
    let mut line = 1;
    let mut start = 1;
    let mut chars = text.chars().peekable();
    fn push_part(w: &mut Word, q: Quote, c: char) {
        match w.parts.last_mut() {
            Some((last, s)) if *last == q => s.push(c),
            _ => w.parts.push((q, c.to_string())),
        }
    }
    let end_word = |words: &mut Vec<Word>, cur: &mut Word, in_word: &mut bool| {
        if *in_word {
            words.push(std::mem::take(cur));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        if !in_word {
            cur.line = line;
        }
        match c {
            '\'' => {
                in_word = true;
                cur.raw.push(c);
                cur.parts.push((Quote::Single, String::new()));
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(ch) => {
                            if ch == '\n' {
                                line += 1;
                            }
                            cur.raw.push(ch);
                            push_part(&mut cur, Quote::Single, ch);
                        }
                        None => bail!("line {line}: an unterminated ' quote"),
                    }
                }
                cur.raw.push('\'');
            }
            '"' => {
                in_word = true;
                cur.raw.push(c);
                cur.parts.push((Quote::Double, String::new()));
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some('\n') => line += 1,
                            Some(ch @ ('"' | '\\' | '$' | '`')) => {
                                cur.raw.push('\\');
                                cur.raw.push(ch);
                                push_part(&mut cur, Quote::Single, ch);
                            }
                            Some(ch) => {
                                cur.raw.push('\\');
                                cur.raw.push(ch);
                                push_part(&mut cur, Quote::Double, '\\');
                                push_part(&mut cur, Quote::Double, ch);
                            }
                            None => bail!("line {line}: an unterminated \" quote"),
                        },
                        Some('`') => cur.substitution = true,
                        Some(ch) => {
                            if ch == '\n' {
                                line += 1;
                            }
                            if ch == '(' && cur.raw.ends_with('$') {
                                cur.substitution = true;
                            }
                            cur.raw.push(ch);
                            push_part(&mut cur, Quote::Double, ch);
                        }
                        None => bail!("line {line}: an unterminated \" quote"),
                    }
                }
                cur.raw.push('"');
            }
            '\\' => match chars.next() {
                Some('\n') => line += 1,
                None => {}
                Some(ch) => {
                    in_word = true;
                    cur.raw.push(ch);
                    push_part(&mut cur, Quote::Single, ch);
                }
            },
            '#' if !in_word => {
                // A comment: to the end of the line, whose newline ends the command below.
                while chars.next_if(|&ch| ch != '\n').is_some() {}
            }
            '`' => {
                in_word = true;
                cur.substitution = true;
                cur.raw.push(c);
            }
            '$' if chars.peek() == Some(&'{') => {
                // `${...}` is one piece, whatever it holds.
                in_word = true;
                chars.next();
                let Some(inner) = balanced(&mut chars, '{', '}', &mut line) else {
                    bail!("line {line}: an unterminated `${{`");
                };
                let text = format!("${{{inner}}}");
                cur.raw.push_str(&text);
                for ch in text.chars() {
                    push_part(&mut cur, Quote::None, ch);
                }
            }
            '(' if in_word
                && (cur.raw.ends_with('$') || cur.raw.ends_with('=') && cur.parts.len() <= 1) =>
            {
                // `$(...)` (a command substitution) or `NAME=(...)` (an array), kept whole.
                let what = if cur.raw.ends_with('$') {
                    "`$(`"
                } else {
                    "array `(`"
                };
                let Some(inner) = balanced(&mut chars, '(', ')', &mut line) else {
                    bail!("line {line}: an unterminated {what}");
                };
                if cur.raw.ends_with('$') {
                    cur.substitution = true;
                } else {
                    cur.array = true;
                }
                cur.raw.push_str(&format!("({inner})"));
            }
            '\n' | ';' => {
                end_word(&mut words, &mut cur, &mut in_word);
                if c == '\n' {
                    line += 1;
                }
                if !words.is_empty() {
                    commands.push(Command {
                        line: start,
                        words: std::mem::take(&mut words),
                    });
                }
                start = line;
            }
            c if c.is_whitespace() => end_word(&mut words, &mut cur, &mut in_word),
            c => {
                in_word = true;
                cur.raw.push(c);
                push_part(&mut cur, Quote::None, c);
            }
        }
    }
    end_word(&mut words, &mut cur, &mut in_word);
    if !words.is_empty() {
        commands.push(Command { line: start, words });
    }
    Ok(commands)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(given: &[(&str, &str)], process: &[(&str, &str)]) -> ShellEnv {
        let map = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        ShellEnv {
            given: map(given),
            process: map(process),
        }
    }

    fn words(text: &str, env: &ShellEnv) -> Vec<String> {
        override_words(text, env).unwrap().words
    }

    #[test]
    fn a_plain_list_of_overrides_is_its_words() {
        let e = env(&[], &[]);
        assert_eq!(
            words("a=1 b='x y'\n# comment\nc=\"[1, 2]\" \\\n d=4\n", &e),
            ["a=1", "b=x y", "c=[1, 2]", "d=4"]
        );
    }

    #[test]
    fn variables_come_from_env_flags_the_script_and_the_environment() {
        let script = "set -x\nBS=512\nexport LR=1e-6\nN=${N:-5}\n\
                      python3 -m verl.trainer.main_ppo \\\n  data.train_batch_size=$BS \\\n  \
                      actor_rollout_ref.actor.optim.lr=${LR} \\\n  actor_rollout_ref.rollout.n=$N \\\n  \
                      data.train_files=$HOME/data/train.parquet data.val_files=~/data/test.parquet \\\n  \
                      trainer.project_name='$BS' $@\n";
        let e = env(&[], &[("HOME", "/home/u")]);
        let out = override_words(script, &e).unwrap();
        assert_eq!(
            out.words,
            [
                "data.train_batch_size=512",
                "actor_rollout_ref.actor.optim.lr=1e-6",
                "actor_rollout_ref.rollout.n=5",
                "data.train_files=/home/u/data/train.parquet",
                "data.val_files=/home/u/data/test.parquet",
                "trainer.project_name=$BS",
            ]
        );
        assert_eq!(out.notes.len(), 1, "{:?}", out.notes);
        assert!(out.notes[0].contains("`${N:-5}`: `N` is not set, so its default `5`"));
        // `--env` wins over the script; the environment fills what the script leaves unset.
        let e = env(&[("BS", "64")], &[("HOME", "/h"), ("N", "8")]);
        let w = words(script, &e);
        assert_eq!(w[0], "data.train_batch_size=64");
        assert_eq!(w[2], "actor_rollout_ref.rollout.n=8");
    }

    #[test]
    fn what_cannot_be_known_is_refused_with_the_line_and_the_word() {
        let e = env(&[], &[]);
        let err = |text: &str| override_words(text, &e).unwrap_err().to_string();
        let msg = err("data.train_batch_size=$BS actor_rollout_ref.actor.kl_loss_coef=${KL}\n");
        assert!(
            msg.contains("line 1: `data.train_batch_size=$BS`: `$BS` is not set")
                && msg.contains("kl_loss_coef=${KL}`: `$KL` is not set")
                && msg.contains("--env BS=VALUE")
                && msg.contains(".hydra/config.yaml"),
            "{msg}"
        );
        let script = "DEVICE=${DEVICE:-cuda}\ncase $DEVICE in\n  cuda) MICRO=4 ;;\n  npu) MICRO=1 ;;\nesac\n\
                      ARGS=(a=1 b=2)\npython3 -m verl.trainer.main_ppo \\\n  x.micro=$MICRO \"${ARGS[@]}\" \\\n  y=$(date)\n";
        let msg = err(script);
        assert!(
            msg.contains("line 8: `x.micro=$MICRO`: `$MICRO` is assigned under a branch, loop or function (line 4)")
                && msg.contains("reads a bash array")
                && msg.contains("command substitution"),
            "{msg}"
        );
        // Given on the command line, the branch's variable is known.
        let e = env(&[("MICRO", "4")], &[]);
        assert!(
            override_words(&script.replace(" \"${ARGS[@]}\" \\\n  y=$(date)", ""), &e)
                .unwrap()
                .words
                .contains(&"x.micro=4".to_string())
        );
        let msg = err("if true; then\n  python3 -m verl.trainer.main_ppo a=1\nfi\n");
        assert!(
            msg.contains("line 2: the verl command runs inside"),
            "{msg}"
        );
        let msg =
            err("python3 -m verl.trainer.main_ppo a=1\npython3 -m verl.trainer.main_ppo a=2\n");
        assert!(msg.contains("2 python commands (lines 1, 2)"), "{msg}");
        let msg = err("python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=$1\n");
        assert!(msg.contains("the script's argument 1"), "{msg}");
    }
}
