//! `cargo xtask demo`: the main job, end to end on a fresh veth testbed.

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::{cargo, is_root, run, setup::setup, workspace_root};

pub(crate) fn demo(out_dir: &Path, count: u64) -> Result<()> {
    if !is_root() {
        bail!(
            "the demo builds network namespaces and loads XDP: run it as root (sudo -E cargo xtask demo)"
        );
    }
    setup()?;
    let root = workspace_root();
    run(Command::new(cargo())
        .current_dir(&root)
        .args(["build", "--release", "-p", "rtprobe"]))?;
    let bin = root.join("target/release/rtprobe");
    let out_dir = if out_dir.is_absolute() {
        out_dir.to_path_buf()
    } else {
        root.join(out_dir)
    };
    std::fs::create_dir_all(&out_dir).with_context(|| format!("create {}", out_dir.display()))?;
    let csv = out_dir.join("out.csv");
    let json = out_dir.join("out.json");
    run(Command::new(&bin)
        .args(["--xdp-mode", "native", "--size", "64", "--interval", "1ms"])
        .args([
            "--count".as_ref(),
            count.to_string().as_ref(),
            "--out".as_ref(),
            csv.as_os_str(),
            "--json".as_ref(),
            json.as_os_str(),
        ]))?;
    run(Command::new(&bin).arg("plot").arg(&csv))?;
    eprintln!(
        "xtask: demo done: {} (CSV, JSON summary and figures)",
        out_dir.display()
    );
    Ok(())
}
