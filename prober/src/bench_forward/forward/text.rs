//! The report as text: the labels of the variants, the table row printed
//! as each step finishes, and the whole report with its ratios, legend and
//! perf table.

use std::{collections::BTreeMap, fmt::Write as _};

use super::report::{ForwardReport, ROUTER_LIMIT_DROP_PCT, StepResult};
use crate::bench_forward::{
    kinds::{ForwardMode, Sink},
    perf::opt,
};

/// The label of a variant: the mode's, with `+wN` for the work variant.
pub(crate) fn variant_label(mode: ForwardMode, work: Option<u32>) -> String {
    match work {
        Some(w) => format!("{}+w{w}", mode_label(mode)),
        None => mode_label(mode).to_string(),
    }
}

pub(super) fn mode_label(m: ForwardMode) -> &'static str {
    match m {
        ForwardMode::Off => "kernel",
        ForwardMode::Skb => "xdp-skb",
        ForwardMode::Native => "xdp-native",
        ForwardMode::SkbPass => "xdp-skb-pass",
        ForwardMode::NativePass => "xdp-native-pass",
    }
}

fn us(ns: Option<u64>) -> String {
    ns.map_or("-".into(), |v| format!("{:.1}", v as f64 / 1000.0))
}

/// One table row per step. Pure.
pub(crate) fn format_step(r: &StepResult) -> String {
    let cores: Vec<String> = r
        .cores
        .iter()
        .map(|c| format!("{:>3.0}/{:<3.0}", c.busy_pct, c.softirq_pct))
        .collect();
    format!(
        "{:<16}{:>5}{:>6}{:>11}{:>11}{:>11}{:>7.1}{:>6.0}{:>6}  {:<16}{:>9}{:>9}{:>10}  {}",
        variant_label(r.mode, r.work),
        r.size,
        format!("{}%", r.load_pct),
        r.offered_pps.map_or("max".into(), |p| format!("{p:.0}")),
        format!("{:.0}", r.generated_pps),
        format!("{:.0}", r.forwarded_pps),
        r.drop_pct,
        r.generator_cpu_pct,
        r.router_cpu_pct.map_or("-".into(), |c| format!("{c:.0}")),
        cores.join(" "),
        us(r.probe.one_way_p50_ns),
        us(r.probe.one_way_p99_ns),
        format!("{}/{}", r.probe.lost, r.probe.sent),
        r.limit.as_str(),
    )
}

pub(crate) fn table_header() -> String {
    format!(
        "{:<16}{:>5}{:>6}{:>11}{:>11}{:>11}{:>7}{:>6}{:>6}  {:<16}{:>9}{:>9}{:>10}  {}",
        "mode",
        "size",
        "load",
        "offered/s",
        "gen/s",
        "fwd/s",
        "drop%",
        "gen%",
        "rtr%",
        "core busy/si%",
        "1way p50",
        "1way p99",
        "lost",
        "limit"
    )
}

/// The whole report as text. Pure.
pub(crate) fn format_report(r: &ForwardReport) -> String {
    let mut o = String::new();
    write_heading(&mut o, r);
    let _ = writeln!(o, "{}", table_header());
    for s in &r.steps {
        let _ = writeln!(o, "{}", format_step(s));
    }
    write_ratios(&mut o, &r.steps);
    write_legend(&mut o, &r.steps);
    write_perf_table(&mut o, &r.steps);
    if !r.bounce.is_empty() {
        o.push('\n');
        o.push_str(&crate::bench_forward::bounce::format_table(
            &r.bounce,
            r.machine.cpus,
        ));
    }
    if let Some(n) = &r.perf_note {
        let _ = writeln!(o, "  {n}");
    }
    o
}

/// The machine and the settings the steps ran with.
fn write_heading(o: &mut String, r: &ForwardReport) {
    let m = &r.machine;
    let _ = writeln!(
        o,
        "bench-forward: {} x {}, kernel {}, load average {:.2} at start; threaded NAPI {}; {}; sink {}",
        m.cpus,
        m.cpu_model,
        m.kernel,
        m.loadavg_at_start,
        if r.threaded_napi { "on" } else { "off" },
        match r.rt_priority {
            Some(p) => format!("generator and router SCHED_FIFO {p}"),
            None => "normal scheduling".into(),
        },
        match r.sink {
            Sink::Xdp => "XDP drop at the receiver",
            Sink::Stack => "the receiver's stack",
        }
    );
    if let Some(h) = &m.host {
        let _ = writeln!(o, "  host: {}", h.line());
    }
}

/// Full-speed forwarding relative to the kernel, per size.
fn write_ratios(o: &mut String, steps: &[StepResult]) {
    let mut best: BTreeMap<(usize, String), f64> = BTreeMap::new();
    for s in steps.iter().filter(|s| s.load_pct >= 100) {
        best.insert((s.size, variant_label(s.mode, s.work)), s.forwarded_pps);
    }
    for ((size, label), pps) in &best {
        if let Some(k) = best.get(&(*size, "kernel".to_string()))
            && label != "kernel"
            && *k > 0.0
        {
            let _ = writeln!(
                o,
                "  {size} B: {label} forwards {:.2}x the kernel's packets/s",
                pps / k
            );
        }
    }
}

/// What the table's columns mean.
fn write_legend(o: &mut String, steps: &[StepResult]) {
    let _ = writeln!(
        o,
        "  sizes are IP packet bytes; gen% / rtr%: CPU of the generator threads / the router's NAPI thread (percent of one core);\n  \
         core busy/si%: per core from /proc/stat, everything on the machine (si = softirq: the receiver's veth);\n  \
         1way: the probe's one-way delay across the hop in µs (kernel timestamps; RTTs are in the JSON);\n  \
         limit: router = the hop dropped > {ROUTER_LIMIT_DROP_PCT} % of what it was offered, generator = flat out and nothing dropped"
    );
    if steps.iter().any(|s| s.work.is_some()) {
        let _ = writeln!(
            o,
            "  +wN: the router's work variant, N memory accesses per packet before forwarding"
        );
    }
}

/// `perf stat` of the router on the flat-out steps that counted it.
fn write_perf_table(o: &mut String, steps: &[StepResult]) {
    let perf_rows: Vec<&StepResult> = steps.iter().filter(|s| s.perf.is_some()).collect();
    if perf_rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nperf stat of the router's NAPI threads, flat-out steps:\n{:<22}{:>5}{:>11}{:>9}{:>7}{:>10}{:>9}",
        "mode", "size", "fwd/s", "cpu ms", "IPC", "br-miss%", "L1-miss%"
    );
    for s in perf_rows {
        let p = s.perf.as_ref().expect("filtered");
        let _ = writeln!(
            o,
            "{:<22}{:>5}{:>11.0}{:>9}{:>7}{:>10}{:>9}",
            variant_label(s.mode, s.work),
            s.size,
            s.forwarded_pps,
            opt(p.task_clock_ms, 0),
            opt(p.ipc(), 2),
            opt(p.branch_miss_pct(), 2),
            opt(p.l1d_miss_pct(), 2),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_forward::{
        cpu::CoreUse,
        forward::report::{Limit, Machine, ProbeFigures},
        kinds::Generator,
    };

    #[test]
    fn report_text_has_ratio_and_limits() {
        let step = |mode, pps: f64, limit| StepResult {
            mode,
            work: None,
            perf: None,
            xdp_mode_attached: "none".into(),
            generator: Generator::Xdp,
            size: 64,
            load_pct: 100,
            offered_pps: None,
            generated: (pps * 2.0) as u64,
            forwarded: (pps * 2.0) as u64,
            secs: 2.0,
            generated_pps: pps,
            forwarded_pps: pps,
            drop_pct: 0.0,
            generator_runs_pps: pps,
            generator_cpu_pct: 99.0,
            router_cpu_pct: Some(97.0),
            cores: vec![CoreUse {
                cpu: 0,
                busy_pct: 100.0,
                softirq_pct: 80.0,
                ..Default::default()
            }],
            probe: ProbeFigures {
                sent: 100,
                lost: 0,
                one_way_p50_ns: Some(25_400),
                ..Default::default()
            },
            xdp_counters: Default::default(),
            router_in_rx_dropped: 0,
            limit,
        };
        let r = ForwardReport {
            testbed_ids: vec!["abc123".into()],
            sink: Sink::Xdp,
            machine: Machine {
                cpus: 2,
                cpu_model: "Test CPU".into(),
                kernel: "6.18".into(),
                loadavg_at_start: 0.5,
                host: None,
            },
            threaded_napi: true,
            rt_priority: None,
            bounce: Vec::new(),
            perf_note: None,
            steps: vec![
                step(ForwardMode::Off, 400_000.0, Limit::Router),
                step(ForwardMode::Native, 1_200_000.0, Limit::Generator),
            ],
        };
        let t = format_report(&r);
        assert!(t.contains("xdp-native forwards 3.00x the kernel"), "{t}");
        assert!(t.contains("router"), "{t}");
        assert!(t.contains("generator"), "{t}");
        assert!(t.contains("25.4"), "{t}");
        assert!(t.contains("100/80"), "{t}");
        assert!(t.contains("Test CPU"), "{t}");
    }
}
