//! The workspace as the rules see it: every member crate's targets (library, binaries, build
//! script, benchmarks, integration tests), each a tree of modules read from its files by
//! following `mod` declarations, and which module names which.

use super::rust::{self, Lexed, Parsed};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What a target is for: the size rule holds code that ships or measures, not tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A library, a binary, a build script, a fuzz target.
    Code,
    Bench,
    Test,
}

pub type ModulePath = Vec<String>;

pub struct SourceFile {
    pub path: PathBuf,
    pub module: ModulePath,
    /// Declared under `#[cfg(test)]` (or inside such a module): test code throughout.
    pub test: bool,
    pub lexed: Lexed,
    pub parsed: Parsed,
}

impl SourceFile {
    /// Its length as the size rule counts it: every line but comments and test code.
    pub fn code_lines(&self) -> usize {
        (1..=self.lexed.lines)
            .filter(|line| !self.lexed.comment_lines.contains(line) && !self.parsed.test_lines.contains(line))
            .count()
    }
}

/// One compilation target: a root file and the modules under it.
pub struct Target {
    pub root: PathBuf,
    pub purpose: Purpose,
    pub files: Vec<SourceFile>,
    /// Every module outside test code, file or inline.
    modules: BTreeSet<ModulePath>,
    /// By module: the names its `use`s bind, with the module written in and the path.
    bindings: BTreeMap<ModulePath, BTreeMap<String, (ModulePath, Vec<String>)>>,
    /// By module: its glob imports (`use a::*`), likewise.
    globs: BTreeMap<ModulePath, Vec<(ModulePath, Vec<String>)>>,
    /// By module: the names it defines.
    defined: BTreeMap<ModulePath, BTreeSet<String>>,
}

/// A module naming a sibling: in folder `parent`, `from` names `to`, first at `file:line`.
#[derive(Debug, Clone)]
pub struct Edge {
    pub to: String,
    pub file: PathBuf,
    pub line: usize,
}

/// Per folder (a module with modules under it), which child names which.
pub type Folders = BTreeMap<ModulePath, BTreeMap<String, BTreeMap<String, Edge>>>;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace holds host/").to_path_buf()
}

/// The workspace's member folders, from its Cargo.toml.
pub fn members() -> Vec<PathBuf> {
    let root = root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("read Cargo.toml");
    let line = manifest.lines().find(|line| line.trim_start().starts_with("members")).expect("a members list");
    let members: Vec<PathBuf> = line.split('"').skip(1).step_by(2).map(|member| root.join(member)).collect();
    assert!(members.len() > 1, "no members read from {line}");
    members
}

/// Every target of a member crate, with its files read.
pub fn targets(member: &Path) -> Vec<Target> {
    let mut roots: Vec<(PathBuf, Purpose)> = Vec::new();
    let mut add = |path: PathBuf, purpose| {
        if path.is_file() && !roots.iter().any(|(known, _)| *known == path) {
            roots.push((path, purpose));
        }
    };
    // Targets named in the manifest first: their purpose is the manifest's.
    let manifest = std::fs::read_to_string(member.join("Cargo.toml")).expect("read a member's Cargo.toml");
    let mut section = String::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_owned();
        } else if let Some(path) = line.strip_prefix("path = \"").and_then(|rest| rest.strip_suffix('"')) {
            match section.as_str() {
                "[[test]]" => add(member.join(path), Purpose::Test),
                "[[bench]]" => add(member.join(path), Purpose::Bench),
                "[lib]" | "[[bin]]" | "[[example]]" => add(member.join(path), Purpose::Code),
                _ => {}
            }
        }
    }
    for name in ["src/lib.rs", "src/main.rs", "build.rs"] {
        add(member.join(name), Purpose::Code);
    }
    for (folder, purpose) in [("src/bin", Purpose::Code), ("benches", Purpose::Bench), ("tests", Purpose::Test)] {
        for entry in read_dir(&member.join(folder)) {
            if entry.extension().is_some_and(|ext| ext == "rs") {
                add(entry, purpose);
            } else if entry.is_dir() {
                add(entry.join("main.rs"), purpose);
            }
        }
    }
    roots.into_iter().map(|(root, purpose)| Target::read(root, purpose)).collect()
}

fn read_dir(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut paths: Vec<PathBuf> = entries.map(|entry| entry.expect("a folder entry").path()).collect();
    paths.sort();
    paths
}

/// Every `.rs` file under `dir`.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for path in read_dir(dir) {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

impl Target {
    fn read(root: PathBuf, purpose: Purpose) -> Self {
        let mut target = Target {
            root: root.clone(),
            purpose,
            files: Vec::new(),
            modules: BTreeSet::from([Vec::new()]),
            bindings: BTreeMap::new(),
            globs: BTreeMap::new(),
            defined: BTreeMap::new(),
        };
        let folder = root.parent().expect("a root file is in a folder").to_path_buf();
        // (file, its module, the folder its `mod x;` files are in, test code)
        let mut queue = vec![(root, Vec::new(), folder, false)];
        while let Some((path, module, children, test)) = queue.pop() {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            let lexed = rust::lex(&text);
            let parsed = rust::parse(&lexed.tokens);
            for declared in &parsed.declared {
                let mut child = module.clone();
                child.extend(declared.inline.iter().cloned());
                child.push(declared.name.clone());
                let (file, grandchildren) = match &declared.path {
                    Some(at) => {
                        let file = path.parent().expect("in a folder").join(at);
                        let below = if file.file_name().is_some_and(|name| name == "mod.rs") {
                            file.parent().expect("in a folder").to_path_buf()
                        } else {
                            file.with_extension("")
                        };
                        (file, below)
                    }
                    None => {
                        let mut base = children.clone();
                        base.extend(declared.inline.iter());
                        let flat = base.join(format!("{}.rs", declared.name));
                        if flat.is_file() {
                            (flat, base.join(&declared.name))
                        } else {
                            (base.join(&declared.name).join("mod.rs"), base.join(&declared.name))
                        }
                    }
                };
                assert!(file.is_file(), "{}: `mod {}` has no file {}", path.display(), declared.name, file.display());
                queue.push((file, child, grandchildren, test || declared.test));
            }
            if !test {
                target.note(&module, &parsed);
            }
            target.files.push(SourceFile { path, module, test, lexed, parsed });
        }
        target
    }

    /// Records a file's modules, imports and definitions (its test code left out).
    fn note(&mut self, module: &ModulePath, parsed: &Parsed) {
        let within = |inline: &[String]| -> ModulePath { module.iter().chain(inline).cloned().collect() };
        self.modules.insert(module.clone());
        for inline in &parsed.inline {
            self.modules.insert(within(inline));
        }
        for declared in parsed.declared.iter().filter(|declared| !declared.test) {
            let mut child = within(&declared.inline);
            child.push(declared.name.clone());
            self.modules.insert(child);
        }
        for import in parsed.imports.iter().filter(|import| !parsed.test_lines.contains(&import.path.line)) {
            let at = within(&import.path.inline);
            let path = (at.clone(), import.path.segments.clone());
            match &import.binding {
                Some(name) => _ = self.bindings.entry(at).or_default().insert(name.clone(), path),
                None => self.globs.entry(at).or_default().push(path),
            }
        }
        for (inline, names) in &parsed.defined {
            self.defined.entry(within(inline)).or_default().extend(names.iter().cloned());
        }
    }

    /// A path written in module `at`, made absolute (from the crate root); `None` when it
    /// leads out of the crate.
    fn absolute(&self, at: &ModulePath, segments: &[String], hops: usize) -> Option<ModulePath> {
        let (first, rest) = segments.split_first()?;
        let joined = |mut base: ModulePath, rest: &[String]| {
            base.extend(rest.iter().cloned());
            base
        };
        match first.as_str() {
            "crate" => Some(rest.to_vec()),
            "self" => Some(joined(at.clone(), rest)),
            "super" => {
                let ups = segments.iter().take_while(|segment| *segment == "super").count();
                let base = at.get(..at.len().checked_sub(ups)?)?.to_vec();
                Some(joined(base, &segments[ups..]))
            }
            name => {
                let mut child = at.clone();
                child.push(name.to_owned());
                if self.modules.contains(&child) {
                    return Some(joined(child, rest));
                }
                if let Some((written_in, path)) = self.bindings.get(at).and_then(|names| names.get(name))
                    && hops < 16
                    && path.as_slice() != [name.to_owned()]
                {
                    return self.absolute(written_in, path, hops + 1).map(|base| joined(base, rest));
                }
                self.defined.get(at).filter(|names| names.contains(name)).map(|_| joined(at.clone(), segments))
            }
        }
    }

    /// The module an absolute path leads to, through re-exports (`pub use x::Y` and
    /// `pub use x::*` in a parent count as naming `x`).
    fn module_of(&self, path: &[String], hops: usize) -> ModulePath {
        let mut module: ModulePath = Vec::new();
        for segment in path {
            module.push(segment.clone());
            if !self.modules.contains(&module) {
                module.pop();
                break;
            }
        }
        let Some(next) = path.get(module.len()) else { return module };
        let rest = &path[module.len() + 1..];
        if hops >= 16 || self.defined.get(&module).is_some_and(|names| names.contains(next)) {
            return module;
        }
        if let Some((written_in, segments)) = self.bindings.get(&module).and_then(|names| names.get(next)) {
            if let Some(mut target) = self.absolute(written_in, segments, 0) {
                target.extend(rest.iter().cloned());
                return self.module_of(&target, hops + 1);
            }
            return module;
        }
        for (written_in, segments) in self.globs.get(&module).into_iter().flatten() {
            let Some(glob) = self.absolute(written_in, segments, 0) else { continue };
            let glob = self.module_of(&glob, hops + 1);
            let named = |names: Option<&BTreeSet<String>>| names.is_some_and(|names| names.contains(next));
            if named(self.defined.get(&glob)) || self.bindings.get(&glob).is_some_and(|names| names.contains_key(next))
            {
                let mut target = glob;
                target.push(next.clone());
                target.extend(rest.iter().cloned());
                return self.module_of(&target, hops + 1);
            }
        }
        module
    }

    /// Which module names which, per folder: a path written in `a/x.rs` that leads to
    /// `b/y.rs` makes `a` name `b` in the root folder. A module naming its parent or its own
    /// children is not counted (a folder's `mod.rs` assembles its children).
    pub fn folders(&self) -> Folders {
        let mut folders = Folders::new();
        for file in self.files.iter().filter(|file| !file.test) {
            let imports = file.parsed.imports.iter().map(|import| &import.path);
            for written in imports.chain(&file.parsed.paths) {
                if file.parsed.test_lines.contains(&written.line) {
                    continue;
                }
                let from: ModulePath = file.module.iter().chain(&written.inline).cloned().collect();
                let Some(path) = self.absolute(&from, &written.segments, 0) else { continue };
                let to = self.module_of(&path, 0);
                let shared = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
                if shared < from.len() && shared < to.len() {
                    let edge = Edge { to: to[shared].clone(), file: file.path.clone(), line: written.line };
                    folders
                        .entry(from[..shared].to_vec())
                        .or_default()
                        .entry(from[shared].clone())
                        .or_default()
                        .entry(to[shared].clone())
                        .or_insert(edge);
                }
            }
        }
        folders
    }

    /// The modules directly under `folder` (file and inline ones, test code left out).
    pub fn children(&self, folder: &ModulePath) -> BTreeSet<String> {
        self.modules
            .iter()
            .filter(|module| module.len() == folder.len() + 1 && module.starts_with(folder))
            .map(|module| module[folder.len()].clone())
            .collect()
    }
}
