//! `cargo xtask graph`: the module graph's checks, see [`crate::modgraph`].

use anyhow::{Result, bail};

use crate::{modgraph, workspace_root};

/// `cargo xtask graph`: prober's module cycles (and with `edges` every
/// dependency); an error when there is a cycle.
pub(crate) fn graph(edges: bool) -> Result<()> {
    let g = modgraph::load(&workspace_root().join("prober/src"))?;
    if edges {
        for (from, tos) in &g.edges {
            for to in tos {
                println!("{} -> {to}", if from.is_empty() { "crate" } else { from });
            }
        }
    }
    check_module_graph(&g)
}

/// Fails on any import cycle between prober's modules, naming each, and
/// on any domain module that reaches up to the commands or names clap.
pub(crate) fn check_module_graph(g: &modgraph::Graph) -> Result<()> {
    let cycles = modgraph::cycle_lines(g);
    let layering = modgraph::layer_violations(g);
    if cycles.is_empty() && layering.is_empty() {
        eprintln!(
            "xtask: module graph: {} modules, no import cycle, no layering break",
            g.modules.len()
        );
        return Ok(());
    }
    for line in cycles.iter().chain(&layering) {
        eprintln!("  {line}");
    }
    let mut why = Vec::new();
    if !cycles.is_empty() {
        why.push(format!(
            "{} import cycle(s) between prober's modules: move what both sides need into a \
             lower module (model/, a leaf), or the caller up into app/",
            cycles.len()
        ));
    }
    if !layering.is_empty() {
        why.push(format!(
            "{} layering break(s): a domain module ({}) never imports app, cli, runner or clap \
             (flags and their ValueEnum impls live in cli.rs and options/), and export never \
             imports probe",
            layering.len(),
            modgraph::DOMAIN.join(", ")
        ));
    }
    bail!(
        "{} (listed above); docs/DEVELOPING.md explains the layers",
        why.join("; ")
    )
}
