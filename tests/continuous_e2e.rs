//! End-to-end: continuous probing. A `--forever` run at 1 ms keeps its
//! resident memory flat, rotates its CSV into a bounded set of files that
//! each start with the metadata and header, prints interval lines and
//! writes an HDR interval log; Ctrl-C ends it with a complete summary. A
//! CSV on a disk that fills up stops the run cleanly with the summary, the
//! JSON and a line saying where the CSV ends. Needs root; run by `cargo
//! xtask test` with `--ignored --test-threads=1`.

mod common;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::*;

fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .expect("VmRSS of the running rtprobe")
}

/// Kills the child on drop, so a failing test leaves no prober running.
struct ChildGuard(std::process::Child);
impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// rtprobe `--forever` at 1 ms on its own testbed, rotating its CSV
/// every 256 KiB (3 kept), with an HDR log and a JSON summary.
fn start_forever(csv: &Path, hlog: &Path, json: &Path) -> ChildGuard {
    let child = Command::new(bin())
        .args([
            "--xdp-mode",
            "native",
            "--forever",
            "--interval",
            "1ms",
            "--quiet",
        ])
        .args([
            "--out-rotate",
            "256KiB",
            "--out-keep",
            "3",
            "--report-every",
            "1s",
        ])
        .arg("--out")
        .arg(csv)
        .arg("--hdr-log")
        .arg(hlog)
        .arg("--json")
        .arg(json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rtprobe");
    ChildGuard(child)
}

/// Stops the run with SIGINT and waits (20 s at most) for it to end;
/// returns its exit status and what it printed.
fn interrupt(child: &mut ChildGuard) -> (std::process::ExitStatus, String, String) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "rtprobe did not stop after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    use std::io::Read;
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stdout, stderr)
}

/// out.csv and three rotated files, each a readable CSV of its own,
/// seqs continuing from the older file into the newer one.
fn check_rotated_files(dir: &Path, csv: &Path, sent: u64) {
    let siblings: Vec<_> = (1..=3).map(|n| dir.join(format!("out.csv.{n}"))).collect();
    assert!(!dir.join("out.csv.4").exists(), "only 3 rotated files kept");
    let mut rows_kept = 0;
    let mut next_seq: Option<u64> = None;
    for f in siblings
        .iter()
        .rev()
        .chain(std::iter::once(&csv.to_path_buf()))
    {
        let size = std::fs::metadata(f)
            .unwrap_or_else(|_| panic!("{} missing", f.display()))
            .len();
        assert!(size <= 256 * 1024, "{} is {size} bytes", f.display());
        let (meta, rows) = read_csv(f);
        assert_eq!(meta.xdp_mode_requested, "native");
        assert!(!rows.is_empty());
        let first: u64 = rows[0][0].parse().unwrap();
        if let Some(n) = next_seq {
            assert_eq!(first, n, "{} continues the file before it", f.display());
        }
        next_seq = Some(rows.last().unwrap()[0].parse::<u64>().unwrap() + 1);
        rows_kept += rows.len();
    }
    assert!(rows_kept < sent as usize, "older rows were rotated away");
    assert_eq!(
        next_seq,
        Some(sent),
        "the newest file ends with the last probe"
    );
}

/// The HDR log: a one-way and an RTT histogram per interval.
fn check_hdr_log(hlog: &Path) {
    let bytes = std::fs::read(hlog).unwrap();
    let mut tags = std::collections::BTreeMap::<String, usize>::new();
    for e in hdrhistogram::serialization::interval_log::IntervalLogIterator::new(&bytes) {
        if let hdrhistogram::serialization::interval_log::LogEntry::Interval(h) = e.unwrap() {
            *tags
                .entry(h.tag().unwrap().as_str().to_string())
                .or_default() += 1;
        }
    }
    assert!(tags.get("one-way").is_some_and(|&n| n >= 24), "{tags:?}");
    assert_eq!(tags.get("one-way"), tags.get("rtt"));
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn forever_at_1ms_keeps_rss_flat_and_rotates_the_csv() {
    if !is_root("forever_at_1ms_keeps_rss_flat_and_rotates_the_csv") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    let hlog = dir.path().join("run.hlog");
    let json = dir.path().join("out.json");
    let mut child = start_forever(&csv, &hlog, &json);
    let pid = child.0.id();
    // Past the testbed set-up and the first rotations (a deadline: the
    // set-up takes seconds on a busy machine).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.path().join("out.csv.3").exists() {
        assert!(Instant::now() < deadline, "no third rotation within 60 s");
        assert!(child.0.try_wait().unwrap().is_none(), "rtprobe ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    let rss_start = vm_rss_kib(pid);
    std::thread::sleep(Duration::from_secs(24));
    let rss_end = vm_rss_kib(pid);
    let (status, stdout, stderr) = interrupt(&mut child);
    assert_eq!(status.code(), Some(130), "interrupted: {stderr}\n{stdout}");
    eprintln!("VmRSS {rss_start} KiB at the third rotation, {rss_end} KiB 24 s later");
    // ~24 000 probes in between: a record kept per probe (~300 bytes) would
    // add ~7 MiB.
    assert!(
        rss_end <= rss_start + 3 * 1024,
        "RSS grew from {rss_start} to {rss_end} KiB over 24 s of probing"
    );

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let sent = summary["sent"].as_u64().unwrap();
    // 24 s of 1 ms ticks at least, each sent however late.
    assert!(sent >= 24_000, "{summary}");
    assert_eq!(summary["unaccounted"], 0);

    check_rotated_files(dir.path(), &csv, sent);

    // Interval lines, about one a second, each with its own counts.
    let lines: Vec<_> = stdout
        .lines()
        .filter(|l| l.starts_with('[') && l.contains(" sent "))
        .collect();
    assert!(lines.len() >= 24, "{stdout}");
    // Every probe is in exactly one line; a whole interval at 1 ms holds
    // 1000 scheduled sends (give or take one where the system clock was
    // slewed against the monotonic schedule).
    let counts: Vec<u64> = lines
        .iter()
        .map(|l| {
            l.split(" sent ")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(counts.iter().sum::<u64>(), sent, "{stdout}");
    assert!(
        counts[1..counts.len() - 1]
            .iter()
            .all(|&n| (995..=1005).contains(&n)),
        "{counts:?}"
    );
    assert!(lines[3].contains("one-way p50"), "{}", lines[3]);

    check_hdr_log(&hlog);
}

/// Unmounts on drop (a failing test must not leave the mount behind).
struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_full_disk_stops_the_run_and_keeps_the_summary_and_json() {
    if !is_root("a_full_disk_stops_the_run_and_keeps_the_summary_and_json") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=128k", "rtprobe-cont-test"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(ok.success(), "mount a 128 KiB tmpfs");
    let _mount = Mount(small.clone());
    let csv = small.join("out.csv");
    let json = dir.path().join("out.json");
    let o = Command::new(bin())
        .args([
            "--xdp-mode",
            "off",
            "--count",
            "20000",
            "--interval",
            "200us",
            "--quiet",
        ])
        .arg("--out")
        .arg(&csv)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(1),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    // "Error: CSV ends at probe N: No space left on device (os error 28) ..."
    let at = stderr
        .split("CSV ends at probe ")
        .nth(1)
        .unwrap_or_else(|| panic!("no 'CSV ends at probe' in: {stderr}"));
    assert!(at.contains("No space left on device"), "{stderr}");
    let n: u64 = at.split(':').next().unwrap().parse().unwrap();
    // The summary is printed and the JSON (on another filesystem) written.
    assert!(stdout.contains("wrote summary to"), "{stdout}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let sent = summary["sent"].as_u64().unwrap();
    assert!(
        sent > n && sent < 20_000,
        "stopped early, counted past the CSV: {summary}"
    );
    assert_eq!(summary["unaccounted"], 0);
    assert!(
        summary["extra"]["output_error"]
            .as_str()
            .unwrap()
            .contains("CSV ends at probe")
    );
    assert!(
        summary
            .get("extra")
            .and_then(|e| e.get("interrupted"))
            .is_none()
    );
    // The CSV ends on a whole row: probe N.
    let (_, rows) = read_csv(&csv);
    let last = rows.last().unwrap();
    assert_eq!(last.len(), 34, "whole last row: {last:?}");
    assert_eq!(last[0].parse::<u64>().unwrap(), n);
    // What the CSV lacks is counted, not assumed.
    let missing = format!(
        "wrote {} rows to {}: {} of the {sent} probes sent are not in it",
        rows.len(),
        csv.display(),
        sent - rows.len() as u64
    );
    assert!(stdout.contains(&missing), "no '{missing}' in: {stdout}");
    assert!(!stdout.contains("interrupted"), "{stdout}");
    let _sweep = NsSweep(read_csv(&csv).0.testbed_id);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn an_hdr_log_on_a_full_disk_ends_on_a_whole_line_and_plots() {
    if !is_root("an_hdr_log_on_a_full_disk_ends_on_a_whole_line_and_plots") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    // Three pages: a few dozen histograms, then the disk is full mid-line.
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=12k", "rtprobe-hlog-test"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(ok.success(), "mount a 12 KiB tmpfs");
    let _mount = Mount(small.clone());
    let hlog = small.join("out.hlog");
    let csv = dir.path().join("out.csv");
    let o = Command::new(bin())
        .args([
            "--xdp-mode",
            "off",
            "--count",
            "60000",
            "--interval",
            "1ms",
            "--report-every",
            "100ms",
            "--quiet",
        ])
        .arg("--out")
        .arg(&csv)
        .arg("--hdr-log")
        .arg(&hlog)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("HDR log") && stderr.contains("No space left on device"),
        "{stderr}"
    );
    let bytes = std::fs::read(&hlog).unwrap();
    assert!(
        bytes.len() > 4096,
        "the log should fill the disk: {} B",
        bytes.len()
    );
    assert!(bytes.ends_with(b"\n"), "the log ends mid-line");
    // `rtprobe plot` reads every interval that was written, as it is.
    let figures = dir.path().join("figures");
    let p = Command::new(bin())
        .arg("plot")
        .arg(&hlog)
        .arg("--out-dir")
        .arg(&figures)
        .output()
        .unwrap();
    assert!(
        p.status.success(),
        "plot refused the log: {}",
        String::from_utf8_lossy(&p.stderr)
    );
    assert!(std::fs::read_dir(&figures).unwrap().count() > 0);
    let _sweep = NsSweep(read_csv(&csv).0.testbed_id);
}
