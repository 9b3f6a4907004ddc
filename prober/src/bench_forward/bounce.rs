//! `bench-forward --bounce`: the XDP thesis's baseline set-up. A generator
//! namespace and a device-under-test namespace joined by one veth pair
//! whose DUT end has N RX/TX queues (`numrxqueues`/`numtxqueues`), each
//! polled by its own threaded-NAPI kernel thread. The DUT runs
//! `bench_bounce` (swap the MACs, XDP_TX: every frame goes back out where
//! it came in) in generic or native XDP; the generator end runs the sink,
//! which counts and drops what comes back. The load is XDP live frames
//! from one generator thread per CPU. `afxdp` instead runs `bench_xsk`
//! (native XDP) on the DUT, which hands every frame to an AF_XDP socket of
//! its queue, and a user-space thread per queue bounces it ([`super::afxdp`]).
//!
//! Queue spreading on veth: a frame redirected into a veth lands on the
//! peer's receive queue `smp_processor_id() % real_num_rx_queues`
//! (`veth_xdp_xmit`), so the generator threads are pinned one per CPU and
//! a machine with C CPUs feeds at most C queues. The report says how many
//! queues did work.
//!
//! Kernel interfaces, through [`crate::sys`]: a veth pair with queue
//! counts (RTM_NEWLINK with IFLA_NUM_TX_QUEUES/IFLA_NUM_RX_QUEUES), threaded
//! NAPI (/sys/class/net/DEV/threaded, 5.12), SIOCETHTOOL (GRO), those of
//! [`super::xdp`] and `sched_setaffinity(2)` (through [`crate::sys::rt`]).
//! Minimum kernel: 5.18.

use std::{
    net::Ipv4Addr,
    sync::atomic::{AtomicBool, AtomicU8, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::{
    afxdp,
    cpu::{self, CoreUse},
    frame::{self, FrameSpec},
    kinds::BounceHook,
    links,
    loadgen::next_repeat,
    perf::{self, PerfFigures, opt},
    plan::Plan,
    xdp::{BenchProgram, Hook},
};
use crate::{
    sys::{Netns, Ns, Sys, SysRef},
    testbed::NS_PREFIX,
};

const LOAD_PORT: u16 = 9;
/// Packet size of the bounce steps (the thesis's smallest, where the
/// per-packet cost shows most).
pub(crate) const BOUNCE_IP_SIZE: usize = 64;

/// One flat-out step of the bounce device.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BounceStep {
    pub(crate) hook: BounceHook,
    /// RX/TX queues of the DUT's veth.
    pub(crate) queues: u32,
    /// Queues whose NAPI thread used more than 5 % of a core.
    pub(crate) queues_busy: u32,
    pub(crate) size: usize,
    pub(crate) secs: f64,
    /// Frames the generator sent, the DUT bounced, and came back.
    pub(crate) generated: u64,
    pub(crate) bounced: u64,
    pub(crate) returned: u64,
    /// afxdp only: frames `bench_xsk` redirected to the sockets (those a
    /// full socket RX ring could not take were dropped and are counted
    /// here too); `bounced` is what user space sent back of them.
    pub(crate) to_sockets: Option<u64>,
    pub(crate) generated_pps: f64,
    pub(crate) bounced_pps: f64,
    /// CPU of the DUT's NAPI threads (and, for afxdp, its forwarding
    /// threads) together, in percent of one core.
    pub(crate) dut_cpu_pct: f64,
    /// The same per queue, in queue order.
    pub(crate) dut_cpu_pct_per_queue: Vec<f64>,
    /// Bounced packets per second per core the DUT used (bounced_pps /
    /// (dut_cpu_pct / 100)).
    pub(crate) bounced_pps_per_core: Option<f64>,
    pub(crate) cores: Vec<CoreUse>,
    pub(crate) perf: Option<PerfFigures>,
}

/// A namespace the bench made through the kernel layer; deleted on drop.
struct OwnedNs<'s> {
    sys: &'s dyn Sys,
    name: String,
}

impl<'s> OwnedNs<'s> {
    fn create(sys: &'s dyn Sys, name: String) -> Result<Self> {
        sys.create_netns(&name)?;
        Ok(Self { sys, name })
    }
}

impl Drop for OwnedNs<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.sys.delete_netns(&self.name) {
            log::warn!("could not delete network namespace {}: {e:#}", self.name);
        }
    }
}

/// The two namespaces and the veth between them; removed on drop (the
/// veth goes with its namespaces).
struct BounceBed<'s> {
    gen_ns: Netns,
    dut_ns: Netns,
    gen_if: String,
    dut_if: String,
    gen_ifindex: u32,
    dut_ifindex: u32,
    gen_mac: [u8; 6],
    dut_mac: [u8; 6],
    /// DUT NAPI threads, one per queue, in queue order.
    napi_tids: Vec<i32>,
    /// Deleted when the bed drops (fields drop in order: last).
    _owned: [OwnedNs<'s>; 2],
}

impl<'s> BounceBed<'s> {
    fn build(sys: &'s dyn Sys, queues: u32, seq: usize) -> Result<Self> {
        let pid = std::process::id();
        let owned = [
            OwnedNs::create(sys, format!("{NS_PREFIX}bounce-{pid}-{seq}-gen"))?,
            OwnedNs::create(sys, format!("{NS_PREFIX}bounce-{pid}-{seq}-dut"))?,
        ];
        let gen_ns = sys.open_netns(&owned[0].name)?;
        let dut_ns = sys.open_netns(&owned[1].name)?;
        // Interface names: 15 bytes at most, unique on the machine (the
        // NAPI threads are named after them).
        let tag = format!("{:x}{seq}", pid % 0xffff);
        let (gen_if, dut_if) = (format!("xbg{tag}"), format!("xbd{tag}"));
        let (g, d) = (Ns::Named(gen_ns.name()), Ns::Named(dut_ns.name()));
        sys.add_veth_queues(g, &gen_if, &dut_if, queues)?;
        sys.move_link(g, &dut_if, d)?;
        sys.set_up(g, &gen_if, true)?;
        sys.set_up(d, &dut_if, true)?;
        // NAPI on the DUT end (GRO, as on the router's ingress), so frames
        // redirected into the pair are taken in every hook, and one
        // kernel thread per queue.
        links::set_gro(sys, &dut_ns, &dut_if, true)?;
        let before = links::napi_threads(&dut_if);
        links::set_threaded_napi(sys, &dut_ns, &dut_if, true)?;
        let mut napi_tids: Vec<i32> = links::napi_threads(&dut_if)
            .into_iter()
            .filter(|t| !before.contains(t))
            .collect();
        // Queue order is NAPI id order (`napi/DEV-ID`), not thread id order.
        napi_tids.sort_by_key(|&t| napi_id(t));
        let gen_mac = links::link_state(sys, &gen_ns, &gen_if)?.1;
        let dut_mac = links::link_state(sys, &dut_ns, &dut_if)?.1;
        let ifindex = |ns, dev: &str, what: &str| -> Result<u32> {
            Ok(sys
                .link(ns, dev)?
                .with_context(|| format!("{what} interface {dev} not found"))?
                .index)
        };
        let gen_ifindex = ifindex(g, &gen_if, "generator")?;
        let dut_ifindex = ifindex(d, &dut_if, "DUT")?;
        Ok(Self {
            dut_ifindex,
            gen_ns,
            dut_ns,
            gen_if,
            dut_if,
            gen_ifindex,
            gen_mac,
            dut_mac,
            napi_tids,
            _owned: owned,
        })
    }
}

/// The NAPI id in a threaded-NAPI thread's name (`napi/DEV-ID`).
fn napi_id(tid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{tid}/comm"))
        .ok()
        .and_then(|c| c.trim_end().rsplit('-').next()?.parse().ok())
        .unwrap_or(u64::MAX)
}

/// What runs on the bed besides the generator: the sink on the
/// generator's end, the DUT's program and, for afxdp, its forwarding
/// threads. Dropped in this order (the forwarders before the program that
/// feeds them).
struct Dut {
    xsk: Option<afxdp::Forwarders>,
    prog: BenchProgram,
    sink: BenchProgram,
}

impl Dut {
    /// Attaches the sink and the DUT's program for `hook`, starts the
    /// AF_XDP forwarders for afxdp, and gives the DUT's threads their
    /// real-time priority.
    fn start(
        plan: &Plan,
        sys: &SysRef,
        hook: BounceHook,
        queues: u32,
        bed: &BounceBed,
    ) -> Result<Self> {
        let mut sink = BenchProgram::sink(LOAD_PORT)?;
        sink.attach(sys.clone(), &bed.gen_ns, &bed.gen_if, Hook::Native)?;
        let (mut prog, dut_hook) = match hook {
            BounceHook::Skb => (BenchProgram::bounce(0)?, Hook::Skb),
            BounceHook::Native => (BenchProgram::bounce(0)?, Hook::Native),
            BounceHook::Afxdp => (BenchProgram::xsk()?, Hook::Native),
        };
        prog.attach(sys.clone(), &bed.dut_ns, &bed.dut_if, dut_hook)?;
        // The DUT's threads one above the generator, as if it had its own
        // cores: they take the CPU whenever frames wait.
        let dut_prio = plan.rt_priority.map(|p| p.saturating_add(1).min(99));
        let xsk = match hook {
            BounceHook::Afxdp => Some(afxdp::Forwarders::start(
                bed.dut_ns.path(),
                bed.dut_ifindex,
                queues,
                dut_prio,
                |q, fd| prog.set_xsk(q, fd),
            )?),
            _ => None,
        };
        if let Some(p) = dut_prio {
            for &tid in &bed.napi_tids {
                links::set_fifo(tid, p)?;
            }
        }
        Ok(Self { xsk, prog, sink })
    }
}

/// Per queue: its NAPI thread and, for afxdp, its forwarding thread; the
/// DUT's cost is their CPU time.
struct QueueThreads(Vec<(i32, Option<i32>)>);

impl QueueThreads {
    fn new(napi_tids: &[i32], xsk: Option<&afxdp::Forwarders>) -> Self {
        Self(
            napi_tids
                .iter()
                .enumerate()
                .map(|(q, &t)| (t, xsk.and_then(|x| x.tids.get(q)).copied()))
                .collect(),
        )
    }

    fn all_tids(&self) -> Vec<i32> {
        self.0
            .iter()
            .flat_map(|&(n, x)| std::iter::once(n).chain(x))
            .collect()
    }

    /// CPU seconds used so far, per queue.
    fn cpu_secs(&self) -> Vec<f64> {
        self.0
            .iter()
            .map(|&(napi, xsk)| {
                cpu::task_cpu_secs(napi).unwrap_or(0.0)
                    + xsk.map_or(0.0, |t| cpu::own_thread_cpu_secs(t).unwrap_or(0.0))
            })
            .collect()
    }
}

/// One generator thread: pinned to `cpu` in the generator's namespace,
/// it sends live frames until the step's time is up or `halt` is set,
/// sizing each batch to what is left.
fn generate_on(
    plan: &Plan,
    generator: &BenchProgram,
    frame: &[u8],
    gen_ns: &Netns,
    cpu: usize,
    halt: &AtomicBool,
    started: Instant,
) -> Result<()> {
    gen_ns.enter_current_thread()?;
    crate::sys::rt::pin_to_cpu(cpu)
        .with_context(|| format!("pin a generator thread to CPU {cpu}"))?;
    if let Some(p) = plan.rt_priority {
        links::set_fifo(0, p)?;
    }
    let mut repeat: u32 = 1 << 14;
    while !halt.load(Ordering::Relaxed) {
        let left = plan.step.saturating_sub(started.elapsed()).as_secs_f64();
        if left <= 0.0 {
            break;
        }
        let t0 = Instant::now();
        generator.run_live(frame, repeat)?;
        let secs = t0.elapsed().as_secs_f64().max(1e-6);
        repeat = next_repeat(f64::from(repeat) / secs, left - secs, 0.1);
    }
    Ok(())
}

/// Runs a generator on every CPU (and `perf stat` on `perf_tids` if the
/// plan asks) until the step ends or `stop` is raised.
fn generate_flat_out(
    plan: &Plan,
    generator: &BenchProgram,
    frame: &[u8],
    gen_ns: &Netns,
    perf_tids: &[i32],
    stop: &AtomicU8,
    started: Instant,
) -> Result<Option<PerfFigures>> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let halt = AtomicBool::new(false);
    std::thread::scope(|s| -> Result<Option<PerfFigures>> {
        let mut gens = Vec::new();
        for c in 0..cpus {
            let halt = &halt;
            gens.push(
                s.spawn(move || generate_on(plan, generator, frame, gen_ns, c, halt, started)),
            );
        }
        let perf = plan
            .perf_stat
            .then(|| s.spawn(|| perf::stat(perf_tids, plan.step.mul_f64(0.9))));
        while gens.iter().any(|h| !h.is_finished()) {
            if stop.load(Ordering::Relaxed) != 0 {
                halt.store(true, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for g in gens {
            g.join()
                .map_err(|_| anyhow::anyhow!("a generator thread panicked"))??;
        }
        match perf {
            Some(h) => {
                Ok(Some(h.join().map_err(|_| {
                    anyhow::anyhow!("the perf thread panicked")
                })??))
            }
            None => Ok(None),
        }
    })
}

/// One flat-out step: the generator on every CPU for `plan.step`.
fn step(
    plan: &Plan,
    sys: &SysRef,
    hook: BounceHook,
    queues: u32,
    seq: usize,
    stop: &AtomicU8,
) -> Result<BounceStep> {
    let bed = BounceBed::build(sys.as_ref(), queues, seq)?;
    let dut = Dut::start(plan, sys, hook, queues, &bed)?;
    let frame = frame::build(&FrameSpec {
        dst_mac: bed.dut_mac,
        src_mac: bed.gen_mac,
        src: Ipv4Addr::new(10, 99, 0, 1),
        dst: Ipv4Addr::new(10, 99, 0, 2),
        src_port: 4000,
        dst_port: LOAD_PORT,
        ip_size: BOUNCE_IP_SIZE,
    });
    let generator = BenchProgram::loadgen(bed.gen_ifindex, &frame, 1.0)?;

    let threads = QueueThreads::new(&bed.napi_tids, dut.xsk.as_ref());
    let napi_before = threads.cpu_secs();
    let cores_before = cpu::sample()?;
    let started = Instant::now();
    let perf = generate_flat_out(
        plan,
        &generator,
        &frame,
        &bed.gen_ns,
        &threads.all_tids(),
        stop,
        started,
    )?;
    let secs = started.elapsed().as_secs_f64();
    let cores_after = cpu::sample()?;
    let per_queue: Vec<f64> = threads
        .cpu_secs()
        .iter()
        .zip(&napi_before)
        .map(|(a, b)| 100.0 * (a - b).max(0.0) / secs)
        .collect();
    // Let the rings drain before reading the counters.
    std::thread::sleep(Duration::from_millis(100));
    let generated = generator.handled()?;
    let Dut { xsk, prog, sink } = dut;
    let (bounced, to_sockets) = match xsk {
        Some(x) => (x.stop()?, Some(prog.handled()?)),
        None => (prog.handled()?, None),
    };
    let returned = sink.handled()?;
    drop((generator, prog, sink));
    drop(bed);
    let dut_cpu_pct: f64 = per_queue.iter().sum();
    let bounced_pps = bounced as f64 / secs;
    Ok(BounceStep {
        hook,
        queues,
        queues_busy: per_queue.iter().filter(|&&c| c > 5.0).count() as u32,
        size: BOUNCE_IP_SIZE,
        secs,
        generated,
        bounced,
        returned,
        to_sockets,
        generated_pps: generated as f64 / secs,
        bounced_pps,
        dut_cpu_pct,
        dut_cpu_pct_per_queue: per_queue,
        bounced_pps_per_core: (dut_cpu_pct > 1.0).then(|| bounced_pps / (dut_cpu_pct / 100.0)),
        cores: cpu::core_use(&cores_before, &cores_after),
        perf,
    })
}

/// Every hook at every queue count.
pub(crate) fn run(
    plan: &Plan,
    sys: &SysRef,
    stop: &AtomicU8,
    progress: &mut impl FnMut(&BounceStep),
) -> Result<Vec<BounceStep>> {
    let mut out = Vec::new();
    let mut seq = 0;
    for &hook in &plan.bounce {
        for &queues in &plan.queues {
            if stop.load(Ordering::SeqCst) != 0 {
                bail!("interrupted; the bounce namespaces were removed");
            }
            seq += 1;
            let r = step(plan, sys, hook, queues, seq, stop)
                .with_context(|| format!("bounce step {hook} with {queues} queue(s)"))?;
            progress(&r);
            out.push(r);
        }
    }
    Ok(out)
}

pub(crate) fn table_header() -> String {
    format!(
        "{:<14}{:>7}{:>6}{:>11}{:>11}{:>11}{:>8}  {:<24}{:>12}  {}",
        "bounce hook",
        "queues",
        "busy",
        "gen/s",
        "bounced/s",
        "back/s",
        "dut%",
        "dut% per queue",
        "bounced/s/core",
        "core busy/si%"
    )
}

/// The name of a bounce hook in the table. Pure.
pub(crate) fn hook_label(h: BounceHook) -> &'static str {
    match h {
        BounceHook::Skb => "xdp-skb",
        BounceHook::Native => "xdp-native",
        BounceHook::Afxdp => "af_xdp",
    }
}

/// One table row. Pure.
pub(crate) fn format_step(b: &BounceStep) -> String {
    let per_q: Vec<String> = b
        .dut_cpu_pct_per_queue
        .iter()
        .map(|c| format!("{c:.0}"))
        .collect();
    let cores: Vec<String> = b
        .cores
        .iter()
        .map(|c| format!("{:>3.0}/{:<3.0}", c.busy_pct, c.softirq_pct))
        .collect();
    format!(
        "{:<14}{:>7}{:>6}{:>11.0}{:>11.0}{:>11.0}{:>8.0}  {:<24}{:>12}  {}",
        hook_label(b.hook),
        b.queues,
        b.queues_busy,
        b.generated_pps,
        b.bounced_pps,
        b.returned as f64 / b.secs,
        b.dut_cpu_pct,
        per_q.join("/"),
        opt(b.bounced_pps_per_core, 0),
        cores.join(" "),
    )
}

/// The table with what it says about queue scaling. Pure.
pub(crate) fn format_table(steps: &[BounceStep], cpus: usize) -> String {
    use std::fmt::Write as _;
    let mut o = format!(
        "bounce (MACs swapped; XDP_TX, or AF_XDP sockets in user space), {} B, generator on every CPU:\n{}\n",
        BOUNCE_IP_SIZE,
        table_header()
    );
    for b in steps {
        let _ = writeln!(o, "{}", format_step(b));
    }
    let mut hooks: Vec<BounceHook> = steps.iter().map(|b| b.hook).collect();
    hooks.dedup();
    for h in hooks {
        let rows: Vec<&BounceStep> = steps.iter().filter(|b| b.hook == h).collect();
        let busy_max = rows.iter().map(|b| b.queues_busy).max().unwrap_or(0);
        if let Some(best) = best_queue_count(&rows) {
            let _ = writeln!(
                o,
                "  {}: within 5 % of the most bounced/s from {best} queue(s) on; at most {busy_max} \
                 queue(s) ever did work: a veth feeds queue CPU % queues and this machine has {cpus} \
                 CPU(s), so queues beyond {cpus} cannot help",
                hook_label(h)
            );
        }
    }
    let best = |h: BounceHook| {
        let rows: Vec<&BounceStep> = steps.iter().filter(|b| b.hook == h).collect();
        best_queue_count(&rows)
    };
    if let (Some(a), Some(n)) = (best(BounceHook::Afxdp), best(BounceHook::Native)) {
        let _ = writeln!(
            o,
            "  AF_XDP's best queue count ({a}) {} native XDP_TX's ({n})",
            if a == n {
                "is the same as"
            } else {
                "differs from"
            }
        );
    }
    let _ = writeln!(
        o,
        "  busy: queues whose NAPI thread used > 5 % of a core; dut%: the DUT's NAPI threads in percent of one core;\n  \
         bounced/s/core: bounced per second per core the DUT used"
    );
    if steps.iter().any(|b| b.hook == BounceHook::Afxdp) {
        let _ = writeln!(
            o,
            "  af_xdp: bench_xsk (native XDP) redirects each frame to its queue's AF_XDP socket (copy mode); a\n  \
             pinned user-space thread per queue swaps the MACs and sends it back; dut% adds those threads"
        );
    }
    o
}

/// The smallest queue count within 5 % of the best bounced rate: where
/// adding queues stops helping. Pure.
pub(crate) fn best_queue_count(rows: &[&BounceStep]) -> Option<u32> {
    let top = rows.iter().map(|b| b.bounced_pps).fold(0.0, f64::max);
    if top <= 0.0 {
        return None;
    }
    rows.iter()
        .filter(|b| b.bounced_pps >= 0.95 * top)
        .map(|b| b.queues)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(queues: u32, pps: f64) -> BounceStep {
        BounceStep {
            hook: BounceHook::Native,
            queues,
            queues_busy: queues.min(2),
            size: 64,
            secs: 1.0,
            generated: pps as u64,
            bounced: pps as u64,
            returned: pps as u64,
            to_sockets: None,
            generated_pps: pps,
            bounced_pps: pps,
            dut_cpu_pct: 90.0,
            dut_cpu_pct_per_queue: vec![45.0, 45.0],
            bounced_pps_per_core: Some(pps / 0.9),
            cores: Vec::new(),
            perf: None,
        }
    }

    #[test]
    fn queue_count_where_scaling_stops() {
        let rows = [row(1, 1.0e6), row(2, 1.6e6), row(4, 1.58e6), row(8, 1.55e6)];
        let refs: Vec<&BounceStep> = rows.iter().collect();
        assert_eq!(best_queue_count(&refs), Some(2));
        assert_eq!(best_queue_count(&[]), None);
        let t = format_table(&rows, 2);
        assert!(t.contains("most bounced/s from 2 queue(s) on"), "{t}");
        assert!(t.contains("at most 2 queue(s) ever did work"), "{t}");
        assert!(t.contains("45/45"), "{t}");
        assert!(!t.contains("af_xdp"), "{t}");
    }

    #[test]
    fn afxdp_rows_next_to_xdp_tx() {
        let mut rows = vec![row(1, 2.0e6), row(2, 2.05e6)];
        for (q, pps) in [(1, 0.5e6), (2, 0.8e6)] {
            let mut r = row(q, pps);
            r.hook = BounceHook::Afxdp;
            r.to_sockets = Some(pps as u64 * 2);
            rows.push(r);
        }
        let t = format_table(&rows, 2);
        assert!(t.contains("\naf_xdp "), "{t}");
        assert!(
            t.contains("af_xdp: within 5 % of the most bounced/s from 2 queue(s)"),
            "{t}"
        );
        assert!(
            t.contains("AF_XDP's best queue count (2) differs from native XDP_TX's (1)"),
            "{t}"
        );
    }
}

/// The bounce device's set-up against the recording fake: no root.
#[cfg(test)]
mod fake_tests {
    use super::*;
    use crate::sys::{
        Offload,
        fake::{Call, FakeSys},
    };

    const SEQ: usize = 3;

    /// The namespaces and interfaces `BounceBed::build` names for `SEQ`.
    fn names() -> (String, String, String, String) {
        let pid = std::process::id();
        let tag = format!("{:x}{SEQ}", pid % 0xffff);
        (
            format!("{NS_PREFIX}bounce-{pid}-{SEQ}-gen"),
            format!("{NS_PREFIX}bounce-{pid}-{SEQ}-dut"),
            format!("xbg{tag}"),
            format!("xbd{tag}"),
        )
    }

    /// A fake kernel with the sysfs files the bed reads and writes.
    fn kernel() -> FakeSys {
        let f = FakeSys::new();
        let (g, d, gi, di) = names();
        for (ns, dev, mac) in [
            (&g, &gi, "02:00:00:00:00:01"),
            (&d, &di, "02:00:00:00:00:02"),
        ] {
            let ns = Ns::Named(ns);
            for c in ["rx_packets", "tx_packets", "rx_dropped", "tx_dropped"] {
                f.with_file(ns, &format!("sysfs:class/net/{dev}/statistics/{c}"), "0");
            }
            f.with_file(ns, &format!("sysfs:class/net/{dev}/address"), mac);
        }
        f.with_file(
            Ns::Named(&d),
            &format!("sysfs:class/net/{di}/threaded"),
            "0",
        );
        f
    }

    #[test]
    fn the_bed_is_built_and_removed_through_the_kernel_layer() {
        let f = kernel();
        let (g, d, gi, di) = names();
        {
            let bed = BounceBed::build(&f, 4, SEQ).unwrap();
            assert_eq!(bed.dut_mac, [2, 0, 0, 0, 0, 2]);
            assert_eq!(bed.gen_ns.name(), g);
            assert_eq!(
                (bed.gen_ifindex, bed.dut_ifindex),
                (
                    f.link_state(Ns::Named(&g), &gi).unwrap().index,
                    f.link_state(Ns::Named(&d), &di).unwrap().index
                )
            );
        }
        assert_eq!(
            f.changes(),
            vec![
                Call::CreateNetns(g.clone()),
                Call::CreateNetns(d.clone()),
                Call::AddVethQueues(g.clone(), gi.clone(), di.clone(), 4),
                Call::MoveLink(g.clone(), di.clone(), d.clone()),
                Call::SetUp(g.clone(), gi.clone(), true),
                Call::SetUp(d.clone(), di.clone(), true),
                Call::SetOffload(d.clone(), di.clone(), Offload::Gro, true),
                Call::SysfsWrite(d.clone(), format!("class/net/{di}/threaded"), "1".into()),
                Call::DeleteNetns(g),
                Call::DeleteNetns(d),
            ]
        );
    }

    #[test]
    fn a_failed_step_still_removes_both_namespaces() {
        let f = kernel();
        let (g, d, ..) = names();
        f.fail_when(|c| matches!(c, Call::SysfsWrite(_, p, _) if p.ends_with("/threaded")));
        let e = match BounceBed::build(&f, 1, SEQ) {
            Err(e) => e,
            Ok(_) => panic!("threaded NAPI was refused"),
        };
        assert!(format!("{e:#}").contains("Linux >= 5.12"), "{e:#}");
        let deleted: Vec<Call> = f
            .changes()
            .into_iter()
            .filter(|c| matches!(c, Call::DeleteNetns(_)))
            .collect();
        assert_eq!(deleted, vec![Call::DeleteNetns(g), Call::DeleteNetns(d)]);
        assert!(f.netns_list().is_empty());
    }
}
