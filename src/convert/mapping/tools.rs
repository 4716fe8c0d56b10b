//! verl's multi-turn rollout (`actor_rollout_ref.rollout.multi_turn.*`) as `rollout.multi_turn`'s
//! turn parameters, and its tool configuration (`tool_config_path`: a YAML file whose `tools`
//! list names each tool's Python class and OpenAI schema) as `[nodes.rollout.tools.NAME]`
//! tables; the eval node gets the same, as verl validates through the same agent loop.
//!
//! Tools: verl's image zoom-in tool (`*.ImageZoomInTool`, DeepEyes' `bbox_2d` in 0–1000 of the
//! picture) becomes a `crop` tool with `coordinates = "norm1000"`, under the schema's function
//! name. Any other tool class has no flowrl counterpart and is named in a note.

use std::path::Path;

use super::mapper::{Mapper, t_str};
use super::{ROLLOUT, Section};
use crate::convert::input::{Value, read_yaml_value};

/// `rollout.multi_turn`'s parameters and tools, as read from verl.
pub(super) struct Turns {
    /// `(key, TOML value, verl key)` of the node's turn parameters.
    params: Vec<(String, String, String)>,
    /// Per tool: its name and `(key, TOML value)` parameters.
    tools: Vec<(String, Vec<(String, String)>)>,
}

const MT: &str = "actor_rollout_ref.rollout.multi_turn";

/// The multi-turn rollout of the configuration, when it enables one with tools flowrl has.
pub(super) fn read(m: &mut Mapper) -> Option<Turns> {
    let enable = format!("{MT}.enable");
    if !m.flag(&enable) {
        return None;
    }
    let mut params = Vec::new();
    if let Some(t) = m.int(&format!("{MT}.max_assistant_turns")) {
        params.push((
            "max_turns".into(),
            t.to_string(),
            format!("{MT}.max_assistant_turns"),
        ));
    }
    if let Some(c) = m.int(&format!("{MT}.max_parallel_calls"))
        && c != 1
    {
        params.push((
            "max_parallel_calls".into(),
            c.to_string(),
            format!("{MT}.max_parallel_calls"),
        ));
    }
    let format = m
        .text(&format!("{MT}.format"))
        .unwrap_or_else(|| "hermes".into());
    if format == "hermes" {
        params.push(("format".into(), t_str("hermes"), format!("{MT}.format")));
    } else {
        m.not_carried(
            &format!("{MT}.format"),
            "tool calls are read in the hermes syntax (Qwen) or Gemma 4's; set the rollout's `format`",
        );
    }
    let config_key = format!("{MT}.tool_config_path");
    let Some(path) = m.text(&config_key) else {
        m.not_carried(
            &enable,
            "multi_turn.enable without a tool_config_path: no tools, so the rollout stays single-turn",
        );
        return None;
    };
    let tools = match read_yaml_value(Path::new(&path)) {
        Ok(v) => tools_of(m, &config_key, &v),
        Err(e) => {
            m.not_carried(
                &config_key,
                format!(
                    "{e:#} (a relative path is read from the working directory); the rollout stays single-turn"
                ),
            );
            return None;
        }
    };
    if tools.is_empty() {
        m.not_carried(
            &config_key,
            "none of its tools has a flowrl counterpart; the rollout stays single-turn",
        );
        return None;
    }
    Some(Turns { params, tools })
}

fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
        _ => None,
    }
}

/// The tools of a verl tool configuration that flowrl has; a note for each other one.
fn tools_of(m: &mut Mapper, key: &str, config: &Value) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    let Some(Value::List(tools)) = get(config, "tools") else {
        m.not_carried(key, "the file has no `tools` list");
        return out;
    };
    for tool in tools {
        let class = get(tool, "class_name")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string();
        let name = get(tool, "tool_schema")
            .and_then(|s| get(s, "function"))
            .and_then(|f| get(f, "name"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| class.rsplit('.').next().unwrap_or("tool").to_string());
        if class.ends_with("ImageZoomInTool") {
            out.push((
                name,
                vec![
                    ("kind".into(), t_str("crop")),
                    ("coordinates".into(), t_str("norm1000")),
                ],
            ));
        } else {
            m.not_carried(
                key,
                format!("tool `{name}` ({class}) has no flowrl counterpart and is left out"),
            );
        }
    }
    out
}

impl Turns {
    /// Writes the turn parameters into a node's section.
    pub(super) fn write(&self, node: &mut Section) {
        for (k, v, from) in &self.params {
            node.set(k, v.clone(), from);
        }
    }

    /// The tool tables of node `name`, after its section.
    pub(super) fn tool_sections(&self, name: &str) -> Vec<Section> {
        self.tools
            .iter()
            .map(|(tool, params)| {
                let mut s = Section::new(&format!("nodes.{name}.tools.{tool}"));
                for (k, v) in params {
                    s.set(
                        k,
                        v.clone(),
                        &format!("{ROLLOUT}.multi_turn.tool_config_path"),
                    );
                }
                s
            })
            .collect()
    }
}
