//! What the `flowrl convert verl` tests (`tests/convert_verl*.rs`) share: the conversion of a
//! fixture through the binary, typed reads of the converted graph, and its validation on the
//! tiny assets. Included by those tests alone (`#[path]`), beside `common`.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{BIN, root};

pub fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures/verl_configs").join(name)
}

/// Runs the binary in the repository root and gives its output, whether it succeeded or not
/// (`common::flowrl` asserts success).
pub fn flowrl(args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(root())
        .args(args)
        .output()
        .unwrap()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Converts `input` into `dir/graph.toml`; returns the graph's text, parsed table and stderr.
/// `flowrl convert verl INPUT -o DIR/graph.toml --verbose EXTRA…`: the graph's text and table,
/// and standard error (each key not carried over, with why).
pub fn convert(input: &Path, dir: &Path, extra: &[&str]) -> (String, toml::Table, String) {
    let graph = dir.join("graph.toml");
    let mut args = vec![
        "convert",
        "verl",
        input.to_str().unwrap(),
        "-o",
        graph.to_str().unwrap(),
        "--verbose",
    ];
    args.extend_from_slice(extra);
    let out = flowrl(&args);
    assert!(out.status.success(), "convert failed:\n{}", stderr(&out));
    let text = std::fs::read_to_string(&graph).unwrap();
    let table: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("not TOML: {e}\n{text}"));
    (text, table, stderr(&out))
}

pub fn get<'a>(t: &'a toml::Table, path: &str) -> &'a toml::Value {
    let mut cur: &toml::Value = t.get(path.split('.').next().unwrap()).unwrap_or_else(|| {
        panic!("no `{path}` in the graph");
    });
    for seg in path.split('.').skip(1) {
        cur = cur
            .get(seg)
            .unwrap_or_else(|| panic!("no `{path}` in the graph"));
    }
    cur
}

pub fn int(t: &toml::Table, path: &str) -> i64 {
    get(t, path)
        .as_integer()
        .unwrap_or_else(|| panic!("`{path}` is not an integer"))
}

pub fn float(t: &toml::Table, path: &str) -> f64 {
    let v = get(t, path);
    v.as_float()
        .or_else(|| v.as_integer().map(|i| i as f64))
        .unwrap_or_else(|| panic!("`{path}` is not a number"))
}

/// A number the graph sets, or the kind's default when it leaves it out.
pub fn float_or(t: &toml::Table, path: &str, default: f64) -> f64 {
    let (parent, key) = path.rsplit_once('.').unwrap();
    match get(t, parent).get(key) {
        Some(_) => float(t, path),
        None => default,
    }
}

pub fn string<'a>(t: &'a toml::Table, path: &str) -> &'a str {
    get(t, path)
        .as_str()
        .unwrap_or_else(|| panic!("`{path}` is not a string"))
}

/// The tiny assets in place of a recipe's model and data, and one CPU device.
pub const TINY: &[&str] = &[
    "--set",
    "models.policy.path=assets/tiny-qwen2-vl",
    "--set",
    "nodes.data.path=datasets/shapes/train.parquet",
    "--set",
    "nodes.data.val_path=datasets/shapes/test.parquet",
    "--set",
    "run.devices=[\"cpu\"]",
];

/// Validates `graph` on the tiny assets, its lengths cut to the tiny model's context.
pub fn validate(graph: &Path, extra: &[&str]) {
    let mut args = vec!["validate", graph.to_str().unwrap()];
    args.extend_from_slice(TINY);
    args.extend_from_slice(&[
        "--set",
        "nodes.data.max_prompt_length=128",
        "--set",
        "nodes.rollout.max_new_tokens=16",
    ]);
    if std::fs::read_to_string(graph)
        .unwrap()
        .contains("[nodes.eval]")
    {
        args.extend_from_slice(&["--set", "nodes.eval.max_new_tokens=16"]);
    }
    args.extend_from_slice(extra);
    let out = flowrl(&args);
    assert!(
        out.status.success(),
        "validate {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
}

/// The graph's sections without the header comments (the three input forms must agree).
pub fn body(text: &str) -> String {
    let start = text.find("\n[run]").unwrap();
    text[start..].to_string()
}
