//! One step: the generator's load at a share of what the hop forwarded flat
//! out, a probe session across the hop at the same time (and `perf stat` on
//! flat-out steps), and the counters read around it turned into a
//! [`StepResult`].

use std::{
    path::PathBuf,
    sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{
    PROBE_PORT, SINK_PORT,
    bed::{ModeBed, ingress_total},
    report::{ProbeFigures, StepResult, classify},
    text::variant_label,
};
use crate::{
    bench_forward::{
        cpu,
        frame::{self, FrameSpec},
        kinds::Generator,
        links,
        loadgen::{self, LiveTarget, Offered, SocketGen},
        perf::{self, PerfFigures},
        plan::{Plan, Variant},
    },
    export::CsvWriter,
    probe::{self, Endpoints, ProbeConfig, TimestampSource as TimestampArg},
    stats::{Summary, XdpCounters, summary::PacketsBytes},
    testbed::Testbed,
};

/// What the flat-out step of a size found; the paced steps are fractions of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct FullSpeed {
    /// What the generator itself did per second (XDP: program runs).
    pub(super) generator_pps: f64,
    /// What the hop forwarded per second.
    pub(super) forwarded_pps: f64,
}

/// What a load run returns.
struct LoadRun {
    /// Packets the generator counted (XDP: program runs, of which it kept
    /// a random share; the exact figure comes from the router's ingress).
    counted: u64,
    secs: f64,
    /// CPU seconds the generator threads used.
    cpu_secs: f64,
}

/// Runs the generator threads in the sender namespace for `duration` at
/// `rate` (None: flat out).
fn run_load(
    bed: &ModeBed,
    plan: &Plan,
    frame_bytes: &[u8],
    ip_size: usize,
    rate: Option<(f64, FullSpeed)>,
    duration: Duration,
    stop: &AtomicU8,
) -> Result<LoadRun> {
    let count = AtomicU64::new(0);
    let halt = AtomicBool::new(false);
    let cpu_micros = AtomicU64::new(0);
    let per_thread = match rate {
        None => Offered::Max,
        Some((pps, _)) => Offered::Pps(pps / plan.threads as f64),
    };
    let live_target = rate.map(|(pps, full)| LiveTarget {
        pps,
        keep: (pps / full.generator_pps.max(1.0)).min(1.0),
    });
    let tb = &bed.tb;
    let sys = tb.sys();
    let router = tb
        .router
        .as_ref()
        .context("the veth testbed has a router")?;
    let rin = &tb.router_in.as_ref().context("router ingress")?.name;
    let sender = &tb.sender;
    let ifindex = tb.sender_if.ifindex;
    let dst = std::net::SocketAddrV4::new(tb.receiver_if.addr, SINK_PORT);
    let started = Instant::now();
    let res: Result<()> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for _ in 0..plan.threads {
            let (count, halt, cpu_micros) = (&count, &halt, &cpu_micros);
            handles.push(s.spawn(move || -> Result<()> {
                sender.enter_current_thread()?;
                if let Some(p) = plan.rt_priority {
                    links::set_fifo(0, p)?;
                }
                let cpu0 = cpu::thread_cpu_secs();
                let r = match plan.generator {
                    Generator::Xdp => {
                        loadgen::run_live(ifindex, frame_bytes, live_target, duration, halt, || {
                            Ok(ingress_total(&links::link_state(sys, router, rin)?.0))
                        })
                        .map(|runs| {
                            count.fetch_add(runs, Ordering::Relaxed);
                        })
                    }
                    Generator::Socket => {
                        let payload = ip_size - frame::IP_LEN - frame::UDP_LEN;
                        SocketGen::new(dst, payload, 64).and_then(|mut g| {
                            loadgen::pace_load(per_thread, duration, 64, halt, count, |n| g.send(n))
                        })
                    }
                };
                let used = cpu::thread_cpu_secs() - cpu0;
                cpu_micros.fetch_add((used * 1e6) as u64, Ordering::Relaxed);
                r
            }));
        }
        // Watch for Ctrl-C while the load runs.
        while handles.iter().any(|h| !h.is_finished()) {
            if stop.load(Ordering::Relaxed) != 0 {
                halt.store(true, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut first_err = None;
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(anyhow::anyhow!("a generator thread panicked"));
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    });
    res?;
    Ok(LoadRun {
        counted: count.load(Ordering::Relaxed),
        secs: started.elapsed().as_secs_f64(),
        cpu_secs: cpu_micros.load(Ordering::Relaxed) as f64 * 1e-6,
    })
}

/// A probe session over the testbed for `duration`.
pub(super) fn run_probe(
    tb: &Testbed,
    plan: &Plan,
    duration: Duration,
    csv_name: &str,
    stop: &AtomicU8,
) -> Result<Summary> {
    let cfg = ProbeConfig {
        size: 64,
        interval: plan.probe_interval,
        count: None,
        duration: Some(duration),
        tos: 0,
        port: PROBE_PORT,
        timestamps: TimestampArg::Software,
        timeout: Duration::from_millis(200),
        flow: 0,
        spin: None,
        busy_poll: false,
        no_warm_up: false,
        rt: crate::sys::rt::RtSettings {
            fifo_priority: plan.rt_priority.map(|p| p + 1),
            ..Default::default()
        },
        kernel_reflector: false,
    };
    let path = match &plan.csv_dir {
        Some(d) => d.join(csv_name),
        None => PathBuf::from("/dev/null"),
    };
    let place = probe::meta::Place::testbed("veth", &tb.id, "user");
    let label = csv_name.trim_end_matches(".csv").to_string();
    let meta = probe::meta::run_meta(&cfg, Some(label), place);
    let mut csv = CsvWriter::create(&path, &meta)?;
    let ep = Endpoints {
        sys: tb.sys(),
        sender_ns: &tb.sender,
        receiver_ns: &tb.receiver,
        sender_if: &tb.sender_if.name,
        receiver_if: &tb.receiver_if.name,
        dst_ip: tb.receiver_if.ip(crate::testbed::IpVersion::V4)?,
    };
    let o = probe::run_session(
        &probe::SessionEnds::Testbed(&ep),
        &cfg,
        &mut csv,
        stop,
        &mut crate::stats::observer::NoObserver,
    )?;
    let mut s = o.stats.summary();
    s.report.kernel_drops = Some(o.kernel_drops);
    Ok(s)
}

/// The load one step offers: the frame, its IP size, the percentage of
/// full speed and, below 100 %, the paced rate with the full-speed figures
/// it derives from.
struct Load<'a> {
    frame: &'a [u8],
    ip_size: usize,
    pct: u32,
    rate: Option<(f64, FullSpeed)>,
}

/// What one step measured while it ran.
struct StepRun {
    /// The probe session across the hop.
    probe: Summary,
    load: LoadRun,
    /// CPU times as the load ended.
    cpu_after: Vec<cpu::CpuTimes>,
    /// The router's counters, on flat-out steps with `--perf-stat`.
    perf: Option<PerfFigures>,
}

/// Runs the probe session, the load (or, at 0 %, a pause as long) and on
/// flat-out steps `perf stat`, side by side for one step.
fn probe_under_load(
    bed: &ModeBed,
    plan: &Plan,
    load: Load<'_>,
    csv_name: &str,
    stop: &AtomicU8,
) -> Result<StepRun> {
    let count_perf = plan.perf_stat && load.pct >= 100;
    let (probe, (run, cpu_after), perf) = std::thread::scope(|s| {
        let probe = s.spawn(|| run_probe(&bed.tb, plan, plan.step, csv_name, stop));
        // Counting stops a little before the load so that it covers load only.
        let perf =
            count_perf.then(|| s.spawn(|| perf::stat(&bed.napi_tids, plan.step.mul_f64(0.9))));
        let run = (|| -> Result<(LoadRun, Vec<cpu::CpuTimes>)> {
            let run = if load.pct == 0 {
                std::thread::sleep(plan.step);
                LoadRun {
                    counted: 0,
                    secs: plan.step.as_secs_f64(),
                    cpu_secs: 0.0,
                }
            } else {
                run_load(
                    bed,
                    plan,
                    load.frame,
                    load.ip_size,
                    load.rate,
                    plan.step,
                    stop,
                )?
            };
            Ok((run, cpu::sample()?))
        })();
        let probe = probe
            .join()
            .map_err(|_| anyhow::anyhow!("the probe thread panicked"))?;
        let perf = match perf {
            Some(h) => Some(
                h.join()
                    .map_err(|_| anyhow::anyhow!("the perf thread panicked"))??,
            ),
            None => None,
        };
        anyhow::Ok((probe, run?, perf))
    })?;
    Ok(StepRun {
        probe: probe.context("the probe session during the step")?,
        load: run,
        cpu_after,
        perf,
    })
}

/// One step: load (unless 0 %) and a probe session side by side. `full`
/// is None for the flat-out step.
pub(super) fn run_step(
    bed: &ModeBed,
    plan: &Plan,
    variant: Variant,
    ip_size: usize,
    load_pct: u32,
    full: Option<FullSpeed>,
    stop: &AtomicU8,
) -> Result<StepResult> {
    let frame_bytes = step_frame(bed, ip_size);
    let rate = match full {
        Some(f) if load_pct < 100 => Some((f.forwarded_pps * f64::from(load_pct) / 100.0, f)),
        _ => None,
    };
    let before = bed.snapshot()?;
    let cpu_before = cpu::sample()?;
    let mode = variant.mode;
    let label = variant_label(mode, variant.work);
    let csv_name = format!("{label}-{ip_size}B-{load_pct}pct.csv");
    let StepRun {
        probe,
        load,
        cpu_after,
        perf,
    } = probe_under_load(
        bed,
        plan,
        Load {
            frame: &frame_bytes,
            ip_size,
            pct: load_pct,
            rate,
        },
        &csv_name,
        stop,
    )?;
    // Let what is still in the rings arrive before reading the counters.
    std::thread::sleep(Duration::from_millis(100));
    let after = bed.snapshot()?;
    let cores = cpu::core_use(&cpu_before, &cpu_after);
    let rx = after.receiver.since(&before.receiver);
    let rin = after.router_in.since(&before.router_in);
    let generated = generated_packets(plan.generator, load_pct, &rin, &probe, &load);
    let xdp_counters = counters_delta(&before.xdp, &after.xdp);
    log::debug!(
        "{label} {ip_size} B {load_pct} %: generator counted {}, router in {rin:?}, receiver {rx:?}, xdp {xdp_counters:?}",
        load.counted
    );
    let forwarded = forwarded_packets(&rx, &probe, generated);
    let secs = load.secs;
    Ok(StepResult {
        mode,
        work: variant.work,
        xdp_mode_attached: bed.attached_mode(mode),
        generator: plan.generator,
        size: ip_size,
        load_pct,
        offered_pps: rate.map(|r| r.0),
        generated,
        forwarded,
        secs,
        generated_pps: cpu::rate(0, generated, secs),
        forwarded_pps: cpu::rate(0, forwarded, secs),
        drop_pct: drop_pct(generated, forwarded),
        generator_runs_pps: cpu::rate(0, load.counted, secs),
        generator_cpu_pct: 100.0 * load.cpu_secs / secs,
        router_cpu_pct: (!bed.napi_tids.is_empty())
            .then(|| 100.0 * (after.router_cpu_secs - before.router_cpu_secs) / secs),
        cores,
        probe: ProbeFigures::from_summary(&probe),
        xdp_counters,
        router_in_rx_dropped: rin.rx_dropped,
        limit: classify(load_pct, generated, forwarded),
        perf,
    })
}

/// The load's frame for one IP size: sender to sink through the router.
fn step_frame(bed: &ModeBed, ip_size: usize) -> Vec<u8> {
    frame::build(&FrameSpec {
        dst_mac: bed.router_mac,
        src_mac: bed.sender_mac,
        src: bed.tb.sender_if.addr,
        dst: bed.tb.receiver_if.addr,
        src_port: 4000,
        dst_port: SINK_PORT,
        ip_size,
    })
}

/// The load packets the generator put on the wire during the step.
fn generated_packets(
    generator: Generator,
    load_pct: u32,
    router_in: &links::LinkCounters,
    probe: &Summary,
    load: &LoadRun,
) -> u64 {
    // Probe datagrams (and their warm-up) cross the hop too; the load is the rest.
    let probe_pkts = probe.sent + 8;
    match generator {
        // Everything the XDP generator kept arrived at, or was dropped at,
        // the router's ingress ring.
        Generator::Xdp if load_pct > 0 => ingress_total(router_in).saturating_sub(probe_pkts),
        _ => load.counted,
    }
}

/// The load packets that reached the receiver (its count less the probe
/// session's), at most what was generated.
fn forwarded_packets(receiver: &links::LinkCounters, probe: &Summary, generated: u64) -> u64 {
    receiver
        .rx_packets
        .saturating_sub(probe.received + 8)
        .min(generated)
}

/// The share of the generated packets that did not arrive, in percent.
fn drop_pct(generated: u64, forwarded: u64) -> f64 {
    if generated == 0 {
        0.0
    } else {
        100.0 * generated.saturating_sub(forwarded) as f64 / generated as f64
    }
}

fn counters_delta(before: &XdpCounters, after: &XdpCounters) -> XdpCounters {
    after
        .iter()
        .map(|(k, a)| {
            let b = before.get(k).copied().unwrap_or_default();
            (
                k.clone(),
                PacketsBytes {
                    packets: a.packets.saturating_sub(b.packets),
                    bytes: a.bytes.saturating_sub(b.bytes),
                },
            )
        })
        .collect()
}
