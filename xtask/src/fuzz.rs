//! The fuzz targets `cargo xtask test` runs, each for a bounded time.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use xdp_common::EBPF_TOOLCHAIN;

use crate::{ebpf::nightly_cargo, run, show};

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
pub(crate) const FUZZ_SECONDS_DEFAULT: u64 = 20;

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
pub(crate) fn fuzz(root: &Path, seconds: u64) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use xdp_common::EBPF_TOOLCHAIN;

    use super::*;
    use crate::workspace_root;

    use crate::testutil::{args_of, env_of};

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
}
