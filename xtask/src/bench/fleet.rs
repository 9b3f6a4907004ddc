//! The fleet at scale: one rtprobe probing 1000 targets at 10 probes/s
//! each (10 k probes/s from one process) for 10 minutes (1 with --quick),
//! answered by `rtprobe reflect` on 1000 addresses inside a namespace;
//! and one reflector's capacity, in-kernel against user-space, on the same
//! veth path.
//!
//! The figures: probes unaccounted for (target 0), peak and final RSS
//! sampled through the run (target ≤ 256 MiB and flat), the prober's CPU
//! (sender, I/O and collector threads: its whole process) as a share of
//! one core (target ≤ 50 %) and per probe; and per reflector, replies/s per
//! CPU: replies over the reflector process' CPU time plus the machine's
//! softirq time during a 100 k/s run, so both reflectors are charged the
//! same way (the in-kernel one works in softirq only).

use std::{
    fmt::Write as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{
    host::children_cpu_s,
    run::{Ctx, in_ns},
    table::{Row, row},
};

const TARGETS: usize = 1000;
const PORT: &str = "5061";
const A_IP: &str = "10.91.250.1";
/// The targets.
const RSS_TARGET_MIB: f64 = 256.0;
const CPU_TARGET_PCT: f64 = 50.0;
/// RSS may grow this much from the first tenth of the run to its end and
/// still count as flat (allocator noise, the kernel's page accounting).
const FLAT_SLACK_MIB: f64 = 8.0;

/// Target i's address on B (10.91.0.1 ... 10.91.3.232 for 1000).
fn target_ip(i: usize) -> String {
    format!("10.91.{}.{}", i / 250, i % 250 + 1)
}

/// Namespaces A (the prober) and B (1000 addresses and the reflectors),
/// joined by a veth; deleted when dropped.
struct Bed {
    a: String,
    b: String,
}

fn sh(cmd: &str) -> Result<()> {
    let o = Command::new("sh").args(["-c", cmd]).output()?;
    if !o.status.success() {
        bail!(
            "`{cmd}` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

impl Bed {
    fn new(out: &Path) -> Result<Bed> {
        let tag = format!("xbf{}", std::process::id());
        let bed = Bed {
            a: format!("{tag}a"),
            b: format!("{tag}b"),
        };
        let (a, b) = (&bed.a, &bed.b);
        sh(&format!(
            "ip netns add {a} && ip netns add {b} \
             && ip link add va netns {a} type veth peer name vb netns {b} \
             && ip -n {a} addr add {A_IP}/16 dev va && ip -n {a} link set va up && ip -n {a} link set lo up \
             && ip -n {b} link set vb up && ip -n {b} link set lo up \
             && ip netns exec {a} ethtool -K va gro off && ip netns exec {a} ethtool -K va gro on \
             && ip netns exec {a} ethtool -K va tx off >/dev/null"
        ))?;
        // One `ip -batch` for the 1000 addresses (a process each takes 10 s).
        let batch = out.join("fleet-addrs.batch");
        let mut cmds = String::new();
        for i in 0..TARGETS {
            let _ = writeln!(cmds, "addr add {}/16 dev vb", target_ip(i));
        }
        std::fs::write(&batch, cmds)?;
        sh(&format!("ip -n {b} -batch {}", batch.display()))?;
        sh(&format!(
            "for i in $(seq 50); do ip netns exec {a} ping -c1 -W1 {} >/dev/null 2>&1 && exit 0; \
             sleep 0.1; done; echo 'B unreachable' >&2; exit 1",
            target_ip(TARGETS - 1)
        ))?;
        Ok(bed)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
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

/// The machine's softirq CPU time so far (all CPUs), in s: where the
/// kernel's receive path, XDP and the veth's transmit run.
fn softirq_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    // cpu  user nice system idle iowait irq softirq steal ...
    stat.lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / clock_ticks()
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
    let every = Duration::from_secs((secs / 30).max(1));
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if let Some(k) = rss_kib(pid) {
            rss.push((t0.elapsed().as_secs_f64(), k));
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
    let summary = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    Ok(FleetRun {
        summary,
        rss,
        cpu_s,
        wall_s,
    })
}

/// The 1000-target rows.
fn fleet_rows(r: &FleetRun) -> Vec<Row> {
    let s = &r.summary;
    let (sent, unaccounted) = (s["sent"].as_u64().unwrap_or(0), s["unaccounted"].as_u64());
    let lost = s["lost"].as_u64().unwrap_or(0);
    let targets = s["extra"]["targets"].as_array().map_or(0, Vec::len);
    let peak = r.rss.iter().map(|&(_, k)| k).max().unwrap_or(0) as f64 / 1024.0;
    // Flat: the end of the run against the end of its first tenth.
    let tenth = r.wall_s / 10.0;
    let early = r
        .rss
        .iter()
        .filter(|&&(t, _)| t <= tenth)
        .map(|&(_, k)| k)
        .max()
        .unwrap_or(0) as f64
        / 1024.0;
    let last = r.rss.last().map_or(0, |&(_, k)| k) as f64 / 1024.0;
    let growth = last - early;
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
        row(
            "1000 targets: RSS peak, growth after the first tenth",
            format!(
                "{peak:.1} MiB peak, {growth:+.1} MiB ({} samples)",
                r.rss.len()
            ),
            "-".into(),
            "≤ 256 MiB, flat",
            Some(peak <= RSS_TARGET_MIB && growth <= FLAT_SLACK_MIB),
        ),
        row(
            "1000 targets: prober CPU (sender, I/O, collector)",
            format!("{cpu_pct:.1} % of one core, {per_probe_us:.2} µs per probe"),
            "-".into(),
            "≤ 50 % of one core",
            Some(cpu_pct <= CPU_TARGET_PCT),
        ),
    ]
}

/// One reflector under a 100 k/s rtprobe run from A: the replies per
/// second, and per CPU-second of the reflector's process plus the
/// machine's softirq time (the in-kernel reflector's work is all softirq;
/// the sender's packets cost the same softirq time with either, so the
/// comparison is fair, and a compiler running beside it adds none).
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
    let (pid, si0) = (r.0.id(), softirq_cpu_s());
    let proc0 = process_cpu_s(pid).unwrap_or(0.0);
    let o = c.output().context("run rtprobe --target")?;
    let cpu_s = softirq_cpu_s() - si0 + process_cpu_s(pid).unwrap_or(proc0) - proc0;
    drop(r);
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
    eprintln!(
        "bench: {kind} reflector: {replies} replies, {cpu_s:.2} CPU-s (its process and softirq)"
    );
    Ok((reply_rate, replies as f64 / cpu_s.max(1e-6)))
}

/// The section: 1000 targets, then the two reflectors' capacity.
pub(super) fn fleet_section(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let bed = Bed::new(&ctx.out)?;
    let secs = if quick { 60 } else { 600 };
    let mut rows = {
        let _r = reflector(ctx, &bed, &format!("0.0.0.0:{PORT}"), false)?;
        eprintln!("bench: {TARGETS} targets at 10/s for {secs} s ...");
        fleet_rows(&fleet_run(ctx, &bed, secs)?)
    };
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
        "reflector capacity at 100 k/s: in-kernel vs user-space",
        format!("{}{ratio}", text(&kernel)),
        format!("user-space: {}", text(&user)),
        "(measured)",
        None,
    ));
    Ok(rows)
}
