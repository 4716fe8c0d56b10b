//! The `exec` node kind: an external program, in any language, as a node of the graph.
//!
//! ```toml
//! [nodes.reward]
//! kind    = "exec"
//! command = ["python3", "examples/python_reward/reward.py"]
//! inputs  = { rollouts = "rollout.rollouts" }
//! timeout_s = 30
//! restart = "on-failure"
//! max_restarts = 2
//! params  = { format_score = 0.1 }
//! ```
//!
//! The program talks JSON lines over stdin/stdout (docs/exec-protocol.md): it first prints a
//! handshake declaring its name, version, typed ports and parameters; then flowrl sends one
//! request per step and the program answers with its outputs and metrics, or an error.
//!
//! The handshake happens when the graph is compiled ([`NodeKind::instantiate`]), so `flowrl
//! validate` type-checks the wiring and the `params` table against what the program declares,
//! like any built-in kind. The process started for that handshake is kept and becomes the node's
//! process when the run builds the node: the program starts once per run, not per step or item.
//!
//! Failures: every call has a timeout (`timeout_s`; `start_timeout_s` for the handshake). A
//! program that exits, hangs or prints something that is not JSON is a *fault*: its process is
//! killed and, with `restart = "on-failure"`, a new one is started and the same request sent again
//! (at most `max_restarts` times over the run); otherwise the step fails with the node's name, what
//! happened and the tail of the program's stderr. An answer that breaks the contract fails the step
//! at once, without a restart (the program is alive and would answer the same again): an `error`,
//! a missing or undeclared output, a wrong batch size, a non-finite number (`NaN`), and the
//! protocol errors that would otherwise desynchronize the conversation: a line left unread before
//! a request (a second answer), or an answer whose `step` is not the request's. A step is never
//! half-applied: outputs, metrics and warnings are taken only from a complete, fully checked
//! answer.
//!
//! Step numbers: messages count steps from 1 like the progress display; the request's `step` is
//! 0-based, so run-time errors name both (`request "step": 0` is step 1).
//!
//! The program's stderr is kept: its last lines go into error messages, and with a run directory
//! all of it, from the program's start (before its handshake) and from every restart, is appended
//! to `<run dir>/exec/<node>.stderr.log`.
//!
//! Metrics: a Scores output is logged like a built-in reward's (`critic/score/*`,
//! `critic/rewards/*`, `critic/score/<component>/mean`, see `reward_support`); the program's own
//! `metrics` are recorded after those, under the names it gives.
//!
//! Pictures: with `images = true` the prompts' pictures (and those tools returned) are written as
//! PNG files under `<run dir>/exec_images/<node>/` and their paths added to the request's inputs
//! (`images`, `tool_images`), so that a program can judge what the model saw (see `images`).
//!
//! What this module does not do: it does not sandbox the program (it runs with flowrl's rights),
//! and it sends no tensors but the per-token numbers of the text-level views in `wire`.

mod images;
pub(crate) mod process;
mod protocol;
mod wire;

use flowrl_engine::node::NodeTable;
use flowrl_engine::{
    BuildContext, Code, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamChoice, ParamSchema,
    ParamSpec, Params, PortSpec, StepContext, ValidateCtx,
};
use process::{Fault, Process, seconds};
use protocol::{Declared, Hello, Request, Response};
use serde::Deserialize;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wire::OutValue;

pub use protocol::{OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION};

/// The kind's name in graphs.
pub const KIND: &str = "exec";

const DEFAULT_START_TIMEOUT_S: f64 = 30.0;

/// The keys the engine reads in every node table.
const ENGINE_KEYS: &[&str] = &["kind", "inputs", "device", "timing"];

/// `restart = ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ParamChoice)]
#[serde(rename_all = "kebab-case")]
enum Restart {
    Never,
    OnFailure,
}

/// The node table's parameters (the program's own are in `params`). Their specs are
/// [`exec_params`]: these, with `params` typed by the program's handshake once there is one.
#[derive(Debug, Clone, Deserialize, Params)]
struct ExecParams {
    /// the program and its arguments, e.g. ["python3", "reward.py"]; a program name without `/`
    /// is looked up in PATH, relative paths start at the working directory
    #[param(required)]
    command: Vec<String>,
    /// seconds the program may take to answer one step
    #[param(default = 60.0, gt = 0.0)]
    timeout_s: f64,
    /// seconds the program may take to print its handshake after it starts
    #[param(default = DEFAULT_START_TIMEOUT_S, gt = 0.0)]
    start_timeout_s: f64,
    /// on a crash, hang or garbled answer: fail the step (`never`) or start the program again
    /// and resend the request (`on-failure`)
    #[param(default = Restart::Never)]
    restart: Restart,
    /// with `on-failure`: how many restarts are allowed over the whole run
    #[param(default = 3, min = 0.0)]
    max_restarts: u32,
    /// write the prompts' pictures (and those tools returned) as PNG files under the run
    /// directory and send their paths with every Prompts, Rollouts, Scores and Advantages input
    /// (`images`, `tool_images`), for judges that look at the picture
    #[param(default = false)]
    images: bool,
    /// with `images`: keep every step's pictures (by default only the latest step's are kept)
    #[param(default = false)]
    keep_images: bool,
    /// parameters forwarded to the program with every request, checked against the ones it
    /// declares in its handshake
    #[serde(default)]
    params: Json,
}

/// The parameters of every exec node ([`ExecParams`]); `program` is the program's declared
/// parameters (the schema of the `params` table), `None` for the kind before any handshake
/// (`params` is then any value).
fn exec_params(program: Option<&[ParamSpec]>) -> Vec<ParamSpec> {
    let mut specs = ExecParams::param_specs();
    if let Some(fields) = program
        && let Some(any) = specs.pop()
    {
        let mut p = ParamSpec::table(any.name, fields.to_vec()).doc(any.doc);
        if fields.iter().any(|f| f.required) {
            p = p.required();
        } else if fields.iter().all(|f| f.default.is_none()) {
            p = p.default(serde_json::json!({}));
        }
        specs.push(p);
    }
    specs
}

/// The command as shown in messages.
fn show(command: &[String]) -> String {
    command
        .iter()
        .map(|a| {
            if a.is_empty() || a.contains(char::is_whitespace) {
                format!("'{a}'")
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// "\nthe last lines of its stderr:\n  | ..." or "" when it wrote nothing.
fn stderr_text(lines: &[String]) -> String {
    if lines.is_empty() {
        return "\n(it wrote nothing to stderr)".into();
    }
    let mut s = String::from("\nthe last lines of its stderr:");
    for l in lines {
        s.push_str("\n  | ");
        s.push_str(l);
    }
    s
}

/// Starts the program and reads its handshake. Errors say what went wrong (without the node
/// name) and carry the stderr tail.
fn start(command: &[String], node: &str, timeout: Duration) -> Result<(Process, Hello), String> {
    let mut p = Process::spawn(command, node).map_err(|f| f.to_string())?;
    let line = match p.recv(timeout) {
        Ok(line) => line,
        Err(f) => {
            if matches!(f, Fault::Timeout(_)) {
                p.kill();
            }
            let what = match f {
                Fault::Timeout(t) => format!("printed no handshake within {}", seconds(t)),
                other => format!("{other} before its handshake"),
            };
            return Err(format!("{what}{}", stderr_text(&p.stderr_tail())));
        }
    };
    match protocol::parse_hello(&line) {
        Ok(h) => Ok((p, h)),
        Err(e) => {
            p.kill();
            Err(format!("{e}{}", stderr_text(&p.stderr_tail())))
        }
    }
}

/// The `exec` kind as registered: its ports and parameters come from each node's program, so
/// [`NodeKind::instantiate`] replaces it by an [`ExecProgram`] for every exec node.
pub struct Exec;

impl NodeKind for Exec {
    fn name(&self) -> &str {
        KIND
    }
    fn doc(&self) -> &str {
        "Runs an external program (any language) as a node, over JSON lines on stdin/stdout.\n\
         The program declares its typed ports and its parameters in a handshake when the graph is \
         checked, so the wiring and `params` are validated like a built-in node's; it starts once \
         per run and answers one request per step. Protocol: docs/exec-protocol.md."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }
    fn params(&self) -> Vec<ParamSpec> {
        exec_params(None)
    }
    fn instantiate(
        &self,
        node: &NodeTable<'_>,
    ) -> Result<Option<Arc<dyn NodeKind>>, Vec<Diagnostic>> {
        let name = node.name();
        let command: Vec<String> = match node.get("command") {
            None => {
                return Err(vec![
                    node.error("command", format!("exec node `{name}` has no `command`"))
                        .with_help("add `command = [\"program\", \"arg\", ...]`"),
                ]);
            }
            Some(v) => match serde_json::from_value::<Vec<String>>(v) {
                Ok(c) if !c.is_empty() => c,
                _ => {
                    return Err(vec![
                        node.error(
                            "command",
                            format!(
                                "`command` of exec node `{name}` must be a non-empty array of strings"
                            ),
                        )
                        .with_help("e.g. `command = [\"python3\", \"reward.py\"]`"),
                    ]);
                }
            },
        };
        let timeout = node
            .get("start_timeout_s")
            .and_then(|v| v.as_f64())
            .filter(|t| t.is_finite() && *t > 0.0)
            .unwrap_or(DEFAULT_START_TIMEOUT_S);
        let cmd = show(&command);
        let (process, hello) = start(&command, name, Duration::from_secs_f64(timeout))
            .map_err(|e| vec![node.error("command", format!("exec node `{name}`: `{cmd}` {e}"))])?;
        let declared = protocol::check_hello(&hello).map_err(|errs| {
            errs.into_iter()
                .map(|e| {
                    node.error(
                        "command",
                        format!("exec node `{name}`: program `{}` (`{cmd}`) {e}", hello.name),
                    )
                })
                .collect::<Vec<_>>()
        })?;
        // A program parameter written at the node's top level instead of inside `params`.
        let own: Vec<String> = exec_params(None).into_iter().map(|p| p.name).collect();
        let misplaced: Vec<Diagnostic> = hello
            .params
            .iter()
            .filter(|d| !own.contains(&d.name) && !ENGINE_KEYS.contains(&d.name.as_str()))
            .filter_map(|d| node.get(&d.name).map(|v| (d, v)))
            .map(|(d, v)| {
                node.error(
                    &d.name,
                    format!(
                        "`{}` is a parameter of exec node `{name}`'s program, not of the node",
                        d.name
                    ),
                )
                .with_help(format!(
                    "program parameters go in the `params` table: `params = {{ {} = {v} }}`",
                    d.name
                ))
            })
            .collect();
        if !misplaced.is_empty() {
            return Err(misplaced);
        }
        let summary = if hello.doc.is_empty() {
            format!("External program `{}` {}.", hello.name, hello.version)
        } else {
            hello.doc.clone()
        };
        let doc = format!(
            "{summary}\n(exec node: program `{}` version {}, command `{cmd}`)",
            hello.name, hello.version
        );
        Ok(Some(Arc::new(ExecProgram {
            command,
            hello,
            declared,
            doc,
            probe: Mutex::new(Some(process)),
        })))
    }
    fn build(&self, _: &Params, ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        anyhow::bail!(
            "exec node `{}` was not instantiated from its program's handshake",
            ctx.node
        )
    }
}

flowrl_engine::register_node_kind!(Exec);

/// The `exec` kind specialized for one node: the ports and parameters its program declared. It
/// holds the process started for the handshake until the node is built.
pub struct ExecProgram {
    command: Vec<String>,
    hello: Hello,
    declared: Declared,
    doc: String,
    probe: Mutex<Option<Process>>,
}

impl NodeKind for ExecProgram {
    fn name(&self) -> &str {
        KIND
    }
    fn doc(&self) -> &str {
        &self.doc
    }
    fn inputs(&self) -> Vec<PortSpec> {
        self.declared.inputs.clone()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        self.declared.outputs.clone()
    }
    fn params(&self) -> Vec<ParamSpec> {
        exec_params(Some(&self.declared.params))
    }
    /// A protocol-1 program still runs, with a warning (W0502) at `command`; `images` on a node
    /// whose inputs carry no pictures, and `keep_images` without `images`, are warnings (W0501).
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let mut warnings = Vec::new();
        let flag = |key: &str| ctx.params().get(key).and_then(Json::as_bool) == Some(true);
        let takes_pictures = self
            .declared
            .inputs
            .iter()
            .any(|s| wire::has_pictures(s.ty));
        if flag("images") && !takes_pictures {
            warnings.push(ctx.warning(
                "images",
                format!(
                    "exec node `{}`: `images = true`, but program `{}` takes no input of type \
                     Prompts, Rollouts, Scores or Advantages, so no picture is sent",
                    ctx.name(),
                    self.hello.name
                ),
            ));
        }
        if flag("keep_images") && !flag("images") {
            warnings.push(ctx.warning(
                "keep_images",
                format!(
                    "exec node `{}`: `keep_images` does nothing without `images = true`",
                    ctx.name()
                ),
            ));
        }
        if self.hello.protocol >= PROTOCOL_VERSION {
            return warnings;
        }
        let msg = format!(
            "exec node `{}`: program `{}` speaks protocol {}, whose answers do not carry the \
             request's `step`, so a stale answer cannot always be told from a fresh one",
            ctx.name(),
            self.hello.name,
            self.hello.protocol
        );
        warnings.push(
            Diagnostic::warning(Code::Deprecated, msg)
                .at(ctx.span_of("command"))
                .with_help(format!(
                    "declare \"protocol\": {PROTOCOL_VERSION} in the handshake and echo the \
                     request's `step` in every answer (docs/exec-protocol.md)"
                )),
        );
        warnings
    }
    fn build(&self, params: &Params, ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let p: ExecParams = params.parse()?;
        let process = self
            .probe
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .filter(|_| p.command == self.command);
        let params = if p.params.is_null() {
            Json::Object(Default::default())
        } else {
            p.params.clone()
        };
        let carrier = self
            .declared
            .inputs
            .iter()
            .find(|s| !s.optional && wire::carries_rollouts(s.ty))
            .map(|s| s.name.clone());
        let stderr_log = ctx
            .run_dir
            .as_ref()
            .map(|d| d.join("exec").join(format!("{}.stderr.log", ctx.node)));
        if let (Some(p), Some(path)) = (&process, &stderr_log) {
            p.log_stderr_to(path)?;
        }
        let images = if p.images {
            let folder = images::ImageFolder::new(ctx.run_dir.as_deref(), &ctx.node, p.keep_images)
                .map_err(|e| anyhow::anyhow!("exec node `{}`: {e}", ctx.node))?;
            Some(folder)
        } else {
            None
        };
        Ok(Box::new(ExecNode {
            node: ctx.node.clone(),
            stderr_log,
            cmd: show(&p.command),
            p,
            params,
            hello: self.hello.clone(),
            outputs: self.declared.outputs.clone(),
            carrier,
            process,
            restarts: 0,
            answered: None,
            images,
        }))
    }
}

/// A running exec node.
struct ExecNode {
    node: String,
    /// `<run dir>/exec/<node>.stderr.log`, when the run has a directory.
    stderr_log: Option<std::path::PathBuf>,
    cmd: String,
    p: ExecParams,
    /// The `params` table sent with every request.
    params: Json,
    hello: Hello,
    outputs: Vec<PortSpec>,
    /// The input whose batch of responses the outputs are attached to.
    carrier: Option<String>,
    process: Option<Process>,
    restarts: u32,
    /// The `step` of the last request the current process answered (`None` since its start).
    answered: Option<u64>,
    /// Where the inputs' pictures are written, with `images = true`.
    images: Option<images::ImageFolder>,
}

/// Why a call failed.
enum CallError {
    /// The process is unusable (exited, hung, garbled); a restart may help.
    Fault(String),
    /// The program answered but broke the contract, or cannot be started as validated.
    Fatal(String),
}

impl ExecNode {
    /// A run-time error of the request with `step` (0-based, named as on the wire).
    fn fail(&self, step: u64, what: impl std::fmt::Display) -> anyhow::Error {
        anyhow::anyhow!(
            "exec node `{}` (`{}`, request `\"step\": {step}`): {what}",
            self.node,
            self.cmd
        )
    }

    /// Starts the program (again) and checks that it declares what was validated.
    fn restart_process(&mut self) -> Result<(), CallError> {
        let timeout = Duration::from_secs_f64(self.p.start_timeout_s);
        let (process, hello) = start(&self.p.command, &self.node, timeout)
            .map_err(|e| CallError::Fault(format!("the program {e}")))?;
        if hello != self.hello {
            return Err(CallError::Fatal(format!(
                "the program's handshake changed since the graph was checked (now `{}` {}); \
                 check the graph again",
                hello.name, hello.version
            )));
        }
        if let Some(path) = &self.stderr_log {
            process
                .log_stderr_to(path)
                .map_err(|e| CallError::Fatal(format!("cannot write {}: {e}", path.display())))?;
        }
        self.process = Some(process);
        self.answered = None;
        Ok(())
    }

    /// The protocol error for a line the program wrote that no request asked for.
    fn unread_line_error(&self, line: &str) -> String {
        let quoted = protocol::excerpt(line);
        let Some(prev) = self.answered else {
            return format!(
                "the program wrote a second line after its handshake, before any request: \
                 `{quoted}`; it must write one line per request and nothing else on stdout"
            );
        };
        let same_step = serde_json::from_str::<Json>(line)
            .ok()
            .and_then(|j| j.get("step").and_then(Json::as_u64))
            == Some(prev);
        if same_step {
            format!(
                "the program answered step {} twice (a second line with `\"step\": {prev}`: \
                 `{quoted}`); it must write exactly one answer line per request",
                prev + 1
            )
        } else {
            format!(
                "the program wrote an extra line after its answer to step {} (`\"step\": \
                 {prev}`): `{quoted}`; it must write exactly one answer line per request (logs \
                 belong on stderr)",
                prev + 1
            )
        }
    }

    /// Checks that an answer is the answer to the request of `step` (protocol 2: it echoes the
    /// request's `step`; protocol 1 answers may omit it).
    fn check_step(&self, r: &Response, step: u64) -> Result<(), String> {
        match r.step {
            Some(s) if s == step => Ok(()),
            Some(s) if Some(s) == self.answered => Err(format!(
                "the program answered step {} twice: the answer read for step {} (`\"step\": \
                 {step}`) carries `\"step\": {s}`; it must write exactly one answer line per \
                 request",
                s + 1,
                step + 1
            )),
            Some(s) => Err(format!(
                "the program's answer carries `\"step\": {s}`, but the request was `\"step\": \
                 {step}` (step {}); each answer must echo its request's `step`",
                step + 1
            )),
            None if self.hello.protocol < 2 || r.error.is_some() => Ok(()),
            None => Err(format!(
                "the program's answer to step {} has no `step`: protocol 2 answers echo the \
                 request's, e.g. `{{\"step\": {step}, \"outputs\": {{..}}}}`",
                step + 1
            )),
        }
    }

    /// Sends the request line of `step` (0-based) and reads its one answer line. Before the
    /// request, no line may be left unread; the answer must be the request's (its `step`).
    fn call(&mut self, line: &str, step: u64) -> Result<Response, CallError> {
        if self.process.is_none() {
            self.restart_process()?;
        }
        let shown = step + 1;
        let timeout = Duration::from_secs_f64(self.p.timeout_s);
        if let Some(extra) = self.process.as_mut().expect("started").unread_line() {
            return Err(CallError::Fatal(self.unread_line_error(&extra)));
        }
        let proc = self.process.as_mut().expect("started");
        let answer = proc.send(line).and_then(|_| proc.recv(timeout));
        let fault = match answer {
            Ok(answer) => match serde_json::from_str::<Json>(&answer) {
                Ok(json) => {
                    let r = serde_json::from_value::<Response>(json).map_err(|e| {
                        CallError::Fatal(format!(
                            "the program answered step {shown} with an invalid response ({e}): \
                             `{}`; expected `{{\"step\": {step}, \"outputs\": {{..}}, \
                             \"metrics\": {{..}}}}` or `{{\"step\": {step}, \"error\": \"..\"}}`",
                            protocol::excerpt(&answer)
                        ))
                    })?;
                    self.check_step(&r, step).map_err(CallError::Fatal)?;
                    self.answered = Some(step);
                    return Ok(r);
                }
                Err(e) => {
                    if let Some((token, at)) = protocol::non_finite_number(&answer) {
                        return Err(CallError::Fatal(format!(
                            "the program answered step {shown} with {token} at `{at}`: scores, \
                             metrics and every other number in an answer must be finite (JSON \
                             has no NaN or Infinity; Python's json.dumps writes them for \
                             float('nan') and float('inf'))"
                        )));
                    }
                    format!(
                        "answered step {shown} with a line that is not JSON ({e}): `{}`; logs \
                         belong on stderr",
                        protocol::excerpt(&answer)
                    )
                }
            },
            Err(Fault::Timeout(t)) => format!("did not answer step {shown} within {}", seconds(t)),
            Err(f) => format!("{f} while handling step {shown}"),
        };
        let mut proc = self.process.take().expect("started");
        proc.kill();
        Err(CallError::Fault(format!(
            "the program {fault}{}",
            stderr_text(&proc.stderr_tail())
        )))
    }
}

impl Node for ExecNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        let step = ctx.step();
        if let Some(folder) = self.images.as_mut() {
            let begun = folder.begin(step);
            begun.map_err(|e| self.fail(step, format!("the step's pictures: {e}")))?;
        }
        let mut sent = BTreeMap::new();
        for (port, value) in inputs.iter() {
            let mut json =
                wire::to_json(value).map_err(|e| self.fail(step, format!("input `{port}` {e}")))?;
            if let Some(folder) = self.images.as_mut() {
                let added = wire::add_images(value, &mut json, folder);
                added.map_err(|e| self.fail(step, format!("pictures of input `{port}`: {e}")))?;
            }
            sent.insert(port.to_string(), json);
        }
        let line = serde_json::to_string(&Request {
            step,
            params: &self.params,
            inputs: sent,
        })?;
        // This step's restarts, for the error when the step fails anyway (its warnings are lost).
        let mut restarted: Vec<String> = Vec::new();
        let earlier = |restarted: &[String]| {
            if restarted.is_empty() {
                String::new()
            } else {
                format!("\n(earlier in this step: {})", restarted.join("; "))
            }
        };
        let response = loop {
            match self.call(&line, step) {
                Ok(r) => break r,
                Err(CallError::Fatal(e)) => {
                    return Err(self.fail(step, format!("{e}{}", earlier(&restarted))));
                }
                Err(CallError::Fault(e)) => {
                    let allowed =
                        self.p.restart == Restart::OnFailure && self.restarts < self.p.max_restarts;
                    if !allowed {
                        let hint = match self.p.restart {
                            Restart::Never => {
                                "\n(restart = \"never\": the run stops here)".to_string()
                            }
                            Restart::OnFailure => format!(
                                "\n(all {} restarts allowed by max_restarts are used)",
                                self.p.max_restarts
                            ),
                        };
                        return Err(self.fail(step, format!("{e}{hint}{}", earlier(&restarted))));
                    }
                    self.restarts += 1;
                    let what = e.lines().next().unwrap_or_default();
                    let n = format!("{} of {} restarts", self.restarts, self.p.max_restarts);
                    ctx.warn(format!(
                        "exec node `{}`: {what}; restarting it ({n})",
                        self.node
                    ));
                    restarted.push(format!("{what}; restarted it ({n})"));
                }
            }
        };
        self.apply(response, inputs, ctx)
            .map_err(|e| self.fail(step, format!("step {}: {e}", step + 1)))
    }
}

impl ExecNode {
    /// Checks a whole answer, then records it: nothing is applied unless everything is valid.
    fn apply(
        &self,
        r: Response,
        inputs: &Inputs,
        ctx: &mut StepContext,
    ) -> Result<Outputs, String> {
        if let Some(e) = r.error {
            return Err(format!("the program reported an error: {e}"));
        }
        let Some(mut values) = r.outputs else {
            return Err("the program answered with neither `outputs` nor `error`".into());
        };
        let mut metrics = Vec::new();
        for (name, v) in r.metrics {
            match v.as_f64().filter(|x| x.is_finite()) {
                Some(x) => metrics.push((name, x)),
                None => return Err(format!("metric `{name}` is not a finite number: {v}")),
            }
        }
        if let Some(extra) = values
            .keys()
            .find(|k| !self.outputs.iter().any(|o| &o.name == *k))
        {
            let declared: Vec<&str> = self.outputs.iter().map(|o| o.name.as_str()).collect();
            return Err(format!(
                "the program returned output `{extra}`, which it did not declare (declared: {})",
                if declared.is_empty() {
                    "none".to_string()
                } else {
                    declared.join(", ")
                }
            ));
        }
        let batch = match &self.carrier {
            Some(port) => inputs.value(port).and_then(wire::rollouts_of),
            None => None,
        };
        let mut out = Outputs::new();
        let mut out_values = Vec::new();
        for spec in &self.outputs {
            let Some(json) = values.remove(&spec.name) else {
                return Err(format!(
                    "the program did not return output `{}` ({})",
                    spec.name, spec.ty
                ));
            };
            let batch = batch.as_ref().ok_or_else(|| {
                format!(
                    "no batch of responses on input to attach `{}` to",
                    spec.name
                )
            })?;
            let v = wire::from_json(spec.ty, json, batch)
                .map_err(|e| format!("output `{}` {e}", spec.name))?;
            out_values.push((spec.name.clone(), v));
        }
        for (_, v) in &out_values {
            if let OutValue::Scores(s) = v {
                crate::kinds::reward::support::log_score_metrics(ctx, s);
            }
        }
        for (port, v) in out_values {
            out = match v {
                OutValue::Scores(s) => out.with(port, s),
                OutValue::Advantages(a) => out.with(port, a),
                OutValue::LogProbs(l) => out.with(port, l),
            };
        }
        for (name, x) in metrics {
            ctx.metric(&name, x);
        }
        for w in r.warnings {
            ctx.warn(format!("exec node `{}`: {w}", self.node));
        }
        Ok(out)
    }
}
