//! `cargo xtask`: the project's explicit build and set-up steps.
//!
//! - `setup`: installs, idempotently, what a fresh Debian machine lacks
//!   (apt packages, the pinned nightly with rust-src and clippy,
//!   bpf-linker, cargo-fuzz, cargo-deb, scapy).
//! - `build-ebpf`: builds the XDP router object and prints its path
//!   (`cargo build` does the same through `prober/build.rs`).
//! - `dist`: the .deb (cargo-deb), see [`dist`].
//! - `demo`: the main job on a fresh veth testbed, see [`demo`].
//! - `man`: writes the man pages (rtprobe.1, rtprobe-SUBCOMMAND.1) and
//!   prints their paths.
//! - `test`: setup, the module graph's checks, promtool over
//!   deploy/prometheus/ (config, rules, rule tests), `cargo fmt --check`,
//!   clippy (the workspace and the eBPF crate), the unit tests, every fuzz
//!   target for a bounded time, then the root/netns tests when root (with
//!   the .deb of `dist` for the package test).
//! - `graph`: the imports of prober's modules that break the layers of
//!   docs/ARCHITECTURE.md, and their cycles (`--edges`: every dependency),
//!   see [`modgraph`].
//!
//! One file per subcommand ([`setup`], [`ebpf`], [`man`], [`demo`],
//! [`graph`], [`checks`] with [`fuzz`], [`bench`], [`dist`],
//! [`monitoring`]); this file holds the command line and the helpers they
//! share (running a command, the workspace root).

use std::{
    env,
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod checks;
mod demo;
mod deploy;
mod dist;
mod ebpf;
mod fuzz;
mod graph;
mod man;
mod modgraph;
mod monitoring;
mod roottests;
mod setup;
#[cfg(test)]
mod testutil;

use fuzz::FUZZ_SECONDS_DEFAULT;

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "rtprobe build and set-up tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what is missing: apt packages, the pinned nightly with rust-src and clippy,
    /// bpf-linker, cargo-fuzz, cargo-deb, scapy.
    Setup,
    /// Build the XDP router object (release, bpfel-unknown-none) and print its path.
    BuildEbpf,
    /// The main job: setup, build everything (release), probe across a fresh veth
    /// testbed through the XDP router in native mode, then plot the result.
    Demo {
        /// Where out.csv, out.json and the figures go.
        #[arg(long, default_value = "demo-out")]
        out_dir: PathBuf,
        /// Probes to send (1 ms apart).
        #[arg(long, default_value_t = 2000)]
        count: u64,
    },
    /// Write the man pages (rtprobe.1 and one per subcommand) from the clap definitions and
    /// print their paths.
    Man {
        /// Where the pages go [default: target/man in the workspace].
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Build the Debian package (cargo-deb): the release binary with its eBPF, man pages,
    /// completions, systemd units and /etc files; print its path.
    Dist,
    /// Benchmarks on the veth testbed, side by side with ping/irtt/sockperf and with the targets.
    Bench(bench::BenchArgs),
    /// Check prober's imports against the layer table of docs/ARCHITECTURE.md (each break as
    /// `file:line: from -> to`) and print the import cycles between its modules (files) as
    /// `a -> b -> c -> a`; fails when there is one. `cargo xtask test` runs the same check.
    Graph {
        /// Also print every dependency between modules, `a -> b`, one per line.
        #[arg(long)]
        edges: bool,
    },
    /// Check the monitoring files (deploy/prometheus, deploy/alertmanager, deploy/grafana) and
    /// every PromQL query of the dashboard and the docs with promtool and amtool, in seconds.
    /// `cargo xtask test` runs the same checks.
    Monitoring,
    /// Setup, the module graph's checks, the monitoring checks, fmt and clippy checks, `cargo test`, each fuzz target for a bounded time, then,
    /// when run as root, `dist` (the .deb the package test installs) and the root/netns tests (`--ignored`).
    Test {
        /// Seconds each fuzz target runs; 0 skips fuzzing (said in the output).
        #[arg(long, env = "RTPROBE_FUZZ_SECONDS", default_value_t = FUZZ_SECONDS_DEFAULT)]
        fuzz_seconds: u64,
        /// Root test binaries run at once (each runs its tests one at a time; the ones that load
        /// the machine on purpose run alone afterwards).
        #[arg(long, env = "RTPROBE_ROOT_JOBS", default_value_t = 3)]
        root_jobs: usize,
        /// Passed to the test binaries (e.g. a test name filter).
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.command {
        Task::Setup => setup::setup(),
        Task::BuildEbpf => ebpf::build_ebpf().map(|p| println!("{}", p.display())),
        Task::Test {
            fuzz_seconds,
            root_jobs,
            args,
        } => checks::test(fuzz_seconds, root_jobs, &args),
        Task::Demo { out_dir, count } => demo::demo(&out_dir, count),
        Task::Man { out_dir } => man::man(out_dir.as_deref()),
        Task::Dist => dist::dist().map(|p| println!("{}", p.display())),
        Task::Bench(args) => bench::bench(&args),
        Task::Graph { edges } => graph::graph(edges),
        Task::Monitoring => checks::check_prometheus_deploy(&workspace_root()),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ lives in the workspace")
        .to_path_buf()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn cargo() -> OsString {
    env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Runs `cmd`, showing it first; fails naming the command.
fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {}", show(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {}", show(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", show(cmd));
    }
    Ok(())
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Output of a command that must succeed, or None.
fn output_of(program: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(program)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_seconds_come_from_the_flag_or_the_environment() {
        let secs = |argv: &[&str]| match Cli::try_parse_from(argv).unwrap().command {
            Task::Test { fuzz_seconds, .. } => fuzz_seconds,
            other => panic!("{other:?}"),
        };
        let from_env = env::var("RTPROBE_FUZZ_SECONDS").ok();
        let expected = from_env.map_or(FUZZ_SECONDS_DEFAULT, |v| v.parse().unwrap());
        assert_eq!(secs(&["xtask", "test"]), expected);
        assert_eq!(secs(&["xtask", "test", "--fuzz-seconds", "0"]), 0);
        assert_eq!(
            secs(&["xtask", "test", "--fuzz-seconds", "7", "--", "x"]),
            7
        );
    }
}
