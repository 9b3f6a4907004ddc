//! End-to-end: a run with a targets file that never ends, as a fleet's
//! prober lives: reloads on SIGHUP (an unchanged target keeps its counts
//! and schedule; a storm of SIGHUPs reloads at most once a second and
//! costs no probe), targets that cannot be opened (reported, tried again,
//! the others lose nothing), a FIFO as the targets file, the open-file
//! limit, and a reader kept from running past the probes' timeout.
//! Reflectors in namespace B, the prober in A; every wait has a deadline.
//! Root tests are run by `cargo xtask test` with `--ignored --test-threads=1`.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use common::{pair::*, targets::*, *};

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
    wait_for_target_errors(
        &mut run,
        &p,
        &[
            ("early", "connect"),
            ("bad", "connect"),
            ("nodns", "resolve"),
        ],
    );
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

/// Until `/metrics` counts a failure of each (target, step).
fn wait_for_target_errors(run: &mut Prober, p: &Pair, want: &[(&str, &str)]) {
    let url = metrics_url(&run.stderr());
    let scrape = || sh(&format!("ip netns exec {} curl -s {url}", p.a));
    run.wait_for("the errors in /metrics", WITHIN, |_| {
        let text = String::from_utf8_lossy(&scrape().stdout).to_string();
        want.iter().all(|(t, step)| {
            text.lines().any(|l| {
                l.starts_with("rtprobe_target_errors_total{")
                    && l.contains(&format!("target=\"{t}\""))
                    && l.contains(&format!("step=\"{step}\""))
            })
        })
    });
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

/// The thread that reads the sockets (the sender, which reads between
/// its sends) kept from running for five probe timeouts (ptrace stops it
/// alone, as a starved CPU would): the probes due meanwhile go late, in
/// a batch once it runs again, and none is counted lost or its echo
/// late (the timeouts wait for the reader); the run shows the stall as
/// send error and says how long echoes waited to be read.
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
    stop_thread_for(thread_named(pid, "rtprobe-sender"), Duration::from_secs(1));
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
    // The reader is the sender: stopped, it sends nothing either, so the
    // stall shows as probes sent late, not as echoes left unread.
    let late = t.json["send_error_ns"]["max"]
        .as_u64()
        .unwrap_or_else(|| panic!("no send_error_ns.max in the summary: {}", t.json));
    eprintln!("probes went up to {} ms late", late / 1_000_000);
    assert!(
        late >= 900_000_000,
        "the sender was stopped for 1 s: its latest send was {late} ns late"
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
