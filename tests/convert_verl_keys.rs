//! `flowrl convert verl` and the keys it does not know: they warn, and fail under `--strict`;
//! verl's whole current default configuration has none.

mod common;
#[path = "common/verl.rs"]
mod verl;
use common::root;
use verl::{convert, flowrl, stderr};

#[test]
fn unknown_keys_warn_and_fail_with_strict() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("overrides.txt");
    std::fs::write(
        &input,
        "algorithm.adv_estimator=grpo\nactor_rollout_ref.rollout.temprature=0.7\n+my.recipe.key=1\n\
         algorithm.use_kl_in_reward=true\n",
    )
    .unwrap();
    // Without --verbose: counted and named by section.
    let out = flowrl(&["convert", "verl", input.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let grouped = stderr(&out);
    assert!(
        grouped.contains(
            "warning: 2 unknown verl key(s), not converted (values: --verbose):\n  \
             actor_rollout_ref.rollout: 1 (temprature (did you mean \
             `actor_rollout_ref.rollout.temperature`?))\n  my: 1 (recipe.key)"
        ),
        "{grouped}"
    );
    assert!(
        grouped.contains("key(s) not carried over (why: --verbose, or the graph's header):\n"),
        "{grouped}"
    );
    assert!(
        grouped.contains("\n  algorithm: 1 (use_kl_in_reward)\n"),
        "{grouped}"
    );
    assert!(!grouped.contains(" = 0.7"), "{grouped}");

    let (text, _, err) = convert(&input, tmp.path(), &[]);
    assert!(
        err.contains("warning: unknown verl key `actor_rollout_ref.rollout.temprature` = 0.7"),
        "{err}"
    );
    assert!(
        err.contains("did you mean `actor_rollout_ref.rollout.temperature`"),
        "{err}"
    );
    assert!(err.contains("`my.recipe.key`"), "{err}");
    assert!(
        text.contains("#   actor_rollout_ref.rollout.temprature = 0.7"),
        "{text}"
    );

    let graph = tmp.path().join("strict.toml");
    let out = flowrl(&[
        "convert",
        "verl",
        input.to_str().unwrap(),
        "-o",
        graph.to_str().unwrap(),
        "--strict",
    ]);
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("error: 2 unknown verl key(s), not converted")
            && err.contains("error: 2 unknown verl key(s) with --strict: no graph written"),
        "{err}"
    );
    assert!(!graph.exists());
}

/// verl's whole default configuration at the commit the converter knows (1dda039b), read as
/// the composed configuration of a run that changed nothing: every key is known.
#[test]
fn a_current_verl_configuration_has_no_unknown_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.yaml");
    std::fs::copy(root().join("src/convert/verl_defaults.yaml"), &config).unwrap();
    let graph = tmp.path().join("graph.toml");
    let out = flowrl(&[
        "convert",
        "verl",
        config.to_str().unwrap(),
        "-o",
        graph.to_str().unwrap(),
        "--strict",
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(", 0 unknown"), "{err}");
    assert!(!err.contains("unknown verl key"), "{err}");
}
