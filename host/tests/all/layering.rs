//! The layering of `host/src` as docs/ARCHITECTURE.md §1 draws it, checked on the source:
//! which top-level module may name which. A change that makes the pipeline reach into the
//! gateway, or the HTTP API into the store, fails here rather than in review.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest a source file may be, not counting its test module.
const MAX_LINES: usize = 600;

fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`None` for lib.rs and main.rs).
fn module_of(root: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(root).expect("under src");
    let first = relative.components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib" && name != "main").then_some(name)
}

/// The code of a file before its test module, without comments.
fn code_lines(text: &str) -> Vec<&str> {
    text.lines()
        .take_while(|line| line.trim() != "#[cfg(test)]")
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect()
}

/// A file declared `#[cfg(test)] mod name;` in its parent is test code throughout.
fn is_test_module(root: &Path, file: &Path) -> bool {
    let Some(stem) = file.file_stem().and_then(|stem| stem.to_str()) else { return false };
    let dir = file.parent().expect("in a folder");
    let parent = if dir == root { root.join("lib.rs") } else { dir.join("mod.rs") };
    let Ok(text) = std::fs::read_to_string(parent) else { return false };
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    lines.windows(2).any(|pair| pair[0] == "#[cfg(test)]" && pair[1] == format!("mod {stem};"))
}

/// Every top-level module each module names (`crate::x` anywhere in its code, `use` or path).
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let root = source_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(module) = module_of(&root, &file) else { continue };
        if is_test_module(&root, &file) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        let named = graph.entry(module.clone()).or_default();
        for line in code_lines(&text) {
            for (at, _) in line.match_indices("crate::") {
                let rest = &line[at + "crate::".len()..];
                let target: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !target.is_empty() && target != module {
                    named.insert(target);
                }
            }
            // `use crate::{a, b::c}` names several.
            if let Some(group) = line.trim_start().strip_prefix("use crate::{") {
                for part in group.split(',') {
                    let target: String = part.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if !target.is_empty() && target != module {
                        named.insert(target);
                    }
                }
            }
        }
    }
    graph
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = imports();
    // Depth-first search for a cycle, reporting the path.
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        module: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut cycle = path[at..].to_vec();
            cycle.push(module.to_owned());
            return Some(cycle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        if let Some(cycle) = visit(&graph, module, &mut Vec::new(), &mut done) {
            panic!("import cycle: {}", cycle.join(" → "));
        }
    }
}

#[test]
fn the_lower_layers_never_name_the_ones_above_them() {
    let graph = imports();
    let forbidden: &[(&str, &[&str])] = &[
        ("pipeline", &["gateway", "api", "node", "server"]),
        ("delivery", &["gateway", "pipeline", "api", "node", "server"]),
        ("membership", &["gateway", "pipeline", "delivery", "api", "node"]),
        ("routing", &["gateway", "pipeline", "delivery", "api", "node", "store"]),
        ("api", &["store"]),
        ("gateway", &["node", "store", "api"]),
    ];
    for (module, never) in forbidden {
        let named = graph.get(*module).unwrap_or_else(|| panic!("no module {module}"));
        for above in *never {
            assert!(!named.contains(*above), "{module} names {above}: {named:?}");
        }
    }
    let store = &graph["store"];
    let below: BTreeSet<String> = ["model", "config", "breaker", "maps"].iter().map(ToString::to_string).collect();
    assert!(store.is_subset(&below), "the store names more than model, config, breaker and maps: {store:?}");
    // The breaker (the store's, Redis', the peers') is a leaf: a state machine and metrics;
    // so are the maps' hasher and upkeep.
    assert!(graph["breaker"].is_empty(), "breaker.rs names other modules: {:?}", graph["breaker"]);
    assert!(graph["maps"].is_empty(), "maps.rs names other modules: {:?}", graph["maps"]);
}

#[test]
fn no_source_file_is_longer_than_600_lines_outside_its_tests() {
    let mut files = Vec::new();
    rust_files(&source_root(), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let text = std::fs::read_to_string(file).expect("read source");
            let lines = text.lines().take_while(|line| line.trim() != "#[cfg(test)]").count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", file.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these: {long:?}");
}
