//! End-to-end: many targets from one rtprobe process (`--targets FILE`,
//! `--target` repeated). Reflectors in namespace B (rtprobe's protocol and
//! STAMP, on their own ports, and a port nobody answers on), the sender in
//! namespace A: each target's own loss and statistics, sends spread over
//! the interval, a reload on SIGHUP that keeps an unchanged target's
//! counts and schedule, targets that cannot be opened reported and tried
//! again while the others lose nothing, a FIFO as the targets file, the
//! open-file limit, a storm of SIGHUPs, memory and CPU for 1, 100 and
//! 1000 targets, and bad targets files refused in one line. Root tests are run by `cargo xtask test`
//! with `--ignored --test-threads=1`.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use common::{pair::*, *};

/// One run of `rtprobe --targets FILE` in namespace A (as root: the file
/// and outputs are in a private temporary directory).
struct MultiRun {
    code: i32,
    stdout: String,
    stderr: String,
    json: serde_json::Value,
    /// Data rows; the last cell is the `target` column.
    rows: Vec<Vec<String>>,
    header: String,
    /// User + system CPU of the run (its process tree), seconds.
    cpu_s: f64,
    wall_s: f64,
}

fn children_cpu_s() -> f64 {
    // SAFETY: rusage is plain data, all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn read_run(dir: &Path, o: std::process::Output, cpu_s: f64, wall_s: f64) -> MultiRun {
    let text = std::fs::read_to_string(dir.join("out.csv")).unwrap_or_default();
    let mut lines = text.lines().skip(1);
    let header = lines.next().unwrap_or_default().to_string();
    let rows = lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    MultiRun {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        json: read_summary(&dir.join("out.json")),
        rows,
        header,
        cpu_s,
        wall_s,
    }
}

fn run_targets(p: &Pair, dir: &Path, args: &[&str]) -> MultiRun {
    let cpu0 = children_cpu_s();
    let t = Instant::now();
    let o = Command::new("ip")
        .args(["netns", "exec", &p.a])
        .arg(bin())
        .arg("--quiet")
        .arg("--out")
        .arg(dir.join("out.csv"))
        .arg("--json")
        .arg(dir.join("out.json"))
        .args(args)
        .output()
        .expect("run rtprobe --targets");
    let wall_s = t.elapsed().as_secs_f64();
    read_run(dir, o, children_cpu_s() - cpu0, wall_s)
}

fn target_of<'a>(j: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    j["extra"]["targets"]
        .as_array()
        .unwrap_or_else(|| panic!("no extra.targets: {j}"))
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no target {name}: {j}"))
}

fn col(header: &str, name: &str) -> usize {
    header
        .split(',')
        .position(|c| c == name)
        .unwrap_or_else(|| panic!("no {name} column: {header}"))
}

const THREE: &str = r#"
[defaults]
interval = "6ms"
labels = { site = "lab" }

[[target]]
name = "plain"
address = "10.77.0.2:7101"

[[target]]
name = "stamp"
address = "10.77.0.2:7102"
protocol = "stamp"
tos = 184
labels = { rack = "r7" }

[[target]]
name = "silent"
address = "10.77.0.2:7109"
"#;

/// Three targets from one process: an rtprobe reflector, a STAMP one and
/// a port nobody answers on. Each has its own counts, loss and RTT; the
/// CSV tags every row; sends to different targets are spread over the
/// interval (gaps of about interval / 3, not bursts).
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn three_targets_each_with_its_own_loss_and_statistics() {
    if !is_root("three_targets_each_with_its_own_loss_and_statistics") {
        return;
    }
    let p = Pair::new();
    let r1 = Reflector::start(&p, &["--listen", "10.77.0.2:7101"]);
    let r2 = Reflector::start(&p, &["--protocol", "stamp", "--listen", "10.77.0.2:7102"]);
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(dir.path(), "targets.toml", THREE);
    const N: u64 = 300;
    let n = N.to_string();
    let t = run_targets(
        &p,
        dir.path(),
        &["--targets", file.to_str().unwrap(), "--count", &n],
    );
    drop((r1.stop(), r2.stop()));
    assert_eq!(t.code, 0, "stderr: {}\nstdout: {}", t.stderr, t.stdout);
    let j = &t.json;
    assert_eq!(j["sent"], 3 * N, "{}", t.stdout);
    assert_eq!(j["lost"], N, "the silent target's probes: {}", t.stdout);
    for name in ["plain", "stamp"] {
        let s = &target_of(j, name)["summary"];
        assert_eq!(
            (s["sent"].as_u64(), s["lost"].as_u64()),
            (Some(N), Some(0)),
            "{name}: {s}"
        );
        assert_eq!(s["rtt_ns"]["count"], N, "{name}");
        assert_eq!(s["unaccounted"], 0, "{name}");
        let split = &s["extra"]["loss_split"];
        assert_eq!(split["forward"], 0, "{name}: {split}");
        eprintln!(
            "{name}: rtt p50 {} ns p99 {} ns, foreign {}, never-sent {}, late {}",
            s["rtt_ns"]["p50"],
            s["rtt_ns"]["p99"],
            s["foreign_packets"],
            s["never_sent"],
            s["late_echoes"]
        );
    }
    let stamp = target_of(j, "stamp");
    assert_eq!(stamp["summary"]["extra"]["reflector"]["protocol"], "stamp");
    assert_eq!(stamp["tos"], 184);
    assert_eq!(stamp["labels"]["rack"], "r7");
    assert_eq!(stamp["labels"]["site"], "lab");
    let silent = &target_of(j, "silent")["summary"];
    assert_eq!(
        (silent["sent"].as_u64(), silent["lost"].as_u64()),
        (Some(N), Some(N))
    );
    assert!(t.stdout.contains("per target (3"), "{}", t.stdout);
    assert!(
        t.stderr.contains("target silent: no answer"),
        "{}",
        t.stderr
    );
    // The CSV: one row per probe, each tagged with its target.
    assert!(t.header.ends_with(",target"), "{}", t.header);
    assert_eq!(t.rows.len() as u64, 3 * N);
    let tc = col(&t.header, "target");
    for name in ["plain", "stamp", "silent"] {
        let k = t.rows.iter().filter(|r| r[tc] == name).count() as u64;
        assert_eq!(k, N, "{name}");
    }
    // Spread: consecutive sends (any target) about 6 ms / 3 = 2 ms apart.
    // The schedule is exact; the sends are as punctual as the machine
    // lets the sender be. Sent in bursts, 2 of every 3 gaps would be ~0.
    let gaps = |name: &str| {
        let c = col(&t.header, name);
        let mut v: Vec<i64> = t.rows.iter().map(|r| r[c].parse().unwrap()).collect();
        v.sort_unstable();
        let mut g: Vec<i64> = v.windows(2).map(|w| w[1] - w[0]).collect();
        g.sort_unstable();
        g
    };
    let (sched, sent) = (gaps("sched_ns"), gaps("send_ns"));
    let q = |g: &[i64], f: f64| g[((g.len() - 1) as f64 * f) as usize];
    let bursts = sent.iter().filter(|&&g| g < 500_000).count();
    eprintln!(
        "inter-send gaps over 3 targets at 6 ms: scheduled p1 {} µs p99 {} µs; sent p5 {} µs, p50 {} µs, p95 {} µs; {bursts} of {} under 0.5 ms",
        q(&sched, 0.01) / 1000,
        q(&sched, 0.99) / 1000,
        q(&sent, 0.05) / 1000,
        q(&sent, 0.5) / 1000,
        q(&sent, 0.95) / 1000,
        sent.len()
    );
    assert!(
        (1_990_000..=2_010_000).contains(&q(&sched, 0.01))
            && (1_990_000..=2_010_000).contains(&q(&sched, 0.99)),
        "scheduled 2 ms apart"
    );
    assert!(
        (1_500_000..2_500_000).contains(&q(&sent, 0.5)),
        "median gap {} ns",
        q(&sent, 0.5)
    );
    assert!(
        bursts * 3 < sent.len(),
        "{bursts} sends within 0.5 ms of another"
    );
}

/// `--target` repeated: each target named by its address, same outputs.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn repeated_target_flags_probe_each() {
    if !is_root("repeated_target_flags_probe_each") {
        return;
    }
    let p = Pair::new();
    let r1 = Reflector::start(&p, &["--listen", "10.77.0.2:7101"]);
    let r2 = Reflector::start(&p, &["--listen", "10.77.0.2:7103"]);
    let dir = tempfile::tempdir().unwrap();
    let t = run_targets(
        &p,
        dir.path(),
        &[
            "--target",
            "10.77.0.2:7101",
            "--target",
            "10.77.0.2:7103",
            "--count",
            "100",
            "--interval",
            "2ms",
        ],
    );
    drop((r1.stop(), r2.stop()));
    assert_eq!(t.code, 0, "stderr: {}\nstdout: {}", t.stderr, t.stdout);
    assert_eq!(t.json["sent"], 200);
    assert_eq!(t.json["lost"], 0);
    assert_eq!(
        target_of(&t.json, "10.77.0.2:7103")["summary"]["received"],
        100
    );
}

/// SIGHUP reloads the file: the unchanged target keeps its counts (its
/// probes before and after the reload are one sequence, no slot of its
/// schedule skipped), the removed one is finalized and stays in the
/// report, the new one starts. Then a change to the file alone adds one
/// more. Every step waits for its line, with a deadline.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn sighup_reload_keeps_an_unchanged_targets_counts() {
    if !is_root("sighup_reload_keeps_an_unchanged_targets_counts") {
        return;
    }
    let p = Pair::new();
    let r1 = Reflector::start(&p, &["--listen", "10.77.0.2:7101"]);
    let r2 = Reflector::start(&p, &["--listen", "10.77.0.2:7103"]);
    let dir = tempfile::tempdir().unwrap();
    let before = "[defaults]\ninterval = \"10ms\"\n[[target]]\nname = \"kept\"\naddress = \"10.77.0.2:7101\"\n\
                  [[target]]\nname = \"gone\"\naddress = \"10.77.0.2:7103\"\n";
    let after = "[defaults]\ninterval = \"10ms\"\n[[target]]\nname = \"kept\"\naddress = \"10.77.0.2:7101\"\n\
                 [[target]]\nname = \"new\"\naddress = \"10.77.0.2:7103\"\n";
    let file = write_file(dir.path(), "targets.toml", before);
    let mut run = Prober::start(&p, dir.path(), &["--targets", file.to_str().unwrap()]);
    run.wait_rows("gone", WITHIN);
    write_file(dir.path(), "targets.toml", after);
    run.signal(nix::sys::signal::Signal::SIGHUP);
    run.wait_stderr("target new: added", WITHIN);
    // A change to the file alone reloads it too (its time is looked at every second).
    let third = format!("{after}[[target]]\nname = \"late\"\naddress = \"10.77.0.2:7101\"\n");
    write_file(dir.path(), "targets.toml", &third);
    run.wait_stderr("target late: added", WITHIN);
    run.wait_rows("late", WITHIN);
    let t = run.interrupt();
    drop((r1.stop(), r2.stop()));
    assert_eq!(t.code, 130, "stderr: {}\nstdout: {}", t.stderr, t.stdout);
    eprintln!("{}", t.stderr.trim());
    assert!(t.stderr.contains("target gone: removed"), "{}", t.stderr);
    assert!(
        t.stderr
            .contains("reload: 1 targets unchanged (their statistics go on), 1 added"),
        "{}",
        t.stderr
    );
    let n = |name: &str, k: &str| target_of(&t.json, name)["summary"][k].as_u64().unwrap();
    for name in ["kept", "gone", "new", "late"] {
        assert!(n(name, "sent") > 0, "{name}: {}", t.stdout);
        assert_eq!(n(name, "unaccounted"), 0, "{name}");
    }
    assert_eq!(n("kept", "lost"), 0, "{}", t.stdout);
    assert_every_slot_sent(&t, "kept", 10_000_000);
}

/// How long a root test waits for a condition before it fails.
const WITHIN: Duration = Duration::from_secs(20);

/// `rtprobe --quiet --forever --out DIR/out.csv --json DIR/out.json ARGS`
/// in namespace A, its stderr in DIR/stderr; interrupted by
/// [`Prober::interrupt`] (killed on drop if a test fails first).
struct Prober {
    child: Option<std::process::Child>,
    dir: PathBuf,
}

impl Prober {
    fn start(p: &Pair, dir: &Path, args: &[&str]) -> Prober {
        Self::start_with(p, dir, &[], args)
    }

    /// `wrap`: a command line that execs rtprobe (same pid: see [`nofile`]).
    fn start_with(p: &Pair, dir: &Path, wrap: &[&str], args: &[&str]) -> Prober {
        // Nothing of an earlier run in `dir` may pass for this one's.
        for f in ["out.csv", "out.json"] {
            let _ = std::fs::remove_file(dir.join(f));
        }
        let child = Command::new("ip")
            .args(["netns", "exec", &p.a])
            .args(wrap)
            .arg(bin())
            .args(["--quiet", "--forever"])
            .arg("--out")
            .arg(dir.join("out.csv"))
            .arg("--json")
            .arg(dir.join("out.json"))
            .args(args)
            .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .spawn()
            .expect("start rtprobe --targets");
        Prober {
            child: Some(child),
            dir: dir.to_path_buf(),
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
    }

    /// Polls `done` every 50 ms until it holds, or panics after `within`
    /// (also if the run ends first).
    fn wait_for(&mut self, what: &str, within: Duration, mut done: impl FnMut(&Self) -> bool) {
        let t0 = Instant::now();
        while !done(self) {
            if let Some(s) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("the run ended ({s}) before {what}: {}", self.stderr());
            }
            assert!(
                t0.elapsed() < within,
                "{what}: not within {within:?}: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_stderr(&mut self, needle: &str, within: Duration) {
        let what = format!("{needle:?} on stderr");
        self.wait_for(&what, within, |r| r.stderr().contains(needle));
    }

    /// Until the CSV (flushed four times a second) has a row of `target`.
    fn wait_rows(&mut self, target: &str, within: Duration) {
        let what = format!("a CSV row of {target}");
        let cell = format!(",{target}\n");
        self.wait_for(&what, within, |r| {
            std::fs::read_to_string(r.dir.join("out.csv")).is_ok_and(|t| t.contains(&cell))
        });
    }

    /// SIGINT, then waits (at most 20 s) for the run to end.
    fn interrupt(mut self) -> MultiRun {
        self.signal(nix::sys::signal::Signal::SIGINT);
        self.wait_end(WITHIN)
    }

    fn wait_end(&mut self, within: Duration) -> MultiRun {
        let mut child = self.child.take().unwrap();
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if t0.elapsed() > within {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the run did not end within {within:?}: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let o = std::process::Output {
            status,
            stdout: std::fs::read(self.dir.join("stdout")).unwrap_or_default(),
            stderr: std::fs::read(self.dir.join("stderr")).unwrap_or_default(),
        };
        read_run(&self.dir, o, 0.0, t0.elapsed().as_secs_f64())
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Every probe of `target` in the CSV is one sequence from 0 and every
/// slot of its schedule (`interval_ns` apart) between its first and last
/// has its probe: none skipped, whatever reloads came.
fn assert_every_slot_sent(t: &MultiRun, target: &str, interval_ns: i64) {
    let (tc, seq, sched) = (
        col(&t.header, "target"),
        col(&t.header, "seq"),
        col(&t.header, "sched_ns"),
    );
    let mut rows: Vec<(u64, i64)> = t
        .rows
        .iter()
        .filter(|r| r[tc] == target)
        .map(|r| (r[seq].parse().unwrap(), r[sched].parse().unwrap()))
        .collect();
    rows.sort_unstable();
    assert!(!rows.is_empty(), "no row of {target}");
    for (i, (s, _)) in rows.iter().enumerate() {
        assert_eq!(*s, i as u64, "{target}: seq {i} missing");
    }
    let span = rows.last().unwrap().1 - rows[0].1;
    let slots = (span + interval_ns / 2) / interval_ns + 1;
    assert_eq!(
        slots as usize,
        rows.len(),
        "{target}: {} probes for {slots} slots of its schedule",
        rows.len()
    );
}

/// Targets that cannot be opened (an address with no route, a name that
/// does not resolve) are each reported (log line, metric, JSON) and tried
/// again, at the start and when a reload adds them; the others lose
/// nothing and the run goes on.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn targets_that_cannot_be_opened_are_reported_and_the_others_lose_nothing() {
    if !is_root("targets_that_cannot_be_opened_are_reported_and_the_others_lose_nothing") {
        return;
    }
    let p = Pair::new();
    let r1 = Reflector::start(
        &p,
        &["--listen", "10.77.0.2:7101", "--listen", "10.77.0.2:7102"],
    );
    let dir = tempfile::tempdir().unwrap();
    let good = "[defaults]\ninterval = \"10ms\"\n[[target]]\nname = \"a\"\naddress = \"10.77.0.2:7101\"\n\
                [[target]]\nname = \"b\"\naddress = \"10.77.0.2:7102\"\n";
    // One bad target among good ones at the start.
    let start = format!("{good}[[target]]\nname = \"early\"\naddress = \"10.77.98.1:5061\"\n");
    let file = write_file(dir.path(), "targets.toml", &start);
    let mut run = Prober::start(
        &p,
        dir.path(),
        &[
            "--targets",
            file.to_str().unwrap(),
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    run.wait_stderr(
        "target early: connect the probe socket to 10.77.98.1:5061",
        WITHIN,
    );
    run.wait_rows("b", WITHIN);
    // A reload adds an unreachable address and a name that does not resolve.
    let more = format!(
        "{start}[[target]]\nname = \"bad\"\naddress = \"10.77.99.99:5061\"\n\
         [[target]]\nname = \"nodns\"\naddress = \"no-such-host.invalid:5061\"\n"
    );
    write_file(dir.path(), "targets.toml", &more);
    run.signal(nix::sys::signal::Signal::SIGHUP);
    run.wait_stderr(
        "target bad: connect the probe socket to 10.77.99.99:5061",
        WITHIN,
    );
    run.wait_stderr("target nodns: ", WITHIN);
    // Tried again, with a backoff: its second failure.
    run.wait_for("bad's second failure", WITHIN, |r| {
        r.stderr()
            .lines()
            .any(|l| l.contains("target bad: ") && l.contains("failure 2)"))
    });
    let url = metrics_url(&run.stderr());
    let scrape = || sh(&format!("ip netns exec {} curl -s {url}", p.a));
    run.wait_for("the errors in /metrics", WITHIN, |_| {
        let text = String::from_utf8_lossy(&scrape().stdout).to_string();
        ["early", "bad"].iter().all(|t| {
            text.lines().any(|l| {
                l.starts_with("rtprobe_target_errors_total{")
                    && l.contains(&format!("target=\"{t}\""))
                    && l.contains("step=\"connect\"")
            })
        }) && text.contains("target=\"nodns\"")
    });
    let t = run.interrupt();
    drop(r1.stop());
    assert_eq!(t.code, 130, "stderr: {}\nstdout: {}", t.stderr, t.stdout);
    for name in ["a", "b"] {
        let s = &target_of(&t.json, name)["summary"];
        assert_eq!(
            (s["lost"].as_u64(), s["unaccounted"].as_u64()),
            (Some(0), Some(0)),
            "{name}: {s}"
        );
        assert_every_slot_sent(&t, name, 10_000_000);
    }
    for (name, why) in [
        ("early", "Network is unreachable"),
        ("bad", "Network is unreachable"),
        ("nodns", "no-such-host.invalid"),
    ] {
        let tj = target_of(&t.json, name);
        assert_eq!(tj["summary"]["sent"], 0, "{name}: {tj}");
        assert!(tj["errors"].as_u64().unwrap() >= 1, "{name}: {tj}");
        assert!(
            tj["last_error"].as_str().unwrap().contains(why),
            "{name}: {tj}"
        );
    }
    assert!(target_of(&t.json, "bad")["errors"].as_u64().unwrap() >= 2);
}

/// The URL `--metrics-listen` printed on stderr.
fn metrics_url(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("rtprobe: serving metrics at "))
        .unwrap_or_else(|| panic!("no metrics URL: {stderr}"))
        .trim()
        .to_string()
}

/// When no target can be opened at the start there is nothing to probe:
/// the run ends with status 1 and each target's cause.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_run_whose_every_target_fails_to_open_ends_with_their_causes() {
    if !is_root("a_run_whose_every_target_fails_to_open_ends_with_their_causes") {
        return;
    }
    let p = Pair::new();
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(
        dir.path(),
        "targets.toml",
        "[[target]]\nname = \"x\"\naddress = \"10.77.98.1:5061\"\n[[target]]\nname = \"y\"\naddress = \"10.77.98.2:5061\"\n",
    );
    let mut run = Prober::start(&p, dir.path(), &["--targets", file.to_str().unwrap()]);
    let t = run.wait_end(WITHIN);
    assert_eq!(t.code, 1, "{}", t.stderr);
    let last = t.stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("Error: none of the 2 targets could be opened")
            && last.contains("x: connect the probe socket to 10.77.98.1:5061")
            && last.contains("y: "),
        "{}",
        t.stderr
    );
}

/// A targets file that is a FIFO is refused at once at the start (status
/// 78), and on a reload refused with a line while the probing goes on
/// and SIGINT still ends the run.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_fifo_as_the_targets_file_is_refused_at_start_and_ignored_on_reload() {
    if !is_root("a_fifo_as_the_targets_file_is_refused_at_start_and_ignored_on_reload") {
        return;
    }
    let p = Pair::new();
    let r1 = Reflector::start(&p, &["--listen", "10.77.0.2:7101"]);
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.toml");
    sh_ok(&format!("mkfifo {}", fifo.display()));
    let mut run = Prober::start(&p, dir.path(), &["--targets", fifo.to_str().unwrap()]);
    let t = run.wait_end(Duration::from_secs(10));
    assert_eq!(t.code, 78, "{}", t.stderr);
    assert!(
        t.stderr.contains("is a FIFO: give a regular file"),
        "{}",
        t.stderr
    );

    let file = write_file(
        dir.path(),
        "targets.toml",
        "[defaults]\ninterval = \"10ms\"\n[[target]]\nname = \"a\"\naddress = \"10.77.0.2:7101\"\n",
    );
    let mut run = Prober::start(&p, dir.path(), &["--targets", file.to_str().unwrap()]);
    run.wait_rows("a", WITHIN);
    std::fs::remove_file(&file).unwrap();
    sh_ok(&format!("mkfifo {}", file.display()));
    run.signal(nix::sys::signal::Signal::SIGHUP);
    run.wait_stderr("reload: targets file", WITHIN);
    let rows_then = std::fs::read_to_string(dir.path().join("out.csv"))
        .unwrap()
        .lines()
        .count();
    run.wait_for("more probes after the refused reload", WITHIN, |r| {
        std::fs::read_to_string(r.dir.join("out.csv"))
            .unwrap()
            .lines()
            .count()
            > rows_then
    });
    let t = run.interrupt();
    drop(r1.stop());
    assert_eq!(t.code, 130, "{}", t.stderr);
    assert!(t.stderr.contains("is a FIFO: give a regular file (it is read again on every reload); the 1 targets go on unchanged"), "{}", t.stderr);
    let s = &target_of(&t.json, "a")["summary"];
    assert_eq!(s["lost"], 0, "{s}");
    assert_every_slot_sent(&t, "a", 10_000_000);
}

/// The I/O thread kept from running for five probe timeouts (ptrace
/// stops it alone, as a starved CPU would): the echoes wait in their
/// sockets, stamped by the kernel in time, and no probe is counted lost
/// or its echo late; the run says how long the echoes waited.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn an_io_thread_kept_from_running_past_the_timeout_loses_no_probe() {
    if !is_root("an_io_thread_kept_from_running_past_the_timeout_loses_no_probe") {
        return;
    }
    let p = Pair::new();
    let r1 = Reflector::start(
        &p,
        &["--listen", "10.77.0.2:7101", "--listen", "10.77.0.2:7102"],
    );
    let dir = tempfile::tempdir().unwrap();
    let two = "[defaults]\ninterval = \"10ms\"\n[[target]]\nname = \"a\"\naddress = \"10.77.0.2:7101\"\n\
               [[target]]\nname = \"b\"\naddress = \"10.77.0.2:7102\"\n";
    let file = write_file(dir.path(), "targets.toml", two);
    let args = ["--targets", file.to_str().unwrap(), "--timeout", "200ms"];
    let mut run = Prober::start(&p, dir.path(), &args);
    run.wait_rows("b", WITHIN);
    let pid = run.child.as_ref().unwrap().id();
    stop_thread_for(thread_named(pid, "rtprobe-io"), Duration::from_secs(1));
    let rows_then = std::fs::read_to_string(dir.path().join("out.csv"))
        .unwrap()
        .lines()
        .count();
    run.wait_for("records after the stall", WITHIN, |r| {
        std::fs::read_to_string(r.dir.join("out.csv"))
            .unwrap()
            .lines()
            .count()
            > rows_then + 100
    });
    let t = run.interrupt();
    drop(r1.stop());
    assert_eq!(t.code, 130, "{}", t.stderr);
    for name in ["a", "b"] {
        let s = &target_of(&t.json, name)["summary"];
        let n = |k: &str| s[k].as_u64().unwrap();
        assert_eq!(
            (n("lost"), n("late_echoes"), n("unaccounted")),
            (0, 0, 0),
            "{name}: {s}"
        );
        assert_every_slot_sent(&t, name, 10_000_000);
    }
    let waited = t.json["pacing"]["reader"]["read_delay_ns"]["max"]
        .as_u64()
        .unwrap();
    eprintln!(
        "echoes waited up to {} ms for the stopped I/O thread",
        waited / 1_000_000
    );
    assert!(
        waited >= 900_000_000,
        "the thread was stopped for 1 s: {waited} ns"
    );
    assert!(
        t.stdout.contains("echoes read after the kernel had them"),
        "{}",
        t.stdout
    );
}

/// Targets file with `n` targets on ports from 20000 of B, every 100 ms.
fn many_targets(dir: &Path, name: &str, n: usize) -> PathBuf {
    let mut text = String::from("[defaults]\ninterval = \"100ms\"\n");
    for i in 0..n {
        text += &format!(
            "[[target]]\nname = \"t{i}\"\naddress = \"10.77.0.2:{}\"\n",
            20000 + i
        );
    }
    write_file(dir, name, &text)
}

/// A shell that sets RLIMIT_NOFILE (soft, hard) and execs the command
/// after it (prlimit(1) would fork: signals would go to it).
fn nofile(soft: u32, hard: u32) -> [&'static str; 3] {
    let script = format!("ulimit -n {hard} && ulimit -Sn {soft} && exec \"$0\" \"$@\"");
    ["sh", "-c", Box::leak(script.into_boxed_str())]
}

/// The open-file limit: raised to what the targets need where the hard
/// limit allows; refused with the number needed where it does not (at
/// the start: status 78; on a reload: the targets probed go on).
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn the_open_file_limit_is_raised_for_the_targets_or_the_file_refused() {
    if !is_root("the_open_file_limit_is_raised_for_the_targets_or_the_file_refused") {
        return;
    }
    let p = Pair::new();
    let dir = tempfile::tempdir().unwrap();
    let hundred = many_targets(dir.path(), "hundred.toml", 100);
    let args = ["--targets", hundred.to_str().unwrap(), "--timeout", "200ms"];
    // Hard limit 64: refused at once, with the number and the setting.
    let mut run = Prober::start_with(&p, dir.path(), &nofile(64, 64), &args);
    let t = run.wait_end(Duration::from_secs(10));
    assert_eq!(t.code, 78, "{}", t.stderr);
    assert!(
        t.stderr.contains("100 probe sockets need 420 open files")
            && t.stderr.contains("hard limit of 64")
            && t.stderr.contains("LimitNOFILE=420"),
        "{}",
        t.stderr
    );
    // Soft 64, hard 4096: raised, every target probed.
    let mut run = Prober::start_with(&p, dir.path(), &nofile(64, 4096), &args);
    run.wait_rows("t99", WITHIN);
    let t = run.interrupt();
    assert_eq!(t.code, 130, "{}", t.stderr);
    assert_eq!(t.json["extra"]["targets"].as_array().unwrap().len(), 100);
    // A reload past the hard limit keeps the targets probed.
    let ten = many_targets(dir.path(), "targets.toml", 10);
    let args = ["--targets", ten.to_str().unwrap(), "--timeout", "200ms"];
    let mut run = Prober::start_with(&p, dir.path(), &nofile(64, 400), &args);
    run.wait_rows("t9", WITHIN);
    std::fs::copy(&hundred, &ten).unwrap();
    run.signal(nix::sys::signal::Signal::SIGHUP);
    run.wait_stderr("reload: 100 probe sockets need 420 open files", WITHIN);
    let t = run.interrupt();
    assert_eq!(t.code, 130, "{}", t.stderr);
    assert!(
        t.stderr.contains("the 10 targets go on unchanged"),
        "{}",
        t.stderr
    );
    assert_eq!(t.json["extra"]["targets"].as_array().unwrap().len(), 10);
}

/// A storm of SIGHUPs (200 in about 2 s, the file unchanged but once)
/// reads the file at most once a second and costs no probe: every slot
/// of each target's schedule has its probe.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_storm_of_sighups_reloads_once_a_second_and_costs_no_probe() {
    if !is_root("a_storm_of_sighups_reloads_once_a_second_and_costs_no_probe") {
        return;
    }
    let p = Pair::new();
    let r1 = Reflector::start(
        &p,
        &["--listen", "10.77.0.2:7101", "--listen", "10.77.0.2:7102"],
    );
    let dir = tempfile::tempdir().unwrap();
    let two = "[defaults]\ninterval = \"10ms\"\n[[target]]\nname = \"a\"\naddress = \"10.77.0.2:7101\"\n\
               [[target]]\nname = \"b\"\naddress = \"10.77.0.2:7102\"\n";
    let file = write_file(dir.path(), "targets.toml", two);
    let mut run = Prober::start(&p, dir.path(), &["--targets", file.to_str().unwrap()]);
    run.wait_rows("b", WITHIN);
    let t0 = Instant::now();
    for i in 0..200 {
        if i == 100 {
            // One real change amid the storm.
            let three = format!("{two}[[target]]\nname = \"c\"\naddress = \"10.77.0.2:7101\"\n");
            write_file(dir.path(), "targets.toml", &three);
        }
        run.signal(nix::sys::signal::Signal::SIGHUP);
        std::thread::sleep(Duration::from_millis(10));
    }
    let storm_s = t0.elapsed().as_secs_f64();
    run.wait_stderr("target c: added", WITHIN);
    run.wait_rows("c", WITHIN);
    let t = run.interrupt();
    drop(r1.stop());
    assert_eq!(t.code, 130, "{}", t.stderr);
    let reloads = t
        .stderr
        .lines()
        .filter(|l| l.contains("] reload: "))
        .count();
    eprintln!("200 SIGHUPs in {storm_s:.1} s: {reloads} reloads");
    // At most one a second, over the storm and the waits after it.
    let bound = (t0.elapsed().as_secs_f64()).ceil() as usize + 1;
    assert!(
        (1..=bound).contains(&reloads),
        "{reloads} reloads (at most {bound}): {}",
        t.stderr
    );
    for name in ["a", "b"] {
        let s = &target_of(&t.json, name)["summary"];
        assert_eq!(
            (s["lost"].as_u64(), s["unaccounted"].as_u64()),
            (Some(0), Some(0)),
            "{name}: {s}"
        );
        assert_every_slot_sent(&t, name, 10_000_000);
    }
}

/// Runs `rtprobe --targets` like [`run_targets`], reading its resident
/// memory (VmRSS, KiB) every 250 ms while it runs.
fn run_targets_sampled(p: &Pair, dir: &Path, args: &[&str]) -> (MultiRun, Vec<u64>) {
    let cpu0 = children_cpu_s();
    let t = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &p.a])
        .arg(bin())
        .arg("--quiet")
        .arg("--out")
        .arg(dir.join("out.csv"))
        .arg("--json")
        .arg(dir.join("out.json"))
        .args(args)
        // Files, not pipes: nobody reads a pipe while the run goes on.
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .expect("run rtprobe --targets");
    // `ip netns exec` execs rtprobe: same pid.
    let status = format!("/proc/{}/status", child.id());
    let mut rss = Vec::new();
    while child.try_wait().unwrap().is_none() {
        let kib: Option<u64> = std::fs::read_to_string(&status).ok().and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            l.split_whitespace().nth(1)?.parse().ok()
        });
        rss.extend(kib);
        std::thread::sleep(Duration::from_millis(250));
    }
    let o = std::process::Output {
        status: child.wait().unwrap(),
        stdout: std::fs::read(dir.join("stdout")).unwrap(),
        stderr: std::fs::read(dir.join("stderr")).unwrap(),
    };
    let wall_s = t.elapsed().as_secs_f64();
    (read_run(dir, o, children_cpu_s() - cpu0, wall_s), rss)
}

/// Memory and CPU for 1, 100 and 1000 targets: targets are 1000 ports of
/// one `rtprobe reflect` in namespace B; each target at 2 probes/s (every
/// 100 ms with one target), for 6 s. Measured on the debug build the
/// tests run: 1000 targets must stay within the issue's 256 MiB, and
/// their memory must not grow while they probe.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn memory_and_cpu_per_target() {
    if !is_root("memory_and_cpu_per_target") {
        return;
    }
    const PORT0: u16 = 20000;
    let p = Pair::new();
    let listens: Vec<String> = (0..1000)
        .map(|i| format!("10.77.0.2:{}", PORT0 + i))
        .collect();
    let mut args = Vec::new();
    for l in &listens {
        args.extend(["--listen", l.as_str()]);
    }
    let r = Reflector::start(&p, &args);
    let mut figures = Vec::new();
    for n in [1usize, 100, 1000] {
        let dir = tempfile::tempdir().unwrap();
        let interval = if n == 1 { "100ms" } else { "500ms" };
        let mut text = format!("[defaults]\ninterval = \"{interval}\"\n");
        for i in 0..n {
            text += &format!(
                "[[target]]\nname = \"t{i}\"\naddress = \"10.77.0.2:{}\"\n",
                PORT0 as usize + i
            );
        }
        let file = write_file(dir.path(), "targets.toml", &text);
        let (t, rss_samples) = run_targets_sampled(
            &p,
            dir.path(),
            &["--targets", file.to_str().unwrap(), "--duration", "6s"],
        );
        assert_eq!(
            t.code, 0,
            "{n} targets: stderr: {}\nstdout: {}",
            t.stderr, t.stdout
        );
        let sent = t.json["sent"].as_u64().unwrap();
        let rss = t.json["extra"]["peak_rss_kib"].as_u64().unwrap();
        assert_eq!(t.json["unaccounted"], 0, "{n}");
        assert_eq!(t.json["lost"], 0, "{n} targets: {}", t.stdout);
        assert!(sent >= 5 * n as u64, "{n} targets sent {sent}");
        eprintln!(
            "{n:>5} targets: {sent} probes in {:.1} s; peak RSS {rss} KiB; CPU {:.2} s ({:.0} µs per probe, {:.1} ms per target)",
            t.wall_s,
            t.cpu_s,
            t.cpu_s * 1e6 / sent as f64,
            t.cpu_s * 1e3 / n as f64
        );
        figures.push((n, rss, t.cpu_s, sent, rss_samples));
    }
    drop(r.stop());
    let (rss1, rss1000) = (figures[0].1, figures[2].1);
    let per_target_kib = rss1000.saturating_sub(rss1) as f64 / 999.0;
    let cpu_per_target_ms = (figures[2].2 - figures[0].2) * 1e3 / 999.0;
    eprintln!(
        "per target: {per_target_kib:.0} KiB, {cpu_per_target_ms:.1} ms CPU (1 -> 1000 targets, 12 probes each)"
    );
    // Flat: the last quarter of the 1000-target run's samples (probing,
    // then the summaries) holds no more than the second quarter plus a
    // margin for the final report.
    let samples = &figures[2].4;
    let q = samples.len() / 4;
    let (mid, end) = (
        samples[q..2 * q].iter().max().copied().unwrap_or(0),
        samples[3 * q..].iter().max().copied().unwrap_or(0),
    );
    eprintln!("1000 targets: VmRSS over the run (KiB, every 250 ms): {samples:?}");
    assert!(end <= mid + 16 * 1024, "grew from {mid} to {end} KiB");
    // The issue's budget for 1000 targets, and the figure stated in
    // docs/REMOTE.md with room for a loaded machine.
    assert!(rss1000 <= 256 * 1024, "1000 targets: {rss1000} KiB");
    assert!(per_target_kib < 150.0, "{per_target_kib} KiB per target");
}

/// A bad targets file is refused with one line naming the file, line and
/// field, before anything is sent. Needs no root.
#[test]
fn bad_targets_files_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[[target]]\nname = 'a'\n",
            "targets.toml:1:1: missing field `address`",
        ),
        (
            "[[target]]\nname = 'a'\naddress = '127.0.0.1'\nlabels = { job = 'x' }\n",
            "targets.toml:1: [[target]] #1 (\"a\"): labels: \"job\" is reserved",
        ),
        (
            "[[target]]\nname = 'a'\naddress = '127.0.0.1'\nsize = 9000\n",
            "size: 9000 is out of range",
        ),
        (
            "[[target]]\naddress = '127.0.0.1'\n[[target]]\naddress = '127.0.0.1'\n",
            "given twice",
        ),
        (
            "[[target]]\nname = 'a'\naddress = '127.0.0.1'\nrate = 3\n",
            "targets.toml:4:1: target[1].rate: unknown field",
        ),
        ("", "no [[target]]"),
    ];
    for (text, want) in cases {
        let file = write_file(dir.path(), "targets.toml", text);
        let o = Command::new(bin())
            .args([
                "--quiet",
                "--count",
                "1",
                "--targets",
                file.to_str().unwrap(),
            ])
            .arg("--out")
            .arg(dir.path().join("out.csv"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{text:?} accepted");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.contains(want), "{text:?}: {err}");
        assert!(!dir.path().join("out.csv").exists(), "nothing ran");
    }
    // --target and --targets together: clap's usage error.
    let o = Command::new(bin())
        .args(["--target", "127.0.0.1", "--targets", "x.toml"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}
