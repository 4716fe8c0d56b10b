//! Reading a verl run's configuration: a Hydra `config.yaml` (composed, interpolations
//! unresolved, as Hydra saves it in `.hydra/`, or already resolved), a Hydra `overrides.yaml` (a
//! YAML list of `key=value` strings), or a launch script or text of `key=value` overrides, read
//! as the shell hands them to `python3 -m verl.trainer.main_ppo` ([`super::shell`]).
//!
//! Every form ends as one flat map of dotted keys to values: verl's default configuration
//! (`verl_defaults.yaml`, verl's `_generated_ppo_trainer.yaml`) with the input laid over it, then
//! OmegaConf's interpolations (`${a.b}`, `${.sibling}`, `${oc.select:a.b,default}`,
//! `${oc.env:VAR,default}`) resolved. What the input itself set is kept apart, so that the graph's
//! header can list the keys a user chose rather than every default.
//!
//! It does not compose Hydra config groups (`actor@actor_rollout_ref.actor=megatron_actor`):
//! such an override is reported as a key the converter does not know.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use anyhow::{Context, Result, bail};
use yaml_rust2::{Yaml, YamlLoader};

use super::shell::{ShellEnv, override_words};

/// verl's default configuration (verl/trainer/config/_generated_ppo_trainer.yaml at
/// verl-project/verl, formerly volcengine/verl, 1dda039b9c6311889a9c9a26040677e1254814f9 of
/// 2026-08-22: verl 0.10.0.dev, after v0.9.0).
const VERL_DEFAULTS: &str = include_str!("verl_defaults.yaml");

/// One configuration value, as OmegaConf holds it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Value>),
    /// A mapping: empty in a leaf (`engine_kwargs: {}`), or a subtree an interpolation selected.
    Map(Vec<(String, Value)>),
}

impl Value {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Float(f) if f.fract() == 0.0 => Some(*f as i64),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Equal as configuration values: an integer equals the same float.
    pub fn same(&self, other: &Value) -> bool {
        match (self.as_f64(), other.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => self == other,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => write!(f, "null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Str(s) => write!(f, "{s}"),
            Value::List(items) => {
                write!(f, "[")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{v}")?;
                }
                write!(f, "]")
            }
            Value::Map(entries) => {
                write!(f, "{{")?;
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{k}: {v}")?;
                }
                write!(f, "}}")
            }
        }
    }
}

/// Which of the three forms the input was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputForm {
    /// A composed configuration (Hydra's `.hydra/config.yaml`).
    Config,
    /// Hydra's `.hydra/overrides.yaml`.
    HydraOverrides,
    /// `key=value` words of a command line.
    CommandLine,
}

impl fmt::Display for InputForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InputForm::Config => "a composed verl configuration (Hydra config.yaml)",
            InputForm::HydraOverrides => "Hydra's override list (overrides.yaml)",
            InputForm::CommandLine => "verl command-line overrides",
        })
    }
}

/// A verl configuration: every key, resolved, over verl's defaults.
#[derive(Debug)]
pub struct VerlConfig {
    pub form: InputForm,
    /// Every leaf key with its resolved value.
    pub values: BTreeMap<String, Value>,
    /// verl's defaults, resolved the same way.
    pub defaults: BTreeMap<String, Value>,
    /// The keys the input chose: its overrides, or the keys of a composed configuration whose
    /// value is not verl's default.
    pub set: BTreeSet<String>,
    /// Words of a command line that are not overrides (reported, not converted).
    pub stray_words: Vec<String>,
    /// What reading a command line noted (a `${VAR:-default}` that took its default).
    pub notes: Vec<String>,
}

impl VerlConfig {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key)
    }

    /// Reads `path` in whichever form it is; a command line's variables from `env`.
    pub fn read(path: &Path, env: &ShellEnv) -> Result<VerlConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        VerlConfig::parse_with(&text, env)
    }

    /// [`VerlConfig::parse_with`] with no variables but the script's own.
    #[cfg(test)]
    pub fn parse(text: &str) -> Result<VerlConfig> {
        VerlConfig::parse_with(text, &ShellEnv::default())
    }

    pub fn parse_with(text: &str, env: &ShellEnv) -> Result<VerlConfig> {
        let defaults_raw = flatten_yaml(&parse_yaml(VERL_DEFAULTS).expect("verl defaults parse"));
        let defaults = resolve_all(&defaults_raw);
        let yaml = parse_yaml(text).ok();
        let mut notes = Vec::new();
        let (form, raw, set, stray_words) = match &yaml {
            Some(config @ Yaml::Hash(_)) => {
                let config = flatten_yaml(config);
                let mut raw = defaults_raw.clone();
                for key in config.keys() {
                    remove_subtree(&mut raw, key);
                }
                raw.extend(config);
                (InputForm::Config, raw, BTreeSet::new(), Vec::new())
            }
            Some(Yaml::Array(items)) if items.iter().all(|i| matches!(i, Yaml::String(_))) => {
                let words: Vec<String> = items
                    .iter()
                    .map(|i| i.as_str().unwrap().to_string())
                    .collect();
                let (raw, set, stray) = apply_overrides(&defaults_raw, &words)?;
                (InputForm::HydraOverrides, raw, set, stray)
            }
            _ => {
                let words = override_words(text, env)?;
                notes = words.notes;
                let (raw, set, stray) = apply_overrides(&defaults_raw, &words.words)?;
                (InputForm::CommandLine, raw, set, stray)
            }
        };
        let values = resolve_all(&raw);
        let set = if form == InputForm::Config {
            values
                .iter()
                .filter(|(k, v)| defaults.get(*k).is_none_or(|d| !d.same(v)))
                .map(|(k, _)| k.clone())
                .collect()
        } else {
            set
        };
        Ok(VerlConfig {
            form,
            values,
            defaults,
            set,
            stray_words,
            notes,
        })
    }
}

/// A YAML file's value (a verl tool configuration, say).
pub fn read_yaml_value(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(yaml_value(&parse_yaml(&text)?))
}

fn parse_yaml(text: &str) -> Result<Yaml> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| anyhow::anyhow!("YAML: {e}"))?;
    Ok(docs.into_iter().next().unwrap_or(Yaml::Null))
}

fn yaml_value(y: &Yaml) -> Value {
    match y {
        Yaml::Real(s) => s.parse().map(Value::Float).unwrap_or(Value::Str(s.clone())),
        Yaml::Integer(i) => Value::Int(*i),
        Yaml::String(s) => Value::Str(s.clone()),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Array(items) => Value::List(items.iter().map(yaml_value).collect()),
        Yaml::Hash(h) => Value::Map(
            h.iter()
                .map(|(k, v)| (yaml_key(k), yaml_value(v)))
                .collect(),
        ),
        Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => Value::Null,
    }
}

fn yaml_key(k: &Yaml) -> String {
    match k {
        Yaml::String(s) => s.clone(),
        other => yaml_value(other).to_string(),
    }
}

/// Dotted leaf keys of a YAML mapping (an empty mapping is a leaf).
fn flatten_yaml(y: &Yaml) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    flatten_into(&mut out, "", yaml_value(y));
    out
}

fn flatten_into(out: &mut BTreeMap<String, Value>, prefix: &str, v: Value) {
    match v {
        Value::Map(entries) if !entries.is_empty() => {
            for (k, v) in entries {
                let key = if prefix.is_empty() {
                    k
                } else {
                    format!("{prefix}.{k}")
                };
                flatten_into(out, &key, v);
            }
        }
        v if !prefix.is_empty() => {
            out.insert(prefix.to_string(), v);
        }
        _ => {}
    }
}

fn remove_subtree(map: &mut BTreeMap<String, Value>, key: &str) {
    let below = format!("{key}.");
    map.retain(|k, _| k != key && !k.starts_with(&below));
}

/// A configuration with overrides applied: every key, the keys the overrides set, and the words
/// that are not overrides.
type Overridden = (BTreeMap<String, Value>, BTreeSet<String>, Vec<String>);

/// Hydra's override forms: `key=value` (change), `+key=value` (add), `++key=value` (add or
/// change), `~key` / `~key=value` (delete).
fn apply_overrides(base: &BTreeMap<String, Value>, words: &[String]) -> Result<Overridden> {
    let mut map = base.clone();
    let mut set = BTreeSet::new();
    let mut stray = Vec::new();
    for word in words {
        if let Some(rest) = word.strip_prefix('~') {
            let key = rest.split('=').next().unwrap_or(rest);
            remove_subtree(&mut map, key);
            set.insert(key.to_string());
            continue;
        }
        let Some((key, value)) = word.split_once('=') else {
            stray.push(word.clone());
            continue;
        };
        let key = key.trim_start_matches('+');
        if key.is_empty() {
            bail!("override `{word}` has no key");
        }
        remove_subtree(&mut map, key);
        let mut leaves = BTreeMap::new();
        flatten_into(&mut leaves, key, parse_override_value(value));
        if leaves.is_empty() {
            leaves.insert(key.to_string(), Value::Map(Vec::new()));
        }
        set.extend(leaves.keys().cloned());
        map.extend(leaves);
    }
    Ok((map, set, stray))
}

/// A value of Hydra's override grammar (also the default of `oc.select`): null, booleans in any
/// case, numbers, quoted strings, `[a, b]` lists, `{k: v}` mappings, anything else a string.
pub fn parse_override_value(s: &str) -> Value {
    let s = s.trim();
    if s.len() >= 2
        && ((s.starts_with('\'') && s.ends_with('\'')) || (s.starts_with('"') && s.ends_with('"')))
    {
        return Value::Str(s[1..s.len() - 1].to_string());
    }
    if s.starts_with('[') && s.ends_with(']') {
        return Value::List(
            split_top_level(&s[1..s.len() - 1], ',')
                .iter()
                .filter(|p| !p.trim().is_empty())
                .map(|p| parse_override_value(p))
                .collect(),
        );
    }
    if s.starts_with('{') && s.ends_with('}') {
        return Value::Map(
            split_top_level(&s[1..s.len() - 1], ',')
                .iter()
                .filter_map(|p| {
                    let (k, v) = p.split_once(':')?;
                    Some((k.trim().to_string(), parse_override_value(v)))
                })
                .collect(),
        );
    }
    match s.to_ascii_lowercase().as_str() {
        "null" | "~" => return Value::Null,
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    if let Ok(i) = s.replace('_', "").parse::<i64>()
        && !s.is_empty()
    {
        return Value::Int(i);
    }
    if s.bytes().any(|b| b.is_ascii_digit())
        && let Ok(x) = s.parse::<f64>()
    {
        return Value::Float(x);
    }
    Value::Str(s.to_string())
}

/// Splits at `sep` outside brackets, braces and quotes.
fn split_top_level(s: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut cur = String::new();
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            (None, c) if c == sep && depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    parts
}

/// Every value with OmegaConf's interpolations resolved.
fn resolve_all(raw: &BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    raw.iter()
        .map(|(k, v)| (k.clone(), resolve(raw, k, v, 0)))
        .collect()
}

fn resolve(raw: &BTreeMap<String, Value>, key: &str, v: &Value, depth: usize) -> Value {
    match v {
        Value::Str(s) if s.contains("${") && depth < 32 => resolve_str(raw, key, s, depth),
        Value::List(items) => Value::List(
            items
                .iter()
                .map(|i| resolve(raw, key, i, depth + 1))
                .collect(),
        ),
        v => v.clone(),
    }
}

/// A string with interpolations: one that is a single `${...}` takes the selected value's type;
/// otherwise each interpolation is replaced by its text.
fn resolve_str(raw: &BTreeMap<String, Value>, key: &str, s: &str, depth: usize) -> Value {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        let Some(len) = interpolation_len(&rest[start..]) else {
            break;
        };
        let inner = &rest[start + 2..start + len - 1];
        let value = interpolate(raw, key, inner, depth);
        if start == 0 && len == rest.len() && out.is_empty() {
            return value;
        }
        out.push_str(&rest[..start]);
        out.push_str(&value.to_string());
        rest = &rest[start + len..];
    }
    out.push_str(rest);
    Value::Str(out)
}

/// Length of the `${...}` at the start of `s`, nested interpolations included.
fn interpolation_len(s: &str) -> Option<usize> {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

fn interpolate(raw: &BTreeMap<String, Value>, key: &str, inner: &str, depth: usize) -> Value {
    let inner = inner.trim();
    if let Some(args) = inner.strip_prefix("oc.select:") {
        let parts = split_top_level(args, ',');
        let default = parts
            .get(1)
            .map(|d| resolve(raw, key, &parse_override_value(d), depth + 1))
            .unwrap_or(Value::Null);
        return lookup(raw, key, parts[0].trim(), depth).unwrap_or(default);
    }
    if let Some(args) = inner.strip_prefix("oc.env:") {
        let parts = split_top_level(args, ',');
        return match std::env::var(parts[0].trim()) {
            Ok(v) => Value::Str(v),
            Err(_) => parts
                .get(1)
                .map(|d| parse_override_value(d))
                .unwrap_or(Value::Null),
        };
    }
    lookup(raw, key, inner, depth).unwrap_or_else(|| Value::Str(format!("${{{inner}}}")))
}

/// The value at `path` (absolute, or relative to `key`'s parent with leading dots), resolved;
/// a subtree as a mapping of its leaves.
fn lookup(raw: &BTreeMap<String, Value>, key: &str, path: &str, depth: usize) -> Option<Value> {
    let full = if path.starts_with('.') {
        let dots = path.len() - path.trim_start_matches('.').len();
        let mut segs: Vec<&str> = key.split('.').collect();
        for _ in 0..dots {
            segs.pop();
        }
        let rest = &path[dots..];
        if segs.is_empty() {
            rest.to_string()
        } else {
            format!("{}.{rest}", segs.join("."))
        }
    } else {
        path.to_string()
    };
    if let Some(v) = raw.get(&full) {
        return Some(resolve(raw, &full, v, depth + 1));
    }
    let below = format!("{full}.");
    let children: Vec<(String, Value)> = raw
        .range(below.clone()..)
        .take_while(|(k, _)| k.starts_with(&below))
        .map(|(k, v)| (k[below.len()..].to_string(), resolve(raw, k, v, depth + 1)))
        .collect();
    (!children.is_empty()).then_some(Value::Map(children))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_resolve() {
        let cfg = VerlConfig::parse("").unwrap();
        assert_eq!(cfg.form, InputForm::CommandLine);
        assert!(cfg.set.is_empty());
        // ${oc.select:data.max_response_length,512}
        assert_eq!(
            cfg.get("actor_rollout_ref.rollout.response_length"),
            Some(&Value::Int(512))
        );
        // ${.save_contents}
        assert_eq!(
            cfg.get("critic.checkpoint.load_contents"),
            cfg.get("critic.checkpoint.save_contents")
        );
        // ${oc.select:.ppo_micro_batch_size_per_gpu,null} → null
        assert_eq!(
            cfg.get("critic.forward_micro_batch_size_per_gpu"),
            Some(&Value::Null)
        );
        assert_eq!(
            cfg.get("trainer.default_local_dir"),
            Some(&Value::Str("checkpoints/verl_examples/gsm8k".into()))
        );
    }

    #[test]
    fn command_line_words() {
        let text = "python3 -m verl.trainer.main_ppo \\\n    data.truncation='error' \\\n    trainer.logger='[\"console\",\"wandb\"]' +a.b.c=True actor_rollout_ref.rollout.n=5 $@\n";
        let cfg = VerlConfig::parse(text).unwrap();
        assert_eq!(
            cfg.get("data.truncation"),
            Some(&Value::Str("error".into()))
        );
        assert_eq!(
            cfg.get("trainer.logger"),
            Some(&Value::List(vec![
                Value::Str("console".into()),
                Value::Str("wandb".into())
            ]))
        );
        assert_eq!(cfg.get("a.b.c"), Some(&Value::Bool(true)));
        // The override reaches what interpolates it.
        assert_eq!(cfg.get("critic.rollout_n"), Some(&Value::Int(5)));
        assert!(cfg.stray_words.is_empty());
        assert_eq!(cfg.set.len(), 4);
    }

    #[test]
    fn override_values() {
        assert_eq!(parse_override_value("1e-6"), Value::Float(1e-6));
        assert_eq!(parse_override_value("-1"), Value::Int(-1));
        assert_eq!(parse_override_value("False"), Value::Bool(false));
        assert_eq!(
            parse_override_value("all-linear"),
            Value::Str("all-linear".into())
        );
        assert_eq!(
            parse_override_value("'.*visual.*'"),
            Value::Str(".*visual.*".into())
        );
        assert_eq!(
            parse_override_value("[q_proj, v_proj]"),
            Value::List(vec![
                Value::Str("q_proj".into()),
                Value::Str("v_proj".into())
            ])
        );
    }
}
