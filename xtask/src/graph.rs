//! `cargo xtask graph`: prober's imports against the layer table of
//! docs/ARCHITECTURE.md, and their cycles; see [`crate::modgraph`].

use std::{fs, path::Path};

use anyhow::{Context, Result, bail};

use crate::{
    modgraph::{self, cycles, layers},
    workspace_root,
};

/// The page whose `## The layers` block is the layer table.
const ARCHITECTURE: &str = "docs/ARCHITECTURE.md";

/// `cargo xtask graph`: the layer breaks and cycles of prober's modules
/// (and with `edges` every dependency); an error when there is one.
pub(crate) fn graph(edges: bool) -> Result<()> {
    let root = workspace_root();
    let g = modgraph::load(&root.join("prober/src"))?;
    if edges {
        for (from, tos) in &g.edges {
            for to in tos {
                println!("{from} -> {to}");
            }
        }
    }
    check_module_graph(&root, &g)
}

/// The layer table, read from docs/ARCHITECTURE.md under `root`.
pub(crate) fn load_layers(root: &Path) -> Result<layers::Layers> {
    let path = root.join(ARCHITECTURE);
    let page = fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    layers::Layers::from_markdown(&page)
        .with_context(|| format!("the layer table of {ARCHITECTURE}"))
}

/// Fails on any import that breaks the layer table (up, within a row, a
/// module the table lacks, clap below the option model) and on any import
/// cycle between prober's modules, naming each.
pub(crate) fn check_module_graph(root: &Path, g: &modgraph::Graph) -> Result<()> {
    let layers = load_layers(root)?;
    let layering = layers::violations(g, &layers);
    let cycles = cycles::cycle_lines(g);
    if cycles.is_empty() && layering.is_empty() {
        eprintln!(
            "xtask: module graph: {} modules in {} layers, no import up or across a layer, \
             no import cycle",
            g.modules.len(),
            layers.rows.len()
        );
        return Ok(());
    }
    for line in layering.iter().chain(&cycles) {
        eprintln!("  {line}");
    }
    let mut why = Vec::new();
    if !layering.is_empty() {
        why.push(format!(
            "{} layering break(s): a module imports only modules in rows below its own in the \
             table of {ARCHITECTURE} (\"## The layers\"), every top-level module is in it, and \
             only {} name clap",
            layering.len(),
            layers::CLAP_ALLOWED.join(", ")
        ));
    }
    if !cycles.is_empty() {
        why.push(format!(
            "{} import cycle(s) between prober's modules: move what both sides need into a \
             lower module (a leaf), or the caller up",
            cycles.len()
        ));
    }
    bail!(
        "{} (listed above); docs/DEVELOPING.md explains the check",
        why.join("; ")
    )
}
