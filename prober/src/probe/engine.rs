//! The one probe-session engine every run goes through: the self-built
//! testbed and the NIC pair (sender and receiver in their namespaces) as
//! well as a reflector that is not ours to drive (`--target`, or STAMP
//! through the testbed). What varies is at its edges: the sender's socket
//! and the wire format (rtprobe or STAMP), and who answers ([`EchoSide`]).
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

pub(crate) mod collect;
mod io;

use self::collect::{HwSetup, collect_and_join};
use self::io::ReadBy;
pub(crate) use self::io::ReadMark;
use super::{
    ProbeConfig, RecordSink, STOP_SENDING, SessionObserver, clock, events,
    matcher::Event,
    pacer,
    packet::{FLAG_ECHO, Probe},
    reflect::FLAG_WARMUP,
    socket::{self, ProbeSocket, RecvBatch},
    wire::{Echo, WARMUP_SEQ, Wire},
};
use crate::stats::RunStats;

/// A session's echo side: which reflector answers the probes and, where
/// it is ours, the receiver's socket and session it reads.
pub(crate) enum EchoSide<'a> {
    /// rtprobe's reflector in this process, at the receiver's socket
    /// (its namespace), for the probes of `session`.
    InProcess { sock: &'a ProbeSocket, session: u64 },
    /// rtprobe's in-kernel reflector (XDP) at the receiver. Its probes
    /// never reach `sock` (the receiver's); what it passes up (another
    /// run's datagrams) does, and is read and counted there as
    /// [`EchoSide::InProcess`] would.
    Kernel { sock: &'a ProbeSocket, session: u64 },
    /// Another process or host: only the sender's socket sees anything.
    Remote,
}

impl<'a> EchoSide<'a> {
    /// The receiver's socket where the reflector is ours, and its session.
    pub(crate) fn receiver_session(&self) -> Option<(&'a ProbeSocket, u64)> {
        match *self {
            EchoSide::InProcess { sock, session } | EchoSide::Kernel { sock, session } => {
                Some((sock, session))
            }
            EchoSide::Remote => None,
        }
    }

    /// The receiver's socket where the reflector is ours.
    pub(crate) fn receiver(&self) -> Option<&'a ProbeSocket> {
        self.receiver_session().map(|(sock, _)| sock)
    }
}

/// Notes what a batch of accepted echoes said (the remote run's ledger).
pub(crate) type EchoNote<'a> = dyn Fn(&[Echo]) + Sync + 'a;

/// One session as the engine runs it.
pub(crate) struct Session<'a> {
    /// The sender's socket: probes out, TX stamps and echoes in.
    pub(crate) sock: &'a ProbeSocket,
    /// Where the probes go, and the only source echoes are taken from.
    pub(crate) dst: SocketAddr,
    pub(crate) wire: &'a Wire,
    pub(crate) echo_side: EchoSide<'a>,
    /// Sees what the accepted echoes (the warm-up's late ones too) said.
    pub(crate) on_echoes: Option<&'a EchoNote<'a>>,
    /// Datagrams on the probe port during the warm-up, counted as foreign.
    pub(crate) foreign_before: u64,
}

/// The statistics, late arrivals and first failed output of a session.
pub(crate) type Collected = (RunStats, u64, Option<String>);

/// One target of a session: a testbed's one, or each remote reflector of
/// `--target`/`--targets`. Each has its own socket (connected: the kernel
/// drops datagrams of other sources), sequence space and probe options.
pub(crate) struct Leg<'a> {
    pub(crate) s: Session<'a>,
    pub(crate) cfg: ProbeConfig,
    /// Probes tried so far (the first seq not yet sent): the pacer counts
    /// them, the echo rules refuse echoes at or above it.
    pub(crate) attempts: AtomicU64,
    /// CLOCK_MONOTONIC time its seq 0 is due: a target carried over a
    /// reload keeps its schedule. None: its next probe is due at the
    /// round's start.
    pub(crate) anchor_ns: Option<i64>,
}

impl<'a> Leg<'a> {
    /// The one leg of a session with one target.
    pub(crate) fn one(s: Session<'a>, cfg: &ProbeConfig) -> Self {
        Self {
            s,
            cfg: cfg.clone(),
            attempts: AtomicU64::new(0),
            anchor_ns: None,
        }
    }
}

/// Where one leg's records go.
pub(crate) struct LegOut<'a> {
    pub(crate) csv: &'a mut dyn RecordSink,
    pub(crate) observer: &'a mut dyn SessionObserver,
}

/// One round of a session: all of it, or the part between two reloads of
/// a targets file (the legs that did not change go on in the next round
/// with their collectors, sequence numbers and sockets).
pub(crate) struct Round<'a> {
    /// No probe is scheduled at or after this CLOCK_MONOTONIC time (the
    /// run's end over reloads; None: `--duration` from the round's start).
    pub(crate) end_mono_ns: Option<i64>,
    /// The round ends, its collectors kept, once this says so.
    pub(crate) pause: &'a (dyn Fn() -> bool + Sync),
    /// Each leg's collector from the round before (None: a new leg).
    pub(crate) carried: Vec<Option<collect::Collector>>,
}

impl Round<'_> {
    /// A whole session: it ends by the first leg's count or duration.
    pub(crate) fn whole() -> Round<'static> {
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
    Paused(Vec<collect::Collector>),
}

impl Driven {
    /// The statistics of a round that cannot pause.
    pub(crate) fn finished(self) -> Result<Vec<Collected>> {
        match self {
            Driven::Finished(c) => Ok(c),
            Driven::Paused(_) => bail!("internal: a session paused without a reload"),
        }
    }
}

/// Runs the session's threads: the paced sender (one for every leg),
/// which also reads the sockets (see [`io`]), an I/O thread only where the
/// reflector is ours in this process, and the calling thread collecting
/// records until every probe is accounted for, `stop` says so, or the
/// round pauses. The first leg's options give what the legs share (count,
/// real-time settings).
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
    // A reflector of ours in this process (on any leg) needs a thread
    // waiting at its socket.
    let in_process = |l: &Leg<'_>| matches!(l.s.echo_side, EchoSide::InProcess { .. });
    let read_by = if legs.iter().any(in_process) {
        ReadBy::IoThread
    } else {
        ReadBy::Sender
    };
    let (done, sent) = (AtomicBool::new(false), AtomicBool::new(false));
    let mark = ReadMark::new();
    let (ev_tx, ev_rx) = mpsc::channel::<Vec<events::Tagged>>();
    for (i, l) in legs.iter().enumerate() {
        if l.s.foreign_before > 0 {
            let _ = ev_tx.send(vec![
                (i as u32, Event::Foreign);
                l.s.foreign_before as usize
            ]);
        }
    }
    let (done, sent, mark, pause) = (&done, &sent, &mark, round.pause);
    let end_ns = round.end_mono_ns;
    std::thread::scope(|sc| {
        let io = (read_by == ReadBy::IoThread)
            .then(|| {
                let ev = ev_tx.clone();
                std::thread::Builder::new()
                    .name("rtprobe-io".into())
                    .spawn_scoped(sc, move || {
                        pacer::share_fifo_priority(&cfg.rt);
                        let mut io = io::Io::new(legs, ev, mark, ReadBy::IoThread);
                        io.run(done, pause);
                        io.timing()
                    })
                    .context("spawn the probe I/O thread")
            })
            .transpose()?;
        let run = (|| {
            let ev = ev_tx.clone();
            let sender = std::thread::Builder::new()
                .name("rtprobe-sender".into())
                .spawn_scoped(sc, move || {
                    let until = pacer::Until {
                        end_ns,
                        stop,
                        pause,
                    };
                    sender_thread(legs, cfg, &until, ev, (read_by, mark), (sent, done))
                })
                .context("spawn sender thread")?;
            let c = Collecting {
                legs,
                carried: round.carried,
                pause,
                read: mark,
            };
            collect_and_join(&ev_rx, c, hw, outs, stop, (sender, sent, done))
        })();
        done.store(true, Ordering::SeqCst);
        let io_reader = io.and_then(|h| h.join().ok());
        let mut run = run;
        match &mut run {
            // A paused round's last echoes and stamps go to the collectors kept.
            Ok((Driven::Paused(cs), _)) => {
                while let Ok(evs) = ev_rx.try_recv() {
                    collect::route(cs, evs);
                }
            }
            Ok((Driven::Finished(v), sender_reader)) => {
                let reader = io_reader.or(sender_reader.take());
                for (stats, _, _) in v.iter_mut() {
                    stats.set_reader(reader.clone());
                }
            }
            Err(_) => {}
        }
        run.map(|(d, _)| d)
    })
}

/// What the sender thread returns: its pacing, and its timing as the
/// reader where it read the sockets.
pub(crate) type SenderDone = (
    Result<crate::stats::Pacing>,
    Option<crate::stats::ReaderTiming>,
);

/// The sender thread: sends every leg's probes and, with [`ReadBy::Sender`],
/// reads the sockets between its sends and, once `sent` says the last
/// probe is out, in a loop until `done`.
fn sender_thread(
    legs: &[Leg<'_>],
    cfg: &ProbeConfig,
    until: &pacer::Until<'_>,
    ev: mpsc::Sender<Vec<events::Tagged>>,
    (read_by, mark): (ReadBy, &ReadMark),
    (sent, done): (&AtomicBool, &AtomicBool),
) -> SenderDone {
    if read_by == ReadBy::IoThread {
        let pacing = send_all(legs, cfg, until, &mut pacer::SendOnly::new(&ev));
        sent.store(true, Ordering::SeqCst);
        return (pacing, None);
    }
    let mut io = io::Io::new(legs, ev, mark, ReadBy::Sender);
    let pacing = send_all(legs, cfg, until, &mut io);
    // Every Sent event is handed over by now.
    sent.store(true, Ordering::SeqCst);
    // The pacer put the thread's scheduling back; the reads that follow
    // keep the sender's real-time priority, as an I/O thread had it.
    pacer::share_fifo_priority(&cfg.rt);
    io.run(done, until.pause);
    (pacing, Some(io.timing()))
}

/// The sender: every leg's probes, paced from one schedule.
fn send_all(
    legs: &[Leg<'_>],
    cfg: &ProbeConfig,
    until: &pacer::Until<'_>,
    out: &mut dyn pacer::Handover,
) -> Result<crate::stats::Pacing> {
    let pace: Vec<pacer::PaceLeg<'_>> = legs
        .iter()
        .map(|l| pacer::PaceLeg {
            sock: l.s.sock,
            dst: l.s.dst,
            size: l.cfg.size,
            interval_ns: l.cfg.interval.as_nanos() as i64,
            count: l.cfg.count,
            anchor_ns: l.anchor_ns,
            attempts: &l.attempts,
        })
        .collect();
    let mut scratch = Vec::with_capacity(cfg.size);
    pacer::pace_with(&pace, cfg, until, out, &mut |leg, seq, send_ns, buf| {
        legs[leg]
            .s
            .wire
            .encode(seq, send_ns, false, buf, &mut scratch)
    })
}

/// What the collector of a round works with.
pub(crate) struct Collecting<'l, 'a> {
    pub(crate) legs: &'l [Leg<'a>],
    pub(crate) carried: Vec<Option<collect::Collector>>,
    pub(crate) pause: &'l (dyn Fn() -> bool + Sync),
    /// How far the I/O thread has read: no probe is given up as lost
    /// before it has read past the probe's timeout.
    pub(crate) read: &'l ReadMark,
}

/// Receive buffer of one datagram during a warm-up or status probe.
pub(crate) const WARM_UP_BUF_BYTES: usize = 2048;

/// What a warm-up found.
pub(crate) struct WarmedUp {
    /// The answer (None: stopped before one came).
    pub(crate) echo: Option<Echo>,
    /// Datagrams of other sessions at a testbed's receiver meanwhile.
    pub(crate) foreign: u64,
}

/// Sends warm-up probes every 100 ms until one is answered (3 s at most):
/// resolves neighbours on every hop before the run and proves that
/// something answers at all. Any stop request ends it: it is set-up, and a
/// run stopped before probing sends nothing (`echo` is None then).
pub(crate) fn warm_up(s: &Session<'_>, size: usize, stop: &AtomicU8) -> Result<WarmedUp> {
    let w = exchange(s, size, Ask::warm_up(WARMUP_SEQ, 30, STOP_SENDING), stop)?;
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
    match (&s.echo_side, s.wire) {
        (EchoSide::Remote, wire) => {
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

/// One question to the reflector, asked before or after the probing:
/// probe `seq`, marked as a warm-up (answered, never counted) or not (a
/// STAMP status probe, which a stateful reflector numbers).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    pub(crate) seq: u64,
    pub(crate) warmup: bool,
    /// Sends at most, each waited on `wait_ms` (a retry of a counted
    /// probe would be counted again: one try then).
    pub(crate) tries: u32,
    pub(crate) wait_ms: i64,
    /// Gives up, sending nothing more, once the stop level reaches this.
    pub(crate) give_up_at: u8,
}

impl Ask {
    /// A warm-up probe `tries` times, 100 ms apart.
    pub(crate) fn warm_up(seq: u64, tries: u32, give_up_at: u8) -> Self {
        Self {
            seq,
            warmup: true,
            tries,
            wait_ms: 100,
            give_up_at,
        }
    }
}

/// Sends probe `ask.seq` up to `ask.tries` times and returns the first
/// answer to it. Where the reflector is ours it echoes warm-ups itself
/// (the I/O thread is not running yet); with the in-kernel reflector the
/// kernel answers first and the receiver's socket sees only others'
/// datagrams, which are counted. On a testbed a failed send or receive is
/// an error (nothing else explains it); towards a remote reflector the
/// next try follows.
pub(crate) fn exchange(
    s: &Session<'_>,
    size: usize,
    ask: Ask,
    stop: &AtomicU8,
) -> Result<WarmedUp> {
    let receiver = s.echo_side.receiver_session();
    let strict = receiver.is_some();
    let mut buf = vec![0u8; size];
    let mut scratch = Vec::with_capacity(size);
    // Room for any echo (at most a 1500-byte MTU's payload; a longer
    // foreign datagram is cut, and counted all the same): a warm-up per
    // target of a thousand allocates 16 x this.
    let mut batch = RecvBatch::new(16, size.max(WARM_UP_BUF_BYTES));
    let mut foreign = 0u64;
    let given_up = || stop.load(Ordering::SeqCst) >= ask.give_up_at;
    let mut polled = vec![s.sock];
    polled.extend(receiver.map(|(rx, _)| rx));
    for _ in 0..ask.tries {
        if given_up() {
            break;
        }
        s.wire.encode(
            ask.seq,
            clock::realtime_ns(),
            ask.warmup,
            &mut buf,
            &mut scratch,
        );
        if let Err(e) = s.sock.send_to(&buf, s.dst, u32::MAX - 1) {
            if strict {
                return Err(e).with_context(|| format!("send warm-up probe to {}", s.dst));
            }
            log::debug!("warm-up send to {}: {e}", s.dst);
        }
        let until = clock::realtime_ns() + ask.wait_ms * 1_000_000;
        while clock::realtime_ns() < until && !given_up() {
            let polled_ok = socket::poll_any(&polled, 10);
            if strict {
                polled_ok?;
            }
            if let Some((rx, session)) = receiver {
                foreign += echo_warm_ups(rx, &mut batch, session)?;
            }
            let echo = answer_at_sender(s, &mut batch, ask, strict)?;
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
/// answer to the probe asked, if it came.
fn answer_at_sender(
    s: &Session<'_>,
    batch: &mut RecvBatch,
    ask: Ask,
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
            && e.warmup == ask.warmup
            && e.seq == ask.seq
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
    if let Some((rx, session)) = s.echo_side.receiver_session() {
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
