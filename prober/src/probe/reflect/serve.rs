//! [`serve`]: the user-space reflector's socket loop. It runs each
//! datagram through the [`Core`], sends the replies back a batch at a
//! time, matches the replies' TX stamps to the probes' RX stamps for the
//! turnaround, and says new sessions and receive errors (rate-limited).
//!
//! Fair under any flood: each pass takes at most one batch
//! ([`BATCH`] datagrams) from each socket in turn, so a flooded socket
//! (one family, or the strangers' share) costs the others at most one
//! batch's work per pass, and the stop flag and the `--duration` deadline
//! are checked between passes, not only when the sockets fall quiet
//! (before, one socket under a flood was read to the end of the flood:
//! the other family's client lost 19.5 % at 200 kpps, and a SIGINT took
//! 12.4 s).
//!
//! Kernel interfaces: poll, recvmmsg/sendmmsg on the sockets of
//! `bind.rs` (on a wildcard address each reply with its source set by
//! IP_PKTINFO / IPV6_PKTINFO, Linux >= 2.6.14), and the socket error
//! queue for TX stamps (matched by SCM_TS_OPT_ID, Linux >= 6.13; older
//! kernels get no turnaround).

use std::{
    net::{IpAddr, SocketAddr},
    sync::atomic::{AtomicU8, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{
    Counters,
    bind::bound_to_wildcard,
    budget::{LineLimit, StampBudget, TX_STAMP_BURST, TX_STAMPS_PER_S},
    decide::{Addressing, Core, Verdict},
    report::{ServeReport, SessionInfo},
};
use crate::{
    probe::wire::ProtocolArg,
    probe::{
        addresses::LocalNets,
        clock,
        cmsg::TxKind,
        socket::{ProbeSocket, RecvBatch},
    },
};

/// "new session" lines (and, separately, receive errors) logged a second
/// at most; the rest are counted in one line.
pub const LOG_LINES_PER_S: u32 = 10;
/// Sessions listed in the JSON at most.
const SESSION_LIST_MAX: usize = 1000;
/// RX stamps kept for matching TX stamps (OPT_ID modulo this).
const TURNAROUND_RING: usize = 4096;
/// Datagrams taken from one socket per turn (one recvmmsg).
const BATCH: usize = 64;
/// Longest wait for a datagram: how late a stop (or the end of
/// `--duration`) is seen on quiet sockets. Under load the loop does not
/// wait at all and sees it within one pass.
const IDLE_POLL_MS: u64 = 20;

/// Answers on `socks` until `stop` is set or `duration` passes.
/// `session_line` gets the "new session ... from ..." lines, at most
/// [`LOG_LINES_PER_S`] a second, then one "... not shown" line for the rest.
/// A failed receive is counted, logged (as often) and survived.
pub(crate) fn serve(
    socks: &[ProbeSocket],
    core: &mut Core,
    stop: &AtomicU8,
    duration: Option<Duration>,
    session_line: impl FnMut(&str),
    mut on_tick: impl FnMut(&Counters),
) -> Result<ServeReport> {
    let start = Instant::now();
    let deadline = duration.map(|d| start + d);
    let mut server = Server::new(core, session_line)?;
    let refs: Vec<&ProbeSocket> = socks.iter().collect();
    let wildcard: Vec<bool> = socks.iter().map(bound_to_wildcard).collect();
    server
        .core
        .set_local_nets(LocalNets::read().context("read this host's addresses")?);
    let (mut nets_read, mut last_tick) = (start, start);
    // Whether a socket gave a full batch last pass: more is waiting, so
    // the next pass reads without waiting.
    let mut busy = false;
    loop {
        let now = Instant::now();
        if stop.load(Ordering::SeqCst) != 0 || deadline.is_some_and(|d| now >= d) {
            break;
        }
        if !busy {
            let wait = deadline.map_or(IDLE_POLL_MS, |d| {
                let left = d.saturating_duration_since(now).as_millis() as u64;
                left.clamp(1, IDLE_POLL_MS)
            });
            crate::probe::socket::poll_any(&refs, wait as i32).context("reflector poll")?;
        }
        // Addresses come and go (DHCP, a new interface): a subnet broadcast
        // may be new. Once a second bounds both the cost and the window.
        if nets_read.elapsed() >= Duration::from_secs(1) {
            nets_read = Instant::now();
            match LocalNets::read() {
                Ok(n) => server.core.set_local_nets(n),
                Err(e) => log::warn!("reflector: {e:#}; keeping the addresses read before"),
            }
        }
        busy = server.pass(socks, &wildcard);
        if last_tick.elapsed() >= Duration::from_millis(250) {
            last_tick = Instant::now();
            on_tick(&server.core.counters);
            // A flood that stopped still gets its count said.
            if let Some(k) = server.session_lines.roll(clock::realtime_ns()) {
                (server.session_line)(&held_back_line(k));
            }
        }
    }
    if let Some(k) = server.session_lines.take_held_back() {
        (server.session_line)(&held_back_line(k));
    }
    if let Some(k) = server.error_lines.take_held_back() {
        log::warn!("reflector: {k} more receive errors not shown");
    }
    on_tick(&server.core.counters);
    Ok(server.report(start.elapsed()))
}

fn held_back_line(k: u64) -> String {
    format!("{k} more new sessions in the last second not shown")
}

/// The user-space reflector's state between polls: the core answering
/// probes, the receive batches, the echo TX stamps that give the
/// turnaround, and the rate-limited session and error lines.
struct Server<'c, F: FnMut(&str)> {
    core: &'c mut Core,
    batch: RecvBatch,
    errq: RecvBatch,
    /// Datagrams of the batch to send back, and the OPT_ID each asks a TX
    /// stamp for.
    echo: Vec<usize>,
    stamps: Vec<Option<u32>>,
    /// The address each reply leaves from (only on a wildcard socket:
    /// the probe's destination).
    from: Vec<Option<IpAddr>>,
    /// RX stamp per OPT_ID, for the most recent [`TURNAROUND_RING`] ids.
    ring: Vec<i64>,
    next_id: u32,
    budget: StampBudget,
    /// Echoes sent with a TX stamp asked for.
    sampled: u64,
    turnaround: hdrhistogram::Histogram<u64>,
    sessions: Vec<SessionInfo>,
    session_lines: LineLimit,
    error_lines: LineLimit,
    session_line: F,
}

impl<'c, F: FnMut(&str)> Server<'c, F> {
    fn new(core: &'c mut Core, session_line: F) -> Result<Self> {
        Ok(Server {
            core,
            batch: RecvBatch::new(BATCH, 65536),
            errq: RecvBatch::new(64, 256),
            echo: Vec::with_capacity(BATCH),
            stamps: Vec::with_capacity(BATCH),
            from: Vec::with_capacity(BATCH),
            ring: vec![0i64; TURNAROUND_RING],
            next_id: 0,
            budget: StampBudget::new(TX_STAMPS_PER_S, TX_STAMP_BURST),
            sampled: 0,
            turnaround: hdrhistogram::Histogram::<u64>::new(3).context("histogram")?,
            sessions: Vec::new(),
            session_lines: LineLimit::new(LOG_LINES_PER_S),
            error_lines: LineLimit::new(LOG_LINES_PER_S),
            session_line,
        })
    }

    /// One pass: a batch from each socket in turn (`wildcard`: which are
    /// bound to a wildcard address). True if a batch was full: more may
    /// be waiting.
    fn pass(&mut self, socks: &[ProbeSocket], wildcard: &[bool]) -> bool {
        let mut busy = false;
        for (sock, &w) in socks.iter().zip(wildcard) {
            busy |= self.serve_batch(sock, w);
        }
        busy
    }

    /// Answers one batch of what waits on `sock` (its turn of the pass)
    /// and collects the echoes' TX stamps. On a `wildcard` socket each
    /// reply leaves from the address its probe was sent to. True when the
    /// batch was full: more may be waiting.
    fn serve_batch(&mut self, sock: &ProbeSocket, wildcard: bool) -> bool {
        let n = match sock.recv_batch(&mut self.batch, false) {
            Ok(n) => n,
            Err(e) => {
                self.receive_failed(&e);
                0
            }
        };
        if n > 0 {
            self.answer_batch(sock, n, wildcard, clock::realtime_ns());
            if !self.echo.is_empty() {
                self.send_echoes(sock);
            }
        }
        self.drain_tx_stamps(sock);
        n == self.batch.capacity()
    }

    /// E.g. ENOMEM, or an error a socket option queued: the next datagram
    /// may well be fine, so it is counted and logged (rate-limited) only.
    fn receive_failed(&mut self, e: &std::io::Error) {
        self.core.counters.recv_errors += 1;
        let now = clock::realtime_ns();
        if let Some(k) = self.error_lines.roll(now) {
            log::warn!("reflector: {k} more receive errors in the last second");
        }
        if self.error_lines.admit() {
            log::warn!("reflector: receive failed ({e}); going on");
        }
    }

    /// Runs the first `n` datagrams of the batch through the core, and
    /// lists the replies to send with the TX stamps they ask for and, on
    /// a `wildcard` socket, the address each leaves from.
    fn answer_batch(&mut self, sock: &ProbeSocket, n: usize, wildcard: bool, now: i64) {
        self.echo.clear();
        self.stamps.clear();
        self.from.clear();
        for i in 0..n {
            let (payload, src, c) = self.batch.get(i);
            let at = Addressing {
                src,
                dst: c.dst,
                ifindex: c.ifindex,
            };
            let v = self.core.handle_addressed(payload, at, c.sw_ns, c.ttl, now);
            let Verdict::Reply { new_session, .. } = v else {
                continue;
            };
            if let Some(id) = new_session {
                self.new_session(src, id, now);
            }
            // Only a reply with an RX stamp can give a turnaround.
            let stamp = c.sw_ns.is_some() && sock.per_send_opt_id() && self.budget.take(now);
            if stamp {
                self.ring[self.next_id as usize % TURNAROUND_RING] = c.sw_ns.unwrap_or(0);
                self.stamps.push(Some(self.next_id));
                self.next_id = self.next_id.wrapping_add(1);
            } else {
                self.stamps.push(None);
            }
            // The core answered only a probe sent to one of this host's
            // unicast addresses, so the destination is one to send from.
            self.from.push(if wildcard { c.dst } else { None });
            self.echo.push(i);
        }
    }

    /// Says a new session (rate-limited) and keeps it for the report's
    /// list (the first [`SESSION_LIST_MAX`]).
    fn new_session(&mut self, src: SocketAddr, id: u64, now: i64) {
        if let Some(k) = self.session_lines.roll(now) {
            (self.session_line)(&held_back_line(k));
        }
        let show = self.session_lines.admit();
        // Built only when used: under a flood of new sessions, formatting
        // each would cost more than answering it.
        if show || self.sessions.len() < SESSION_LIST_MAX {
            let info = session_info(self.core.policy().protocol, src, id);
            if show {
                (self.session_line)(&format!("new session {} from {}", info.id, info.source));
            }
            if self.sessions.len() < SESSION_LIST_MAX {
                self.sessions.push(info);
            }
        }
    }

    fn send_echoes(&mut self, sock: &ProbeSocket) {
        match sock.send_back_stamping(&mut self.batch, &self.echo, &self.stamps, &self.from) {
            Ok(sent) => {
                self.core.counters.send_errors += (self.echo.len() - sent) as u64;
                // Asked for (a kernel without per-send ids was asked for
                // none); a refused send gets no stamp.
                if sock.per_send_opt_id() {
                    self.sampled += self.stamps.iter().flatten().count() as u64;
                }
            }
            Err(e) => {
                log::debug!("reflector send: {e}");
                self.core.counters.send_errors += self.echo.len() as u64;
            }
        }
    }

    fn drain_tx_stamps(&mut self, sock: &ProbeSocket) {
        drain_tx_stamps(
            sock,
            &mut self.errq,
            &self.ring,
            self.next_id,
            &mut self.turnaround,
        );
    }

    fn report(self, elapsed: Duration) -> ServeReport {
        let core = self.core;
        let clock = core.clock(clock::realtime_ns());
        let policy = core.policy();
        ServeReport {
            protocol: policy.protocol.name(),
            listen: Vec::new(),
            authenticated: policy.key.is_some(),
            stateful: policy.stateful || policy.protocol == ProtocolArg::Rtprobe,
            rate_limit_pps: policy.limits.per_source_pps.unwrap_or(0),
            global_rate_limit_pps: policy.limits.global_pps,
            peers_rate_limit_pps: policy.limits.peers_pps,
            peers: policy
                .peers
                .prefixes()
                .iter()
                .map(|p| p.to_string())
                .collect(),
            duration_s: elapsed.as_secs_f64(),
            counters: core.counters.clone(),
            turnaround_ns: crate::stats::Latency::from_hist(&self.turnaround),
            turnaround_sampled: self.sampled,
            turnaround_stamps_per_s: TX_STAMPS_PER_S,
            session_list: self.sessions,
            clock_synchronized: clock.is_some_and(|c| c.synchronized),
            clock_max_error_ns: clock.map(|c| c.max_error_ns),
            stopped_after_signal_ms: None,
        }
    }
}

fn session_info(protocol: ProtocolArg, src: SocketAddr, id: u64) -> SessionInfo {
    SessionInfo {
        source: src.to_string(),
        id: match protocol {
            ProtocolArg::Rtprobe => format!("{id:#018x}"),
            ProtocolArg::Stamp => format!("ssid {id}"),
        },
        first_seen: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    }
}

/// Echo TX stamps: turnaround = TX stamp - the probe's RX stamp (matched
/// by OPT_ID; only the recent ring of them, which is all a live queue holds).
fn drain_tx_stamps(
    sock: &ProbeSocket,
    errq: &mut RecvBatch,
    ring: &[i64],
    next_id: u32,
    h: &mut hdrhistogram::Histogram<u64>,
) {
    loop {
        let got = sock.recv_batch(errq, true).unwrap_or(0);
        for i in 0..got {
            let (_, _, c) = errq.get(i);
            if let Some((id, TxKind::Software, tx_ns)) = c.tx_stamp()
                && sock.per_send_opt_id()
                && next_id.wrapping_sub(id) as usize <= TURNAROUND_RING
            {
                let rx = ring[id as usize % TURNAROUND_RING];
                if rx > 0 && tx_ns >= rx {
                    let _ = h.record((tx_ns - rx) as u64);
                }
            }
        }
        if got < errq.capacity() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        super::{bind::local_port, testutil::*},
        *,
    };
    use crate::probe::reflect::bind;

    /// A reply the kernel refuses counts as a send error (the socket is
    /// shut down for writing: every send fails with EPIPE), not as sent.
    #[test]
    fn refused_replies_count_as_send_errors() {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let port = std::net::UdpSocket::bind(any)
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let at = SocketAddr::from(([127, 0, 0, 1], port));
        let socks = bind(&[at]).unwrap();
        // SAFETY: shutdown on an fd the ProbeSocket owns and keeps open.
        unsafe { libc::shutdown(socks[0].fd(), libc::SHUT_WR) };
        let client = std::net::UdpSocket::bind(any).unwrap();
        for seq in 0..3 {
            client.send_to(&probe(5, seq, 64), at).unwrap();
        }
        let mut c = core(ProtocolArg::Rtprobe, None, 0, false);
        let stop = AtomicU8::new(0);
        let report = serve(
            &socks,
            &mut c,
            &stop,
            Some(Duration::from_millis(300)),
            |_| {},
            |_| {},
        )
        .unwrap();
        let k = &report.counters;
        assert_eq!((k.reflected, k.send_errors), (3, 3), "{k:?}");
    }

    /// A reply whose source is no longer this host's (the address went
    /// between the probe and the reply) is refused: over IPv4 with
    /// ENETUNREACH, over IPv6 with EINVAL, as a kernel without per-send
    /// OPT_IDs refuses those. The refusal costs that reply only, not the
    /// turnaround of every later one.
    #[test]
    fn a_refused_source_does_not_turn_off_per_send_stamp_ids() {
        // TEST-NET-1 and the documentation prefix: never this host's.
        for (lo, gone) in [("127.0.0.1", "192.0.2.1"), ("::1", "2001:db8::1")] {
            let lo: IpAddr = lo.parse().unwrap();
            let wildcard = SocketAddr::new(
                if lo.is_ipv4() {
                    std::net::Ipv4Addr::UNSPECIFIED.into()
                } else {
                    std::net::Ipv6Addr::UNSPECIFIED.into()
                },
                0,
            );
            let Ok(socks) = bind(&[wildcard]) else {
                eprintln!("no {lo} here: skipped");
                continue;
            };
            let refl = &socks[0];
            let client = std::net::UdpSocket::bind(SocketAddr::new(lo, 0)).unwrap();
            client
                .set_read_timeout(Some(Duration::from_secs(1)))
                .unwrap();
            let to = SocketAddr::new(lo, local_port(refl));
            for seq in 0..2 {
                client.send_to(&probe(7, seq, 64), to).unwrap();
            }
            let mut batch = RecvBatch::new(4, 256);
            let mut n = 0;
            for _ in 0..100 {
                n = refl.recv_batch(&mut batch, false).unwrap();
                if n > 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(n, 2, "both on loopback in one batch");
            let per_send = refl.per_send_opt_id();
            let from = [Some(gone.parse().unwrap()), None];
            let sent = refl
                .send_back_stamping(&mut batch, &[0, 1], &[Some(1), Some(2)], &from)
                .unwrap();
            let now = refl.per_send_opt_id();
            eprintln!("{lo}: {sent} of 2 replies sent; per-send ids {per_send} -> {now}");
            assert_eq!(sent, 1, "the reply from {gone} is refused, the other goes");
            assert_eq!(now, per_send);
            let mut buf = [0u8; 128];
            client.recv(&mut buf).unwrap();
        }
    }

    /// A flooded socket gets one batch per pass, not all it holds: with
    /// hundreds of datagrams waiting on the first socket, one pass answers
    /// the probe waiting on the second, and the first still holds the
    /// rest for the next passes (before, it was read to the end first).
    #[test]
    fn one_pass_takes_one_batch_from_each_socket() {
        let lo = SocketAddr::from(([127, 0, 0, 1], 0));
        let socks = bind(&[lo, lo]).unwrap();
        let at: Vec<SocketAddr> = socks
            .iter()
            .map(|s| SocketAddr::from(([127, 0, 0, 1], local_port(s))))
            .collect();
        let flooder = std::net::UdpSocket::bind(lo).unwrap();
        let mut queued = 0u64;
        while queued < 4 * BATCH as u64 {
            flooder.send_to(&probe(1, queued, 32), at[0]).unwrap();
            queued += 1;
        }
        let client = std::net::UdpSocket::bind(lo).unwrap();
        client.send_to(&probe(2, 0, 64), at[1]).unwrap();
        // Loopback delivers at once, but give the softirq a moment.
        std::thread::sleep(Duration::from_millis(50));
        let mut c = core(ProtocolArg::Rtprobe, None, 0, false);
        // Loopback is a good source on loopback only: say which it is.
        c.set_local_nets(LocalNets::read().unwrap());
        let mut server = Server::new(&mut c, |_| {}).unwrap();
        let busy = server.pass(&socks, &[false, false]);
        assert!(busy, "the first socket gave a full batch");
        assert_eq!(server.core.counters.datagrams, BATCH as u64 + 1);
        client
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut buf = [0u8; 128];
        assert_eq!(client.recv(&mut buf).unwrap(), 64, "the probe was answered");
        // The rest is still there, a batch a pass.
        let mut passes = 1;
        while server.pass(&socks, &[false, false]) {
            passes += 1;
        }
        assert_eq!(server.core.counters.datagrams, queued + 1);
        assert!(passes >= 4, "{passes} passes for {queued} datagrams");
    }

    /// Stop and `--duration` are seen between batches: `serve` returns at
    /// its deadline while a flood is still arriving (before, a socket that
    /// kept its batches full was read until the flood ended).
    #[test]
    fn the_deadline_is_kept_with_a_backlog_waiting() {
        let lo = SocketAddr::from(([127, 0, 0, 1], 0));
        let socks = bind(&[lo]).unwrap();
        let at = SocketAddr::from(([127, 0, 0, 1], local_port(&socks[0])));
        let flooder = std::net::UdpSocket::bind(lo).unwrap();
        let stop = AtomicU8::new(0);
        let flooding = std::sync::atomic::AtomicBool::new(true);
        let mut c = core(ProtocolArg::Rtprobe, None, 0, false);
        let report = std::thread::scope(|s| {
            s.spawn(|| {
                let deadline = Instant::now() + Duration::from_secs(20);
                let mut seq = 0;
                while flooding.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let _ = flooder.send_to(&probe(3, seq, 32), at);
                    seq += 1;
                }
            });
            std::thread::sleep(Duration::from_millis(20));
            let r = serve(
                &socks,
                &mut c,
                &stop,
                Some(Duration::from_millis(300)),
                |_| {},
                |_| {},
            );
            let still = flooding.swap(false, Ordering::Relaxed);
            (r, still)
        });
        let (report, flood_still_running) = report;
        let report = report.unwrap();
        eprintln!(
            "serve returned after {:.3} s with {} datagrams read",
            report.duration_s, report.counters.datagrams
        );
        assert!(
            flood_still_running,
            "serve returned only when the flood ended"
        );
        assert!(report.counters.datagrams > 0);
    }

    /// Loopback has all of 127/8: a probe to 127.0.0.2 on a reflector bound
    /// to 0.0.0.0 is answered from 127.0.0.2, so a sender connected to
    /// that address gets it (routing alone would pick 127.0.0.1, which the
    /// connected socket drops). The same socket on 127.0.0.2 itself does
    /// too, without a source of its own.
    #[test]
    fn a_wildcard_reflector_answers_from_the_address_probed() {
        for listen in ["0.0.0.0", "127.0.0.2"] {
            let port = std::net::UdpSocket::bind("0.0.0.0:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let socks = bind(&[format!("{listen}:{port}").parse().unwrap()]).unwrap();
            let probed = SocketAddr::from(([127, 0, 0, 2], port));
            let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            client.connect(probed).unwrap();
            for seq in 0..5 {
                client.send(&probe(6, seq, 64)).unwrap();
            }
            let mut c = core(ProtocolArg::Rtprobe, None, 0, false);
            let stop = AtomicU8::new(0);
            let dur = Some(Duration::from_millis(200));
            let report = serve(&socks, &mut c, &stop, dur, |_| {}, |_| {}).unwrap();
            client.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 128];
            let echoes = std::iter::from_fn(|| client.recv(&mut buf).ok()).count();
            eprintln!(
                "--listen {listen}:{port}: {echoes}/5 echoes to a sender connected to {probed}"
            );
            assert_eq!(report.counters.reflected, 5, "{listen}");
            assert_eq!(echoes, 5, "{listen}: replies left from another address");
        }
    }
}
