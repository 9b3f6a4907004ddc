//! `rtprobe targets INVENTORY`: each host's peers file and Prometheus'
//! file_sd list from one fleet inventory ([`crate::options::inventory`]).
//! Nothing is written unless the whole inventory passes its checks; each
//! file is written whole or not at all.

use std::{io::Write, path::Path, process::ExitCode};

use anyhow::{Context, Result, anyhow};

use crate::{cli::TargetsArgs, options::inventory};

pub(super) fn command(a: &TargetsArgs) -> Result<ExitCode> {
    let inv = inventory::read(&a.inventory)?;
    if let Some(name) = &a.host {
        let host = inv.host(name).ok_or_else(|| {
            let names: Vec<&str> = inv.hosts.iter().map(|h| h.name.as_str()).collect();
            anyhow!(
                "{}: no [[host]] named {name:?}: give one of {}",
                a.inventory.display(),
                names.join(", ")
            )
        })?;
        return print(&inv.peers_toml(host));
    }
    if let Some(dir) = &a.out_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create {}: check the path", dir.display()))?;
        for h in &inv.hosts {
            let path = dir.join(format!("{}.toml", h.name));
            write(&path, &inv.peers_toml(h))?;
        }
    }
    if let Some(file) = &a.prometheus_sd {
        write(file, &inv.prometheus_sd())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `text` to `path` (atomically) and prints the path.
fn write(path: &Path, text: &str) -> Result<()> {
    crate::export::atomic::write(path, text.as_bytes()).map_err(|e| anyhow!("{e}"))?;
    println!("{}", path.display());
    Ok(())
}

fn print(text: &str) -> Result<ExitCode> {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        // `rtprobe targets inv --host h1 | head` is no error.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("cannot write the peers file to stdout")
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}
