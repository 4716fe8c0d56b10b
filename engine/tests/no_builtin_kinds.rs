//! The linking trap: a registry without flowrl's built-in kinds (a plugin binary that never calls
//! `flowrl_nodes`) makes unknown sections (E0101) and kinds (E0201) say so, with the fix; a full
//! registry keeps its did-you-mean and points plugin kinds at their own binary.

mod testkit;

use flowrl_engine::{Code, Registry, compile};

/// The shape of graphs/grpo_vlm.toml: a model resource and built-in node kinds.
const DEFAULT_LIKE: &str = r#"
[run]
steps = 1

[models.policy]
path = "assets/tiny-qwen2-vl"

[nodes.rollout]
kind = "rollout"
model = "policy"
"#;

fn render(registry: &Registry, text: &str) -> (Vec<Code>, String) {
    match compile(registry, "g.toml", text, &[]) {
        Ok(_) => panic!("expected errors"),
        Err(f) => (f.diagnostics.iter().map(|d| d.code).collect(), f.render()),
    }
}

#[test]
fn an_almost_empty_registry_says_no_built_in_kinds_are_registered() {
    let plugin_only = Registry::new().with_kind(testkit::Source);
    let (codes, text) = render(&plugin_only, DEFAULT_LIKE);
    assert_eq!(
        codes,
        vec![Code::UnknownSection, Code::UnknownKind],
        "{text}"
    );
    assert_eq!(
        text.matches("= help: no built-in kinds are registered in this binary")
            .count(),
        2,
        "{text}"
    );
    assert!(!text.contains("did you mean `nodes`?"), "{text}");
    assert!(
        text.contains(
            "`flowrl_nodes::plugin_main!(...)` or `flowrl_nodes::register_builtin(&mut registry)`"
        ),
        "{text}"
    );
}

#[test]
fn a_full_registry_keeps_its_hints() {
    let (_, text) = render(&testkit::registry(), DEFAULT_LIKE);
    assert!(!text.contains("no built-in kinds"), "{text}");
    assert!(
        text.contains("a kind defined in a plugin crate runs with that plugin's binary"),
        "{text}"
    );
}
