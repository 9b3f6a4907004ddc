//! The probe session: a paced sender, one I/O thread that echoes every
//! probe at the receiver and collects TX timestamps and echoes at the
//! sender (one wake-up serves both ends: on a 2-core VM wake-ups, not
//! packets, are what a probe costs), and the calling thread matching
//! everything into records.
//!
//! ```text
//! sender ns                                 receiver ns
//!  [pacer] --probe--> (path) --> [io: reflect] --echo--> (path) --+
//!     |                          [io: errqueue TX stamps, echoes] <+
//!     | Sent (batched)                 | Arrived / TxTimestamp / Echoed (batched)
//!     +------> [collector: Matcher] <--+ -> CSV rows, RunStats
//! ```

pub mod addresses;
pub mod clock;
pub mod cmsg;
pub mod cpu_wait;
pub mod events;
pub mod kstats;
pub mod matcher;
pub mod pacer;
pub mod packet;
pub mod phc;
pub mod reflect;
pub mod remote;
pub mod socket;
pub mod stamp;
pub mod timestamps;
pub mod wake;

pub use timestamps::TimestampSource;

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering},
        mpsc,
    },
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::{
    model::{observer::SessionObserver, record::RecordSink},
    stats::RunStats,
    sys::Netns,
    testbed::Iface,
};
use events::EventBatch;
use matcher::{Event, Matcher};
use packet::{FLAG_ECHO, HEADER_LEN, Probe};
use socket::{HwTimestamping, ProbeSocket, RecvBatch, TsFlags};

/// Stop levels set by the signal handler: 1 = stop sending and wait for
/// probes in flight, 2 = finish at once.
pub const STOP_SENDING: u8 = 1;
pub const STOP_NOW: u8 = 2;

/// Marks the warm-up datagrams that resolve neighbours before the run.
const FLAG_WARMUP: u8 = 2;

impl ProbeConfig {
    /// The labels of this flow's metrics (and its HDR log's header).
    pub fn flow_labels(&self, target: &str) -> crate::export::metrics::FlowLabels {
        crate::export::metrics::FlowLabels::new(target, self.flow, self.tos, self.size)
    }
}

/// How often the collector flushes the CSV and ticks the observer (~4x/s).
pub const TICK_NS: i64 = 250_000_000;

/// Validated probe options.
#[derive(Clone)]
pub struct ProbeConfig {
    pub size: usize,
    pub interval: Duration,
    pub count: Option<u64>,
    pub duration: Option<Duration>,
    pub tos: u8,
    pub port: u16,
    pub timestamps: TimestampSource,
    pub timeout: Duration,
    pub flow: u8,
    /// The pacer sleeps until this long before a send, then spins (`--spin`);
    /// None: a margin learned from the machine's wake-up latency.
    pub spin: Option<Duration>,
    /// Spin over the whole interval instead of sleeping.
    pub busy_poll: bool,
    /// Real-time settings the sender thread applies to itself (its
    /// SCHED_FIFO priority also goes to the probe's receive threads).
    pub rt: crate::tune::rt::RtSettings,
    /// rtprobe's in-kernel reflector (XDP) answers this flow's probes at
    /// the receiver: arrivals come from the echoes' payloads.
    pub kernel_reflector: bool,
}

impl std::fmt::Debug for ProbeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeConfig")
            .field("size", &self.size)
            .field("interval", &self.interval)
            .field("count", &self.count)
            .field("duration", &self.duration)
            .field("tos", &self.tos)
            .field("port", &self.port)
            .field("timestamps", &self.timestamps)
            .field("timeout", &self.timeout)
            .field("flow", &self.flow)
            .field("spin", &self.spin)
            .field("busy_poll", &self.busy_poll)
            .field("rt", &self.rt)
            .field("kernel_reflector", &self.kernel_reflector)
            .finish()
    }
}

/// Where probes go from and to.
pub struct Endpoints<'a> {
    /// The kernel layer that reads the namespaces' drop counters.
    pub sys: &'a dyn crate::sys::Sys,
    pub sender_ns: &'a Netns,
    pub receiver_ns: &'a Netns,
    pub sender_if: &'a Iface,
    pub receiver_if: &'a Iface,
    /// The address family of the probes (`--ip`).
    pub ip: crate::testbed::IpVersion,
}

/// What the session learned besides the records.
pub struct SessionOutcome {
    pub stats: RunStats,
    pub hardware_tx: bool,
    pub hardware_rx: bool,
    pub late_arrivals: u64,
    pub interrupted: bool,
    /// Kernel counters that explain losses (receive-buffer and backlog drops).
    pub kernel_drops: serde_json::Value,
    /// Per NIC with hardware stamps: its PHC, the offset's uncertainty and
    /// drift against the system clock, or why its stamps were left out.
    pub hw_clocks: serde_json::Value,
    /// An output (CSV, HDR log...) failed during the run and stopped it,
    /// in words: "CSV ends at probe 41999: No space left on device".
    pub output_error: Option<String>,
}

/// A NIC's PTP hardware clock, sampled against CLOCK_REALTIME while the
/// session runs so its hardware stamps can be put on the system clock.
struct NicClock {
    conv: Arc<Mutex<phc::PhcConverter>>,
    sampler: Option<phc::PhcSampler>,
}

/// How often a PHC is read against the system clock: often enough that
/// interpolation over a drift of tens of ppm stays within a few ns.
const PHC_SAMPLE_PERIOD: Duration = Duration::from_millis(100);

/// Finds and samples the PHC of `ifname` (in `ns`). None, with the reason
/// in words, where the NIC has none or it cannot be read.
fn nic_clock(ns: &Netns, ifname: &str) -> Result<NicClock, String> {
    let index = ns
        .run(|| Ok(phc::phc_index(ifname)))
        .map_err(|e| format!("{e:#}"))?
        .map_err(|e| format!("{e:#}"))?
        .ok_or_else(|| {
            format!("{ifname} has no PTP hardware clock: its hardware stamps cannot be put on the system clock and are left out")
        })?;
    let clock = phc::PtpClock::open(index).map_err(|e| format!("{e:#}"))?;
    let mut conv = phc::PhcConverter::new();
    conv.set_phc_index(index);
    let conv = Arc::new(Mutex::new(conv));
    let sampler = phc::PhcSampler::spawn(clock, PHC_SAMPLE_PERIOD, conv.clone())
        .map_err(|e| format!("{e:#}"))?;
    Ok(NicClock {
        conv,
        sampler: Some(sampler),
    })
}

impl NicClock {
    /// Stops sampling; the converter's report as JSON.
    fn finish(&mut self) -> serde_json::Value {
        let sampler = self.sampler.take().map(|s| s.stop());
        let report = self.conv.lock().map(|c| c.report()).ok();
        let mut v = serde_json::to_value(report).unwrap_or_default();
        if let (serde_json::Value::Object(o), Some(Ok(st))) = (&mut v, sampler) {
            o.insert("read_errors".into(), st.errors.into());
            if let Some(e) = st.last_error {
                o.insert("last_read_error".into(), e.into());
            }
        }
        v
    }
}

/// Puts hardware stamps on the system clock with each NIC's sampled PHC.
struct PhcClocks {
    sender: Option<Arc<Mutex<phc::PhcConverter>>>,
    receiver: Option<Arc<Mutex<phc::PhcConverter>>>,
}

impl matcher::HwClocks for PhcClocks {
    fn sender(&self, raw_ns: i64) -> Option<i64> {
        self.sender.as_ref()?.lock().ok()?.to_realtime(raw_ns)
    }
    fn receiver(&self, raw_ns: i64) -> Option<i64> {
        self.receiver.as_ref()?.lock().ok()?.to_realtime(raw_ns)
    }
}

fn new_session_id() -> u64 {
    use rand::Rng;
    rand::rng().random::<u64>() | 1
}

/// Timestamping for one side: hardware if asked and the NIC can.
fn side_timestamping(
    ns: &Netns,
    ifname: &str,
    want: TimestampSource,
) -> Result<Option<HwTimestamping>> {
    if want == TimestampSource::Software {
        return Ok(None);
    }
    match ns.run(|| Ok(HwTimestamping::enable(ifname)))? {
        Ok(h) => Ok(Some(h)),
        Err(e) if want == TimestampSource::Hardware => bail!(
            "{ifname} cannot timestamp in hardware (SIOCSHWTSTAMP: {e}); use --timestamps software or auto"
        ),
        Err(e) => {
            log::info!("{ifname}: no hardware timestamping ({e}), using software timestamps");
            Ok(None)
        }
    }
}

/// Runs one probe session, streaming records to `csv`. Returns when every
/// probe is sent and accounted for, or when `stop` says so.
pub fn run_session(
    ep: &Endpoints<'_>,
    cfg: &ProbeConfig,
    csv: &mut dyn RecordSink,
    stop: &AtomicU8,
    observer: &mut dyn SessionObserver,
) -> Result<SessionOutcome> {
    if cfg.size < HEADER_LEN {
        bail!(
            "--size {} is too small: a probe needs at least {HEADER_LEN} bytes",
            cfg.size
        );
    }
    let session = new_session_id();
    let hw_tx = side_timestamping(ep.sender_ns, &ep.sender_if.name, cfg.timestamps)?;
    let hw_rx = side_timestamping(ep.receiver_ns, &ep.receiver_if.name, cfg.timestamps)?;
    let (hardware_tx, hardware_rx) = (hw_tx.is_some(), hw_rx.is_some());
    let mut sender_clock = hardware_tx.then(|| nic_clock(ep.sender_ns, &ep.sender_if.name));
    let mut receiver_clock = hardware_rx.then(|| nic_clock(ep.receiver_ns, &ep.receiver_if.name));
    for (side, c) in [("sender", &sender_clock), ("receiver", &receiver_clock)] {
        if let Some(Err(why)) = c {
            log::warn!("{side}: {why}");
        }
    }
    let clocks = PhcClocks {
        sender: sender_clock
            .as_ref()
            .and_then(|c| c.as_ref().ok())
            .map(|c| c.conv.clone()),
        receiver: receiver_clock
            .as_ref()
            .and_then(|c| c.as_ref().ok())
            .map(|c| c.conv.clone()),
    };

    // The family of the run (`--ip`): both sockets and the destination.
    let dst = SocketAddr::new(ep.receiver_if.ip(ep.ip)?, cfg.port);
    let any = SocketAddr::new(crate::testbed::unspecified(dst.ip()), cfg.port);
    let rcvbuf_bytes = socket::rcvbuf_bytes(cfg.interval, cfg.timeout);
    let tx_sock = ep.sender_ns.run(|| {
        ProbeSocket::bind(
            any,
            cfg.tos,
            TsFlags {
                tx: true,
                rx: true,
                hardware: hardware_tx,
            },
            rcvbuf_bytes,
        )
    })?;
    // The reflector timestamps its echoes too: the RTT of the path is the
    // two kernel-stamped legs, without the reflector's user-space time.
    let rx_sock = ep.receiver_ns.run(|| {
        ProbeSocket::bind(
            any,
            cfg.tos,
            TsFlags {
                tx: true,
                rx: true,
                hardware: hardware_rx,
            },
            rcvbuf_bytes,
        )
    })?;
    // Every probe goes to `dst` and every echo comes from it.
    if let Err(e) = tx_sock.connect(dst) {
        log::info!("probe socket not connected to {dst} ({e}): a route lookup per probe");
    }
    let done = AtomicBool::new(false);
    let attempts = AtomicU64::new(0);
    let (ev_tx, ev_rx) = mpsc::channel::<Vec<Event>>();
    let (tx_sock, rx_sock, done_ref, attempts_ref) = (&tx_sock, &rx_sock, &done, &attempts);
    let drops_before =
        kstats::DropSnapshot::take(ep.sys, ep.sender_ns.into(), ep.receiver_ns.into());

    let result = std::thread::scope(|s| {
        let foreign = warm_up(tx_sock, rx_sock, dst, session, cfg.size, stop)?;
        if foreign > 0 {
            // Datagrams on the probe port during the warm-up are counted too.
            let _ = ev_tx.send(vec![Event::Foreign; foreign as usize]);
        }
        // The warm-up's echoes told whether the kernel takes per-send OPT_IDs.
        let echo_stamps = rx_sock.per_send_opt_id();
        let ev = ev_tx.clone();
        // One thread serves both ends: it echoes at the receiver and, in the
        // same wake-up, collects the echo and the TX timestamp at the sender.
        let io = std::thread::Builder::new()
            .name("rtprobe-io".into())
            .spawn_scoped(s, move || {
                pacer::share_fifo_priority(&cfg.rt);
                io_loop(
                    Sides {
                        tx: tx_sock,
                        rx: rx_sock,
                        dst,
                    },
                    session,
                    cfg.kernel_reflector,
                    attempts_ref,
                    done_ref,
                    &ev,
                )
            })
            .context("spawn the probe I/O thread")?;
        let run = (|| {
            let ev = ev_tx.clone();
            let sender = std::thread::Builder::new()
                .name("rtprobe-sender".into())
                .spawn_scoped(s, move || {
                    pacer::pace(tx_sock, dst, session, cfg, stop, attempts_ref, &ev)
                })
                .context("spawn sender thread")?;
            let hw = HwSetup {
                echo_stamps,
                sender_tx: hardware_tx,
                receiver_tx: hardware_rx,
                clocks: Box::new(clocks),
            };
            collect_and_join(ev_rx, cfg, hw, csv, stop, sender, observer)
        })();
        done_ref.store(true, Ordering::SeqCst);
        let _ = io.join();
        run
    });
    drop((hw_tx, hw_rx));
    let mut hw_clocks = serde_json::Map::new();
    for (side, c) in [
        ("sender", &mut sender_clock),
        ("receiver", &mut receiver_clock),
    ] {
        match c {
            Some(Ok(c)) => {
                hw_clocks.insert(side.into(), c.finish());
            }
            Some(Err(why)) => {
                hw_clocks.insert(side.into(), serde_json::json!({ "error": why }));
            }
            None => {}
        }
    }
    let (mut stats, late_arrivals, output_error) = result?;
    let drops_after =
        kstats::DropSnapshot::take(ep.sys, ep.sender_ns.into(), ep.receiver_ns.into());
    stats.set_attempts(attempts.load(Ordering::SeqCst));
    Ok(SessionOutcome {
        stats,
        hardware_tx,
        hardware_rx,
        late_arrivals,
        // A failed output stops the session too; that is no interruption.
        interrupted: stop.load(Ordering::SeqCst) != 0 && output_error.is_none(),
        kernel_drops: drops_after.report_since(&drops_before),
        hw_clocks: serde_json::Value::Object(hw_clocks),
        output_error,
    })
}

/// Sends a few warm-up datagrams so neighbour resolution on every hop
/// happens before the run, and checks that the path works at all. It
/// echoes them itself (the I/O thread starts after it); with the in-kernel
/// reflector the kernel answers them first and the receiver's socket sees
/// nothing, which works the same: the sender waits for any echo.
fn warm_up(
    tx: &ProbeSocket,
    rx: &ProbeSocket,
    dst: SocketAddr,
    session: u64,
    size: usize,
    stop: &AtomicU8,
) -> Result<u64> {
    let mut foreign = 0u64;
    let mut buf = vec![0u8; size];
    Probe {
        session,
        seq: u64::MAX,
        flow: 0,
        echo: false,
        send_ns: 0,
        kernel_times: None,
    }
    .encode(&mut buf);
    buf[5] = FLAG_WARMUP;
    let mut batch = RecvBatch::new(8, size.max(2048));
    let deadline = clock::realtime_ns() + 3_000_000_000;
    let mut next_send = 0i64;
    let mut echo = Vec::new();
    while clock::realtime_ns() < deadline && stop.load(Ordering::SeqCst) == 0 {
        if clock::realtime_ns() >= next_send {
            tx.send_to(&buf, dst, u32::MAX - 1)
                .with_context(|| format!("send warm-up probe to {dst}"))?;
            next_send = clock::realtime_ns() + 100_000_000;
        }
        socket::poll_any(&[tx, rx], 20)?;
        // The reflector's part: echo warm-up probes of this session.
        let n = rx.recv_batch(&mut batch, false)?;
        echo.clear();
        for i in 0..n {
            let (p, _, _) = batch.get(i);
            match Probe::decode(p, session) {
                Ok(pr) if !pr.echo && p[5] & FLAG_WARMUP != 0 => {
                    p[5] |= FLAG_ECHO;
                    echo.push(i);
                }
                Ok(_) => {}
                Err(_) => foreign += 1,
            }
        }
        if !echo.is_empty() {
            let ids = vec![u32::MAX - 1; echo.len()];
            rx.send_back(&mut batch, &echo, &ids)
                .context("echo a warm-up probe")?;
            // Throw away the echoes' TX timestamps.
            while rx.recv_batch(&mut batch, true)? > 0 {}
        }
        // Throw away warm-up TX timestamps.
        while tx.recv_batch(&mut batch, true)? > 0 {}
        let mut got_echo = false;
        let n = tx.recv_batch(&mut batch, false)?;
        for i in 0..n {
            let (p, _, _) = batch.get(i);
            if Probe::decode(p, session).is_ok_and(|pr| pr.echo) && p[5] & FLAG_WARMUP != 0 {
                got_echo = true;
            }
        }
        if got_echo {
            // Let late duplicates and timestamps of the warm-up drain.
            std::thread::sleep(Duration::from_millis(20));
            loop {
                let n = rx.recv_batch(&mut batch, false)?;
                if n == 0 {
                    break;
                }
                foreign += (0..n)
                    .filter(|&i| Probe::decode(batch.get(i).0, session).is_err())
                    .count() as u64;
            }
            while rx.recv_batch(&mut batch, true)? > 0 {}
            while tx.recv_batch(&mut batch, true)? > 0 {}
            while tx.recv_batch(&mut batch, false)? > 0 {}
            return Ok(foreign);
        }
    }
    if stop.load(Ordering::SeqCst) != 0 {
        return Ok(foreign);
    }
    bail!(
        "no warm-up probe came back from {dst} within 3 s: the path through the testbed is broken (run with -v for details, check `ip netns` and XDP counters)"
    )
}

/// The reflector's reusable buffers.
struct ReflectBufs {
    batch: RecvBatch,
    errq: RecvBatch,
    /// Indexes in `batch` of the probes to echo, and their OPT_IDs.
    echo: Vec<usize>,
    ids: Vec<u32>,
    /// (seq, software RX, hardware RX) of this wake-up's probes.
    arrivals: Vec<(u64, Option<i64>, Option<i64>)>,
    /// The reflector's decisions, the same as `rtprobe reflect`'s.
    core: reflect::Core,
}

/// Receiver side of one wake-up: takes the probes queued at the receiver
/// socket, echoes them all with one sendmmsg (each echo's TX timestamp
/// carrying the probe's seq as OPT_ID), records their arrival, and collects
/// echo TX timestamps. Returns how many messages it took.
fn reflect_queued(
    rx: &ProbeSocket,
    bufs: &mut ReflectBufs,
    session: u64,
    issued: &AtomicU64,
    finishing: bool,
    out: &mut EventBatch,
) -> usize {
    let ReflectBufs {
        batch,
        errq,
        echo,
        ids,
        arrivals,
        core,
    } = bufs;
    let n = match rx.recv_batch(batch, false) {
        Ok(n) => n,
        Err(e) => {
            log::warn!("reflector receive: {e}");
            return 0;
        }
    };
    let now = clock::realtime_ns();
    // Read after the datagrams: every probe sent before them is below it.
    let sent_end = issued.load(Ordering::SeqCst);
    echo.clear();
    ids.clear();
    arrivals.clear();
    for i in 0..n {
        let (payload, src, c) = batch.get(i);
        // Read before the reply is written over it.
        let probe = Probe::decode(payload, session);
        let warmup = payload.len() > 5 && payload[5] & FLAG_WARMUP != 0;
        let verdict = core.handle(payload, src, c.sw_ns, c.ttl, now);
        match (verdict, probe) {
            (reflect::Verdict::Reply { .. }, Ok(p)) => {
                echo.push(i);
                ids.push(p.seq as u32);
                if !warmup && p.seq < sent_end {
                    arrivals.push((p.seq, c.sw_ns, c.hw_ns));
                } else if !warmup {
                    // Answered (its echo is refused at the sender too), but
                    // kept out of the matcher, whose window it would grow.
                    out.push(Event::NeverSent, now);
                }
            }
            (reflect::Verdict::Reply { .. }, Err(_)) => {
                // Another run's probe: answered, as any reflector would.
                echo.push(i);
                ids.push(u32::MAX - 2);
                out.push(Event::Foreign, now);
            }
            (reflect::Verdict::Drop(_), Ok(_)) => {}
            (reflect::Verdict::Drop(_), Err(_)) => out.push(Event::Foreign, now),
        }
    }
    let echo_send_ns = (!echo.is_empty()).then(clock::realtime_ns);
    if !echo.is_empty()
        && let Err(e) = rx.send_back(batch, echo, ids)
    {
        log::debug!("echo of {} probes failed: {e}", echo.len());
    }
    for &(seq, sw_ns, hw_ns) in arrivals.iter() {
        out.push(
            Event::Arrived {
                seq,
                sw_ns,
                hw_ns,
                user_ns: now,
                echo_send_ns,
            },
            now,
        );
    }
    // On veth the echoes' TX stamps are queued by now; elsewhere they are
    // picked up after a later echo, or when the run ends. Each echo queues
    // two stamps (SCHED and the driver's): drain the queue to empty, else
    // it grows past the receive buffer and the kernel drops stamps.
    let mut n_err = 0;
    if !echo.is_empty() || finishing {
        loop {
            let got = rx.recv_batch(errq, true).unwrap_or(0);
            if rx.per_send_opt_id() {
                for i in 0..got {
                    let (_, _, c) = errq.get(i);
                    if let Some((opt_id, kind, ts_ns)) = c.tx_stamp() {
                        out.push(
                            Event::EchoTx {
                                opt_id,
                                kind,
                                ts_ns,
                            },
                            now,
                        );
                    }
                }
            }
            n_err += got;
            if got < errq.capacity() {
                break;
            }
        }
    }
    n + n_err
}

/// Sender side of one wake-up: TX timestamps from the error queue and
/// echoes. Returns how many messages it took.
fn drain_sender(
    sides: &Sides<'_>,
    batch: &mut RecvBatch,
    errq: &mut RecvBatch,
    session: u64,
    issued: &AtomicU64,
    out: &mut EventBatch,
) -> usize {
    let tx = sides.tx;
    let now = clock::realtime_ns();
    let n_err = tx.recv_batch(errq, true).unwrap_or(0);
    for i in 0..n_err {
        let (_, _, c) = errq.get(i);
        if let Some((opt_id, kind, ts_ns)) = c.tx_stamp() {
            out.push(
                Event::TxTimestamp {
                    opt_id,
                    kind,
                    ts_ns,
                },
                now,
            );
        }
    }
    let n = tx.recv_batch(batch, false).unwrap_or(0);
    let read_ns = clock::realtime_ns();
    let sent_end = issued.load(Ordering::SeqCst);
    for i in 0..n {
        let (payload, src, c) = batch.get(i);
        if !socket::same_endpoint(src, sides.dst) {
            out.push(Event::Foreign, now);
            continue;
        }
        match Probe::decode(payload, session) {
            Ok(p) if p.echo && payload[5] & FLAG_WARMUP == 0 && p.seq >= sent_end => {
                out.push(Event::NeverSent, now)
            }
            Ok(p) if p.echo && payload[5] & FLAG_WARMUP == 0 => out.push(
                Event::Echoed {
                    seq: p.seq,
                    sw_ns: c.sw_ns,
                    hw_ns: c.hw_ns,
                    user_ns: read_ns,
                    reflector: p.kernel_times,
                },
                now,
            ),
            Ok(_) => {}
            Err(_) => out.push(Event::Foreign, now),
        }
    }
    n + n_err
}

/// The I/O thread: waits for probes at the receiver, reflects them, drains
/// the sender's queues (both the error queue and data on every wake-up; a
/// TX timestamp left queued is charged to the receive buffer), and hands
/// events over in batches.
/// The testbed's two sockets and where the probes go.
struct Sides<'a> {
    tx: &'a ProbeSocket,
    rx: &'a ProbeSocket,
    dst: SocketAddr,
}

fn io_loop(
    sides: Sides<'_>,
    session: u64,
    kernel_reflector: bool,
    issued: &AtomicU64,
    done: &AtomicBool,
    ev: &mpsc::Sender<Vec<Event>>,
) {
    let rx = sides.rx;
    let mut reflect = ReflectBufs {
        batch: RecvBatch::new(64, 65536),
        errq: RecvBatch::new(64, 256),
        echo: Vec::with_capacity(64),
        ids: Vec::with_capacity(64),
        arrivals: Vec::with_capacity(64),
        // No rate limit: the testbed's own probes may come at any rate.
        core: reflect::Core::new(reflect::Policy {
            protocol: crate::spec::remote::ProtocolArg::Rtprobe,
            key: None,
            rate_limit_pps: 0,
            stateful: true,
        }),
    };
    let mut sbatch = RecvBatch::new(64, 65536);
    let mut errq = RecvBatch::new(64, 256);
    let mut out = EventBatch::new();
    loop {
        let finishing = done.load(Ordering::Relaxed);
        let wait = if finishing {
            0
        } else {
            out.wait_ms(clock::realtime_ns(), 20)
        };
        // Only the receiver's socket is waited on. A thread sleeping on the
        // sender's socket would be woken (a cross-core IPI, costly on a VM)
        // for every TX timestamp, inside the probe's own send path, which
        // would show in the one-way delay. With nobody waiting there, the
        // kernel only queues; the timestamp and (on veth, synchronously
        // during the echo's send) the echo are collected right after the
        // echo goes out, or at the next wake-up at the latest.
        // With the in-kernel reflector nothing arrives at the receiver's
        // socket, and waiting on the sender's would put a wake-up into
        // every probe's send path (above). The echoes' RX stamps are the
        // kernel's whenever they are read, so they are collected every
        // millisecond (the receive buffer, at least 32 MiB, holds far more).
        let wait = if kernel_reflector { wait.min(1) } else { wait };
        let polled: &[&ProbeSocket] = &[rx];
        if let Err(e) = socket::poll_any(polled, wait) {
            log::warn!("probe I/O poll: {e}");
            out.flush(ev);
            return;
        }
        let mut got = 0;
        loop {
            let n = reflect_queued(rx, &mut reflect, session, issued, finishing, &mut out)
                + drain_sender(&sides, &mut sbatch, &mut errq, session, issued, &mut out);
            got += n;
            if n == 0 || out.len() >= events::MAX_LEN {
                break;
            }
        }
        if (finishing || out.due(clock::realtime_ns())) && !out.flush(ev) {
            return;
        }
        if finishing && got == 0 {
            out.flush(ev);
            return;
        }
    }
}

/// Hardware timestamping of a session, as the matcher needs it.
struct HwSetup {
    /// The reflector stamps its echoes (per-send OPT_IDs work here).
    echo_stamps: bool,
    /// The sender's NIC stamps TX in hardware: wait for those stamps.
    sender_tx: bool,
    /// The receiver's NIC stamps the echoes' TX in hardware.
    receiver_tx: bool,
    /// Puts the NICs' PHC stamps on the system clock.
    clocks: Box<dyn matcher::HwClocks>,
}

/// The per-probe state of a session between the event sources and the
/// outputs: the matcher, the run's statistics, the CSV and the observer
/// (interval histograms, HDR log, metrics). `run_session` feeds it the
/// sockets' events; anything else that produces [`Event`]s (e.g. the
/// continuous-run memory bench) drives the same code. Times are the
/// events' clock (CLOCK_REALTIME ns), passed in by the caller.
pub struct Collector {
    stats: RunStats,
    m: Matcher,
    timeout_ns: i64,
    last_flush: i64,
    /// A failed output (disk full, file removed) ends the run the way a
    /// first Ctrl-C does: no more sends, probes in flight still counted.
    output_error: Option<String>,
    csv_ok: bool,
}

impl Collector {
    /// `expect`: the stamps a record waits for; `clocks` puts hardware
    /// stamps on the system clock; `now_ns` starts the flush clock.
    pub fn new(
        cfg: &ProbeConfig,
        expect: matcher::Expect,
        clocks: Box<dyn matcher::HwClocks>,
        now_ns: i64,
    ) -> Self {
        let m = Matcher::new(
            cfg.size as u32,
            cfg.flow,
            cfg.timeout.as_nanos() as i64,
            expect,
        )
        .with_hw_clocks(clocks)
        .with_kernel_reflector(cfg.kernel_reflector);
        Self {
            stats: RunStats::with_interval(cfg.interval.as_nanos() as i64),
            m,
            timeout_ns: cfg.timeout.as_nanos() as i64,
            last_flush: now_ns,
            output_error: None,
            csv_ok: true,
        }
    }

    /// Feeds events in arrival order.
    pub fn on_events(&mut self, evs: impl IntoIterator<Item = Event>) {
        for e in evs {
            self.m.on_event(e, &mut self.stats);
        }
    }

    /// Probes in flight (not yet finalized).
    pub fn in_flight(&self) -> usize {
        self.m.in_flight()
    }

    /// The run's statistics so far.
    pub fn stats(&self) -> &RunStats {
        &self.stats
    }

    /// Probes that arrived after they had been given up as lost.
    pub fn late_arrivals(&self) -> u64 {
        self.m.late_arrivals()
    }

    /// The first output that failed, if one did.
    pub fn output_error(&self) -> Option<&str> {
        self.output_error.as_deref()
    }

    fn fail(&mut self, why: String, stop: &AtomicU8) {
        log::warn!("{why}: stopping the run");
        self.output_error.get_or_insert(why);
        stop.fetch_max(STOP_SENDING, Ordering::SeqCst);
    }

    /// Finalizes what is complete or timed out at `now_ns` (everything
    /// with `flush_all`) into the statistics, the observer and the CSV;
    /// then, about every [`TICK_NS`], flushes the CSV and ticks the observer.
    pub fn drain(
        &mut self,
        now_ns: i64,
        flush_all: bool,
        csv: &mut dyn RecordSink,
        observer: &mut dyn SessionObserver,
        stop: &AtomicU8,
    ) {
        let mut write_err: Option<anyhow::Error> = None;
        let (stats, csv_ok) = (&mut self.stats, self.csv_ok);
        self.m.drain(now_ns, flush_all, |r| {
            stats.on_record(&r);
            observer.on_record(&r);
            if csv_ok
                && write_err.is_none()
                && let Err(e) = csv.write(&r)
            {
                write_err = Some(e);
            }
        });
        if let Some(e) = write_err.take() {
            self.csv_ok = false;
            self.fail(format!("{e:#}"), stop);
        }
        if now_ns - self.last_flush > TICK_NS {
            if self.csv_ok
                && let Err(e) = csv.flush()
            {
                self.csv_ok = false;
                self.fail(format!("{e:#}"), stop);
            }
            self.last_flush = now_ns;
            self.stats.set_unmatched(self.m.unmatched());
            if let Err(e) = observer.on_tick(&self.stats, false) {
                self.fail(e, stop);
            }
        }
    }

    /// Flushes the CSV and ticks the observer a last time: the run's
    /// statistics, its late arrivals and the first output that failed.
    pub fn finish(
        mut self,
        csv: &mut dyn RecordSink,
        observer: &mut dyn SessionObserver,
        stop: &AtomicU8,
    ) -> (RunStats, u64, Option<String>) {
        if self.csv_ok
            && let Err(e) = csv.flush()
        {
            self.fail(format!("{e:#}"), stop);
        }
        self.stats.set_unmatched(self.m.unmatched());
        if let Err(e) = observer.on_tick(&self.stats, true) {
            self.fail(e, stop);
        }
        if self.m.hw_unconverted() > 0 {
            log::warn!(
                "{} hardware timestamps could not be put on the system clock and were left out",
                self.m.hw_unconverted()
            );
        }
        (self.stats, self.m.late_arrivals(), self.output_error)
    }
}

/// Collects until the sender has finished (stopping it if collecting
/// fails), joins it and puts its pacing figures into the statistics:
/// the run's statistics, late arrivals and the output that failed.
fn collect_and_join(
    ev_rx: mpsc::Receiver<Vec<Event>>,
    cfg: &ProbeConfig,
    hw: HwSetup,
    csv: &mut dyn RecordSink,
    stop: &AtomicU8,
    sender: std::thread::ScopedJoinHandle<'_, Result<crate::stats::Pacing>>,
    observer: &mut dyn SessionObserver,
) -> Result<(RunStats, u64, Option<String>)> {
    let out = collect(
        ev_rx,
        cfg,
        hw,
        csv,
        stop,
        &|| sender.is_finished(),
        observer,
    );
    if out.is_err() {
        stop.fetch_max(STOP_NOW, Ordering::SeqCst);
    }
    let pacing = sender
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the sender thread panicked")))?;
    out.map(|(mut stats, late, failed)| {
        stats.set_pacing(pacing);
        (stats, late, failed)
    })
}

fn collect(
    ev_rx: mpsc::Receiver<Vec<Event>>,
    cfg: &ProbeConfig,
    hw: HwSetup,
    csv: &mut dyn RecordSink,
    stop: &AtomicU8,
    sender_finished: &dyn Fn() -> bool,
    observer: &mut dyn SessionObserver,
) -> Result<(RunStats, u64, Option<String>)> {
    let expect = matcher::Expect {
        tx: true,
        tx_hw: hw.sender_tx,
        echo_tx: hw.echo_stamps && !cfg.kernel_reflector,
        echo_tx_hw: hw.echo_stamps && hw.receiver_tx && !cfg.kernel_reflector,
    };
    let mut c = Collector::new(cfg, expect, hw.clocks, clock::realtime_ns());
    let mut sender_done_at: Option<i64> = None;
    loop {
        // Looked at before taking events: once it is true every event of
        // the sender is already in the channel, so none can be missed below.
        let sender_done = sender_finished();
        match ev_rx.recv_timeout(Duration::from_millis(20)) {
            Ok(evs) => {
                c.on_events(evs);
                // Take whatever else is queued before draining.
                while let Ok(evs) = ev_rx.try_recv() {
                    c.on_events(evs);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {}
        }
        let now = clock::realtime_ns();
        if sender_done_at.is_none() && sender_done {
            sender_done_at = Some(now);
        }
        let finish_now = stop.load(Ordering::SeqCst) >= STOP_NOW
            || sender_done_at.is_some_and(|t| now - t > c.timeout_ns + 50_000_000);
        if finish_now {
            // The sender may still be stopping (it looks at `stop` at least
            // every 100 ms); its last events must not be lost.
            let give_up = std::time::Instant::now() + Duration::from_secs(2);
            while !sender_finished() && std::time::Instant::now() < give_up {
                std::thread::sleep(Duration::from_millis(1));
            }
            while let Ok(evs) = ev_rx.try_recv() {
                c.on_events(evs);
            }
        }
        c.drain(now, finish_now, csv, observer, stop);
        if finish_now || (sender_done_at.is_some() && c.in_flight() == 0) {
            break;
        }
    }
    Ok(c.finish(csv, observer, stop))
}
