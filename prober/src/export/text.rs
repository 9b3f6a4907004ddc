//! The human summary printed at the end of a run. Pure.

use std::fmt::Write as _;

use crate::{
    export::plot::axis::{format_duration_ns, split_duration_ns},
    model::meta::RunMeta,
    stats::{
        Latency, Pacing, RunReport, Summary,
        chain::Stage,
        report::{
            FetchTimes, FlowReport, FlowSummary, HardwareClock, KernelDrops, ReflectorReport,
        },
    },
};

/// A latency for the tables: the number right-aligned by the caller, then
/// the unit in a column of two ("812 ns", "5.743 µs", "109 ms", "2 s ").
fn lat(v: Option<u64>) -> String {
    match v {
        None => "-   ".into(),
        Some(ns) => {
            let (number, unit) = split_duration_ns(ns as f64);
            format!("{number} {:<2}", unit.symbol())
        }
    }
}

/// A percentile of `l` for the tables: "> 1.074 s " when it fell among
/// the values above the histogram's cap.
fn pct(l: &Latency, v: Option<u64>) -> String {
    match l.above_cap(v) {
        Some(cap) => format!("> {}", lat(Some(cap))),
        None => lat(v),
    }
}

fn row(out: &mut String, name: &str, l: &Latency) {
    let mean = l.mean.map(|m| m.round() as u64);
    let _ = writeln!(
        out,
        "  {name:<14}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}",
        lat(l.min),
        pct(l, l.p50),
        pct(l, l.p90),
        pct(l, l.p99),
        pct(l, l.p999),
        lat(l.max),
        lat(mean)
    );
}

/// A single latency in words: "142 µs", "-" when unknown.
fn words(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |ns| format_duration_ns(ns as f64))
}

/// " (timer + adaptive spin: margin 142 µs, spin 13.9 µs/probe = 1.39 % of a CPU)".
fn pacing_words(p: &Pacing) -> String {
    let cost = format!(
        "spin {}/probe = {:.2} % of a CPU",
        format_duration_ns(p.spin_ns_per_probe),
        p.spin_cpu_pct
    );
    match p.mode.as_str() {
        "busy-poll" => format!(" (busy-poll: {cost})"),
        mode => format!(
            " (timer + {mode} spin: margin {}, {}{cost})",
            words(p.margin_ns),
            p.warm_up_ns_per_probe
                .map(|ns| format!("warm-up on loopback {}/probe, ", format_duration_ns(ns)))
                .unwrap_or_default()
        ),
    }
}

/// "waited for a CPU 1.25 ms (0.06 % of the sending); the hypervisor stole
/// 40 ms from CPUs 0-1 (1.00 %)", None when neither counter was readable.
fn waits_words(w: &crate::stats::CpuWaits) -> Option<String> {
    let runq = w.runq_wait_ns.map(|ns| {
        format!(
            "waited for a CPU {} ({:.2} % of the sending)",
            format_duration_ns(ns as f64),
            w.runq_wait_pct().unwrap_or(0.0)
        )
    });
    let steal = w.steal_ns.map(|ns| {
        format!(
            "the hypervisor stole {} from {} ({:.2} %)",
            if ns == 0 {
                "nothing".to_string()
            } else {
                format_duration_ns(ns as f64)
            },
            cpu_list(&w.cpus),
            w.steal_pct().unwrap_or(0.0)
        )
    });
    let parts: Vec<String> = runq.into_iter().chain(steal).collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// "CPU 3", "CPUs 0-1", "CPUs 0,2-3".
fn cpu_list(cpus: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &c in cpus {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == c => *end = c,
            _ => runs.push((c, c)),
        }
    }
    let words: Vec<String> = runs
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    format!(
        "CPU{} {}",
        if cpus.len() == 1 { "" } else { "s" },
        words.join(",")
    )
}

/// ", protocol stamp, SSID 12, probes arrived with TTL 64" for a session
/// against a reflector (hop limit over IPv6); empty otherwise.
fn protocol_words(r: &ReflectorReport, ipv6: bool) -> String {
    let Some(p) = &r.protocol else {
        return String::new();
    };
    let mut w = format!(", protocol {p}");
    if let Some(ssid) = r.ssid {
        w += &format!(", SSID {ssid}");
    }
    if r.authenticated == Some(true) {
        w += ", authenticated (HMAC-SHA-256)";
    }
    let ttl = if ipv6 { "hop limit" } else { "TTL" };
    match (r.sender_ttl_min.flatten(), r.sender_ttl_max.flatten()) {
        (Some(a), Some(b)) if a == b => w += &format!(", probes arrived with {ttl} {a}"),
        (Some(a), Some(b)) => w += &format!(", probes arrived with {ttl} {a}..{b}"),
        _ => {}
    }
    w
}

pub(crate) fn format_summary(s: &Summary, m: &RunMeta) -> String {
    let mut o = String::new();
    run_lines(&mut o, s, m);
    count_lines(&mut o, s, m);
    reflector_lines(&mut o, s);
    clock_lines(&mut o, s);
    pacing_lines(&mut o, s, m);
    setup_lines(&mut o, s, m);
    load_lines(&mut o, &s.report);
    latency_table(&mut o, s);
    flows_table(&mut o, &s.report.flows);
    targets_table(&mut o, &s.report.targets);
    o
}

/// What was run: probes, testbed, XDP mode, IPv6 addresses.
fn run_lines(o: &mut String, s: &Summary, m: &RunMeta) {
    let interval = humantime::format_duration(std::time::Duration::from_nanos(m.interval_ns));
    let _ = writeln!(
        o,
        "rtprobe{}: {} B probes every {interval}, TOS {:#04x}, port {}, {} ({} -> {})",
        m.label
            .as_deref()
            .map(|l| format!(" [{l}]"))
            .unwrap_or_default(),
        m.size,
        m.tos,
        m.port,
        if m.testbed == "remote" {
            "remote reflector".to_string()
        } else {
            format!("{} testbed", m.testbed)
        },
        m.tx_if.as_deref().unwrap_or("?"),
        m.rx_if.as_deref().unwrap_or("?"),
    );
    if let Some(h) = &s.report.host {
        let _ = writeln!(o, "  host: {}", h.line());
    }
    let _ = writeln!(
        o,
        "  XDP mode: requested {}, attached {}{}",
        m.xdp_mode_requested,
        m.xdp_mode_attached,
        if m.xdp_action == "none" {
            String::new()
        } else {
            format!(" ({})", m.xdp_action)
        }
    );
    // IPv4 testbed runs say nothing here, as before `--ip`.
    if let Some(ip) = s.report.ip.as_ref().filter(|ip| ip.version == 6) {
        let _ = writeln!(
            o,
            "  IPv6: {} -> {} ({} B IP packets: 40-byte IPv6 + 8-byte UDP header)",
            ip.sender,
            ip.receiver,
            m.size + 48
        );
    }
}

/// Probes sent, received, lost; timestamps; what was refused.
fn count_lines(o: &mut String, s: &Summary, m: &RunMeta) {
    let _ = writeln!(
        o,
        "  sent {}  received {}  lost {} ({:.2} %)  reordered {}  duplicates {}  echoes lost {}",
        s.sent, s.received, s.lost, s.loss_pct, s.reordered, s.duplicates, s.echo_lost
    );
    let _ = writeln!(
        o,
        "  timestamps: {} (requested {}); TX timestamps missing {}, duplicate {}, late {}",
        s.timestamp_source,
        m.timestamps_requested,
        s.tx_timestamp_missing,
        s.tx_timestamp_duplicates,
        s.tx_timestamp_late,
    );
    let _ = writeln!(
        o,
        "  refused: foreign packets {}, never-sent seqs {}, late echoes {}",
        s.foreign_packets, s.never_sent, s.late_echoes
    );
}

/// The reflector, the loss by direction and the clock rule.
fn reflector_lines(o: &mut String, s: &Summary) {
    let rep = &s.report;
    if let Some(r) = &rep.reflector {
        let mode = r
            .xdp_mode
            .as_ref()
            .map(|m| format!(" (XDP {m})"))
            .unwrap_or_default();
        let note = r
            .note
            .as_ref()
            .map(|n| format!("; {n}"))
            .unwrap_or_default();
        // A testbed run says its family; a --target run's address shows it.
        let ipv6 = rep.ip.as_ref().is_some_and(|i| i.version == 6)
            || r.target.as_ref().is_some_and(|t| t.starts_with('['));
        let _ = writeln!(
            o,
            "  reflector: {}{mode}{note}{}",
            r.kind,
            protocol_words(r, ipv6)
        );
    }
    if let Some(l) = &rep.loss_split {
        let n = |v: Option<u64>| v.map_or("?".to_string(), |x| x.to_string());
        let _ = writeln!(
            o,
            "  loss by direction: forward {}  return {}  unknown {} ({})",
            n(l.forward),
            n(l.r#return),
            l.unknown,
            l.basis
        );
    }
    if let Some(c) = &rep.clock {
        let _ = writeln!(o, "  clock: {}", c.note());
    }
}

/// Kernel drops and memory, where the figures start, the NICs' clocks.
fn clock_lines(o: &mut String, s: &Summary) {
    if let Some(line) = drops_line(s) {
        let _ = writeln!(o, "{line}");
    }
    let _ = writeln!(o, "  {}", start_words(&s.one_way_start));
    let Some(clocks) = &s.report.hardware_clocks else {
        return;
    };
    let sides = [("receiver", &clocks.receiver), ("sender", &clocks.sender)];
    for (side, c) in sides
        .into_iter()
        .filter_map(|(n, c)| Some((n, c.as_ref()?)))
    {
        let line = match c {
            HardwareClock::Failed { error } => format!("{side} NIC: {error}"),
            HardwareClock::Sampled(c) => {
                let p = &c.phc;
                // Unknown figures print as the JSON has them.
                let n = |v: Option<u64>| v.map_or("null".to_string(), |x| x.to_string());
                format!(
                    "{side} NIC: PHC /dev/ptp{} on the system clock by {} samples; offset uncertainty (read window) median {} ns, max {} ns; drift {} ppb; steps {}",
                    n(p.phc_index.map(u64::from)),
                    p.samples,
                    n(p.read_window_median_ns),
                    n(p.read_window_max_ns),
                    p.drift_ppb.map_or("-".into(), |d| format!("{d:.0}")),
                    p.steps
                )
            }
        };
        let _ = writeln!(o, "  hardware clock, {line}");
    }
}

/// How the sender kept its schedule, woke up, and waited for a CPU.
fn pacing_lines(o: &mut String, s: &Summary, m: &RunMeta) {
    let pct = |n: u64| {
        if s.sent == 0 {
            0.0
        } else {
            100.0 * n as f64 / s.sent as f64
        }
    };
    let _ = writeln!(
        o,
        "  pacing{}: {:.0} probes/s sent; missed ticks {} ({:.2} %, sent > 1 interval late); unaccounted probes {}{}",
        match (&s.pacing, &m.knobs.pacing) {
            (Some(p), _) => pacing_words(p),
            (None, Some(p)) if p.busy_poll => " (busy-poll)".to_string(),
            (None, Some(p)) => p
                .spin_ns
                .map(|n| format!(" (timer + {:.0} µs spin)", n as f64 / 1000.0))
                .unwrap_or_default(),
            (None, None) => String::new(),
        },
        s.send_rate_pps,
        s.missed_ticks,
        pct(s.missed_ticks),
        s.unaccounted,
        if s.unaccounted > 0 {
            " (BUG: every probe must be received or lost)"
        } else {
            ""
        }
    );
    let Some(p) = &s.pacing else {
        return;
    };
    if p.wake_late_ns.count > 0 {
        let w = &p.wake_late_ns;
        let _ = writeln!(
            o,
            "  sender wake-ups: late p50 {} / p99 {} / max {} ({} sleeps, {} overslept the send){}{}",
            words(w.p50),
            words(w.p99),
            words(w.max),
            w.count,
            p.overslept,
            p.sender_cpu_pct
                .map(|c| format!("; sender thread {c:.1} % of a CPU"))
                .unwrap_or_default(),
            if p.clock_steps > 0 {
                format!(
                    "; {} wall-clock steps (stamps followed, schedule did not)",
                    p.clock_steps
                )
            } else {
                String::new()
            },
        );
    }
    if p.send_failures > 0 {
        let _ = writeln!(
            o,
            "  send failed: {} probes (counted as lost; the log names the target and the error)",
            p.send_failures
        );
    }
    if let Some(w) = &p.waits
        && let Some(line) = waits_words(w)
    {
        // Steal on a VM whose idle CPUs halt: the knob that keeps them running.
        let hint = match p.cpu_dma_latency_us {
            Some(us) => format!("; CPU idle-latency limit {us} µs held"),
            None if w.steal_pct().unwrap_or(0.0) >= 1.0 => {
                " (--cpu-dma-latency 0 keeps idle vCPUs from halting and handing the CPU back)"
                    .into()
            }
            None => String::new(),
        };
        let _ = writeln!(o, "  sender not running: {line}{hint}");
    }
    if let Some(r) = &p.reader {
        reader_line(o, r);
    }
}

/// How long the echoes waited to be read, and the reading thread (the
/// sender, or the in-process reflector's I/O thread) for a CPU.
fn reader_line(o: &mut String, r: &crate::stats::ReaderTiming) {
    let d = &r.read_delay_ns;
    if d.count == 0 {
        return;
    }
    let waits = r
        .waits
        .as_ref()
        .and_then(waits_words)
        .map(|w| format!("; the thread {w}"))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "  echoes read after the kernel had them: p50 {} / p99 {} / max {} (the reader's delay; no probe is lost to it){waits}",
        words(d.p50),
        words(d.p99),
        words(d.max),
    );
}

/// The XDP counters and the knobs applied.
fn setup_lines(o: &mut String, s: &Summary, m: &RunMeta) {
    if !s.xdp_counters.is_empty() {
        let parts: Vec<String> = s
            .xdp_counters
            .iter()
            .filter(|(_, c)| c.packets > 0)
            .map(|(k, c)| format!("{k} {} pkt / {} B", c.packets, c.bytes))
            .collect();
        let _ = writeln!(
            o,
            "  XDP counters: {}",
            if parts.is_empty() {
                "all zero".into()
            } else {
                parts.join(", ")
            }
        );
    }
    // How the sender paced is stored with the knobs but is not one.
    let names: Vec<&str> = (m.knobs.names().into_iter())
        .filter(|k| *k != "bottleneck" && *k != "pacing")
        .collect();
    if !names.is_empty() {
        let at = match &m.knobs.bottleneck {
            Some(b) => format!("bottleneck {}; ", b.dev),
            None => String::new(),
        };
        let _ = writeln!(
            o,
            "  knobs: {} ({at}details in the JSON summary)",
            names.join(", ")
        );
    }
}

/// What the competing load achieved, what was skipped, and whether the
/// run was stopped early.
fn load_lines(o: &mut String, r: &RunReport) {
    let flows = r.load.as_ref().map_or(&[][..], |l| &l.flows[..]);
    for f in flows {
        let _ = writeln!(o, "{}", load_flow_line(f));
    }
    if let Some(q) = r.load.as_ref().and_then(|l| l.bottleneck.as_ref()) {
        let _ = writeln!(
            o,
            "  bottleneck {} ({}, the kernel's counters over the window, probes included): \
             {:.1} Mbit/s of frames sent, {} dropped of {} ({:.2} %)",
            q.dev,
            q.qdisc,
            q.delivered_bps / 1e6,
            q.dropped_packets,
            q.dropped_packets + q.sent_packets,
            q.drop_pct
        );
    }
    for k in &r.skipped {
        let _ = writeln!(o, "  SKIPPED: {k}");
    }
    if r.interrupted {
        // What reached the CSV is counted where the rows are known (the
        // "wrote N rows" line), never assumed here.
        let _ = writeln!(o, "  interrupted: the run was stopped early");
    }
}

/// "  load udp:100M: 95.1 Mbit/s of 100.0 offered, loss 4.90 % (calculated 4.88 %), ...".
fn load_flow_line(f: &FlowReport) -> String {
    let mut line = format!("  load {}:", f.spec);
    if let Some(cc) = &f.cc {
        line += &format!(" {cc}");
    }
    line += &format!(" {:.1} Mbit/s", f.achieved_bps / 1e6);
    if let Some(bps) = f.offered_bps {
        line += &format!(" of {:.1} offered", bps / 1e6);
    }
    if let (Some(l), Some(e)) = (f.loss_pct, f.expected_loss_pct) {
        line += &format!(", loss {l:.2} % (calculated {e:.2} %)");
    }
    if let (Some(lost), Some(sent)) = (f.lost_packets, f.sent_packets) {
        line += &format!(", {lost} of {sent} datagrams lost");
    }
    if let Some(t) = &f.fetch {
        line += &format!(", {}", fetch_line(t));
    }
    line
}

/// The latency table, stage by stage, and where the time went.
fn latency_table(o: &mut String, s: &Summary) {
    let _ = writeln!(
        o,
        "  {:<14}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}",
        "", "min", "p50", "p90", "p99", "p99.9", "max", "mean"
    );
    row(o, "one-way", &s.one_way_ns);
    row(o, "rtt", &s.rtt_ns);
    // Stages without data (no hardware stamps: no driver stage) are left out.
    for stage in Stage::ALL {
        let l = s.stages_ns.get(stage);
        if l.count > 0 {
            row(o, &format!(" {}", stage.label()), l);
        }
    }
    row(o, "rtt net", &s.rtt_net_ns);
    row(o, "turnaround", &s.reflector_turnaround_ns);
    row(o, "ipdv", &s.ipdv_ns);
    row(o, "send error", &s.send_error_ns);
    row(o, "send->tx", &s.send_to_tx_ns);
    let said: Vec<&str> = [&s.one_way_dominant, &s.rtt_dominant]
        .into_iter()
        .flatten()
        .map(|d| d.text.as_str())
        .collect();
    if !said.is_empty() {
        let _ = writeln!(o, "  where the time went: {}", said.join("; "));
    }
}

/// One-way per probe flow (runs with `--flow`).
fn flows_table(o: &mut String, flows: &[FlowSummary]) {
    if flows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "  per flow, one-way:\n  {:<5}{:>6}{:>6}{:>6}{:>10}{:>8}{:>7}{:>11}{:>11}{:>11}{:>11}",
        "flow", "port", "tos", "size", "interval", "sent", "lost", "p50", "p99", "p99.9", "max"
    );
    for f in flows {
        let fs = &f.summary;
        let interval = humantime::format_duration(std::time::Duration::from_nanos(f.interval_ns));
        let _ = writeln!(
            o,
            "  {:<5}{:>6}{:>6}{:>6}{:>10}{:>8}{:>7}{:>11}{:>11}{:>11}{:>11}",
            f.flow.to_string(),
            f.port.to_string(),
            format!("{:#04x}", f.tos),
            f.size.to_string(),
            interval.to_string(),
            fs.sent,
            fs.lost,
            lat(fs.one_way_ns.p50),
            lat(fs.one_way_ns.p99),
            lat(fs.one_way_ns.p999),
            lat(fs.one_way_ns.max)
        );
    }
}

/// Per target (runs with several): loss by direction, what was refused,
/// RTT. The figures above it are the total.
fn targets_table(o: &mut String, targets: &[crate::stats::report::TargetSummary]) {
    if targets.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "  per target ({}; the figures above are their total):\n  {:<20}{:>8}{:>7}{:>6}{:>6}{:>8}{:>8}{:>6}{:>11}{:>11}{:>11}",
        targets.len(),
        "target",
        "sent",
        "lost",
        "fwd",
        "ret",
        "foreign",
        "unsent",
        "late",
        "rtt p50",
        "rtt p99",
        "max"
    );
    let n = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for t in targets {
        let s = &t.summary;
        let split = s.report.loss_split.as_ref();
        let _ = writeln!(
            o,
            "  {:<20}{:>8}{:>7}{:>6}{:>6}{:>8}{:>8}{:>6}{:>11}{:>11}{:>11}",
            t.name,
            s.sent,
            s.lost,
            n(split.and_then(|l| l.forward)),
            n(split.and_then(|l| l.r#return)),
            s.foreign_packets,
            s.never_sent,
            s.late_echoes,
            pct(&s.rtt_ns, s.rtt_ns.p50),
            pct(&s.rtt_ns, s.rtt_ns.p99),
            lat(s.rtt_ns.max)
        );
    }
}

/// Where the headline figures start, in words.
fn start_words(start: &str) -> &'static str {
    match start {
        "sched" => {
            "one-way and RTT start as the probe enters the sender's qdisc (kernel SCHED stamp) and end at the receiver's / the echo's RX stamp"
        }
        "user" => {
            "one-way and RTT start at the user-space send (the kernel gave no SCHED stamp) and end at the receiver's / the echo's RX stamp"
        }
        "mixed" => {
            "one-way and RTT start at the kernel's SCHED stamp, or at the user-space send for probes without one, and end at the RX stamps"
        }
        _ => "one-way and RTT: no probe came back",
    }
}

/// A fetch load's times in one line: "12 fetches of 100KiB: 0.512 ± 0.101 s,
/// p50 0.490, p90 0.700, p99 0.800, max 0.810 s, 0 failed".
pub(crate) fn fetch_line(t: &FetchTimes) -> String {
    let s3 = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.3}"));
    format!(
        "{} fetches of {}: {} ± {} s, p50 {}, p90 {}, p99 {}, max {} s, {} failed",
        t.count,
        crate::model::units::Bytes(t.size_bytes),
        s3(t.mean_s),
        s3(t.sd_s),
        s3(t.p50_s),
        s3(t.p90_s),
        s3(t.p99_s),
        s3(t.max_s),
        t.failures
    )
}

/// Kernel drop counters and peak memory, "-" where they could not be read
/// (null in the JSON): unknown is never shown as 0.
fn drops_line(s: &Summary) -> Option<String> {
    let d = s.report.kernel_drops.as_ref();
    let rss = s.report.peak_rss_kib;
    if d.is_none() && rss.is_none() {
        return None;
    }
    let d = d.and_then(Option::as_ref);
    let v = |x: Option<u64>| x.map_or("-".into(), |n| n.to_string());
    let k = |f: fn(&KernelDrops) -> Option<u64>| v(d.and_then(f));
    Some(format!(
        "  kernel drops: receiver rcvbuf {}, in-errors {}; sender rcvbuf {}, sndbuf {}; host backlog {}; peak RSS {} KiB",
        k(|d| d.receiver_rcvbuf_errors),
        k(|d| d.receiver_in_errors),
        k(|d| d.sender_rcvbuf_errors),
        k(|d| d.sender_sndbuf_errors),
        k(|d| d.host_backlog_drops),
        v(rss.flatten()),
    ))
}

#[cfg(test)]
#[path = "text_tests.rs"]
mod tests;
