//! One probe run end to end: testbed, XDP router, probe session, summary,
//! teardown. Teardown happens through guards, so it also runs on errors and
//! after Ctrl-C.

use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::{Context, Result, bail};

use crate::{
    cli::XdpModeArg,
    config::RunOptions,
    export::{CsvWriter, RunMeta},
    probe::{self, Endpoints},
    stats::Summary,
    testbed::{Kind, Testbed},
};

/// The result of a run.
pub struct RunOutcome {
    pub summary: Summary,
    pub meta: RunMeta,
    pub rows: u64,
    pub interrupted: bool,
}

fn check_stop(stop: &AtomicU8) -> Result<()> {
    if stop.load(Ordering::SeqCst) != 0 {
        bail!("interrupted before probing started; nothing was measured (the testbed was removed)");
    }
    Ok(())
}

/// Runs one probe session as `opts` says. `progress(sent)` is called a few
/// times a second.
pub fn execute(
    opts: &RunOptions,
    stop: &AtomicU8,
    progress: impl FnMut(u64),
) -> Result<RunOutcome> {
    crate::testbed::require_root()?;
    let testbed = match (&opts.tx_if, &opts.rx_if) {
        (Some(t), Some(r)) => Testbed::nic_pair(t, r)?,
        (None, None) => Testbed::veth()?,
        _ => bail!("NIC-pair mode needs both --tx-if and --rx-if"),
    };
    log::info!(
        "testbed {} ready: namespaces {}",
        testbed.id,
        testbed.namespaces().join(", ")
    );
    check_stop(stop)?;

    let xdp = crate::ebpf::attach_for_testbed(&testbed, opts.xdp_mode, opts.xdp_action)?;
    check_stop(stop)?;

    let meta = RunMeta {
        version: env!("CARGO_PKG_VERSION").to_string(),
        started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        label: opts.label.clone(),
        testbed: match testbed.kind {
            Kind::Veth => "veth".into(),
            Kind::NicPair => "nic-pair".into(),
        },
        testbed_id: testbed.id.clone(),
        tx_if: Some(testbed.sender_if.name.clone()),
        rx_if: Some(testbed.receiver_if.name.clone()),
        xdp_mode_requested: mode_name(opts.xdp_mode).into(),
        xdp_mode_attached: xdp.attached_mode_name(),
        xdp_action: if opts.xdp_mode == XdpModeArg::Off {
            "none".into()
        } else {
            format!("{:?}", opts.xdp_action).to_lowercase()
        },
        size: opts.probe.size as u32,
        interval_ns: opts.probe.interval.as_nanos() as u64,
        count: opts.probe.count,
        duration_ns: opts.probe.duration.map(|d| d.as_nanos() as u64),
        tos: opts.probe.tos,
        port: opts.probe.port,
        timestamps_requested: format!("{:?}", opts.probe.timestamps).to_lowercase(),
        knobs: pacing_knobs(opts),
    };
    let mut csv = CsvWriter::create(&opts.out, &meta)?;
    let ep = Endpoints {
        sender_ns: &testbed.sender,
        receiver_ns: &testbed.receiver,
        sender_if: &testbed.sender_if,
        receiver_if: &testbed.receiver_if,
    };
    let outcome = probe::run_session(&ep, &opts.probe, &mut csv, stop, progress)?;
    let mut summary = outcome.stats.summary();
    summary.xdp_mode_requested = meta.xdp_mode_requested.clone();
    summary.xdp_mode_attached = meta.xdp_mode_attached.clone();
    summary.xdp_counters = xdp.counters().context("read XDP counters")?;
    summary
        .extra
        .insert("late_arrivals".into(), outcome.late_arrivals.into());
    summary
        .extra
        .insert("kernel_drops".into(), outcome.kernel_drops.clone());
    summary
        .extra
        .insert("peak_rss_kib".into(), peak_rss_kib().into());
    summary.extra.insert(
        "hardware_timestamping".into(),
        serde_json::json!({"sender": outcome.hardware_tx, "receiver": outcome.hardware_rx}),
    );
    if outcome.interrupted {
        summary.extra.insert("interrupted".into(), true.into());
    }
    xdp.detach().context("detach the XDP router")?;
    testbed.teardown()?;
    Ok(RunOutcome {
        summary,
        meta,
        rows: csv.rows(),
        interrupted: outcome.interrupted,
    })
}

/// How the sender paced, stored with the run.
fn pacing_knobs(opts: &RunOptions) -> serde_json::Map<String, serde_json::Value> {
    let p = &opts.probe;
    let mut m = serde_json::Map::new();
    m.insert(
        "pacing".into(),
        serde_json::json!({
            "busy_poll": p.busy_poll,
            "spin_ns": if p.busy_poll { None } else { Some(p.spin.as_nanos() as u64) },
            "rt_priority": p.rt.rt_priority,
            "mlockall": p.rt.mlockall,
            "pin_cpu": p.rt.pin_cpu,
        }),
    );
    m
}

/// The process's peak resident memory so far (VmHWM), in KiB; 0 if unknown.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

pub fn mode_name(m: XdpModeArg) -> &'static str {
    match m {
        XdpModeArg::Off => "off",
        XdpModeArg::Skb => "skb",
        XdpModeArg::Native => "native",
        XdpModeArg::Auto => "auto",
    }
}
