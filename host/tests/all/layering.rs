//! The house rules of CONTRIBUTING.md, checked on the source of every crate of the workspace:
//!
//! * **Layering** — which top-level module of `host/src` may name which, as
//!   docs/ARCHITECTURE.md §1 draws it. A change that makes the pipeline reach into the
//!   gateway, or the HTTP API into the store, fails here rather than in review.
//! * **No cycles** — in every target of every crate (library, binaries, benchmarks,
//!   integration tests), and in every folder of it, the modules side by side never name each
//!   other round in a circle: one of two modules that need each other's pieces is the wrong
//!   home for them, and the shared piece moves where both can depend on it.
//! * **Size** — no file of a library, binary, build script or benchmark is longer than 600
//!   lines, not counting comments and its test code: a longer one is split by facet into a
//!   folder. Integration tests and test modules are lists of cases and may run longer.
//!
//! A module "names" another through a `use` or a path anywhere in its code outside tests;
//! a re-export (`pub use x::Y` in the parent) counts as naming `x`.

mod rust;
mod workspace;

use std::collections::{BTreeMap, BTreeSet};
use workspace::{Folders, Purpose, Target};

/// Longest a source file may be, in lines that are not comments or test code.
const MAX_LINES: usize = 600;

/// Every top-level module of `herald-host`'s library and the top-level modules it names.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let host = workspace::root().join("host");
    let library = workspace::targets(&host)
        .into_iter()
        .find(|target| target.root == host.join("src/lib.rs"))
        .expect("herald-host has a library");
    let mut graph: BTreeMap<String, BTreeSet<String>> =
        library.children(&Vec::new()).into_iter().map(|module| (module, BTreeSet::new())).collect();
    for (from, named) in library.folders().remove(&Vec::new()).unwrap_or_default() {
        graph.entry(from).or_default().extend(named.into_keys());
    }
    graph
}

fn every_target() -> Vec<Target> {
    workspace::members().iter().flat_map(|member| workspace::targets(member)).collect()
}

fn relative(path: &std::path::Path) -> String {
    path.strip_prefix(workspace::root()).unwrap_or(path).display().to_string()
}

/// The groups of a folder's modules that name each other round in a circle (strongly
/// connected components of more than one module), each with the namings within it.
fn cycles(graph: &BTreeMap<String, BTreeMap<String, workspace::Edge>>) -> Vec<Vec<(String, workspace::Edge)>> {
    // Two modules are in one group when each reaches the other.
    let reaches = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut next = vec![from.to_owned()];
        while let Some(module) = next.pop() {
            for to in graph.get(&module).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(to.clone()) {
                    next.push(to.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> = graph.keys().map(|module| (module, reaches(module))).collect();
    let mut grouped = BTreeSet::new();
    let mut groups = Vec::new();
    for (module, reached) in &reach {
        if !reached.contains(*module) || grouped.contains(*module) {
            continue;
        }
        let group: BTreeSet<&String> =
            reached.iter().filter(|other| reach.get(other).is_some_and(|back| back.contains(*module))).collect();
        grouped.extend(group.iter().map(|m| (*m).clone()));
        let namings = group
            .iter()
            .flat_map(|from| {
                graph[*from]
                    .iter()
                    .filter(|(to, _)| group.contains(to))
                    .map(|(_, edge)| ((*from).clone(), edge.clone()))
            })
            .collect();
        groups.push(namings);
    }
    groups
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mut found = Vec::new();
    for target in every_target() {
        let folders: Folders = target.folders();
        for (folder, graph) in &folders {
            for namings in cycles(graph) {
                // Where each naming is, so the report says what to move.
                let steps: Vec<String> = namings
                    .iter()
                    .map(|(from, edge)| format!("{from} → {} ({}:{})", edge.to, relative(&edge.file), edge.line))
                    .collect();
                let place = if folder.is_empty() { "the crate root".to_owned() } else { folder.join("::") };
                found.push(format!("{} ({place}): {}", relative(&target.root), steps.join(", ")));
            }
        }
    }
    assert!(found.is_empty(), "import cycles between modules side by side:\n{}", found.join("\n"));
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
    let targets = every_target();
    let mut long = BTreeMap::new();
    for target in targets.iter().filter(|target| target.purpose != Purpose::Test) {
        for file in target.files.iter().filter(|file| !file.test) {
            let lines = file.code_lines();
            if lines > MAX_LINES {
                long.insert(relative(&file.path), lines);
            }
        }
    }
    assert!(long.is_empty(), "split these (lines of code outside comments and tests): {long:?}");
    // A file no target reaches would escape every rule.
    let reached: BTreeSet<_> =
        targets.iter().flat_map(|target| target.files.iter().map(|file| file.path.clone())).collect();
    let mut stray = Vec::new();
    for member in workspace::members() {
        let mut files = Vec::new();
        workspace::rust_files(&member.join("src"), &mut files);
        stray.extend(files.into_iter().filter(|file| !reached.contains(file)).map(|file| relative(&file)));
    }
    assert!(stray.is_empty(), "files no target declares (a `mod` is missing, or they are dead): {stray:?}");
}

#[test]
fn the_reader_finds_what_a_file_names() {
    let text = r##"
//! A module.
use crate::{
    a::{self, B},
    c::D as E,
};
use super::f::*;

/// Not `crate::nowhere` (a comment), nor "crate::string" or r#"crate::raw"#.
pub fn g() -> char {
    let _ = crate::h::I::new();
    '\''
}

#[cfg(test)]
mod tests {
    use crate::j::K;
}
"##;
    let lexed = rust::lex(text);
    let parsed = rust::parse(&lexed.tokens);
    let imports: Vec<(Vec<String>, Option<String>)> =
        parsed.imports.iter().map(|import| (import.path.segments.clone(), import.binding.clone())).collect();
    let strings = |segments: &[&str]| segments.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(
        imports,
        [
            (strings(&["crate", "a"]), Some("a".to_owned())),
            (strings(&["crate", "a", "B"]), Some("B".to_owned())),
            (strings(&["crate", "c", "D"]), Some("E".to_owned())),
            (strings(&["super", "f"]), None),
        ]
    );
    let paths: Vec<Vec<String>> = parsed.paths.iter().map(|path| path.segments.clone()).collect();
    assert_eq!(paths, [strings(&["crate", "h", "I", "new"])]);
    assert_eq!(parsed.test_lines, (15..=18).collect());
    assert_eq!(lexed.comment_lines, BTreeSet::from([2, 9]));
}
