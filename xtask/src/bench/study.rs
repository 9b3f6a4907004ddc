//! The study section: the figures of the study's relations with their
//! original bounds. The root tests (tests/chain_e2e.rs, knobs_e2e.rs,
//! prio_e2e.rs, tune/root_tests.rs) check the mechanisms behind them
//! against the kernel's own counters at whatever rate the machine gives;
//! how fast the shaper, the queue and the priority class are on this
//! machine is a figure, measured here and printed next to its bound.

use anyhow::{Context, Result};
use serde_json::Value;

use super::{
    run::Ctx,
    table::{Row, row},
};

/// 1470 B of payload + UDP/IPv4/Ethernet headers: the frame as the kernel
/// counts it.
const FRAME_BYTES: f64 = 1470.0 + 8.0 + 20.0 + 14.0;
/// What htb charges per frame on top at 100 Mbit/s (preamble, FCS, gap).
const WIRE_OVERHEAD_BYTES: f64 = 24.0;
const LINK_BPS: f64 = 100e6;

fn f64_at(j: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(j, |v, k| v.get(k))?.as_f64()
}

pub(super) fn study_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let mut rows = cbr_queue_rows(ctx, quick)?;
    rows.push(cbr_loss_row(ctx, quick)?);
    rows.extend(prio_rows(ctx, quick)?);
    rows.push(tcp_fill_row(ctx, quick)?);
    rows.push(fetch_row(ctx, quick)?);
    Ok(rows)
}

/// CBR UDP at 150 % into a 100-packet queue at the sender (chain_e2e's
/// run): the shaper's delivered rate against its 100 Mbit/s, and the
/// probes' one-way p50 against the queue's drain time at the nominal rate
/// (100 x 1512 B frames at 100 Mbit/s = 12.3 ms).
fn cbr_queue_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let count = if quick { "750" } else { "1500" };
    let j = ctx.probe(
        "study-cbr-queue",
        &[
            "--count",
            count,
            "--interval",
            "2ms",
            "--link-rate",
            "100mbit",
            "--queue-limit",
            "100",
            "--load",
            "udp:150%,size=1470",
        ],
    )?;
    let delivered = f64_at(&j, &["extra", "load", "bottleneck", "delivered_bps"])
        .context("no shaper counters in the run's JSON")?;
    // The shaper's rate in its own terms: frames plus the overhead it
    // charges, over the link rate.
    let share = delivered * (FRAME_BYTES + WIRE_OVERHEAD_BYTES) / FRAME_BYTES / LINK_BPS;
    let nominal_ms = 100.0 * (FRAME_BYTES + WIRE_OVERHEAD_BYTES) * 8.0 / LINK_BPS * 1e3;
    let p50_ms = f64_at(&j, &["one_way_ns", "p50"]).context("no one-way p50")? / 1e6;
    let off = (p50_ms - nominal_ms).abs() / nominal_ms;
    let stall = format!(
        "the shaper delivered {:.1} % of its rate (starved of CPU?); sender {}",
        share * 100.0,
        super::host::waits_text(&j["pacing"]["waits"])
    );
    let shaper = row(
        "htb shaper under CBR UDP at 150 %: rate delivered",
        format!(
            "{:.1} Mbit/s of frames ({:.1} % of the link)",
            delivered / 1e6,
            share * 100.0
        ),
        "100 Mbit/s set".into(),
        ">= 85 %",
        Some(share >= 0.85),
    )
    .because(stall.clone());
    let queue = row(
        "CBR UDP into a 100-packet queue: one-way p50",
        format!("{p50_ms:.2} ms"),
        format!("{nominal_ms:.2} ms drain time at 100 Mbit/s"),
        "within 15 %",
        Some(off <= 0.15),
    )
    .because(stall);
    Ok(vec![shaper, queue])
}

/// CBR UDP at 150 % through the router's 100 Mbit/s shaper (knobs_e2e's
/// run): the load's loss against the calculation from the rate it offered.
fn cbr_loss_row(ctx: &Ctx, quick: bool) -> Result<Row> {
    let count = if quick { "3000" } else { "6000" };
    let j = ctx.probe(
        "study-cbr-loss",
        &[
            "--count",
            count,
            "--interval",
            "1ms",
            "--link-rate",
            "100mbit",
            "--bottleneck",
            "router",
            "--load",
            "udp:150%,size=1470",
        ],
    )?;
    let flow = &j["extra"]["load"]["flows"][0];
    let (Some(measured), Some(calculated)) = (
        flow["loss_pct"].as_f64(),
        flow["expected_loss_pct"].as_f64(),
    ) else {
        anyhow::bail!("no load loss figures in the run's JSON");
    };
    let delivered = f64_at(&j, &["extra", "load", "bottleneck", "delivered_bps"]).unwrap_or(0.0);
    Ok(row(
        "CBR UDP at 150 % through the shaper: loss",
        format!("{measured:.2} %"),
        format!("{calculated:.2} % calculated"),
        "within 1.5 points",
        Some((measured - calculated).abs() <= 1.5),
    )
    .because(format!(
        "the shaper delivered {:.1} Mbit/s of frames; sender {}",
        delivered / 1e6,
        super::host::waits_text(&j["pacing"]["waits"])
    )))
}

/// Study 4's bound (prio_e2e's runs): with `htb-prio` the high-priority
/// flow's p99 under TCP at 100 % stays within 1 ms of its idle p99, while
/// the low-priority flow's rises by more than 1 ms.
fn prio_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let duration = if quick { "3s" } else { "5s" };
    // prio_e2e's flows: high 64 B every 200 us (TOS 0xC0), low 1472 B
    // every 1 ms (port 5062), frames (no GSO) in the router's queue; the
    // study's sender ran SCHED_FIFO.
    let args = |load: bool| {
        let mut a = vec![
            "--duration",
            duration,
            "--interval",
            "200us",
            "--size",
            "64",
            "--tos",
            "0xC0",
            "--flow",
            "port=5062,tos=0,size=1472,interval=1ms",
            "--link-rate",
            "100mbit",
            "--bottleneck",
            "router",
            "--gso",
            "off",
            "--qdisc",
            "htb-prio",
            "--rt-priority",
            "80",
        ];
        if load {
            a.extend(["--load", "tcp:100%,cc=cubic", "--load-warmup", "2s"]);
        }
        a
    };
    // Its own --rt-priority: not the bench's.
    let idle = ctx.probe_rt("study-prio-idle", &args(false), None)?;
    let loaded = ctx.probe_rt("study-prio-loaded", &args(true), None)?;
    let p99 = |j: &Value, i: usize| {
        j["extra"]["flows"][i]["summary"]["one_way_ns"]["p99"]
            .as_f64()
            .map(|v| v / 1e6)
    };
    let (Some(hi0), Some(lo0), Some(hi1), Some(lo1)) = (
        p99(&idle, 0),
        p99(&idle, 1),
        p99(&loaded, 0),
        p99(&loaded, 1),
    ) else {
        anyhow::bail!("no per-flow one-way p99 in the runs' JSON");
    };
    Ok(vec![
        row(
            "htb-prio under TCP at 100 %: high-priority p99 rise",
            format!("{:.3} ms ({hi0:.3} -> {hi1:.3} ms)", hi1 - hi0),
            format!(
                "low-priority flow {:.3} ms ({lo0:.3} -> {lo1:.3} ms)",
                lo1 - lo0
            ),
            "<= 1 ms, low > 1 ms",
            Some(hi1 - hi0 <= 1.0 && lo1 - lo0 > 1.0),
        )
        .because(super::host::waits_text(&loaded["pacing"]["waits"])),
    ])
}

/// TCP (cubic) at 100 % of a 100 Mbit/s shaped link: the share it filled.
fn tcp_fill_row(ctx: &Ctx, quick: bool) -> Result<Row> {
    let count = if quick { "1000" } else { "2000" };
    let j = ctx.probe(
        "study-tcp-fill",
        &[
            "--count",
            count,
            "--interval",
            "1ms",
            "--link-rate",
            "100mbit",
            "--bottleneck",
            "router",
            "--load",
            "tcp:100%",
        ],
    )?;
    let bps = f64_at(&j, &["extra", "load", "total_achieved_bps"]).context("no load figures")?;
    Ok(row(
        "TCP load on a 100 Mbit/s shaped link: throughput",
        format!("{:.1} Mbit/s", bps / 1e6),
        "100 Mbit/s link".into(),
        ">= 85 Mbit/s",
        Some(bps >= 85e6),
    )
    .because(super::host::waits_text(&j["pacing"]["waits"])))
}

/// Study 5 (fetch_e2e's runs): the median 100 KiB fetch behind a bulk
/// cubic flow on a 10 Mbit/s router bottleneck, with a 100-packet queue
/// against a 20-packet one (tests/fetch_e2e.rs says why more than 1.25x).
fn fetch_row(ctx: &Ctx, quick: bool) -> Result<Row> {
    let duration = if quick { "10s" } else { "20s" };
    let p50_s = |queue: &str| -> Result<f64> {
        let j = ctx.probe(
            &format!("study-fetch-q{queue}"),
            &[
                "--duration",
                duration,
                "--interval",
                "100ms",
                "--link-rate",
                "10mbit",
                "--bottleneck",
                "router",
                "--gso",
                "off",
                "--queue-limit",
                queue,
                "--load",
                "tcp,cc=cubic",
                "--load",
                "fetch:100KiB,every=500ms,cc=cubic,timeout=10s",
                "--load-warmup",
                "2s",
            ],
        )?;
        j["extra"]["load"]["flows"]
            .as_array()
            .and_then(|f| f.iter().find(|f| f["kind"] == "fetch"))
            .and_then(|f| f["fetch"]["p50_s"].as_f64())
            .context("no fetch figures in the run's JSON")
    };
    let (small, big) = (p50_s("20")?, p50_s("100")?);
    Ok(row(
        "100 KiB fetch behind bulk TCP, 10 Mbit/s: median, 100- vs 20-packet queue",
        format!("{:.2}x ({big:.3} s vs {small:.3} s)", big / small),
        "-".into(),
        "> 1.25x",
        Some(big > 1.25 * small),
    ))
}
