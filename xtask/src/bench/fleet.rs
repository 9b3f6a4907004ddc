//! The fleet at scale: one rtprobe probing 1000 targets at 10 probes/s
//! each (10 k probes/s from one process) for 10 minutes (1 with --quick),
//! answered by `rtprobe reflect` on 1000 addresses inside a namespace;
//! and one reflector's capacity, in-kernel against user-space, on the same
//! veth path.
//!
//! The figures: probes unaccounted for (target 0), peak and final RSS
//! sampled through the run (targets: peak ≤ 128 MiB, ≤ 2 MiB of growth
//! over the second half) with the statistics' bytes per target the run
//! reports (`extra.stats_bytes_per_target`), the prober's CPU
//! (sender, I/O and collector threads: its whole process) as a share of
//! one core (target ≤ 50 %) and per probe; and per reflector, replies/s per
//! CPU of its own at 100 k/s offered: the user-space reflector's process
//! time, the in-kernel one's XDP program run time (BPF statistics); the
//! stack and driver softirq work around them is not split out.

use std::{
    fmt::Write as _,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{
    bed::Bed,
    host::children_cpu_s,
    run::{Ctx, in_ns, sh},
    table::{Row, row},
};

const TARGETS: usize = 1000;
const PORT: &str = "5061";
const A_IP: &str = "10.91.250.1";
/// The issues' targets (20 item 6, 25 item 5).
const RSS_TARGET_MIB: f64 = 128.0;
const CPU_TARGET_PCT: f64 = 50.0;
/// RSS may grow this much over the second half of the run and still
/// count as flat (allocator noise, the kernel's page accounting).
const FLAT_SLACK_MIB: f64 = 2.0;

/// Target i's address on B (10.91.0.1 ... 10.91.3.232 for 1000).
fn target_ip(i: usize) -> String {
    format!("10.91.{}.{}", i / 250, i % 250 + 1)
}

/// Namespaces A (the prober) and B (1000 addresses and the reflectors),
/// joined by a veth with A's side prepared for B's in-kernel reflector.
fn fleet_bed(ctx: &Ctx) -> Result<Bed> {
    let file = ctx.out.join("fleet-addrs.txt");
    let mut addrs = String::new();
    for i in 0..TARGETS {
        let _ = writeln!(addrs, "{}/16", target_ip(i));
    }
    std::fs::write(&file, addrs).with_context(|| format!("write {}", file.display()))?;
    Bed::new(
        ctx,
        "bench-fleet",
        &[
            "--a-addr",
            &format!("{A_IP}/16"),
            "--b-addrs-file",
            &file.to_string_lossy(),
            "--xdp-peer",
        ],
    )
}

/// A process started in a namespace, SIGTERMed (then killed) on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `rtprobe reflect` in B on every address (user space), or on the one
/// address it owns in the kernel, with a per-source limit above what the
/// one prober sends; returns once it answers.
fn reflector(ctx: &Ctx, bed: &Bed, listen: &str, kernel: bool) -> Result<Proc> {
    let mut c = in_ns(&bed.b, &ctx.bin.to_string_lossy());
    c.args([
        "reflect",
        "-q",
        "--listen",
        listen,
        "--rate-limit",
        "1000000",
    ]);
    if kernel {
        c.arg("--kernel");
    }
    let log = ctx.out.join(format!(
        "fleet-reflect-{}.log",
        if kernel { "kernel" } else { "user" }
    ));
    let p = Proc(
        c.stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("start rtprobe reflect")?,
    );
    let t = Instant::now();
    while !std::fs::read_to_string(&log)?.contains("rtprobe reflect: answering ") {
        if t.elapsed() > Duration::from_secs(10) {
            bail!(
                "rtprobe reflect not answering after 10 s: {}",
                std::fs::read_to_string(&log)?.trim()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(p)
}

/// VmRSS of a process, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .ok()
}

/// A process' user + system CPU time so far, in s (from /proc/PID/stat).
fn process_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces): state is
    // the first, utime the 12th, stime the 13th.
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks())
}

/// Ticks per second of /proc's CPU times.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// The targets file: TARGETS targets at 100 ms each.
fn targets_toml() -> String {
    let mut s = String::from("[defaults]\ninterval = \"100ms\"\nsize = 64\n\n");
    for i in 0..TARGETS {
        let _ = write!(
            s,
            "[[target]]\nname = \"t{i:04}\"\naddress = \"{}:{PORT}\"\n\n",
            target_ip(i)
        );
    }
    s
}

/// What one fleet run measured.
struct FleetRun {
    summary: Value,
    /// (seconds into the run, RSS in KiB), sampled through it.
    rss: Vec<(f64, u64)>,
    cpu_s: f64,
    wall_s: f64,
    /// Each thread's share of one core while probing (thread name, %).
    threads: Vec<(String, f64)>,
}

/// Each thread's time on a CPU so far (name, ns), from
/// /proc/PID/task/TID/schedstat (exact, where /proc's tick-sampled
/// utime/stime misattribute a thread that sleeps thousands of times a
/// second).
fn thread_cpu_ns(pid: u32) -> Vec<(String, u64)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut v: Vec<(String, u64)> = dir
        .flatten()
        .filter_map(|t| {
            let name = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let ns = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            Some((
                name.trim().to_string(),
                ns.split_whitespace().next()?.parse().ok()?,
            ))
        })
        .collect();
    v.sort();
    v
}

/// The threads' shares of one core between two readings `secs` apart
/// (threads of the same name added up).
fn thread_shares(a: &[(String, u64)], b: &[(String, u64)], secs: f64) -> Vec<(String, f64)> {
    let total = |v: &[(String, u64)], name: &str| -> u64 {
        v.iter().filter(|(n, _)| n == name).map(|x| x.1).sum()
    };
    let mut out: Vec<(String, f64)> = Vec::new();
    for (name, _) in b {
        if out.iter().any(|(n, _)| n == name) {
            continue;
        }
        let ns = total(b, name).saturating_sub(total(a, name));
        out.push((name.clone(), 100.0 * ns as f64 / 1e9 / secs.max(1e-9)));
    }
    out.retain(|(_, p)| *p >= 0.05);
    out.sort_by(|x, y| y.1.total_cmp(&x.1));
    out
}

fn fleet_run(ctx: &Ctx, bed: &Bed, secs: u64) -> Result<FleetRun> {
    let targets = ctx.out.join("fleet-targets.toml");
    std::fs::write(&targets, targets_toml())?;
    let json = ctx.out.join("fleet-1000.json");
    let mut c = in_ns(&bed.a, &ctx.bin.to_string_lossy());
    c.arg("--targets")
        .arg(&targets)
        .args([
            "--quiet",
            "--duration",
            &format!("{secs}s"),
            "--out",
            "/dev/null",
            "--json",
        ])
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(ctx.out.join("fleet-1000.log"))?);
    let (t0, cpu0) = (Instant::now(), children_cpu_s());
    let mut child = c.spawn().context("start rtprobe --targets")?;
    let pid = child.id();
    let mut rss = Vec::new();
    // The threads' CPU while probing: from 10 s in (the warm-up is over)
    // to the last reading before the end of the sending.
    let (mut first_threads, mut last_threads) = (None, None);
    let every = Duration::from_secs((secs / 30).max(1));
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if let Some(k) = rss_kib(pid) {
            rss.push((t0.elapsed().as_secs_f64(), k));
        }
        let at = t0.elapsed().as_secs_f64();
        if at >= 10.0 && at <= secs as f64 {
            let now = (at, thread_cpu_ns(pid));
            if first_threads.is_none() {
                first_threads = Some(now);
            } else {
                last_threads = Some(now);
            }
        }
        if t0.elapsed() > Duration::from_secs(secs + 120) {
            let _ = child.kill();
            bail!("rtprobe --targets did not end within 2 min of its {secs} s");
        }
        std::thread::sleep(
            every
                .min(Duration::from_millis(500))
                .max(Duration::from_millis(200)),
        );
    };
    // The prober is a waited-for child now: its whole CPU time.
    let (wall_s, cpu_s) = (t0.elapsed().as_secs_f64(), children_cpu_s() - cpu0);
    if !status.success() {
        bail!(
            "rtprobe --targets failed ({status}): {}",
            std::fs::read_to_string(ctx.out.join("fleet-1000.log"))?.trim()
        );
    }
    let trace: String = rss.iter().map(|(t, k)| format!("{t:.1} {k}\n")).collect();
    std::fs::write(ctx.out.join("fleet-1000-rss.txt"), trace)?;
    let summary = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    let threads = match (first_threads, last_threads) {
        (Some((t1, a)), Some((t2, b))) => thread_shares(&a, &b, t2 - t1),
        _ => Vec::new(),
    };
    Ok(FleetRun {
        summary,
        rss,
        cpu_s,
        wall_s,
        threads,
    })
}

/// The RSS row: the peak, the growth over the second half, and the bytes
/// per target the run's statistics hold (`per_target`, as it reported).
fn rss_row(r: &FleetRun, targets: usize, per_target: Option<u64>) -> Row {
    let peak = r.rss.iter().map(|&(_, k)| k).max().unwrap_or(0) as f64 / 1024.0;
    // Flat: the end of the run against its middle (the first half fills
    // the matcher's window of recent sends and the histograms' buckets).
    let half = r.wall_s / 2.0;
    let early = r
        .rss
        .iter()
        .filter(|&&(t, _)| t <= half)
        .map(|&(_, k)| k)
        .max()
        .unwrap_or(0) as f64
        / 1024.0;
    let last = r.rss.last().map_or(0, |&(_, k)| k) as f64 / 1024.0;
    let growth = last - early;
    // After the warm-up (10 s in), for the first half's growth.
    let settled = r
        .rss
        .iter()
        .find(|&&(t, _)| t >= 10.0)
        .map_or(0, |&(_, k)| k) as f64
        / 1024.0;
    let rss_why = if peak > RSS_TARGET_MIB {
        format!(
            "the peak {peak:.1} MiB is above {RSS_TARGET_MIB} MiB; the targets' statistics hold {}",
            per_target.map_or("an unreported amount".into(), |b| format!(
                "{:.1} MiB ({b} B each)",
                (b as usize * targets) as f64 / (1 << 20) as f64
            ))
        )
    } else {
        format!(
            "{:+.1} MiB from 10 s to the middle, {growth:+.1} MiB in the second half ({}); the \
             targets' statistics are fixed at {} per target, so the growth is elsewhere",
            early - settled,
            if growth < early - settled {
                "slowing"
            } else {
                "not slowing"
            },
            per_target.map_or("an unreported size".into(), |b| format!("{b} B"))
        )
    };
    row(
        "1000 targets: RSS peak, growth over the second half",
        format!(
            "{peak:.1} MiB peak, {growth:+.1} MiB ({} samples)",
            r.rss.len()
        ),
        match per_target {
            Some(b) => format!(
                "statistics {b} B per target ({:.1} MiB for {targets}), fixed when a target starts",
                (b as usize * targets) as f64 / (1 << 20) as f64
            ),
            None => "statistics per target: not reported".into(),
        },
        "≤ 128 MiB, ≤ +2 MiB",
        Some(peak <= RSS_TARGET_MIB && growth <= FLAT_SLACK_MIB),
    )
    .because(rss_why)
}

/// The 1000-target rows.
fn fleet_rows(r: &FleetRun) -> Vec<Row> {
    let s = &r.summary;
    let (sent, unaccounted) = (s["sent"].as_u64().unwrap_or(0), s["unaccounted"].as_u64());
    let lost = s["lost"].as_u64().unwrap_or(0);
    let targets = s["extra"]["targets"].as_array().map_or(0, Vec::len);
    let cpu_why = if r.threads.is_empty() {
        "the threads' split was not sampled".to_string()
    } else {
        let (name, pct) = &r.threads[0];
        format!("{name} took {pct:.1} % of a core, the most of any thread")
    };
    let cpu_pct = 100.0 * r.cpu_s / r.wall_s;
    let per_probe_us = if sent > 0 {
        r.cpu_s * 1e6 / sent as f64
    } else {
        f64::NAN
    };
    vec![
        row(
            "1000 targets x 10/s: probes unaccounted",
            format!(
                "{} of {sent} sent ({lost} lost, {targets} targets reported, {:.0} probes/s)",
                unaccounted.map_or("?".into(), |u| u.to_string()),
                s["send_rate_pps"].as_f64().unwrap_or(0.0)
            ),
            "-".into(),
            "0",
            Some(unaccounted == Some(0) && targets == TARGETS),
        ),
        rss_row(r, targets, s["extra"]["stats_bytes_per_target"].as_u64()),
        row(
            "1000 targets: prober CPU (sender, I/O, collector)",
            format!("{cpu_pct:.1} % of one core, {per_probe_us:.2} µs per probe"),
            if r.threads.is_empty() {
                "-".into()
            } else {
                let split: Vec<String> = r
                    .threads
                    .iter()
                    .map(|(n, p)| format!("{n} {p:.1} %"))
                    .collect();
                format!("while probing: {}", split.join(", "))
            },
            "≤ 50 % of one core",
            Some(cpu_pct <= CPU_TARGET_PCT),
        )
        .because(cpu_why),
    ]
}

/// The reflector's XDP program (the BPF program descriptor of type XDP it
/// holds): (id, run time in ns, runs) while `kernel.bpf_stats_enabled` is
/// on, from /proc/PID/fdinfo (bpftool 7.1 lists no programs on this
/// kernel).
fn xdp_prog_stats(pid: u32) -> Option<(u64, u64, u64)> {
    // `ip netns exec` may run the reflector as its child.
    let pid = reflector_pid(pid);
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).ok()? {
        let info = std::fs::read_to_string(e.ok()?.path()).unwrap_or_default();
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        // BPF_PROG_TYPE_XDP is 6.
        if field("prog_type:") == Some(6) {
            return Some((
                field("prog_id:")?,
                field("run_time_ns:").unwrap_or(0),
                field("run_cnt:").unwrap_or(0),
            ));
        }
    }
    None
}

/// `pid`, or its child running rtprobe (`ip netns exec` forks on some
/// versions).
fn reflector_pid(pid: u32) -> u32 {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .find(|c: &u32| {
            std::fs::read_to_string(format!("/proc/{c}/cmdline"))
                .is_ok_and(|l| l.contains("reflect"))
        })
        .unwrap_or(pid)
}

/// One reflector under a 100 k/s rtprobe run from A: the replies per
/// second achieved, and the reflector's own CPU per reply — the
/// user-space reflector's process time (its syscalls included), the
/// in-kernel one's XDP program run time (kernel.bpf_stats_enabled, on for
/// the run only). Neither includes the veth driver's and the stack's
/// softirq work, which /proc/stat samples too coarsely to split; the
/// in-kernel reflector has no stack work past the driver at all.
fn capacity(ctx: &Ctx, bed: &Bed, kernel: bool, count: u64) -> Result<(f64, f64)> {
    let listen = format!("{}:{PORT}", target_ip(0));
    let r = reflector(ctx, bed, &listen, kernel)?;
    let kind = if kernel { "kernel" } else { "user" };
    let json = ctx.out.join(format!("fleet-capacity-{kind}.json"));
    let mut c = in_ns(&bed.a, &ctx.bin.to_string_lossy());
    c.args([
        "--quiet",
        "--target",
        &listen,
        "--interval",
        "10us",
        "--count",
        &count.to_string(),
    ])
    .args(["--out", "/dev/null", "--json"])
    .arg(&json);
    let stats_was =
        std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_default();
    if kernel {
        std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")
            .context("turn on BPF run-time statistics")?;
    }
    let pid = reflector_pid(r.0.id());
    let xdp0 = if kernel { xdp_prog_stats(pid) } else { None };
    let proc0 = process_cpu_s(pid).unwrap_or(0.0);
    let o = c.output().context("run rtprobe --target");
    let (proc1, xdp1) = (
        process_cpu_s(pid).unwrap_or(proc0),
        if kernel { xdp_prog_stats(pid) } else { None },
    );
    if kernel {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", stats_was.trim());
    }
    drop(r);
    let o = o?;
    if !o.status.success() {
        bail!(
            "rtprobe --target ({kind} reflector): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    let (sent, replies) = (
        s["sent"].as_u64().unwrap_or(0),
        s["received"].as_u64().unwrap_or(0),
    );
    let reply_rate =
        s["send_rate_pps"].as_f64().unwrap_or(0.0) * replies as f64 / sent.max(1) as f64;
    let cpu_s = match (xdp0, xdp1) {
        (Some((id0, t0, _)), Some((id1, t1, _))) if id0 == id1 => (t1 - t0) as f64 / 1e9,
        _ if kernel => {
            bail!(
                "no run-time statistics of the XDP program on B's veth (kernel.bpf_stats_enabled, /proc/{pid}/fdinfo): before {xdp0:?}, after {xdp1:?}"
            )
        }
        _ => proc1 - proc0,
    };
    eprintln!(
        "bench: {kind} reflector: {replies} replies, {:.0} ns of its own CPU per reply",
        cpu_s * 1e9 / replies.max(1) as f64
    );
    Ok((reply_rate, replies as f64 / cpu_s.max(1e-9)))
}

/// The section: 1000 targets, then the two reflectors' capacity.
pub(super) fn fleet_section(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let bed = fleet_bed(ctx)?;
    let secs = if quick { 60 } else { 600 };
    let mut rows = {
        let _r = reflector(ctx, &bed, &format!("0.0.0.0:{PORT}"), false)?;
        eprintln!("bench: {TARGETS} targets at 10/s for {secs} s ...");
        fleet_rows(&fleet_run(ctx, &bed, secs)?)
    };
    // The in-kernel reflector holds at most 256 addresses of its
    // interface: B keeps one for the capacity runs.
    sh(&format!(
        "ip -n {b} addr flush dev {vb} && ip -n {b} addr add {}/16 dev {vb}",
        target_ip(0),
        b = bed.b,
        vb = bed.vb
    ))?;
    let count = if quick { 200_000 } else { 1_000_000 };
    let user = capacity(ctx, &bed, false, count);
    let kernel = capacity(ctx, &bed, true, count);
    let text = |r: &Result<(f64, f64)>| match r {
        Ok((rate, per_cpu)) => format!(
            "{:.0} k replies/s per CPU ({:.0} k/s achieved)",
            per_cpu / 1e3,
            rate / 1e3
        ),
        Err(e) => format!("failed: {e:#}"),
    };
    let ratio = match (&kernel, &user) {
        (Ok((_, k)), Ok((_, u))) => format!(" = {:.1}x user-space", k / u),
        _ => String::new(),
    };
    rows.push(row(
        "reflector at 100 k/s offered: in-kernel (XDP run time) vs user-space (process CPU)",
        format!("{}{ratio}", text(&kernel)),
        format!("user-space: {}", text(&user)),
        "(measured)",
        None,
    ));
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_not_flat_says_how_it_grew() {
        // 40 MiB at 10 s, 70 at the middle, 79 at the end of 600 s.
        let rss = [
            (0.0, 4),
            (10.0, 40 << 10),
            (300.0, 70 << 10),
            (600.0, 79 << 10),
        ];
        let r = FleetRun {
            summary: serde_json::json!({"sent": 6_000_000, "unaccounted": 0, "lost": 0,
                "extra": {"targets": [{}], "stats_bytes_per_target": 89_600}}),
            rss: rss.to_vec(),
            cpu_s: 240.0,
            wall_s: 600.0,
            threads: vec![("rtprobe-sender".into(), 20.0)],
        };
        let rows = fleet_rows(&r);
        assert_eq!(rows[1].met, Some(false));
        let why = rows[1].why.as_deref().unwrap();
        assert!(
            why.starts_with(
                "+30.0 MiB from 10 s to the middle, +9.0 MiB in the second half (slowing); the \
                 targets' statistics are fixed at 89600 B per target"
            ),
            "{why}"
        );
        assert_eq!(
            rows[1].peer,
            "statistics 89600 B per target (0.1 MiB for 1), fixed when a target starts"
        );
        assert_eq!(rows[2].met, Some(true), "40 % of a core");
    }

    #[test]
    fn thread_shares_add_threads_of_one_name_over_the_interval() {
        let s = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(n, ns)| (n.to_string(), *ns)).collect()
        };
        let a = s(&[
            ("rtprobe-io", 1_000_000_000),
            ("rtprobe-run", 0),
            ("rtprobe-run", 5),
        ]);
        let b = s(&[
            ("rtprobe-io", 1_500_000_000),
            ("rtprobe-run", 1_000_000_000),
            ("rtprobe-run", 1_000_000_005),
            ("rtprobe-sender", 2_000_000_000),
        ]);
        let shares = thread_shares(&a, &b, 10.0);
        assert_eq!(
            shares,
            vec![
                ("rtprobe-run".to_string(), 20.0),
                ("rtprobe-sender".to_string(), 20.0),
                ("rtprobe-io".to_string(), 5.0),
            ]
        );
    }
}
