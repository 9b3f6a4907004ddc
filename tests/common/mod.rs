//! Helpers for the end-to-end tests: root check, unique names, guards that
//! remove what a test created even when it fails.

#![allow(dead_code)]

pub mod pair;
pub mod targets;
pub mod waits;

use std::{path::PathBuf, process::Command};

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rtprobe"))
}

/// True when the test may touch the kernel; otherwise prints why it skips.
/// Root tests are `#[ignore]`d and run by `cargo xtask test` as root, so
/// reaching this without root means someone ran them by hand.
pub fn is_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    // Under CI a root test that cannot run is a failure, never a pass.
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{test} needs root and CI=true: run `cargo xtask test` as root");
    }
    // Straight to stderr: libtest captures eprintln! of passing tests.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED (not root): {test} (run `cargo xtask test` as root)"
    );
    false
}

/// A short name unique to this process and call: `<prefix><pid%10000><n>`.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}{}",
        std::process::id() % 10000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

pub fn sh(cmd: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("run sh")
}

/// The text of an output's stdout.
pub trait StdoutText {
    fn stdout_text(&self) -> String;
}

impl StdoutText for std::process::Output {
    fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

pub fn sh_ok(cmd: &str) -> String {
    let o = sh(cmd);
    assert!(
        o.status.success(),
        "{cmd} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Deletes a root-namespace link on drop.
pub struct LinkGuard(pub String);
impl Drop for LinkGuard {
    fn drop(&mut self) {
        let _ = sh(&format!("ip link del {} 2>/dev/null", self.0));
    }
}

/// Namespaces of one rtprobe run still present.
pub fn namespaces_of(testbed_id: &str) -> Vec<String> {
    rtprobe::sys::netns::list()
        .into_iter()
        .filter(|n| n.contains(testbed_id))
        .collect()
}

/// Deletes any namespace of the given testbed id on drop (a failing test
/// must not leave one behind either).
pub struct NsSweep(pub String);
impl Drop for NsSweep {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        for n in namespaces_of(&self.0) {
            let _ = sh(&format!("ip netns del {n}"));
        }
    }
}

/// The run metadata (first CSV line) and data rows of an rtprobe CSV.
pub fn read_csv(path: &std::path::Path) -> (rtprobe::model::meta::RunMeta, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).expect("read csv");
    let mut lines = text.lines();
    let meta = lines
        .next()
        .and_then(|l| l.strip_prefix(rtprobe::export::META_PREFIX))
        .expect("meta line");
    let meta = serde_json::from_str(meta).expect("meta json");
    let header = lines.next().expect("header");
    assert!(header.starts_with("seq,flow,size,sched_ns,send_ns,tx_ns,rx_ns,echo_ns,one_way_ns,rtt_ns,tx_src,rx_src,echo_src,ts_source,lost"));
    let rows = lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    (meta, rows)
}

/// The JSON summary at `path` (null when the run wrote none), checked
/// against the checked-in schema: every run of the end-to-end tests is a
/// test of docs/run-report.schema.json.
pub fn read_summary(path: &std::path::Path) -> serde_json::Value {
    let Ok(text) = std::fs::read_to_string(path) else {
        return serde_json::Value::Null;
    };
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_matches_schema(&json);
    json
}

/// Fails with every place where `summary` breaks docs/run-report.schema.json
/// (unknown, missing or mistyped fields: its objects are closed).
pub fn assert_matches_schema(summary: &serde_json::Value) {
    assert_matches(
        summary,
        include_str!("../../docs/run-report.schema.json"),
        "docs/run-report.schema.json",
    );
}

/// The same for `rtprobe flows --json` and docs/flows-report.schema.json.
pub fn assert_matches_flows_schema(report: &serde_json::Value) {
    assert_matches(
        report,
        include_str!("../../docs/flows-report.schema.json"),
        "docs/flows-report.schema.json",
    );
}

fn assert_matches(v: &serde_json::Value, schema: &str, name: &str) {
    let schema: serde_json::Value = serde_json::from_str(schema).expect("the schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(v)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "the JSON does not match {name}:\n{}",
        errors.join("\n")
    );
}

/// One rtprobe run with `--quiet --out DIR/out.csv --json DIR/out.json ARGS`;
/// checks a CSV was written and the run's namespaces are gone.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub json: serde_json::Value,
    pub meta: rtprobe::model::meta::RunMeta,
    pub rows: Vec<Vec<String>>,
    /// UDP datagrams the kernel dropped at a full socket buffer in the
    /// run's namespaces while it ran (RcvbufErrors + InErrors; 0 where not
    /// counted): what a process starved of CPU loses, which a test tells
    /// apart from what rtprobe loses.
    pub kernel_drops: u64,
}

/// A run lost no probe but those the kernel dropped at a full socket
/// buffer (a receiver or sender starved of CPU): rtprobe itself loses none.
pub fn assert_lost_only_by_the_kernel(r: &Run) {
    let lost = r.json["lost"]
        .as_u64()
        .unwrap_or_else(|| panic!("no lost in {}", r.json));
    assert!(
        lost <= r.kernel_drops,
        "{lost} probes lost, {} datagrams dropped by the kernel at full socket buffers: {}",
        r.kernel_drops,
        r.stdout
    );
}

/// The UDP datagrams namespace `ns` dropped at a full socket buffer so far
/// (RcvbufErrors + InErrors of its /proc/net/snmp).
pub fn udp_buffer_drops(ns: &str) -> u64 {
    let snmp = sh_ok(&format!("ip netns exec {ns} cat /proc/net/snmp"));
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        panic!("no Udp lines in {ns}'s /proc/net/snmp: {snmp}");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .filter(|(n, _)| *n == "RcvbufErrors" || *n == "InErrors")
        .map(|(_, v)| v.parse::<u64>().unwrap())
        .sum()
}

pub fn probe(dir: &std::path::Path, args: &[&str]) -> Run {
    let csv = dir.join("out.csv");
    let json = dir.join("out.json");
    let o = std::process::Command::new(bin())
        .args([
            "--quiet",
            "--out",
            csv.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ])
        .args(args)
        .output()
        .expect("run rtprobe");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(csv.exists(), "no CSV written: {stderr}");
    let (meta, rows) = read_csv(&csv);
    let _sweep = NsSweep(meta.testbed_id.clone());
    let json = read_summary(&json);
    assert!(
        namespaces_of(&meta.testbed_id).is_empty(),
        "namespaces left behind: {:?}",
        namespaces_of(&meta.testbed_id)
    );
    // The run's own reading of its namespaces' counters.
    let k = &json["extra"]["kernel_drops"];
    let kernel_drops = [
        "receiver_rcvbuf_errors",
        "receiver_in_errors",
        "sender_rcvbuf_errors",
        "sender_in_errors",
    ]
    .iter()
    .filter_map(|c| k[c].as_u64())
    .sum();
    Run {
        kernel_drops,
        code: o.status.code().unwrap_or(-1),
        stdout,
        stderr,
        json,
        meta,
        rows,
    }
}

/// The thread of `pid` named `name` (its TID).
pub fn thread_named(pid: u32, name: &str) -> i32 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
        .unwrap_or_else(|| panic!("no thread {name} in {pid}"))
}

/// Stops one thread (ptrace: PTRACE_SEIZE + PTRACE_INTERRUPT) for `d`,
/// then lets it go on: the rest of the process runs meanwhile.
pub fn stop_thread_for(tid: i32, d: std::time::Duration) {
    // SAFETY: plain ptrace/waitpid calls on a thread of a child's process.
    unsafe {
        assert_eq!(
            libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0),
            0,
            "seize {tid}"
        );
        assert_eq!(libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0), 0);
        let mut status = 0;
        assert_eq!(libc::waitpid(tid, &mut status, libc::__WALL), tid);
    }
    std::thread::sleep(d);
    // SAFETY: as above; detaching resumes the thread.
    unsafe {
        assert_eq!(
            libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0),
            0,
            "detach {tid}"
        );
    }
}
