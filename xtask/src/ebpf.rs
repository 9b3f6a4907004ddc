//! `cargo xtask build-ebpf`: the XDP router object, built on the pinned
//! nightly for bpfel-unknown-none as prober/build.rs builds it.

use std::{
    env,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use xdp_common::{EBPF_TARGET, EBPF_TOOLCHAIN};

use crate::{output_of, setup::rust_src_present, show, workspace_root};

pub(crate) const EBPF_PACKAGE: &str = "xdp-router";

/// What `bpf_target_arch` the eBPF crates are compiled for (aya-ebpf uses
/// it to pick pt_regs layouts); the host's, as aya-build does.
fn bpf_target_arch() -> &'static str {
    match env::consts::ARCH {
        a if a.starts_with("riscv64") => "riscv64",
        a => a,
    }
}

/// `cargo` of the pinned nightly. The stable toolchain running xtask must
/// not leak into it.
pub(crate) fn nightly_cargo() -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", EBPF_TOOLCHAIN, "cargo"])
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO");
    cmd
}

/// `cargo SUBCOMMAND` over the eBPF crate as the eBPF build does it: the
/// pinned nightly, bpfel-unknown-none, `-Z build-std=core` and the flags
/// aya-build uses from prober/build.rs.
pub(crate) fn ebpf_cargo(root: &Path, subcommand: &str) -> Command {
    let rustflags = [
        format!("--cfg=bpf_target_arch=\"{}\"", bpf_target_arch()),
        "-Cdebuginfo=2".to_string(),
        "-Clink-arg=--btf".to_string(),
    ]
    .join("\x1f");
    let mut cmd = nightly_cargo();
    cmd.current_dir(root)
        .arg(subcommand)
        .args(["--package", EBPF_PACKAGE, "--bins", "--release"])
        .args(["--target", EBPF_TARGET, "-Z", "build-std=core"])
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags);
    cmd
}

pub(crate) fn build_ebpf() -> Result<PathBuf> {
    if output_of("rustup", &["run", EBPF_TOOLCHAIN, "rustc", "-V"]).is_none()
        || !rust_src_present(EBPF_TOOLCHAIN)
    {
        bail!("toolchain {EBPF_TOOLCHAIN} with rust-src is missing: run `cargo xtask setup`");
    }
    if output_of("bpf-linker", &["--version"]).is_none() {
        bail!("bpf-linker is not on PATH: run `cargo xtask setup`");
    }
    let mut cmd = ebpf_cargo(&workspace_root(), "build");
    cmd.arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped());
    eprintln!("xtask: running {}", show(&cmd));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {}", show(&cmd)))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut object = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo output")?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && msg["target"]["name"] == EBPF_PACKAGE
            && let Some(exe) = msg["executable"].as_str()
        {
            object = Some(PathBuf::from(exe));
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!("building {EBPF_PACKAGE} failed ({status})");
    }
    object.with_context(|| format!("cargo built no {EBPF_PACKAGE} object"))
}
