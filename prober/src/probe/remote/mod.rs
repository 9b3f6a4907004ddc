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
//! Many targets: each its own socket and statistics, one sender and one
//! I/O thread for all. A target that fails to open (its name does not
//! resolve, socket(2) or connect(2) fails) is that target's error: it is
//! reported and tried again with a backoff while the others are probed.
//! Reloads, retries and the reports of targets taken out run on a thread
//! of their own ([`keeper`]); the probing pauses only to swap the legs,
//! and a target that did not change keeps its schedule.
//!
//! Kernel interfaces: a connected UDP socket with SO_TIMESTAMPING
//! (software RX/TX stamps, no privilege), `adjtimex(2)` read only.

mod keeper;
mod outputs;
mod resolve;
mod setup;
mod verdict;

use std::{
    net::SocketAddr,
    sync::{
        Mutex,
        atomic::{AtomicU8, AtomicU64, Ordering},
    },
};

use anyhow::{Context, Result, bail};

pub(crate) use self::resolve::resolve;
pub(crate) use self::setup::{OpenStep, open_files_for};
pub(crate) use self::verdict::{ClockVerdict, LossSplit, RemoteFacts, apply_clock_rule, summarise};
use self::{
    keeper::{Attempt, Change, Keeper, Link, Opener, Removal, Retiring},
    outputs::{OneWayObserver, OneWaySink},
    setup::{WarmUp, in_parallel, prepare, trailer},
    verdict::{Ledger, outcome},
};
use super::{
    HwSetup, ProbeConfig, RecordSink, SessionOutcome, clock, engine,
    matcher::NoHwClocks,
    pacer,
    socket::ProbeSocket,
    stamp::{ClockSync, HmacKey},
    wire::{Echo, ProtocolArg, Wire},
};
use crate::{stats::observer::SessionObserver, sys::Netns};

/// Where the probes go and how they look.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) addr: SocketAddr,
    pub(crate) protocol: ProtocolArg,
    pub(crate) key: Option<HmacKey>,
    /// The reflector is known to answer STAMP statelessly (rtprobe's
    /// in-kernel one): its sequence numbers tell nothing of forward loss.
    pub(crate) stateless_reflector: bool,
    /// Sender and reflector read the same clock (the namespace testbed):
    /// one-way needs no synchronisation.
    pub(crate) shared_clock: bool,
}

/// One remote target of a session: where, how, and its probe options.
#[derive(Clone)]
pub(crate) struct RemoteLeg {
    pub(crate) target: Target,
    pub(crate) cfg: ProbeConfig,
    /// The CSV's `target` cell (None: a single `--target` run's CSV,
    /// which has no such column).
    pub(crate) name: Option<String>,
    /// Its metrics labels besides `target` (a targets file's).
    pub(crate) labels: std::collections::BTreeMap<String, String>,
    /// HOST:PORT as written when the target is a host name: resolved each
    /// time the target is opened (None: `target.addr` is its address).
    pub(crate) host: Option<String>,
}

impl RemoteLeg {
    /// Whether a reload leaves this target as it is (same name, address,
    /// protocol, probe options and labels): it keeps its statistics. A
    /// host name is compared as written (it is resolved when opened).
    fn same_as(&self, o: &RemoteLeg) -> bool {
        let (a, b) = (&self.cfg, &o.cfg);
        self.name == o.name
            && self.host == o.host
            && (self.host.is_some() || self.target.addr == o.target.addr)
            && self.target.addr.port() == o.target.addr.port()
            && self.target.protocol == o.target.protocol
            && (a.size, a.tos, a.interval) == (b.size, b.tos, b.interval)
            && self.labels == o.labels
    }

    fn label(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.host.clone())
            .unwrap_or_else(|| self.target.addr.to_string())
    }
}

/// How a run with a targets file reloads it (SIGHUP).
pub(crate) struct Reloads<'a> {
    /// Counts the reload requests.
    pub(crate) generation: &'a AtomicU64,
    /// Reads and checks the file again.
    pub(crate) read: &'a (dyn Fn() -> Result<Vec<RemoteLeg>> + Sync),
}

/// Makes each target's observer (its metrics, or the progress and HDR
/// log of a single target).
pub(crate) type ObserverFor<'o> = dyn FnMut(&RemoteLeg) -> Box<dyn SessionObserver + 'o> + 'o;

/// Told of each failed open of a target: the target, the step and the
/// error in words (the caller counts it in its metrics; the log line is
/// this module's).
pub(crate) type OnOpenError<'a> = dyn Fn(&RemoteLeg, OpenStep, &str) + Sync + 'a;

/// A target's failed opens: how many, and the last one's cause.
#[derive(Debug, Clone, Default)]
pub(crate) struct OpenErrors {
    pub(crate) count: u64,
    pub(crate) last: Option<String>,
}

/// A target of the running session and what it has so far.
struct Active<'o> {
    leg: RemoteLeg,
    p: Prepared,
    observer: Box<dyn SessionObserver + 'o>,
    /// Its collector from the round before a reload.
    collector: Option<super::Collector>,
    /// Probes tried so far (its next seq).
    sent: u64,
    /// CLOCK_MONOTONIC time its seq 0 was due (set by its first round).
    anchor_ns: Option<i64>,
    /// Failed opens before it opened.
    errors: OpenErrors,
}

/// A target's state from set-up to its report.
struct Prepared {
    /// Where its probes go (its host name resolved).
    addr: SocketAddr,
    wire: Wire,
    sock: ProbeSocket,
    ledger: Mutex<Ledger>,
    show_one_way: bool,
    early: ClockVerdict,
}

/// What every round of a session shares.
struct Rounds<'s, 'c> {
    shared: &'s Mutex<&'c mut dyn RecordSink>,
    end_mono_ns: Option<i64>,
    local_clock: &'s ClockSync,
    stop: &'s AtomicU8,
}

/// The remote side of [`super::run_session`] and [`super::run_targets`]:
/// one connected socket per target, from namespace `ns` (None: the
/// calling thread's), the reflectors' stamps from their echoes, one
/// sender and one I/O thread for all, and after the run each target's
/// status probe, loss split and clock verdict. With one target (and no
/// reloads) a failure to open it or a warm-up without answer is an error.
/// With several a target that fails to open is reported (`on_error`, a
/// log line) and tried again with a backoff while the others are probed,
/// one that does not answer the warm-up is warned about and probed
/// anyway; only when no target opens at all is it an error. With
/// `reloads` a reload request is applied between two rounds: unchanged
/// targets go on with their statistics, sequence numbers and schedule,
/// removed ones are finalized (and stay in the result), new ones start.
/// Returns each target with its outcome: removed ones first, those that
/// never opened last.
pub(super) fn targets_session<'o>(
    legs: Vec<RemoteLeg>,
    ns: Option<&Netns>,
    csv: &mut dyn RecordSink,
    observer_for: &mut ObserverFor<'o>,
    reloads: Option<&Reloads<'_>>,
    on_error: &OnOpenError<'_>,
    stop: &AtomicU8,
) -> Result<Vec<(RemoteLeg, SessionOutcome)>> {
    let local_clock = ClockSync::read_kernel().unwrap_or(ClockSync {
        synchronized: false,
        max_error_ns: 0,
        tai_offset_s: 0,
    });
    let single = legs.len() == 1 && reloads.is_none();
    let opener = Opener::new(ns, local_clock, on_error, stop);
    let (opened, failing) = if single {
        (
            vec![open_single(&legs[0], ns, &local_clock, stop)?],
            Vec::new(),
        )
    } else {
        let (opened, failing) =
            opener.open_all(legs.into_iter().map(Attempt::first).collect(), WarmUp::Many);
        if opened.is_empty() && stop.load(Ordering::SeqCst) == 0 {
            bail!("{}", none_opened(&failing));
        }
        (opened, failing)
    };
    let mut active: Vec<Active<'o>> = opened
        .into_iter()
        .map(|(leg, p, errors)| Active::new(observer_for(&leg), leg, p, errors))
        .collect();
    if stop.load(Ordering::SeqCst) != 0 {
        // Before the pacer: no probe of the run has been sent, and none will.
        bail!("interrupted before probing started; nothing was measured");
    }
    let shared = Mutex::new(csv);
    let ctx = Rounds {
        shared: &shared,
        // Over reloads the run keeps its one end.
        end_mono_ns: active[0]
            .leg
            .cfg
            .duration
            .filter(|_| !single)
            .map(|d| clock::monotonic_ns() + pacer::START_AHEAD_NS + d.as_nanos() as i64),
        local_clock: &local_clock,
        stop,
    };
    if single {
        let collected = run_round(&mut active, &ctx, &|| false)?.finished()?;
        return finish_all(active, collected, &ctx);
    }
    let open_legs = active.iter().map(|a| a.leg.clone()).collect();
    let keeper = Keeper::new(open_legs, failing, reloads, &opener);
    let link = Link::default();
    std::thread::scope(|sc| {
        let k = sc.spawn(|| keeper.run(&link));
        let r = rounds(active, &link, &ctx, observer_for);
        link.close();
        let kept = k
            .join()
            .map_err(|_| anyhow::anyhow!("the targets' keeper thread panicked"))??;
        let mut all = kept.retired;
        all.extend(r?);
        all.extend(kept.never_opened);
        Ok(all)
    })
}

/// The one target of a run: any failure is the run's.
fn open_single(
    leg: &RemoteLeg,
    ns: Option<&Netns>,
    local_clock: &ClockSync,
    stop: &AtomicU8,
) -> Result<(RemoteLeg, Prepared, OpenErrors)> {
    let p = prepare(leg, ns, local_clock, WarmUp::Single, stop).map_err(|f| f.error)?;
    Ok((leg.clone(), p, OpenErrors::default()))
}

/// Why a run whose every target failed to open does not start: each
/// target's cause (the first ten).
fn none_opened(failing: &[keeper::Failing]) -> String {
    let causes: Vec<String> = failing
        .iter()
        .take(10)
        .map(|f| {
            format!(
                "{}: {}",
                f.leg.label(),
                f.errors.last.as_deref().unwrap_or("-")
            )
        })
        .collect();
    let more = failing.len().saturating_sub(causes.len());
    format!(
        "none of the {} targets could be opened, nothing to probe ({}{})",
        failing.len(),
        causes.join("; "),
        if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        }
    )
}

impl<'o> Active<'o> {
    fn new(
        observer: Box<dyn SessionObserver + 'o>,
        mut leg: RemoteLeg,
        p: Prepared,
        errors: OpenErrors,
    ) -> Self {
        // Its host name as resolved now: the address the report names.
        leg.target.addr = p.addr;
        Self {
            leg,
            p,
            observer,
            collector: None,
            sent: 0,
            anchor_ns: None,
            errors,
        }
    }
}

/// Rounds of the engine until the run ends, each change of the keeper
/// applied between two.
fn rounds<'o>(
    mut active: Vec<Active<'o>>,
    link: &Link,
    ctx: &Rounds<'_, '_>,
    observer_for: &mut ObserverFor<'o>,
) -> Result<Vec<(RemoteLeg, SessionOutcome)>> {
    loop {
        match run_round(&mut active, ctx, &|| link.ready())? {
            engine::Driven::Finished(collected) => return finish_all(active, collected, ctx),
            engine::Driven::Paused(cs) => {
                for (a, c) in active.iter_mut().zip(cs) {
                    a.collector = Some(c);
                }
                if let Some(change) = link.take() {
                    active = apply(active, change, link, ctx, observer_for)?;
                }
            }
        }
    }
}

/// After the last round: every target's status probe (in parallel: a
/// silent target waits 300 ms) and outcome.
fn finish_all(
    active: Vec<Active<'_>>,
    collected: Vec<engine::Collected>,
    ctx: &Rounds<'_, '_>,
) -> Result<Vec<(RemoteLeg, SessionOutcome)>> {
    let stop = ctx.stop;
    let asks: Vec<_> = active.iter().map(|a| (&a.leg, &a.p, a.sent)).collect();
    let trailers = in_parallel(&asks, |(l, p, sent)| trailer(l, p, *sent, stop));
    drop(asks);
    let mut done = Vec::with_capacity(active.len());
    for ((a, c), t) in active.into_iter().zip(collected).zip(trailers) {
        let mut o = outcome(&a.leg, a.p, c, a.sent, t, ctx.local_clock, stop)?;
        if let Some(f) = o.remote.as_mut() {
            f.set_open_errors(&a.errors);
        }
        done.push((a.leg, o));
    }
    Ok(done)
}

/// One round of the engine over the active targets (until it ends or
/// `pause` says so); each target's probe count and schedule are brought
/// back for the next.
fn run_round(
    active: &mut [Active<'_>],
    ctx: &Rounds<'_, '_>,
    pause: &(dyn Fn() -> bool + Sync),
) -> Result<engine::Driven> {
    // New targets start i/N of their interval after the round's start
    // (sends spread evenly); the others keep their schedule.
    let n = active.len() as i64;
    let start_ns = clock::monotonic_ns() + pacer::START_AHEAD_NS;
    for (i, a) in active.iter_mut().enumerate() {
        let phase_ns = a.leg.cfg.interval.as_nanos() as i64 * i as i64 / n;
        a.anchor_ns.get_or_insert(start_ns + phase_ns);
    }
    let carried = active.iter_mut().map(|a| a.collector.take()).collect();
    let (mut views, mut observers) = (Vec::new(), Vec::new());
    for a in active.iter_mut() {
        let Active {
            leg, p, observer, ..
        } = a;
        views.push((&*leg, &*p, a.sent, a.anchor_ns));
        observers.push(OneWayObserver {
            inner: &mut **observer,
            show: p.show_one_way,
            ledger: &p.ledger,
        });
    }
    let notes: Vec<_> = views.iter().map(|(_, p, _, _)| ledger_note(p)).collect();
    let legs: Vec<engine::Leg<'_>> = views
        .iter()
        .zip(&notes)
        .map(|(&(leg, p, sent, anchor_ns), note)| engine_leg(leg, p, sent, anchor_ns, note))
        .collect();
    let mut sinks: Vec<OneWaySink<'_, '_>> = views
        .iter()
        .enumerate()
        .map(|(i, (leg, p, _, _))| OneWaySink {
            inner: ctx.shared,
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
        clocks: std::sync::Arc::new(NoHwClocks),
    };
    let r = engine::Round {
        end_mono_ns: ctx.end_mono_ns,
        pause,
        carried,
    };
    let driven = engine::drive(&legs, hw, &mut outs, ctx.stop, r)?;
    let sent: Vec<u64> = legs
        .iter()
        .map(|l| l.attempts.load(Ordering::SeqCst))
        .collect();
    drop(outs);
    drop(sinks);
    drop(observers);
    drop(legs);
    drop(notes);
    drop(views);
    for (a, s) in active.iter_mut().zip(sent) {
        a.sent = s;
    }
    Ok(driven)
}

/// What a target's accepted echoes tell its ledger.
fn ledger_note(p: &Prepared) -> impl Fn(&[Echo]) + Sync + '_ {
    let ledger = &p.ledger;
    move |seen: &[Echo]| {
        if let Ok(mut l) = ledger.lock() {
            for e in seen {
                l.on_echo(e);
            }
        }
    }
}

/// A target as the engine runs it.
fn engine_leg<'a>(
    leg: &'a RemoteLeg,
    p: &'a Prepared,
    sent: u64,
    anchor_ns: Option<i64>,
    note: &'a engine::EchoNote<'a>,
) -> engine::Leg<'a> {
    engine::Leg {
        s: engine::Session {
            sock: &p.sock,
            dst: p.addr,
            wire: &p.wire,
            echo_side: engine::EchoSide::Remote,
            on_echoes: Some(note),
            foreign_before: 0,
        },
        // The reflector's stamps come in its echoes, as the in-kernel one's do.
        cfg: ProbeConfig {
            kernel_reflector: true,
            ..leg.cfg.clone()
        },
        attempts: AtomicU64::new(sent),
        anchor_ns,
    }
}

/// Applies a change of the keeper between two rounds, one log line per
/// target: removed (or changed) ones are finalized and handed back to the
/// keeper for their status probe and report, new ones start.
fn apply<'o>(
    active: Vec<Active<'o>>,
    change: Change,
    link: &Link,
    ctx: &Rounds<'_, '_>,
    observer_for: &mut ObserverFor<'o>,
) -> Result<Vec<Active<'o>>> {
    let mut next = Vec::with_capacity(active.len() + change.add.len());
    for a in active {
        let label = a.leg.label();
        match change.remove.iter().find(|(n, _)| *n == label) {
            Some((_, Removal::Changed)) => {
                log::warn!("target {label}: changed, finalized and started anew");
                link.retire(retire(a, ctx)?);
            }
            Some((_, Removal::Removed)) => {
                log::warn!(
                    "target {label}: removed after {} probes, finalized (it stays in the report)",
                    a.sent
                );
                link.retire(retire(a, ctx)?);
            }
            None => next.push(a),
        }
    }
    let kept = next.len();
    let added = change.add.len();
    for (leg, p, errors) in change.add {
        let label = leg.label();
        let changed = change.remove.iter().any(|(n, _)| *n == label);
        if change.reload && !changed {
            log::warn!("target {label}: added");
        }
        next.push(Active::new(observer_for(&leg), leg, p, errors));
    }
    if change.reload {
        let failing = match change.failing {
            0 => String::new(),
            n => format!(", {n} failing to open (tried again)"),
        };
        log::warn!(
            "reload: {kept} targets unchanged (their statistics go on), {added} added, {} probed in all{failing}",
            next.len()
        );
    }
    Ok(next)
}

/// A target taken out mid-run: what is still in flight counts as lost;
/// its status probe and report are the keeper's.
fn retire(mut a: Active<'_>, ctx: &Rounds<'_, '_>) -> Result<Retiring> {
    let mut c = a
        .collector
        .take()
        .context("internal: a paused target without its collector")?;
    let mut sink = OneWaySink {
        inner: ctx.shared,
        target: a.leg.name.as_deref(),
        show: a.p.show_one_way,
        flushes: true,
    };
    let mut observer = OneWayObserver {
        inner: &mut *a.observer,
        show: a.p.show_one_way,
        ledger: &a.p.ledger,
    };
    c.drain(
        clock::realtime_ns(),
        true,
        &mut sink,
        &mut observer,
        ctx.stop,
    );
    let collected = c.finish(&mut sink, &mut observer, ctx.stop);
    Ok(Retiring {
        leg: a.leg,
        p: a.p,
        collected,
        sent: a.sent,
        errors: a.errors,
    })
}
