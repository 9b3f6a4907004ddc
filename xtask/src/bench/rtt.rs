//! The RTT section: rtprobe's RTT medians with each reflector against
//! the peers' on the same testbed.

use anyhow::Result;

use super::{
    peers::{fmt_peer, peer_rtts},
    run::Ctx,
    table::{Row, row, us},
};

/// The targets for the in-kernel reflector.
pub(super) const TURNAROUND_TARGET_NS: u64 = 2_000;

#[allow(
    clippy::too_many_lines,
    reason = "one bench section: its runs and the rows it reports read top to bottom"
)]
pub(super) fn rtt_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let count: u64 = if quick { 1000 } else { 2000 };
    let n = count.to_string();
    // One path for all: the XDP router native, which the in-kernel
    // reflector's replies need on the veth testbed. Kernel reflector,
    // user-space reflector and the peers run back to back.
    let k = ctx.probe_on(
        "rtt-kernel",
        "native",
        &["--count", &n, "--interval", "1ms", "--reflector", "kernel"],
        ctx.rt_priority,
    )?;
    let s = ctx.probe_on(
        "rtt",
        "native",
        &["--count", &n, "--interval", "1ms", "--reflector", "user"],
        ctx.rt_priority,
    )?;
    let raw = s["rtt_ns"]["p50"].as_u64();
    let net = s["rtt_net_ns"]["p50"].as_u64();
    let k_raw = k["rtt_ns"]["p50"].as_u64();
    let k_turn = k["reflector_turnaround_ns"]["p50"].as_u64();
    // The same over IPv6: the in-kernel reflector answers there too.
    let k6 = ctx.probe_on(
        "rtt-kernel-ipv6",
        "native",
        &[
            "--count",
            &n,
            "--interval",
            "1ms",
            "--reflector",
            "kernel",
            "--ip",
            "6",
        ],
        ctx.rt_priority,
    )?;
    let k6_raw = k6["rtt_ns"]["p50"].as_u64();
    let k6_turn = k6["reflector_turnaround_ns"]["p50"].as_u64();
    let peers = peer_rtts(ctx, count, "native")?;
    let ping = peers
        .iter()
        .find(|(n, _)| n == "ping")
        .and_then(|(_, r)| r.as_ref().ok().copied());
    let peer_text: Vec<String> = peers
        .iter()
        .map(|(n, r)| format!("{n} {}", fmt_peer(r)))
        .collect();
    let ping6 = peers
        .iter()
        .find(|(n, _)| n == "ping -6")
        .and_then(|(_, r)| r.as_ref().ok().copied());
    let le = |v: Option<u64>, peer: Option<f64>| match (v, peer) {
        (Some(n), Some(p)) => Some(n as f64 / 1000.0 <= p),
        _ => None,
    };
    let le_ping = |v: Option<u64>| le(v, ping);
    Ok(vec![
        row(
            "RTT median, raw, in-kernel reflector (XDP), 1 ms, 64 B",
            us(k_raw),
            format!(
                "ping {}",
                ping.map_or("n/a".into(), |p| format!("{p:.1} µs"))
            ),
            "<= ping",
            le_ping(k_raw),
        ),
        row(
            "reflector turnaround p50, in-kernel reflector",
            us(k_turn),
            "-".into(),
            "<= 2.0 µs",
            k_turn.map(|t| t <= TURNAROUND_TARGET_NS),
        ),
        row(
            "RTT median, raw, in-kernel reflector, IPv6 (--ip 6)",
            us(k6_raw),
            format!(
                "ping -6 {}; turnaround p50 {}",
                ping6.map_or("n/a".into(), |p| format!("{p:.1} µs")),
                us(k6_turn)
            ),
            "<= ping -6",
            le(k6_raw, ping6),
        ),
        row(
            "RTT median, user-space reflector, turnaround taken out",
            us(net),
            peer_text
                .iter()
                .filter(|t| !t.starts_with("ping -6"))
                .cloned()
                .collect::<Vec<_>>()
                .join("; "),
            "<= ping",
            le_ping(net),
        ),
        row(
            "RTT median, raw, user-space reflector in it",
            us(raw),
            format!(
                "reflector turnaround p50 {}",
                us(s["reflector_turnaround_ns"]["p50"].as_u64())
            ),
            "-",
            None,
        ),
    ])
}
