//! `repeat`: a loop node running other nodes on demand within one step — the runs, what the rest
//! of the graph sees, call arguments, and every rule the compiler checks.

mod testkit;

use flowrl_engine::*;
use serde::Deserialize;
use testkit::NUMBERS;

/// Emits `[calls]` on `n` (its call count over the run, kept in its state) and `[7]` on `side`.
struct Counter;
impl NodeKind for Counter {
    fn name(&self) -> &str {
        "test.counter"
    }
    fn doc(&self) -> &str {
        "call counter"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("n", NUMBERS), PortSpec::new("side", NUMBERS)]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(CounterNode(0)))
    }
}
struct CounterNode(u64);
impl Node for CounterNode {
    fn run(&mut self, _: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        use rand::Rng;
        self.0 += 1;
        ctx.metric("counter/calls", self.0 as f64);
        let draw = ctx.rng().random::<f64>();
        ctx.metric("counter/draw", draw);
        Ok(Outputs::new()
            .with("n", vec![self.0 as f64])
            .with("side", vec![7.0]))
    }
}

/// Runs its `repeat` until the values it received sum to `target` or more; emits them.
struct Until;
#[derive(Deserialize)]
struct UntilP {
    target: f64,
}
impl NodeKind for Until {
    fn name(&self) -> &str {
        "test.until"
    }
    fn doc(&self) -> &str {
        "repeat until a sum"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("n", NUMBERS).repeated()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("seen", NUMBERS)]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![ParamSpec::float("target").default(1.0)]
    }
    fn build(&self, p: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let p: UntilP = p.parse()?;
        Ok(Box::new(UntilNode(p.target)))
    }
}
struct UntilNode(f64);
impl Node for UntilNode {
    fn run(&mut self, _: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        let mut seen = Vec::new();
        while seen.iter().sum::<f64>() < self.0 {
            let got = ctx.repeat()?.run(Outputs::new())?;
            seen.extend(got.get::<Vec<f64>>("n")?.iter().copied());
        }
        let runs = ctx.repeat()?.runs();
        ctx.metric("until/runs", runs as f64);
        Ok(Outputs::new().with("seen", seen))
    }
}

/// Hands `[k]` for k = 1..=3 to its repeated nodes and collects what comes back on `y`.
struct Caller;
impl NodeKind for Caller {
    fn name(&self) -> &str {
        "test.caller"
    }
    fn doc(&self) -> &str {
        "calls its repeat with arguments"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("y", NUMBERS).repeated()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![
            PortSpec::new("x", NUMBERS).argument(),
            PortSpec::new("ys", NUMBERS),
        ]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(CallerNode))
    }
}
struct CallerNode;
impl Node for CallerNode {
    fn run(&mut self, _: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        let mut ys: Vec<f64> = Vec::new();
        for k in 1..=3 {
            let got = ctx
                .repeat()?
                .run(Outputs::new().with("x", vec![k as f64]))?;
            ys.extend(got.get::<Vec<f64>>("y")?.iter().copied());
        }
        Ok(Outputs::new().with("ys", ys))
    }
}

/// Passes its numbers on, and panics on its second call.
struct Boom;
impl NodeKind for Boom {
    fn name(&self) -> &str {
        "test.boom"
    }
    fn doc(&self) -> &str {
        "panics on its second call"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("a", NUMBERS)]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![PortSpec::new("sum", NUMBERS)]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        Ok(Box::new(BoomNode(0)))
    }
}
struct BoomNode(u32);
impl Node for BoomNode {
    fn run(&mut self, i: &Inputs, _: &mut StepContext) -> anyhow::Result<Outputs> {
        self.0 += 1;
        assert!(self.0 < 2, "boom at call {}", self.0);
        Ok(Outputs::new().with("sum", i.get::<Vec<f64>>("a")?.clone()))
    }
}

fn registry() -> Registry {
    testkit::registry()
        .with_kind(Boom)
        .with_kind(Counter)
        .with_kind(Until)
        .with_kind(Caller)
}

fn compile_ok(text: &str) -> Graph {
    testkit::graph(&registry(), text, &[])
}

fn compile_err(text: &str) -> String {
    testkit::errors(&registry(), text, &[]).1
}

/// counter → add (doubling) → until, which repeats both; `after` reads the counter's side output
/// and `total` the loop's.
const LOOP: &str = r#"
[nodes.counter]
kind = "test.counter"
[nodes.double]
kind = "test.add"
inputs = { a = "counter.n", b = "counter.n" }
[nodes.until]
kind = "test.until"
repeat = ["counter", "double"]
inputs = { n = "double.sum" }
target = 5.0
[nodes.after]
kind = "test.add"
inputs = { a = "counter.side" }
[nodes.total]
kind = "test.add"
inputs = { a = "until.seen" }
"#;

#[test]
fn a_loop_node_runs_its_repeat_until_it_is_done() {
    let g = compile_ok(LOOP);
    let mut s = Session::build(g, None, None).unwrap();
    // Step 1: the counter gives 1, 2 → doubled 2, 4 → sum 6 ≥ 5 after two runs.
    let r = s.run_step(0, &mut |_| {}).unwrap();
    assert_eq!(r.metrics["until/runs"], 2.0);
    assert_eq!(r.metrics["counter/calls"], 2.0, "the last run's metrics");
    assert_eq!(
        node_metric(&r, "total", "add/sum"),
        6.0,
        "`total` sees the loop's output"
    );
    assert_eq!(
        node_metric(&r, "after", "add/sum"),
        7.0,
        "`after` sees the counter's side"
    );
    // The counter's state carries over: step 2 starts at 3 → doubled 6 ≥ 5 in one run.
    let r = s.run_step(1, &mut |_| {}).unwrap();
    assert_eq!(r.metrics["until/runs"], 1.0);
    assert_eq!(r.metrics["counter/calls"], 3.0);
    let mut names: Vec<&str> = r.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names[..3], ["counter", "double", "until"]);
    names.sort();
    assert_eq!(names, ["after", "counter", "double", "total", "until"]);
    assert!(r.nodes.iter().all(|n| !n.skipped));
}

#[test]
fn a_repeated_node_keeps_one_random_stream_per_step() {
    let g = compile_ok(&LOOP.replace("target = 5.0", "target = 20.0"));
    let mut s = Session::build(g, None, None).unwrap();
    // 2 + 4 + 6 + 8 = 20: four runs; their draws differ (one stream), and the step's last draw
    // is reproducible from the seed.
    let first = s.run_step(0, &mut |_| {}).unwrap();
    assert_eq!(first.metrics["until/runs"], 4.0);
    let g = compile_ok(&LOOP.replace("target = 5.0", "target = 2.0"));
    let mut one = Session::build(g, None, None).unwrap();
    let single = one.run_step(0, &mut |_| {}).unwrap();
    assert_ne!(
        first.metrics["counter/draw"],
        single.metrics["counter/draw"]
    );
}

#[test]
fn repeated_nodes_time_on_their_own_key() {
    let g = compile_ok(LOOP);
    let mut s = Session::build(g, None, None).unwrap();
    let r = s.run_step(0, &mut |_| {}).unwrap();
    for key in ["counter", "double", "until"] {
        assert!(r.metrics[&format!("timing_s/{key}")] >= 0.0);
    }
}

#[test]
fn a_loop_node_hands_arguments_to_its_repeat() {
    let g = compile_ok(
        r#"
[nodes.one]
kind = "test.counter"
[nodes.plus]
kind = "test.add"
inputs = { a = "caller.x", b = "one.side" }
[nodes.caller]
kind = "test.caller"
repeat = ["plus"]
inputs = { y = "plus.sum" }
[nodes.total]
kind = "test.add"
inputs = { a = "caller.ys" }
"#,
    );
    let mut s = Session::build(g, None, None).unwrap();
    let r = s.run_step(0, &mut |_| {}).unwrap();
    // (1 + 7) + (2 + 7) + (3 + 7), and `one` ran once, before the caller.
    assert_eq!(node_metric(&r, "total", "add/sum"), 27.0);
    assert_eq!(r.metrics["counter/calls"], 1.0);
}

/// The value of `key` that node `node` reported this step.
fn node_metric(r: &StepReport, node: &str, key: &str) -> f64 {
    let n = r
        .nodes
        .iter()
        .find(|n| n.name == node)
        .expect("node reported");
    n.metrics
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .expect("metric")
        .1
}

#[test]
fn a_failing_repeated_node_names_itself_its_run_and_its_loop() {
    let g = compile_ok(&LOOP.replace(
        "kind = \"test.add\"\ninputs = { a = \"counter.n\", b = \"counter.n\" }",
        "kind = \"test.boom\"\ninputs = { a = \"counter.n\" }",
    ));
    let mut s = Session::build(g, None, None).unwrap();
    let e = format!("{:#}", s.run_step(0, &mut |_| {}).unwrap_err());
    assert_has(
        &e,
        &[
            "node `until` (kind `test.until`) failed at step 1",
            "node `double` (kind `test.boom`) failed in run 2 of `until`'s repeat at step 1",
            "panicked on cpu:0: boom at call 2",
        ],
    );
    // The nodes came back: the session can still checkpoint every node's state.
    let dir = tempfile::tempdir().unwrap();
    s.save_checkpoint(&dir.path().join("step-1"), 1).unwrap();
}

fn assert_has(rendered: &str, parts: &[&str]) {
    for p in parts {
        assert!(rendered.contains(p), "missing {p:?} in:\n{rendered}");
    }
}

#[test]
fn repeat_belongs_to_kinds_with_repeated_inputs() {
    let e = compile_err(
        "[nodes.c]\nkind = \"test.counter\"\n[nodes.a]\nkind = \"test.add\"\nrepeat = [\"c\"]\ninputs = { a = \"c.n\" }\n",
    );
    assert_has(
        &e,
        &[
            "error[E0402]",
            "node `a` (kind `test.add`) cannot repeat nodes",
        ],
    );
}

#[test]
fn a_repeated_input_must_come_from_the_repeat() {
    let e = compile_err(&LOOP.replace(
        "repeat = [\"counter\", \"double\"]",
        "repeat = [\"counter\"]",
    ));
    assert_has(
        &e,
        &[
            "error[E0402]",
            "`until.n` takes a new value from each run of the nodes `until` repeats, but `double` is not in its `repeat` list",
            "add `double`",
        ],
    );
}

#[test]
fn outputs_on_the_way_into_the_loop_are_read_through_it() {
    let e = compile_err(&LOOP.replace(
        "inputs = { a = \"counter.side\" }",
        "inputs = { a = \"double.sum\" }",
    ));
    assert_has(
        &e,
        &[
            "error[E0402]",
            "`after.a` reads `double.sum`, which `until` repeats on its way into `until`; it would see only the last run",
            "read it through `until`: `until.seen`",
        ],
    );
}

#[test]
fn every_listed_node_feeds_the_loop_and_names_are_checked() {
    let text = format!("{LOOP}[nodes.idle]\nkind = \"test.counter\"\n").replace(
        "repeat = [\"counter\", \"double\"]",
        "repeat = [\"counter\", \"double\", \"idle\", \"dubble\"]",
    );
    let e = compile_err(&text);
    assert_has(
        &e,
        &[
            "`repeat` lists `idle`, which feeds none of `until`'s repeated inputs",
            "error[E0302]",
            "node `until` repeats unknown node `dubble`",
            "did you mean `double`?",
        ],
    );
}

#[test]
fn arguments_go_to_the_repeat_only_and_a_node_has_one_loop() {
    let text = r#"
[nodes.one]
kind = "test.counter"
[nodes.plus]
kind = "test.add"
inputs = { a = "caller.x" }
[nodes.caller]
kind = "test.caller"
repeat = ["plus"]
inputs = { y = "plus.sum" }
[nodes.stray]
kind = "test.add"
inputs = { a = "caller.x" }
[nodes.second]
kind = "test.caller"
repeat = ["plus"]
inputs = { y = "plus.sum" }
"#;
    let e = compile_err(text);
    assert_has(
        &e,
        &[
            "`caller.x` is handed only to the nodes `caller` repeats, and `stray` is not one of them",
            "`plus` is already repeated by `caller`; a node is repeated by at most one node",
        ],
    );
}

#[test]
fn flowrl_nodes_marks_repeated_inputs_and_arguments() {
    let page = flowrl_engine::cli::describe_kind(&Caller);
    assert_has(
        &page,
        &[
            "y : Numbers, repeated (from the nodes in `repeat`)",
            "x : Numbers, argument (handed to the nodes in `repeat`)",
            "repeat = [\"node\", ...]",
        ],
    );
}
