//! The RTT section: rtprobe's RTT medians with each reflector against
//! the peers' on the same testbed, and on a bare veth pair against ping
//! in the same minute (pair.rs). Every verdict compares like with like:
//! rtprobe's round trip from the user-space send to the echo's kernel RX
//! stamp, the points ping measures between. The figures from the qdisc
//! entry (rtprobe's own headline start) are printed next to them.

use anyhow::Result;

use super::{
    pair::pair_rows,
    peers::{fmt_peer, median, peer_rtts},
    run::{Ctx, user_start_rtts_us},
    table::{Row, row, us},
};

/// The targets for the in-kernel reflector.
pub(super) const TURNAROUND_TARGET_NS: u64 = 2_000;

/// Issue 25: the default sender (its reads and warm-up now included)
/// stays within what it cost before, 8-10 % of a core at 1 ms.
pub(super) const SENDER_CPU_TARGET_PCT: f64 = 10.0;

/// "3.2 µs" or "-".
fn us_f(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1} µs"))
}

/// One rtprobe run of the section: its summary and its medians from the
/// user-space send.
struct Run {
    summary: serde_json::Value,
    user_us: Option<f64>,
    user_net_us: Option<f64>,
}

impl Run {
    fn p50(&self, key: &str) -> Option<u64> {
        self.summary[key]["p50"].as_u64()
    }

    /// The sender thread's CPU row: its share of a core and what it did
    /// besides sending (spin, loopback warm-up), from the summary.
    fn sender_cpu_row(&self) -> Row {
        let p = &self.summary["pacing"];
        let cpu = p["sender_cpu_pct"].as_f64();
        let per_probe = |k: &str| {
            p[k].as_f64()
                .map_or("-".into(), |ns| format!("{:.1} µs", ns / 1000.0))
        };
        row(
            "sender thread CPU, in-kernel reflector, 1 ms (it also reads its socket and warms up)",
            cpu.map_or("-".into(), |c| format!("{c:.1} % of a core")),
            format!(
                "spin {}/probe, warm-up on loopback {}/probe",
                per_probe("spin_ns_per_probe"),
                per_probe("warm_up_ns_per_probe")
            ),
            &format!("<= {SENDER_CPU_TARGET_PCT:.0} %"),
            cpu.map(|c| c <= SENDER_CPU_TARGET_PCT),
        )
    }
}

fn run(ctx: &Ctx, name: &str, args: &[&str]) -> Result<Run> {
    let (summary, csv) = ctx.probe_csv(name, "native", args, ctx.rt_priority)?;
    Ok(Run {
        summary,
        user_us: median(&mut user_start_rtts_us(&csv, false)),
        user_net_us: median(&mut user_start_rtts_us(&csv, true)),
    })
}

/// The peers' RTTs on the section's path: ping's and ping -6's medians
/// and the line naming every peer but ping -6.
struct PeerRtts {
    ping: Option<f64>,
    ping6: Option<f64>,
    text: String,
}

impl PeerRtts {
    fn measure(ctx: &Ctx, count: u64) -> Result<Self> {
        let peers = peer_rtts(ctx, count, "native")?;
        let peer = |name: &str| {
            peers
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, r)| r.as_ref().ok().copied())
        };
        let (ping, ping6) = (peer("ping"), peer("ping -6"));
        let text: Vec<String> = peers
            .iter()
            .filter(|(n, _)| n != "ping -6")
            .map(|(n, r)| format!("{n} {}", fmt_peer(r)))
            .collect();
        Ok(Self {
            ping,
            ping6,
            text: text.join("; "),
        })
    }
}

/// `Some(v <= peer)` where both are known.
fn le(v: Option<f64>, peer: Option<f64>) -> Option<bool> {
    match (v, peer) {
        (Some(v), Some(p)) => Some(v <= p),
        _ => None,
    }
}

/// "from the qdisc entry 3 µs": rtprobe's own headline figure.
fn from_qdisc(r: &Run, key: &str) -> String {
    format!("from the qdisc entry {}", us(r.p50(key)))
}

/// The in-kernel reflector's rows: RTT, sender CPU, turnaround, IPv6.
fn kernel_rows(k: &Run, k6: &Run, peers: &PeerRtts) -> Vec<Row> {
    vec![
        row(
            "RTT median, user send -> echo RX, in-kernel reflector (XDP), 1 ms, 64 B",
            us_f(k.user_us),
            format!(
                "ping {} (user send -> reply RX); rtprobe {}",
                us_f(peers.ping),
                from_qdisc(k, "rtt_ns")
            ),
            "<= ping",
            le(k.user_us, peers.ping),
        ),
        k.sender_cpu_row(),
        row(
            "reflector turnaround p50, in-kernel reflector",
            us(k.p50("reflector_turnaround_ns")),
            "-".into(),
            "<= 2.0 µs",
            k.p50("reflector_turnaround_ns")
                .map(|t| t <= TURNAROUND_TARGET_NS),
        ),
        row(
            "RTT median, user send -> echo RX, in-kernel reflector, IPv6 (--ip 6)",
            us_f(k6.user_us),
            format!(
                "ping -6 {}; rtprobe {}; turnaround p50 {}",
                us_f(peers.ping6),
                from_qdisc(k6, "rtt_ns"),
                us(k6.p50("reflector_turnaround_ns"))
            ),
            "<= ping -6",
            le(k6.user_us, peers.ping6),
        ),
    ]
}

/// The user-space reflector's rows: with its turnaround taken out, and in.
fn user_rows(s: &Run, peers: &PeerRtts) -> Vec<Row> {
    vec![
        row(
            "RTT median, user send -> echo RX, user-space reflector, turnaround taken out",
            us_f(s.user_net_us),
            format!("{}; rtprobe {}", peers.text, from_qdisc(s, "rtt_net_ns")),
            "<= ping",
            le(s.user_net_us, peers.ping),
        ),
        row(
            "RTT median, user send -> echo RX, user-space reflector in it",
            us_f(s.user_us),
            format!(
                "rtprobe {}; reflector turnaround p50 {}",
                from_qdisc(s, "rtt_ns"),
                us(s.p50("reflector_turnaround_ns"))
            ),
            "-",
            None,
        ),
    ]
}

pub(super) fn rtt_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let count: u64 = if quick { 1000 } else { 2000 };
    let n = count.to_string();
    // One path for all: the XDP router native, which the in-kernel
    // reflector's replies need on the veth testbed. Kernel reflector,
    // user-space reflector and the peers run back to back.
    let probe = ["--count", &n, "--interval", "1ms", "--reflector"];
    let k = run(ctx, "rtt-kernel", &[&probe[..], &["kernel"]].concat())?;
    let s = run(ctx, "rtt", &[&probe[..], &["user"]].concat())?;
    // The same over IPv6: the in-kernel reflector answers there too.
    let k6 = run(
        ctx,
        "rtt-kernel-ipv6",
        &[&probe[..], &["kernel", "--ip", "6"]].concat(),
    )?;
    let peers = PeerRtts::measure(ctx, count)?;
    let mut rows = kernel_rows(&k, &k6, &peers);
    rows.extend(user_rows(&s, &peers));
    rows.extend(pair_rows(ctx, quick)?);
    Ok(rows)
}
