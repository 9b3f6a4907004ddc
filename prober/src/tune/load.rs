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
//! closes the measuring window by sequence number (`load_acct`), so sent,
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

use std::{
    fmt,
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    str::FromStr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    load_acct::{self, FetchStats, FetchTimes, SeqWindow},
    rt::RtSettings,
    shaping::Shaping,
    units::{Bytes, LoadRate, Rate},
};
use crate::{
    model::units,
    sys::{Netns, Sys},
};

/// First port of the load flows (iperf's).
pub const DEFAULT_LOAD_PORT: u16 = 5201;
/// Upper bound of TCP connections + UDP flows in one run.
pub const MAX_FLOWS: u32 = 32;
const MAGIC: u32 = 0x5254_504c; // "RTPL"
/// UDP load header: magic (4), session (4), sequence number (8), big endian.
const UDP_HEADER_BYTES: usize = 16;
const POLL: Duration = Duration::from_millis(100);
/// SCHED_FIFO priority of the UDP load sender: above every normal thread
/// (builds, stress), below any real-time priority given to the probes.
const UDP_SENDER_FIFO_PRIORITY: u8 = 1;
/// A CBR sender this far behind its schedule cannot send this rate on this
/// machine; it gives up SCHED_FIFO so that it cannot starve the rest.
const UDP_SENDER_MAX_FIFO_LAG: Duration = Duration::from_millis(200);

/// One `--load` entry.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadSpec {
    Tcp {
        rate: LoadRate,
        cc: Option<String>,
        flows: u32,
        port: Option<u16>,
    },
    Udp {
        rate: LoadRate,
        size: u32,
        port: Option<u16>,
    },
    Fetch {
        size: u64,
        every: Duration,
        cc: Option<String>,
        timeout: Duration,
        port: Option<u16>,
    },
}

/// Page size of the fetch load when none is given. The study does not
/// state its page's size; 100 KiB takes several round trips in slow start,
/// so the queue's delay shows in the fetch time as it did there.
pub const DEFAULT_FETCH_SIZE: u64 = 100 * 1024;
/// Pause between one fetch's end and the next one's start.
pub const DEFAULT_FETCH_EVERY: Duration = Duration::from_secs(1);
/// A fetch not done by then is a failure (the study's slowest cell took
/// 10 s on average).
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest page, so that one fetch cannot outlast any sensible run.
pub const MAX_FETCH_SIZE: u64 = 1 << 30;

impl LoadSpec {
    pub fn flows(&self) -> u32 {
        match self {
            LoadSpec::Tcp { flows, .. } => *flows,
            LoadSpec::Udp { .. } | LoadSpec::Fetch { .. } => 1,
        }
    }

    pub fn port(&self) -> Option<u16> {
        match self {
            LoadSpec::Tcp { port, .. }
            | LoadSpec::Udp { port, .. }
            | LoadSpec::Fetch { port, .. } => *port,
        }
    }

    /// The rate it asks for; None for the fetch load (its rate is what
    /// its fetches get).
    pub fn rate(&self) -> Option<LoadRate> {
        match self {
            LoadSpec::Tcp { rate, .. } | LoadSpec::Udp { rate, .. } => Some(*rate),
            LoadSpec::Fetch { .. } => None,
        }
    }

    pub fn cc(&self) -> Option<&str> {
        match self {
            LoadSpec::Tcp { cc, .. } | LoadSpec::Fetch { cc, .. } => cc.as_deref(),
            LoadSpec::Udp { .. } => None,
        }
    }

    /// Needs a link rate to be resolved (a share other than TCP's 100 %).
    pub fn needs_link_rate(&self) -> bool {
        match self {
            LoadSpec::Tcp { rate, .. } => matches!(rate, LoadRate::Share(s) if *s < 1.0),
            LoadSpec::Udp { rate, .. } => matches!(rate, LoadRate::Share(_)),
            LoadSpec::Fetch { .. } => false,
        }
    }
}

impl fmt::Display for LoadSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadSpec::Tcp {
                rate,
                cc,
                flows,
                port,
            } => {
                write!(f, "tcp:{rate}")?;
                if let Some(c) = cc {
                    write!(f, ",cc={c}")?;
                }
                if *flows != 1 {
                    write!(f, ",flows={flows}")?;
                }
                if let Some(p) = port {
                    write!(f, ",port={p}")?;
                }
                Ok(())
            }
            LoadSpec::Udp { rate, size, port } => {
                write!(f, "udp:{rate},size={size}")?;
                if let Some(p) = port {
                    write!(f, ",port={p}")?;
                }
                Ok(())
            }
            LoadSpec::Fetch {
                size,
                every,
                cc,
                timeout,
                port,
            } => {
                write!(
                    f,
                    "fetch:{},every={}",
                    Bytes(*size),
                    units::fmt_duration(*every)
                )?;
                if let Some(c) = cc {
                    write!(f, ",cc={c}")?;
                }
                if *timeout != DEFAULT_FETCH_TIMEOUT {
                    write!(f, ",timeout={}", units::fmt_duration(*timeout))?;
                }
                if let Some(p) = port {
                    write!(f, ",port={p}")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for LoadSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |m: String| format!("invalid load {s:?}: {m}");
        let mut parts = s.split(',').map(str::trim);
        let head = parts.next().unwrap_or_default();
        let (kind, rate) = match head.split_once(':') {
            Some((k, r)) => (k.trim(), Some(r.trim())),
            None => (head, None),
        };
        let mut spec = match kind {
            "tcp" => LoadSpec::Tcp {
                rate: match rate {
                    Some(r) => r.parse().map_err(bad)?,
                    None => LoadRate::Share(1.0),
                },
                cc: None,
                flows: 1,
                port: None,
            },
            "udp" => LoadSpec::Udp {
                rate: rate
                    .ok_or_else(|| {
                        bad("udp needs a rate: udp:150mbit or udp:150% (of the link)".into())
                    })?
                    .parse()
                    .map_err(bad)?,
                size: 1470,
                port: None,
            },
            "fetch" => LoadSpec::Fetch {
                size: match rate {
                    Some(r) => {
                        let b: Bytes = r.parse().map_err(bad)?;
                        if !(1..=MAX_FETCH_SIZE).contains(&b.0) {
                            return Err(bad(format!(
                                "page size {r}: expected 1 byte to {}",
                                Bytes(MAX_FETCH_SIZE)
                            )));
                        }
                        b.0
                    }
                    None => DEFAULT_FETCH_SIZE,
                },
                every: DEFAULT_FETCH_EVERY,
                cc: None,
                timeout: DEFAULT_FETCH_TIMEOUT,
                port: None,
            },
            _ => {
                return Err(bad(format!(
                    "unknown kind {kind:?}: expected tcp[:SHARE|RATE][,cc=..][,flows=N], \
                     udp:SHARE|RATE[,size=B] or fetch[:SIZE][,every=D]"
                )));
            }
        };
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| bad(format!("{p:?}: expected key=value")))?;
            match (&mut spec, k) {
                (LoadSpec::Tcp { cc, .. } | LoadSpec::Fetch { cc, .. }, "cc") => {
                    if v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                        return Err(bad(format!(
                            "cc={v}: expected a name such as cubic, bbr, reno"
                        )));
                    }
                    *cc = Some(v.to_string());
                }
                (LoadSpec::Tcp { flows, .. }, "flows") => {
                    *flows = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_FLOWS).contains(n))
                        .ok_or_else(|| bad(format!("flows={v}: expected 1 to {MAX_FLOWS}")))?;
                }
                (LoadSpec::Udp { size, .. }, "size") => {
                    let b: Bytes = v.parse().map_err(bad)?;
                    if !(16..=65507).contains(&b.0) {
                        return Err(bad(format!(
                            "size={v}: UDP payload must be 16 to 65507 bytes (1472 fits a 1500 MTU)"
                        )));
                    }
                    *size = b.0 as u32;
                }
                (LoadSpec::Fetch { every, .. }, "every") => {
                    *every =
                        units::parse_duration(v).map_err(|e| bad(format!("every={v}: {e}")))?;
                    if *every > Duration::from_secs(3600) {
                        return Err(bad(format!("every={v}: at most 1h")));
                    }
                }
                (LoadSpec::Fetch { timeout, .. }, "timeout") => {
                    *timeout =
                        units::parse_duration(v).map_err(|e| bad(format!("timeout={v}: {e}")))?;
                    if *timeout < Duration::from_millis(10) {
                        return Err(bad(format!("timeout={v}: at least 10ms")));
                    }
                }
                (
                    LoadSpec::Tcp { port, .. }
                    | LoadSpec::Udp { port, .. }
                    | LoadSpec::Fetch { port, .. },
                    "port",
                ) => {
                    *port = Some(
                        v.parse()
                            .ok()
                            .filter(|p| *p != 0)
                            .ok_or_else(|| bad(format!("port={v}: expected 1 to 65535")))?,
                    );
                }
                (LoadSpec::Tcp { .. }, _) => {
                    return Err(bad(format!(
                        "unknown tcp key {k:?}: expected cc, flows or port"
                    )));
                }
                (LoadSpec::Udp { .. }, _) => {
                    return Err(bad(format!("unknown udp key {k:?}: expected size or port")));
                }
                (LoadSpec::Fetch { .. }, _) => {
                    return Err(bad(format!(
                        "unknown fetch key {k:?}: expected every, cc, timeout or port"
                    )));
                }
            }
        }
        Ok(spec)
    }
}

impl Serialize for LoadSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LoadSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Congestion controls the kernel has (the list is the same in every
/// namespace: it names the registered modules).
pub fn available_cc(sys: &dyn Sys) -> Result<Vec<String>> {
    let s = sys.sysctl(
        crate::sys::Ns::Host,
        "net.ipv4.tcp_available_congestion_control",
    )?;
    Ok(s.split_whitespace().map(str::to_string).collect())
}

/// An error naming the congestion controls the kernel has, if `cc` is not one.
pub fn check_cc(cc: &str, available: &[String]) -> Result<(), String> {
    if available.iter().any(|a| a == cc) {
        Ok(())
    } else {
        Err(format!(
            "congestion control {cc:?} is not available in this kernel (available: {}); \
             load its module (modprobe tcp_{cc}) or pick one of those",
            available.join(" ")
        ))
    }
}

/// What one flow did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowReport {
    /// "tcp" or "udp".
    pub kind: String,
    /// The `--load` entry it came from.
    pub spec: String,
    pub port: u16,
    pub cc: Option<String>,
    /// Pacing rate (TCP) or offered payload rate (UDP); None = unpaced.
    pub target_bps: Option<u64>,
    /// Payload bits per second that got through in the measuring window
    /// (after the warm-up). UDP: the window's datagrams received, over
    /// their first to last arrival. TCP: bytes acknowledged to the sender
    /// over the window (bytes read by the receiver if TCP_INFO lacks them).
    pub achieved_bps: f64,
    /// Payload bytes received in the window (UDP: of the window's
    /// datagrams, duplicates once; TCP: read by the receiver).
    pub bytes: u64,
    /// The window's length: mark to stop (UDP: first to last send of the
    /// window's datagrams).
    pub seconds: f64,
    /// UDP: datagrams sent in the window, those of them received (each
    /// once, also if they arrived after the sender stopped), loss %.
    pub sent_packets: Option<u64>,
    pub received_packets: Option<u64>,
    pub loss_pct: Option<f64>,
    /// UDP: the loss the shaped link must cause (66 B overhead per datagram).
    pub expected_loss_pct: Option<f64>,
    /// UDP: payload rate offered over the sender's window.
    pub offered_bps: Option<f64>,
    /// UDP: sent_packets - received_packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_packets: Option<u64>,
    /// UDP: copies of a datagram already received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_packets: Option<u64>,
    /// UDP: datagrams that arrived after one with a higher sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reordered_packets: Option<u64>,
    /// UDP: first to last arrival of the window's datagrams, the span
    /// achieved_bps is measured over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive_seconds: Option<f64>,
    /// UDP: of lost_packets, those the receiver's own socket dropped
    /// (receive buffer full, SO_RXQ_OVFL): not the link's doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_drops: Option<u64>,
    /// UDP: furthest behind its schedule the sender sent a datagram of the
    /// window, ms. Above the queue's drain time (12 ms for 100 full frames
    /// at 100 Mbit/s) the link idled and the loss exceeds the calculation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_send_lag_ms: Option<f64>,
    /// UDP: the sender ran SCHED_FIFO for the whole window (false: it was
    /// not allowed to, or fell too far behind; see max_send_lag_ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_sched_fifo: Option<bool>,
    /// TCP: bytes acknowledged to the sender in the window (tcpi_bytes_acked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked_bytes: Option<u64>,
    /// TCP: the receiver's rate, bytes / seconds (achieved_bps is the
    /// acknowledged rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_bps: Option<f64>,
    /// Fetch: completion times of the window's fetches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch: Option<FetchTimes>,
}

/// The load of one run, for `Summary.extra["load"]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    pub flows: Vec<FlowReport>,
    /// Sum of achieved_bps over all flows.
    pub total_achieved_bps: f64,
    /// The kernel's count of the same window at the bottleneck's root
    /// qdisc (None: no qdisc there to ask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bottleneck: Option<QueueWindow>,
}

/// What the bottleneck's root qdisc counted from the load's mark to the
/// senders' stop: the kernel's witness of the loss and of the rate the
/// shaper delivered. It counts every packet through the qdisc, the
/// probes' among them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueWindow {
    pub dev: String,
    /// The root qdisc's kind and handle, e.g. "htb 1:".
    pub qdisc: String,
    pub seconds: f64,
    /// Packets and bytes the qdisc handed to the device (frames from the
    /// Ethernet header on, as the kernel counts them).
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// Packets the qdisc (or a qdisc below it) dropped.
    pub dropped_packets: u64,
    /// sent_bytes over the window, bits per second.
    pub delivered_bps: f64,
    /// dropped / (dropped + sent), %.
    pub drop_pct: f64,
}

impl QueueWindow {
    /// The difference of two readings of the same qdisc `elapsed` apart.
    pub fn between(
        dev: &str,
        before: &crate::sys::QdiscInfo,
        after: &crate::sys::QdiscInfo,
        elapsed: Duration,
    ) -> Self {
        let sent_packets = after.sent_packets.saturating_sub(before.sent_packets);
        let sent_bytes = after.sent_bytes.saturating_sub(before.sent_bytes);
        // The kernel keeps drops in 32 bits: a wrap is one lap.
        let dropped_packets = u64::from(after.drops.wrapping_sub(before.drops));
        let seconds = elapsed.as_secs_f64().max(1e-9);
        let offered = sent_packets + dropped_packets;
        Self {
            dev: dev.to_string(),
            qdisc: format!("{} {}", after.kind, after.handle),
            seconds,
            sent_packets,
            sent_bytes,
            dropped_packets,
            delivered_bps: sent_bytes as f64 * 8.0 / seconds,
            drop_pct: if offered == 0 {
                0.0
            } else {
                100.0 * dropped_packets as f64 / offered as f64
            },
        }
    }
}

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

/// The fetch client's record of the current window.
struct FetchWindow {
    /// Fetches started before this belong to the warm-up.
    since: Instant,
    stats: FetchStats,
}

/// Running load; stopped by `stop()` or on drop.
pub struct Load {
    flows: Vec<Flow>,
    stop_send: Arc<AtomicBool>,
    stop_recv: Arc<AtomicBool>,
    mark_at: Instant,
    shaping: Option<Shaping>,
    report: Option<LoadReport>,
}

/// Where the load goes and what "100 %" is.
pub struct LoadTarget<'a> {
    /// The kernel layer, for the namespaces' congestion control settings.
    pub sys: &'a dyn Sys,
    pub sender: &'a Netns,
    pub receiver: &'a Netns,
    pub dst: Ipv4Addr,
    /// The sender's address: the fetch load's page server listens there.
    pub src: Ipv4Addr,
    /// Link rate for shares (shaping rate or NIC speed).
    pub link_rate: Option<Rate>,
    /// The shaping, to compute the loss a CBR flow must see.
    pub shaping: Option<Shaping>,
    /// Bytes the bottleneck can queue at most, to size UDP send buffers.
    pub queue_bytes_hint: u64,
}

/// Starts every flow; returns once all TCP connections are up.
pub fn start(target: &LoadTarget<'_>, specs: &[LoadSpec]) -> Result<Load> {
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

/// A TCP socket with congestion control and pacing set, connected to dst.
fn tcp_connect(dst: SocketAddrV4, cc: Option<&str>, pacing: Option<Rate>) -> Result<TcpStream> {
    tcp_connect_within(dst, cc, pacing, None)
}

/// Sets TCP_CONGESTION; an error names the ones the kernel has.
fn set_cc(fd: &impl AsRawFd, cc: &str) -> Result<()> {
    // SAFETY: cc bytes are valid for their length.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_ptr() as *const libc::c_void,
            cc.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        let avail = available_cc(crate::sys::linux_static()).unwrap_or_default();
        return Err(match check_cc(cc, &avail) {
            Err(m) => anyhow!(m),
            Ok(()) => anyhow!("TCP_CONGESTION {cc}: {e}"),
        });
    }
    Ok(())
}

/// As `tcp_connect`; a connect that takes longer than `timeout` fails
/// (SO_SNDTIMEO bounds a blocking connect).
fn tcp_connect_within(
    dst: SocketAddrV4,
    cc: Option<&str>,
    pacing: Option<Rate>,
    timeout: Option<Duration>,
) -> Result<TcpStream> {
    // SAFETY: plain socket(2); owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket(AF_INET, SOCK_STREAM)");
    }
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(cc) = cc {
        set_cc(&fd, cc)?;
    }
    if let Some(r) = pacing {
        let bytes: u64 = r.bytes_per_sec().max(1);
        setsockopt(
            &fd,
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            &bytes,
            "SO_MAX_PACING_RATE",
        )?;
    }
    let stream = TcpStream::from(fd);
    if let Some(t) = timeout {
        stream.set_write_timeout(Some(t.max(Duration::from_millis(1))))?;
    }
    // std has no connect on an existing socket; do it by hand.
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: dst.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*dst.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sa is a valid sockaddr_in.
    let r = unsafe {
        libc::connect(
            stream.as_raw_fd(),
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("connect to {dst}"));
    }
    Ok(stream)
}

fn start_tcp(
    load: &mut Load,
    t: &LoadTarget<'_>,
    spec: &LoadSpec,
    port: u16,
    cc: Option<String>,
    flows: u32,
    rate: Option<Rate>,
) -> Result<()> {
    let addr = SocketAddrV4::new(t.dst, port);
    let listener = t.receiver.run(|| {
        TcpListener::bind(addr).with_context(|| format!("listen on {addr} for the TCP load"))
    })?;
    listener.set_nonblocking(true)?;
    let per_flow = rate.map(|r| Rate::from_bps(r.bps / flows as u64));
    let mut counters = Vec::new();
    for i in 0..flows {
        let c = Arc::new(Counters::default());
        counters.push(c.clone());
        let stream = t
            .sender
            .run(|| tcp_connect(addr, cc.as_deref(), per_flow))
            .with_context(|| format!("TCP load flow {} of {spec}", i + 1))?;
        // Accept it (the SYN is already done: accept returns at once or soon).
        let deadline = Instant::now() + Duration::from_secs(5);
        let tcp_info_fd = stream
            .as_fd()
            .try_clone_to_owned()
            .context("duplicate the TCP load socket for TCP_INFO")?;
        let conn = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        bail!("the TCP load connection to {addr} was not accepted within 5 s");
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e).context("accept the TCP load connection"),
            }
        };
        conn.set_nonblocking(false)?;
        let stop_recv = load.stop_recv.clone();
        let rc = c.clone();
        let receiver = std::thread::Builder::new()
            .name(format!("load-rx-{port}"))
            .spawn(move || tcp_reader(conn, &rc, &stop_recv))?;
        let stop_send = load.stop_send.clone();
        let sc = c.clone();
        let sender = std::thread::Builder::new()
            .name(format!("load-tx-{port}"))
            .spawn(move || tcp_writer(stream, &sc, &stop_send))?;
        c.connected.store(true, Ordering::Relaxed);
        load.flows.push(Flow {
            kind: "tcp",
            spec: spec.to_string(),
            port,
            cc: cc.clone().or_else(|| default_cc(t.sys, t.sender).ok()),
            target_bps: per_flow.map(|r| r.bps),
            udp_size: 0,
            counters: c,
            sender: Some(sender),
            receiver: Some(receiver),
            mark_bytes: 0,
            tcp_info_fd: Some(tcp_info_fd),
            mark_acked: None,
            fetch: None,
        });
    }
    Ok(())
}

struct FetchParams {
    size: u64,
    every: Duration,
    cc: Option<String>,
    timeout: Duration,
}

/// The page server in the sender namespace and the fetching client in the
/// receiver namespace (see the module docs for why this way round).
fn start_fetch(
    load: &mut Load,
    t: &LoadTarget<'_>,
    spec: &LoadSpec,
    port: u16,
    p: FetchParams,
) -> Result<()> {
    let addr = SocketAddrV4::new(t.src, port);
    let cc = p.cc.clone();
    let listener = t.sender.run(|| {
        let l = TcpListener::bind(addr)
            .with_context(|| format!("listen on {addr} for the fetch load's page server"))?;
        // Checked here so that a missing congestion control fails the start,
        // not every fetch.
        if let Some(c) = &cc {
            set_cc(&l, c)?;
        }
        Ok(l)
    })?;
    listener.set_nonblocking(true)?;
    let receiver_ns = t
        .receiver
        .file()
        .try_clone()
        .context("duplicate the receiver namespace handle")?;
    let c = Arc::new(Counters::default());
    let window = Arc::new(Mutex::new(FetchWindow {
        since: Instant::now(),
        stats: FetchStats::new(),
    }));
    // The server outlives the client (it stops with the receivers, after
    // the senders): a fetch the client starts just before the stop finds
    // it listening rather than refused.
    let stop = load.stop_recv.clone();
    let server_cc = p.cc.clone();
    let server = std::thread::Builder::new()
        .name(format!("fetch-srv-{port}"))
        .spawn(move || page_server(listener, server_cc.as_deref(), &stop))?;
    let stop = load.stop_send.clone();
    let (cc_client, w, cc2) = (p.cc.clone(), window.clone(), c.clone());
    let size = p.size;
    let client = std::thread::Builder::new()
        .name(format!("fetch-cli-{port}"))
        .spawn(move || -> Result<()> {
            nix::sched::setns(receiver_ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .context("enter the receiver namespace for the fetch client")?;
            fetch_loop(addr, &p, cc_client.as_deref(), &w, &cc2, &stop)
        })?;
    c.connected.store(true, Ordering::Relaxed);
    load.flows.push(Flow {
        kind: "fetch",
        spec: spec.to_string(),
        port,
        cc: p_cc_or_default(spec, t.sys, t.sender),
        target_bps: None,
        udp_size: 0,
        counters: c,
        // The client stops with the senders (a fetch under way is
        // dropped, neither done nor failed); the server with the receivers.
        sender: Some(client),
        receiver: Some(server),
        mark_bytes: 0,
        tcp_info_fd: None,
        mark_acked: None,
        fetch: Some((window, size)),
    });
    Ok(())
}

fn p_cc_or_default(spec: &LoadSpec, sys: &dyn Sys, sender: &Netns) -> Option<String> {
    spec.cc()
        .map(str::to_string)
        .or_else(|| default_cc(sys, sender).ok())
}

/// Serves one fetch at a time: reads the 8-byte request (the page size,
/// big endian), sends that many bytes, closes.
fn page_server(listener: TcpListener, cc: Option<&str>, stop: &AtomicBool) -> Result<()> {
    let page = vec![0x3cu8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let conn = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => return Err(e).context("accept a fetch"),
        };
        // A failed fetch (the client gave up, reset) is the client's to
        // count; the server just takes the next one.
        if let Err(e) = serve_page(conn, cc, &page, stop) {
            log::debug!("fetch server: {e:#}");
        }
    }
    Ok(())
}

fn serve_page(mut s: TcpStream, cc: Option<&str>, page: &[u8], stop: &AtomicBool) -> Result<()> {
    s.set_nonblocking(false)?;
    if let Some(c) = cc {
        set_cc(&s, c)?;
    }
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(POLL))?;
    s.set_write_timeout(Some(POLL))?;
    let mut req = [0u8; 8];
    let mut got = 0;
    while got < req.len() {
        match s.read(&mut req[got..]) {
            Ok(0) => bail!("the client closed before asking"),
            Ok(n) => got += n,
            Err(e) if is_retry(&e) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e).context("read the fetch request"),
        }
    }
    let mut left = u64::from_be_bytes(req).min(MAX_FETCH_SIZE);
    while left > 0 {
        let n = left.min(page.len() as u64) as usize;
        match s.write(&page[..n]) {
            Ok(w) => left -= w as u64,
            Err(e) if is_retry(&e) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e).context("send the page"),
        }
    }
    Ok(())
}

fn is_retry(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
    )
}

enum FetchOutcome {
    Done,
    Failed(anyhow::Error),
    Stopped,
}

/// Fetches, waits `every`, fetches again, until stopped.
fn fetch_loop(
    addr: SocketAddrV4,
    p: &FetchParams,
    cc: Option<&str>,
    window: &Mutex<FetchWindow>,
    c: &Counters,
    stop: &AtomicBool,
) -> Result<()> {
    let mut failures_logged = 0;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let mut outcome = fetch_once(addr, p.size, cc, started + p.timeout, c, stop);
        if matches!(outcome, FetchOutcome::Failed(_)) && stop.load(Ordering::Relaxed) {
            // Cut short by the stop, not by the path.
            outcome = FetchOutcome::Stopped;
        }
        let took = started.elapsed();
        {
            let mut w = window.lock().unwrap_or_else(|e| e.into_inner());
            let counts = started >= w.since;
            match &outcome {
                FetchOutcome::Done if counts => w.stats.record(took),
                FetchOutcome::Failed(_) if counts => w.stats.fail(),
                _ => {}
            }
        }
        match outcome {
            FetchOutcome::Stopped => break,
            FetchOutcome::Failed(e) => {
                if failures_logged < 3 {
                    log::warn!("a fetch of {} bytes from {addr} failed: {e:#}", p.size);
                    failures_logged += 1;
                }
            }
            FetchOutcome::Done => {}
        }
        let next = Instant::now() + p.every;
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= next {
                break;
            }
            std::thread::sleep((next - now).min(POLL));
        }
    }
    Ok(())
}

fn fetch_once(
    addr: SocketAddrV4,
    size: u64,
    cc: Option<&str>,
    deadline: Instant,
    c: &Counters,
    stop: &AtomicBool,
) -> FetchOutcome {
    let left = |d: Instant| d.saturating_duration_since(Instant::now());
    let mut s = match tcp_connect_within(addr, cc, None, Some(left(deadline))) {
        Ok(s) => s,
        Err(e) => return FetchOutcome::Failed(e),
    };
    let r = (|| -> Result<bool> {
        s.set_write_timeout(Some(left(deadline).max(Duration::from_millis(1))))?;
        s.write_all(&size.to_be_bytes())
            .context("send the request")?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = 0u64;
        while got < size {
            if stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let l = left(deadline);
            if l.is_zero() {
                bail!("timed out after {got} of {size} bytes");
            }
            s.set_read_timeout(Some(l.min(POLL)))?;
            match s.read(&mut buf) {
                Ok(0) => bail!("the server closed after {got} of {size} bytes"),
                Ok(n) => {
                    got += n as u64;
                    c.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if is_retry(&e) => {}
                Err(e) => return Err(e).context("read the page"),
            }
        }
        Ok(true)
    })();
    match r {
        Ok(true) => FetchOutcome::Done,
        Ok(false) => FetchOutcome::Stopped,
        Err(e) => FetchOutcome::Failed(e),
    }
}

/// The congestion control new TCP sockets of `ns` get (per namespace
/// since Linux 4.15).
fn default_cc(sys: &dyn Sys, ns: &Netns) -> Result<String> {
    sys.sysctl(ns.into(), "net.ipv4.tcp_congestion_control")
}

fn tcp_writer(mut s: TcpStream, _c: &Counters, stop: &AtomicBool) -> Result<()> {
    s.set_write_timeout(Some(POLL))?;
    let buf = vec![0x5au8; 128 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match s.write(&buf) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e).context("TCP load write"),
        }
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    Ok(())
}

fn tcp_reader(mut s: TcpStream, c: &Counters, stop: &AtomicBool) -> Result<()> {
    s.set_read_timeout(Some(POLL))?;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                c.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e).context("TCP load read"),
        }
    }
}

fn start_udp(
    load: &mut Load,
    t: &LoadTarget<'_>,
    spec: &LoadSpec,
    port: u16,
    size: u32,
    rate: Rate,
) -> Result<()> {
    let addr = SocketAddrV4::new(t.dst, port);
    let session: u32 = rand::random();
    let rx = t.receiver.run(|| {
        let s = UdpSocket::bind(addr).with_context(|| format!("bind {addr} for the UDP load"))?;
        let rcvbuf: libc::c_int = 8 << 20;
        setsockopt(
            &s,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &rcvbuf,
            "SO_RCVBUFFORCE",
        )?;
        Ok(s)
    })?;
    let sndbuf_bytes = (t.queue_bytes_hint * 4).clamp(4 << 20, 256 << 20) as libc::c_int;
    let tx = t.sender.run(|| {
        let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).context("bind the UDP load sender")?;
        setsockopt(
            &s,
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            &sndbuf_bytes,
            "SO_SNDBUFFORCE",
        )?;
        s.connect(addr)
            .with_context(|| format!("connect the UDP load to {addr}"))?;
        Ok(s)
    })?;
    let c = Arc::new(Counters::default());
    let stop_recv = load.stop_recv.clone();
    let rc = c.clone();
    let receiver = std::thread::Builder::new()
        .name(format!("load-rx-{port}"))
        .spawn(move || udp_reader(rx, session, &rc, &stop_recv))?;
    let stop_send = load.stop_send.clone();
    let sc = c.clone();
    let sender = std::thread::Builder::new()
        .name(format!("load-tx-{port}"))
        .spawn(move || udp_cbr(tx, session, size, rate, &sc, &stop_send))?;
    load.flows.push(Flow {
        kind: "udp",
        spec: spec.to_string(),
        port,
        cc: None,
        target_bps: Some(rate.bps),
        udp_size: size,
        counters: c,
        sender: Some(sender),
        receiver: Some(receiver),
        mark_bytes: 0,
        tcp_info_fd: None,
        mark_acked: None,
        fetch: None,
    });
    Ok(())
}

/// Sends on an absolute schedule: at time t, floor(t * pps) datagrams are
/// due; whatever is due goes out, then the thread sleeps until the next
/// one. Bursts stay within one scheduler wake-up.
fn udp_cbr(
    s: UdpSocket,
    session: u32,
    size: u32,
    rate: Rate,
    c: &Counters,
    stop: &AtomicBool,
) -> Result<()> {
    let pps = rate.bps as f64 / (size as f64 * 8.0);
    let mut buf = vec![0u8; size as usize];
    buf[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    buf[4..8].copy_from_slice(&session.to_be_bytes());
    // A CBR source the scheduler holds back for longer than the bottleneck
    // queue takes to drain (12 ms for 100 frames at 100 Mbit/s) leaves the
    // link idle and then bursts into a full queue: loss above the
    // calculation that the link did not cause. With a busy CPU that
    // happened for tens of ms at a time. (The study ran its probe server
    // real-time, iperf2 -z; its lab's CBR source had a machine to itself.)
    // Without the privilege it runs as it is.
    let mut fifo = match (RtSettings {
        fifo_priority: Some(UDP_SENDER_FIFO_PRIORITY),
        ..RtSettings::default()
    })
    .apply_to_current_thread()
    {
        Ok(g) => Some(g),
        Err(e) => {
            log::info!("the UDP load sender runs with normal scheduling: {e:#}");
            None
        }
    };
    let t0 = Instant::now();
    let mut seq: u64 = 0;
    let mut window = SentWindow::default();
    let mut window_open = false;
    while !stop.load(Ordering::Relaxed) {
        let due = (t0.elapsed().as_secs_f64() * pps) as u64;
        if fifo.is_some()
            && due > seq
            && Duration::from_secs_f64((due - seq) as f64 / pps) > UDP_SENDER_MAX_FIFO_LAG
        {
            log::warn!(
                "the UDP load sender is more than {} ms behind its schedule ({} Mbit/s is \
                 more than this machine sends): it continues with normal scheduling",
                UDP_SENDER_MAX_FIFO_LAG.as_millis(),
                rate.bps / 1_000_000
            );
            fifo = None;
            window.fifo = false;
        }
        let mut burst = 0;
        while seq < due && burst < 1024 {
            if c.mark_requested.swap(false, Ordering::AcqRel) {
                // Published before the datagram leaves, so the receiver
                // sees the new window before any datagram of it.
                c.window_lo.store(seq, Ordering::SeqCst);
                window = SentWindow {
                    lo: seq,
                    hi: seq,
                    fifo: fifo.is_some(),
                    ..SentWindow::default()
                };
                window_open = true;
            }
            buf[8..UDP_HEADER_BYTES].copy_from_slice(&seq.to_be_bytes());
            match s.send(&buf) {
                Ok(_) => {
                    c.tx_packets.fetch_add(1, Ordering::Relaxed);
                }
                // A qdisc drop may surface as ENOBUFS: the datagram was
                // sent into the link and lost there, which is the point.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    c.tx_packets.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => return Err(e).context("UDP load send"),
            }
            if window_open {
                let now = Instant::now();
                window.first_at.get_or_insert(now);
                window.last_at = Some(now);
                let due_at = t0 + Duration::from_secs_f64(seq as f64 / pps);
                window.max_lag = window.max_lag.max(now.saturating_duration_since(due_at));
            }
            seq += 1;
            burst += 1;
        }
        let next = Duration::from_secs_f64((seq + 1) as f64 / pps);
        let now = t0.elapsed();
        if next > now {
            std::thread::sleep((next - now).min(POLL));
        }
    }
    if c.mark_requested.load(Ordering::Acquire) {
        // Marked but stopped before the next datagram: an empty window.
        c.window_lo.store(seq, Ordering::SeqCst);
        window = SentWindow {
            lo: seq,
            hi: seq,
            fifo: fifo.is_some(),
            ..SentWindow::default()
        };
    } else if window_open {
        // The window closes at the first datagram not sent.
        window.hi = seq;
    }
    *c.sent_window.lock().unwrap_or_else(|p| p.into_inner()) = window;
    Ok(())
}

fn udp_reader(s: UdpSocket, session: u32, c: &Counters, stop: &AtomicBool) -> Result<()> {
    let mut window = SeqWindow::new();
    let r = udp_read_loop(&s, session, c, stop, &mut window);
    *c.received_window.lock().unwrap_or_else(|p| p.into_inner()) = Some(window);
    r
}

fn udp_read_loop(
    s: &UdpSocket,
    session: u32,
    c: &Counters,
    stop: &AtomicBool,
    window: &mut SeqWindow,
) -> Result<()> {
    use nix::{
        errno::Errno,
        sys::{
            socket::{ControlMessageOwned, MsgFlags, recvmsg, setsockopt, sockopt},
            time::TimeSpec,
        },
    };
    s.set_read_timeout(Some(Duration::from_millis(20)))?;
    // The kernel stamps each datagram as it comes off the link (netif_rx),
    // so a receiver thread that is scheduled late does not stretch the
    // window the achieved rate is measured over.
    setsockopt(s, sockopt::ReceiveTimestampns, &true)
        .context("SO_TIMESTAMPNS on the UDP load receiver")?;
    // The socket's drop counter tells a full receive buffer (our side)
    // from a drop in the path.
    setsockopt(s, sockopt::RxqOvfl, &1).context("SO_RXQ_OVFL on the UDP load receiver")?;
    let mut buf = vec![0u8; 65536];
    let mut cmsg = nix::cmsg_space!(TimeSpec, u32);
    let mut drops_base: Option<u32> = None;
    loop {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let got =
            recvmsg::<()>(s.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::empty()).map(|m| {
                let (mut stamp, mut drops) = (None, 0);
                for c in m.cmsgs().into_iter().flatten() {
                    match c {
                        ControlMessageOwned::ScmTimestampns(ts) => {
                            stamp = Some(Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32));
                        }
                        // Only present once the socket has dropped.
                        ControlMessageOwned::RxqOvfl(n) => drops = n,
                        _ => {}
                    }
                }
                (m.bytes, stamp, drops)
            });
        match got {
            Ok((n, stamp, drops)) if n >= UDP_HEADER_BYTES => {
                if buf[0..4] == MAGIC.to_be_bytes() && buf[4..8] == session.to_be_bytes() {
                    // SCM_TIMESTAMPNS is CLOCK_REALTIME: the same clock
                    // when a stamp is missing.
                    let at = stamp.unwrap_or_else(|| {
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap_or_default()
                    });
                    c.rx_packets.fetch_add(1, Ordering::Relaxed);
                    c.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    let lo = c.window_lo.load(Ordering::SeqCst);
                    if lo != u64::MAX && window.lo() != Some(lo) {
                        window.restart(lo);
                        drops_base = Some(drops);
                    }
                    if let Some(base) = drops_base {
                        c.socket_drops
                            .store(drops.wrapping_sub(base) as u64, Ordering::Relaxed);
                    }
                    let mut seq = [0u8; 8];
                    seq.copy_from_slice(&buf[8..UDP_HEADER_BYTES]);
                    window.on_datagram(u64::from_be_bytes(seq), n as u64, at);
                }
            }
            Ok(_) => {}
            Err(Errno::EAGAIN | Errno::EINTR) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e).context("UDP load receive"),
        }
    }
}

/// Bytes the peer acknowledged on a TCP socket (tcpi_bytes_acked), None
/// where the kernel does not report it (before 4.1) or TCP_INFO fails.
fn tcp_bytes_acked(fd: &impl AsRawFd) -> Option<u64> {
    // SAFETY: tcp_info is plain integers; all zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: info is a live tcp_info of `len` bytes; the kernel writes at
    // most `len` and says how much in `len`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut info as *mut libc::tcp_info as *mut libc::c_void,
            &mut len,
        )
    };
    let end = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + std::mem::size_of::<u64>();
    (r == 0 && len as usize >= end).then_some(info.tcpi_bytes_acked)
}

impl Load {
    /// Starts the measurement window (after the warm-up). UDP senders
    /// open theirs at their next datagram; a later mark moves it.
    pub fn mark(&mut self) {
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
    pub fn received_bytes(&self) -> u64 {
        self.flows
            .iter()
            .map(|f| f.counters.rx_bytes.load(Ordering::Relaxed))
            .sum()
    }

    /// Stops the senders, lets the queue drain into the receivers, stops
    /// them, and reports. Idempotent: a second call returns the same report.
    pub fn stop(&mut self) -> Result<LoadReport> {
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
            if let Some(h) = f.sender.take() {
                match h.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        first_err.get_or_insert(e);
                    }
                    Err(_) => {
                        first_err.get_or_insert(anyhow!("a load sender thread panicked"));
                    }
                }
            }
        }
        // Whatever is still queued at the bottleneck arrives now: wait
        // until the receivers see nothing new for 200 ms (at most 3 s).
        // A 100 Mbit/s link drains a 100-packet queue in 12 ms.
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
        self.stop_recv.store(true, Ordering::Relaxed);
        for f in &mut self.flows {
            if let Some(h) = f.receiver.take() {
                match h.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        first_err.get_or_insert(e);
                    }
                    Err(_) => {
                        first_err.get_or_insert(anyhow!("a load receiver thread panicked"));
                    }
                }
            }
        }
        let mut rep = LoadReport::default();
        for (i, f) in self.flows.iter().enumerate() {
            let bytes = window_bytes[i];
            let mut fr = FlowReport {
                kind: f.kind.into(),
                spec: f.spec.clone(),
                port: f.port,
                cc: f.cc.clone(),
                target_bps: f.target_bps,
                achieved_bps: load_acct::rate_bps(bytes, window),
                bytes,
                seconds: window,
                ..Default::default()
            };
            if f.kind == "tcp" {
                fr.received_bps = Some(fr.achieved_bps);
                if let Some(acked) = window_acked[i] {
                    fr.acked_bytes = Some(acked);
                    fr.achieved_bps = load_acct::rate_bps(acked, window);
                }
            }
            if f.kind == "udp" {
                self.udp_report(f, &mut fr);
            }
            if let Some((w, size)) = &f.fetch {
                let w = w.lock().unwrap_or_else(|e| e.into_inner());
                fr.fetch = Some(w.stats.times(*size));
            }
            rep.total_achieved_bps += fr.achieved_bps;
            rep.flows.push(fr);
        }
        self.report = Some(rep.clone());
        match first_err {
            Some(e) => Err(e.context("the competing load failed")),
            None => Ok(rep),
        }
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
        let offered = load_acct::span_rate_bps(counts.sent, size, send_span);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_window_is_the_difference_of_two_readings() {
        let q = |sent_packets, sent_bytes, drops| crate::sys::QdiscInfo {
            ifindex: 3,
            kind: "htb".into(),
            handle: "1:".into(),
            parent: "root".into(),
            qlen: 0,
            backlog_bytes: 0,
            drops,
            overlimits: 0,
            requeues: 0,
            sent_bytes,
            sent_packets,
        };
        let w = QueueWindow::between(
            "rtp-r",
            &q(1000, 1_512_000, u32::MAX - 9),
            &q(3000, 4_536_000, 990),
            Duration::from_secs(2),
        );
        assert_eq!(w.qdisc, "htb 1:");
        assert_eq!((w.sent_packets, w.sent_bytes), (2000, 3_024_000));
        // 10 drops up to the wrap and 990 after it.
        assert_eq!(w.dropped_packets, 1000);
        assert!((w.drop_pct - 100.0 / 3.0).abs() < 1e-9);
        assert!((w.delivered_bps - 12.096e6).abs() < 1.0);
        let idle = QueueWindow::between("d", &q(5, 5, 5), &q(5, 5, 5), Duration::ZERO);
        assert_eq!(idle.drop_pct, 0.0);
    }

    #[test]
    fn parses_load_specs() {
        assert_eq!(
            "tcp".parse::<LoadSpec>().unwrap(),
            LoadSpec::Tcp {
                rate: LoadRate::Share(1.0),
                cc: None,
                flows: 1,
                port: None
            }
        );
        let s: LoadSpec = "tcp:50%,cc=bbr,flows=2".parse().unwrap();
        assert_eq!(s.to_string(), "tcp:50%,cc=bbr,flows=2");
        assert!(s.needs_link_rate());
        assert!(!"tcp:100%".parse::<LoadSpec>().unwrap().needs_link_rate());
        assert!(!"tcp:40mbit".parse::<LoadSpec>().unwrap().needs_link_rate());
        let u: LoadSpec = "udp:150mbit,size=1470".parse().unwrap();
        assert_eq!(
            u,
            LoadSpec::Udp {
                rate: LoadRate::Rate(Rate::mbit(150)),
                size: 1470,
                port: None
            }
        );
        assert_eq!(u.to_string(), "udp:150mbit,size=1470");
        assert!("udp:150%".parse::<LoadSpec>().unwrap().needs_link_rate());
        for bad in [
            "udp",
            "quic:10%",
            "tcp:fast",
            "tcp:50%,flows=0",
            "tcp:50%,flows=99",
            "tcp,cc=",
            "tcp,size=100",
            "udp:10mbit,size=70000",
            "udp:10mbit,cc=bbr",
            "tcp,port=0",
            "tcp,bbr",
        ] {
            assert!(bad.parse::<LoadSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_fetch_specs() {
        let f: LoadSpec = "fetch:100KB,every=500ms".parse().unwrap();
        assert_eq!(
            f,
            LoadSpec::Fetch {
                size: 102_400,
                every: Duration::from_millis(500),
                cc: None,
                timeout: DEFAULT_FETCH_TIMEOUT,
                port: None
            }
        );
        assert_eq!(f.to_string(), "fetch:100KiB,every=500ms");
        assert_eq!(f.to_string().parse::<LoadSpec>().unwrap(), f);
        assert!(!f.needs_link_rate());
        assert_eq!((f.flows(), f.rate()), (1, None));
        let d: LoadSpec = "fetch".parse().unwrap();
        assert_eq!(d.to_string(), "fetch:100KiB,every=1s");
        let c: LoadSpec = "fetch:1MiB,cc=reno,timeout=5s,port=6000".parse().unwrap();
        assert_eq!(c.cc(), Some("reno"));
        assert_eq!(c.port(), Some(6000));
        assert_eq!(
            c.to_string(),
            "fetch:1MiB,every=1s,cc=reno,timeout=5s,port=6000"
        );
        // Each bad input: one line that names the key (or the size).
        for (bad, names) in [
            ("fetch:0", "page size"),
            ("fetch:2048MiB", "page size"),
            ("fetch:lots", "invalid size"),
            ("fetch,every=soon", "every=soon"),
            ("fetch,every=2h", "every=2h"),
            ("fetch,timeout=1ms", "timeout=1ms"),
            ("fetch,cc=", "cc="),
            ("fetch,flows=2", "unknown fetch key \"flows\""),
            ("fetch,size=10", "unknown fetch key \"size\""),
            ("fetch,port=0", "port=0"),
            ("fetch,500ms", "expected key=value"),
        ] {
            let e = bad.parse::<LoadSpec>().unwrap_err();
            assert!(e.contains(names) && !e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn fetch_report_is_optional_in_json() {
        // A report written before the fetch load existed still reads.
        let old = serde_json::json!({"kind": "tcp", "spec": "tcp:100%", "port": 5201,
            "cc": "cubic", "target_bps": null, "achieved_bps": 9e6, "bytes": 1, "seconds": 1.0,
            "sent_packets": null, "received_packets": null, "loss_pct": null,
            "expected_loss_pct": null, "offered_bps": null});
        let f: FlowReport = serde_json::from_value(old).unwrap();
        assert_eq!(f.fetch, None);
        assert!(serde_json::to_value(&f).unwrap().get("fetch").is_none());
        let with = FlowReport {
            kind: "fetch".into(),
            fetch: Some(FetchTimes {
                size_bytes: 100,
                count: 3,
                mean_s: Some(0.5),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = serde_json::to_value(&with).unwrap();
        assert_eq!(v["fetch"]["count"], 3);
        assert_eq!(serde_json::from_value::<FlowReport>(v).unwrap(), with);
    }

    #[test]
    fn cc_check_names_the_available_ones() {
        let avail = vec!["reno".to_string(), "cubic".to_string()];
        assert!(check_cc("cubic", &avail).is_ok());
        let e = check_cc("bbr", &avail).unwrap_err();
        assert!(e.contains("reno cubic") && e.contains("tcp_bbr"), "{e}");
    }

    #[test]
    fn report_round_trips_through_json() {
        let r = LoadReport {
            bottleneck: None,
            flows: vec![FlowReport {
                kind: "udp".into(),
                spec: "udp:150mbit,size=1470".into(),
                port: 5201,
                sent_packets: Some(10),
                received_packets: Some(6),
                loss_pct: Some(40.0),
                ..Default::default()
            }],
            total_achieved_bps: 1e6,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(serde_json::from_value::<LoadReport>(v).unwrap(), r);
    }
}
