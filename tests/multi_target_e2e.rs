//! End-to-end: many targets from one rtprobe process (`--targets FILE`,
//! `--target` repeated). Reflectors in namespace B (rtprobe's protocol and
//! STAMP, on their own ports, and a port nobody answers on), the sender in
//! namespace A: each target's own loss and statistics, sends spread over
//! the interval, memory and CPU for 1, 100 and 1000 targets, and bad
//! targets files refused in one line. Reloads and targets that cannot be
//! opened: tests/reload_e2e.rs. Root tests are run by `cargo xtask test`
//! with `--ignored --test-threads=1`.

mod common;

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use common::{pair::*, targets::*, *};

fn children_cpu_s() -> f64 {
    // SAFETY: rusage is plain data, all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
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
    check_sends_spread(&t);
}

/// Spread: consecutive sends (any target) about 6 ms / 3 = 2 ms apart.
/// The schedule is exact; the sends are as punctual as the machine lets
/// the sender be. Sent in bursts, 2 of every 3 gaps would be ~0.
fn check_sends_spread(t: &MultiRun) {
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
