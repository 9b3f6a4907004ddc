//! The like-for-like RTT on a bare veth pair: two namespaces, `rtprobe
//! reflect --kernel` in one with its peer prepared as the reflector asks
//! (GRO requested, TX checksums off), and in the other, taking turns in
//! the same minute, `rtprobe --target`, `ping` and the send-path floor
//! (`cargo bench --bench send_floor`: one thread with rtprobe's socket
//! options and datagram). Each is measured from the user-space send to the
//! echo's kernel RX stamp; the verdict is rtprobe's median over ping's.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{
    peers::{median, parse_ping_rtts_us},
    run::{Ctx, have, in_ns, output_text, user_start_rtts_us},
    table::{Row, row},
};

/// The goal: rtprobe's user send -> echo RX median at most ping's.
pub(super) const TARGET_RATIO_VS_PING: f64 = 1.0;

const A_IP: &str = "10.78.0.1";
const B_IP: &str = "10.78.0.2";
const PORT: &str = "5061";
/// What `rtprobe reflect` prints once it answers.
const READY_LINE: &str = "rtprobe reflect: answering ";

/// Two namespaces joined by a veth pair, named after this process;
/// deleted (the veth with them) when dropped.
struct Pair {
    a: String,
    b: String,
}

impl Pair {
    fn new() -> Result<Pair> {
        let tag = format!("xbp{}", std::process::id());
        let p = Pair {
            a: format!("{tag}a"),
            b: format!("{tag}b"),
        };
        let (va, vb) = (format!("{tag}va"), format!("{tag}vb"));
        let sh = |cmd: String| -> Result<()> {
            let o = Command::new("sh").args(["-c", &cmd]).output()?;
            if !o.status.success() {
                bail!(
                    "`{cmd}` failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
            }
            Ok(())
        };
        sh(format!("ip netns add {}", p.a))?;
        sh(format!("ip netns add {}", p.b))?;
        sh(format!(
            "ip link add {va} netns {} type veth peer name {vb} netns {}",
            p.a, p.b
        ))?;
        for (ns, dev, ip) in [(&p.a, &va, A_IP), (&p.b, &vb, B_IP)] {
            sh(format!(
                "ip -n {ns} addr add {ip}/24 dev {dev} && ip -n {ns} link set {dev} up \
                 && ip -n {ns} link set lo up"
            ))?;
        }
        // What `rtprobe reflect --kernel` asks of a veth's peer.
        sh(format!(
            "ip netns exec {a} ethtool -K {va} gro off && ip netns exec {a} ethtool -K {va} gro on \
             && ip netns exec {a} ethtool -K {va} tx off >/dev/null",
            a = p.a
        ))?;
        // The veth drops what is sent until its carrier is seen (up to 1 s).
        sh(format!(
            "for i in $(seq 50); do ip netns exec {} ping -c1 -W1 {B_IP} >/dev/null 2>&1 && exit 0; \
             sleep 0.1; done; echo '{B_IP} unreachable' >&2; exit 1",
            p.a
        ))?;
        Ok(p)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// `rtprobe reflect --kernel` in namespace B; SIGTERM when dropped.
struct KernelReflector(Child);

impl KernelReflector {
    fn start(ctx: &Ctx, p: &Pair) -> Result<Self> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &p.b])
            .arg(&ctx.bin)
            .args(["reflect", "--kernel", "--listen", &format!("{B_IP}:{PORT}")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("start rtprobe reflect --kernel")?;
        let stderr = child.stderr.take().context("reflector stderr")?;
        let (tx, rx) = mpsc::channel();
        // Drains its stderr to the end, so it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.starts_with(READY_LINE) {
                    let _ = tx.send(Ok(()));
                } else if line.starts_with("Error") {
                    let _ = tx.send(Err(line));
                }
            }
        });
        let r = KernelReflector(child);
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(r),
            Ok(Err(e)) => bail!("rtprobe reflect --kernel: {e}"),
            Err(_) => bail!("rtprobe reflect --kernel did not answer within 10 s"),
        }
    }
}

impl Drop for KernelReflector {
    fn drop(&mut self) {
        // SIGTERM lets it detach its XDP program and exit.
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

/// Builds the floor sender (`cargo bench --bench send_floor`) and returns
/// its executable.
fn build_floor() -> Result<std::path::PathBuf> {
    let mut c = Command::new(crate::cargo());
    c.current_dir(crate::workspace_root()).args([
        "bench",
        "-q",
        "-p",
        "rtprobe",
        "--bench",
        "send_floor",
        "--no-run",
        "--message-format",
        "json",
    ]);
    let out = output_text(c, "cargo bench --bench send_floor --no-run")?;
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|j| j["target"]["name"] == "send_floor" && j["executable"].is_string())
        .and_then(|j| j["executable"].as_str().map(Into::into))
        .context("cargo built no send_floor executable")
}

/// What the rounds measured, per tool: every probe's RTT in µs (the floor:
/// each round's median) and rtprobe's stack stage medians in µs.
#[derive(Default)]
struct Samples {
    rtprobe: Vec<f64>,
    ping: Vec<f64>,
    floor: Vec<f64>,
    rtprobe_stack: Vec<f64>,
    floor_stack: Vec<f64>,
    /// rtprobe's median over ping's, per round.
    round_ratios: Vec<f64>,
}

fn rtprobe_round(ctx: &Ctx, p: &Pair, round: usize, n: &str, s: &mut Samples) -> Result<f64> {
    let (csv, json) = (
        ctx.out.join(format!("pair-rtprobe-{round}.csv")),
        ctx.out.join(format!("pair-rtprobe-{round}.json")),
    );
    let mut c = in_ns(&p.a, &ctx.bin.to_string_lossy());
    c.args([
        "--quiet",
        "--target",
        B_IP,
        "--count",
        n,
        "--interval",
        "1ms",
    ])
    .arg("--out")
    .arg(&csv)
    .arg("--json")
    .arg(&json);
    if let Some(prio) = ctx.rt_priority {
        c.args(["--rt-priority", &prio.to_string(), "--mlockall"]);
    }
    output_text(c, "rtprobe --target")?;
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    if let Some(ns) = summary["stages_ns"]["stack"]["p50"].as_f64() {
        s.rtprobe_stack.push(ns / 1000.0);
    }
    let mut v = user_start_rtts_us(&std::fs::read_to_string(&csv)?, false);
    s.rtprobe.extend_from_slice(&v);
    median(&mut v).context("rtprobe's CSV has no answered probe")
}

fn ping_round(ctx: &Ctx, p: &Pair, round: usize, n: &str, s: &mut Samples) -> Result<f64> {
    let mut c = chrt(ctx, &p.a, "ping");
    c.args(["-n", "-i", "0.001", "-s", "64", "-W", "1", "-c", n, B_IP]);
    let t = output_text(c, "ping")?;
    std::fs::write(ctx.out.join(format!("pair-ping-{round}.txt")), &t)?;
    let mut v = parse_ping_rtts_us(&t);
    s.ping.extend_from_slice(&v);
    median(&mut v).context("ping printed no replies")
}

fn floor_round(ctx: &Ctx, p: &Pair, exe: &str, n: &str, s: &mut Samples) -> Result<()> {
    let mut c = chrt(ctx, &p.a, exe);
    c.args(["--target", &format!("{B_IP}:{PORT}"), "--count", n]);
    let t = output_text(c, "send_floor")?;
    let j: Value = serde_json::from_str(t.trim()).context("send_floor printed no JSON")?;
    if let Some(v) = j["rtt_user_start_p50_ns"].as_f64() {
        s.floor.push(v / 1000.0);
    }
    if let Some(v) = j["stack_p50_ns"].as_f64() {
        s.floor_stack.push(v / 1000.0);
    }
    Ok(())
}

/// `prog` in namespace `ns`, SCHED_FIFO as rtprobe's runs when the bench
/// has --rt-priority.
fn chrt(ctx: &Ctx, ns: &str, prog: &str) -> Command {
    match ctx.rt_priority {
        Some(prio) if have("chrt") => {
            let mut c = in_ns(ns, "chrt");
            c.args(["-f", &prio.to_string(), prog]);
            c
        }
        _ => in_ns(ns, prog),
    }
}

fn measure(ctx: &Ctx, quick: bool) -> Result<Samples> {
    if !have("ping") {
        bail!("ping is not installed (apt-get install iputils-ping)");
    }
    let floor = build_floor();
    let pair = Pair::new()?;
    let _reflector = KernelReflector::start(ctx, &pair)?;
    let (rounds, n) = if quick { (3, "1000") } else { (5, "2000") };
    let mut s = Samples::default();
    // Taking turns, so that what else the machine does weighs on each alike.
    for round in 0..rounds {
        let r = rtprobe_round(ctx, &pair, round, n, &mut s)?;
        let p = ping_round(ctx, &pair, round, n, &mut s)?;
        s.round_ratios.push(r / p);
        if let Ok(exe) = &floor {
            floor_round(ctx, &pair, &exe.to_string_lossy(), n, &mut s)?;
        }
    }
    if let Err(e) = floor {
        eprintln!("bench: the send floor was not built: {e:#}");
    }
    Ok(s)
}

/// The ratio row's text: the medians, the ratio, its spread over the rounds.
fn ratio_text(rtprobe_us: f64, ping_us: f64, round_ratios: &[f64]) -> String {
    let lo = round_ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = round_ratios.iter().copied().fold(0.0, f64::max);
    format!(
        "{rtprobe_us:.1} µs = {:.2}x ping (rounds {lo:.2}..{hi:.2}x)",
        rtprobe_us / ping_us
    )
}

pub(super) fn pair_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let metric =
        "RTT median, user send -> echo RX, bare veth pair, reflect --kernel: rtprobe / ping";
    let target = format!("<= {TARGET_RATIO_VS_PING:.1}x ping");
    let mut s = match measure(ctx, quick) {
        Ok(s) => s,
        Err(e) => {
            return Ok(vec![row(
                metric,
                format!("failed: {e:#}"),
                "-".into(),
                &target,
                Some(false),
            )]);
        }
    };
    let (Some(r), Some(p)) = (median(&mut s.rtprobe), median(&mut s.ping)) else {
        bail!("no round trips measured on the veth pair");
    };
    let floor = median(&mut s.floor);
    let stack = |v: &mut Vec<f64>| median(v).map_or("-".into(), |m| format!("{m:.1} µs"));
    Ok(vec![
        row(
            metric,
            ratio_text(r, p, &s.round_ratios),
            format!(
                "ping {p:.1} µs, {} rounds taking turns; rtprobe's stack (user send -> SCHED) p50 {}",
                s.round_ratios.len(),
                stack(&mut s.rtprobe_stack)
            ),
            &target,
            Some(r / p <= TARGET_RATIO_VS_PING),
        )
        .because(short_of_ping(r, p, floor)),
        row(
            "send floor (one thread, rtprobe's socket options), user send -> echo RX",
            floor.map_or("-".into(), |f| format!("{f:.1} µs = {:.2}x ping", f / p)),
            format!(
                "its stack (user send -> SCHED) p50 {}; cargo bench --bench send_floor",
                stack(&mut s.floor_stack)
            ),
            "-",
            None,
        ),
    ])
}

/// Why rtprobe's round trip `r` is above ping's `p`, from the send
/// floor's `floor` of the same run (µs each).
fn short_of_ping(r: f64, p: f64, floor: Option<f64>) -> String {
    match floor {
        Some(f) if f / p > TARGET_RATIO_VS_PING => format!(
            "the send floor (one thread, rtprobe's socket options) was {:.2}x ping in the same \
             run, so the kernel's UDP send path with TX stamps is above ping's here; rtprobe is \
             {:+.1} µs from the floor",
            f / p,
            r - f
        ),
        Some(f) => format!(
            "the send floor was {:.2}x ping in the same run; rtprobe's own send path adds {:+.1} µs \
             to it",
            f / p,
            r - f
        ),
        None => "the send floor did not run, so the gap is not split".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_splits_the_gap_at_the_floor() {
        assert!(short_of_ping(10.0, 5.0, Some(8.0)).starts_with("the send floor (one thread"));
        assert!(short_of_ping(10.0, 5.0, Some(8.0)).ends_with("+2.0 µs from the floor"));
        assert!(short_of_ping(6.0, 5.0, Some(4.5)).ends_with("adds +1.5 µs to it"));
    }

    #[test]
    fn ratio_row_text() {
        assert_eq!(
            ratio_text(9.8, 7.0, &[1.3, 1.5, 1.42]),
            "9.8 µs = 1.40x ping (rounds 1.30..1.50x)"
        );
    }
}
