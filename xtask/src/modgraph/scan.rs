//! What one file's code refers to: its `use` trees and the paths inline in
//! its code, outside comments, literals and `#[cfg(test)]` items.

use super::tokens::{Tok, tokenize};

/// A path as written, relative to the inline module it is written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPath {
    /// Segments of the inline modules around it (`mod a { mod b { .. } }`).
    pub within: Vec<String>,
    /// As written: `crate::a::b`, `super::x`, `self::y`, `child::z`.
    pub segments: Vec<String>,
    /// Where it is written (1-based).
    pub line: usize,
}

/// A path made crate-absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub path: Vec<String>,
    pub line: usize,
    /// For a path written relative to its module (`child::x`, no `crate`,
    /// `self` or `super`): that module, which it names only when it
    /// resolves to one of that module's descendants (otherwise it is
    /// another crate, a type or a local name).
    pub under: Option<Vec<String>>,
}

/// What a file's code refers to.
#[derive(Debug, Default)]
pub struct Scan {
    pub paths: Vec<RawPath>,
    /// Modules declared `#[cfg(test)] mod name;` (their files are tests).
    pub test_mods: Vec<String>,
    /// The line of the first `clap::` path outside test items (`use
    /// clap::..`, `clap::Args`), if any.
    pub uses_clap: Option<usize>,
}

impl Scan {
    /// The crate-absolute paths, for a file whose module is `module`.
    pub fn paths(&self, module: &str) -> Vec<Target> {
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
                let (path, relative) = absolute(&here, &p.segments)?;
                Some(Target {
                    path,
                    line: p.line,
                    under: relative.then_some(here),
                })
            })
            .collect()
    }
}

/// `crate::..` as is; `super::`/`self::` against the module `here`; any
/// other name (a child module, another crate, a type) appended to `here`,
/// flagged relative; None for `::other_crate`.
fn absolute(here: &[String], segments: &[String]) -> Option<(Vec<String>, bool)> {
    let (first, rest) = segments.split_first()?;
    match first.as_str() {
        "crate" => Some((rest.to_vec(), false)),
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
            Some((at, false))
        }
        "::" => None,
        _ => {
            let mut at = here.to_vec();
            at.extend(segments.iter().cloned());
            Some((at, true))
        }
    }
}

/// Scans one file: its `use` trees and inline paths (`crate::a::b(..)`,
/// `super::x`, `child::y`), outside comments, string and char literals and
/// `#[cfg(test)]` items.
pub fn scan(code: &str) -> Scan {
    let all = tokenize(code);
    let tokens = drop_test_items(&all);
    let mut out = Scan::default();
    let mut within: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let names = || within.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        match tokens[i].as_str() {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if within.last().is_some_and(|(_, d)| *d == depth) {
                    within.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|b| b == "{") => {
                within.push((tokens[i + 1].text.clone(), depth));
            }
            "use" => {
                let end = tokens[i..]
                    .iter()
                    .position(|t| t == ";")
                    .map_or(tokens.len(), |p| i + p);
                for (segments, line) in expand_use(&tokens[i + 1..end]) {
                    let within = names();
                    out.paths.push(RawPath {
                        within,
                        segments,
                        line,
                    });
                }
                i = end;
                continue;
            }
            t if is_ident(t) && !after_path_sep(&tokens, i) => {
                let (segments, j) = inline_path(&tokens, i);
                if segments.len() > 1 {
                    out.paths.push(RawPath {
                        within: names(),
                        segments,
                        line: tokens[i].line,
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
    out.uses_clap = tokens
        .windows(2)
        .find(|w| w[0] == "clap" && w[1] == "::")
        .map(|w| w[0].line);
    out
}

/// The segments of the path `a::b::c` that starts at `i`, and the index
/// after it.
fn inline_path(tokens: &[Tok], i: usize) -> (Vec<String>, usize) {
    let mut segments = vec![tokens[i].text.clone()];
    let mut j = i + 1;
    while tokens.get(j).is_some_and(|s| s == "::")
        && tokens.get(j + 1).is_some_and(|s| is_ident(s.as_str()))
    {
        segments.push(tokens[j + 1].text.clone());
        j += 2;
    }
    (segments, j)
}

fn after_path_sep(tokens: &[Tok], i: usize) -> bool {
    i > 0 && tokens[i - 1] == "::"
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Names in `#[cfg(test)] mod name;`.
fn test_mod_decls(tokens: &[Tok]) -> Vec<String> {
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
                out.push(tokens[j + 1].text.clone());
            }
        }
        i += 1;
    }
    out
}

/// Where the item after `#[cfg(test)]` at `i` starts, if there is one.
fn cfg_test_at(tokens: &[Tok], i: usize) -> Option<usize> {
    let want = ["#", "[", "cfg", "(", "test", ")", "]"];
    (tokens.len() >= i + want.len() && tokens[i..i + want.len()].iter().eq(want.iter()))
        .then_some(i + want.len())
}

/// Skips `#[..]` attributes from `i` on.
fn skip_attributes(tokens: &[Tok], mut i: usize) -> usize {
    while tokens.get(i).is_some_and(|t| t == "#") && tokens.get(i + 1).is_some_and(|t| t == "[") {
        i = close_of(tokens, i + 1, "[", "]") + 1;
    }
    i
}

/// Skips `pub`, `pub(crate)`, `pub(super)`...
fn skip_visibility(tokens: &[Tok], i: usize) -> usize {
    if tokens.get(i + 1).is_some_and(|t| t == "(") {
        close_of(tokens, i + 1, "(", ")") + 1
    } else {
        i + 1
    }
}

/// The index of the token that closes the `open` at `i`.
fn close_of(tokens: &[Tok], i: usize, open: &str, close: &str) -> usize {
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
fn drop_test_items(tokens: &[Tok]) -> Vec<Tok> {
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
pub fn expand_use(tokens: &[Tok]) -> Vec<(Vec<String>, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    expand_tree(tokens, &mut i, &[], &mut out);
    out
}

fn expand_tree(
    tokens: &[Tok],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, usize)>,
) {
    let mut path = prefix.to_vec();
    // A leading `::` (`use ::std::..`) names another crate.
    if tokens.get(*i).is_some_and(|t| t == "::") {
        *i += 1;
        path.push("::".into());
    }
    loop {
        match tokens.get(*i).map(Tok::as_str) {
            Some("{") => {
                *i += 1;
                loop {
                    match tokens.get(*i).map(Tok::as_str) {
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
                out.push((path, line_before(tokens, *i)));
                return;
            }
            Some("self") if !path.is_empty() => {
                *i += 1;
                skip_rename(tokens, i);
                out.push((path, line_before(tokens, *i)));
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
                out.push((path, line_before(tokens, *i)));
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

/// The line of the token before `i` (the last one a path took).
fn line_before(tokens: &[Tok], i: usize) -> usize {
    tokens
        .get(i.saturating_sub(1))
        .or(tokens.last())
        .map_or(0, |t| t.line)
}

fn skip_rename(tokens: &[Tok], i: &mut usize) {
    if tokens.get(*i).is_some_and(|t| t == "as") {
        *i += 2;
    }
}
