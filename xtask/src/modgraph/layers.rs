//! The layer table and the imports that break it.
//!
//! The table lives once, in docs/ARCHITECTURE.md: the first fenced block
//! under the `## The layers` heading, one row a line, top to bottom, each
//! `module, module: what lives there`. A module may import only modules in
//! rows below its own; test code is out of the graph already.

use std::collections::BTreeSet;

use anyhow::{Result, bail};

use super::{Graph, top};

/// The heading the table sits under.
pub const HEADING: &str = "## The layers";

/// The modules that may name `clap::` paths outside their tests: the
/// command line and the option model it flattens.
pub const CLAP_ALLOWED: [&str; 3] = ["app", "cli", "options"];

/// The rows of the table, top to bottom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layers {
    pub rows: Vec<Vec<String>>,
}

impl Layers {
    /// The table of a markdown page (see the module docs).
    pub fn from_markdown(page: &str) -> Result<Layers> {
        let mut lines = page.lines().skip_while(|l| l.trim_end() != HEADING);
        if lines.next().is_none() {
            bail!("no `{HEADING}` heading");
        }
        if !lines.any(|l| l.trim_start().starts_with("```")) {
            bail!("no fenced block under `{HEADING}`");
        }
        let mut rows = Vec::new();
        for line in lines.take_while(|l| !l.trim_start().starts_with("```")) {
            if line.trim().is_empty() {
                continue;
            }
            let Some((names, _what)) = line.split_once(':') else {
                bail!("layer row without `modules: what lives there`: {line:?}");
            };
            let row: Vec<String> = names.split(',').map(|n| n.trim().to_string()).collect();
            if row.iter().any(|n| !is_module_name(n)) {
                bail!("layer row with a bad module name: {line:?}");
            }
            rows.push(row);
        }
        if rows.is_empty() {
            bail!("the block under `{HEADING}` has no rows");
        }
        Ok(Layers { rows })
    }

    /// The row of a top-level module (0 = the top), if the table has it.
    pub fn row(&self, module: &str) -> Option<usize> {
        self.rows.iter().position(|r| r.iter().any(|m| m == module))
    }
}

fn is_module_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// Every break of the layers, one line each, in file order:
/// `prober/src/export/text.rs:12: export -> tune (up the table)`,
/// `... (same row)`, `prober/src/engine.rs: engine is not in the layer
/// table`, `prober/src/tune/knob_spec.rs:3: tune names clap`.
pub fn violations(g: &Graph, layers: &Layers) -> Vec<String> {
    let mut out = unknown_modules(g, layers);
    let mut seen = BTreeSet::new();
    for i in &g.imports {
        let (from, to) = (top(&i.from), top(&i.to));
        if from.is_empty() || to.is_empty() || from == to {
            continue;
        }
        let (Some(rf), Some(rt)) = (layers.row(from), layers.row(to)) else {
            continue; // reported as unknown above
        };
        let why = match rt.cmp(&rf) {
            std::cmp::Ordering::Greater => continue,
            std::cmp::Ordering::Equal => "same row",
            std::cmp::Ordering::Less => "up the table",
        };
        if seen.insert((i.file.clone(), i.line, to)) {
            out.push(format!("{}:{}: {from} -> {to} ({why})", i.file, i.line));
        }
    }
    for (module, line) in &g.clap_users {
        let t = top(module);
        if !t.is_empty() && !CLAP_ALLOWED.contains(&t) {
            let file = g.files.get(module).map_or(module.as_str(), String::as_str);
            out.push(format!(
                "{file}:{line}: {t} names clap (only {} may)",
                CLAP_ALLOWED.join(", ")
            ));
        }
    }
    out
}

/// Each top-level module of the graph that the table lacks.
fn unknown_modules(g: &Graph, layers: &Layers) -> Vec<String> {
    let tops: BTreeSet<&str> = g.modules.iter().map(|m| top(m)).collect();
    tops.into_iter()
        .filter(|t| !t.is_empty() && layers.row(t).is_none())
        .map(|t| {
            let file = g.files.get(t).map_or(t, String::as_str);
            format!("{file}: {t} is not in the layer table")
        })
        .collect()
}
