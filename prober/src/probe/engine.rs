//! The one probe-session engine every run goes through: the self-built
//! testbed and the NIC pair (sender and receiver in their namespaces) as
//! well as a reflector that is not ours to drive (`--target`, or STAMP
//! through the testbed). What varies is at its edges: the sender's socket
//! and the wire format (rtprobe or STAMP), and who answers ([`Reflector`]).
//!
//! ```text
//!  [pacer] --probe--> (path) --> reflector: in-process | kernel | remote
//!     |                                  |
//!     | Sent        [io: TX stamps, echoes judged by EchoRules] <--echo--+
//!     +------> [collector: Matcher] <----+ -> CSV rows, RunStats
//! ```
//!
//! One I/O thread serves both ends where the reflector is ours: one wake-up
//! echoes at the receiver and collects the echo and TX timestamps at the
//! sender (on a 2-core VM wake-ups, not packets, are what a probe costs).
//!
//! Kernel interfaces: UDP sockets with SO_TIMESTAMPING, poll(2),
//! recvmmsg/sendmmsg (see [`super::socket`]).

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering},
        mpsc,
    },
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{
    HwSetup, ProbeConfig, RecordSink, STOP_SENDING, SessionObserver, clock, collect_and_join,
    events::{self, EventBatch},
    matcher::{EchoRules, Event, Verdict},
    pacer,
    packet::{FLAG_ECHO, Probe},
    reflect::{self, FLAG_WARMUP},
    socket::{self, ProbeSocket, RecvBatch},
    wire::{Echo, WARMUP_SEQ, Wire},
};
use crate::stats::RunStats;

/// Who answers the probes.
pub(crate) enum Reflector<'a> {
    /// rtprobe's reflector in this process, at the receiver's socket
    /// (its namespace), for the probes of `session`.
    InProcess { sock: &'a ProbeSocket, session: u64 },
    /// rtprobe's in-kernel reflector (XDP) at the receiver. Its probes
    /// never reach `sock` (the receiver's); what it passes up (another
    /// run's datagrams) does, and is read and counted there as
    /// [`Reflector::InProcess`] would.
    Kernel { sock: &'a ProbeSocket, session: u64 },
    /// Another process or host: only the sender's socket sees anything.
    Remote,
}

/// Notes what a batch of accepted echoes said (the remote run's ledger).
pub(crate) type EchoNote<'a> = dyn Fn(&[Echo]) + Sync + 'a;

/// One session as the engine runs it.
pub(crate) struct Session<'a> {
    /// The sender's socket: probes out, TX stamps and echoes in.
    pub sock: &'a ProbeSocket,
    /// Where the probes go, and the only source echoes are taken from.
    pub dst: SocketAddr,
    pub wire: &'a Wire,
    pub reflector: Reflector<'a>,
    /// Sees what the accepted echoes (the warm-up's late ones too) said.
    pub on_echoes: Option<&'a EchoNote<'a>>,
    /// Datagrams on the probe port during the warm-up, counted as foreign.
    pub foreign_before: u64,
}

/// The statistics, late arrivals and first failed output of a session.
pub(crate) type Collected = (RunStats, u64, Option<String>);

/// One target of a session: a testbed's one, or each remote reflector of
/// `--target`/`--targets`. Each has its own socket (connected: the kernel
/// drops datagrams of other sources), sequence space and probe options.
pub(crate) struct Leg<'a> {
    pub s: Session<'a>,
    pub cfg: ProbeConfig,
    /// Probes tried so far (the first seq not yet sent): the pacer counts
    /// them, the echo rules refuse echoes at or above it.
    pub attempts: AtomicU64,
    /// Its first probe goes this long after the run's start (the targets
    /// are spread over the interval).
    pub phase_ns: i64,
}

impl<'a> Leg<'a> {
    /// The one leg of a session with one target.
    pub fn one(s: Session<'a>, cfg: &ProbeConfig) -> Self {
        Self {
            s,
            cfg: cfg.clone(),
            attempts: AtomicU64::new(0),
            phase_ns: 0,
        }
    }
}

/// Where one leg's records go.
pub(crate) struct LegOut<'a> {
    pub csv: &'a mut dyn RecordSink,
    pub observer: &'a mut dyn SessionObserver,
}

/// One round of a session: all of it, or the part between two reloads of
/// a targets file (the legs that did not change go on in the next round
/// with their collectors, sequence numbers and sockets).
pub(crate) struct Round<'a> {
    /// No probe is scheduled at or after this CLOCK_MONOTONIC time (the
    /// run's end over reloads; None: `--duration` from the round's start).
    pub end_mono_ns: Option<i64>,
    /// The round ends, its collectors kept, once this says so.
    pub pause: &'a (dyn Fn() -> bool + Sync),
    /// Each leg's collector from the round before (None: a new leg).
    pub carried: Vec<Option<super::Collector>>,
}

impl Round<'_> {
    /// A whole session: it ends by the first leg's count or duration.
    pub fn whole() -> Round<'static> {
        Round {
            end_mono_ns: None,
            pause: &|| false,
            carried: Vec::new(),
        }
    }
}

/// How a round ended.
pub(crate) enum Driven {
    /// Every probe is sent and accounted for (or a stop said so): per leg
    /// its statistics, late arrivals and first failed output.
    Finished(Vec<Collected>),
    /// Paused for a reload: per leg its collector, probes in flight kept.
    Paused(Vec<super::Collector>),
}

impl Driven {
    /// The statistics of a round that cannot pause.
    pub fn finished(self) -> Result<Vec<Collected>> {
        match self {
            Driven::Finished(c) => Ok(c),
            Driven::Paused(_) => bail!("internal: a session paused without a reload"),
        }
    }
}

/// Runs the session's threads: the I/O thread, the paced sender (one for
/// every leg) and the calling thread collecting records until every probe
/// is accounted for, `stop` says so, or the round pauses. The first leg's
/// options give what the legs share (count, real-time settings).
pub(crate) fn drive(
    legs: &[Leg<'_>],
    hw: HwSetup,
    outs: &mut [LegOut<'_>],
    stop: &AtomicU8,
    round: Round<'_>,
) -> Result<Driven> {
    let cfg = &legs
        .first()
        .context("internal: a session without a target")?
        .cfg;
    let done = AtomicBool::new(false);
    let (ev_tx, ev_rx) = mpsc::channel::<Vec<events::Tagged>>();
    for (i, l) in legs.iter().enumerate() {
        if l.s.foreign_before > 0 {
            let _ = ev_tx.send(vec![
                (i as u32, Event::Foreign);
                l.s.foreign_before as usize
            ]);
        }
    }
    let (done_ref, pause) = (&done, round.pause);
    let end_ns = round.end_mono_ns;
    std::thread::scope(|sc| {
        let ev = ev_tx.clone();
        let io = std::thread::Builder::new()
            .name("rtprobe-io".into())
            .spawn_scoped(sc, move || {
                pacer::share_fifo_priority(&cfg.rt);
                io_loop(legs, done_ref, &ev)
            })
            .context("spawn the probe I/O thread")?;
        let run = (|| {
            let ev = ev_tx.clone();
            let sender = std::thread::Builder::new()
                .name("rtprobe-sender".into())
                .spawn_scoped(sc, move || {
                    let pace: Vec<pacer::PaceLeg<'_>> = legs
                        .iter()
                        .map(|l| pacer::PaceLeg {
                            sock: l.s.sock,
                            dst: l.s.dst,
                            size: l.cfg.size,
                            interval_ns: l.cfg.interval.as_nanos() as i64,
                            phase_ns: l.phase_ns,
                            attempts: &l.attempts,
                        })
                        .collect();
                    let mut scratch = Vec::with_capacity(cfg.size);
                    let until = pacer::Until {
                        end_ns,
                        stop,
                        pause,
                    };
                    pacer::pace_with(&pace, cfg, &until, &ev, &mut |leg, seq, send_ns, buf| {
                        legs[leg]
                            .s
                            .wire
                            .encode(seq, send_ns, false, buf, &mut scratch)
                    })
                })
                .context("spawn sender thread")?;
            let c = Collecting {
                legs,
                carried: round.carried,
                pause,
            };
            collect_and_join(&ev_rx, c, hw, outs, stop, sender)
        })();
        done_ref.store(true, Ordering::SeqCst);
        let _ = io.join();
        // A paused round's last echoes and stamps go to the collectors kept.
        let mut run = run;
        if let Ok(Driven::Paused(cs)) = &mut run {
            while let Ok(evs) = ev_rx.try_recv() {
                super::route(cs, evs);
            }
        }
        run
    })
}

/// What the collector of a round works with.
pub(crate) struct Collecting<'l, 'a> {
    pub legs: &'l [Leg<'a>],
    pub carried: Vec<Option<super::Collector>>,
    pub pause: &'l (dyn Fn() -> bool + Sync),
}

/// Receive buffer of one datagram during a warm-up or status probe.
pub(crate) const WARM_UP_BUF_BYTES: usize = 2048;

/// What a warm-up found.
pub(crate) struct WarmedUp {
    /// The answer (None: stopped before one came).
    pub echo: Option<Echo>,
    /// Datagrams of other sessions at a testbed's receiver meanwhile.
    pub foreign: u64,
}

/// Sends warm-up probes every 100 ms until one is answered (3 s at most):
/// resolves neighbours on every hop before the run and proves that
/// something answers at all. Any stop request ends it: it is set-up, and a
/// run stopped before probing sends nothing (`echo` is None then).
pub(crate) fn warm_up(s: &Session<'_>, size: usize, stop: &AtomicU8) -> Result<WarmedUp> {
    let w = exchange(s, size, WARMUP_SEQ, stop, STOP_SENDING, 30)?;
    if w.echo.is_some() {
        let foreign = settle(s)?;
        return Ok(WarmedUp {
            echo: w.echo,
            foreign: w.foreign + foreign,
        });
    }
    if stop.load(Ordering::SeqCst) != 0 {
        return Ok(w);
    }
    let dst = s.dst;
    match (&s.reflector, s.wire) {
        (Reflector::Remote, wire) => {
            let auth = match wire {
                Wire::Stamp { key: Some(_), .. } => " and holds the same --auth-key",
                _ => "",
            };
            let what = match wire {
                Wire::Rtprobe { .. } => "`rtprobe reflect`",
                Wire::Stamp { .. } => "a STAMP reflector (`rtprobe reflect --protocol stamp`)",
            };
            bail!(
                "no answer from {dst} within 3 s: check that {what} runs there on that port{auth}, and that no firewall drops UDP"
            )
        }
        _ => bail!(
            "no warm-up probe came back from {dst} within 3 s: the path through the testbed is broken (run with -v for details, check `ip netns` and XDP counters)"
        ),
    }
}

/// The receiver's socket where the reflector is ours, and its session.
fn testbed_receiver<'a>(s: &Session<'a>) -> Option<(&'a ProbeSocket, u64)> {
    match s.reflector {
        Reflector::InProcess { sock, session } | Reflector::Kernel { sock, session } => {
            Some((sock, session))
        }
        Reflector::Remote => None,
    }
}

/// Sends warm-up-marked probe `seq` up to `tries` times, 100 ms apart, and
/// returns the first answer to it. Where the reflector is ours it echoes
/// warm-ups itself (the I/O thread is not running yet); with the in-kernel
/// reflector the kernel answers first and the receiver's socket sees only
/// others' datagrams, which are counted. Gives up, sending nothing more,
/// once the stop level reaches `give_up_at`. On a testbed a failed send or
/// receive is an error (nothing else explains it); towards a remote
/// reflector the next try follows.
pub(crate) fn exchange(
    s: &Session<'_>,
    size: usize,
    seq: u64,
    stop: &AtomicU8,
    give_up_at: u8,
    tries: u32,
) -> Result<WarmedUp> {
    let receiver = testbed_receiver(s);
    let strict = receiver.is_some();
    let mut buf = vec![0u8; size];
    let mut scratch = Vec::with_capacity(size);
    // Room for any echo (at most a 1500-byte MTU's payload; a longer
    // foreign datagram is cut, and counted all the same): a warm-up per
    // target of a thousand allocates 16 x this.
    let mut batch = RecvBatch::new(16, size.max(WARM_UP_BUF_BYTES));
    let mut foreign = 0u64;
    let given_up = || stop.load(Ordering::SeqCst) >= give_up_at;
    let mut polled = vec![s.sock];
    polled.extend(receiver.map(|(rx, _)| rx));
    for _ in 0..tries {
        if given_up() {
            break;
        }
        s.wire
            .encode(seq, clock::realtime_ns(), true, &mut buf, &mut scratch);
        if let Err(e) = s.sock.send_to(&buf, s.dst, u32::MAX - 1) {
            if strict {
                return Err(e).with_context(|| format!("send warm-up probe to {}", s.dst));
            }
            log::debug!("warm-up send to {}: {e}", s.dst);
        }
        let until = clock::realtime_ns() + 100_000_000;
        while clock::realtime_ns() < until && !given_up() {
            let polled_ok = socket::poll_any(&polled, 10);
            if strict {
                polled_ok?;
            }
            if let Some((rx, session)) = receiver {
                foreign += echo_warm_ups(rx, &mut batch, session)?;
            }
            let echo = answer_at_sender(s, &mut batch, seq, strict)?;
            if echo.is_some() {
                return Ok(WarmedUp { echo, foreign });
            }
        }
    }
    Ok(WarmedUp {
        echo: None,
        foreign,
    })
}

/// The reflector's part of a testbed warm-up: echoes the warm-up probes of
/// `session` queued at `rx` and throws their TX stamps away. Returns how
/// many datagrams of other sessions it saw.
fn echo_warm_ups(rx: &ProbeSocket, batch: &mut RecvBatch, session: u64) -> Result<u64> {
    let mut foreign = 0;
    let n = rx.recv_batch(batch, false)?;
    let mut echo = Vec::new();
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
        rx.send_back(batch, &echo, &ids)
            .context("echo a warm-up probe")?;
        while rx.recv_batch(batch, true)? > 0 {}
    }
    Ok(foreign)
}

/// The sender's part: throws the warm-up's TX stamps away and returns the
/// answer to probe `seq`, if it came.
fn answer_at_sender(
    s: &Session<'_>,
    batch: &mut RecvBatch,
    seq: u64,
    strict: bool,
) -> Result<Option<Echo>> {
    let recv = |batch: &mut RecvBatch, errq: bool| match s.sock.recv_batch(batch, errq) {
        Err(e) if strict => Err(e),
        r => Ok(r.unwrap_or(0)),
    };
    while recv(batch, true)? > 0 {}
    let n = recv(batch, false)?;
    for i in 0..n {
        let (payload, src, _) = batch.get(i);
        if socket::same_endpoint(src, s.dst)
            && let Some(e) = s.wire.decode(payload)
            && e.warmup
            && e.seq == seq
        {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// Lets late duplicates and the warm-up's TX stamps drain after its answer.
/// Returns how many datagrams of other sessions came to a testbed's receiver.
fn settle(s: &Session<'_>) -> Result<u64> {
    std::thread::sleep(Duration::from_millis(20));
    let mut batch = RecvBatch::new(16, WARM_UP_BUF_BYTES);
    let mut foreign = 0;
    if let Some((rx, session)) = testbed_receiver(s) {
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
    }
    while s.sock.recv_batch(&mut batch, true).unwrap_or(0) > 0 {}
    while s.sock.recv_batch(&mut batch, false).unwrap_or(0) > 0 {}
    Ok(foreign)
}

/// The sender's reusable buffers.
struct SenderBufs {
    batch: RecvBatch,
    errq: RecvBatch,
    /// This wake-up's accepted echoes, for [`Session::on_echoes`].
    seen: Vec<Echo>,
}

/// The I/O thread: waits for probes at an in-process reflector (or for
/// echoes where the reflector is not ours), reflects them, drains the
/// sender's queues (both the error queue and data on every wake-up; a TX
/// timestamp left queued is charged to the receive buffer), and hands
/// events over in batches. With several targets it waits on all their
/// sockets at once and drains those that have something.
fn io_loop(legs: &[Leg<'_>], done: &AtomicBool, ev: &mpsc::Sender<Vec<events::Tagged>>) {
    let rules: Vec<EchoRules<'_>> = legs
        .iter()
        .map(|l| EchoRules {
            wire: l.s.wire,
            target: l.s.dst,
            issued: &l.attempts,
        })
        .collect();
    let first = &legs[0];
    let mut reflect = (!matches!(first.s.reflector, Reflector::Remote)).then(ReflectBufs::new);
    let mut sender = SenderBufs {
        batch: RecvBatch::new(64, 65536),
        errq: RecvBatch::new(64, 256),
        seen: Vec::with_capacity(64),
    };
    // Where the reflector is ours only the receiver's socket is waited on.
    // A thread sleeping on the sender's socket would be woken (a cross-core
    // IPI, costly on a VM) for every TX timestamp, inside the probe's own
    // send path, which would show in the one-way delay. With nobody waiting
    // there, the kernel only queues; the timestamp and (on veth,
    // synchronously during the echo's send) the echo are collected right
    // after the echo goes out, or at the next wake-up at the latest.
    // With the in-kernel reflector nothing arrives at the receiver's
    // socket, and waiting on the sender's would put a wake-up into every
    // probe's send path (above). The echoes' RX stamps are the kernel's
    // whenever they are read, so they are collected every millisecond (the
    // receive buffer, at least 32 MiB, holds far more).
    let (polled, max_wait_ms): (Vec<&ProbeSocket>, _) = match first.s.reflector {
        Reflector::InProcess { sock, .. } => (vec![sock], None),
        Reflector::Kernel { sock, .. } => (vec![sock], Some(1)),
        Reflector::Remote => (legs.iter().map(|l| l.s.sock).collect(), None),
    };
    let remote = matches!(first.s.reflector, Reflector::Remote);
    let cadence_ms = pickup_cadence_ms(legs);
    let (mut fds, mut ready) = (Vec::new(), Vec::new());
    let mut many = (polled.len() > 1)
        .then(|| ReadySet::new(&polled))
        .and_then(|r| {
            r.map_err(|e| log::debug!("epoll: {e}; poll() instead"))
                .ok()
        });
    let mut out = EventBatch::new();
    loop {
        let finishing = done.load(Ordering::Relaxed);
        let wait = if finishing {
            0
        } else {
            out.wait_ms(clock::realtime_ns(), 20)
        };
        let wait = max_wait_ms.map_or(wait, |m| wait.min(m));
        // On a cadence the thread sleeps on its own timer and then takes
        // whatever is ready without waiting: nothing wakes it from a send.
        let wait = match cadence_ms {
            Some(c) if wait > 0 => {
                let ms = wait.min(c);
                std::thread::sleep(std::time::Duration::from_millis(ms as u64));
                0
            }
            _ => wait,
        };
        let waited = match many.as_mut() {
            Some(set) => set.wait(wait, &mut ready),
            None => socket::poll_ready(&polled, wait, &mut fds, &mut ready),
        };
        if let Err(e) = waited {
            log::warn!("probe I/O poll: {e}");
            out.flush(ev);
            return;
        }
        // The testbed's one sender is drained on every wake-up (nobody
        // waits on it, above); remote targets when their socket is ready.
        if !remote || finishing {
            ready.clear();
            ready.extend(0..legs.len());
        }
        let mut got = 0;
        loop {
            let reflected = match (&first.s.reflector, reflect.as_mut()) {
                (
                    Reflector::InProcess { sock, session } | Reflector::Kernel { sock, session },
                    Some(b),
                ) => reflect_queued(sock, b, *session, &first.attempts, finishing, &mut out),
                _ => 0,
            };
            let mut n = reflected;
            ready.retain(|&i| {
                let k = drain_sender(&legs[i].s, &rules[i], i as u32, &mut sender, &mut out);
                n += k;
                k > 0
            });
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

/// Remote targets probed at this many probes/s in all, or more, are read
/// on a cadence rather than when something arrives.
pub(crate) const CADENCE_MIN_PPS: f64 = 1000.0;
/// The cadence: echoes, their kernel RX stamps and the TX stamps wait in
/// the sockets' queues at most this long (only `echo_user_ns` in the CSV
/// shows it; the receive buffers hold far more).
pub(crate) const CADENCE_MS: i32 = 1;

/// Whether the I/O thread reads remote targets' sockets every
/// [`CADENCE_MS`] instead of sleeping until one has something. A thread
/// asleep on a socket is woken (a cross-core IPI, costly on a VM) by every
/// TX timestamp queued there, inside the probe's own send path, where it
/// adds to the round trip, and once per echo: at 1000 targets x 10/s that
/// was 30 000 wake-ups/s. On a cadence nobody sleeps on the sockets.
/// Below [`CADENCE_MIN_PPS`] the wake-ups cost less than the cadence.
fn pickup_cadence_ms(legs: &[Leg<'_>]) -> Option<i32> {
    let remote = legs
        .first()
        .is_some_and(|l| matches!(l.s.reflector, Reflector::Remote));
    let pps: f64 = legs
        .iter()
        .map(|l| 1e9 / (l.cfg.interval.as_nanos().max(1) as f64))
        .sum();
    (remote && pps >= CADENCE_MIN_PPS).then_some(CADENCE_MS)
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

/// Sender side of one wake-up: TX timestamps from the error queue and the
/// echoes, each judged by `rules`. Returns how many messages it took.
fn drain_sender(
    s: &Session<'_>,
    rules: &EchoRules<'_>,
    tag: u32,
    bufs: &mut SenderBufs,
    out: &mut EventBatch,
) -> usize {
    let now = clock::realtime_ns();
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
    n + n_err
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
                crate::spec::remote::ProtocolArg::Rtprobe,
            )),
        }
    }
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
                    out.push(0, Event::NeverSent, now);
                }
            }
            (reflect::Verdict::Reply { .. }, Err(_)) => {
                // Another run's probe: answered, as any reflector would.
                echo.push(i);
                ids.push(u32::MAX - 2);
                out.push(0, Event::Foreign, now);
            }
            (reflect::Verdict::Drop(_), Ok(_)) => {}
            (reflect::Verdict::Drop(_), Err(_)) => out.push(0, Event::Foreign, now),
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
            now,
        );
    }
    // On veth the echoes' TX stamps are queued by now; elsewhere they are
    // picked up after a later echo, or when the run ends.
    let n_err = if !echo.is_empty() || finishing {
        collect_echo_stamps(rx, errq, now, out)
    } else {
        0
    };
    n + n_err
}

/// Takes the echoes' TX stamps queued at the receiver socket. Each echo
/// queues two stamps (SCHED and the driver's): the queue is drained to
/// empty, else it grows past the receive buffer and the kernel drops
/// stamps. Returns how many messages it took.
fn collect_echo_stamps(
    rx: &ProbeSocket,
    errq: &mut RecvBatch,
    now: i64,
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
    n_err
}
