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
        let first = &legs[0];
        // Nobody sleeps on a sender's socket while probes go out: a thread
        // asleep there is woken by every TX stamp from inside the send (the
        // sending CPU wakes it, with an IPI where it sleeps on another
        // one), and on veth by the echo, before its RX stamp. The sender
        // reads its socket itself between sends; only once the last probe
        // is out does its loop wait on it. The in-process reflector's I/O
        // thread waits on the receiver's socket, as any reflector does,
        // and reads the sender's right after each echo (on veth the echo
        // and the stamps are queued by then).
        let polled: Vec<&ProbeSocket> = match (first.s.echo_side.receiver(), by) {
            (Some(rx), ReadBy::IoThread) => vec![rx],
            (Some(rx), ReadBy::Sender) => vec![rx, first.s.sock],
            (None, _) => legs.iter().map(|l| l.s.sock).collect(),
        };
        let remote = first.s.echo_side.receiver().is_none();
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
        let first = &self.legs[0];
        let mut reflector_left = self.reflect.is_some();
        let mut got = 0;
        for _ in 0..rounds {
            let mut n = 0;
            if reflector_left
                && let (Some((sock, session)), Some(b)) =
                    (first.s.echo_side.receiver_session(), self.reflect.as_mut())
            {
                let (k, drained) =
                    reflect_queued(sock, b, session, &first.attempts, finishing, &mut self.out);
                n += k;
                reflector_left = !drained;
            }
            let (legs, rules) = (self.legs, &self.rules);
            let (sender, out) = (&mut self.sender, &mut self.out);
            self.ready.retain(|&i| {
                let (k, drained) = drain_sender(&legs[i].s, &rules[i], i as u32, sender, out);
                n += k;
                !drained
            });
            got += n;
            if !reflector_left && self.ready.is_empty() {
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

/// Receiver side of one pass: takes the probes queued at the receiver
/// socket, echoes them all with one sendmmsg (each echo's TX timestamp
/// carrying the probe's seq as OPT_ID), records their arrival, and collects
/// echo TX timestamps. Returns how many messages it took, and whether it
/// emptied the socket's receive queue.
fn reflect_queued(
    rx: &ProbeSocket,
    bufs: &mut ReflectBufs,
    session: u64,
    issued: &AtomicU64,
    finishing: bool,
    out: &mut EventBatch,
) -> (usize, bool) {
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
                    out.push(0, Event::NeverSent, age_ns);
                }
            }
            (reflect::Verdict::Reply { .. }, Err(_)) => {
                // Another run's probe: answered, as any reflector would.
                echo.push(i);
                ids.push(u32::MAX - 2);
                out.push(0, Event::Foreign, age_ns);
            }
            (reflect::Verdict::Drop(_), Ok(_)) => {}
            (reflect::Verdict::Drop(_), Err(_)) => out.push(0, Event::Foreign, age_ns),
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
            0,
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
        collect_echo_stamps(rx, errq, age_ns, out)
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
    age_ns: i64,
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
                        0,
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
mod tests {
    use std::{sync::atomic::AtomicU8, time::Duration};

    use super::*;
    use crate::{
        model::record::ProbeRecord,
        probe::{
            ProbeConfig, TimestampSource,
            engine::{
                Collecting, EchoSide, LegOut,
                collect::{HwSetup, collect},
            },
            matcher::NoHwClocks,
            socket::TsFlags,
            wire::Wire,
        },
        stats::RunStats,
        stats::observer::NoObserver,
    };

    /// The records a session wrote.
    #[derive(Default)]
    struct Rows(Vec<ProbeRecord>);

    impl crate::model::record::RecordSink for Rows {
        fn write(&mut self, r: &ProbeRecord) -> anyhow::Result<()> {
            self.0.push(r.clone());
            Ok(())
        }
        fn flush(&mut self) -> anyhow::Result<()> {
            Ok(())
        }
    }

    fn cfg(timeout: Duration) -> ProbeConfig {
        ProbeConfig {
            size: 64,
            interval: Duration::from_millis(10),
            count: Some(1),
            duration: None,
            tos: 0,
            port: 9,
            timestamps: TimestampSource::Software,
            timeout,
            flow: 0,
            spin: None,
            busy_poll: false,
            no_warm_up: false,
            rt: Default::default(),
            kernel_reflector: true,
        }
    }

    /// Runs the collector over one probe sent now, whose echo the kernel
    /// took 1 ms later, while a reader that was kept from reading for
    /// `stall` hands the echo over (`echo`) and moves its mark. Returns
    /// the statistics.
    fn collect_with_a_stalled_reader(stall: Duration, echo: bool) -> RunStats {
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
        let wire = Wire::Rtprobe {
            session: 7,
            flow: 0,
        };
        let legs = [Leg {
            s: Session {
                sock: &sock,
                dst: "127.0.0.1:9".parse().unwrap(),
                wire: &wire,
                echo_side: EchoSide::Remote,
                on_echoes: None,
                foreign_before: 0,
            },
            cfg: cfg(Duration::from_millis(50)),
            attempts: AtomicU64::new(1),
            anchor_ns: None,
        }];
        let (tx, rx) = mpsc::channel();
        let mark = ReadMark::new();
        let sent_ns = clock::realtime_ns();
        let sent = Event::Sent {
            seq: 0,
            opt_id: 0,
            sched_ns: sent_ns,
            send_ns: sent_ns,
        };
        tx.send(vec![(0, sent)]).unwrap();
        mark.publish(sent_ns);
        let finished = AtomicBool::new(false);
        let (stop, mut rows, mut observer) = (AtomicU8::new(0), Rows::default(), NoObserver);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                std::thread::sleep(stall);
                if echo {
                    let e = Event::Echoed {
                        seq: 0,
                        sw_ns: Some(sent_ns + 1_000_000),
                        hw_ns: None,
                        user_ns: clock::realtime_ns(),
                        reflector: None,
                    };
                    tx.send(vec![(0, e)]).unwrap();
                }
                mark.publish(clock::realtime_ns());
                finished.store(true, Ordering::SeqCst);
            });
            let c = Collecting {
                legs: &legs,
                carried: Vec::new(),
                pause: &|| false,
                read: &mark,
            };
            let hw = HwSetup {
                echo_stamps: false,
                sender_tx: false,
                receiver_tx: false,
                clocks: Box::new(NoHwClocks),
            };
            let mut outs = [LegOut {
                csv: &mut rows,
                observer: &mut observer,
            }];
            let done = || finished.load(Ordering::SeqCst);
            let d = collect(&rx, c, hw, &mut outs, &stop, &done).unwrap();
            let mut got = d.finished().unwrap();
            got.pop().unwrap().0
        })
    }

    #[test]
    fn a_reader_kept_from_a_cpu_past_the_timeout_loses_no_probe() {
        // Four timeouts without a read: the record waits, the echo counts.
        let s = collect_with_a_stalled_reader(Duration::from_millis(200), true);
        let c = s.counts();
        assert_eq!((c.received, c.lost, c.late_echoes), (1, 0, 0), "{c:?}");
        // The reader read past the timeout and saw no echo: lost.
        let s = collect_with_a_stalled_reader(Duration::from_millis(200), false);
        let c = s.counts();
        assert_eq!((c.received, c.lost), (0, 1), "{c:?}");
    }

    #[test]
    fn the_mark_only_moves_forward_and_ends_at_the_end() {
        let m = ReadMark::new();
        m.publish(100);
        m.publish(50);
        assert_eq!(m.until_ns(), 100);
        m.end();
        assert_eq!(m.until_ns(), i64::MAX);
    }

    fn plain_socket() -> ProbeSocket {
        let no_stamps = TsFlags {
            tx: false,
            rx: false,
            hardware: false,
        };
        // Room for a few hundred small datagrams.
        ProbeSocket::bind("127.0.0.1:0".parse().unwrap(), 0, no_stamps, 1 << 20).unwrap()
    }

    /// A sender's socket connected to a peer on loopback, and the peer
    /// (which knows the sender's address once it has its first datagram).
    fn connected_pair() -> (ProbeSocket, std::net::UdpSocket, std::net::SocketAddr) {
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer_addr = peer.local_addr().unwrap();
        let sock = plain_socket();
        sock.connect(peer_addr).unwrap();
        sock.send_to(&[0u8; 64], peer_addr, 0).unwrap();
        let mut buf = [0u8; 64];
        let (_, sender_addr) = peer.recv_from(&mut buf).unwrap();
        (sock, peer, sender_addr)
    }

    fn remote_leg<'a>(sock: &'a ProbeSocket, dst: std::net::SocketAddr, wire: &'a Wire) -> Leg<'a> {
        Leg {
            s: Session {
                sock,
                dst,
                wire,
                echo_side: EchoSide::Remote,
                on_echoes: None,
                foreign_before: 0,
            },
            cfg: cfg(Duration::from_millis(50)),
            attempts: AtomicU64::new(1),
            anchor_ns: None,
        }
    }

    #[test]
    fn between_sends_reads_the_echo_and_the_mark_moves_once_it_is_handed_over() {
        let (sock, peer, sender_addr) = connected_pair();
        let wire = Wire::Rtprobe {
            session: 7,
            flow: 0,
        };
        // The echo of probe 0, from the address probed.
        let (mut echo, mut scratch) = (vec![0u8; 64], Vec::new());
        wire.encode(0, clock::realtime_ns(), false, &mut echo, &mut scratch);
        echo[5] |= crate::probe::packet::FLAG_ECHO;
        peer.send_to(&echo, sender_addr).unwrap();
        let legs = [remote_leg(&sock, peer.local_addr().unwrap(), &wire)];
        let (tx, rx) = mpsc::channel();
        let mark = ReadMark::new();
        let mut io = Io::new(&legs, tx, &mark, ReadBy::Sender);
        // Loopback delivers within the send; give a loaded machine time.
        let before_ns = clock::realtime_ns();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while io.batch().len() == 0 && std::time::Instant::now() < deadline {
            io.between_sends();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(io.batch().len(), 1, "the echo read without a wait");
        assert!(
            rx.try_recv().is_err(),
            "nothing handed over before hand_over"
        );
        assert_eq!(mark.until_ns(), i64::MIN, "the mark waits for the events");
        assert!(io.hand_over());
        let got = rx.try_recv().unwrap();
        assert!(
            matches!(got[..], [(0, Event::Echoed { seq: 0, .. })]),
            "{got:?}"
        );
        assert!(mark.until_ns() >= before_ns, "the mark covers the read");
        drop(io);
        assert_eq!(
            mark.until_ns(),
            i64::MAX,
            "a reader that ends ends the mark"
        );
    }

    #[test]
    fn a_flood_is_read_a_batch_per_send_and_the_mark_waits_for_the_rest() {
        let (sock, peer, sender_addr) = connected_pair();
        let wire = Wire::Rtprobe {
            session: 7,
            flow: 0,
        };
        // 150 datagrams from the target: more than one read takes (64).
        for i in 0..150u8 {
            peer.send_to(&[i; 40], sender_addr).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        let legs = [remote_leg(&sock, peer.local_addr().unwrap(), &wire)];
        let (tx, rx) = mpsc::channel();
        let mark = ReadMark::new();
        let mut io = Io::new(&legs, tx, &mark, ReadBy::Sender);
        let mut reads = Vec::new();
        while mark.until_ns() == i64::MIN && reads.len() < 10 {
            io.between_sends();
            // Foreign datagrams: one event each.
            reads.push(io.batch().len());
            io.hand_over();
        }
        assert_eq!(
            reads,
            [64, 64, 22],
            "a batch per send; the mark moved at the last"
        );
        assert_eq!(rx.try_iter().map(|b| b.len()).sum::<usize>(), 150);
    }

    #[test]
    fn only_the_in_process_reflectors_thread_waits_and_never_on_the_sender() {
        let (tx_sock, rx_sock) = (plain_socket(), plain_socket());
        let wire = Wire::Rtprobe {
            session: 7,
            flow: 0,
        };
        let dst = "127.0.0.1:9".parse().unwrap();
        let fds = |legs: &[Leg<'_>], by| {
            let (ev, _) = mpsc::channel();
            let mark = ReadMark::new();
            let io = Io::new(legs, ev, &mark, by);
            io.polled.iter().map(|s| s.fd()).collect::<Vec<_>>()
        };
        let mut leg = remote_leg(&tx_sock, dst, &wire);
        leg.s.echo_side = EchoSide::InProcess {
            sock: &rx_sock,
            session: 7,
        };
        // The reflector's thread waits for probes, on the receiver's socket only.
        assert_eq!(fds(&[leg], ReadBy::IoThread), [rx_sock.fd()]);
        // Where the sender reads, its loop waits on both once it has sent all.
        let mut leg = remote_leg(&tx_sock, dst, &wire);
        leg.s.echo_side = EchoSide::Kernel {
            sock: &rx_sock,
            session: 7,
        };
        assert_eq!(fds(&[leg], ReadBy::Sender), [rx_sock.fd(), tx_sock.fd()]);
        let leg = remote_leg(&tx_sock, dst, &wire);
        assert_eq!(fds(&[leg], ReadBy::Sender), [tx_sock.fd()]);
    }
}
