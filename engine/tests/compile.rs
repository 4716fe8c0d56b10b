//! The compiler's checks, one per diagnostic code, on graphs of test-only kinds.

mod testkit;

use flowrl_engine::{Code, Override, compile};

fn errors(text: &str, overrides: &[&str]) -> (Vec<(Code, String)>, String) {
    testkit::errors(&testkit::registry(), text, overrides)
}

const GOOD: &str = testkit::good_graph!();

#[test]
fn good_graph_compiles_with_defaults_and_order() {
    let (g, warnings) = compile(&testkit::registry(), "g.toml", GOOD, &[]).unwrap();
    assert!(warnings.is_empty());
    assert_eq!(g.nodes.len(), 4);
    let src = &g.nodes[g.node_id("src").unwrap()];
    assert_eq!(src.params.get_f64("scale"), Some(1.0));
    assert_eq!(src.params.get_str("mode"), Some("uniform"));
    assert_eq!(src.params.get_f64("opts.coef"), Some(0.5));
    assert_eq!(src.timing_key, "gen");
    assert_eq!(g.nodes[g.node_id("add").unwrap()].timing_key, "add");
    let pos = |n: &str| g.order.iter().position(|&i| g.nodes[i].name == n).unwrap();
    assert!(pos("src") < pos("add") && pos("add") < pos("score"));
    assert_eq!(g.resources.len(), 2);
    assert_eq!(g.resources[1].depends, vec![0]);
    assert!(g.resolved.contains("[nodes.src]"));
}

#[test]
fn syntax_error_points_at_line() {
    let (e, text) = errors("[run]\nsteps = = 3\n", &[]);
    assert_eq!(e[0].0, Code::Syntax);
    assert!(text.contains("--> g.toml:2:"), "{text}");
}

#[test]
fn unknown_kind_key_section_with_did_you_mean_all_at_once_sorted() {
    let g = GOOD
        .replace("kind = \"test.add\"", "kind = \"test.ad\"")
        .replace("count = 4", "cuont = 4")
        .replace("[run]", "[rnu]");
    let (e, text) = errors(&g, &[]);
    let codes: Vec<Code> = e.iter().map(|x| x.0).collect();
    assert_eq!(
        codes,
        vec![Code::UnknownSection, Code::UnknownKey, Code::UnknownKind],
        "{text}"
    );
    assert!(text.contains("help: did you mean `run`?"), "{text}");
    assert!(
        text.contains("unknown key `cuont` in node `src` (kind `test.source`)"),
        "{text}"
    );
    assert!(text.contains("help: did you mean `count`?"), "{text}");
    assert!(text.contains("unknown node kind `test.ad`"), "{text}");
    assert!(text.contains("help: did you mean `test.add`?"), "{text}");
    assert!(text.ends_with("3 errors found\n"), "{text}");
}

#[test]
fn wrong_type_range_enum_and_nested_table() {
    let g = GOOD.replace(
        "count = 4",
        "count = \"four\"\nscale = 0\nmode = \"normul\"\nopts = { coef = -1, extra = 2 }",
    );
    let (e, text) = errors(&g, &[]);
    let codes: Vec<Code> = e.iter().map(|x| x.0).collect();
    assert_eq!(
        codes,
        vec![
            Code::WrongType,
            Code::OutOfRange,
            Code::InvalidValue,
            Code::OutOfRange,
            Code::UnknownKey
        ],
        "{text}"
    );
    assert!(
        text.contains("`count` must be an integer, found a string"),
        "{text}"
    );
    assert!(text.contains("`scale` must be > 0, got 0"), "{text}");
    assert!(text.contains("did you mean `normal`?"), "{text}");
    assert!(text.contains("`opts.coef` must be >= 0, got -1"), "{text}");
    assert!(text.contains("unknown key `opts.extra`"), "{text}");
}

#[test]
fn missing_required_param_and_unknown_resource() {
    let g = GOOD
        .replace("model = \"policy\"\n", "")
        .replace("from = \"policy\"", "from = \"polcy\"");
    let (e, text) = errors(&g, &[]);
    assert!(
        e.contains(&(
            Code::MissingParam,
            "node `train` (kind `test.train`) is missing required parameter `model`".into()
        )),
        "{text}"
    );
    assert!(
        e.contains(&(
            Code::UnknownResource,
            "unknown model resource `polcy`".into()
        )),
        "{text}"
    );
    assert!(text.contains("did you mean `policy`?"), "{text}");
}

#[test]
fn ports_unknown_node_unknown_output_mismatch_missing_input() {
    let g = GOOD
        .replace("inputs = { a = \"src.n\" }", "inputs = { bb = \"src.n\" }")
        .replace(
            "inputs = { n = \"add.sum\" }",
            "inputs = { n = \"ad.sum\" }",
        )
        .replace("inputs = { n = \"src.n\" }", "inputs = { n = \"src.m\" }")
        + "\n[nodes.sink]\nkind = \"test.sink\"\ninputs = { scores = \"src.n\" }\n";
    let (e, text) = errors(&g, &[]);
    let codes: Vec<Code> = e.iter().map(|x| x.0).collect();
    assert_eq!(
        codes,
        vec![
            Code::MissingInput,
            Code::UnknownPort,
            Code::UnknownNode,
            Code::UnknownOutput,
            Code::PortTypeMismatch
        ],
        "{text}"
    );
    assert!(
        text.contains("node `add` (kind `test.add`) has no input port `bb`"),
        "{text}"
    );
    assert!(
        text.contains("needs input `a` (Numbers), which is not wired"),
        "{text}"
    );
    assert!(text.contains("wired to unknown node `ad`"), "{text}");
    assert!(text.contains("did you mean `add`?"), "{text}");
    assert!(text.contains("has no output port `m`"), "{text}");
    assert!(
        text.contains("`sink.scores` expects Scores, got Numbers from `src.n`"),
        "{text}"
    );
    assert!(
        text.contains("`src` (kind `test.source`) is defined here"),
        "{text}"
    );
}

#[test]
fn cycle_is_printed_as_whole_chain() {
    let g = r#"
[nodes.a]
kind = "test.add"
inputs = { a = "c.sum" }
[nodes.b]
kind = "test.add"
inputs = { a = "a.sum" }
[nodes.c]
kind = "test.add"
inputs = { a = "b.sum" }
[nodes.self]
kind = "test.add"
inputs = { a = "self.sum" }
"#;
    let (e, text) = errors(g, &[]);
    assert!(
        e.contains(&(Code::Cycle, "cycle in the graph: a → b → c → a".into())),
        "{text}"
    );
    assert!(
        e.contains(&(Code::Cycle, "cycle in the graph: self → self".into())),
        "{text}"
    );
    assert!(text.contains("`b.a` takes `a.sum`"), "{text}");
}

#[test]
fn kind_constraint_reports_numbers() {
    let (e, text) = errors(&GOOD.replace("micro = 2", "micro = 3"), &[]);
    assert_eq!(
        e,
        vec![(
            Code::Constraint,
            "count 4 of `src` is not divisible by micro = 3".into()
        )],
        "{text}"
    );
    assert!(text.contains("--> g.toml:22:9"), "{text}");
}

#[test]
fn overrides_are_checked_and_point_at_the_argument() {
    let (e, text) = errors(GOOD, &["nodes.src.count=0", "nodes.src.count.x=1", "nope"]);
    assert_eq!(e.len(), 3, "{text}");
    assert!(text.contains("--> --set #1:1:17"), "{text}");
    assert!(text.contains("`count` must be >= 1, got 0"), "{text}");
    assert!(
        text.contains(
            "cannot set `nodes.src.count.x`: `nodes.src.count` is an integer, not a table"
        ),
        "{text}"
    );
    assert!(text.contains("`--set nope` has no `=`"), "{text}");
    // A valid override changes the graph.
    let (g, _) = compile(
        &testkit::registry(),
        "g.toml",
        GOOD,
        &Override::sets(&["nodes.src.count=8".into()]),
    )
    .unwrap();
    assert_eq!(g.nodes[0].params.get_i64("count"), Some(8));
}

#[test]
fn run_section_device_is_checked() {
    let (e, _) = errors(&GOOD.replace("seed = 1", "seed = 1\ndevice = \"tpu\""), &[]);
    assert_eq!(e[0].0, Code::InvalidValue);
}

#[test]
fn a_misspelled_required_key_or_port_is_reported_once() {
    let g = GOOD
        .replace("model = \"policy\"\n", "modle = \"policy\"\n")
        .replace("inputs = { a = \"src.n\" }", "inputs = { aa = \"src.n\" }");
    let (e, text) = errors(&g, &[]);
    let codes: Vec<Code> = e.iter().map(|x| x.0).collect();
    assert_eq!(codes, vec![Code::UnknownPort, Code::UnknownKey], "{text}");
}
