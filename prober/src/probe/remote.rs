//! The session-sender towards a reflector that is not ours to drive: a
//! remote host (`rtprobe --target`), or the receiver of a testbed run with
//! `--protocol stamp`. One socket sends the paced probes and takes the TX
//! stamps and the echoes; the reflector's receive and transmit times come
//! from the echo (rtprobe echoes: bytes 32..48; STAMP: T2 and T3), as with
//! the in-kernel reflector, so the same matcher, CSV and summary serve.
//!
//! Loss by direction: the reflector says how many probes of the session it
//! received (rtprobe echoes: the state field, see [`super::reflect`];
//! STAMP stateful reflectors: their own sequence number, RFC 8762 §4.3).
//! After the run one more probe (a warm-up, not counted by rtprobe's
//! reflector) asks for the final count: forward loss = sent - received
//! there, return loss = the rest. A stateless STAMP reflector echoes the
//! sender's numbers, which say nothing about the way out: then the split
//! is "unknown".
//!
//! Clocks: one-way figures compare the reflector's clock with ours. They
//! are shown only when both kernels say their clock is synchronised
//! (`adjtimex`: no STA_UNSYNC; the reflector's state comes in its Error
//! Estimate), with the sum of both maximum errors as their bound.
//!
//! Trust: the socket is connected to the target, so the kernel delivers
//! only its datagrams; an echo then counts only if it is of this session,
//! for a seq already sent (the pacer counts a probe before sending it) and
//! while the matcher still awaits it. Foreign, never-sent and late echoes
//! are counted apart, and nothing kept grows with the seqs that arrive.
//!
//! Kernel interfaces: a connected UDP socket with SO_TIMESTAMPING
//! (software RX/TX stamps, no privilege), `adjtimex(2)` read only.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        Mutex,
        atomic::{AtomicU8, AtomicU64, Ordering},
    },
};

use anyhow::{Context, Result, bail};

use super::{
    HwSetup, ProbeConfig, RecordSink, STOP_NOW, SessionOutcome, clock, engine,
    matcher::NoHwClocks,
    socket::{self, ProbeSocket, RecvBatch, TsFlags},
    stamp::{ClockSync, ErrorEstimate, HmacKey},
    wire::{Echo, SSID_WARMUP_BIT, WARMUP_SEQ, Wire},
};
use crate::{
    model::{observer::SessionObserver, record::ProbeRecord},
    spec::remote::ProtocolArg,
    stats::report::{ClockReport, ReflectorReport},
    sys::Netns,
};

/// Where the probes go and how they look.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub protocol: ProtocolArg,
    pub key: Option<HmacKey>,
    /// The reflector is known to answer STAMP statelessly (rtprobe's
    /// in-kernel one): its sequence numbers tell nothing of forward loss.
    pub stateless_reflector: bool,
    /// Sender and reflector read the same clock (the namespace testbed):
    /// one-way needs no synchronisation.
    pub shared_clock: bool,
}

/// One target's writer into the session's one CSV: the one-way column
/// and the two stages that cross hosts (path: sender TX -> reflector RX;
/// return path: reflector TX -> sender RX) left empty when the clocks do
/// not allow them (the raw stamps stay), and the row tagged with the
/// target's name where the CSV has a `target` column.
struct OneWaySink<'a, 'b> {
    inner: &'a Mutex<&'b mut dyn RecordSink>,
    /// The CSV's `target` cell (None: a single `--target` run's CSV).
    target: Option<&'a str>,
    show: bool,
    /// Only one leg flushes the shared CSV on the collector's ticks.
    flushes: bool,
}

/// A record without the figures that compare two hosts' clocks (one-way,
/// path, return path): what the CSV and /metrics get when the clocks do
/// not allow them.
fn without_one_way(r: &ProbeRecord) -> ProbeRecord {
    let mut c = r.clone();
    c.one_way_ns = None;
    c.path_ns = None;
    c.return_ns = None;
    c
}

impl RecordSink for OneWaySink<'_, '_> {
    fn write(&mut self, r: &ProbeRecord) -> Result<()> {
        let cleared;
        let r = if self.show {
            r
        } else {
            cleared = without_one_way(r);
            &cleared
        };
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| anyhow::anyhow!("CSV writer poisoned"))?;
        match self.target {
            Some(t) => inner.write_for(t, r),
            None => inner.write(r),
        }
    }
    fn flush(&mut self) -> Result<()> {
        if !self.flushes {
            return Ok(());
        }
        self.inner
            .lock()
            .map_err(|_| anyhow::anyhow!("CSV writer poisoned"))?
            .flush()
    }
}

/// One target's observer (its metrics) sees the records the CSV gets: no
/// one-way histogram between clocks that do not allow it.
struct OneWayObserver<'a> {
    inner: &'a mut dyn SessionObserver,
    show: bool,
}

impl SessionObserver for OneWayObserver<'_> {
    fn on_record(&mut self, r: &ProbeRecord) {
        if self.show {
            self.inner.on_record(r);
        } else {
            self.inner.on_record(&without_one_way(r));
        }
    }
    fn on_tick(&mut self, stats: &crate::stats::RunStats, last: bool) -> Result<(), String> {
        self.inner.on_tick(stats, last)
    }
}

/// The STAMP status probe's sequence number: a stateful reflector answers
/// with its count instead, a stateless one with this number.
const STAMP_STATUS_SEQ: u32 = u32::MAX - 2;

/// What the echoes told beyond the records. Constant size: it keeps no
/// per-seq state, whatever seqs arrive (how many probes came back is the
/// records' count, see [`split_loss`]).
#[derive(Debug, Default)]
struct Ledger {
    /// Highest seq echoed, with the reflector's count (rtprobe) or its own
    /// sequence number (STAMP) in that echo.
    last: Option<(u64, Option<u64>, Option<u32>)>,
    /// STAMP: every reflector sequence number equalled the sender's.
    stamp_seq_mirrored: bool,
    ee: Option<ErrorEstimate>,
    ttl_min: Option<u8>,
    ttl_max: Option<u8>,
    /// The answer to the trailing status probe.
    trailer: Option<Echo>,
}

impl Ledger {
    /// Notes an echo from the target of this session for a seq that was
    /// sent (the I/O loop refuses the others before they get here).
    fn on_echo(&mut self, e: &Echo) {
        if e.ee.is_some() {
            self.ee = e.ee;
        }
        if let Some(t) = e.ttl {
            self.ttl_min = Some(self.ttl_min.map_or(t, |m| m.min(t)));
            self.ttl_max = Some(self.ttl_max.map_or(t, |m| m.max(t)));
        }
        if e.warmup {
            return;
        }
        if let Some(rs) = e.reflector_seq
            && rs as u64 != e.seq
        {
            self.stamp_seq_mirrored = false;
        }
        if self.last.is_none_or(|(s, _, _)| e.seq > s) {
            self.last = Some((e.seq, e.received, e.reflector_seq));
        }
    }
}

pub use crate::stats::report::LossSplit;

/// Splits `lost` of `sent` probes (seqs 0..sent) by what the reflector
/// said. The probes that came back are the records' count, `sent - lost`:
/// every one of them is at or below the highest seq echoed, so that count
/// is also how many came back up to it.
fn split_loss(
    l: &Ledger,
    sent: u64,
    lost: u64,
    protocol: ProtocolArg,
    stateless: bool,
) -> LossSplit {
    let unknown = |basis: &str| LossSplit {
        forward: None,
        r#return: None,
        unknown: lost,
        basis: basis.into(),
    };
    // Reflector's count of this session's probes at the trailer, if it answered.
    let final_count = l.trailer.and_then(|t| match protocol {
        ProtocolArg::Rtprobe => t.received,
        ProtocolArg::Stamp => t.reflector_seq.map(u64::from),
    });
    // A stateless reflector answers the status probe with its own number.
    let mirrored_status =
        protocol == ProtocolArg::Stamp && final_count == Some(STAMP_STATUS_SEQ as u64);
    let mirrored_run =
        protocol == ProtocolArg::Stamp && final_count.is_none() && l.stamp_seq_mirrored && lost > 0;
    if protocol == ProtocolArg::Stamp && (stateless || mirrored_status || mirrored_run) {
        return unknown(
            "the STAMP reflector echoes the sender's sequence numbers (stateless), which do not tell forward from return loss",
        );
    }
    if let Some(received) = final_count {
        let forward = sent.saturating_sub(received).min(lost);
        return LossSplit {
            forward: Some(forward),
            r#return: Some(lost - forward),
            unknown: 0,
            basis: "the reflector's count of probes received, asked after the run".into(),
        };
    }
    let Some((seq, received, refl_seq)) = l.last else {
        return unknown("no echo came back: nothing tells where the probes were lost");
    };
    let count = match protocol {
        ProtocolArg::Rtprobe => received,
        ProtocolArg::Stamp => refl_seq.map(|r| r as u64 + 1),
    };
    let Some(received) = count else {
        return unknown(
            "the echoes carry no count of probes received (an in-kernel reflector, or probes under 64 bytes)",
        );
    };
    let through = seq + 1;
    let lost_through = through.saturating_sub(sent.saturating_sub(lost));
    let forward = through.saturating_sub(received).min(lost_through);
    LossSplit {
        forward: Some(forward),
        r#return: Some(lost_through - forward),
        unknown: lost.saturating_sub(lost_through),
        basis: "the reflector's count in the last echo; probes after it are unknown (the status probe after the run got no answer)".into(),
    }
}

pub use crate::stats::report::ClockVerdict;

pub const NOT_SYNCED_NOTE: &str = "clocks not synchronised: one-way not shown";

pub fn clock_verdict(local: &ClockSync, remote: Option<ErrorEstimate>) -> ClockVerdict {
    let r_sync = remote.map(|e| e.synchronized());
    let r_err = remote.and_then(|e| e.to_error_ns());
    let shown = local.synchronized && r_sync == Some(true) && r_err.is_some();
    let bound = shown.then(|| local.max_error_ns.saturating_add(r_err.unwrap_or(0)));
    let note = match bound {
        Some(b) => format!(
            "one-way between two clocks: each figure is within ±{} of the truth (sender's maximum error {} + reflector's {})",
            fmt_ns(b),
            fmt_ns(local.max_error_ns),
            fmt_ns(r_err.unwrap_or(0))
        ),
        None => {
            let why = match (local.synchronized, r_sync) {
                (false, _) => "this host's clock is not synchronised (adjtimex STA_UNSYNC)",
                (true, None) => "the reflector does not say whether its clock is synchronised",
                (true, Some(false)) => {
                    "the reflector's clock is not synchronised (its Error Estimate's S bit is 0)"
                }
                (true, Some(true)) => "the reflector's error estimate is invalid",
            };
            format!("{NOT_SYNCED_NOTE} ({why}); RTT needs one clock only and is shown")
        }
    };
    ClockVerdict {
        one_way_shown: shown,
        bound_ns: bound,
        sender_synchronized: local.synchronized,
        sender_max_error_ns: local.max_error_ns,
        reflector_synchronized: r_sync,
        reflector_error_ns: r_err,
        note,
    }
}

fn fmt_ns(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 => format!("{:.1} s", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} ms", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1} µs", n as f64 / 1e3),
        n => format!("{n} ns"),
    }
}

/// What a session against a reflector not ours learned besides the
/// records ([`SessionOutcome::remote`]).
#[derive(Debug, Clone)]
pub struct RemoteFacts {
    pub loss: LossSplit,
    pub clock: ClockVerdict,
    /// Protocol facts for the summary (SSID, TTLs seen, echoes); `kind`
    /// is left for the caller to say.
    pub info: ReflectorReport,
}

/// The wire of a new session towards `target`: a fresh session id (rtprobe)
/// or SSID (STAMP, with this host's clock in its Error Estimate).
fn session_wire(target: &Target, cfg: &ProbeConfig, local_clock: &ClockSync) -> Wire {
    match target.protocol {
        ProtocolArg::Rtprobe => Wire::Rtprobe {
            session: super::new_session_id(),
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
/// target's family and connected to it.
fn bind_towards(
    target: &Target,
    cfg: &ProbeConfig,
    wire: &Wire,
    ns: Option<&Netns>,
) -> Result<ProbeSocket> {
    if target.addr.is_ipv6() && cfg.size > crate::spec::plan::MAX_PAYLOAD_1500_IPV6 {
        bail!(
            "--size {} does not fit a 1500-byte MTU over IPv6 (40-byte header) to {}: use at most {} bytes",
            cfg.size,
            target.addr,
            crate::spec::plan::MAX_PAYLOAD_1500_IPV6
        );
    }
    if cfg.size < wire.min_len() {
        bail!(
            "--size {} is too small for {} probes: use at least {} bytes",
            cfg.size,
            target.protocol.name(),
            wire.min_len()
        );
    }
    let bind = || {
        ProbeSocket::bind(
            // The target's family: an IPv6 target gets an AF_INET6 socket.
            SocketAddr::new(
                match target.addr {
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
        Some(ns) => ns.run(bind)?,
        None => bind()?,
    };
    let dst = target.addr;
    // The kernel then delivers only datagrams from the target: an off-path
    // sender's forged echoes never reach this socket.
    sock.connect(dst).with_context(|| {
        format!("connect the probe socket to {dst}: check that this host has a route to it")
    })?;
    Ok(sock)
}

/// One remote target of a session: where, how, and its probe options.
pub(crate) struct RemoteLeg {
    pub target: Target,
    pub cfg: ProbeConfig,
    /// The CSV's `target` cell (None: a single `--target` run's CSV,
    /// which has no such column).
    pub name: Option<String>,
    /// Its metrics labels besides `target` (a targets file's).
    pub labels: std::collections::BTreeMap<String, String>,
}

impl RemoteLeg {
    /// Whether a reload leaves this target as it is (same name, address,
    /// protocol, probe options and labels): it keeps its statistics.
    fn same_as(&self, o: &RemoteLeg) -> bool {
        let (a, b) = (&self.cfg, &o.cfg);
        self.name == o.name
            && self.target.addr == o.target.addr
            && self.target.protocol == o.target.protocol
            && (a.size, a.tos, a.interval) == (b.size, b.tos, b.interval)
            && self.labels == o.labels
    }

    fn label(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.target.addr.to_string())
    }
}

/// How a run with a targets file reloads it (SIGHUP).
pub(crate) struct Reloads<'a> {
    /// Counts the reload requests.
    pub generation: &'a AtomicU64,
    /// Reads and checks the file again.
    pub read: &'a dyn Fn() -> Result<Vec<RemoteLeg>>,
}

/// Makes each target's observer (its metrics, or the progress and HDR
/// log of a single target).
pub(crate) type ObserverFor<'o> = dyn FnMut(&RemoteLeg) -> Box<dyn SessionObserver + 'o> + 'o;

/// A target of the running session and what it has so far.
struct Active<'o> {
    leg: RemoteLeg,
    p: Prepared,
    observer: Box<dyn SessionObserver + 'o>,
    /// Its collector from the round before a reload.
    collector: Option<super::Collector>,
    /// Probes tried so far (its next seq).
    sent: u64,
}

/// A target's state from set-up to its report.
struct Prepared {
    wire: Wire,
    sock: ProbeSocket,
    ledger: Mutex<Ledger>,
    show_one_way: bool,
    early: ClockVerdict,
}

/// Most targets warmed up (or asked for their count) at once, one thread each.
const PARALLEL: usize = 128;

/// Runs `f` over `items` in chunks of [`PARALLEL`] threads; the results in order.
fn in_parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
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

/// The remote side of [`super::run_session`] and [`super::run_targets`]:
/// one connected socket per target, from namespace `ns` (None: the
/// calling thread's), the reflectors' stamps from their echoes, one
/// sender and one I/O thread for all, and after the run each target's
/// status probe, loss split and clock verdict. With one target a warm-up
/// without answer is an error; with several that target is warned about
/// and probed anyway (its loss shows in its report). With `reloads` a
/// reload request pauses the round: unchanged targets go on with their
/// statistics and sequence numbers, removed ones are finalized (and stay
/// in the result), new ones start. Returns each target with its outcome,
/// removed ones first.
pub(super) fn targets_session<'o>(
    legs: Vec<RemoteLeg>,
    ns: Option<&Netns>,
    csv: &mut dyn RecordSink,
    observer_for: &mut ObserverFor<'o>,
    reloads: Option<&Reloads<'_>>,
    stop: &AtomicU8,
) -> Result<Vec<(RemoteLeg, SessionOutcome)>> {
    let local_clock = ClockSync::read_kernel().unwrap_or(ClockSync {
        synchronized: false,
        max_error_ns: 0,
        tai_offset_s: 0,
    });
    let mode = if legs.len() == 1 && reloads.is_none() {
        WarmUp::Single
    } else {
        WarmUp::Many
    };
    let mut active = start(legs, ns, &local_clock, mode, stop, observer_for)?;
    if stop.load(Ordering::SeqCst) != 0 {
        // Before the pacer: no probe of the run has been sent, and none will.
        bail!("interrupted before probing started; nothing was measured");
    }
    let shared = Mutex::new(csv);
    // Over reloads the run keeps its one end.
    let end_mono_ns = reloads
        .and(active[0].leg.cfg.duration)
        .map(|d| clock::monotonic_ns() + super::pacer::START_AHEAD_NS + d.as_nanos() as i64);
    let counter = reloads.map(|r| r.generation);
    let generation = || counter.map_or(0, |g| g.load(Ordering::SeqCst));
    let mut done = Vec::new();
    loop {
        let seen = generation();
        let pause = || generation() != seen;
        match round(&mut active, &shared, end_mono_ns, &pause, stop)? {
            engine::Driven::Finished(collected) => {
                // The status probes in parallel: a silent target waits 300 ms.
                let asks: Vec<_> = active.iter().map(|a| (&a.leg, &a.p, a.sent)).collect();
                let trailers = in_parallel(&asks, |(l, p, sent)| trailer(l, p, *sent, stop));
                drop(asks);
                for ((a, c), t) in active.into_iter().zip(collected).zip(trailers) {
                    let o = outcome(&a.leg, a.p, c, a.sent, t, &local_clock, stop)?;
                    done.push((a.leg, o));
                }
                return Ok(done);
            }
            engine::Driven::Paused(cs) => {
                for (a, c) in active.iter_mut().zip(cs) {
                    a.collector = Some(c);
                }
                let Some(r) = reloads else {
                    bail!("internal: a session paused without a reload");
                };
                active = reload(
                    active,
                    r,
                    ns,
                    &local_clock,
                    &shared,
                    &mut done,
                    observer_for,
                    stop,
                )?;
            }
        }
    }
}

/// One round of the engine over the active targets; each target's probe
/// count is brought back for the next.
fn round(
    active: &mut [Active<'_>],
    shared: &Mutex<&mut dyn RecordSink>,
    end_mono_ns: Option<i64>,
    pause: &(dyn Fn() -> bool + Sync),
    stop: &AtomicU8,
) -> Result<engine::Driven> {
    let n = active.len() as i64;
    let carried = active.iter_mut().map(|a| a.collector.take()).collect();
    let (mut views, mut observers) = (Vec::new(), Vec::new());
    for a in active.iter_mut() {
        let Active {
            leg, p, observer, ..
        } = a;
        views.push((&*leg, &*p, a.sent));
        observers.push(OneWayObserver {
            inner: &mut **observer,
            show: p.show_one_way,
        });
    }
    let notes: Vec<_> = views
        .iter()
        .map(|(_, p, _)| {
            let ledger = &p.ledger;
            move |seen: &[Echo]| {
                if let Ok(mut l) = ledger.lock() {
                    for e in seen {
                        l.on_echo(e);
                    }
                }
            }
        })
        .collect();
    let legs: Vec<engine::Leg<'_>> = views
        .iter()
        .zip(&notes)
        .enumerate()
        .map(|(i, ((leg, p, sent), note))| engine::Leg {
            s: engine::Session {
                sock: &p.sock,
                dst: leg.target.addr,
                wire: &p.wire,
                reflector: engine::Reflector::Remote,
                on_echoes: Some(note),
                foreign_before: 0,
            },
            // The reflector's stamps come in its echoes, as the in-kernel one's do.
            cfg: ProbeConfig {
                kernel_reflector: true,
                ..leg.cfg.clone()
            },
            attempts: AtomicU64::new(*sent),
            // Target i starts i/N of its interval late: sends spread evenly.
            phase_ns: leg.cfg.interval.as_nanos() as i64 * i as i64 / n,
        })
        .collect();
    let mut sinks: Vec<OneWaySink<'_, '_>> = views
        .iter()
        .enumerate()
        .map(|(i, (leg, p, _))| OneWaySink {
            inner: shared,
            target: leg.name.as_deref(),
            show: p.show_one_way,
            flushes: i == 0,
        })
        .collect();
    let mut outs: Vec<engine::LegOut<'_>> = sinks
        .iter_mut()
        .zip(observers.iter_mut())
        .map(|(csv, observer)| engine::LegOut { csv, observer })
        .collect();
    let hw = HwSetup {
        echo_stamps: false,
        sender_tx: false,
        receiver_tx: false,
        clocks: Box::new(NoHwClocks),
    };
    let r = engine::Round {
        end_mono_ns,
        pause,
        carried,
    };
    let driven = engine::drive(&legs, hw, &mut outs, stop, r)?;
    let sent: Vec<u64> = legs
        .iter()
        .map(|l| l.attempts.load(Ordering::SeqCst))
        .collect();
    drop(outs);
    drop(observers);
    for (a, s) in active.iter_mut().zip(sent) {
        a.sent = s;
    }
    Ok(driven)
}

/// Sockets, wires and warm-ups of new targets (in parallel), and their observers.
fn start<'o>(
    legs: Vec<RemoteLeg>,
    ns: Option<&Netns>,
    local_clock: &ClockSync,
    mode: WarmUp,
    stop: &AtomicU8,
    observer_for: &mut ObserverFor<'o>,
) -> Result<Vec<Active<'o>>> {
    let prepared = in_parallel(&legs, |l| prepare(l, ns, local_clock, mode, stop));
    legs.into_iter()
        .zip(prepared)
        .map(|(leg, p)| {
            Ok(Active {
                observer: observer_for(&leg),
                p: p?,
                leg,
                collector: None,
                sent: 0,
            })
        })
        .collect()
}

/// Reads the targets again and applies the change, one log line per
/// target: unchanged ones go on, removed (or changed) ones are finalized
/// into `done`, new ones start. A file that fails its checks changes nothing.
#[allow(clippy::too_many_arguments)]
fn reload<'o>(
    active: Vec<Active<'o>>,
    r: &Reloads<'_>,
    ns: Option<&Netns>,
    local_clock: &ClockSync,
    shared: &Mutex<&mut dyn RecordSink>,
    done: &mut Vec<(RemoteLeg, SessionOutcome)>,
    observer_for: &mut ObserverFor<'o>,
    stop: &AtomicU8,
) -> Result<Vec<Active<'o>>> {
    let list = match (r.read)() {
        Ok(l) => l,
        Err(e) => {
            log::warn!(
                "reload: {e:#}; the {} targets probed go on unchanged",
                active.len()
            );
            return Ok(active);
        }
    };
    let mut old: Vec<Option<Active<'o>>> = active.into_iter().map(Some).collect();
    let (mut next, mut added) = (Vec::new(), Vec::new());
    for l in list {
        let at = old
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.leg.name == l.name));
        match at.and_then(|i| old[i].take().map(|a| (i, a))) {
            Some((_, a)) if a.leg.same_as(&l) => next.push(a),
            Some((_, a)) => {
                log::warn!("target {}: changed, finalized and started anew", l.label());
                done.push(finalize(a, shared, local_clock, stop)?);
                added.push(l);
            }
            None => added.push(l),
        }
    }
    for a in old.into_iter().flatten() {
        log::warn!(
            "target {}: removed after {} probes, finalized (it stays in the report)",
            a.leg.label(),
            a.sent
        );
        done.push(finalize(a, shared, local_clock, stop)?);
    }
    let names: Vec<String> = added.iter().map(RemoteLeg::label).collect();
    let kept = next.len();
    let mode = WarmUp::Reload;
    next.extend(start(added, ns, local_clock, mode, stop, observer_for)?);
    for name in &names {
        log::warn!("target {name}: added");
    }
    log::warn!(
        "reload: {kept} targets unchanged (their statistics go on), {} added, {} probed in all",
        names.len(),
        next.len()
    );
    Ok(next)
}

/// A target taken out mid-run: what is still in flight counts as lost,
/// then its report as at the end of a run.
fn finalize(
    mut a: Active<'_>,
    shared: &Mutex<&mut dyn RecordSink>,
    local_clock: &ClockSync,
    stop: &AtomicU8,
) -> Result<(RemoteLeg, SessionOutcome)> {
    let c = a
        .collector
        .take()
        .context("internal: a paused target without its collector")?;
    let mut sink = OneWaySink {
        inner: shared,
        target: a.leg.name.as_deref(),
        show: a.p.show_one_way,
        flushes: true,
    };
    let mut c = c;
    c.drain(
        clock::realtime_ns(),
        true,
        &mut sink,
        &mut *a.observer,
        stop,
    );
    let collected = c.finish(&mut sink, &mut *a.observer, stop);
    report(a, collected, local_clock, stop)
}

/// A target's outcome after its last probe: the status probe, then its
/// statistics with the loss split and clock verdict.
fn report(
    a: Active<'_>,
    c: engine::Collected,
    local_clock: &ClockSync,
    stop: &AtomicU8,
) -> Result<(RemoteLeg, SessionOutcome)> {
    let t = trailer(&a.leg, &a.p, a.sent, stop);
    let o = outcome(&a.leg, a.p, c, a.sent, t, local_clock, stop)?;
    Ok((a.leg, o))
}

/// A target's socket, wire and warm-up.
/// How a target's warm-up goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WarmUp {
    /// The run's only target: no answer within 3 s is an error.
    Single,
    /// One of several at the start: 3 s, then probed anyway.
    Many,
    /// Added by a reload: 0.5 s, then probed anyway.
    Reload,
}

fn prepare(
    l: &RemoteLeg,
    ns: Option<&Netns>,
    local_clock: &ClockSync,
    mode: WarmUp,
    stop: &AtomicU8,
) -> Result<Prepared> {
    let wire = session_wire(&l.target, &l.cfg, local_clock);
    let sock = bind_towards(&l.target, &l.cfg, &wire, ns)?;
    let name = l.label();
    let first = match mode {
        // A reload pauses every other target while it warms up: half a
        // second for the new ones, not the three of a start.
        WarmUp::Reload => {
            let s = towards(&sock, l.target.addr, &wire);
            let w = engine::exchange(&s, l.cfg.size, WARMUP_SEQ, stop, super::STOP_SENDING, 5)?;
            if w.echo.is_none() {
                log::warn!(
                    "target {name}: no answer to the warm-up within 0.5 s; probing it anyway"
                );
            }
            Ok(w.echo)
        }
        WarmUp::Single | WarmUp::Many => warm_up(&sock, l.target.addr, &wire, l.cfg.size, stop),
    };
    let first = match first {
        Ok(first) => first,
        Err(e) if mode != WarmUp::Single => {
            log::warn!("target {name}: {e:#}; probing it anyway");
            None
        }
        Err(e) => return Err(e),
    };
    // The clocks as the run starts decide the CSV's one-way column.
    let early = clock_verdict(local_clock, first.and_then(|e| e.ee));
    Ok(Prepared {
        show_one_way: l.target.shared_clock || early.one_way_shown,
        wire,
        sock,
        ledger: Mutex::new(Ledger {
            stamp_seq_mirrored: true,
            ..Ledger::default()
        }),
        early,
    })
}

/// After the run: the reflector's answer to the status probe, its final
/// count of this session (None: not asked, or no answer).
fn trailer(l: &RemoteLeg, p: &Prepared, sent: u64, stop: &AtomicU8) -> Option<Echo> {
    let target = &l.target;
    let stateful_stamp = target.protocol == ProtocolArg::Stamp && !target.stateless_reflector;
    // Nothing sent (a stop came between the warm-up and the first probe):
    // nothing to count, so nothing to ask.
    if sent > 0 && (target.protocol == ProtocolArg::Rtprobe || stateful_stamp) {
        status_probe(&p.sock, target.addr, &p.wire, l.cfg.size, stop)
    } else {
        None
    }
}

/// A target's outcome: its statistics with the loss split, the clock
/// verdict and the protocol facts its echoes told.
fn outcome(
    l: &RemoteLeg,
    p: Prepared,
    c: engine::Collected,
    sent: u64,
    trailer: Option<Echo>,
    local_clock: &ClockSync,
    stop: &AtomicU8,
) -> Result<SessionOutcome> {
    let target = &l.target;
    let (mut stats, late_arrivals, output_error) = c;
    stats.set_attempts(sent);
    let mut ledger = p
        .ledger
        .into_inner()
        .map_err(|_| anyhow::anyhow!("echo ledger poisoned"))?;
    ledger.trailer = trailer;
    let loss = split_loss(
        &ledger,
        sent,
        stats.lost(),
        target.protocol,
        target.stateless_reflector,
    );
    let clock = final_clock(target, local_clock, p.early, &ledger);
    let info = protocol_info(target, &p.wire, &ledger, stats.counts().received);
    Ok(SessionOutcome {
        stats,
        hardware_tx: false,
        hardware_rx: false,
        late_arrivals,
        interrupted: stop.load(Ordering::SeqCst) != 0,
        kernel_drops: None,
        hw_clocks: Default::default(),
        output_error,
        remote: Some(RemoteFacts { loss, clock, info }),
    })
}

/// The one-way verdict at the end: shared clocks need none; otherwise the
/// clocks as the run started (if they failed then) or as the last echo said.
fn final_clock(
    target: &Target,
    local_clock: &ClockSync,
    early: ClockVerdict,
    ledger: &Ledger,
) -> ClockVerdict {
    if target.shared_clock {
        ClockVerdict {
            one_way_shown: true,
            bound_ns: None,
            sender_synchronized: local_clock.synchronized,
            sender_max_error_ns: local_clock.max_error_ns,
            reflector_synchronized: None,
            reflector_error_ns: None,
            note: "sender and reflector share this host's clock (namespaces): one-way needs no synchronisation".into(),
        }
    } else if !early.one_way_shown {
        early
    } else {
        clock_verdict(local_clock, ledger.ee)
    }
}

/// Protocol facts for the summary: the session id or SSID, the echoes and
/// (STAMP) the sender TTLs the reflector saw.
fn protocol_info(target: &Target, wire: &Wire, ledger: &Ledger, echoes: u64) -> ReflectorReport {
    let mut info = ReflectorReport {
        protocol: Some(target.protocol.name().into()),
        target: Some(target.addr.to_string()),
        echoes: Some(echoes),
        ..Default::default()
    };
    match wire {
        Wire::Rtprobe { session, .. } => info.session = Some(format!("{session:#018x}")),
        Wire::Stamp { ssid, key, .. } => {
            info.ssid = Some(*ssid);
            info.authenticated = Some(key.is_some());
            info.sender_ttl_min = Some(ledger.ttl_min);
            info.sender_ttl_max = Some(ledger.ttl_max);
        }
    }
    info
}

/// The engine's view of a session towards `dst` (no ledger: the warm-up
/// and the status probe read their answers themselves).
fn towards<'a>(sock: &'a ProbeSocket, dst: SocketAddr, wire: &'a Wire) -> engine::Session<'a> {
    engine::Session {
        sock,
        dst,
        wire,
        reflector: engine::Reflector::Remote,
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
/// warm-up-marked probe of the session (answered, not counted); a stateful
/// STAMP reflector numbers one more packet of the SSID, whose reply
/// carries the count before it.
fn status_probe(
    sock: &ProbeSocket,
    dst: SocketAddr,
    wire: &Wire,
    size: usize,
    stop: &AtomicU8,
) -> Option<Echo> {
    match wire {
        Wire::Rtprobe { .. } => engine::exchange(
            &towards(sock, dst, wire),
            size,
            u64::MAX - 1,
            stop,
            STOP_NOW,
            3,
        )
        .ok()
        .and_then(|w| w.echo),
        Wire::Stamp { .. } => {
            // One try only: a retry would be counted again by the reflector,
            // and the answer to the first would then not give the count.
            let mut buf = vec![0u8; size];
            let mut scratch = Vec::with_capacity(size);
            let mut batch = RecvBatch::new(16, engine::WARM_UP_BUF_BYTES);
            let seq = STAMP_STATUS_SEQ as u64;
            wire.encode(seq, clock::realtime_ns(), false, &mut buf, &mut scratch);
            let _ = sock.send_to(&buf, dst, u32::MAX - 1);
            let until = clock::realtime_ns() + 500_000_000;
            while clock::realtime_ns() < until && stop.load(Ordering::SeqCst) < STOP_NOW {
                let _ = socket::poll_any(&[sock], 10);
                while sock.recv_batch(&mut batch, true).unwrap_or(0) > 0 {}
                let n = sock.recv_batch(&mut batch, false).unwrap_or(0);
                for i in 0..n {
                    let (payload, src, _) = batch.get(i);
                    if socket::same_endpoint(src, dst)
                        && let Some(e) = wire.decode(payload)
                        && !e.warmup
                        && e.seq == seq
                    {
                        return Some(e);
                    }
                }
            }
            None
        }
    }
}

/// The clock-related fields of a summary when the clocks are not shown to
/// agree: one-way figures and the two stages that cross between the clocks
/// (path, return path) are cleared, and what was said about them. RTT,
/// the stages on one host, and IPDV (a difference of one-way delays, in
/// which a constant offset cancels) are kept.
pub fn apply_clock_rule(s: &mut crate::stats::Summary, v: &ClockVerdict) {
    if !v.one_way_shown {
        s.one_way_ns = Default::default();
        s.stages_ns.path = Default::default();
        s.stages_ns.return_path = Default::default();
        s.one_way_dominant = None;
        s.rtt_dominant = None;
    }
    s.report.clock = Some(ClockReport::Verdict(v.clone()));
}

/// The summary of a session against a reflector, with what the reflector
/// told (`facts`: its clock rule, loss split and protocol facts).
pub fn summarise(o: &SessionOutcome, facts: &RemoteFacts, kind: &str) -> crate::stats::Summary {
    let mut s = o.stats.summary();
    s.xdp_mode_requested = "none".into();
    s.xdp_mode_attached = "none".into();
    apply_clock_rule(&mut s, &facts.clock);
    s.report.reflector = Some(ReflectorReport {
        kind: kind.into(),
        ..facts.info.clone()
    });
    s.report.loss_split = Some(facts.loss.clone());
    s.report.late_arrivals = Some(o.late_arrivals);
    s.report.peak_rss_kib = Some(crate::model::run::peak_rss_kib());
    s.report.interrupted = o.interrupted;
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::STOP_SENDING;
    use std::time::Duration;

    /// What an observer was given.
    #[derive(Default)]
    struct Seen(Vec<ProbeRecord>);

    impl SessionObserver for Seen {
        fn on_record(&mut self, r: &ProbeRecord) {
            self.0.push(r.clone());
        }
    }

    #[test]
    fn metrics_get_no_one_way_figure_where_the_clocks_do_not_allow_it() {
        let r = ProbeRecord {
            seq: 7,
            one_way_ns: Some(5_000),
            path_ns: Some(3_000),
            return_ns: Some(2_000),
            rtt_ns: Some(9_000),
            ..Default::default()
        };
        for show in [false, true] {
            let mut seen = Seen::default();
            OneWayObserver {
                inner: &mut seen,
                show,
            }
            .on_record(&r);
            let got = &seen.0[0];
            assert_eq!(got.rtt_ns, Some(9_000), "RTT needs one clock: always there");
            assert_eq!(got.one_way_ns.is_some(), show);
            assert_eq!(got.path_ns.is_some(), show);
            assert_eq!(got.return_ns.is_some(), show);
        }
    }

    fn ledger(echoed: &[u64], last_received: Option<u64>) -> Ledger {
        let mut l = Ledger {
            stamp_seq_mirrored: true,
            ..Ledger::default()
        };
        for &s in echoed {
            l.on_echo(&Echo {
                seq: s,
                warmup: false,
                times: None,
                received: last_received,
                reflector_seq: None,
                ee: None,
                ttl: None,
            });
        }
        l
    }

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
    fn trailer_count_splits_loss_exactly() {
        // 10 sent, 7 echoed; the reflector got 9: 1 forward, 2 return.
        let mut l = ledger(&[0, 1, 2, 4, 5, 6, 8], None);
        l.trailer = Some(Echo {
            seq: u64::MAX - 1,
            warmup: true,
            times: None,
            received: Some(9),
            reflector_seq: None,
            ee: None,
            ttl: None,
        });
        let s = split_loss(&l, 10, 3, ProtocolArg::Rtprobe, false);
        assert_eq!((s.forward, s.r#return, s.unknown), (Some(1), Some(2), 0));
    }

    #[test]
    fn without_trailer_the_tail_is_unknown() {
        // Echoes up to seq 8 said 8 received; 10 sent, lost: 3, 7, 9.
        let l = ledger(&[0, 1, 2, 4, 5, 6, 8], Some(8));
        let s = split_loss(&l, 10, 3, ProtocolArg::Rtprobe, false);
        // Through seq 8: 9 sent, 8 received -> 1 forward, 1 return; seq 9 unknown.
        assert_eq!((s.forward, s.r#return, s.unknown), (Some(1), Some(1), 1));
        let none = split_loss(&Ledger::default(), 10, 10, ProtocolArg::Rtprobe, false);
        assert_eq!((none.forward, none.unknown), (None, 10));
    }

    #[test]
    fn the_ledger_keeps_no_state_per_seq_and_splits_by_the_records() {
        // The echoes that once grew a bitmap to 512 MiB leave it as it was.
        let mut l = ledger(&[0, 1, 2, 4], Some(4));
        let before = format!("{l:?}").len();
        for seq in [0xFFFF_FFFF, 0x7FFF_FFFF, u64::MAX] {
            l.on_echo(&Echo {
                seq,
                warmup: true,
                times: None,
                received: Some(1),
                reflector_seq: None,
                ee: None,
                ttl: None,
            });
        }
        assert_eq!(
            format!("{l:?}").len(),
            before,
            "warm-ups only touch clock facts"
        );
        // 6 sent, 4 came back (3 and 5 lost): through seq 4, 5 sent and the
        // reflector got 4 -> 1 lost forward, none on return; seq 5 unknown.
        let s = split_loss(&l, 6, 2, ProtocolArg::Rtprobe, false);
        assert_eq!((s.forward, s.r#return, s.unknown), (Some(1), Some(0), 1));
    }

    #[test]
    fn stateless_stamp_gives_no_split() {
        let mut l = ledger(&[0, 1], None);
        let s = split_loss(&l, 3, 1, ProtocolArg::Stamp, true);
        assert_eq!((s.forward, s.unknown), (None, 1));
        // Not known beforehand: the status probe's number came back as sent.
        let status = |refl: u32| Echo {
            seq: STAMP_STATUS_SEQ as u64,
            warmup: false,
            times: None,
            received: None,
            reflector_seq: Some(refl),
            ee: None,
            ttl: None,
        };
        l.trailer = Some(status(STAMP_STATUS_SEQ));
        let s = split_loss(&l, 3, 1, ProtocolArg::Stamp, false);
        assert_eq!((s.forward, s.unknown), (None, 1));
        // A stateful reflector counted 3 of 3: the loss was on the way back.
        l.trailer = Some(status(3));
        let s = split_loss(&l, 3, 1, ProtocolArg::Stamp, false);
        assert_eq!((s.forward, s.r#return, s.unknown), (Some(0), Some(1), 0));
    }

    #[test]
    fn one_way_only_with_both_clocks_synchronised() {
        let synced = ClockSync {
            synchronized: true,
            max_error_ns: 2_000_000,
            tai_offset_s: 37,
        };
        let unsynced = ClockSync {
            synchronized: false,
            ..synced
        };
        let ee = ErrorEstimate::from_error_ns(true, 1_000_000, false);
        let v = clock_verdict(&synced, Some(ee));
        assert!(v.one_way_shown);
        assert!(v.bound_ns.unwrap() >= 3_000_000);
        let v = clock_verdict(&unsynced, Some(ee));
        assert!(!v.one_way_shown);
        assert!(v.note.starts_with(NOT_SYNCED_NOTE));
        let v = clock_verdict(&synced, Some(ErrorEstimate::from_error_ns(false, 0, false)));
        assert!(!v.one_way_shown && v.note.contains("reflector's clock"));
        assert!(!clock_verdict(&synced, None).one_way_shown);
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
                protocol: ProtocolArg::Stamp,
                key: k,
                rate_limit_pps: 0,
                stateful: true,
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
