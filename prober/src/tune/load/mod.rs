//! Competing load built into rtprobe (no iperf): bulk TCP flows and a
//! constant-bit-rate UDP flow from the sender namespace to the receiver
//! namespace, across the same path and the same bottleneck queue as the
//! probes.
//!
//! Written as (CLI `--load`, repeatable; TOML `load = [...]`):
//!
//! ```text
//! tcp[:SHARE|RATE][,cc=cubic|bbr|reno|...][,flows=N][,port=P]
//! udp:SHARE|RATE[,size=BYTES][,port=P]
//! fetch[:SIZE][,every=D][,cc=NAME][,timeout=D][,port=P]
//! ```
//!
//! TCP: `tcp` / `tcp:100%` is an unpaced bulk transfer that fills the link
//! the way the study's iperf did (its congestion control decides the rate
//! and the queue it builds). Below 100 % (`tcp:50%`) or at an absolute
//! rate (`tcp:50mbit`) each socket is paced with SO_MAX_PACING_RATE (TCP's
//! internal pacing, no fq needed since Linux 4.13) at its part of the
//! rate; `flows=N` opens N connections sharing it. The share is of the link
//! rate: the shaping rate, or the speed of a physical bottleneck NIC.
//! `cc=` sets TCP_CONGESTION per flow; a congestion control the kernel
//! lacks is an error naming the ones it has.
//!
//! UDP: datagrams of `size` bytes of payload (default 1470, the lab's
//! iperf) sent on an absolute schedule at SHARE x link rate or RATE of
//! payload bits, like iperf's `-b`. Each datagram carries a magic, the
//! flow's session and a sequence number; the sender itself opens and
//! closes the measuring window by sequence number (`acct`), so sent,
//! received, loss, offered and achieved rate all count the same datagrams,
//! whatever was still queued at the mark or at the stop. The loss is
//! reported next to the loss the link must cause (`shaping`).
//! The UDP socket's send buffer is raised (SO_SNDBUFFORCE) above what the
//! bottleneck queue can hold: otherwise a sender behind its own qdisc
//! blocks instead of being dropped and would see no loss at all. The UDP
//! sender thread runs SCHED_FIFO (priority 1) where allowed, so that a busy
//! CPU does not hold it back long enough for the link to idle.
//!
//! Fetch: the study's "web page fetched repeatedly" (bufferbloat, study
//! §5). A client in the receiver namespace opens a new TCP connection to a
//! page server in the sender namespace, asks for SIZE bytes (default
//! 100 KiB; KB = KiB as everywhere in rtprobe), reads them, closes, waits
//! `every` (default 1 s) and fetches again. The server sits with the bulk
//! flow's sender (the study's h1 served the page and ran iperf), so the
//! page's data crosses the same bottleneck queue as the bulk flow and the
//! probes. A fetch's time runs from the connect call to the last byte
//! read: handshake, request, slow start, every queued RTT. `cc=` is the
//! page server's congestion control (the data sender's; default: the
//! kernel's). A fetch not done within `timeout` (default 30 s) is a
//! failure. Only fetches started after the warm-up count.
//!
//! TCP: the sender's bytes acknowledged (TCP_INFO `tcpi_bytes_acked`) and
//! the receiver's bytes read are both taken at the mark and at the stop;
//! the achieved rate is the acknowledged one.
//!
//! Sockets are created by threads inside the namespaces (receiver side in
//! the receiver namespace, sender side in the sender namespace) and then
//! served by plain threads: a socket belongs to the namespace it was made
//! in. Every thread checks a stop flag at least every 100 ms; the number of
//! flows is bounded.
//!
//! Kernel interface: TCP/UDP sockets, TCP_CONGESTION (Linux >= 2.6.13),
//! TCP_INFO with tcpi_bytes_acked (>= 4.1; older kernels report no
//! acknowledged bytes), SO_MAX_PACING_RATE (>= 3.13, TCP internal pacing >= 4.13),
//! SO_SNDBUFFORCE/SO_RCVBUFFORCE (CAP_NET_ADMIN), sched_setscheduler
//! (CAP_SYS_NICE) for the UDP sender, SO_TIMESTAMPNS (>= 2.6.22)
//! and SO_RXQ_OVFL (>= 2.6.33) on the UDP receiver, and
//! /proc/sys/net/ipv4/tcp_available_congestion_control.
//!
//! Layout: `spec` parses the `--load` entries; `tcp`, `udp` and `fetch`
//! start each kind's threads; `acct` counts the measuring window; `outcome`
//! holds what `stop()` returns. This file starts and stops the whole load.

mod acct;
mod fetch;
mod outcome;
mod spec;
mod tcp;
mod udp;

use std::{
    net::Ipv4Addr,
    os::fd::{AsRawFd, OwnedFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

pub(crate) use self::{
    acct::FetchTimes,
    outcome::{FlowReport, LoadReport, QueueWindow},
    spec::{LoadSpec, MAX_FETCH_SIZE, available_cc, check_cc},
};
use self::{
    acct::{FetchStats, SeqWindow},
    fetch::{FetchParams, FetchWindow, start_fetch},
    tcp::{start_tcp, tcp_bytes_acked},
    udp::start_udp,
};
use super::{
    amounts::{LoadRate, Rate},
    shaping::Shaping,
};
use crate::sys::Netns;

/// First port of the load flows (iperf's).
pub(crate) const DEFAULT_LOAD_PORT: u16 = 5201;
/// Upper bound of TCP connections + UDP flows in one run.
pub(crate) const MAX_FLOWS: u32 = 32;
/// How often every load thread looks at its stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Counters a flow's threads share.
struct Counters {
    rx_bytes: AtomicU64,
    rx_packets: AtomicU64,
    tx_packets: AtomicU64,
    connected: AtomicBool,
    /// UDP: set by mark(); the sender opens a window at its next datagram.
    mark_requested: AtomicBool,
    /// UDP: first sequence number of the window, published by the sender
    /// before it sends that datagram (u64::MAX: no window yet).
    window_lo: AtomicU64,
    /// UDP: the sender's side of the window.
    sent_window: Mutex<SentWindow>,
    /// UDP: the receiver's side, left here when its thread ends.
    received_window: Mutex<Option<SeqWindow>>,
    /// UDP: datagrams the receiver's socket dropped (buffer full) since
    /// the window's first arrival, from SO_RXQ_OVFL.
    socket_drops: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            rx_bytes: AtomicU64::new(0),
            rx_packets: AtomicU64::new(0),
            tx_packets: AtomicU64::new(0),
            connected: AtomicBool::new(false),
            mark_requested: AtomicBool::new(false),
            window_lo: AtomicU64::new(u64::MAX),
            sent_window: Mutex::new(SentWindow::default()),
            received_window: Mutex::new(None),
            socket_drops: AtomicU64::new(0),
        }
    }
}

/// The UDP sender's window: `[lo, hi)` and when its first and last
/// datagrams went out.
#[derive(Debug, Clone, Copy, Default)]
struct SentWindow {
    lo: u64,
    hi: u64,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    /// Furthest a datagram of the window went out behind its due time.
    max_lag: Duration,
    /// The sender ran SCHED_FIFO for the whole window.
    fifo: bool,
}

struct Flow {
    kind: &'static str,
    spec: String,
    port: u16,
    cc: Option<String>,
    target_bps: Option<u64>,
    udp_size: u32,
    counters: Arc<Counters>,
    sender: Option<JoinHandle<Result<()>>>,
    receiver: Option<JoinHandle<Result<()>>>,
    /// rx_bytes at mark().
    mark_bytes: u64,
    /// TCP: the sender socket (a duplicate descriptor) to read TCP_INFO from.
    tcp_info_fd: Option<OwnedFd>,
    /// TCP: bytes acknowledged at mark().
    mark_acked: Option<u64>,
    /// Fetch: the window's completion times and the page size.
    fetch: Option<(Arc<Mutex<FetchWindow>>, u64)>,
}

/// Joins a load flow's `role` thread ("sender", "receiver"), keeping the
/// first error.
fn join_flow_thread(
    h: Option<JoinHandle<Result<()>>>,
    role: &str,
    first_err: &mut Option<anyhow::Error>,
) {
    let Some(h) = h else {
        return;
    };
    match h.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            first_err.get_or_insert(e);
        }
        Err(_) => {
            first_err.get_or_insert(anyhow!("a load {role} thread panicked"));
        }
    }
}

/// Running load; stopped by `stop()` or on drop.
pub(crate) struct Load {
    flows: Vec<Flow>,
    stop_send: Arc<AtomicBool>,
    stop_recv: Arc<AtomicBool>,
    mark_at: Instant,
    shaping: Option<Shaping>,
    report: Option<LoadReport>,
}

/// Where the load goes and what "100 %" is.
pub(crate) struct LoadTarget<'a> {
    /// The kernel layer, for the namespaces' congestion control settings.
    pub(crate) sys: &'a dyn crate::sys::Sys,
    pub(crate) sender: &'a Netns,
    pub(crate) receiver: &'a Netns,
    pub(crate) dst: Ipv4Addr,
    /// The sender's address: the fetch load's page server listens there.
    pub(crate) src: Ipv4Addr,
    /// Link rate for shares (shaping rate or NIC speed).
    pub(crate) link_rate: Option<Rate>,
    /// The shaping, to compute the loss a CBR flow must see.
    pub(crate) shaping: Option<Shaping>,
    /// Bytes the bottleneck can queue at most, to size UDP send buffers.
    pub(crate) queue_bytes_hint: u64,
}

/// Starts every flow; returns once all TCP connections are up.
pub(crate) fn start(target: &LoadTarget<'_>, specs: &[LoadSpec]) -> Result<Load> {
    let total: u32 = specs.iter().map(LoadSpec::flows).sum();
    if total > MAX_FLOWS {
        bail!("{total} load flows requested; at most {MAX_FLOWS}");
    }
    let mut load = Load {
        flows: Vec::new(),
        stop_send: Arc::new(AtomicBool::new(false)),
        stop_recv: Arc::new(AtomicBool::new(false)),
        mark_at: Instant::now(),
        shaping: target.shaping.clone(),
        report: None,
    };
    let mut next_port = DEFAULT_LOAD_PORT;
    for spec in specs {
        let port = match spec.port() {
            Some(p) => p,
            None => {
                let p = next_port;
                next_port += 1;
                p
            }
        };
        if let LoadSpec::Fetch {
            size,
            every,
            cc,
            timeout,
            ..
        } = spec
        {
            start_fetch(
                &mut load,
                target,
                spec,
                port,
                FetchParams {
                    size: *size,
                    every: *every,
                    cc: cc.clone(),
                    timeout: *timeout,
                },
            )?;
            continue;
        }
        let rate = match spec.rate().expect("tcp and udp have a rate") {
            LoadRate::Rate(r) => Some(r),
            LoadRate::Share(s) if s >= 1.0 && matches!(spec, LoadSpec::Tcp { .. }) => None,
            LoadRate::Share(s) => Some(
                target
                    .link_rate
                    .ok_or_else(|| {
                        anyhow!(
                            "load {spec} is a share of the link, but the link rate is unknown: \
                             shape the link (--link-rate) or give a rate (e.g. tcp:50mbit)"
                        )
                    })?
                    .scaled(s),
            ),
        };
        match spec {
            LoadSpec::Tcp { cc, flows, .. } => {
                start_tcp(&mut load, target, spec, port, cc.clone(), *flows, rate)?
            }
            LoadSpec::Udp { size, .. } => {
                let rate = rate.expect("udp always has a rate");
                start_udp(&mut load, target, spec, port, *size, rate)?
            }
            LoadSpec::Fetch { .. } => unreachable!("started above"),
        }
    }
    load.mark();
    Ok(load)
}

fn setsockopt<T>(fd: &impl AsRawFd, level: i32, name: i32, val: &T, what: &str) -> Result<()> {
    // SAFETY: val points to a live T of the given size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            val as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context(what.to_string());
    }
    Ok(())
}

impl Load {
    /// Starts the measurement window (after the warm-up). UDP senders
    /// open theirs at their next datagram; a later mark moves it.
    pub(crate) fn mark(&mut self) {
        self.mark_at = Instant::now();
        for f in &mut self.flows {
            f.mark_bytes = f.counters.rx_bytes.load(Ordering::Relaxed);
            f.mark_acked = f.tcp_info_fd.as_ref().and_then(tcp_bytes_acked);
            if f.kind == "udp" {
                f.counters.mark_requested.store(true, Ordering::Release);
            }
            if let Some((w, _)) = &f.fetch {
                let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
                w.since = self.mark_at;
                w.stats = FetchStats::new();
            }
        }
    }

    /// Bytes received so far by all flows (for warm-up checks and tests).
    pub(crate) fn received_bytes(&self) -> u64 {
        self.flows
            .iter()
            .map(|f| f.counters.rx_bytes.load(Ordering::Relaxed))
            .sum()
    }

    /// Stops the senders, lets the queue drain into the receivers, stops
    /// them, and reports. Idempotent: a second call returns the same report.
    pub(crate) fn stop(&mut self) -> Result<LoadReport> {
        if let Some(r) = &self.report {
            return Ok(r.clone());
        }
        // TCP's window ends here, on both sides at once; UDP's ends at the
        // sender's last datagram, and its tail is counted after the drain.
        let window = self.mark_at.elapsed().as_secs_f64().max(1e-9);
        let window_bytes: Vec<u64> = self
            .flows
            .iter()
            .map(|f| f.counters.rx_bytes.load(Ordering::Relaxed) - f.mark_bytes)
            .collect();
        let window_acked: Vec<Option<u64>> = self
            .flows
            .iter()
            .map(|f| {
                let now = f.tcp_info_fd.as_ref().and_then(tcp_bytes_acked)?;
                Some(now.saturating_sub(f.mark_acked?))
            })
            .collect();
        self.stop_send.store(true, Ordering::Relaxed);
        let mut first_err = None;
        for f in &mut self.flows {
            join_flow_thread(f.sender.take(), "sender", &mut first_err);
        }
        self.wait_for_drain();
        self.stop_recv.store(true, Ordering::Relaxed);
        for f in &mut self.flows {
            join_flow_thread(f.receiver.take(), "receiver", &mut first_err);
        }
        let mut rep = LoadReport::default();
        for (i, f) in self.flows.iter().enumerate() {
            let fr = self.flow_report(f, window_bytes[i], window_acked[i], window);
            rep.total_achieved_bps += fr.achieved_bps;
            rep.flows.push(fr);
        }
        self.report = Some(rep.clone());
        match first_err {
            Some(e) => Err(e.context("the competing load failed")),
            None => Ok(rep),
        }
    }

    /// Whatever is still queued at the bottleneck arrives now: waits
    /// until the receivers see nothing new for 200 ms (at most 3 s).
    /// A 100 Mbit/s link drains a 100-packet queue in 12 ms.
    fn wait_for_drain(&self) {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut last = self.received_bytes();
        let mut quiet_since = Instant::now();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            let now = self.received_bytes();
            if now != last {
                last = now;
                quiet_since = Instant::now();
            } else if quiet_since.elapsed() >= Duration::from_millis(200) {
                break;
            }
        }
    }

    /// One flow's report over the window of `window` s in which its
    /// receiver got `bytes` (and, TCP, its sender had `acked` acknowledged).
    fn flow_report(&self, f: &Flow, bytes: u64, acked: Option<u64>, window: f64) -> FlowReport {
        let mut fr = FlowReport {
            kind: f.kind.into(),
            spec: f.spec.clone(),
            port: f.port,
            cc: f.cc.clone(),
            target_bps: f.target_bps,
            achieved_bps: acct::rate_bps(bytes, window),
            bytes,
            seconds: window,
            ..Default::default()
        };
        if f.kind == "tcp" {
            fr.received_bps = Some(fr.achieved_bps);
            if let Some(acked) = acked {
                fr.acked_bytes = Some(acked);
                fr.achieved_bps = acct::rate_bps(acked, window);
            }
        }
        if f.kind == "udp" {
            self.udp_report(f, &mut fr);
        }
        if let Some((w, size)) = &f.fetch {
            let w = w.lock().unwrap_or_else(|e| e.into_inner());
            fr.fetch = Some(w.stats.times(*size));
        }
        fr
    }

    /// Fills a UDP flow's report from the sender's window and what the
    /// receiver got of it.
    fn udp_report(&self, f: &Flow, fr: &mut FlowReport) {
        let sent = *f
            .counters
            .sent_window
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let received = f
            .counters
            .received_window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_default();
        // A receiver that never saw the window (all lost) has no lo; the
        // sender's is the window.
        let mut w = received;
        if w.lo() != Some(sent.lo) {
            w.restart(sent.lo);
        }
        let counts = w.counts(sent.hi);
        let size = f.udp_size as u64;
        let send_span = match (sent.first_at, sent.last_at) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        };
        let offered = acct::span_rate_bps(counts.sent, size, send_span);
        fr.sent_packets = Some(counts.sent);
        fr.received_packets = Some(counts.received);
        fr.lost_packets = Some(counts.lost);
        fr.duplicate_packets = Some(counts.duplicates);
        fr.reordered_packets = Some(counts.reordered);
        fr.loss_pct = counts.loss_pct();
        fr.bytes = counts.bytes;
        fr.seconds = send_span.as_secs_f64();
        fr.receive_seconds = Some(counts.receive_span.as_secs_f64());
        fr.achieved_bps = counts.achieved_bps(f.udp_size).unwrap_or(0.0);
        fr.offered_bps = offered;
        fr.socket_drops = Some(f.counters.socket_drops.load(Ordering::Relaxed));
        fr.max_send_lag_ms = Some(sent.max_lag.as_secs_f64() * 1e3);
        fr.sender_sched_fifo = Some(sent.fifo);
        fr.expected_loss_pct = match (&self.shaping, offered) {
            (Some(s), Some(o)) => Some(s.expected_udp_loss_pct(f.udp_size, o)),
            _ => None,
        };
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        if self.report.is_none()
            && let Err(e) = self.stop()
        {
            log::warn!("{e:#}");
        }
    }
}
