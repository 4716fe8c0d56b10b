//! Tools a multi-turn rollout's policy calls (`rollout.multi_turn`'s `tools` table).
//!
//! A graph declares each tool under the name the model calls it by, with its kind and the
//! kind's parameters (the kind defaults to the name):
//!
//! ```toml
//! [nodes.rollout.tools.zoom_in]          # kind "zoom_in"
//! coordinates = "norm1000"
//! [nodes.rollout.tools.look]
//! kind = "crop"
//! ```
//!
//! Kinds: `crop` and `zoom_in` ([`zoom`]), `rotate` ([`rotate`]), and `exec` ([`exec`]): a
//! program in any language over JSON lines. A tool answers with text and
//! pictures ([`ToolOutput`]); a bad call (unknown tool, bad or missing arguments, a box outside
//! the picture) is answered with an error message the model reads, and counted, never an error
//! of the run. Calls are parsed from the turn's text in the family's syntax ([`call`]); the
//! answers are rendered through the model's chat template ([`render`]).

pub mod call;
pub mod exec;
pub mod render;
pub mod rotate;
pub mod tool;
pub mod zoom;

use std::collections::BTreeMap;
use std::sync::Arc;

use image::RgbImage;
use serde_json::{Map, Value as Json};

pub use tool::{Tool, ToolOutput};

/// The tool kinds.
pub const TOOL_KINDS: &[&str] = &["crop", "exec", "rotate", "zoom_in"];

/// A graph's tools by name.
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl std::fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

/// A problem with a tool's declaration: the parameter path (`tools.zoom_in.kind`) and the
/// message.
pub type SpecError = (String, String);

impl ToolSet {
    /// The tools declared by `spec` (the `tools` table), or every problem with it.
    pub fn from_spec(spec: &Json) -> Result<Self, Vec<SpecError>> {
        let mut tools = BTreeMap::new();
        let mut errors = Vec::new();
        let table = match spec {
            Json::Null => return Ok(Self::default()),
            Json::Object(t) => t,
            _ => {
                return Err(vec![(
                    "tools".into(),
                    "`tools` must be a table of tools by name".into(),
                )]);
            }
        };
        for (name, decl) in table {
            let path = format!("tools.{name}");
            let Json::Object(decl) = decl else {
                errors.push((path, format!("tool `{name}` must be a table")));
                continue;
            };
            let mut params = decl.clone();
            let kind = match params.remove("kind") {
                None => name.clone(),
                Some(Json::String(k)) => k,
                Some(_) => {
                    errors.push((format!("{path}.kind"), "`kind` must be a string".into()));
                    continue;
                }
            };
            match build_tool(&kind, name, Json::Object(params)) {
                Ok(tool) => {
                    tools.insert(name.clone(), tool);
                }
                Err(Problem::Kind) => {
                    let hint =
                        flowrl_engine::diagnostic::did_you_mean(&kind, TOOL_KINDS.iter().copied())
                            .map(|s| format!(" ({s})"))
                            .unwrap_or_default();
                    let at = if decl.contains_key("kind") {
                        format!("{path}.kind")
                    } else {
                        path
                    };
                    errors.push((
                        at,
                        format!(
                            "unknown tool kind `{kind}`{hint}; the kinds are {}",
                            TOOL_KINDS.join(", ")
                        ),
                    ));
                }
                Err(Problem::Params(m)) => errors.push((path, format!("tool `{name}`: {m}"))),
            }
        }
        if errors.is_empty() {
            Ok(Self { tools })
        } else {
            Err(errors)
        }
    }

    /// This set with `tool` under `name` (a tool built in code rather than declared in the
    /// graph, e.g. by a test); a tool of that name is replaced.
    pub fn with(mut self, name: &str, tool: Arc<dyn Tool>) -> Self {
        self.tools.insert(name.to_string(), tool);
        self
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// The tools' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// True when no tool is declared.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The tools' OpenAI function descriptions.
    pub fn functions(&self) -> Vec<Json> {
        self.tools.iter().map(|(n, t)| t.function(n)).collect()
    }

    /// Runs a parsed call: the tool's answer, or the message an unknown tool or a bad call gets.
    pub fn call(
        &self,
        name: &str,
        arguments: &Json,
        pictures: &[Arc<RgbImage>],
    ) -> Result<ToolOutput, String> {
        let Some(tool) = self.get(name) else {
            let names: Vec<&str> = self.names().collect();
            return Err(format!(
                "Error: there is no tool `{name}`; the tools are {}",
                names.join(", ")
            ));
        };
        let empty = Map::new();
        let arguments = arguments.as_object().unwrap_or(&empty);
        tool.call(arguments, pictures)
    }
}

enum Problem {
    Kind,
    Params(String),
}

fn build_tool(kind: &str, name: &str, params: Json) -> Result<Arc<dyn Tool>, Problem> {
    fn parse<T: serde::de::DeserializeOwned>(params: Json) -> Result<T, Problem> {
        serde_json::from_value(params).map_err(|e| Problem::Params(e.to_string()))
    }
    Ok(match kind {
        "crop" => Arc::new(zoom::Crop::new(parse(params)?, 1.0).map_err(Problem::Params)?),
        "zoom_in" => Arc::new(zoom::Crop::new(parse(params)?, 2.0).map_err(Problem::Params)?),
        "rotate" => {
            let _: rotate::RotateParams = parse(params)?;
            Arc::new(rotate::Rotate)
        }
        "exec" => Arc::new(exec::ExecTool::new(name, parse(params)?).map_err(Problem::Params)?),
        _ => return Err(Problem::Kind),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn declarations_are_checked_with_every_problem_named() {
        let ok = ToolSet::from_spec(
            &json!({"zoom_in": {"coordinates": "norm1000"}, "turn": {"kind": "rotate"}}),
        )
        .unwrap();
        assert_eq!(ok.names().collect::<Vec<_>>(), ["turn", "zoom_in"]);
        let errs = ToolSet::from_spec(&json!({
            "zoom": {},
            "look": {"kind": "crop", "coordinates": "polar"},
            "spin": {"kind": "rotate", "speed": 2},
        }))
        .unwrap_err();
        let text = format!("{errs:?}");
        assert!(
            text.contains("unknown tool kind `zoom` (did you mean `zoom_in`?)"),
            "{text}"
        );
        assert!(
            text.contains("tool `look`: unknown variant `polar`"),
            "{text}"
        );
        assert!(
            text.contains("tool `spin`: unknown field `speed`"),
            "{text}"
        );
        let unknown = ok.call("zoom", &json!({}), &[]).unwrap_err();
        assert!(
            unknown.contains("no tool `zoom`; the tools are turn, zoom_in"),
            "{unknown}"
        );
    }
}
