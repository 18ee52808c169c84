//! The layout's promise (docs/ARCHITECTURE.md), checked against the code: every module of the
//! library imports only from layers below its own, peers in a layer do not import each other,
//! and no two files import each other, directly or round a loop.
//!
//! Imports are read from the source text: every `crate::` and `super::` path outside the unit
//! tests (`#[cfg(test)] mod tests`, `fixtures.rs`), `use` groups expanded, each path resolved to
//! the module that defines the item (through `pub use` re-exports of a `mod.rs`).
//!
//! `cargo test --test layers -- --nocapture` prints the import graph (`scripts/layers` too).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, bottom first, with their top-level modules. A module imports only from layers
/// below its own; `lib.rs` itself (`Error`, `Result`, `TOOL_NAME`) is under every layer.
const LAYERS: &[(&str, &[&str])] = &[
    ("support", &["error", "progress", "telemetry"]),
    ("pure: format", &["format"]),
    ("pure: domain", &["domain"]),
    ("edges", &["k8s", "store"]),
    ("shared by the flows", &["metrics"]),
    ("flows", &["backup", "restore", "journal"]),
    ("flows: move", &["moving"]),
    ("flows: controller", &["controller"]),
    ("demo and bench (feature fleet)", &["fleet"]),
];

/// Modules of the flows and edges that are pure all the same (docs/ARCHITECTURE.md, "Pure and
/// edge"): they import only from the pure layers and name no client, store or runtime.
const PURE_IN_FLOWS: &[&str] = &["restore::plan", "controller::index", "journal::state", "store::retention::plan"];

/// The last pure layer in [`LAYERS`].
const PURE_UP_TO: &str = "pure: domain";

type Module = Vec<String>;

fn name(m: &Module) -> String {
    if m.is_empty() { "crate".into() } else { m.join("::") }
}

/// Every library module (not the binary side: main.rs, cli/, bin/) with its source text.
fn modules(src: &Path) -> BTreeMap<Module, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ readable") {
            let path = entry.expect("a directory entry").path();
            let rel = path.strip_prefix(src).expect("below src/");
            let rel_str = rel.to_string_lossy().to_string();
            if ["main.rs", "cli", "bin", "fixtures.rs"].contains(&rel_str.as_str()) {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let mut module: Module = rel.with_extension("").iter().map(|p| p.to_string_lossy().to_string()).collect();
            if module.last().is_some_and(|l| l == "mod" || l == "lib") {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            out.insert(module, without_unit_tests(&text));
        }
    }
    out
}

/// The text before the unit tests, with comments blanked.
fn without_unit_tests(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..end]
        .lines()
        .map(|line| match line.trim_start().starts_with("//") {
            true => "",
            false => line.split(" // ").next().unwrap_or(line),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a `use` tree or an inline path starting at `at` (just after `crate::`/`super::`)
/// names: `a::b::{c, d::{e}}` gives `a::b::c` and `a::b::d::e`.
fn paths_at(text: &[u8], mut at: usize) -> Vec<Vec<String>> {
    let ident = |at: &mut usize| {
        let start = *at;
        while *at < text.len() && (text[*at].is_ascii_alphanumeric() || text[*at] == b'_') {
            *at += 1;
        }
        String::from_utf8_lossy(&text[start..*at]).to_string()
    };
    let skip_ws = |at: &mut usize| {
        while *at < text.len() && text[*at].is_ascii_whitespace() {
            *at += 1;
        }
    };
    let mut prefix = vec![];
    loop {
        skip_ws(&mut at);
        if at < text.len() && text[at] == b'{' {
            // A group: split at top-level commas, expand each.
            let (mut depth, mut start, mut out) = (0, at + 1, vec![]);
            let mut i = at;
            while i < text.len() {
                match text[i] {
                    b'{' => depth += 1,
                    b'}' | b',' if depth == 1 => {
                        for p in paths_at(text, start) {
                            out.push(prefix.iter().cloned().chain(p).collect());
                        }
                        start = i + 1;
                        if text[i] == b'}' {
                            break;
                        }
                    }
                    b'}' => depth -= 1,
                    _ => {}
                }
                i += 1;
            }
            return out;
        }
        let segment = ident(&mut at);
        if segment.is_empty() || segment == "self" {
            return if prefix.is_empty() { vec![] } else { vec![prefix] };
        }
        prefix.push(segment);
        if text[at..].starts_with(b"::") {
            at += 2;
        } else {
            return vec![prefix];
        }
    }
}

/// Every path `module`'s text names through `crate::` or `super::`, made absolute. (`super`
/// is the module minus its last segment, for `a/b.rs` and `a/mod.rs` alike.)
fn imports(module: &Module, text: &str) -> Vec<Vec<String>> {
    let bytes = text.as_bytes();
    let mut out = vec![];
    for (at, _) in text.match_indices("crate::").chain(text.match_indices("super::")) {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
            continue;
        }
        let mut base = module.clone();
        let mut rest = at;
        if text[rest..].starts_with("crate::") {
            base.clear();
            rest += "crate::".len();
        }
        while text[rest..].starts_with("super::") {
            base.pop();
            rest += "super::".len();
        }
        for path in paths_at(bytes, rest) {
            out.push(base.iter().cloned().chain(path).collect());
        }
    }
    out
}

/// `pub use child::Item` and `pub use child::{A, B}` of each module: item name → child.
fn reexports(modules: &BTreeMap<Module, String>) -> BTreeMap<(Module, String), String> {
    let mut out = BTreeMap::new();
    for (module, text) in modules {
        for (at, _) in text.match_indices("pub use ") {
            let rest = at + "pub use ".len();
            for path in paths_at(text.as_bytes(), rest) {
                let child: Module = module.iter().cloned().chain([path[0].clone()]).collect();
                if path.len() >= 2 && modules.contains_key(&child) {
                    out.insert((module.clone(), path[path.len() - 1].clone()), path[0].clone());
                }
            }
        }
    }
    out
}

/// The module that defines what `path` names: its longest prefix that is a module, followed
/// through re-exports.
fn resolve(
    path: &[String],
    modules: &BTreeMap<Module, String>,
    reexports: &BTreeMap<(Module, String), String>,
) -> Module {
    let mut current: Module = vec![];
    for segment in path {
        let child: Module = current.iter().cloned().chain([segment.clone()]).collect();
        if modules.contains_key(&child) {
            current = child;
        } else if let Some(via) = reexports.get(&(current.clone(), segment.clone())) {
            current.push(via.clone());
            return current;
        } else {
            break;
        }
    }
    current
}

fn layer_of(module: &Module) -> Option<usize> {
    let top = module.first()?;
    LAYERS.iter().position(|(_, members)| members.contains(&top.as_str()))
}

/// One module is the other or inside it (a mod.rs and its files share items both ways).
fn related(a: &Module, b: &Module) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

struct Graph {
    edges: BTreeMap<Module, BTreeSet<Module>>,
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let reexports = reexports(&modules);
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, text) in &modules {
        let entry = edges.entry(module.clone()).or_default();
        for path in imports(module, text) {
            if path.first().is_some_and(|p| p == "fixtures") {
                continue;
            }
            let target = resolve(&path, &modules, &reexports);
            if !target.is_empty() && !related(module, &target) {
                entry.insert(target);
            }
        }
    }
    Graph { edges }
}

#[test]
fn no_module_imports_from_a_layer_above_its_own_or_from_a_peer() {
    let graph = graph();
    let mut violations = vec![];
    for (module, targets) in &graph.edges {
        let Some(own) = layer_of(module) else {
            if !module.is_empty() {
                violations.push(format!("{} is in no layer: add it to LAYERS and docs/ARCHITECTURE.md", name(module)));
            }
            continue;
        };
        for target in targets {
            let Some(theirs) = layer_of(target) else { continue };
            let same_tree = module.first() == target.first();
            if theirs > own || (theirs == own && !same_tree) {
                violations.push(format!(
                    "{} ({}) imports {} ({})",
                    name(module),
                    LAYERS[own].0,
                    name(target),
                    LAYERS[theirs].0
                ));
            }
        }
    }
    assert!(violations.is_empty(), "imports against the layers:\n  {}", violations.join("\n  "));
}

#[test]
fn the_pure_modules_of_the_flows_use_only_pure_code() {
    let graph = graph();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let pure_up_to = LAYERS.iter().position(|(l, _)| *l == PURE_UP_TO).expect("the pure layer");
    let mut violations = vec![];
    for pure in PURE_IN_FLOWS {
        let module: Module = pure.split("::").map(str::to_string).collect();
        let text = modules.get(&module).unwrap_or_else(|| panic!("{pure} is gone: update PURE_IN_FLOWS"));
        for target in graph.edges.get(&module).into_iter().flatten() {
            if layer_of(target).is_some_and(|l| l > pure_up_to) {
                violations.push(format!("{pure} imports {}", name(target)));
            }
        }
        for client in ["kube::", "object_store::", "tokio::", "reqwest::", "std::fs"] {
            if text.contains(client) {
                violations.push(format!("{pure} names {client}"));
            }
        }
    }
    assert!(violations.is_empty(), "pure modules that are not:\n  {}", violations.join("\n  "));
}

#[test]
fn no_two_modules_import_each_other_round_a_loop() {
    let graph = graph();
    // Depth-first search for a back edge; the loop is reported as the path that closes it.
    fn visit(
        node: &Module,
        graph: &Graph,
        path: &mut Vec<Module>,
        done: &mut BTreeSet<Module>,
        loops: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|m| m == node) {
            let cycle: Vec<String> = path[at..].iter().chain([node]).map(name).collect();
            loops.push(cycle.join(" -> "));
            return;
        }
        if !done.insert(node.clone()) {
            return;
        }
        path.push(node.clone());
        for next in graph.edges.get(node).into_iter().flatten() {
            visit(next, graph, path, done, loops);
        }
        path.pop();
    }
    let (mut done, mut loops) = (BTreeSet::new(), vec![]);
    for node in graph.edges.keys() {
        visit(node, &graph, &mut vec![], &mut done, &mut loops);
    }
    assert!(loops.is_empty(), "import loops:\n  {}", loops.join("\n  "));
}

#[test]
fn the_import_graph() {
    let graph = graph();
    let mut by_top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    println!("modules and what they import (within one top-level module omitted):");
    for (module, targets) in &graph.edges {
        let outside: Vec<String> = targets.iter().filter(|t| t.first() != module.first()).map(name).collect();
        if !outside.is_empty() {
            println!("  {:<28} -> {}", name(module), outside.join(", "));
        }
        if let Some(top) = module.first() {
            by_top
                .entry(top.clone())
                .or_default()
                .extend(targets.iter().filter_map(|t| t.first()).filter(|t| *t != top).cloned());
        }
    }
    println!("\nby layer, bottom first:");
    for (layer, members) in LAYERS {
        for top in *members {
            let uses: Vec<&str> = by_top.get(*top).into_iter().flatten().map(String::as_str).collect();
            println!("  {layer:<32} {top:<11} -> {}", if uses.is_empty() { "-".into() } else { uses.join(", ") });
        }
    }
    // The reading itself is checked: these imports exist in the code today.
    let has = |from: &[&str], to: &[&str]| {
        let from: Module = from.iter().map(|s| s.to_string()).collect();
        let to: Module = to.iter().map(|s| s.to_string()).collect();
        graph.edges.get(&from).is_some_and(|t| t.contains(&to))
    };
    assert!(has(&["restore", "apply"], &["k8s", "writer"]), "a `use crate::k8s::Writer` (re-exported) is read");
    assert!(has(&["format", "payload"], &["format", "spill"]), "a `use super::spill::…` is read");
    assert!(has(&["controller", "index"], &["domain", "pairing"]), "a grouped import is read");
}
