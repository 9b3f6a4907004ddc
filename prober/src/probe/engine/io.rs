//! The session's reader: takes the TX stamps and echoes at the sender,
//! echoes the probes where the reflector is ours in this process, and
//! hands the events to the collector in batches, with how far it has read
//! ([`ReadMark`]): the collector gives a probe up as lost only once the
//! reader has read every socket past the probe's timeout, so a stall of
//! the reader (waiting for a CPU) delays records but never turns an echo
//! the kernel received in time into a loss.
//!
//! Who reads ([`ReadBy`]): the sender thread itself, right after each
//! tick's sends and then, once the last probe is out, in a loop until the
//! session ends; so no thread sleeps on a probe socket while probes go
//! out, and none is woken (by a TX stamp, an echo, or a timer of its own)
//! inside a probe's send. With the in-process reflector an I/O thread
//! waits on the receiver's socket, as any reflector does, and reads the
//! sender's right after each echo.
//!
//! Kernel interfaces: epoll(7) (Linux >= 2.6) or poll(2), recvmmsg(2) and
//! MSG_ERRQUEUE (TX stamps), sendmmsg(2) (echoes), and
//! `/proc/thread-self/schedstat` for the reader's run-queue wait.

use std::sync::{
    atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering},
    mpsc,
};

use hdrhistogram::Histogram;

use super::{Leg, Session};
use crate::{
    probe::{
        clock, cpu_wait,
        events::{self, EventBatch},
        matcher::{EchoRules, Event, Verdict},
        pacer::{self, Handover},
        packet::Probe,
        reflect::{self, FLAG_WARMUP},
        socket::{self, ProbeSocket, RecvBatch},
        wire::Echo,
    },
    stats::{Latency, ReaderTiming},
};

/// How far the reader has read, on CLOCK_REALTIME: every datagram and
/// stamp the kernel queued on the session's sockets before this time has
/// been read and its events handed to the collector. `i64::MAX` once the
/// reader has ended (nothing more will come).
pub(crate) struct ReadMark(AtomicI64);

impl ReadMark {
    pub(crate) fn new() -> Self {
        Self(AtomicI64::new(i64::MIN))
    }

    /// Read before taking the events it covers: every batch handed over
    /// before the mark was set is then in the channel.
    pub(crate) fn until_ns(&self) -> i64 {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn publish(&self, ns: i64) {
        self.0.fetch_max(ns, Ordering::Release);
    }

    fn end(&self) {
        self.0.store(i64::MAX, Ordering::Release);
    }
}

/// The sender's reusable buffers.
struct SenderBufs {
    batch: RecvBatch,
    errq: RecvBatch,
    /// This wake-up's accepted echoes, for [`Session::on_echoes`].
    seen: Vec<Echo>,
    /// From each echo's kernel RX stamp to its read here.
    read_delay: Histogram<u64>,
}

/// Longest read delay recorded (an hour); longer ones count as this.
const MAX_READ_DELAY_NS: u64 = 3_600_000_000_000;

/// Who reads a session's sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadBy {
    /// The sender thread, between its sends and after the last one.
    Sender,
    /// An I/O thread waiting on the in-process reflector's socket.
    IoThread,
}

/// The reader's state between passes.
pub(super) struct Io<'l, 'a> {
    legs: &'l [Leg<'a>],
    rules: Vec<EchoRules<'l>>,
    reflect: Option<ReflectBufs>,
    /// The legs whose receiver socket is ours (a testbed's flows).
    receivers: Vec<usize>,
    /// Of those, the ones whose socket still has something in this pass.
    reflecting: Vec<usize>,
    sender: SenderBufs,
    /// What a blocking wait waits on.
    polled: Vec<&'l ProbeSocket>,
    /// Remote targets: only the sockets that have something are read.
    remote: bool,
    fds: Vec<libc::pollfd>,
    /// The legs to read in this pass.
    ready: Vec<usize>,
    many: Option<ReadySet>,
    /// Events not handed over yet, aged on CLOCK_MONOTONIC.
    out: EventBatch,
    ev: mpsc::Sender<Vec<events::Tagged>>,
    mark: &'l ReadMark,
    /// The start of the newest complete pass whose events are not handed
    /// over yet: the mark moves there once they are.
    read_to: Option<i64>,
    start: cpu_wait::Snapshot,
}

impl<'l, 'a> Io<'l, 'a> {
    pub(super) fn new(
        legs: &'l [Leg<'a>],
        ev: mpsc::Sender<Vec<events::Tagged>>,
        mark: &'l ReadMark,
        by: ReadBy,
    ) -> Self {
        let rules = legs
            .iter()
            .map(|l| EchoRules {
                wire: l.s.wire,
                target: l.s.dst,
                issued: &l.attempts,
            })
            .collect();
        let receivers: Vec<usize> = (0..legs.len())
            .filter(|&i| legs[i].s.echo_side.receiver().is_some())
            .collect();
        let rx_socks = receivers
            .iter()
            .filter_map(|&i| legs[i].s.echo_side.receiver());
        // Nobody sleeps on a sender's socket while probes go out: a thread
        // asleep there is woken by every TX stamp from inside the send (the
        // sending CPU wakes it, with an IPI where it sleeps on another
        // one), and on veth by the echo, before its RX stamp. The sender
        // reads its socket itself between sends; only once the last probe
        // is out does its loop wait on it. The in-process reflector's I/O
        // thread waits on the receiver's socket, as any reflector does,
        // and reads the sender's right after each echo (on veth the echo
        // and the stamps are queued by then).
        let remote = receivers.is_empty();
        let polled: Vec<&ProbeSocket> = match (remote, by) {
            (false, ReadBy::IoThread) => rx_socks.collect(),
            (false, ReadBy::Sender) => rx_socks.chain(legs.iter().map(|l| l.s.sock)).collect(),
            (true, _) => legs.iter().map(|l| l.s.sock).collect(),
        };
        let many = (remote && polled.len() > 1)
            .then(|| ReadySet::new(&polled))
            .and_then(|r| {
                r.map_err(|e| log::debug!("epoll: {e}; poll() instead"))
                    .ok()
            });
        Self {
            legs,
            rules,
            reflect: (!remote).then(ReflectBufs::new),
            reflecting: Vec::with_capacity(receivers.len()),
            receivers,
            sender: SenderBufs {
                batch: RecvBatch::new(64, 65536),
                errq: RecvBatch::new(64, 256),
                seen: Vec::with_capacity(64),
                read_delay: Histogram::new_with_bounds(1, MAX_READ_DELAY_NS, 2)
                    .expect("valid histogram bounds"),
            },
            polled,
            remote,
            fds: Vec::new(),
            ready: Vec::new(),
            many,
            out: EventBatch::new(),
            ev,
            mark,
            read_to: None,
            start: cpu_wait::Snapshot::now(),
        }
    }

    /// Waits up to `timeout_ms` until a socket has something and puts the
    /// legs to read in `ready` (0: looks without waiting; with one target
    /// not even that: its socket is read anyway). Returns the time the
    /// wait began: whatever the kernel had queued by then is read by the
    /// pass that follows.
    fn wait(&mut self, timeout_ms: i32, finishing: bool) -> std::io::Result<i64> {
        let began_ns = clock::realtime_ns();
        let several = self.remote && self.legs.len() > 1;
        match self.many.as_mut() {
            Some(set) => set.wait(timeout_ms, &mut self.ready)?,
            None if several || timeout_ms != 0 => {
                socket::poll_ready(&self.polled, timeout_ms, &mut self.fds, &mut self.ready)?
            }
            None => {}
        }
        // A testbed's one sender and one target are read whatever the
        // wait said (the in-process reflector's I/O thread waits on the
        // receiver's socket only); several targets when theirs is ready.
        if !several || finishing {
            self.ready.clear();
            self.ready.extend(0..self.legs.len());
        }
        Ok(began_ns)
    }

    /// Reads what is ready until nothing is left (the pass is complete:
    /// true), the batch is full, or each socket has had `rounds` reads.
    /// Returns how many messages it took.
    fn read_ready(&mut self, finishing: bool, rounds: usize) -> (usize, bool) {
        self.reflecting.clear();
        if self.reflect.is_some() {
            self.reflecting.extend_from_slice(&self.receivers);
        }
        let mut got = 0;
        for _ in 0..rounds {
            let mut n = 0;
            let (legs, out) = (self.legs, &mut self.out);
            if let Some(b) = self.reflect.as_mut() {
                self.reflecting.retain(|&i| {
                    let Some((sock, session)) = legs[i].s.echo_side.receiver_session() else {
                        return false;
                    };
                    let leg = Reflected {
                        session,
                        issued: &legs[i].attempts,
                        tag: i as u32,
                    };
                    let (k, drained) = reflect_queued(sock, b, leg, finishing, out);
                    n += k;
                    !drained
                });
            }
            let (legs, rules) = (self.legs, &self.rules);
            let (sender, out) = (&mut self.sender, &mut self.out);
            self.ready.retain(|&i| {
                let (k, drained) = drain_sender(&legs[i].s, &rules[i], i as u32, sender, out);
                n += k;
                !drained
            });
            got += n;
            if self.reflecting.is_empty() && self.ready.is_empty() {
                return (got, true);
            }
            if self.out.len() >= events::MAX_LEN {
                return (got, false);
            }
        }
        (got, false)
    }

    /// One pass: waits up to `timeout_ms`, then reads everything that was
    /// queued when the wait began, handing full batches over on the way.
    /// Returns how many messages it took.
    fn pass(&mut self, timeout_ms: i32, finishing: bool) -> std::io::Result<usize> {
        let began_ns = self.wait(timeout_ms, finishing)?;
        let mut got = 0;
        loop {
            let (n, complete) = self.read_ready(finishing, usize::MAX);
            got += n;
            if complete {
                self.read_to = Some(began_ns);
                return Ok(got);
            }
            if !self.out.flush(&self.ev) {
                return Ok(got);
            }
        }
    }

    /// The sender's pass between two sends: one read of each queue of
    /// each socket, so that a flood at a probe socket costs the sender a
    /// bounded time per tick and never its schedule; the rest is read at
    /// the next ticks (the mark moves once a pass has read everything).
    fn pass_between_sends(&mut self) -> std::io::Result<usize> {
        let began_ns = self.wait(0, false)?;
        let (n, complete) = self.read_ready(false, 1);
        if complete {
            self.read_to = Some(began_ns);
        }
        Ok(n)
    }

    /// Waits and reads until `done`, in short waits once `pause` says the
    /// round ends; the last pass, once `done`, reads without waiting until
    /// nothing is left. Then the mark ends.
    pub(super) fn run(&mut self, done: &AtomicBool, pause: &(dyn Fn() -> bool + Sync)) {
        loop {
            let finishing = done.load(Ordering::Relaxed);
            let wait_ms = match (finishing, pause()) {
                (true, _) => 0,
                (false, true) => self.out.wait_ms(clock::monotonic_ns(), 1),
                (false, false) => self.out.wait_ms(clock::monotonic_ns(), 20),
            };
            let got = match self.pass(wait_ms, finishing) {
                Ok(n) => n,
                Err(e) => {
                    log::warn!("probe I/O poll: {e}");
                    break;
                }
            };
            let now = clock::monotonic_ns();
            if (finishing || self.out.due(now) || self.out.len() == 0) && !self.hand_over() {
                break;
            }
            if finishing && got == 0 {
                break;
            }
        }
        self.hand_over();
        self.mark.end();
    }

    /// What this thread saw of its own timing since it began to read.
    pub(super) fn timing(&self) -> ReaderTiming {
        ReaderTiming {
            read_delay_ns: Latency::from_hist(&self.sender.read_delay),
            waits: Some(self.start.since(&cpu_wait::Snapshot::now())),
        }
    }
}

impl pacer::Handover for Io<'_, '_> {
    fn batch(&mut self) -> &mut EventBatch {
        &mut self.out
    }

    fn between_sends(&mut self) {
        if let Err(e) = self.pass_between_sends() {
            log::debug!("probe sockets: {e}");
        }
    }

    /// Hands the events over, then moves the mark to the newest complete
    /// pass they cover.
    fn hand_over(&mut self) -> bool {
        if !self.out.flush(&self.ev) {
            return false;
        }
        if let Some(t) = self.read_to.take() {
            self.mark.publish(t);
        }
        true
    }
}

/// A reader that stops reading (its thread ended, or panicked) never
/// holds the collector's timeouts back.
impl Drop for Io<'_, '_> {
    fn drop(&mut self) {
        self.mark.end();
    }
}

/// Many sockets waited on at once through one epoll set, registered once:
/// poll() walked all of them in the kernel on every wake-up, which was
/// half the CPU of a run with 1000 targets at 10 probes/s each.
struct ReadySet {
    ep: std::os::fd::OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl ReadySet {
    fn new(socks: &[&ProbeSocket]) -> std::io::Result<Self> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: plain syscall; the fd is owned below.
        let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new fd nobody else owns.
        let ep = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        for (i, s) in socks.iter().enumerate() {
            // Level-triggered, as poll(): EPOLLERR (a TX timestamp on the
            // error queue) is always reported.
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: i as u64,
            };
            // SAFETY: both fds are open; `ev` is a valid event.
            if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, s.fd(), &mut ev) } < 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        let events = vec![libc::epoll_event { events: 0, u64: 0 }; socks.len()];
        Ok(Self { ep, events })
    }

    /// Like [`socket::poll_ready`]: the indexes of the sockets that have
    /// data or queued timestamps, in ascending order.
    fn wait(&mut self, timeout_ms: i32, ready: &mut Vec<usize>) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        ready.clear();
        // SAFETY: `events` holds `len` writable events.
        let n = unsafe {
            libc::epoll_wait(
                self.ep.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as i32,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        ready.extend(self.events[..n as usize].iter().map(|e| e.u64 as usize));
        ready.sort_unstable();
        Ok(())
    }
}

/// Sender side of one pass: TX timestamps from the error queue and the
/// echoes, each judged by `rules`. Returns how many messages it took, and
/// whether both queues were emptied (each gave less than a full batch:
/// all they held when the pass began is read).
fn drain_sender(
    s: &Session<'_>,
    rules: &EchoRules<'_>,
    tag: u32,
    bufs: &mut SenderBufs,
    out: &mut EventBatch,
) -> (usize, bool) {
    let now = clock::monotonic_ns();
    let n_err = s.sock.recv_batch(&mut bufs.errq, true).unwrap_or(0);
    for i in 0..n_err {
        let (_, _, c) = bufs.errq.get(i);
        if let Some((opt_id, kind, ts_ns)) = c.tx_stamp() {
            out.push(
                tag,
                Event::TxTimestamp {
                    opt_id,
                    kind,
                    ts_ns,
                },
                now,
            );
        }
    }
    let n = s.sock.recv_batch(&mut bufs.batch, false).unwrap_or(0);
    let read_ns = clock::realtime_ns();
    // Read after the datagrams: every probe sent before them is below it.
    let sent_end = rules.issued.load(Ordering::SeqCst);
    bufs.seen.clear();
    for i in 0..n {
        let (payload, src, c) = bufs.batch.get(i);
        match rules.judge(payload, src, sent_end) {
            Verdict::Probe(e) => {
                bufs.seen.push(e);
                if let Some(rx_ns) = c.sw_ns {
                    let delay_ns = read_ns.saturating_sub(rx_ns).max(1) as u64;
                    bufs.read_delay.saturating_record(delay_ns);
                }
                out.push(
                    tag,
                    Event::Echoed {
                        seq: e.seq,
                        sw_ns: c.sw_ns,
                        hw_ns: c.hw_ns,
                        user_ns: read_ns,
                        reflector: e.times,
                    },
                    now,
                );
            }
            Verdict::WarmUp(e) => bufs.seen.push(e),
            Verdict::Foreign => out.push(tag, Event::Foreign, now),
            Verdict::NeverSent => out.push(tag, Event::NeverSent, now),
        }
    }
    if let Some(f) = s.on_echoes
        && !bufs.seen.is_empty()
    {
        f(&bufs.seen);
    }
    let drained = n_err < bufs.errq.capacity() && n < bufs.batch.capacity();
    (n + n_err, drained)
}

/// The in-process reflector's reusable buffers.
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

impl ReflectBufs {
    fn new() -> Self {
        Self {
            batch: RecvBatch::new(64, 65536),
            errq: RecvBatch::new(64, 256),
            echo: Vec::with_capacity(64),
            ids: Vec::with_capacity(64),
            arrivals: Vec::with_capacity(64),
            // No rate limit: the testbed's own probes may come at any rate.
            core: reflect::Core::new(reflect::Policy::unlimited(
                crate::probe::wire::ProtocolArg::Rtprobe,
            )),
        }
    }
}

/// The leg a receiver socket serves: its session, its probes tried so
/// far, and the tag of its events.
struct Reflected<'l> {
    session: u64,
    issued: &'l AtomicU64,
    tag: u32,
}

/// Receiver side of one pass: takes the probes queued at the receiver
/// socket, echoes them all with one sendmmsg (each echo's TX timestamp
/// carrying the probe's seq as OPT_ID), records their arrival, and collects
/// echo TX timestamps. Returns how many messages it took, and whether it
/// emptied the socket's receive queue.
fn reflect_queued(
    rx: &ProbeSocket,
    bufs: &mut ReflectBufs,
    leg: Reflected<'_>,
    finishing: bool,
    out: &mut EventBatch,
) -> (usize, bool) {
    let Reflected {
        session,
        issued,
        tag,
    } = leg;
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
            return (0, true);
        }
    };
    let now = clock::realtime_ns();
    let age_ns = clock::monotonic_ns();
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
                    out.push(tag, Event::NeverSent, age_ns);
                }
            }
            (reflect::Verdict::Reply { .. }, Err(_)) => {
                // Another run's probe: answered, as any reflector would.
                echo.push(i);
                ids.push(u32::MAX - 2);
                out.push(tag, Event::Foreign, age_ns);
            }
            (reflect::Verdict::Drop(_), Ok(_)) => {}
            (reflect::Verdict::Drop(_), Err(_)) => out.push(tag, Event::Foreign, age_ns),
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
            tag,
            Event::Arrived {
                seq,
                sw_ns,
                hw_ns,
                user_ns: now,
                echo_send_ns,
            },
            age_ns,
        );
    }
    // On veth the echoes' TX stamps are queued by now; elsewhere they are
    // picked up after a later echo, or when the run ends.
    let n_err = if !echo.is_empty() || finishing {
        collect_echo_stamps(rx, errq, (tag, age_ns), out)
    } else {
        0
    };
    (n + n_err, n < batch.capacity())
}

/// Takes the echoes' TX stamps queued at the receiver socket. Each echo
/// queues two stamps (SCHED and the driver's): the queue is drained to
/// empty, else it grows past the receive buffer and the kernel drops
/// stamps. Returns how many messages it took.
fn collect_echo_stamps(
    rx: &ProbeSocket,
    errq: &mut RecvBatch,
    (tag, age_ns): (u32, i64),
    out: &mut EventBatch,
) -> usize {
    let mut n_err = 0;
    loop {
        let got = rx.recv_batch(errq, true).unwrap_or(0);
        if rx.per_send_opt_id() {
            for i in 0..got {
                let (_, _, c) = errq.get(i);
                if let Some((opt_id, kind, ts_ns)) = c.tx_stamp() {
                    out.push(
                        tag,
                        Event::EchoTx {
                            opt_id,
                            kind,
                            ts_ns,
                        },
                        age_ns,
                    );
                }
            }
        }
        n_err += got;
        if got < errq.capacity() {
            break;
        }
    }
    n_err
}

#[cfg(test)]
#[path = "io_tests.rs"]
mod tests;
