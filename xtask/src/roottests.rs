//! The root tests of `cargo xtask test`: every test binary of the rtprobe
//! package run with `--ignored --test-threads=1`, several binaries at once.
//!
//! A binary's tests run one at a time, in order, as before; binaries run
//! side by side because every root test makes its own namespaces, veths
//! and qdiscs under names unique to its process and removes them, and
//! asserts mechanisms rather than speeds, so a neighbour's load changes
//! how long it takes, not whether it passes. The binaries that load the
//! machine on purpose (floods, forwarding benches, the 8-host fleet) or
//! watch the whole machine (every namespace present) run alone after the
//! others.
//!
//! Each binary's output goes to a log file, printed whole when it ends, so
//! that parallel outputs do not interleave.

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// Test binaries (the file name before the hash) that run alone.
const ALONE: &[&str] = &[
    "bench_e2e",
    "fleet_e2e",
    "hostile_kreflect_e2e",
    "hostile_ureflect_e2e",
    "multi_target_e2e",
    "dist_e2e",
    "flood_reflect_e2e",
    // Its sock_ops program is one per host (a lock), as is the library's
    // root test of it, which runs in the parallel phase.
    "flows_e2e",
];

/// One test binary of the package.
#[derive(Debug, Clone)]
struct TestBin {
    /// `e2e`, `remote_e2e`, `rtprobe` (the library's unit tests), ...
    name: String,
    path: PathBuf,
}

/// Builds the package's test binaries (a no-op after `cargo test`) and
/// lists them from cargo's JSON messages.
fn test_bins(root: &Path) -> Result<Vec<TestBin>> {
    let out = Command::new(crate::cargo())
        .current_dir(root)
        .args(["test", "-p", "rtprobe", "--no-run", "--message-format=json"])
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test -p rtprobe --no-run failed");
    }
    let mut bins = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name)) = (msg["executable"].as_str(), msg["target"]["name"].as_str())
        else {
            continue;
        };
        if msg["profile"]["test"].as_bool() == Some(true) {
            // The library's and the binary's unit tests share the crate's
            // name: told apart by their kind.
            let kind = msg["target"]["kind"][0].as_str().unwrap_or("test");
            bins.push(TestBin {
                name: if kind == "test" {
                    name.to_string()
                } else {
                    format!("{name}-{kind}")
                },
                path: PathBuf::from(exe),
            });
        }
    }
    if bins.is_empty() {
        bail!("cargo listed no test binary of rtprobe");
    }
    Ok(bins)
}

struct Running {
    bin: TestBin,
    child: Child,
    log: PathBuf,
    started: Instant,
}

/// What one binary's run came to.
struct Done {
    name: String,
    ok: bool,
    secs: f64,
}

fn start(bin: &TestBin, logs: &Path, envs: &[(&str, &str)], args: &[String]) -> Result<Running> {
    let log = logs.join(format!("{}.log", bin.name));
    let file = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
    let child = Command::new(&bin.path)
        .args(["--ignored", "--test-threads=1"])
        .args(args)
        .envs(envs.iter().copied())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("start {}", bin.path.display()))?;
    eprintln!("xtask: root tests: {} started", bin.name);
    Ok(Running {
        bin: bin.clone(),
        child,
        log,
        started: Instant::now(),
    })
}

/// Prints a finished binary's log and what it came to.
fn finish(mut r: Running) -> Result<Done> {
    let status = r.child.wait()?;
    let secs = r.started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&r.log).unwrap_or_default();
    println!(
        "---- root tests: {} ({secs:.0} s, {status}) ----\n{text}",
        r.bin.name
    );
    Ok(Done {
        name: r.bin.name,
        ok: status.success(),
        secs,
    })
}

/// Runs `queue` with at most `jobs` binaries at once.
fn run_pool(
    mut queue: VecDeque<TestBin>,
    jobs: usize,
    logs: &Path,
    envs: &[(&str, &str)],
    args: &[String],
) -> Result<Vec<Done>> {
    let mut running: Vec<Running> = Vec::new();
    let mut done = Vec::new();
    while !queue.is_empty() || !running.is_empty() {
        while running.len() < jobs.max(1)
            && let Some(b) = queue.pop_front()
        {
            running.push(start(&b, logs, envs, args)?);
        }
        let mut i = 0;
        while i < running.len() {
            if running[i].child.try_wait()?.is_some() {
                done.push(finish(running.swap_remove(i))?);
            } else {
                i += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(done)
}

/// Runs every root test: the shared binaries `jobs` at a time, then the
/// ones in [`ALONE`] one by one. Fails naming the binaries that failed.
pub(crate) fn run(root: &Path, jobs: usize, envs: &[(&str, &str)], args: &[String]) -> Result<()> {
    let started = Instant::now();
    let bins = test_bins(root)?;
    let logs = root.join("target/root-tests");
    std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
    let (alone, shared): (Vec<TestBin>, Vec<TestBin>) = bins
        .into_iter()
        .partition(|b| ALONE.contains(&b.name.as_str()));
    eprintln!(
        "xtask: root tests: {} binaries {jobs} at a time, then {} alone (logs in {})",
        shared.len(),
        alone.len(),
        logs.display()
    );
    let mut done = run_pool(shared.into(), jobs, &logs, envs, args)?;
    done.extend(run_pool(alone.into(), 1, &logs, envs, args)?);
    let failed: Vec<&str> = done
        .iter()
        .filter(|d| !d.ok)
        .map(|d| d.name.as_str())
        .collect();
    let mut slowest: Vec<&Done> = done.iter().collect();
    slowest.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    eprintln!(
        "xtask: root tests took {:.0} s; slowest: {}",
        started.elapsed().as_secs_f64(),
        slowest
            .iter()
            .take(5)
            .map(|d| format!("{} {:.0} s", d.name, d.secs))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !failed.is_empty() {
        bail!(
            "root tests failed in {} (their output is above and in {})",
            failed.join(", "),
            logs.display()
        );
    }
    Ok(())
}
