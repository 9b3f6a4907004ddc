//! `cargo xtask`: the project's explicit build and set-up steps.
//!
//! - `setup`: installs, idempotently, what a fresh Debian machine lacks
//!   (apt packages, the pinned nightly with rust-src and clippy,
//!   bpf-linker, cargo-fuzz, cargo-deb, scapy).
//! - `build-ebpf`: builds the XDP router object and prints its path
//!   (`cargo build` does the same through `prober/build.rs`).
//! - `dist`: the .deb (cargo-deb), see [`dist`].
//! - `man`: writes the man pages (rtprobe.1, rtprobe-SUBCOMMAND.1) and
//!   prints their paths.
//! - `test`: setup, the module graph's cycle check, promtool over
//!   deploy/prometheus/ (config, rules, rule tests), `cargo fmt --check`,
//!   clippy (the workspace and the eBPF crate), the unit tests, every fuzz
//!   target for a bounded time, then the root/netns tests when root (with
//!   the .deb of `dist` for the package test).
//! - `graph`: the import cycles between prober's modules and the layering
//!   breaks (a domain module importing the commands or clap; `--edges`:
//!   every dependency), see [`modgraph`].

use std::{
    env,
    ffi::OsString,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod deploy;
mod dist;
mod modgraph;
mod monitoring;
mod roottests;
use xdp_common::{BPF_LINKER_VERSION, EBPF_TARGET, EBPF_TOOLCHAIN};

/// Debian packages rtprobe's build, tests and comparisons use.
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev", // bpf-linker links against LLVM 22
    "iperf3",
    "irtt",
    "sockperf",
    "xdp-tools",
    "bpftool",
    "tshark",
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
const EBPF_PACKAGE: &str = "xdp-router";
/// The cargo-fuzz release `cargo xtask setup` installs (any patch level).
const CARGO_FUZZ_MINOR: &str = "0.13";
/// The fuzz targets in fuzz/ (one per parser that faces a file or the
/// network) and the committed seed directories each starts from, relative
/// to the workspace root. New inputs go to `fuzz/corpus/TARGET`
/// (git-ignored), crashes to `fuzz/artifacts/TARGET`.
const FUZZ_TARGETS: &[(&str, &[&str])] = &[
    ("csv_reader", &["fuzz/seeds/csv_reader"]),
    ("scenario", &["fuzz/seeds/scenario", "configs"]),
    ("sender_echo", &["fuzz/seeds/sender_echo"]),
    ("reflector", &["fuzz/seeds/reflector"]),
];
/// Seconds each fuzz target runs in `cargo xtask test`.
const FUZZ_SECONDS_DEFAULT: u64 = 20;

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
    /// Print the import cycles between prober's modules (files), one per line as
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
    /// Setup, the module graph's cycle check, the monitoring checks, fmt and clippy checks, `cargo test`, each fuzz target for a bounded time, then,
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
        Task::Setup => setup(),
        Task::BuildEbpf => build_ebpf().map(|p| println!("{}", p.display())),
        Task::Test {
            fuzz_seconds,
            root_jobs,
            args,
        } => test(fuzz_seconds, root_jobs, &args),
        Task::Demo { out_dir, count } => demo(&out_dir, count),
        Task::Man { out_dir } => man(out_dir.as_deref()),
        Task::Dist => dist::dist().map(|p| println!("{}", p.display())),
        Task::Bench(args) => bench::bench(&args),
        Task::Graph { edges } => graph(edges),
        Task::Monitoring => check_prometheus_deploy(&workspace_root()),
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

// ---------------------------------------------------------------- setup

fn setup() -> Result<()> {
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

fn rust_src_present(toolchain: &str) -> bool {
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

// ---------------------------------------------------------------- build-ebpf

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
fn nightly_cargo() -> Command {
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
fn ebpf_cargo(root: &Path, subcommand: &str) -> Command {
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

fn build_ebpf() -> Result<PathBuf> {
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

// ---------------------------------------------------------------- man

/// The pages come from rtprobe itself (its hidden `man` subcommand), where
/// the clap definitions live: xtask must build without rtprobe's eBPF
/// toolchain, since `cargo xtask setup` is what installs it.
fn man_command(root: &Path, out_dir: Option<&Path>) -> Command {
    let out_dir = match out_dir {
        Some(d) if d.is_absolute() => d.to_path_buf(),
        // Relative to where the user typed it, not to the workspace.
        Some(d) => env::current_dir().map_or_else(|_| d.to_path_buf(), |c| c.join(d)),
        None => root.join("target/man"),
    };
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root)
        .args([
            "run",
            "--quiet",
            "--package",
            "rtprobe",
            "--",
            "man",
            "--out-dir",
        ])
        .arg(out_dir);
    cmd
}

fn man(out_dir: Option<&Path>) -> Result<()> {
    run(&mut man_command(&workspace_root(), out_dir))
}

// ---------------------------------------------------------------- demo

fn demo(out_dir: &Path, count: u64) -> Result<()> {
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

// ---------------------------------------------------------------- test

/// `cargo xtask graph`: prober's module cycles (and with `edges` every
/// dependency); an error when there is a cycle.
fn graph(edges: bool) -> Result<()> {
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
fn check_module_graph(g: &modgraph::Graph) -> Result<()> {
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

fn test(fuzz_seconds: u64, root_jobs: usize, args: &[String]) -> Result<()> {
    setup()?;
    let root = workspace_root();
    // Seconds, before the minutes of builds and tests below.
    check_module_graph(&modgraph::load(&root.join("prober/src"))?)?;
    check_prometheus_deploy(&root)?;
    for mut fmt in fmt_check_commands(&root) {
        run(&mut fmt).context(
            "run `cargo fmt --all && cargo fmt --manifest-path fuzz/Cargo.toml` to format the code",
        )?;
    }
    run(&mut clippy_command(&root))?;
    run(&mut clippy_ebpf_command(&root))?;
    let mut unit = Command::new(cargo());
    unit.current_dir(&root).arg("test");
    if !args.is_empty() {
        unit.arg("--").args(args);
    }
    run(&mut unit)?;
    fuzz(&root, fuzz_seconds)?;

    if !is_root() {
        return root_tests_not_run(under_ci());
    }
    // tests/dist_e2e.rs installs and purges this package.
    let deb = dist::dist()?;
    let deb = deb.to_string_lossy();
    roottests::run(&root, root_jobs, &[("RTPROBE_DEB", &*deb)], args)?;
    eprintln!("xtask: all tests passed (unit and root)");
    Ok(())
}

/// The monitoring rtprobe ships, as its tools read it (xtask/src/deploy.rs):
/// deploy/prometheus/ (config, the opt-in reflector job, rules and their
/// unit tests, a runbook section per alert), deploy/alertmanager/ (config,
/// routes), the Grafana dashboard's shape, and every PromQL expression of
/// the dashboard and the docs (promtool parses it; windows of at least 4
/// scrape intervals). promtool and amtool come with the `prometheus` and
/// `prometheus-alertmanager` apt packages, which `setup()` installs.
fn check_prometheus_deploy(root: &Path) -> Result<()> {
    deploy::check_prometheus(root)?;
    deploy::check_alertmanager(root)?;
    deploy::check_queries(root)?;
    eprintln!("xtask: deploy/: Prometheus, Alertmanager and Grafana files pass their checks");
    Ok(())
}

/// Clippy over every default member and target; any warning (the
/// workspace lints included: undocumented unsafe, unsafe ops in unsafe fns)
/// fails the test run.
fn clippy_command(root: &Path) -> Command {
    let mut c = Command::new(cargo());
    c.current_dir(root)
        .args(["clippy", "--all-targets", "--", "-D", "warnings"]);
    c
}

/// `cargo fmt --check` over the whole workspace (the eBPF crate too) and
/// over the fuzz crate, which is not a member.
fn fmt_check_commands(root: &Path) -> [Command; 2] {
    [&["--all"][..], &["--manifest-path", "fuzz/Cargo.toml"][..]].map(|which| {
        let mut c = Command::new(cargo());
        c.current_dir(root)
            .arg("fmt")
            .args(which)
            .args(["--", "--check"]);
        c
    })
}

/// Clippy over the eBPF crate, which only the pinned nightly builds for
/// bpfel-unknown-none (so the workspace clippy leaves it out); the
/// workspace lints apply and any warning fails.
fn clippy_ebpf_command(root: &Path) -> Command {
    let mut c = ebpf_cargo(root, "clippy");
    c.args(["--", "-D", "warnings"]);
    c
}

// ---------------------------------------------------------------- fuzz

/// cargo fuzz over fuzz/ on the pinned nightly. The targets fuzz parsers,
/// not the XDP programs: `AYA_BUILD_SKIP` keeps prober/build.rs from
/// building the eBPF object under the fuzzer's flags. The parsers they
/// reach are safe Rust, where AddressSanitizer finds nothing a panic
/// would not, so they run without it and with debug assertions (an
/// arithmetic overflow panics): the build takes 244 s instead of 300 s
/// on the 2-vCPU CI machine, and each run goes faster.
fn cargo_fuzz(root: &Path, subcommand: &str) -> Command {
    let mut c = nightly_cargo();
    c.current_dir(root)
        .args(["fuzz", subcommand, "--fuzz-dir", "fuzz"])
        .args(["--sanitizer", "none", "--debug-assertions"])
        .env("AYA_BUILD_SKIP", "1");
    c
}

/// Runs `target` for `seconds` from its corpus and seed directories. A
/// crash, a leak, a unit slower than 10 s or over 2 GiB RSS fails it and
/// leaves the input in fuzz/artifacts/TARGET/.
fn fuzz_run_command(root: &Path, target: &str, seeds: &[&str], seconds: u64) -> Command {
    let mut c = cargo_fuzz(root, "run");
    // The first directory receives the new inputs; the seeds are only read.
    c.arg(target)
        .arg(Path::new("fuzz/corpus").join(target))
        .args(seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"]);
    c
}

fn files_in(dir: &Path) -> std::collections::BTreeSet<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

/// Runs `cmd` with its output in `log` (libFuzzer prints a line per new
/// input: thousands a run); shows the run's final figures, or on failure
/// the last lines, and where the whole log is.
fn run_logged(cmd: &mut Command, log: &Path) -> Result<()> {
    eprintln!("xtask: running {} (output in {})", show(cmd), log.display());
    let out =
        std::fs::File::create(log).with_context(|| format!("cannot write {}", log.display()))?;
    let err = out.try_clone().context("duplicate the log file")?;
    let status = cmd
        .stdout(out)
        .stderr(err)
        .status()
        .with_context(|| format!("cannot run {}", show(cmd)))?;
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    if status.success() {
        for l in lines
            .iter()
            .filter(|l| l.starts_with("Done ") || l.starts_with("stat::"))
        {
            eprintln!("xtask:   {l}");
        }
        return Ok(());
    }
    for l in &lines[lines.len().saturating_sub(40)..] {
        eprintln!("{l}");
    }
    bail!(
        "`{}` failed ({status}); whole output in {}",
        show(cmd),
        log.display()
    )
}

/// Every fuzz target for `seconds` each; 0 skips them (said on stdout).
fn fuzz(root: &Path, seconds: u64) -> Result<()> {
    if seconds == 0 {
        println!("SKIPPED: fuzzing (--fuzz-seconds 0 or RTPROBE_FUZZ_SECONDS=0)");
        return Ok(());
    }
    // fuzz/ is its own workspace: build it with the versions the
    // workspace's lock file pins (cargo adds only libFuzzer's crates).
    let lock = root.join("fuzz/Cargo.lock");
    std::fs::copy(root.join("Cargo.lock"), &lock)
        .with_context(|| format!("cannot write {}", lock.display()))?;
    run(&mut cargo_fuzz(root, "build"))?;
    for (target, seeds) in FUZZ_TARGETS {
        let corpus = root.join("fuzz/corpus").join(target);
        std::fs::create_dir_all(&corpus)
            .with_context(|| format!("cannot create {}", corpus.display()))?;
        let artifacts = root.join("fuzz/artifacts").join(target);
        let before = files_in(&artifacts);
        // Beside the build (ignored by git), not among the artifacts.
        let logs = root.join("fuzz/target/logs");
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create {}", logs.display()))?;
        let log = logs.join(format!("{target}.log"));
        if let Err(e) = run_logged(&mut fuzz_run_command(root, target, seeds, seconds), &log) {
            let found: Vec<String> = files_in(&artifacts)
                .difference(&before)
                .map(|p| p.display().to_string())
                .collect();
            let Some(first) = found.first() else {
                return Err(e.context(format!("fuzz target {target} failed without an artifact")));
            };
            bail!(
                "fuzz target {target} failed on {}: reproduce with `rustup run {EBPF_TOOLCHAIN} \
                 cargo fuzz run --fuzz-dir fuzz {target} {first}`, fix the parser and add the \
                 input to its unit tests",
                found.join(", ")
            );
        }
    }
    eprintln!(
        "xtask: {} fuzz targets ran {seconds} s each without a failure",
        FUZZ_TARGETS.len()
    );
    Ok(())
}

/// `CI=true` (or 1), as GitHub Actions, GitLab and most CI services set it.
fn under_ci() -> bool {
    env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Without root the root tests (`--ignored`, and the e2e files' bodies)
/// did not run: say so, and under CI fail, so a green CI run always
/// includes them.
fn root_tests_not_run(ci: bool) -> Result<()> {
    let what = "SKIPPED: the root tests (cargo test -p rtprobe -- --ignored, and the bodies \
        of the end-to-end files) did not run: they need root (sudo -E cargo xtask test)";
    println!("{what}");
    if ci {
        bail!("CI=true and not root: the root tests must run in CI");
    }
    eprintln!("xtask: unit tests passed; root tests NOT run");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_root_fails_under_ci_only() {
        assert!(root_tests_not_run(false).is_ok());
        let e = root_tests_not_run(true).unwrap_err().to_string();
        assert!(e.contains("CI=true"), "{e}");
    }

    #[test]
    fn man_runs_rtprobe_man_into_the_chosen_dir() {
        let root = Path::new("/ws");
        let args = |c: &Command| -> Vec<String> {
            c.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let c = man_command(root, None);
        assert_eq!(c.get_current_dir(), Some(root));
        let a = args(&c);
        assert_eq!(a[..4], ["run", "--quiet", "--package", "rtprobe"]);
        assert_eq!(a[4..], ["--", "man", "--out-dir", "/ws/target/man"]);
        let a = args(&man_command(root, Some(Path::new("/tmp/pages"))));
        assert_eq!(a.last().map(String::as_str), Some("/tmp/pages"));
        let a = args(&man_command(root, Some(Path::new("pages"))));
        let cwd = env::current_dir().unwrap();
        assert_eq!(a.last(), Some(&cwd.join("pages").display().to_string()));
    }

    #[test]
    fn clippy_denies_warnings_on_all_targets() {
        let c = clippy_command(Path::new("/ws"));
        assert_eq!(c.get_current_dir(), Some(Path::new("/ws")));
        let a: Vec<_> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(a, ["clippy", "--all-targets", "--", "-D", "warnings"]);
    }

    fn args_of(c: &Command) -> Vec<String> {
        c.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn env_of(c: &Command, key: &str) -> Option<String> {
        c.get_envs()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
    }

    #[test]
    fn fmt_checks_the_whole_workspace_and_the_fuzz_crate() {
        let [all, fuzz] = fmt_check_commands(Path::new("/ws"));
        assert_eq!(all.get_current_dir(), Some(Path::new("/ws")));
        assert_eq!(args_of(&all), ["fmt", "--all", "--", "--check"]);
        assert_eq!(fuzz.get_current_dir(), Some(Path::new("/ws")));
        assert_eq!(
            args_of(&fuzz),
            ["fmt", "--manifest-path", "fuzz/Cargo.toml", "--", "--check"]
        );
    }

    #[test]
    fn ebpf_clippy_is_the_ebpf_build_with_warnings_denied() {
        let c = clippy_ebpf_command(Path::new("/ws"));
        assert_eq!(c.get_program(), "rustup");
        assert_eq!(c.get_current_dir(), Some(Path::new("/ws")));
        let a = args_of(&c);
        assert_eq!(a[..4], ["run", EBPF_TOOLCHAIN, "cargo", "clippy"]);
        assert_eq!(
            a[4..],
            [
                "--package",
                EBPF_PACKAGE,
                "--bins",
                "--release",
                "--target",
                EBPF_TARGET,
                "-Z",
                "build-std=core",
                "--",
                "-D",
                "warnings"
            ]
        );
        // The same flags as the build, so clippy sees the same cfg.
        let build = ebpf_cargo(Path::new("/ws"), "build");
        let flags = env_of(&c, "CARGO_ENCODED_RUSTFLAGS").unwrap();
        assert_eq!(
            Some(&flags),
            env_of(&build, "CARGO_ENCODED_RUSTFLAGS").as_ref()
        );
        assert!(flags.contains("bpf_target_arch"), "{flags}");
        // Stable's cargo must not leak into the nightly one.
        for var in ["RUSTC", "RUSTUP_TOOLCHAIN", "CARGO"] {
            assert!(
                c.get_envs().any(|(k, v)| k == var && v.is_none()),
                "{var} not removed"
            );
        }
    }

    #[test]
    fn fuzz_run_is_bounded_and_keeps_seeds_read_only() {
        let c = fuzz_run_command(
            Path::new("/ws"),
            "scenario",
            &["fuzz/seeds/scenario", "configs"],
            25,
        );
        assert_eq!(c.get_current_dir(), Some(Path::new("/ws")));
        assert_eq!(env_of(&c, "AYA_BUILD_SKIP").as_deref(), Some("1"));
        let a = args_of(&c);
        assert_eq!(a[..3], ["run", EBPF_TOOLCHAIN, "cargo"]);
        assert_eq!(
            a[3..],
            [
                "fuzz",
                "run",
                "--fuzz-dir",
                "fuzz",
                "--sanitizer",
                "none",
                "--debug-assertions",
                "scenario",
                // New inputs go to the first (git-ignored) directory.
                "fuzz/corpus/scenario",
                "fuzz/seeds/scenario",
                "configs",
                "--",
                "-max_total_time=25",
                "-timeout=10",
                "-rss_limit_mb=2048",
                "-print_final_stats=1"
            ]
        );
    }

    #[test]
    fn every_fuzz_target_is_in_the_fuzz_crate_with_its_seeds() {
        let root = workspace_root();
        let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).unwrap();
        let declared = manifest.matches("[[bin]]").count();
        assert_eq!(declared, FUZZ_TARGETS.len(), "a target xtask does not run");
        for (target, seeds) in FUZZ_TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{target}\"")),
                "{target}"
            );
            for s in *seeds {
                assert!(root.join(s).is_dir(), "{target}: no seed directory {s}");
            }
        }
    }

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
