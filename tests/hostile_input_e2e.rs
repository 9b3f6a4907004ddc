//! End-to-end: input and outputs a user (or a full disk) can get wrong.
//! A scenario whose matrix is 14.4 M cells is refused in one line with a
//! small RSS; a probe run whose CSV and JSON share a 64 KiB tmpfs keeps
//! every whole CSV row that fit, leaves no torn JSON (the earlier one
//! stays), prints the summary and names both files; SIGINT during testbed
//! set-up sends no probe and leaves no namespace; a 20-character
//! `--tx-if` and a scenario that is not UTF-8 each get one line that says
//! what is wrong. The root tests are `--ignored`; run by `cargo xtask
//! test` with `--ignored --test-threads=1`.

mod common;

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::*;

/// A finished child: exit code, output, peak RSS (from wait4) and time.
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    max_rss_kib: i64,
    elapsed: Duration,
}

/// Runs `cmd` to the end, killed after `limit` (the test then fails).
// The child is reaped by wait4 (for its own rusage), which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn run_bounded(cmd: &mut Command, limit: Duration) -> Finished {
    use std::io::Read;
    let started = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rtprobe");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let (mut o, mut e) = (String::new(), String::new());
        let _ = out.read_to_string(&mut o);
        let _ = err.read_to_string(&mut e);
        (o, e)
    });
    let pid = child.id() as libc::pid_t;
    let (status, rusage) = loop {
        let mut status = 0;
        // SAFETY: rusage is plain data that wait4 fills.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waits for our own child, by pid, without blocking.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break (status, ru);
        }
        assert!(r == 0, "wait4: {}", std::io::Error::last_os_error());
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("rtprobe ran longer than {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = started.elapsed();
    let (stdout, stderr) = reader.join().unwrap();
    Finished {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stdout,
        stderr,
        max_rss_kib: rusage.ru_maxrss,
        elapsed,
    }
}

/// Unmounts on drop, so a failing test leaves no mount behind.
struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The file: 27 KB whose matrix is 2000 sizes x 1800 intervals x
/// 4 XDP modes = 14.4 M cells (it grew to 4 GB and aborted).
fn huge_matrix_scenario() -> String {
    let sizes: Vec<String> = (0..2000).map(|i| (64 + i % 1400).to_string()).collect();
    let intervals: Vec<String> = (1..=1800).map(|i| format!("\"{i}us\"")).collect();
    format!(
        "[probe]\ncount = 10\nsizes = [{}]\nintervals = [{}]\n\
         xdp_modes = [\"off\", \"skb\", \"native\", \"auto\"]\n",
        sizes.join(","),
        intervals.join(",")
    )
}

#[test]
fn a_huge_matrix_is_refused_in_one_line_with_a_small_rss() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("huge.toml");
    std::fs::write(&f, huge_matrix_scenario()).unwrap();
    let size = std::fs::metadata(&f).unwrap().len();
    let r = run_bounded(
        Command::new(bin()).args(["run", "--check"]).arg(&f),
        Duration::from_secs(30),
    );
    eprintln!(
        "huge matrix ({size} B file, 14.4 M cells): exit {:?} in {:?}, peak RSS {} KiB",
        r.code, r.elapsed, r.max_rss_kib
    );
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "one line: {}", r.stderr);
    assert!(
        r.stderr.contains("the matrix has 14400000 cells")
            && r.stderr.contains("over the limit of 10000")
            && r.stderr.contains("split the scenario"),
        "{}",
        r.stderr
    );
    assert!(r.max_rss_kib < 64 * 1024, "peak RSS {} KiB", r.max_rss_kib);
    assert!(r.elapsed < Duration::from_secs(10), "{:?}", r.elapsed);
}

#[test]
fn a_scenario_that_is_not_utf8_says_so_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("latin1.toml");
    std::fs::write(&f, b"[probe]\ncount = 10\n# d\xe9lai de 1 ms\n").unwrap();
    let r = run_bounded(
        Command::new(bin()).args(["run", "--check"]).arg(&f),
        Duration::from_secs(30),
    );
    eprintln!("non-UTF-8 scenario: {}", r.stderr.trim());
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("not UTF-8 (byte 0xe9 at offset 22, line 3)"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("check the path"), "{}", r.stderr);
}

#[test]
fn a_20_character_interface_name_is_one_line_naming_the_limit() {
    for flag in ["--tx-if", "--rx-if"] {
        let long = "enp0s31f6abcdefghijk";
        assert_eq!(long.len(), 20);
        let (tx, rx) = if flag == "--tx-if" {
            (long, "eth1")
        } else {
            ("eth1", long)
        };
        let r = run_bounded(
            Command::new(bin()).args(["--tx-if", tx, "--rx-if", rx, "--count", "1"]),
            Duration::from_secs(30),
        );
        eprintln!("{flag} of 20 bytes: exit {:?}: {}", r.code, r.stderr.trim());
        assert_eq!(r.code, Some(2), "a usage error: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        assert!(
            r.stderr
                .starts_with(&format!("Error: {flag} {long} is 20 bytes"))
                && r.stderr.contains("at most 15 bytes"),
            "{}",
            r.stderr
        );
        assert!(!r.stderr.contains("os error 34"), "{}", r.stderr);
    }
}

/// The full disk: CSV and JSON on one small filesystem. The CSV
/// keeps every whole row that fit, the earlier JSON is left as it was (no
/// torn one, no temporary), the summary is printed and the error names
/// both files and what each holds.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_full_disk_keeps_whole_rows_and_the_earlier_json_and_names_both_files() {
    if !is_root("a_full_disk_keeps_whole_rows_and_the_earlier_json_and_names_both_files") {
        return;
    }
    // With an earlier JSON (kept as it was) and without one (none left).
    full_disk_run(Some("{\"sent\": 7, \"from\": \"an earlier run\"}\n"));
    full_disk_run(None);
}

fn full_disk_run(previous: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "rtprobe-hostile-test"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(ok.success(), "mount a 64 KiB tmpfs");
    let _mount = Mount(dir.path().to_path_buf());
    let (csv, json) = (dir.path().join("out.csv"), dir.path().join("out.json"));
    if let Some(p) = previous {
        std::fs::write(&json, p).unwrap();
    }
    let r = run_bounded(
        Command::new(bin())
            .args(["--xdp-mode", "off", "--count", "2000", "--interval", "1ms"])
            .args(["--quiet", "--out"])
            .arg(&csv)
            .arg("--json")
            .arg(&json),
        Duration::from_secs(30),
    );
    let (meta, rows) = read_csv(&csv);
    let _sweep = NsSweep(meta.testbed_id.clone());
    let csv_bytes = std::fs::metadata(&csv).unwrap().len();
    let free_kib = nix::sys::statvfs::statvfs(dir.path())
        .map(|s| s.blocks_available() * s.fragment_size() / 1024)
        .unwrap_or(0);
    eprintln!(
        "full disk: exit {:?}; CSV {csv_bytes} B with {} rows on a 64 KiB tmpfs ({free_kib} KiB \
         free after); stderr: {}",
        r.code,
        rows.len(),
        r.stderr.trim()
    );
    assert_eq!(
        r.code,
        Some(1),
        "stdout: {}\nstderr: {}",
        r.stdout,
        r.stderr
    );
    // The summary was printed.
    assert!(
        r.stdout.contains("sent ") && r.stdout.contains("one-way"),
        "{}",
        r.stdout
    );
    // Every row is whole, in order from probe 0, and as many as fit: the
    // file fills the disk but for less than a page (tmpfs allocates pages)
    // and a row.
    assert!(!rows.is_empty(), "no rows kept");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.len(), 34, "row {i} is torn: {row:?}");
        assert_eq!(row[0], i.to_string(), "row {i}");
    }
    assert!(std::fs::read_to_string(&csv).unwrap().ends_with('\n'));
    assert!(csv_bytes > 64 * 1024 - 4096 - 600, "{csv_bytes} B");
    check_error_names_both_files(&r.stderr, &csv, &json, rows.len(), previous.is_some());
    check_json_untouched(dir.path(), &json, previous);
    assert!(namespaces_of(&meta.testbed_id).is_empty());
}

/// The error line names both files and what each holds.
fn check_error_names_both_files(
    stderr: &str,
    csv: &Path,
    json: &Path,
    n: usize,
    had_previous: bool,
) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("Error: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(
        line.contains(&format!(
            "{}: disk full after {n} rows, the rows written are whole",
            csv.display()
        )),
        "{line}"
    );
    let kept = if had_previous {
        "the earlier file there is unchanged"
    } else {
        "no file left behind"
    };
    assert!(
        line.contains(&format!("{}: not written (disk full", json.display()))
            && line.contains(kept),
        "{line}"
    );
}

/// No torn JSON: the earlier one is there as it was (or none), and no
/// temporary.
fn check_json_untouched(dir: &Path, json: &Path, previous: Option<&str>) {
    assert_eq!(std::fs::read_to_string(json).ok().as_deref(), previous);
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let want: &[&str] = if previous.is_some() {
        &["out.csv", "out.json"]
    } else {
        &["out.csv"]
    };
    assert_eq!(names, want);
}

/// Starts a testbed run with `-v`, sends SIGINT once its stderr shows
/// `after_line` (or at once), and returns the run's outputs.
fn interrupt_during_setup(
    after_line: Option<&str>,
) -> (Finished, String, Vec<Vec<String>>, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let (csv, json) = (dir.path().join("out.csv"), dir.path().join("out.json"));
    let started = Instant::now();
    let mut child = Command::new(bin())
        .args(["-v", "--count", "2000", "--interval", "1ms", "--out"])
        .arg(&csv)
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = read_until(&mut stderr, after_line, child.id(), started);
    let at = started.elapsed();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    seen.push_str(&rest);
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    let status = wait_for_exit(&mut child, &seen);
    let rows = if csv.exists() {
        read_csv(&csv).1
    } else {
        Vec::new()
    };
    let summary = std::fs::read_to_string(&json)
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap_or(serde_json::Value::Null);
    let f = Finished {
        code: status.code(),
        stdout,
        stderr: seen,
        max_rss_kib: 0,
        elapsed: started.elapsed(),
    };
    eprintln!(
        "SIGINT {} ({at:?} after start): exit {:?}, {} CSV rows, JSON sent {}, ended after {:?}",
        after_line.map_or("at once".to_string(), |l| format!("after {l:?}")),
        f.code,
        rows.len(),
        summary["sent"],
        f.elapsed
    );
    let id = testbed_id_in(&f.stderr);
    (f, id, rows, summary)
}

/// Reads the run's stderr until a line shows `after_line` (None: reads
/// nothing, waits 20 ms); returns what it read.
fn read_until(
    stderr: &mut BufReader<std::process::ChildStderr>,
    after_line: Option<&str>,
    pid: u32,
    started: Instant,
) -> String {
    let mut seen = String::new();
    match after_line {
        // Once the signal handlers are installed, not the testbed built.
        None => wait_for_sigint_handler(pid, started),
        Some(want) => loop {
            let mut l = String::new();
            if stderr.read_line(&mut l).unwrap() == 0 {
                break;
            }
            seen.push_str(&l);
            if l.contains(want) {
                break;
            }
            assert!(!l.is_empty(), "no {want:?} in: {seen}");
            assert!(started.elapsed() < Duration::from_secs(20), "{seen}");
        },
    }
    seen
}

/// Waits (20 s at most) for the interrupted run to end.
fn wait_for_exit(child: &mut std::process::Child, seen: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("rtprobe did not end after SIGINT: {seen}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until process `pid` catches SIGINT (bit 2 of SigCgt in
/// /proc/PID/status): a handler installed, whatever the machine's load.
fn wait_for_sigint_handler(pid: u32, started: Instant) {
    const SIGINT_BIT: u64 = 1 << (libc::SIGINT - 1);
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
            .unwrap_or(0);
        if caught & SIGINT_BIT != 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "pid {pid} installed no SIGINT handler in 20 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The testbed ID in a `-v` run's "testbed ID ready: namespaces
/// rtprobe-ID-sender, ..." line ("" without one).
fn testbed_id_in(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| {
            l.split(" ready: namespaces ")
                .next()
                .filter(|_| l.contains(" ready: namespaces "))
        })
        .and_then(|head| head.rsplit(' ').next())
        .unwrap_or("")
        .to_string()
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn sigint_during_setup_sends_no_probe_and_leaves_no_namespace() {
    if !is_root("sigint_during_setup_sends_no_probe_and_leaves_no_namespace") {
        return;
    }
    // At once (before the testbed exists), once it is built (XDP,
    // sockets and the warm-up still to come), and once the receiver's
    // timestamping is set (the sockets, warm-up and sender to come: past
    // every set-up check, only the warm-up and the pacer see the stop).
    for after in [
        None,
        Some("ready: namespaces"),
        Some("veth-rcv: no hardware timestamping"),
    ] {
        let (r, id, rows, summary) = interrupt_during_setup(after);
        let _sweep = NsSweep(id.clone());
        assert!(
            matches!(r.code, Some(1) | Some(130)),
            "exit {:?}: {}",
            r.code,
            r.stderr
        );
        assert!(
            rows.is_empty(),
            "{} probes in the CSV: {}",
            rows.len(),
            r.stderr
        );
        if !summary.is_null() {
            assert_eq!(summary["sent"], 0, "{summary}");
        }
        if r.code == Some(1) {
            assert!(
                r.stderr.contains("interrupted before probing started"),
                "{}",
                r.stderr
            );
        }
        if after.is_some() {
            assert!(!id.is_empty(), "no testbed id in: {}", r.stderr);
            assert!(namespaces_of(&id).is_empty(), "{:?}", namespaces_of(&id));
        }
        let _ = &r.stdout;
    }
}

/// `rtprobe --target` started in namespace `ns` (by setns before exec, so
/// the pid is rtprobe's own from the start: no `ip netns exec` in between
/// that a SIGINT would kill).
fn spawn_target_in(ns: &str, dir: &std::path::Path, args: &[&str]) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let ns_file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["--quiet", "--out"])
        .arg(dir.join("out.csv"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setns is a plain syscall, safe between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::sched::setns(&ns_file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)
        });
    }
    cmd.spawn().expect("start rtprobe --target")
}

/// Whether `pid` has a handler for SIGINT (its SigCgt mask in /proc).
fn catches_sigint(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))
                .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << (libc::SIGINT - 1)) != 0)
}

/// SIGINT, then the child's exit code and stderr (killed after 10 s: the
/// test then fails).
fn interrupt_and_wait(child: &mut std::process::Child) -> (Option<i32>, String, Duration) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let sent = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if sent.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("rtprobe --target did not end within 10 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status.code(), err, sent.elapsed())
}

/// UDP datagrams sent from a network namespace (`Udp: OutDatagrams` of the
/// given /proc/net/snmp text). Only rtprobe sends UDP in A, so this counts
/// its warm-up tries and nothing else (ARP, IPv6 DAD and MLD frames on the
/// veth do not count, which an rx_packets count got wrong once on CI).
fn udp_out_datagrams(snmp: &str) -> u64 {
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next().unwrap(), udp.next().unwrap());
    let col = names
        .split_whitespace()
        .position(|n| n == "OutDatagrams")
        .unwrap();
    values.split_whitespace().nth(col).unwrap().parse().unwrap()
}

fn assert_one_line_interrupted(code: Option<i32>, err: &str) {
    assert_eq!(code, Some(1), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("interrupted before probing started"),
        "{err}"
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn sigint_before_target_probing_sends_nothing() {
    if !is_root("sigint_before_target_probing_sends_nothing") {
        return;
    }
    let p = pair::Pair::new();
    let r = pair::Reflector::start(&p, &["--listen", "0.0.0.0:5061"]);
    let target = format!("{}:5061", pair::B_IP);
    // SIGINT as soon as rtprobe handles it (set-up still to come: the
    // socket, the warm-up, the pacer; the first warm-up try may race it).
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn_target_in(&p.a, dir.path(), &["--target", &target, "--count", "100"]);
    let started = Instant::now();
    while !catches_sigint(child.id()) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "rtprobe never installed its SIGINT handler"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    let at = started.elapsed();
    let (code, err, took) = interrupt_and_wait(&mut child);
    let (refl, log) = r.stop();
    let c = &refl["counters"];
    eprintln!(
        "--target, SIGINT {at:?} after start: exit {code:?} after {took:?}, the reflector got {} datagrams; stderr: {}",
        c["datagrams"],
        err.trim()
    );
    // rtprobe checks the stop flag before each send, but the signal is sent
    // once the handler is in place and can land just after the first
    // warm-up try left (CI saw that once): that one try may arrive, no
    // second try and no probe of the run (100 of them) may.
    assert!(
        c["datagrams"].as_u64().unwrap() <= 1,
        "a datagram was sent after the signal: {refl} {log}"
    );
    assert_one_line_interrupted(code, &err);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn sigint_during_target_warm_up_stops_it() {
    if !is_root("sigint_during_target_warm_up_stops_it") {
        return;
    }
    let p = pair::Pair::new();
    // Nothing answers rtprobe probes on the port (a STAMP reflector takes
    // them as malformed, and no ICMP comes back): the warm-up goes on
    // trying, every 100 ms, for 3 s.
    let r = pair::Reflector::start(
        &p,
        &["--protocol", "stamp", "--listen", "0.0.0.0:5061", "-q"],
    );
    let target = format!("{}:5061", pair::B_IP);
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn_target_in(&p.a, dir.path(), &["--target", &target, "--count", "100"]);
    // Read through the child's own /proc entry (microseconds, no process
    // to spawn) so that no 100 ms try can fall between the count and the
    // signal. Signalled once the warm-up has sent a try (a deadline: the
    // start takes longer on a busy machine).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let in_a = format!("ip netns exec {} cat /proc/net/snmp", p.a);
    // Only rtprobe sends UDP in A: once A counts one, the child is in A.
    while udp_out_datagrams(&sh_ok(&in_a)) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no warm-up try within 20 s"
        );
    }
    let before = udp_out_datagrams(
        &std::fs::read_to_string(format!("/proc/{}/net/snmp", child.id())).unwrap(),
    );
    let (code, err, took) = interrupt_and_wait(&mut child);
    let after = udp_out_datagrams(&sh_ok(&format!("ip netns exec {} cat /proc/net/snmp", p.a)));
    let (refl, log) = r.stop();
    let c = &refl["counters"];
    eprintln!(
        "--target, SIGINT during an unanswered warm-up: exit {code:?} after {took:?}; \
         A sent {} UDP datagrams after the signal, the reflector got {} in all; stderr: {}",
        after - before,
        c["datagrams"],
        err.trim()
    );
    assert!(c["datagrams"].as_u64().unwrap() >= 1, "{refl} {log}");
    assert_eq!(after, before, "datagrams sent after SIGINT");
    assert!(took < Duration::from_millis(500), "{took:?}");
    assert_one_line_interrupted(code, &err);
}
