//! `rtprobe bench-forward`: how many packets per second the router hop of
//! the veth testbed forwards, with kernel forwarding and with rtprobe's XDP
//! router in each mode, what it costs in CPU per core, and what the probe
//! latency does at the same time as the load rises.
//!
//! For every mode a fresh testbed is built; GRO is switched on on the
//! router's ingress veth and on the receiver's veth (a veth only takes
//! redirected XDP frames when it runs NAPI, and this keeps the receive
//! path the same in every mode), and the ingress NAPI runs in a kernel
//! thread of its own (threaded NAPI) so the scheduler can put the router
//! on another core than the generator. Then for every packet size the
//! generator runs flat out once (the 100 % step, which calibrates the
//! others), and each lower step offers that percentage of what the hop
//! forwarded flat out, while a probe session measures RTT and one-way
//! delay across the hop: latency as the load approaches the hop's capacity.
//!
//! Where the numbers come from: generated = what the generator handed to
//! the kernel; forwarded = packets received on the receiver's veth
//! (rtnetlink IFLA_STATS64) minus the probes; CPU per core = /proc/stat.
//! Kernel interfaces: those of `loadgen`, `links`, `cpu`, `testbed`, `ebpf`.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::{
    cpu::{self, CoreUse},
    frame::{self, FrameSpec},
    kinds::{ForwardMode, Generator, Sink},
    links::{self, LinkCounters},
    loadgen::{self, LiveTarget, Offered, SocketGen},
    perf::{self, PerfFigures, opt},
    xdp::{BenchProgram, Hook},
};
pub use crate::spec::bench_forward::{Plan, Variant};
use crate::{
    ebpf::{XdpAction as XdpActionArg, XdpMode as XdpModeArg},
    export::CsvWriter,
    probe::{self, Endpoints, ProbeConfig, STOP_NOW, TimestampSource as TimestampArg},
    stats::{Summary, XdpCounters, summary::PacketsBytes},
    sys::{Offload, SysRef},
    testbed::Testbed,
};

/// Port the load is sent to (discard): no socket listens there, so the
/// receiver drops it right after the UDP lookup.
const SINK_PORT: u16 = 9;
const PROBE_PORT: u16 = 5061;

/// What stopped the forwarded rate from going higher in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    /// The hop dropped part of what it was offered: it was the bottleneck.
    Router,
    /// Flat out and nothing dropped: the generator could not offer more.
    Generator,
    /// A paced step the hop carried in full: no limit reached.
    None,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Router => "router",
            Limit::Generator => "generator",
            Limit::None => "-",
        }
    }
}

/// Drops above this share of what was generated mean the hop is the limit
/// (below it: packets still in flight when the counters were read, and
/// the odd neighbour-resolution drop).
pub const ROUTER_LIMIT_DROP_PCT: f64 = 1.0;

/// Names the limit of a step from what was generated and forwarded. Pure.
pub fn classify(load_pct: u32, generated: u64, forwarded: u64) -> Limit {
    if generated == 0 {
        return Limit::None;
    }
    let drop_pct = 100.0 * generated.saturating_sub(forwarded) as f64 / generated as f64;
    if drop_pct > ROUTER_LIMIT_DROP_PCT {
        Limit::Router
    } else if load_pct >= 100 {
        Limit::Generator
    } else {
        Limit::None
    }
}

/// Probe figures of one step.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProbeFigures {
    pub sent: u64,
    pub lost: u64,
    pub rtt_p50_ns: Option<u64>,
    pub rtt_p99_ns: Option<u64>,
    /// RTT of the path without the reflector's user-space turnaround.
    pub rtt_net_p50_ns: Option<u64>,
    pub rtt_net_p99_ns: Option<u64>,
    pub one_way_p50_ns: Option<u64>,
    pub one_way_p99_ns: Option<u64>,
}

impl ProbeFigures {
    fn from_summary(s: &Summary) -> Self {
        Self {
            sent: s.sent,
            lost: s.lost,
            rtt_p50_ns: s.rtt_ns.p50,
            rtt_p99_ns: s.rtt_ns.p99,
            rtt_net_p50_ns: s.rtt_net_ns.p50,
            rtt_net_p99_ns: s.rtt_net_ns.p99,
            one_way_p50_ns: s.one_way_ns.p50,
            one_way_p99_ns: s.one_way_ns.p99,
        }
    }
}

/// One measured step.
#[derive(Debug, Clone, Serialize)]
pub struct StepResult {
    pub mode: ForwardMode,
    /// Memory accesses per packet of the router's work variant (None: the router itself).
    pub work: Option<u32>,
    pub xdp_mode_attached: String,
    pub generator: Generator,
    pub size: usize,
    pub load_pct: u32,
    pub offered_pps: Option<f64>,
    pub generated: u64,
    pub forwarded: u64,
    pub secs: f64,
    pub generated_pps: f64,
    pub forwarded_pps: f64,
    pub drop_pct: f64,
    /// XDP generator: program runs per second (it keeps a share); socket: datagrams sent.
    pub generator_runs_pps: f64,
    /// CPU the generator threads used, in percent of one core.
    pub generator_cpu_pct: f64,
    /// CPU the router's NAPI thread used, in percent of one core (threaded NAPI only;
    /// the receiver's softirq work is not in it).
    pub router_cpu_pct: Option<f64>,
    pub cores: Vec<CoreUse>,
    pub probe: ProbeFigures,
    /// Router XDP counters during the step (empty without XDP).
    pub xdp_counters: XdpCounters,
    /// Interface counters during the step, for finding where drops happened.
    pub router_in_rx_dropped: u64,
    pub limit: Limit,
    /// `perf stat` of the router's threads (flat-out steps with --perf-stat).
    pub perf: Option<PerfFigures>,
}

/// Everything `bench-forward` measured, with the machine it ran on.
#[derive(Debug, Clone, Serialize)]
pub struct ForwardReport {
    pub machine: Machine,
    /// Ids of the testbeds built (one per mode); all removed at the end.
    pub testbed_ids: Vec<String>,
    pub sink: Sink,
    pub threaded_napi: bool,
    pub rt_priority: Option<u8>,
    pub steps: Vec<StepResult>,
    /// The bounce device's steps (--bounce), per hook and queue count.
    pub bounce: Vec<super::bounce::BounceStep>,
    /// Why the perf figures are missing, when they are.
    pub perf_note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub kernel: String,
    /// 1-minute load average when the bench started: other work on the
    /// machine shares the cores with the router under test.
    pub loadavg_at_start: f64,
}

impl Machine {
    pub fn describe() -> Self {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let loadavg_at_start = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(0.0);
        Self {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            kernel,
            loadavg_at_start,
        }
    }
}

fn xdp_of(m: ForwardMode) -> (XdpModeArg, XdpActionArg) {
    match m {
        ForwardMode::Off => (XdpModeArg::Off, XdpActionArg::Redirect),
        ForwardMode::Skb => (XdpModeArg::Skb, XdpActionArg::Redirect),
        ForwardMode::Native => (XdpModeArg::Native, XdpActionArg::Redirect),
        ForwardMode::SkbPass => (XdpModeArg::Skb, XdpActionArg::Pass),
        ForwardMode::NativePass => (XdpModeArg::Native, XdpActionArg::Pass),
    }
}

/// The label of a variant: the mode's, with `+wN` for the work variant.
pub fn variant_label(mode: ForwardMode, work: Option<u32>) -> String {
    match work {
        Some(w) => format!("{}+w{w}", mode_label(mode)),
        None => mode_label(mode).to_string(),
    }
}

pub fn mode_label(m: ForwardMode) -> &'static str {
    match m {
        ForwardMode::Off => "kernel",
        ForwardMode::Skb => "xdp-skb",
        ForwardMode::Native => "xdp-native",
        ForwardMode::SkbPass => "xdp-skb-pass",
        ForwardMode::NativePass => "xdp-native-pass",
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

/// The interfaces whose counters a step reads.
struct Snapshot {
    router_in: LinkCounters,
    receiver: LinkCounters,
    xdp: XdpCounters,
    /// CPU seconds of the router's NAPI threads.
    router_cpu_secs: f64,
}

/// One mode's testbed and what the steps need to know about it.
struct ModeBed {
    /// Dropped first: detaches from an interface that still exists.
    _sink: Option<super::sink::Sink>,
    /// The router's work variant, attached instead of the router.
    work: Option<(BenchProgram, u32)>,
    tb: Testbed,
    xdp: crate::ebpf::XdpSetup,
    /// The router's NAPI kernel threads (threaded NAPI only).
    napi_tids: Vec<i32>,
    router_mac: [u8; 6],
    sender_mac: [u8; 6],
}

impl ModeBed {
    /// The XDP mode `mode`'s program runs in: the work router's as
    /// attached for the mode, else what the kernel reports.
    fn attached_mode(&self, mode: ForwardMode) -> String {
        match &self.work {
            Some(_) if mode == ForwardMode::Skb => "skb".into(),
            Some(_) => "native".into(),
            None => self.xdp.attached_mode_name(),
        }
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let router = self
            .tb
            .router
            .as_ref()
            .context("the veth testbed has a router")?;
        let rin = self.tb.router_in.as_ref().context("router ingress")?;
        Ok(Snapshot {
            router_in: links::link_state(self.tb.sys(), router, &rin.name)?.0,
            receiver: links::link_state(
                self.tb.sys(),
                &self.tb.receiver,
                &self.tb.receiver_if.name,
            )?
            .0,
            xdp: match &self.work {
                Some((prog, _)) => prog.router_counters()?,
                None => self.xdp.counters()?,
            },
            router_cpu_secs: self
                .napi_tids
                .iter()
                .filter_map(|&t| cpu::task_cpu_secs(t))
                .sum(),
        })
    }
}

/// Frames that reached the router's ingress ring, taken or dropped.
fn ingress_total(c: &LinkCounters) -> u64 {
    c.rx_packets + c.rx_dropped
}

/// What the flat-out step of a size found; the paced steps are fractions of it.
#[derive(Debug, Clone, Copy)]
struct FullSpeed {
    /// What the generator itself did per second (XDP: program runs).
    generator_pps: f64,
    /// What the hop forwarded per second.
    forwarded_pps: f64,
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
fn run_probe(
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
        rt: crate::tune::rt::RtSettings {
            fifo_priority: plan.rt_priority.map(|p| p + 1),
            ..Default::default()
        },
        kernel_reflector: false,
    };
    let path = match &plan.csv_dir {
        Some(d) => d.join(csv_name),
        None => PathBuf::from("/dev/null"),
    };
    let place = probe::meta::Place {
        testbed: "veth".into(),
        testbed_id: tb.id.clone(),
        reflector: "user".into(),
        ..Default::default()
    };
    let label = csv_name.trim_end_matches(".csv").to_string();
    let meta = probe::meta::run_meta(&cfg, Some(label), place);
    let mut csv = CsvWriter::create(&path, &meta)?;
    let ep = Endpoints {
        sys: tb.sys(),
        sender_ns: &tb.sender,
        receiver_ns: &tb.receiver,
        sender_if: &tb.sender_if,
        receiver_if: &tb.receiver_if,
        ip: crate::testbed::IpVersion::V4,
    };
    let o = probe::run_session(
        &probe::SessionEnds::Testbed(&ep),
        &cfg,
        &mut csv,
        stop,
        &mut crate::model::observer::NoObserver,
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
fn run_step(
    bed: &ModeBed,
    plan: &Plan,
    variant: Variant,
    ip_size: usize,
    load_pct: u32,
    full: Option<FullSpeed>,
    stop: &AtomicU8,
) -> Result<StepResult> {
    let frame_bytes = frame::build(&FrameSpec {
        dst_mac: bed.router_mac,
        src_mac: bed.sender_mac,
        src: bed.tb.sender_if.addr,
        dst: bed.tb.receiver_if.addr,
        src_port: 4000,
        dst_port: SINK_PORT,
        ip_size,
    });
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
    // Probe datagrams (and their warm-up) cross the hop too; the load is the rest.
    let probe_pkts = probe.sent + 8;
    let generated = match plan.generator {
        // Everything the XDP generator kept arrived at, or was dropped at,
        // the router's ingress ring.
        Generator::Xdp if load_pct > 0 => ingress_total(&rin).saturating_sub(probe_pkts),
        _ => load.counted,
    };
    let xdp_counters = counters_delta(&before.xdp, &after.xdp);
    log::debug!(
        "{label} {ip_size} B {load_pct} %: generator counted {}, router in {rin:?}, receiver {rx:?}, xdp {xdp_counters:?}",
        load.counted
    );
    let forwarded = rx
        .rx_packets
        .saturating_sub(probe.received + 8)
        .min(generated);
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
        drop_pct: if generated == 0 {
            0.0
        } else {
            100.0 * generated.saturating_sub(forwarded) as f64 / generated as f64
        },
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

/// Builds the testbed for one mode and prepares the receive paths.
fn testbed_for(sys: SysRef, variant: Variant, plan: &Plan) -> Result<ModeBed> {
    let mode = variant.mode;
    let tb = Testbed::veth(sys)?;
    let router = tb
        .router
        .as_ref()
        .context("the veth testbed has a router")?;
    let rin = tb
        .router_in
        .as_ref()
        .context("router ingress")?
        .name
        .clone();
    links::set_gro(tb.sys(), router, &rin, true)?;
    links::set_gro(tb.sys(), &tb.receiver, &tb.receiver_if.name, true)?;
    let mut napi_tids = Vec::new();
    if plan.threaded_napi {
        let before = links::napi_threads(&rin);
        links::set_threaded_napi(tb.sys(), router, &rin, true)?;
        // Ours are the ones that were not there before (other testbeds
        // may have a veth of the same name).
        napi_tids = links::napi_threads(&rin)
            .into_iter()
            .filter(|t| !before.contains(t))
            .collect();
        if let Some(p) = plan.rt_priority {
            for &tid in &napi_tids {
                links::set_fifo(tid, p)?;
            }
        }
    }
    let (m, a) = xdp_of(mode);
    let (xdp, work) = match variant.work {
        None => (crate::ebpf::attach_for_testbed(&tb, m, a)?, None),
        Some(n) => (
            crate::ebpf::attach_for_testbed(&tb, XdpModeArg::Off, a)?,
            Some((attach_work_router(&tb, mode, n)?, n)),
        ),
    };
    let sink = match plan.sink {
        Sink::Stack => None,
        Sink::Xdp => {
            // Probes cross a native XDP program now: local UDP must leave
            // with a full checksum (the testbed goes away with the mode).
            tb.sys()
                .set_offload(
                    (&tb.sender).into(),
                    &tb.sender_if.name,
                    Offload::TxCsum,
                    false,
                )
                .context("TX checksum offload off on the sender (for the XDP sink)")?;
            Some(super::sink::Sink::attach(
                tb.sys_ref(),
                &tb.receiver,
                &tb.receiver_if.name,
                SINK_PORT,
            )?)
        }
    };
    let router_mac = links::link_state(tb.sys(), router, &rin)?.1;
    let sender_mac = links::link_state(tb.sys(), &tb.sender, &tb.sender_if.name)?.1;
    Ok(ModeBed {
        _sink: sink,
        work,
        tb,
        xdp,
        napi_tids,
        router_mac,
        sender_mac,
    })
}

/// Attaches the router's work variant (`n` memory accesses per packet) to
/// both router interfaces, where `attach_for_testbed` puts the router, and
/// prepares the end veths as `attach_for_testbed` does for native mode:
/// GRO on (frames redirected into a veth need NAPI on its peer) and TX
/// checksum offload off (local UDP through native XDP needs full
/// checksums). The testbed goes away with the variant, so nothing is put back.
fn attach_work_router(tb: &Testbed, mode: ForwardMode, n: u32) -> Result<BenchProgram> {
    let router = tb
        .router
        .as_ref()
        .context("the veth testbed has a router")?;
    let rin = &tb.router_in.as_ref().context("router ingress")?.name;
    let rout = &tb.router_out.as_ref().context("router egress")?.name;
    let hook = if mode == ForwardMode::Skb {
        Hook::Skb
    } else {
        Hook::Native
    };
    for (ns, ifname) in [
        (&tb.sender, &tb.sender_if.name),
        (&tb.receiver, &tb.receiver_if.name),
    ] {
        links::set_gro(tb.sys(), ns, ifname, true)?;
        tb.sys()
            .set_offload(ns.into(), ifname, Offload::TxCsum, false)
            .with_context(|| format!("TX checksum offload off on {ifname} (for native XDP)"))?;
    }
    let mut prog = BenchProgram::router_work(n)?;
    for ifname in [rin, rout] {
        prog.add_egress(tb.sys(), router, ifname)?;
        prog.attach(tb.sys_ref(), router, ifname, hook)?;
    }
    Ok(prog)
}

fn check_stop(stop: &AtomicU8) -> Result<()> {
    if stop.load(Ordering::SeqCst) != 0 {
        bail!("interrupted; the testbed was removed");
    }
    Ok(())
}

/// Runs the whole plan. `progress` gets each step as it finishes.
pub fn run(
    plan: &Plan,
    sys: SysRef,
    stop: &AtomicU8,
    mut progress: impl FnMut(&StepResult),
    mut bounce_progress: impl FnMut(&super::bounce::BounceStep),
) -> Result<ForwardReport> {
    crate::testbed::require_root()?;
    let machine = Machine::describe();
    let mut steps = Vec::new();
    let mut testbed_ids = Vec::new();
    for &variant in &plan.variants {
        check_stop(stop)?;
        let bed = testbed_for(sys.clone(), variant, plan).with_context(|| {
            format!(
                "preparing the testbed for {}",
                variant_label(variant.mode, variant.work)
            )
        })?;
        testbed_ids.push(bed.tb.id.clone());
        // Resolve neighbours on every hop before any load.
        run_probe(&bed.tb, plan, Duration::from_millis(50), "prime.csv", stop)?;
        for &size in &plan.sizes {
            // Flat out first: it calibrates the paced steps.
            let flat_out = run_step(&bed, plan, variant, size, 100, None, stop)?;
            let full = FullSpeed {
                generator_pps: flat_out.generator_runs_pps,
                forwarded_pps: flat_out.forwarded_pps,
            };
            let mut results = Vec::new();
            for &load in plan.loads.iter().filter(|&&l| l < 100) {
                check_stop(stop)?;
                let r = run_step(&bed, plan, variant, size, load, Some(full), stop)?;
                progress(&r);
                results.push(r);
            }
            if plan.loads.contains(&100) {
                progress(&flat_out);
                results.push(flat_out);
            }
            steps.extend(results);
        }
        let ModeBed {
            _sink,
            work,
            tb,
            xdp,
            ..
        } = bed;
        drop(_sink);
        drop(work);
        xdp.detach().context("detach the XDP router")?;
        tb.teardown()?;
    }
    let mut bounce = Vec::new();
    if !plan.bounce.is_empty() {
        bounce = super::bounce::run(plan, &sys, stop, &mut bounce_progress)?;
    }
    if stop.load(Ordering::SeqCst) >= STOP_NOW {
        bail!("interrupted");
    }
    let perf_note = plan.perf_stat.then(|| perf_note(&steps, &bounce)).flatten();
    Ok(ForwardReport {
        machine,
        testbed_ids,
        sink: plan.sink,
        threaded_napi: plan.threaded_napi,
        rt_priority: plan.rt_priority,
        steps,
        bounce,
        perf_note,
    })
}

/// Why IPC and the miss rates are missing, if they are: perf is not
/// there, or it counted no hardware event (a VM without a virtual PMU).
fn perf_note(steps: &[StepResult], bounce: &[super::bounce::BounceStep]) -> Option<String> {
    if let Err(why) = perf::available() {
        return Some(format!("perf stat skipped: {why}"));
    }
    let counted: Vec<&PerfFigures> = steps
        .iter()
        .filter_map(|s| s.perf.as_ref())
        .chain(bounce.iter().filter_map(|b| b.perf.as_ref()))
        .collect();
    if !counted.is_empty() && counted.iter().all(|p| !p.has_hardware_counters()) {
        return Some(
            "perf stat ran, but this machine counts no hardware event (cycles, instructions, \
             branches, L1 misses show <not supported>: no PMU in this VM), so IPC and the \
             miss rates are unknown; only task-clock was counted"
                .into(),
        );
    }
    None
}

fn us(ns: Option<u64>) -> String {
    ns.map_or("-".into(), |v| format!("{:.1}", v as f64 / 1000.0))
}

/// One table row per step. Pure.
pub fn format_step(r: &StepResult) -> String {
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

pub fn table_header() -> String {
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
pub fn format_report(r: &ForwardReport) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
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
    let _ = writeln!(o, "{}", table_header());
    for s in &r.steps {
        let _ = writeln!(o, "{}", format_step(s));
    }
    // Full-speed forwarding relative to the kernel, per size.
    let mut best: BTreeMap<(usize, String), f64> = BTreeMap::new();
    for s in r.steps.iter().filter(|s| s.load_pct >= 100) {
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
    let _ = writeln!(
        o,
        "  sizes are IP packet bytes; gen% / rtr%: CPU of the generator threads / the router's NAPI thread (percent of one core);\n  \
         core busy/si%: per core from /proc/stat, everything on the machine (si = softirq: the receiver's veth);\n  \
         1way: the probe's one-way delay across the hop in µs (kernel timestamps; RTTs are in the JSON);\n  \
         limit: router = the hop dropped > {ROUTER_LIMIT_DROP_PCT} % of what it was offered, generator = flat out and nothing dropped"
    );
    if r.steps.iter().any(|s| s.work.is_some()) {
        let _ = writeln!(
            o,
            "  +wN: the router's work variant, N memory accesses per packet before forwarding"
        );
    }
    let perf_rows: Vec<&StepResult> = r.steps.iter().filter(|s| s.perf.is_some()).collect();
    if !perf_rows.is_empty() {
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
    if !r.bounce.is_empty() {
        o.push('\n');
        o.push_str(&super::bounce::format_table(&r.bounce, r.machine.cpus));
    }
    if let Some(n) = &r.perf_note {
        let _ = writeln!(o, "  {n}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_classification() {
        assert_eq!(classify(100, 1_000_000, 1_000_000), Limit::Generator);
        assert_eq!(classify(100, 1_000_000, 995_000), Limit::Generator);
        assert_eq!(classify(100, 1_000_000, 900_000), Limit::Router);
        assert_eq!(classify(50, 500_000, 400_000), Limit::Router);
        assert_eq!(classify(50, 500_000, 500_000), Limit::None);
        assert_eq!(classify(0, 0, 0), Limit::None);
    }

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
