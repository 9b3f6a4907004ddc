//! Opening and preparing a target: its session's wire, a socket connected
//! to it, the warm-up that checks it answers (and brings the reflector's
//! clock state), and after the run the status probe that asks for its
//! final count. Warm-ups and status probes of many targets run in parallel.
//! Room for every target's socket under the open-file limit.
//!
//! Kernel interfaces: socket(2), bind(2), connect(2) through
//! [`ProbeSocket`]; getrlimit(2)/setrlimit(2) RLIMIT_NOFILE.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        Mutex,
        atomic::{AtomicU8, Ordering},
    },
};

use anyhow::Result;

use super::{
    Prepared, RemoteLeg, Target,
    verdict::{Ledger, STAMP_STATUS_SEQ, clock_verdict},
};
use crate::{
    probe::wire::ProtocolArg,
    probe::{
        ProbeConfig, STOP_NOW, engine,
        socket::{self, ProbeSocket, TsFlags},
        stamp::{ClockSync, ErrorEstimate},
        wire::{Echo, SSID_WARMUP_BIT, WARMUP_SEQ, Wire},
    },
    sys::Netns,
};

/// The wire of a new session towards `target`: a fresh session id (rtprobe)
/// or SSID (STAMP, with this host's clock in its Error Estimate).
fn session_wire(target: &Target, cfg: &ProbeConfig, local_clock: &ClockSync) -> Wire {
    match target.protocol {
        ProtocolArg::Rtprobe => Wire::Rtprobe {
            session: crate::probe::new_session_id(),
            flow: cfg.flow,
        },
        ProtocolArg::Stamp => Wire::Stamp {
            ssid: (rand::random::<u16>() & !SSID_WARMUP_BIT).max(1),
            key: target.key.clone(),
            ee: ErrorEstimate::from_clock_sync(local_clock, false),
            tai_offset_s: local_clock.tai_offset_s,
        },
    }
}

/// The probe socket, bound in `ns` (None: the calling thread's) in the
/// family of `dst` and connected to it.
fn bind_towards(
    target: &Target,
    dst: SocketAddr,
    cfg: &ProbeConfig,
    wire: &Wire,
    ns: Option<&Netns>,
) -> Result<ProbeSocket, OpenFailure> {
    let socket_step = |error| OpenFailure {
        step: OpenStep::Socket,
        error,
    };
    if dst.is_ipv6() && cfg.size > crate::probe::wire::MAX_PAYLOAD_1500_IPV6 {
        return Err(socket_step(anyhow::anyhow!(
            "--size {} does not fit a 1500-byte MTU over IPv6 (40-byte header) to {dst}: use at most {} bytes",
            cfg.size,
            crate::probe::wire::MAX_PAYLOAD_1500_IPV6
        )));
    }
    if cfg.size < wire.min_len() {
        return Err(socket_step(anyhow::anyhow!(
            "--size {} is too small for {} probes: use at least {} bytes",
            cfg.size,
            target.protocol.name(),
            wire.min_len()
        )));
    }
    let bind = || {
        ProbeSocket::bind(
            // The target's family: an IPv6 target gets an AF_INET6 socket.
            SocketAddr::new(
                match dst {
                    SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                },
                0,
            ),
            cfg.tos,
            TsFlags {
                tx: true,
                rx: true,
                hardware: false,
            },
            socket::rcvbuf_bytes(cfg.interval, cfg.timeout),
        )
    };
    let sock = match ns {
        Some(ns) => ns.run(bind),
        None => bind(),
    }
    .map_err(socket_step)?;
    // The kernel then delivers only datagrams from the target: an off-path
    // sender's forged echoes never reach this socket.
    sock.connect(dst).map_err(|e| OpenFailure {
        step: OpenStep::Connect,
        error: anyhow::Error::from(e).context(format!(
            "connect the probe socket to {dst}: check that this host has a route to it"
        )),
    })?;
    Ok(sock)
}

/// The step of opening a target that failed (the `step` label of
/// `rtprobe_target_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenStep {
    /// Its host name did not resolve.
    Resolve,
    /// socket(2), its options or bind(2) failed (EMFILE: out of file descriptors).
    Socket,
    /// connect(2) failed: no route to it.
    Connect,
    /// The only target of a run did not answer its warm-up.
    Answer,
}

impl OpenStep {
    pub(crate) fn key(self) -> &'static str {
        match self {
            OpenStep::Resolve => "resolve",
            OpenStep::Socket => "socket",
            OpenStep::Connect => "connect",
            OpenStep::Answer => "answer",
        }
    }
}

/// Why a target could not be opened.
#[derive(Debug)]
pub(crate) struct OpenFailure {
    pub(crate) step: OpenStep,
    pub(crate) error: anyhow::Error,
}

/// The target's address: its host name resolved now (names are resolved
/// each time a target is opened, so a name that fails now is tried
/// again), or the address it was given.
fn address_of(l: &RemoteLeg, stop: &AtomicU8) -> Result<SocketAddr, OpenFailure> {
    let Some(host) = &l.host else {
        return Ok(l.target.addr);
    };
    let failed = |error| OpenFailure {
        step: OpenStep::Resolve,
        error,
    };
    // getaddrinfo(3) cannot be interrupted and may wait for DNS for many
    // seconds: it runs on a thread of its own, waited for at most
    // RESOLVE_TIMEOUT (or until a stop), so neither the session's end nor
    // a reload waits for it; a late answer is dropped with the thread.
    let (tx, rx) = std::sync::mpsc::channel();
    let (name, port) = (host.clone(), l.target.addr.port());
    std::thread::Builder::new()
        .name("rtprobe-resolve".into())
        .spawn(move || {
            let _ = tx.send(super::resolve(&name, port));
        })
        .map_err(|e| failed(anyhow::anyhow!("start a thread to resolve {host}: {e}")))?;
    let until = std::time::Instant::now() + RESOLVE_TIMEOUT;
    while std::time::Instant::now() < until && stop.load(Ordering::SeqCst) == 0 {
        match rx.recv_timeout(std::time::Duration::from_millis(100)) {
            Ok(r) => {
                return r.map_err(|e| {
                    failed(anyhow::anyhow!(
                        "{}",
                        format!("{e:#}").replace("--target ", "")
                    ))
                });
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    Err(failed(anyhow::anyhow!(
        "{host}: no answer from the resolver within {} s",
        RESOLVE_TIMEOUT.as_secs()
    )))
}

/// Longest wait for a host name to resolve.
const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Open files a targets run needs besides one socket per target: stdio,
/// the CSV, JSON and HDR log, epoll, the runtime's, and up to 256
/// connections of the metrics server.
pub(crate) const RESERVED_FDS: u64 = 320;

/// Makes room under RLIMIT_NOFILE for `sockets` probe sockets besides
/// [`RESERVED_FDS`]: raises the soft limit (up to the hard one) where it
/// is lower. The error says how many are needed and what to set.
pub(crate) fn open_files_for(sockets: usize) -> Result<()> {
    let needed = sockets as u64 + RESERVED_FDS;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Ok(()); // Not knowable: the sockets will say (EMFILE).
    }
    if lim.rlim_cur >= needed {
        return Ok(());
    }
    let fix = format!(
        "raise it (LimitNOFILE={needed} in the systemd unit, `ulimit -n {needed}` in a shell) or split the targets over several rtprobe processes"
    );
    if lim.rlim_max < needed {
        anyhow::bail!(
            "{sockets} probe sockets need {needed} open files (one per target, {RESERVED_FDS} more for the rest), over this process's hard limit of {} (RLIMIT_NOFILE): {fix}",
            lim.rlim_max
        );
    }
    let raised = libc::rlimit {
        rlim_cur: needed,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: plain syscall with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        let e = std::io::Error::last_os_error();
        anyhow::bail!(
            "{sockets} probe sockets need {needed} open files, over the soft limit of {} (RLIMIT_NOFILE), which could not be raised ({e}): {fix}",
            lim.rlim_cur
        );
    }
    log::info!(
        "open-file limit raised from {} to {needed} for {sockets} targets",
        lim.rlim_cur
    );
    Ok(())
}

/// Most targets warmed up (or asked for their count) at once, one thread each.
const PARALLEL: usize = 128;

/// Runs `f` over `items` in chunks of [`PARALLEL`] threads; the results in order.
pub(super) fn in_parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let f = &f;
    let mut out = Vec::with_capacity(items.len());
    for chunk in items.chunks(PARALLEL) {
        std::thread::scope(|sc| {
            let hs: Vec<_> = chunk.iter().map(|t| sc.spawn(move || f(t))).collect();
            out.extend(
                hs.into_iter()
                    .map(|h| h.join().expect("a warm-up thread panicked")),
            );
        });
    }
    out
}

/// How a target's warm-up goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WarmUp {
    /// The run's only target: no answer within 3 s is an error.
    Single,
    /// One of several at the start: 3 s, then probed anyway.
    Many,
    /// Added by a reload: 0.5 s, then probed anyway.
    Reload,
}

/// A target's address, socket, wire and warm-up. Only the only target
/// of a run (`WarmUp::Single`) fails for want of an answer.
pub(super) fn prepare(
    l: &RemoteLeg,
    ns: Option<&Netns>,
    local_clock: &ClockSync,
    mode: WarmUp,
    stop: &AtomicU8,
) -> Result<Prepared, OpenFailure> {
    let addr = address_of(l, stop)?;
    let wire = session_wire(&l.target, &l.cfg, local_clock);
    let sock = bind_towards(&l.target, addr, &l.cfg, &wire, ns)?;
    let name = l.label();
    let first = match mode {
        // Added by a reload or a retry, warmed up while the others are
        // probed: half a second, not the three of a start.
        WarmUp::Reload => engine::exchange(
            &towards(&sock, addr, &wire),
            l.cfg.size,
            engine::Ask::warm_up(WARMUP_SEQ, 5, crate::probe::STOP_SENDING),
            stop,
        )
        .map(|w| {
            if w.echo.is_none() && stop.load(Ordering::SeqCst) == 0 {
                log::warn!(
                    "target {name}: no answer to the warm-up within 0.5 s; probing it anyway"
                );
            }
            w.echo
        }),
        WarmUp::Single | WarmUp::Many => warm_up(&sock, addr, &wire, l.cfg.size, stop),
    };
    let first = match first {
        Ok(first) => first,
        Err(e) if mode != WarmUp::Single => {
            log::warn!("target {name}: {e:#}; probing it anyway");
            None
        }
        Err(error) => {
            return Err(OpenFailure {
                step: OpenStep::Answer,
                error,
            });
        }
    };
    // The clocks as the run starts decide the CSV's one-way column.
    let early = clock_verdict(local_clock, first.and_then(|e| e.ee));
    Ok(Prepared {
        addr,
        show_one_way: l.target.shared_clock || early.one_way_shown,
        wire,
        sock,
        ledger: Mutex::new(Ledger::new()),
        early,
    })
}

/// After the run: the reflector's answer to the status probe, its final
/// count of this session (None: not asked, or no answer).
pub(super) fn trailer(l: &RemoteLeg, p: &Prepared, sent: u64, stop: &AtomicU8) -> Option<Echo> {
    let target = &l.target;
    let stateful_stamp = target.protocol == ProtocolArg::Stamp && !target.stateless_reflector;
    // Nothing sent (a stop came between the warm-up and the first probe):
    // nothing to count, so nothing to ask.
    if sent > 0 && (target.protocol == ProtocolArg::Rtprobe || stateful_stamp) {
        status_probe(&p.sock, p.addr, &p.wire, l.cfg.size, stop)
    } else {
        None
    }
}

/// The engine's view of a session towards `dst` (no ledger: the warm-up
/// and the status probe read their answers themselves).
fn towards<'a>(sock: &'a ProbeSocket, dst: SocketAddr, wire: &'a Wire) -> engine::Session<'a> {
    engine::Session {
        sock,
        dst,
        wire,
        echo_side: engine::EchoSide::Remote,
        on_echoes: None,
        foreign_before: 0,
    }
}

/// The engine's warm-up towards the reflector: its answer, None if a stop
/// request ended it first.
fn warm_up(
    sock: &ProbeSocket,
    dst: SocketAddr,
    wire: &Wire,
    size: usize,
    stop: &AtomicU8,
) -> Result<Option<Echo>> {
    Ok(engine::warm_up(&towards(sock, dst, wire), size, stop)?.echo)
}

/// Asks the reflector for its final count of the session: rtprobe sends a
/// warm-up-marked probe of the session (answered, not counted), up to 3
/// times; a stateful STAMP reflector numbers one more packet of the SSID,
/// whose reply carries the count before it; one try only, waited on for
/// half a second: a retry would be counted again, and the answer to the
/// first would then not give the count.
fn status_probe(
    sock: &ProbeSocket,
    dst: SocketAddr,
    wire: &Wire,
    size: usize,
    stop: &AtomicU8,
) -> Option<Echo> {
    let ask = match wire {
        Wire::Rtprobe { .. } => engine::Ask::warm_up(u64::MAX - 1, 3, STOP_NOW),
        Wire::Stamp { .. } => engine::Ask {
            seq: STAMP_STATUS_SEQ as u64,
            warmup: false,
            tries: 1,
            wait_ms: 500,
            give_up_at: STOP_NOW,
        },
    };
    engine::exchange(&towards(sock, dst, wire), size, ask, stop)
        .ok()
        .and_then(|w| w.echo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::{STOP_SENDING, stamp::HmacKey};
    use std::time::Duration;

    /// A probe socket connected to a plain UDP socket on loopback that
    /// plays a silent reflector, and the session's wire.
    fn silent_peer() -> (ProbeSocket, std::net::UdpSocket, SocketAddr, Wire) {
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_nonblocking(true).unwrap();
        let dst = peer.local_addr().unwrap();
        let sock = ProbeSocket::bind(
            "127.0.0.1:0".parse().unwrap(),
            0,
            TsFlags {
                tx: false,
                rx: false,
                hardware: false,
            },
            0,
        )
        .unwrap();
        sock.connect(dst).unwrap();
        let wire = Wire::Rtprobe {
            session: 7,
            flow: 0,
        };
        (sock, peer, dst, wire)
    }

    fn datagrams_at(peer: &std::net::UdpSocket) -> usize {
        let mut buf = [0u8; 2048];
        std::iter::from_fn(|| peer.recv(&mut buf).ok()).count()
    }

    #[test]
    fn one_stop_request_ends_the_warm_up_before_it_sends() {
        let (sock, peer, dst, wire) = silent_peer();
        let stop = AtomicU8::new(STOP_SENDING);
        let t = std::time::Instant::now();
        assert!(warm_up(&sock, dst, &wire, 64, &stop).unwrap().is_none());
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
        assert_eq!(datagrams_at(&peer), 0);
    }

    #[test]
    fn one_stop_request_ends_the_warm_up_within_a_wait() {
        let (sock, peer, dst, wire) = silent_peer();
        let stop = AtomicU8::new(0);
        let t = std::time::Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                stop.store(STOP_SENDING, Ordering::SeqCst);
            });
            assert!(warm_up(&sock, dst, &wire, 64, &stop).unwrap().is_none());
        });
        // The first try went out; its 100 ms wait ended at the stop.
        assert!(t.elapsed() < Duration::from_millis(90), "{:?}", t.elapsed());
        assert_eq!(datagrams_at(&peer), 1);
    }

    #[test]
    fn the_status_probe_still_goes_out_after_one_stop_request() {
        let (sock, peer, dst, wire) = silent_peer();
        let stop = AtomicU8::new(STOP_SENDING);
        assert!(status_probe(&sock, dst, &wire, 64, &stop).is_none());
        assert_eq!(datagrams_at(&peer), 3, "3 tries, none answered");
        let stop = AtomicU8::new(STOP_NOW);
        assert!(status_probe(&sock, dst, &wire, 64, &stop).is_none());
        assert_eq!(datagrams_at(&peer), 0);
    }

    #[test]
    fn stamp_wire_round_trips_through_the_reflector_core() {
        use crate::probe::reflect::{Core, Policy};
        let key = HmacKey::new(&[3u8; 32]).unwrap();
        for k in [None, Some(key)] {
            let wire = Wire::Stamp {
                ssid: 77,
                key: k.clone(),
                ee: ErrorEstimate::from_error_ns(false, 0, false),
                tai_offset_s: 0,
            };
            let mut core = Core::new(Policy {
                key: k,
                ..Policy::unlimited(ProtocolArg::Stamp)
            });
            let mut buf = vec![0u8; 120];
            let mut scratch = Vec::new();
            let now = 1_763_850_000_000_000_000;
            wire.encode(5, now, false, &mut buf, &mut scratch);
            let src = std::net::SocketAddr::from(([192, 0, 2, 9], 1));
            assert!(matches!(
                core.handle(&mut buf, src, Some(now + 1000), Some(64), now + 2000),
                crate::probe::reflect::Verdict::Reply { .. }
            ));
            let e = wire.decode(&buf).unwrap();
            assert_eq!(
                (e.seq, e.warmup, e.reflector_seq, e.ttl),
                (5, false, Some(0), Some(64))
            );
            let t = e.times.unwrap();
            assert!(
                (t.rx_ns - (now + 1000)).abs() < 1000,
                "NTP keeps ns within 1 ns: {t:?}"
            );
            // A warm-up has its own SSID and is told apart.
            wire.encode(1, now, true, &mut buf, &mut scratch);
            core.handle(&mut buf, src, None, None, now);
            assert!(wire.decode(&buf).unwrap().warmup);
        }
    }
}
