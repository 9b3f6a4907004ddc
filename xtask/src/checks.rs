//! `cargo xtask test`: every check in order, from seconds to minutes, and
//! the commands it runs.

use std::{env, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::{
    cargo, deploy, dist, ebpf::ebpf_cargo, fuzz::fuzz, graph::check_module_graph, is_root,
    modgraph, roottests, run, setup::setup, workspace_root,
};

pub(crate) fn test(fuzz_seconds: u64, root_jobs: usize, args: &[String]) -> Result<()> {
    setup()?;
    let root = workspace_root();
    // Seconds, before the minutes of builds and tests below.
    check_module_graph(&root, &modgraph::load(&root.join("prober/src"))?)?;
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
pub(crate) fn check_prometheus_deploy(root: &Path) -> Result<()> {
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
    use xdp_common::{EBPF_TARGET, EBPF_TOOLCHAIN};

    use super::*;
    use crate::ebpf::{EBPF_PACKAGE, ebpf_cargo};

    #[test]
    fn missing_root_fails_under_ci_only() {
        assert!(root_tests_not_run(false).is_ok());
        let e = root_tests_not_run(true).unwrap_err().to_string();
        assert!(e.contains("CI=true"), "{e}");
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

    use crate::testutil::{args_of, env_of};

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
}
