//! The import graph of prober's modules: its layers and its cycles.
//!
//! Each file under `prober/src` is a node, named by its module path
//! (`probe/remote.rs` = `probe::remote`, `export/mod.rs` = `export`,
//! `lib.rs` and `main.rs` = the crate root, ""). A file depends on every
//! module that one of its paths names: `crate::`, `super::` and `self::`
//! paths, and paths that start with one of its child modules, in `use`
//! trees (groups expanded, `as` renames dropped) and inline in the code
//! (`crate::run::execute(..)`); comments (doc links included) and string
//! literals are not code. A path resolves to the longest prefix that is a
//! module. Test code is left out: files named `tests.rs`, `*_tests.rs` or
//! `testutil.rs`, files declared under `#[cfg(test)]`, and `#[cfg(test)]`
//! items.
//!
//! Two checks read the graph:
//!
//! - [`layers`]: the layer table of docs/ARCHITECTURE.md (the one copy,
//!   read at run time). Every import between two top-level modules points
//!   to a lower row, never up nor within its row; every top-level module
//!   is in the table; only `app`, `cli` and `options` name `clap::` paths.
//! - [`cycles`]: the loops of the file-level graph. Edges between a
//!   module and its ancestors or descendants (a child using its parent's
//!   items, a parent re-exporting its child's) count when they close a
//!   loop through another module: a cycle is printed when one of its edges
//!   joins two unrelated modules. The crate root (lib.rs: declarations and
//!   re-exports) is no node.
//!
//! Why a text scan rather than `cargo modules`: it needs no extra tool
//! (rust-analyzer) in CI, runs in milliseconds, and macros that build
//! paths (none in prober) are the only thing it cannot see.

pub mod cycles;
pub mod layers;
mod scan;
mod tokens;

#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use scan::scan;

/// One import: a path in `file` at `line` that names module `to`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Import {
    pub from: String,
    pub to: String,
    pub file: String,
    pub line: usize,
}

/// Module path -> the modules it depends on.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Graph {
    pub modules: BTreeSet<String>,
    /// Module -> its file, as printed (`prober/src/probe/mod.rs`).
    pub files: BTreeMap<String, String>,
    /// Every dependency between two modules (nesting included; none to
    /// or from the crate root).
    pub edges: BTreeMap<String, BTreeSet<String>>,
    /// Every import of another module, where it is written.
    pub imports: Vec<Import>,
    /// Modules whose non-test code names a `clap::` path, and the line.
    pub clap_users: BTreeMap<String, usize>,
}

/// One source file: its module path, its path as printed and its code.
#[derive(Debug, Clone)]
pub struct Source {
    pub module: String,
    pub file: String,
    pub code: String,
}

/// The graph of the crate whose sources are under `src`; files are named
/// relative to the directory two levels up (the workspace, for
/// `prober/src`).
pub fn load(src: &Path) -> Result<Graph> {
    let mut paths = Vec::new();
    collect_rs(src, &mut paths)?;
    paths.sort();
    let shown_from = src.parent().and_then(Path::parent).unwrap_or(src);
    let mut sources = Vec::new();
    for path in paths {
        let rel = path.strip_prefix(src).unwrap_or(&path);
        let Some(module) = module_path(rel) else {
            continue;
        };
        if is_test_file(&path) {
            continue;
        }
        let code = fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        let file = path.strip_prefix(shown_from).unwrap_or(&path);
        sources.push(Source {
            module,
            file: file.display().to_string(),
            code,
        });
    }
    // Files that only a `#[cfg(test)] mod x;` declares are test code.
    let mut test_only = BTreeSet::new();
    for s in &sources {
        for name in scan(&s.code).test_mods {
            test_only.insert(join(&s.module, &name));
        }
    }
    sources.retain(|s| !test_only.contains(&s.module));
    Ok(build(&sources))
}

/// The graph of the given files, one per module.
pub fn build(files: &[Source]) -> Graph {
    let modules: BTreeSet<String> = files.iter().map(|s| s.module.clone()).collect();
    let mut g = Graph {
        modules: modules.clone(),
        ..Graph::default()
    };
    for s in files {
        g.files.insert(s.module.clone(), s.file.clone());
        let scanned = scan(&s.code);
        if let Some(line) = scanned.uses_clap {
            g.clap_users.insert(s.module.clone(), line);
        }
        for target in scanned.paths(&s.module) {
            let Some(to) = resolve(&modules, &target.path) else {
                continue;
            };
            if let Some(under) = &target.under {
                // A relative path names a module only below its own.
                if to.split("::").count() <= under.len() || to.is_empty() {
                    continue;
                }
            }
            if to == s.module {
                continue;
            }
            g.imports.push(Import {
                from: s.module.clone(),
                to: to.clone(),
                file: s.file.clone(),
                line: target.line,
            });
            if !s.module.is_empty() && !to.is_empty() {
                g.edges.entry(s.module.clone()).or_default().insert(to);
            }
        }
    }
    g.imports
        .sort_by(|a, b| (&a.file, a.line, &a.to).cmp(&(&b.file, b.line, &b.to)));
    g.imports.dedup();
    g
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_rs(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

pub fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests.rs" || name == "testutil.rs" || name.ends_with("_tests.rs")
}

/// `foo/bar.rs` -> `foo::bar`, `foo/mod.rs` -> `foo`, `lib.rs` -> "".
/// None for a file that is not a module (a `bin/` target).
pub fn module_path(rel: &Path) -> Option<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    match stem {
        "mod" => {}
        "lib" | "main" if parts.is_empty() => {}
        s => parts.push(s.to_string()),
    }
    Some(parts.join("::"))
}

fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_string()
    } else {
        format!("{parent}::{child}")
    }
}

/// The longest prefix of `path` (absolute segments) that is a module.
fn resolve(modules: &BTreeSet<String>, path: &[String]) -> Option<String> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|m| modules.contains(m))
}

/// Whether one module is the other, or its ancestor.
pub fn related(a: &str, b: &str) -> bool {
    let inside = |x: &str, y: &str| y.is_empty() || x == y || x.starts_with(&format!("{y}::"));
    inside(a, b) || inside(b, a)
}

/// The top-level module of a module path (`probe::remote` -> `probe`).
pub fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or("")
}
