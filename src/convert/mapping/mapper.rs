//! Reading a verl configuration's values and writing them as a node's parameters: typed getters,
//! notes for what does not carry over, parameters written only where they differ from the
//! kind's default (so that every form of the input gives the same graph), and verl's
//! micro-batch keys. It knows no section; the other parts of `mapping` decide what goes where.

use flowrl_engine::registry::Registry;
use serde_json::Value as Json;

use super::{Note, NoteKind, Section};
use crate::convert::input::{Value, VerlConfig};

/// TOML text of a string.
pub(super) fn t_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// TOML text of a float (always with a decimal point or exponent).
pub(super) fn t_f64(x: f64) -> String {
    let s = format!("{x:?}");
    if s.contains(['.', 'e', 'E']) || s.contains("inf") || s.contains("NaN") {
        s
    } else {
        format!("{s}.0")
    }
}

/// TOML text of a list of strings.
pub(super) fn t_strs(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| t_str(s)).collect();
    format!("[{}]", quoted.join(", "))
}

/// A verl list value (or one value) as strings; empty for null.
pub(super) fn string_list(v: &Value) -> Vec<String> {
    match v {
        Value::List(items) => items.iter().map(|i| i.to_string()).collect(),
        Value::Null => Vec::new(),
        v => vec![v.to_string()],
    }
}

/// The conversion under way: the configuration, the kinds, and what has been written so far.
pub(super) struct Mapper<'a> {
    pub(super) cfg: &'a VerlConfig,
    pub(super) registry: &'a Registry,
    pub(super) notes: Vec<Note>,
    pub(super) sections: Vec<Section>,
    /// Data-parallel size of verl's workers: GPUs ÷ ulysses_sequence_parallel_size.
    pub(super) dp: i64,
}

impl Mapper<'_> {
    pub(super) fn v(&self, key: &str) -> &Value {
        static NULL: Value = Value::Null;
        self.cfg.get(key).unwrap_or(&NULL)
    }
    pub(super) fn int(&self, key: &str) -> Option<i64> {
        self.v(key).as_i64()
    }
    pub(super) fn float(&self, key: &str) -> Option<f64> {
        self.v(key).as_f64()
    }
    pub(super) fn flag(&self, key: &str) -> bool {
        self.v(key).as_bool().unwrap_or(false)
    }
    pub(super) fn text(&self, key: &str) -> Option<String> {
        match self.v(key) {
            Value::Null => None,
            v => Some(v.to_string()),
        }
    }

    pub(super) fn not_carried(&mut self, key: &str, reason: impl Into<String>) {
        let value = self.v(key).to_string();
        self.notes.push(Note {
            key: key.to_string(),
            value,
            kind: NoteKind::NotCarried(reason.into()),
        });
    }

    /// The default of a node kind's parameter, as JSON.
    fn default_of(&self, kind: &str, param: &str) -> Option<Json> {
        let spec = self.registry.kind(kind)?.params();
        spec.into_iter()
            .find(|p| p.name == param)
            .and_then(|p| p.default)
    }

    fn kind_has(&self, kind: &str, param: &str) -> bool {
        self.registry
            .kind(kind)
            .is_some_and(|k| k.params().iter().any(|p| p.name == param))
    }

    /// Writes a float parameter when it differs from flowrl's default (so that every form of the
    /// input gives the same graph).
    pub(super) fn float_param(&self, s: &mut Section, kind: &str, param: &str, from: &str) {
        let Some(x) = self.float(from) else { return };
        let default = self.default_of(kind, param).and_then(|d| d.as_f64());
        if default != Some(x) {
            s.set(param, t_f64(x), from);
        }
    }

    pub(super) fn int_param(&self, s: &mut Section, kind: &str, param: &str, from: &str) {
        let Some(x) = self.int(from) else { return };
        let default = self.default_of(kind, param).and_then(|d| d.as_i64());
        if default != Some(x) {
            s.set(param, x.to_string(), from);
        }
    }

    pub(super) fn str_param(&self, s: &mut Section, kind: &str, param: &str, from: &str) {
        let Some(x) = self.v(from).as_str().map(str::to_string) else {
            return;
        };
        let default = self.default_of(kind, param);
        if default.as_ref().and_then(|d| d.as_str()) != Some(x.as_str()) {
            s.set(param, t_str(&x), from);
        }
    }

    /// The token budget from `[use_dynamic_bsz, max_token_len]` ([`Self::dynamic`]), else
    /// `micro_batch_size` from `[per_gpu, global]` ([`Self::micro`]): never both, as verl
    /// ignores the micro-batch size when `use_dynamic_bsz` is on (a micro-batch size the input
    /// sets anyway is listed as of no meaning).
    pub(super) fn micro_batches(
        &mut self,
        s: &mut Section,
        kind: &str,
        [per_gpu, global]: [&str; 2],
        [use_key, len_key]: [&str; 2],
    ) {
        if self.dynamic(s, kind, use_key, len_key) {
            for key in [per_gpu, global] {
                if self.cfg.set.contains(key) && !matches!(self.v(key), Value::Null) {
                    self.notes.push(Note {
                        key: key.to_string(),
                        value: self.v(key).to_string(),
                        kind: NoteKind::NoEffect(
                            "use_dynamic_bsz is on: the token budget makes the micro-batches",
                        ),
                    });
                }
            }
            return;
        }
        if let Some((micro, from)) = self.micro(per_gpu, global) {
            s.set("micro_batch_size", micro.to_string(), &from);
        }
    }

    /// A per-device micro-batch: `<prefix>_per_gpu`, else the global `<prefix>` ÷ dp.
    fn micro(&mut self, per_gpu: &str, global: &str) -> Option<(i64, String)> {
        if let Some(m) = self.int(per_gpu) {
            return Some((m, per_gpu.to_string()));
        }
        let g = self.int(global)?;
        let m = (g / self.dp).max(1);
        if g % self.dp != 0 {
            self.not_carried(
                global,
                format!(
                    "{g} is not divisible by the {} data-parallel GPUs; {m} per device",
                    self.dp
                ),
            );
        }
        Some((m, format!("{global} ÷ {} GPUs", self.dp)))
    }

    /// verl's `use_remove_padding` at `key` → the kind's `padding_free` when it has one (a kind
    /// without one lays sequences out padded: the same numbers, more memory).
    pub(super) fn padding_free(&mut self, s: &mut Section, kind: &str, key: &str) {
        self.switch(
            s,
            kind,
            "padding_free",
            key,
            "lays its sequences out padded",
        );
    }

    /// verl's `enable_gradient_checkpointing` at `key` → the kind's `gradient_checkpointing`
    /// when it has one (a kind without one keeps every layer's activations: the same numbers,
    /// more memory).
    pub(super) fn gradient_checkpointing(&mut self, s: &mut Section, kind: &str, key: &str) {
        let without = "keeps every layer's activations for the backward";
        self.switch(s, kind, "gradient_checkpointing", key, without);
    }

    /// A verl memory switch at `key` → `param = true` on the kind when it has `param`; else
    /// noted as not carried: "`kind` {without}: the same numbers, more memory".
    fn switch(&mut self, s: &mut Section, kind: &str, param: &str, key: &str, without: &str) {
        if !self.flag(key) {
            return;
        }
        if self.kind_has(kind, param) {
            s.set(param, "true".to_string(), key);
        } else {
            self.not_carried(
                key,
                format!("`{kind}` {without}: the same numbers, more memory"),
            );
        }
    }

    /// verl's dynamic micro-batches (`use_dynamic_bsz` + a token budget) → the kind's
    /// `max_tokens_per_micro_batch` when it has one; whether it was set.
    fn dynamic(&mut self, s: &mut Section, kind: &str, use_key: &str, len_key: &str) -> bool {
        if !self.flag(use_key) {
            return false;
        }
        let Some(tokens) = self.int(len_key) else {
            return false;
        };
        if self.kind_has(kind, "max_tokens_per_micro_batch") {
            s.set("max_tokens_per_micro_batch", tokens.to_string(), len_key);
            true
        } else {
            self.not_carried(
                use_key,
                format!(
                    "`{kind}` has no token-budget micro-batches yet: micro-batches are counted in responses ({len_key} = {tokens} not used); the gradient is the same, only memory differs"
                ),
            );
            false
        }
    }
}
