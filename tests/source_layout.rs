//! The layout rules a newcomer relies on, checked over the sources themselves: no Rust source
//! file of the workspace is over 800 lines, and the modules of the models, nodes and datasets
//! crates import one another without a circle.
//!
//! A module's imports are the paths its code names (comments, string literals and its
//! `#[cfg(test)] mod tests` block left out): `crate::a::b::…`, `super::…`, and the names of its
//! own child modules (`use child::Item`, `child::f(…)`). Each path counts as an edge to the
//! deepest module file it reaches. A child that names its parent while the parent names the
//! child (a re-export, a call) is a circle as much as two siblings naming each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod common;

/// The most lines a source file may have.
const MAX_LINES: usize = 800;

/// The crate source folders whose modules must not import each other in a circle.
const ACYCLIC: &[&str] = &["models/src", "nodes/src", "datasets/src"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | "vendor" | ".git") && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_is_over_800_lines() {
    let root = common::root();
    let mut files = Vec::new();
    rust_files(root, &mut files);
    assert!(files.len() > 100, "found only {} Rust files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).ok()?.lines().count();
            (lines > MAX_LINES).then(|| {
                format!(
                    "{} ({lines} lines)",
                    f.strip_prefix(root).unwrap().display()
                )
            })
        })
        .collect();
    assert!(
        long.is_empty(),
        "split these by responsibility (at most {MAX_LINES} lines a file): {}",
        long.join(", ")
    );
}

/// The code of a file without its comments, string and char literals and test module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let bytes: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            ('/', Some('/')) => {
                while i < bytes.len() && bytes[i] != '\n' {
                    i += 1;
                }
            }
            ('"', _) => {
                i += 1;
                while i < bytes.len() && bytes[i] != '"' {
                    i += if bytes[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            ('\'', _) if bytes.get(i + 2) == Some(&'\'') => i += 3,
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// The paths `code` names: each `a::b::c` run of identifiers joined by `::`, with `{…}` groups
/// of `use` trees expanded.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        if !ident(chars[i]) || (i > 0 && ident(chars[i - 1])) {
            i += 1;
            continue;
        }
        let (path, end) = read_path(&chars, i, Vec::new(), &mut paths);
        if path.len() > 1 {
            paths.push(path);
        }
        i = end.max(i + 1);
    }
    paths
}

/// Reads the path starting at `i` after `prefix`; a `{…}` group adds each of its paths to `all`.
fn read_path(
    chars: &[char],
    mut i: usize,
    mut path: Vec<String>,
    all: &mut Vec<Vec<String>>,
) -> (Vec<String>, usize) {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    loop {
        let start = i;
        while i < chars.len() && ident(chars[i]) {
            i += 1;
        }
        if start == i {
            return (path, i);
        }
        path.push(chars[start..i].iter().collect());
        if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
            i += 2;
            if chars.get(i) == Some(&'{') {
                i += 1;
                loop {
                    while i < chars.len() && (chars[i].is_whitespace() || chars[i] == ',') {
                        i += 1;
                    }
                    if i >= chars.len() || chars[i] == '}' {
                        return (Vec::new(), i + 1);
                    }
                    let (inner, end) = read_path(chars, i, path.clone(), all);
                    if inner.len() > path.len() {
                        all.push(inner);
                    }
                    i = end.max(i + 1);
                    while i < chars.len() && !matches!(chars[i], ',' | '}') {
                        i += 1;
                    }
                }
            }
        } else {
            return (path, i);
        }
    }
}

/// The module circles among the files of the crate source folder `src` (each circle sorted).
fn circles(src: &Path) -> Vec<Vec<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let module_of = |f: &Path| -> Vec<String> {
        let rel = f.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().to_string())
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        parts
    };
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|f| (module_of(f), std::fs::read_to_string(f).unwrap()))
        .collect();
    let deepest = |path: &[String]| -> Option<Vec<String>> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|m| modules.contains_key(m))
    };
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, text) in &modules {
        let mut targets = BTreeSet::new();
        for path in paths_in(&code_of(text)) {
            let absolute: Vec<String> = match path[0].as_str() {
                "crate" => path[1..].to_vec(),
                "super" | "self" => {
                    let ups = path.iter().take_while(|p| *p == "super").count();
                    let Some(keep) = module.len().checked_sub(ups) else {
                        continue;
                    };
                    let rest = path.iter().skip(ups.max(1)).skip_while(|p| *p == "self");
                    module[..keep].iter().chain(rest).cloned().collect()
                }
                first => {
                    let child = [module.clone(), vec![first.to_string()]].concat();
                    if modules.contains_key(&child) {
                        [module.clone(), path.to_vec()].concat()
                    } else {
                        continue;
                    }
                }
            };
            if let Some(target) = deepest(&absolute)
                && target != *module
                && !target.is_empty()
            {
                targets.insert(target);
            }
        }
        edges.insert(module.clone(), targets);
    }
    strongly_connected(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
            names.sort();
            names
        })
        .collect()
}

/// Tarjan's strongly connected components.
fn strongly_connected(
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> Vec<Vec<Vec<String>>> {
    struct State<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in &s.edges[v] {
            let Some((w, _)) = s.edges.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn the_models_nodes_and_datasets_modules_import_without_a_circle() {
    let root = common::root();
    for src in ACYCLIC {
        let found = circles(&root.join(src));
        assert!(
            found.is_empty(),
            "{src}: modules that import each other in a circle: {found:?}; move what they share \
             into a module of its own that imports neither"
        );
    }
}

/// The checker sees a circle where there is one: a parent that re-exports its child's item
/// while the child imports the parent's, and two siblings that name each other.
#[test]
fn the_circle_check_finds_a_parent_and_child_and_two_siblings() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "mod a;\nmod b;\nmod tools;\n");
    write("a.rs", "use crate::b::B;\npub struct A;\n");
    write(
        "b.rs",
        "// crate::a::A in a comment is no import\npub struct B;\n",
    );
    write(
        "tools/mod.rs",
        "mod zoom;\npub use zoom::Zoom;\npub trait Tool {}\n",
    );
    write(
        "tools/zoom.rs",
        "use super::Tool;\npub struct Zoom;\nimpl Tool for Zoom {}\n",
    );
    assert_eq!(circles(dir.path()), vec![vec!["tools", "tools::zoom"]]);
    write("b.rs", "use crate::{a::A, c};\npub struct B;\n");
    let found = circles(dir.path());
    assert!(
        found.contains(&vec!["a".to_string(), "b".to_string()]),
        "{found:?}"
    );
}
