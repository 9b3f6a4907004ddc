//! `cargo xtask setup`: installs, idempotently, what a fresh Debian machine
//! lacks (apt packages, the pinned nightly with rust-src and clippy,
//! bpf-linker, cargo-fuzz, cargo-deb, scapy). The stable toolchain that
//! runs it is rust-toolchain.toml's, which rustup installs before xtask
//! can run (`rustup toolchain install` where RUSTUP_AUTO_INSTALL=0).

use std::{
    env,
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use xdp_common::{BPF_LINKER_VERSION, EBPF_TOOLCHAIN};

use crate::{cargo, dist, ebpf::nightly_cargo, is_root, output_of, run, workspace_root};

/// Debian packages rtprobe's build, tests and comparisons use.
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev", // bpf-linker links against LLVM 22
    "iperf3",
    "irtt",
    "sockperf",
    "xdp-tools",
    "bpftool",
    "tshark",
    "tcpdump", // rtprobe flows' round trip against a capture (cargo xtask bench --only flows)
    "stress-ng",
    "ethtool",
    "iproute2",
    "iputils-ping",            // the ping column of cargo xtask bench
    "rt-tests",                // cyclictest: the machine's wake-up latency next to the pacing rows
    "prometheus", // a real server scrapes a probe run; promtool checks metrics and deploy/
    "prometheus-alertmanager", // amtool checks deploy/alertmanager/
    "g++",        // libFuzzer (cargo fuzz) is C++
    "systemd",    // systemd-analyze verify/security over the .deb's units (tests/dist_e2e.rs)
    "man-db",     // systemd-analyze verify looks up each unit's man: documentation
    "curl",       // the metrics tests scrape /metrics from inside a namespace
];
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
/// The cargo-fuzz release `cargo xtask setup` installs (any patch level).
const CARGO_FUZZ_MINOR: &str = "0.13";

pub(crate) fn setup() -> Result<()> {
    setup_apt()?;
    setup_toolchain()?;
    setup_bpf_linker()?;
    setup_component("clippy", "clippy")?;
    setup_component("fmt", "rustfmt")?;
    setup_cargo_fuzz()?;
    dist::setup_cargo_deb()?;
    setup_scapy();
    eprintln!("xtask: setup complete");
    Ok(())
}

/// A component of the workspace's toolchain that `cargo xtask test` runs
/// (`cargo clippy`, `cargo fmt`; rustup's minimal profile leaves them out).
fn setup_component(subcommand: &str, component: &str) -> Result<()> {
    let present = Command::new(cargo())
        .args([subcommand, "--version"])
        .current_dir(workspace_root())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        eprintln!("xtask: {component} present, skipped");
        return Ok(());
    }
    if output_of("rustup", &["--version"]).is_none() {
        bail!(
            "cargo {subcommand} not found and no rustup: install {component} for your Rust toolchain"
        );
    }
    run(Command::new("rustup")
        .args(["component", "add", component])
        .current_dir(workspace_root()))
}

/// `cargo-fuzz 0.13.2` -> true when it is the pinned minor release.
fn cargo_fuzz_version_ok(version_line: &str) -> bool {
    version_line
        .strip_prefix("cargo-fuzz ")
        .is_some_and(|v| v.starts_with(&format!("{CARGO_FUZZ_MINOR}.")))
}

/// cargo-fuzz, which builds and runs the targets in fuzz/ on the pinned
/// nightly (libFuzzer's instrumentation needs `-Z` flags).
fn setup_cargo_fuzz() -> Result<()> {
    let current = output_of(
        "rustup",
        &["run", EBPF_TOOLCHAIN, "cargo", "fuzz", "--version"],
    );
    if let Some(v) = &current
        && cargo_fuzz_version_ok(v)
    {
        eprintln!("xtask: {v} present, skipped");
        return Ok(());
    }
    let version_req = format!("~{CARGO_FUZZ_MINOR}");
    let mut install = nightly_cargo();
    install.args([
        "install",
        "cargo-fuzz",
        "--version",
        &version_req,
        "--locked",
        "--force",
    ]);
    run(&mut install)
}

/// scapy, the independent STAMP implementation rtprobe's interop tests
/// compare against (prober/src/probe/stamp/scapy_interop.rs). Those tests
/// print SKIPPED without it, so a failed install warns instead of stopping
/// the set-up.
fn setup_scapy() {
    if output_of("python3", &["-c", "import scapy"]).is_some() {
        eprintln!("xtask: python3 scapy present, skipped");
        return;
    }
    let mut pip = Command::new("python3");
    pip.args(["-m", "pip", "install", "--quiet", "scapy"]);
    if let Err(e) = run(&mut pip) {
        eprintln!("xtask: warning: {e:#}; the STAMP interop tests will be skipped");
    }
}

fn apt_installed(pkg: &str) -> bool {
    output_of("dpkg-query", &["-W", "-f=${Status}", pkg])
        .is_some_and(|s| s.ends_with("install ok installed"))
}

fn setup_apt() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !apt_installed(p))
        .collect();
    if missing.is_empty() {
        eprintln!("xtask: apt packages: all present, skipped");
        return Ok(());
    }
    if output_of("apt-get", &["--version"]).is_none() {
        bail!(
            "apt-get not found; install these packages with your package manager: {}",
            missing.join(" ")
        );
    }
    // Root runs apt-get directly; others go through sudo if there is one.
    let sudo = !is_root();
    if sudo && output_of("sudo", &["--version"]).is_none() {
        bail!(
            "apt packages missing ({}) and not root: run `cargo xtask setup` as root",
            missing.join(" ")
        );
    }
    let apt = |args: &[&str]| {
        let mut c = if sudo {
            let mut c = Command::new("sudo");
            c.args(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]);
            c
        } else {
            let mut c = Command::new("apt-get");
            c.env("DEBIAN_FRONTEND", "noninteractive");
            c
        };
        c.args(args);
        c
    };
    eprintln!("xtask: apt packages missing: {}", missing.join(" "));
    run(&mut apt(&["update"]))?;
    let mut install = apt(&["install", "-y", "--no-install-recommends"]);
    install.args(&missing);
    run(&mut install)
}

pub(crate) fn rust_src_present(toolchain: &str) -> bool {
    output_of("rustup", &["run", toolchain, "rustc", "--print", "sysroot"]).is_some_and(|s| {
        Path::new(&s)
            .join("lib/rustlib/src/rust/library/core/Cargo.toml")
            .is_file()
    })
}

fn setup_toolchain() -> Result<()> {
    if output_of("rustup", &["--version"]).is_none() {
        bail!(
            "rustup not found: install it from https://rustup.rs, then run `cargo xtask setup` again"
        );
    }
    // RUSTUP_AUTO_INSTALL=0 may be set: `rustup run` then fails instead of
    // installing, which is exactly the check we want.
    let Some(v) = output_of("rustup", &["run", EBPF_TOOLCHAIN, "rustc", "-V"]) else {
        return run(Command::new("rustup").args([
            "toolchain",
            "install",
            EBPF_TOOLCHAIN,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
            "--component",
            "clippy",
            "--no-self-update",
        ]));
    };
    // rust-src for -Z build-std; clippy lints the eBPF crate, which only
    // this toolchain builds.
    let mut missing = Vec::new();
    if !rust_src_present(EBPF_TOOLCHAIN) {
        missing.push("rust-src");
    }
    if output_of(
        "rustup",
        &["run", EBPF_TOOLCHAIN, "cargo-clippy", "--version"],
    )
    .is_none()
    {
        missing.push("clippy");
    }
    if missing.is_empty() {
        eprintln!(
            "xtask: toolchain {EBPF_TOOLCHAIN} with rust-src and clippy present ({v}), skipped"
        );
        return Ok(());
    }
    run(Command::new("rustup")
        .args(["component", "add"])
        .args(&missing)
        .args(["--toolchain", EBPF_TOOLCHAIN]))
}

/// `bpf-linker 0.13.0` -> true when it is the pinned minor release.
fn linker_version_ok(version_line: &str) -> bool {
    version_line
        .strip_prefix("bpf-linker ")
        .is_some_and(|v| v.starts_with(&format!("{BPF_LINKER_VERSION}.")))
}

fn setup_bpf_linker() -> Result<()> {
    let current = output_of("bpf-linker", &["--version"]);
    if let Some(v) = &current
        && linker_version_ok(v)
    {
        eprintln!("xtask: {v} present, skipped");
        return Ok(());
    }
    match &current {
        Some(v) => eprintln!("xtask: found {v}, want {BPF_LINKER_VERSION}.x: reinstalling"),
        None => eprintln!("xtask: bpf-linker not found: installing"),
    }
    if !Path::new(LLVM_PREFIX).join("bin/llvm-config").exists() {
        bail!(
            "{LLVM_PREFIX} has no llvm-config: install llvm-22-dev first (`cargo xtask setup` as root does)"
        );
    }
    let path = match env::var_os("PATH") {
        Some(p) => {
            let mut v = vec![Path::new(LLVM_PREFIX).join("bin")];
            v.extend(env::split_paths(&p));
            env::join_paths(v).context("PATH")?
        }
        None => Path::new(LLVM_PREFIX).join("bin").into_os_string(),
    };
    let version_req = format!("~{BPF_LINKER_VERSION}");
    run(Command::new(cargo())
        .env("LLVM_PREFIX", LLVM_PREFIX)
        .env("PATH", path)
        .args([
            "install",
            "bpf-linker",
            "--version",
            &version_req,
            "--locked",
            "--force",
            "--no-default-features",
            "--features",
            "llvm-22",
        ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_fuzz_version_check() {
        assert!(cargo_fuzz_version_ok("cargo-fuzz 0.13.2"));
        assert!(!cargo_fuzz_version_ok("cargo-fuzz 0.12.0"));
        assert!(!cargo_fuzz_version_ok("cargo-fuzz 0.130.0"));
        assert!(!cargo_fuzz_version_ok("something else"));
    }

    #[test]
    fn linker_version_check() {
        assert!(linker_version_ok("bpf-linker 0.13.0"));
        assert!(linker_version_ok("bpf-linker 0.13.2"));
        assert!(!linker_version_ok("bpf-linker 0.9.13"));
        assert!(!linker_version_ok("bpf-linker 0.130.0"));
        assert!(!linker_version_ok("something else"));
    }
}
