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
//! payload bits, like iperf's `-b`. Sent and received datagrams give the
//! loss, reported next to the loss the link must cause (`shaping`).
//! The UDP socket's send buffer is raised (SO_SNDBUFFORCE) above what the
//! bottleneck queue can hold: otherwise a sender behind its own qdisc
//! blocks instead of being dropped and would see no loss at all.
//!
//! Sockets are created by threads inside the namespaces (receiver side in
//! the receiver namespace, sender side in the sender namespace) and then
//! served by plain threads: a socket belongs to the namespace it was made
//! in. Every thread checks a stop flag at least every 100 ms; the number of
//! flows is bounded.
//!
//! Kernel interface: TCP/UDP sockets, TCP_CONGESTION (Linux >= 2.6.13),
//! SO_MAX_PACING_RATE (>= 3.13, TCP internal pacing >= 4.13),
//! SO_SNDBUFFORCE/SO_RCVBUFFORCE (CAP_NET_ADMIN), and
//! /proc/sys/net/ipv4/tcp_available_congestion_control.

use std::{
    fmt,
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    shaping::Shaping,
    units::{Bytes, LoadRate, Rate},
};
use crate::testbed::Netns;

/// First port of the load flows (iperf's).
pub const DEFAULT_LOAD_PORT: u16 = 5201;
/// Upper bound of TCP connections + UDP flows in one run.
pub const MAX_FLOWS: u32 = 32;
const MAGIC: u32 = 0x5254_504c; // "RTPL"
const POLL: Duration = Duration::from_millis(100);

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
}

impl LoadSpec {
    pub fn flows(&self) -> u32 {
        match self {
            LoadSpec::Tcp { flows, .. } => *flows,
            LoadSpec::Udp { .. } => 1,
        }
    }

    pub fn port(&self) -> Option<u16> {
        match self {
            LoadSpec::Tcp { port, .. } | LoadSpec::Udp { port, .. } => *port,
        }
    }

    pub fn rate(&self) -> LoadRate {
        match self {
            LoadSpec::Tcp { rate, .. } | LoadSpec::Udp { rate, .. } => *rate,
        }
    }

    pub fn cc(&self) -> Option<&str> {
        match self {
            LoadSpec::Tcp { cc, .. } => cc.as_deref(),
            LoadSpec::Udp { .. } => None,
        }
    }

    /// Needs a link rate to be resolved (a share other than TCP's 100 %).
    pub fn needs_link_rate(&self) -> bool {
        match self {
            LoadSpec::Tcp { rate, .. } => matches!(rate, LoadRate::Share(s) if *s < 1.0),
            LoadSpec::Udp { rate, .. } => matches!(rate, LoadRate::Share(_)),
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
            _ => {
                return Err(bad(format!(
                    "unknown kind {kind:?}: expected tcp[:SHARE|RATE][,cc=..][,flows=N] or udp:SHARE|RATE[,size=B]"
                )));
            }
        };
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| bad(format!("{p:?}: expected key=value")))?;
            match (&mut spec, k) {
                (LoadSpec::Tcp { cc, .. }, "cc") => {
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
                (LoadSpec::Tcp { port, .. } | LoadSpec::Udp { port, .. }, "port") => {
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

/// Congestion controls the kernel has (as seen from the calling thread).
pub fn available_cc() -> Result<Vec<String>> {
    let p = "/proc/sys/net/ipv4/tcp_available_congestion_control";
    let s = std::fs::read_to_string(p).with_context(|| format!("read {p}"))?;
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
    /// Payload bits per second that arrived at the receiver in the
    /// measurement window (after the warm-up).
    pub achieved_bps: f64,
    /// Payload bytes received in the window.
    pub bytes: u64,
    pub seconds: f64,
    /// UDP: datagrams sent / received over the whole run, loss %.
    pub sent_packets: Option<u64>,
    pub received_packets: Option<u64>,
    pub loss_pct: Option<f64>,
    /// UDP: the loss the shaped link must cause (66 B overhead per datagram).
    pub expected_loss_pct: Option<f64>,
    /// UDP: payload rate actually offered (sent datagrams / time).
    pub offered_bps: Option<f64>,
}

/// The load of one run, for `Summary.extra["load"]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    pub flows: Vec<FlowReport>,
    /// Sum of achieved_bps over all flows.
    pub total_achieved_bps: f64,
}

/// Counters a flow's threads share.
#[derive(Default)]
struct Counters {
    rx_bytes: AtomicU64,
    rx_packets: AtomicU64,
    tx_packets: AtomicU64,
    connected: AtomicBool,
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
    started: Instant,
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
    pub sender: &'a Netns,
    pub receiver: &'a Netns,
    pub dst: Ipv4Addr,
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
        let rate = match spec.rate() {
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
    // SAFETY: plain socket(2); owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket(AF_INET, SOCK_STREAM)");
    }
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(cc) = cc {
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
            let avail = available_cc().unwrap_or_default();
            return Err(match check_cc(cc, &avail) {
                Err(m) => anyhow!(m),
                Ok(()) => anyhow!("TCP_CONGESTION {cc}: {e}"),
            });
        }
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
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("connect the TCP load to {dst}"));
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
            cc: cc.clone().or_else(|| default_cc().ok()),
            target_bps: per_flow.map(|r| r.bps),
            udp_size: 0,
            counters: c,
            sender: Some(sender),
            receiver: Some(receiver),
            mark_bytes: 0,
            started: Instant::now(),
        });
    }
    Ok(())
}

fn default_cc() -> Result<String> {
    let p = "/proc/sys/net/ipv4/tcp_congestion_control";
    Ok(std::fs::read_to_string(p)?.trim().to_string())
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
        started: Instant::now(),
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
    let t0 = Instant::now();
    let mut seq: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = (t0.elapsed().as_secs_f64() * pps) as u64;
        let mut burst = 0;
        while seq < due && burst < 1024 {
            buf[8..16].copy_from_slice(&seq.to_be_bytes());
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
            seq += 1;
            burst += 1;
        }
        let next = Duration::from_secs_f64((seq + 1) as f64 / pps);
        let now = t0.elapsed();
        if next > now {
            std::thread::sleep((next - now).min(POLL));
        }
    }
    Ok(())
}

fn udp_reader(s: UdpSocket, session: u32, c: &Counters, stop: &AtomicBool) -> Result<()> {
    s.set_read_timeout(Some(Duration::from_millis(20)))?;
    let mut buf = vec![0u8; 65536];
    loop {
        match s.recv(&mut buf) {
            Ok(n) if n >= 16 => {
                if buf[0..4] == MAGIC.to_be_bytes() && buf[4..8] == session.to_be_bytes() {
                    c.rx_packets.fetch_add(1, Ordering::Relaxed);
                    c.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
            Ok(_) => {}
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
            Err(e) => return Err(e).context("UDP load receive"),
        }
    }
}

impl Load {
    /// Starts the measurement window (after the warm-up).
    pub fn mark(&mut self) {
        self.mark_at = Instant::now();
        for f in &mut self.flows {
            f.mark_bytes = f.counters.rx_bytes.load(Ordering::Relaxed);
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
        let window = self.mark_at.elapsed().as_secs_f64().max(1e-9);
        let window_bytes: Vec<u64> = self
            .flows
            .iter()
            .map(|f| f.counters.rx_bytes.load(Ordering::Relaxed) - f.mark_bytes)
            .collect();
        self.stop_send.store(true, Ordering::Relaxed);
        let mut first_err = None;
        let mut send_secs = Vec::new();
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
            send_secs.push(f.started.elapsed().as_secs_f64());
        }
        // Whatever is still queued at the bottleneck arrives now: wait
        // until the receivers see nothing new for 200 ms (at most 3 s).
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
                achieved_bps: bytes as f64 * 8.0 / window,
                bytes,
                seconds: window,
                ..Default::default()
            };
            if f.kind == "udp" {
                let sent = f.counters.tx_packets.load(Ordering::Relaxed);
                let recv = f.counters.rx_packets.load(Ordering::Relaxed);
                fr.sent_packets = Some(sent);
                fr.received_packets = Some(recv);
                fr.loss_pct = (sent > 0).then(|| 100.0 * (1.0 - recv as f64 / sent as f64));
                let offered = sent as f64 * f.udp_size as f64 * 8.0 / send_secs[i].max(1e-9);
                fr.offered_bps = Some(offered);
                fr.expected_loss_pct = self
                    .shaping
                    .as_ref()
                    .map(|s| s.expected_udp_loss_pct(f.udp_size, offered));
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
    fn cc_check_names_the_available_ones() {
        let avail = vec!["reno".to_string(), "cubic".to_string()];
        assert!(check_cc("cubic", &avail).is_ok());
        let e = check_cc("bbr", &avail).unwrap_err();
        assert!(e.contains("reno cubic") && e.contains("tcp_bbr"), "{e}");
    }

    #[test]
    fn report_round_trips_through_json() {
        let r = LoadReport {
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
