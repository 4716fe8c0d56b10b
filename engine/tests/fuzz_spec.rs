//! Property tests of the graph compiler's outside input: graph TOML text and `--set` overrides.
//!
//! The property, for every input: [`compile`] returns `Ok`, or `Err` with at least one
//! diagnostic, every message non-empty, and the rendered report (which slices the source text at
//! the diagnostics' spans) non-empty — never a panic, never a stack overflow. A graph that
//! compiles also compiles again from its resolved TOML (what the run directory keeps).
//!
//! Inputs are structured mutations of valid graphs (this crate's test graph, and the shipped
//! `graphs/*.toml`, which name kinds the test registry lacks): values replaced by edge-case TOML
//! values (extreme integers, NaN/inf, wrong types, unicode, nested arrays and tables), lines
//! deleted, duplicated, swapped or truncated, keys renamed, bytes inserted; plus random
//! `--set PATH=VALUE` arguments built from the graph's own key paths, and hand-made deep nesting.
//!
//! Cases (fixed seed, no persistence file): 1024 document mutations, 1024 override sets, 512 raw
//! texts; a few seconds on one core.

mod testkit;

use flowrl_engine::{Override, compile};
use proptest::prelude::*;
use proptest::test_runner::Config;

const GOOD: &str = testkit::good_graph!("opts = { coef = 0.25 }");

const SHIPPED: &[&str] = &[
    include_str!("../../graphs/grpo_vlm.toml"),
    include_str!("../../graphs/sft_vlm.toml"),
    include_str!("../../graphs/grpo_gemma4.toml"),
];

fn config(cases: u32) -> Config {
    testkit::proptest_config(cases, 0x5eed_0020)
}

/// The property: Ok, or every diagnostic has a message and the report renders.
fn check(text: &str, overrides: &[String]) -> Result<(), TestCaseError> {
    let registry = testkit::registry();
    match compile(&registry, "g.toml", text, &Override::sets(overrides)) {
        Ok((graph, _warnings)) => {
            // The resolved graph the run directory keeps compiles again.
            if let Err(f) = compile(&registry, "resolved.toml", &graph.resolved, &[]) {
                return Err(TestCaseError::fail(format!(
                    "the resolved graph of a good graph does not compile:\n{}\n--- resolved:\n{}",
                    f.render(),
                    graph.resolved
                )));
            }
        }
        Err(f) => {
            prop_assert!(!f.diagnostics.is_empty(), "a failure with no diagnostic");
            for d in &f.diagnostics {
                prop_assert!(!d.message.trim().is_empty(), "an empty message: {d:?}");
            }
            prop_assert!(!f.render().trim().is_empty());
        }
    }
    Ok(())
}

/// Edge-case TOML values (as text).
fn toml_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("9223372036854775807".to_string()),
        Just("-9223372036854775808".to_string()),
        Just("99999999999999999999999".to_string()),
        Just("0x7fffffffffffffff".to_string()),
        Just("nan".to_string()),
        Just("-inf".to_string()),
        Just("1e308".to_string()),
        Just("5e-324".to_string()),
        Just("true".to_string()),
        Just("1979-05-27T07:32:00Z".to_string()),
        Just("\"\"".to_string()),
        Just("\"src.n\"".to_string()),
        Just("\"policy\"".to_string()),
        Just("\"test.add\"".to_string()),
        Just("\"é🦀\\u0000\"".to_string()),
        Just("'''multi\nline'''".to_string()),
        any::<i64>().prop_map(|i| i.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        "[a-z.é]{0,12}".prop_map(|s| format!("{s:?}")),
    ];
    leaf.prop_recursive(3, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            prop::collection::vec(("[a-z]{1,6}", inner), 0..4).prop_map(|v| {
                let items: Vec<String> = v.into_iter().map(|(k, x)| format!("{k} = {x}")).collect();
                format!("{{ {} }}", items.join(", "))
            }),
        ]
    })
}

#[derive(Debug, Clone)]
enum Edit {
    /// Replace the value of line `i` (if it has `=`).
    Value(usize, String),
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    /// Rename the key of line `i`.
    Key(usize, String),
    /// Insert text at byte offset (moved down to a char boundary).
    Insert(usize, String),
    /// Cut the text at byte offset (moved down to a char boundary).
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<usize>(), toml_value()).prop_map(|(i, v)| Edit::Value(i, v)),
        1 => any::<usize>().prop_map(Edit::DeleteLine),
        1 => any::<usize>().prop_map(Edit::DuplicateLine),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
        1 => (any::<usize>(), "[a-z_.\"é ]{0,10}").prop_map(|(i, k)| Edit::Key(i, k)),
        1 => (any::<usize>(), prop_oneof![
            Just("[".to_string()), Just("]".to_string()), Just("=".to_string()),
            Just("\"".to_string()), Just("\n[nodes.x]\n".to_string()), Just("\u{0}".to_string()),
            Just("[[nodes]]\n".to_string()), Just("é".to_string()), "\\PC{0,6}",
        ]).prop_map(|(o, s)| Edit::Insert(o, s)),
        1 => any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(text: &str, edit: &Edit) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        lines.push(String::new());
    }
    let n = lines.len();
    match edit {
        Edit::Value(i, v) => {
            let l = &mut lines[i % n];
            if let Some(eq) = l.find('=') {
                *l = format!("{}= {v}", &l[..eq]);
            } else {
                *l = format!("{l}\nx = {v}");
            }
        }
        Edit::DeleteLine(i) => {
            lines.remove(i % n);
        }
        Edit::DuplicateLine(i) => {
            let l = lines[i % n].clone();
            lines.insert(i % n, l);
        }
        Edit::SwapLines(a, b) => lines.swap(a % n, b % n),
        Edit::Key(i, k) => {
            let l = &mut lines[i % n];
            if let Some(eq) = l.find('=') {
                *l = format!("{k} {}", &l[eq..]);
            }
        }
        Edit::Insert(o, s) => {
            let t = lines.join("\n");
            let at = floor_boundary(&t, o % (t.len() + 1));
            return format!("{}{s}{}", &t[..at], &t[at..]);
        }
        Edit::Truncate(o) => {
            let t = lines.join("\n");
            let at = floor_boundary(&t, o % (t.len() + 1));
            return t[..at].to_string();
        }
    }
    lines.join("\n") + "\n"
}

fn base_graph() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        3 => Just(GOOD),
        1 => prop::sample::select(SHIPPED),
    ]
}

/// Key paths that exist in the test graph, plus made-up ones.
fn key_path() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "run.steps",
            "run.seed",
            "run.device",
            "run.devices",
            "run.checkpoint_every",
            "run.workers",
            "models.policy.init",
            "models.reference.from",
            "nodes.src.count",
            "nodes.src.scale",
            "nodes.src.mode",
            "nodes.src.opts.coef",
            "nodes.src.kind",
            "nodes.add.inputs.a",
            "nodes.add.inputs",
            "nodes.score.micro",
            "nodes.train.model",
            "nodes.train.lr",
            "nodes.train.device",
            "nodes.new.kind",
            "nodes",
            "run",
        ])
        .prop_map(str::to_string),
        "[a-z]{0,4}(\\.[a-zé ]{0,4}){0,4}",
    ]
}

fn override_arg() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (key_path(), toml_value()).prop_map(|(k, v)| format!("{k}={v}")),
        1 => (key_path(), "[^=]{0,8}").prop_map(|(k, v)| format!("{k}={v}")),
        1 => "\\PC{0,16}",
        1 => Just("=".to_string()),
        1 => Just("nodes..src=1".to_string()),
    ]
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn mutated_graphs_compile_or_report(
        base in base_graph(),
        edits in prop::collection::vec(edit(), 1..5),
    ) {
        let mut text = base.to_string();
        for e in &edits {
            text = apply(&text, e);
        }
        check(&text, &[])?;
    }

    #[test]
    fn overrides_compile_or_report(sets in prop::collection::vec(override_arg(), 1..5)) {
        check(GOOD, &sets)?;
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_text_compiles_or_reports(text in "\\PC{0,200}") {
        check(&text, &[])?;
    }
}

/// Deeply nested arrays and inline tables, in the file and in an override: an error or a
/// graph, not a stack overflow (the process would abort).
#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    for depth in [64, 1_000, 100_000] {
        let arrays = format!(
            "[run]\nsteps = {}{}\n",
            "[".repeat(depth),
            "]".repeat(depth)
        );
        check(&arrays, &[]).unwrap();
        let tables = format!(
            "[run]\nsteps = {}{}\n",
            "{a = ".repeat(depth),
            "}".repeat(depth)
        );
        check(&tables, &[]).unwrap();
        let dotted = format!("{}= 1\n", "a.".repeat(depth));
        check(&dotted, &[]).unwrap();
        check(
            GOOD,
            &[format!(
                "nodes.src.count={}{}",
                "[".repeat(depth),
                "]".repeat(depth)
            )],
        )
        .unwrap();
        check(GOOD, &[format!("{}=1", "a.".repeat(depth))]).unwrap();
    }
}
