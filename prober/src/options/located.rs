//! Where in a TOML file a problem is: "FILE:LINE:COL: key: message" for
//! the scenario files and the bench-forward sweep files alike, from the
//! error's byte span and the key around it.

use std::{fmt, path::Path};

use anyhow::anyhow;

/// 1-based line and column of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// Dotted key path of the innermost entry around `offset`, and its key's span.
fn key_at(text: &str, offset: usize) -> Option<(String, std::ops::Range<usize>)> {
    use toml::de::{DeTable, DeValue};
    fn walk(
        t: &DeTable<'_>,
        prefix: &str,
        offset: usize,
        best: &mut Option<(String, std::ops::Range<usize>)>,
    ) {
        for (k, v) in t.iter() {
            let path = if prefix.is_empty() {
                k.get_ref().to_string()
            } else {
                format!("{prefix}.{}", k.get_ref())
            };
            let (ks, vs) = (k.span(), v.span());
            match v.get_ref() {
                DeValue::Table(inner) => walk(inner, &path, offset, best),
                // An array of tables ([[target]]): each as `key[i]`, from 1.
                DeValue::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        if let DeValue::Table(inner) = item.get_ref() {
                            walk(inner, &format!("{path}[{}]", i + 1), offset, best);
                        }
                    }
                }
                _ => {}
            }
            let inside = ks.start <= offset && offset <= vs.end.max(ks.end);
            if inside && best.as_ref().is_none_or(|(_, s)| ks.start >= s.start) {
                *best = Some((path, ks));
            }
        }
    }
    let doc = DeTable::parse(text).ok()?;
    let mut best = None;
    walk(doc.get_ref(), "", offset, &mut best);
    best
}

/// Span of a dotted key path (e.g. "set.bql.qdisc").
pub(crate) fn key_span(text: &str, path: &[&str]) -> Option<std::ops::Range<usize>> {
    use toml::de::{DeTable, DeValue};
    let doc = DeTable::parse(text).ok()?;
    let mut t = doc.get_ref();
    for (i, p) in path.iter().enumerate() {
        let (k, v) = t.iter().find(|(k, _)| k.get_ref() == p)?;
        if i + 1 == path.len() {
            return Some(k.span());
        }
        match v.get_ref() {
            DeValue::Table(inner) => t = inner,
            _ => return Some(k.span()),
        }
    }
    None
}

/// "FILE:LINE:COL: key: message" for a problem at `path` in the file.
pub(crate) fn located(
    file: &Path,
    text: &str,
    path: &[&str],
    msg: impl fmt::Display,
) -> anyhow::Error {
    let key = path.join(".");
    match key_span(text, path) {
        Some(s) => {
            let (l, c) = line_col(text, s.start);
            anyhow!("{}:{l}:{c}: {key}: {msg}", file.display())
        }
        None => anyhow!("{}: {key}: {msg}", file.display()),
    }
}

/// "FILE:LINE:COL: key: message" for any TOML file read with serde (the
/// bench-forward sweep files too): the error's span, and the key around it.
pub(crate) fn located_toml_error(file: &Path, text: &str, e: &toml::de::Error) -> anyhow::Error {
    let msg = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(s) => {
            let (l, c) = line_col(text, s.start);
            match key_at(text, s.start) {
                Some((key, _)) => anyhow!("{}:{l}:{c}: {key}: {msg}", file.display()),
                None => anyhow!("{}:{l}:{c}: {msg}", file.display()),
            }
        }
        None => anyhow!("{}: {msg}", file.display()),
    }
}
