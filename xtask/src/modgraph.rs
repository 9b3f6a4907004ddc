//! The import graph of prober's modules, and its cycles.
//!
//! Each file under `prober/src` is a node, named by its module path
//! (`probe/remote.rs` = `probe::remote`, `export/mod.rs` = `export`,
//! `lib.rs` and `main.rs` = the crate root, ""). A file depends on every
//! module that one of its `crate::` or `super::` paths names, in `use`
//! trees (groups expanded, `as` renames dropped) and inline in the code
//! (`crate::runner::execute(..)`): the path resolves to the longest prefix
//! that is a module. Edges between a module and its own ancestors or
//! descendants are left out (a parent declares its children, children use
//! their parent's items: that is nesting, not layering), and so is test
//! code: files named `tests.rs`, `*_tests.rs` or `testutil.rs`, files
//! declared under `#[cfg(test)]`, and `#[cfg(test)]` items.
//!
//! A cycle is a strongly connected component of more than one module
//! (Tarjan). Each is printed as the elementary cycles that cover its
//! edges, `a -> b -> c -> a`, so every line is a loop to cut.
//!
//! Layering ([`layer_violations`]): a domain module ([`DOMAIN`]) imports
//! none of `app`, `cli` and `runner` (the commands and the parse result),
//! names no `clap::` path outside its test code (its flags live in `cli`
//! and `spec`), and `export` imports no `probe`.
//!
//! Why a text scan rather than `cargo modules`: it needs no extra tool
//! (rust-analyzer) in CI, runs in milliseconds, and macros that build
//! paths (none in prober) are the only thing it cannot see.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

/// Module path -> the modules it depends on.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Graph {
    pub modules: BTreeSet<String>,
    pub edges: BTreeMap<String, BTreeSet<String>>,
    /// Modules whose non-test code names a `clap::` path.
    pub clap_users: BTreeSet<String>,
}

/// One source file: its module path and its code.
struct Source {
    module: String,
    path: PathBuf,
    code: String,
}

/// The graph of the crate whose sources are under `src`.
pub fn load(src: &Path) -> Result<Graph> {
    let mut files = Vec::new();
    collect_rs(src, &mut files)?;
    files.sort();
    let mut sources = Vec::new();
    for path in files {
        let rel = path.strip_prefix(src).unwrap_or(&path);
        let Some(module) = module_path(rel) else {
            continue;
        };
        let code = fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        sources.push(Source { module, path, code });
    }
    // Files that only a `#[cfg(test)] mod x;` declares are test code.
    let mut test_only = BTreeSet::new();
    for s in &sources {
        for name in scan(&s.code).test_mods {
            test_only.insert(join(&s.module, &name));
        }
    }
    let kept: Vec<&Source> = sources
        .iter()
        .filter(|s| !test_only.contains(&s.module) && !is_test_file(&s.path))
        .collect();
    let files: Vec<(String, String)> = kept
        .iter()
        .map(|s| (s.module.clone(), s.code.clone()))
        .collect();
    Ok(build(&files))
}

/// The graph of `(module path, code)` pairs, one per file.
pub fn build(files: &[(String, String)]) -> Graph {
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut g = Graph {
        modules: modules.clone(),
        edges: BTreeMap::new(),
        clap_users: BTreeSet::new(),
    };
    for (module, code) in files {
        let scanned = scan(code);
        if scanned.uses_clap {
            g.clap_users.insert(module.clone());
        }
        let deps = g.edges.entry(module.clone()).or_default();
        for path in scanned.paths(module) {
            let Some(to) = resolve(&modules, &path) else {
                continue;
            };
            if !related(module, &to) {
                deps.insert(to);
            }
        }
    }
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

fn is_test_file(path: &Path) -> bool {
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
fn related(a: &str, b: &str) -> bool {
    let inside = |x: &str, y: &str| y.is_empty() || x == y || x.starts_with(&format!("{y}::"));
    inside(a, b) || inside(b, a)
}

/// A path as written, relative to the inline module it is written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPath {
    /// Segments of the inline modules around it (`mod a { mod b { .. } }`).
    pub within: Vec<String>,
    /// As written: `crate::a::b`, `super::x`, `self::y`.
    pub segments: Vec<String>,
}

/// What a file's code refers to.
#[derive(Debug, Default)]
pub struct Scan {
    pub paths: Vec<RawPath>,
    /// Modules declared `#[cfg(test)] mod name;` (their files are tests).
    pub test_mods: Vec<String>,
    /// A `clap::` path outside test items (`use clap::..`, `clap::Args`).
    pub uses_clap: bool,
}

impl Scan {
    /// The crate-absolute paths, for a file whose module is `module`.
    pub fn paths(&self, module: &str) -> Vec<Vec<String>> {
        let base: Vec<String> = module
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        self.paths
            .iter()
            .filter_map(|p| {
                let mut here = base.clone();
                here.extend(p.within.iter().cloned());
                absolute(&here, &p.segments)
            })
            .collect()
    }
}

/// `crate::..` as is; `super::`/`self::` against the module `here`; None
/// for anything else (another crate, a child through a relative path).
fn absolute(here: &[String], segments: &[String]) -> Option<Vec<String>> {
    let (first, rest) = segments.split_first()?;
    match first.as_str() {
        "crate" => Some(rest.to_vec()),
        "self" | "super" => {
            let mut at = here.to_vec();
            let mut rest = segments;
            while let Some((s, r)) = rest.split_first() {
                match s.as_str() {
                    "self" => {}
                    "super" => {
                        at.pop()?;
                    }
                    _ => break,
                }
                rest = r;
            }
            at.extend(rest.iter().cloned());
            Some(at)
        }
        _ => None,
    }
}

/// Scans one file: its `use` trees and inline `crate::`/`super::` paths,
/// outside comments, string and char literals and `#[cfg(test)]` items.
pub fn scan(code: &str) -> Scan {
    let all = tokenize(code);
    let tokens = drop_test_items(&all);
    let mut out = Scan::default();
    let mut within: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        match t {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if within.last().is_some_and(|(_, d)| *d == depth) {
                    within.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|b| b == "{") => {
                within.push((tokens[i + 1].clone(), depth));
            }
            "use" => {
                let end = tokens[i..]
                    .iter()
                    .position(|t| t == ";")
                    .map_or(tokens.len(), |p| i + p);
                let names: Vec<String> = within.iter().map(|(n, _)| n.clone()).collect();
                for segments in expand_use(&tokens[i + 1..end]) {
                    out.paths.push(RawPath {
                        within: names.clone(),
                        segments,
                    });
                }
                i = end;
                continue;
            }
            "crate" | "super" | "self" if !after_path_sep(&tokens, i) => {
                let mut segments = vec![t.to_string()];
                let mut j = i + 1;
                while tokens.get(j).is_some_and(|s| s == "::")
                    && tokens.get(j + 1).is_some_and(|s| is_ident(s))
                {
                    segments.push(tokens[j + 1].clone());
                    j += 2;
                }
                if segments.len() > 1 {
                    out.paths.push(RawPath {
                        within: within.iter().map(|(n, _)| n.clone()).collect(),
                        segments,
                    });
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out.test_mods = test_mod_decls(&all);
    out.uses_clap = tokens.windows(2).any(|w| w[0] == "clap" && w[1] == "::");
    out
}

fn after_path_sep(tokens: &[String], i: usize) -> bool {
    i > 0 && tokens[i - 1] == "::"
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Names in `#[cfg(test)] mod name;`.
fn test_mod_decls(tokens: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if let Some(after) = cfg_test_at(tokens, i) {
            let mut j = skip_attributes(tokens, after);
            if tokens.get(j).is_some_and(|t| t == "pub") {
                j = skip_visibility(tokens, j);
            }
            if tokens.get(j).is_some_and(|t| t == "mod")
                && tokens.get(j + 2).is_some_and(|t| t == ";")
            {
                out.push(tokens[j + 1].clone());
            }
        }
        i += 1;
    }
    out
}

/// Where the item after `#[cfg(test)]` at `i` starts, if there is one.
fn cfg_test_at(tokens: &[String], i: usize) -> Option<usize> {
    let want = ["#", "[", "cfg", "(", "test", ")", "]"];
    (tokens.len() >= i + want.len() && tokens[i..i + want.len()].iter().eq(want.iter()))
        .then_some(i + want.len())
}

/// Skips `#[..]` attributes from `i` on.
fn skip_attributes(tokens: &[String], mut i: usize) -> usize {
    while tokens.get(i).is_some_and(|t| t == "#") && tokens.get(i + 1).is_some_and(|t| t == "[") {
        i = close_of(tokens, i + 1, "[", "]") + 1;
    }
    i
}

/// Skips `pub`, `pub(crate)`, `pub(super)`...
fn skip_visibility(tokens: &[String], i: usize) -> usize {
    if tokens.get(i + 1).is_some_and(|t| t == "(") {
        close_of(tokens, i + 1, "(", ")") + 1
    } else {
        i + 1
    }
}

/// The index of the token that closes the `open` at `i`.
fn close_of(tokens: &[String], i: usize, open: &str, close: &str) -> usize {
    let mut depth = 0usize;
    for (j, t) in tokens.iter().enumerate().skip(i) {
        if t == open {
            depth += 1;
        } else if t == close {
            depth -= 1;
            if depth == 0 {
                return j;
            }
        }
    }
    tokens.len()
}

/// The tokens without `#[cfg(test)]` items: each ends at its first `;`
/// outside brackets or with the block its first `{` opens.
fn drop_test_items(tokens: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        let Some(after) = cfg_test_at(tokens, i) else {
            out.push(tokens[i].clone());
            i += 1;
            continue;
        };
        let mut j = skip_attributes(tokens, after);
        let mut parens = 0i32;
        while j < tokens.len() {
            match tokens[j].as_str() {
                "(" | "[" => parens += 1,
                ")" | "]" => parens -= 1,
                ";" if parens == 0 => break,
                "{" if parens == 0 => {
                    j = close_of(tokens, j, "{", "}");
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        i = j + 1;
    }
    out
}

/// The paths of one `use` tree (the tokens between `use` and `;`), each
/// as its segments: groups expanded, `self` in a group is the prefix,
/// `as` renames and `*` dropped.
pub fn expand_use(tokens: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut i = 0;
    expand_tree(tokens, &mut i, &[], &mut out);
    out
}

fn expand_tree(tokens: &[String], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    // A leading `::` (`use ::std::..`) names another crate.
    if tokens.get(*i).is_some_and(|t| t == "::") {
        *i += 1;
        path.push("::".into());
    }
    loop {
        match tokens.get(*i).map(String::as_str) {
            Some("{") => {
                *i += 1;
                loop {
                    match tokens.get(*i).map(String::as_str) {
                        None => return,
                        Some("}") => {
                            *i += 1;
                            return;
                        }
                        Some(",") => *i += 1,
                        Some(_) => expand_tree(tokens, i, &path, out),
                    }
                }
            }
            Some("*") => {
                *i += 1;
                out.push(path);
                return;
            }
            Some("self") if !path.is_empty() => {
                *i += 1;
                skip_rename(tokens, i);
                out.push(path);
                return;
            }
            Some(t) if is_ident(t) => {
                path.push(t.to_string());
                *i += 1;
                if tokens.get(*i).is_some_and(|t| t == "::") {
                    *i += 1;
                    continue;
                }
                skip_rename(tokens, i);
                out.push(path);
                return;
            }
            _ => {
                // Not a path (e.g. a stray token): stop this branch.
                *i += 1;
                return;
            }
        }
    }
}

fn skip_rename(tokens: &[String], i: &mut usize) {
    if tokens.get(*i).is_some_and(|t| t == "as") {
        *i += 2;
    }
}

/// Rust code as tokens: identifiers, `::` and single punctuation, with
/// comments, string, byte-string and char literals left out (lifetimes
/// stay out too). Enough to find paths and match brackets.
pub fn tokenize(code: &str) -> Vec<String> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            i = skip_block_comment(&c, i);
        } else if let Some(end) = raw_string_end(&c, i) {
            i = end;
        } else if ch == '"' || (ch == 'b' && next == Some('"')) {
            i = skip_string(&c, if ch == 'b' { i + 1 } else { i });
        } else if ch == '\'' || (ch == 'b' && next == Some('\'')) {
            i = skip_char_or_lifetime(&c, if ch == 'b' { i + 1 } else { i });
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(c[start..i].iter().collect());
        } else if ch == ':' && next == Some(':') {
            out.push("::".into());
            i += 2;
        } else {
            out.push(ch.to_string());
            i += 1;
        }
    }
    out
}

fn skip_block_comment(c: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// The end of a raw string `r"..."`, `r#"..."#`, `br#".."#` at `i`, if one starts there.
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(j)
}

fn skip_string(c: &[char], mut i: usize) -> usize {
    i += 1;
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// A char literal (`'a'`, `'\n'`, `'\u{1F600}'`) is skipped whole; a
/// lifetime or label (`'a`) only its quote.
fn skip_char_or_lifetime(c: &[char], i: usize) -> usize {
    if c.get(i + 1) == Some(&'\\') {
        let mut j = i + 2;
        while j < c.len() && c[j] != '\'' {
            j += 1;
        }
        return j + 1;
    }
    if c.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    i + 1
}

/// The strongly connected components of more than one module (Tarjan),
/// each sorted, in the order of their smallest module.
pub fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.g.edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.found.push(comp);
                }
            }
        }
    }
    let mut t = Tarjan {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    let nodes: BTreeSet<&str> = g
        .modules
        .iter()
        .map(String::as_str)
        .chain(g.edges.keys().map(String::as_str))
        .collect();
    for v in nodes {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found.sort();
    t.found
}

/// Elementary cycles of one component that together use every edge inside
/// it: for each edge not yet on a cycle, the edge and the shortest way
/// back. Each starts at its smallest module.
pub fn covering_cycles(g: &Graph, component: &[String]) -> Vec<Vec<String>> {
    let inside: BTreeSet<&str> = component.iter().map(String::as_str).collect();
    let next = |v: &str| -> Vec<&str> {
        g.edges
            .get(v)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .filter(|w| inside.contains(w))
            .collect()
    };
    let mut covered: BTreeSet<(String, String)> = BTreeSet::new();
    let mut out: Vec<Vec<String>> = Vec::new();
    for &u in &inside {
        for v in next(u) {
            if covered.contains(&(u.to_string(), v.to_string())) {
                continue;
            }
            let Some(back) = shortest_path(v, u, &next) else {
                continue;
            };
            let mut cycle: Vec<String> = std::iter::once(u.to_string())
                .chain(back.iter().map(|s| s.to_string()))
                .collect();
            cycle.pop(); // `back` ends at `u` again
            for k in 0..cycle.len() {
                let to = &cycle[(k + 1) % cycle.len()];
                covered.insert((cycle[k].clone(), to.clone()));
            }
            let start = (0..cycle.len())
                .min_by_key(|&k| &cycle[k])
                .unwrap_or_default();
            cycle.rotate_left(start);
            if !out.contains(&cycle) {
                out.push(cycle);
            }
        }
    }
    out.sort();
    out
}

/// The shortest path from `from` to `to` (both included), breadth first.
fn shortest_path<'a>(
    from: &'a str,
    to: &'a str,
    next: &dyn Fn(&str) -> Vec<&'a str>,
) -> Option<Vec<&'a str>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    let mut seen = BTreeSet::from([from]);
    while let Some(v) = queue.pop_front() {
        if v == to {
            let mut path = vec![v];
            let mut at = v;
            while let Some(&p) = came_from.get(at) {
                path.push(p);
                at = p;
            }
            path.reverse();
            return Some(path);
        }
        for w in next(v) {
            if seen.insert(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    None
}

/// The layers under the commands: they take plain types (from `spec` and
/// `model`) and never reach up to the command line.
pub const DOMAIN: [&str; 10] = [
    "bench_forward",
    "ebpf",
    "export",
    "model",
    "probe",
    "scenario",
    "stats",
    "sys",
    "testbed",
    "tune",
];

/// What a domain module must not import: the commands, their parse result
/// and the run they drive.
const ABOVE_DOMAIN: [&str; 3] = ["app", "cli", "runner"];

/// The top-level module of a module path (`probe::remote` -> `probe`).
fn layer(module: &str) -> &str {
    module.split("::").next().unwrap_or("")
}

/// Every break of the layering rules (see the module docs), one line each:
/// `probe::remote -> runner` or `tune::knob_spec uses clap`.
pub fn layer_violations(g: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for (from, tos) in &g.edges {
        let from_layer = layer(from);
        if !DOMAIN.contains(&from_layer) {
            continue;
        }
        for to in tos {
            let to_layer = layer(to);
            if ABOVE_DOMAIN.contains(&to_layer) || (from_layer == "export" && to_layer == "probe") {
                out.push(format!("{from} -> {to}"));
            }
        }
    }
    for m in &g.clap_users {
        if DOMAIN.contains(&layer(m)) {
            out.push(format!("{m} uses clap"));
        }
    }
    out.sort();
    out
}

/// Every cycle of the graph as `a -> b -> c -> a` lines ("" for the crate root).
pub fn cycle_lines(g: &Graph) -> Vec<String> {
    let name = |m: &str| {
        if m.is_empty() {
            "crate".to_string()
        } else {
            m.to_string()
        }
    };
    cycles(g)
        .iter()
        .flat_map(|c| covering_cycles(g, c))
        .map(|cycle| {
            let mut parts: Vec<String> = cycle.iter().map(|m| name(m)).collect();
            parts.push(name(&cycle[0]));
            parts.join(" -> ")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn uses(code: &str) -> Vec<Vec<String>> {
        expand_use(&tokenize(code))
    }

    #[test]
    fn module_paths_follow_the_file_layout() {
        let m = |p: &str| module_path(Path::new(p));
        assert_eq!(m("lib.rs").as_deref(), Some(""));
        assert_eq!(m("main.rs").as_deref(), Some(""));
        assert_eq!(m("app/mod.rs").as_deref(), Some("app"));
        assert_eq!(m("probe/remote.rs").as_deref(), Some("probe::remote"));
        assert_eq!(m("export/plot/mod.rs").as_deref(), Some("export::plot"));
        assert_eq!(m("export/lib.rs").as_deref(), Some("export::lib"));
        assert_eq!(m("bin/tool.rs"), None);
        assert_eq!(m("README.md"), None);
    }

    #[test]
    fn use_groups_expand_and_renames_drop() {
        assert_eq!(
            uses("crate::{a, b::{c, d as e}, f::self, g::*}"),
            vec![
                s(&["crate", "a"]),
                s(&["crate", "b", "c"]),
                s(&["crate", "b", "d"]),
                s(&["crate", "f"]),
                s(&["crate", "g"]),
            ]
        );
        assert_eq!(
            uses("super::{self, x::Y as Z}"),
            vec![s(&["super"]), s(&["super", "x", "Y"])]
        );
        assert_eq!(uses("::std::io"), vec![s(&["::", "std", "io"])]);
    }

    #[test]
    fn scan_finds_uses_and_inline_paths_but_not_comments_strings_or_tests() {
        let code = r##"
            //! See [`crate::nope::a`].
            use crate::{runner::RunOutcome, export::{csv, live as l}};
            use super::sibling::Thing;
            /* crate::nope::b */
            fn f<'a>(x: &'a str) -> char {
                let _ = "crate::nope::c";
                let _ = r#"crate::nope::d"#;
                crate::app::with_signals(true, |_| Ok(()));
                let c = '"'; let _ = crate::model::units::parse(c);
                '{'
            }
            #[cfg(test)]
            mod tests { use crate::nope::e; fn g() { crate::nope::f(); } }
            #[cfg(test)]
            mod helpers;
            #[cfg(test)]
            pub mod fake;
            #[cfg(test)]
            pub(crate) mod more_tests { use crate::nope::g; }
            mod inner { use super::super::up::X; }
        "##;
        let sc = scan(code);
        let mut got = sc.paths("a::b");
        got.sort();
        let mut want = vec![
            s(&["runner", "RunOutcome"]),
            s(&["export", "csv"]),
            s(&["export", "live"]),
            s(&["a", "sibling", "Thing"]),
            s(&["app", "with_signals"]),
            s(&["model", "units", "parse"]),
            s(&["a", "up", "X"]),
        ];
        want.sort();
        assert_eq!(got, want);
        assert_eq!(sc.test_mods, s(&["helpers", "fake"]));
    }

    fn graph(files: &[(&str, &str)]) -> Graph {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(m, c)| (m.to_string(), c.to_string()))
            .collect();
        build(&files)
    }

    #[test]
    fn paths_resolve_to_the_longest_module_and_nesting_is_no_edge() {
        let g = graph(&[
            ("", "pub mod a; pub mod b;"),
            (
                "a",
                "pub mod x; use crate::a::x::Y; use crate::b::Thing::method;",
            ),
            ("a::x", "use super::Z; use crate::b::c::deep;"),
            ("b", "pub mod c;"),
            ("b::c", "use crate::nothing_here;"),
        ]);
        assert_eq!(g.edges["a"], BTreeSet::from(["b".to_string()]));
        assert_eq!(g.edges["a::x"], BTreeSet::from(["b::c".to_string()]));
        assert!(g.edges["b::c"].is_empty());
        assert!(g.edges[""].is_empty());
        assert!(cycles(&g).is_empty());
    }

    #[test]
    fn a_cycle_is_found_and_printed_as_a_loop() {
        let g = graph(&[
            ("app", "use crate::runner::execute;"),
            ("runner", "fn f() { crate::probe::remote::execute(); }"),
            ("probe", "pub mod remote; pub mod reflect;"),
            (
                "probe::remote",
                "use crate::runner::RunOutcome; use super::reflect::x;",
            ),
            ("probe::reflect", "use crate::app::with_signals;"),
            ("stats", "use crate::app::x;"),
        ]);
        assert_eq!(
            cycles(&g),
            vec![s(&["app", "probe::reflect", "probe::remote", "runner"])]
        );
        assert_eq!(
            cycle_lines(&g),
            vec![
                "app -> runner -> probe::remote -> probe::reflect -> app",
                "probe::remote -> runner -> probe::remote",
            ]
        );
    }

    #[test]
    fn an_acyclic_graph_has_no_cycle_and_two_loops_are_two_components() {
        let chain = graph(&[
            ("a", "use crate::b::X;"),
            ("b", "use crate::c::Y;"),
            ("c", ""),
        ]);
        assert!(cycle_lines(&chain).is_empty());
        let two = graph(&[
            ("a", "use crate::b::X;"),
            ("b", "use crate::a::Y;"),
            ("c", "use crate::d::X;"),
            ("d", "use crate::c::Y;"),
        ]);
        assert_eq!(cycles(&two).len(), 2);
        assert_eq!(cycle_lines(&two), vec!["a -> b -> a", "c -> d -> c"]);
    }

    #[test]
    fn a_domain_module_importing_the_commands_or_clap_breaks_the_layers() {
        let g = graph(&[
            ("app", "use clap::Parser; use crate::runner::execute;"),
            (
                "cli",
                "#[derive(clap::Args)] struct A; use crate::tune::KnobSpec;",
            ),
            ("spec::knobs", "use clap::Args; use crate::tune::KnobSpec;"),
            ("runner", "use crate::probe::x;"),
            (
                "tune::knob_spec",
                "#[derive(clap::Args)] pub struct KnobSpec;",
            ),
            (
                "export::plot",
                "use ::clap::ValueEnum; use crate::probe::Record;",
            ),
            (
                "probe::remote",
                "fn f() { crate::runner::RunOutcome::ok(); }",
            ),
            ("scenario", "use crate::cli::Cli;"),
            ("probe", "pub mod remote; use crate::app::with_signals;"),
            (
                "stats",
                "// clap::Args in a comment\nfn f() -> &str { \"clap::x\" }\n\
                 #[cfg(test)] mod tests { use clap::Parser; use crate::cli::Cli; }",
            ),
        ]);
        assert_eq!(
            layer_violations(&g),
            vec![
                "export::plot -> probe",
                "export::plot uses clap",
                "probe -> app",
                "probe::remote -> runner",
                "scenario -> cli",
                "tune::knob_spec uses clap",
            ]
        );
        let clean = graph(&[("cli", "use clap::Args;"), ("tune", "use crate::model::x;")]);
        assert!(layer_violations(&clean).is_empty());
    }

    #[test]
    fn test_files_are_left_out() {
        assert!(is_test_file(Path::new("options/tests.rs")));
        assert!(is_test_file(Path::new("sys/sys_tests.rs")));
        assert!(is_test_file(Path::new("testutil.rs")));
        assert!(!is_test_file(Path::new("probe/latest.rs")));
    }
}
