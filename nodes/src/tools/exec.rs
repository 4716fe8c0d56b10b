//! `exec`: a tool written in any language, as a program flowrl starts once and talks to in
//! JSON lines (the `exec` node kind's process handling: stderr kept for messages, a timeout per
//! answer, killed with the run).
//!
//! ```toml
//! [nodes.rollout.tools.measure]
//! kind = "exec"
//! command = ["python3", "tools/measure.py"]
//! description = "Measure the distance between two points of an image"
//! parameters = { type = "object", properties = { points = { type = "array" } }, required = ["points"] }
//! timeout_s = 30
//! ```
//!
//! Per call flowrl writes one line on the program's stdin,
//! `{"tool": NAME, "arguments": {...}, "images": [PNG paths]}` (the conversation's pictures so
//! far: the prompt's, then earlier tool answers'; files in a temporary folder, removed after
//! the answer), and reads one line from its stdout: `{"text": "...", "images": [paths]}` (PNG or
//! JPEG files it wrote, read before the next call) or `{"error": "..."}`, which the model reads
//! as the tool's answer. Arguments are checked against `parameters` (an object schema:
//! `required` keys present, no key outside `properties` when it lists some, the JSON types
//! named by `type`) before the program sees them. A program that exits, stops answering within
//! `timeout_s` or answers something else is killed, the call is answered with an error (the
//! model reads it, it is counted) and the next call starts the program again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use image::RgbImage;
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use super::tool::{Tool, ToolOutput};
use crate::kinds::exec::process::Process;

/// Parameters of an `exec` tool in the graph.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecParams {
    pub command: Vec<String>,
    #[serde(default)]
    pub description: String,
    /// JSON schema of the arguments (an object schema).
    #[serde(default = "any_object")]
    pub parameters: Json,
    #[serde(default = "thirty")]
    pub timeout_s: f64,
}

fn any_object() -> Json {
    json!({"type": "object", "properties": {}})
}

fn thirty() -> f64 {
    30.0
}

/// The tool.
pub struct ExecTool {
    name: String,
    params: ExecParams,
    process: Mutex<Option<Process>>,
    /// Where the pictures of a call are written.
    scratch: PathBuf,
    calls: AtomicU64,
}

impl ExecTool {
    /// Checks the declaration (a message for the graph's diagnostics). The program starts at
    /// the first call.
    pub fn new(name: &str, params: ExecParams) -> Result<Self, String> {
        if params.command.is_empty() {
            return Err("`command` must name a program".into());
        }
        if !(params.timeout_s.is_finite() && params.timeout_s > 0.0) {
            return Err(format!(
                "`timeout_s` must be positive, got {}",
                params.timeout_s
            ));
        }
        check_schema(&params.parameters)?;
        let scratch = std::env::temp_dir().join(format!(
            "flowrl-tool-{}-{name}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        Ok(Self {
            name: name.to_string(),
            params,
            process: Mutex::new(None),
            scratch,
            calls: AtomicU64::new(0),
        })
    }

    /// One request and its answer line, starting the program when none runs; a failure
    /// leaves no program behind.
    fn exchange(&self, request: &str) -> Result<String, String> {
        let mut guard = self.process.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let p = Process::spawn(&self.params.command, &self.name)
                .map_err(|f| format!("Error: the tool program {f}"))?;
            *guard = Some(p);
        }
        let p = guard.as_mut().expect("started above");
        let timeout = Duration::from_secs_f64(self.params.timeout_s);
        match p.send(request).and_then(|()| p.recv(timeout)) {
            Ok(line) => Ok(line),
            Err(fault) => {
                let tail = p.stderr_tail().last().cloned().unwrap_or_default();
                p.kill();
                *guard = None;
                let tail = if tail.is_empty() {
                    String::new()
                } else {
                    format!(" (stderr: {tail})")
                };
                Err(format!("Error: the tool program {fault}{tail}"))
            }
        }
    }
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl Drop for ExecTool {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// An object schema: `type` "object", `properties` an object, `required` keys among them.
fn check_schema(schema: &Json) -> Result<(), String> {
    let o = schema
        .as_object()
        .ok_or("`parameters` must be a JSON-schema object")?;
    if o.get("type").and_then(Json::as_str) != Some("object") {
        return Err("`parameters` must have type = \"object\"".into());
    }
    let properties = match o.get("properties") {
        None => Map::new(),
        Some(Json::Object(p)) => p.clone(),
        Some(_) => return Err("`parameters.properties` must be a table".into()),
    };
    for (key, p) in &properties {
        if let Some(t) = p.get("type")
            && !t.as_str().is_some_and(|t| TYPES.contains(&t))
        {
            return Err(format!(
                "`parameters.properties.{key}.type` must be one of {}",
                TYPES.join(", ")
            ));
        }
    }
    if let Some(required) = o.get("required") {
        let list = required
            .as_array()
            .ok_or("`parameters.required` must be a list of names")?;
        for r in list {
            let name = r
                .as_str()
                .ok_or("`parameters.required` must be a list of names")?;
            if !properties.is_empty() && !properties.contains_key(name) {
                return Err(format!(
                    "`parameters.required` names `{name}`, which is not among the properties"
                ));
            }
        }
    }
    Ok(())
}

const TYPES: &[&str] = &[
    "object", "array", "string", "number", "integer", "boolean", "null",
];

/// Whether `v` has JSON-schema type `t`.
fn has_type(v: &Json, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.as_f64().is_some_and(|x| x.fract() == 0.0),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => true,
    }
}

impl Tool for ExecTool {
    fn function(&self, name: &str) -> Json {
        json!({
            "type": "function",
            "function": {
                "name": name,
                "description": self.params.description,
                "parameters": self.params.parameters,
            }
        })
    }

    fn call(
        &self,
        arguments: &Map<String, Json>,
        pictures: &[Arc<RgbImage>],
    ) -> Result<ToolOutput, String> {
        let schema = &self.params.parameters;
        let properties = schema.get("properties").and_then(Json::as_object);
        for r in schema
            .get("required")
            .and_then(Json::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().unwrap_or_default();
            if !arguments.contains_key(r) {
                return Err(format!("Error: missing argument {r}"));
            }
        }
        if let Some(props) = properties.filter(|p| !p.is_empty()) {
            for (k, v) in arguments {
                let Some(p) = props.get(k) else {
                    let names: Vec<&str> = props.keys().map(String::as_str).collect();
                    return Err(format!(
                        "Error: unknown argument `{k}`; the arguments are {}",
                        names.join(", ")
                    ));
                };
                if let Some(t) = p.get("type").and_then(Json::as_str)
                    && !has_type(v, t)
                {
                    return Err(format!("Error: argument {k} must be of type {t}, got {v}"));
                }
            }
        }
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let dir = self.scratch.join(format!("call_{call}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("Error: the tool's pictures cannot be written ({e})"))?;
        let result = (|| {
            let mut files = Vec::with_capacity(pictures.len());
            for (k, p) in pictures.iter().enumerate() {
                let path = dir.join(format!("image_{k}.png"));
                p.save(&path)
                    .map_err(|e| format!("Error: the tool's pictures cannot be written ({e})"))?;
                files.push(path.display().to_string());
            }
            let request = json!({"tool": self.name, "arguments": arguments, "images": files});
            let line = self.exchange(&request.to_string())?;
            self.answer(&line)
        })();
        let _ = std::fs::remove_dir_all(&dir);
        result
    }
}

impl ExecTool {
    /// The program's answer line as the tool's answer.
    fn answer(&self, line: &str) -> Result<ToolOutput, String> {
        let v: Json = serde_json::from_str(line).map_err(|_| {
            self.restart();
            format!("Error: the tool program answered something other than a JSON object: {line}")
        })?;
        if let Some(e) = v.get("error") {
            return Err(match e.as_str() {
                Some(s) => s.to_string(),
                None => e.to_string(),
            });
        }
        let text = v
            .get("text")
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_string();
        let mut out = Vec::new();
        for f in v
            .get("images")
            .and_then(Json::as_array)
            .into_iter()
            .flatten()
        {
            let path = f.as_str().unwrap_or_default();
            let picture = image::open(path)
                .map_err(|e| format!("Error: the tool's picture `{path}` cannot be read ({e})"))?;
            out.push(picture.to_rgb8());
        }
        Ok(ToolOutput {
            text,
            pictures: out,
        })
    }

    /// Kills the program (the next call starts it again).
    fn restart(&self) {
        let mut guard = self.process.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut p) = guard.take() {
            p.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tool program in shell: answers `{"text": ...}` with the image count, an error for
    /// `{"fail": true}`, and exits for `{"die": true}`.
    fn program(dir: &std::path::Path) -> Vec<String> {
        let script = dir.join("tool.sh");
        std::fs::write(
            &script,
            "while read -r line; do\n\
               case \"$line\" in\n\
                 *'\"die\":true'*) exit 3 ;;\n\
                 *'\"fail\":true'*) echo '{\"error\": \"Error: no can do\"}' ;;\n\
                 *) n=$(echo \"$line\" | grep -o 'image_[0-9]*.png' | wc -l); echo \"{\\\"text\\\": \\\"saw $n images\\\"}\" ;;\n\
               esac\n\
             done\n",
        )
        .unwrap();
        vec!["sh".into(), script.display().to_string()]
    }

    fn tool(dir: &std::path::Path) -> ExecTool {
        let params: ExecParams = serde_json::from_value(json!({
            "command": program(dir),
            "parameters": {"type": "object", "properties": {"fail": {"type": "boolean"}, "die": {"type": "boolean"}}},
            "timeout_s": 10,
        }))
        .unwrap();
        ExecTool::new("probe", params).unwrap()
    }

    #[test]
    fn answers_errors_and_restarts_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let t = tool(dir.path());
        let pictures = vec![Arc::new(RgbImage::new(4, 4)), Arc::new(RgbImage::new(2, 2))];
        let args = |v: Json| v.as_object().unwrap().clone();
        assert_eq!(
            t.call(&args(json!({})), &pictures).unwrap().text,
            "saw 2 images"
        );
        assert_eq!(
            t.call(&args(json!({"fail": true})), &pictures).unwrap_err(),
            "Error: no can do"
        );
        let died = t.call(&args(json!({"die": true})), &pictures).unwrap_err();
        assert!(died.contains("the tool program"), "{died}");
        // Started again for the next call.
        assert_eq!(
            t.call(&args(json!({})), &pictures[..1]).unwrap().text,
            "saw 1 images"
        );
        let bad = t.call(&args(json!({"fail": 3})), &pictures).unwrap_err();
        assert!(bad.contains("must be of type boolean"), "{bad}");
        let unknown = t.call(&args(json!({"zoom": 1})), &pictures).unwrap_err();
        assert!(unknown.contains("unknown argument `zoom`"), "{unknown}");
    }

    #[test]
    fn declarations_are_checked() {
        let bad = |v: Json| {
            let p: ExecParams = serde_json::from_value(v).unwrap();
            ExecTool::new("t", p).err().unwrap()
        };
        assert!(bad(json!({"command": []})).contains("must name a program"));
        assert!(
            bad(json!({"command": ["x"], "parameters": {"type": "array"}}))
                .contains("type = \"object\"")
        );
        assert!(
            bad(json!({"command": ["x"], "parameters": {"type": "object", "properties": {"a": {}}, "required": ["b"]}}))
                .contains("names `b`")
        );
        assert!(
            bad(json!({"command": ["x"], "parameters": {"type": "object", "properties": {"a": {"type": "float"}}}}))
                .contains("must be one of")
        );
    }
}
